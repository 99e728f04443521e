"""TC calling TC: `(a, b) = f(x, y)` inlines f's statements into the caller (tcstage/lang/inline.py).

Every program runs on the CPU and as one CUDA kernel under emulation, against numpy; the errors
of a call are located at the call, and errors inside inlined statements at the callee's source
with a note naming the call.
"""

import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage.lang import checked as C

rng = np.random.default_rng(13)
M = tc.MappingOptions


def f32(*shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def both(prog, name, *args, options=None):
    """The function's result on the CPU and under CUDA emulation (each as a tuple)."""
    cpu = prog[name](*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(prog, name, *args, options=options or M(), target="cuda-emulated")
    gpu = kernel(*args)
    wrap = lambda r: r if isinstance(r, tuple) else (r,)  # noqa: E731
    return wrap(cpu), wrap(gpu)


def check(prog, name, args, expected, options=None):
    for results in both(prog, name, *args, options=options):
        assert len(results) == len(expected)
        for got, want in zip(results, expected):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


LAYERS = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
  C(i, j) +=! A(i, k) * B(k, j)
}
def biasrelu(float(M,N) X, float(N) b) -> (Y) {
  Y(i, j) = fmax(X(i, j) + b(j), 0)
}
def fcrelu(float(B,I) x, float(I,O) w, float(O) bias) -> (y) {
  (h) = matmul(x, w)
  (y) = biasrelu(h, bias)
}
"""


def test_fcrelu_from_two_tcs():
    prog = tc.define(LAYERS)
    x, w, b = f32(6, 5), f32(5, 7), f32(7)
    check(prog, "fcrelu", (x, w, b), [np.maximum(x @ w + b, 0)],
          options=M().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2, 2))
    fn = prog.fcrelu.checked
    assert [s.tensor for s in fn.statements] == ["h", "y"]
    assert fn.tensors["h"].kind == "temp" and fn.outputs == ("y",)
    assert [C.statement_text(s) for s in fn.statements] == [
        "h(i, j) +=! x(i, k) * w(k, j)", "y(i, j) = fmax(h(i, j) + bias(j), 0)"]
    assert [f.name for f in fn.callees] == ["matmul", "biasrelu"]
    assert prog.fcrelu.output_shapes((6, 5), (5, 7), (7,)) == [(6, 7)]
    reports = prog.fcrelu.ranges(x, w, b)
    assert [r.concrete for r in reports] == [{"i": (0, 6), "j": (0, 7), "k": (0, 5)},
                                            {"i": (0, 6), "j": (0, 7)}]


# The callee has a temporary and a where clause over its own size variable; the caller calls it
# twice, with different sizes, the second time on a temporary of its own.
MLP = """
def fc(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  t(n, o) +=! x(n, i) * w(o, i)
  y(n, o) = fmax(t(n, o) + b(o), 0) where o in 0:O
}
def mlp2(float(N,K) X, float(H,K) W1, float(H) B1, float(P,H) W2, float(P) B2) -> (Y) {
  (Z) = fc(X, W1, B1)
  (Y) = fc(Z, W2, B2)
}
"""


def test_two_layer_mlp_calls_one_callee_twice_with_different_sizes():
    prog = tc.define(MLP)
    X, W1, B1, W2, B2 = f32(4, 6), f32(5, 6), f32(5), f32(3, 5), f32(3)
    hidden = np.maximum(X @ W1.T + B1, 0)
    check(prog, "mlp2", (X, W1, B1, W2, B2), [np.maximum(hidden @ W2.T + B2, 0)])
    fn = prog.mlp2.checked
    # each call's temporary gets its own fresh name; O is bound to H, then to P
    assert [C.statement_text(s) for s in fn.statements] == [
        "fc_t(n, o) +=! X(n, i) * W1(o, i)",
        "Z(n, o) = fmax(fc_t(n, o) + B1(o), 0) where o in 0:H",
        "fc_t_1(n, o) +=! Z(n, i) * W2(o, i)",
        "Y(n, o) = fmax(fc_t_1(n, o) + B2(o), 0) where o in 0:P"]
    assert {fn.tensors[t].kind for t in ("fc_t", "fc_t_1", "Z")} == {"temp"}
    assert prog.mlp2.output_shapes(X, W1, B1, W2, B2) == [(4, 3)]


def test_multi_result_call_with_scalar_arguments_in_every_syntax():
    # the callee is defined after its caller; `a, b = f(...)`, `(a, b) = f(...)` and `a = f(...)`
    prog = tc.define("""
def caller(float(N) A, float s, float t) -> (P, Q, R) {
  P, Q = scale(A, s)
  (R, U) = scale(Q, t)
  V = total(R)
}
def scale(float(N) X, float c) -> (S, T) {
  S(i) = X(i) * c
  T(i) = X(i) + c
}
def total(float(N) X) -> (O) {
  O +=! X(i)
}
""")
    A = f32(9)
    s, t = np.float32(1.5), np.float32(-0.25)
    check(prog, "caller", (A, s, t), [A * s, A + s, (A + s) * t])
    assert prog.caller.checked.tensors["V"].rank == 0


def test_nested_calls_with_temporaries_and_size_variables_in_expressions():
    # f calls g calls h; g's size variable N is used as a value, and bound to a temporary's
    # extent (`T.0`) in f
    prog = tc.define("""
def h(float(N) A) -> (O) {
  O(i) = A(i) * 2
}
def g(float(N) A, float c) -> (O) {
  (t) = h(A)
  O(i) = t(i) + c / N
}
def f(float(N) A, float c) -> (P) {
  T(i) = A(2 * i)
  (P) = g(T, c)
}
""")
    A, c = f32(9), np.float32(3.0)
    T = A[::2]
    check(prog, "f", (A, c), [T * 2 + c / len(T)], options=M().mapToThreads(8))
    texts = [C.statement_text(s) for s in prog.f.checked.statements]
    assert texts == ["T(i) = A(2 * i)", "g_t(i) = T(i) * 2", "P(i) = g_t(i) + c / T.0"]


def test_fresh_names_never_clash_with_the_callers():
    # the caller already uses `sq_t` and the size variable `i`, the callee's temporary's fresh
    # name and its index variable
    prog = tc.define("""
def sq(float(M) A) -> (B) {
  t(i) = A(i) * A(i)
  B(i) = t(i) + 1
}
def f(float(i) X) -> (Y, sq_t) {
  sq_t(k) = X(k) - 1
  (Y) = sq(sq_t)
}
""")
    X = f32(7)
    check(prog, "f", (X,), [(X - 1) ** 2 + 1, X - 1])
    texts = [C.statement_text(s) for s in prog.f.checked.statements]
    assert texts == ["sq_t(k) = X(k) - 1", "sq_t_1(i_1) = sq_t(i_1) * sq_t(i_1)",
                     "Y(i_1) = sq_t_1(i_1) + 1"]


MM = """def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(i, j) +=! A(i, k) * B(k, j)
}
"""


@pytest.mark.parametrize("caller, message, at", [
    ("def f(float(M,K) A) -> (C) { (C) = mm(A) }",
     "'mm' takes 2 arguments (A, B), but the call passes 1", "(C) = mm(A)"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (C, D) = mm(A, B) }",
     "'mm' returns 1 tensor (C), but the call takes 2 results", "(C, D) = mm(A, B)"),
    ("def f(float(M) X, float(M,N) B) -> (C) { (C) = mm(X, B) }",
     "argument 'X' for parameter 'A' of 'mm' has rank 1, not 2", "X"),
    ("def f(int32(M,K) X, float(K,N) B) -> (C) { (C) = mm(X, B) }",
     "argument 'X' for parameter 'A' of 'mm' holds int32, not float32", "X"),
    ("def f(float(M,K) A, float(J,N) B) -> (C) { (C) = mm(A, B) }",
     "gives size variable 'K' two sizes: dimension 1 of 'A' (for 'A') is K, dimension 0 of "
     "'B' (for 'B') is J", "B"),
    ("def f(float(M,K) A, float(K,N) Bb) -> (C) { (C) = mm(A, B) }",
     "argument 'B' for parameter 'B' of 'mm' is not a tensor of 'f'; did you mean 'Bb'?", "B"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (C) = mm(A, K) }",
     "argument 'K' for parameter 'B' of 'mm' is a size variable", "K"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (C) = mm(A, T)\n T(i, j) = B(i, j) }",
     "argument 'T' for parameter 'B' of 'mm' is defined only after this call", "T"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(i, j) = A(i, j)\n (C) = mm(A, B) }",
     "result 'C' of the call of 'mm' (its output 'C') is already defined", "C"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (A) = mm(A, B)\n C(i) = A(i, 0) }",
     "result 'A' of the call of 'mm' (its output 'C') is an input", "A"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (C) = mn(A, B) }",
     "unknown TC function 'mn'", "mn"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(i, j) = mm(A, B) }",
     "'mm' is a TC function: a call defines whole tensors", "C(i, j) = mm(A, B)"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(i, j) = 2 * mm(A, B) }",
     "'mm' is a TC function; a call is a statement of its own", "mm(A, B)"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { (C) = f(A, B) }",
     "recursive call of TC function 'f' (f -> f)", "f"),
    ("def f(float(N) A) -> (C) { (C) = g(A) }\ndef g(float(N) A) -> (C) { (C) = f(A) }",
     "recursive call of TC function 'f' (f -> g -> f)", "f"),
    ("def acc(float(N) A) -> (C) { C(i) += A(i) }\ndef f(float(N) A) -> (C) { (C) = acc(A) }",
     "'acc' cannot be called from a TC: its output 'C' starts from values its caller supplies",
     "(C) = acc(A)"),
    ("def c3(float(3) A) -> (C) { C(i) = A(i) }\ndef f(float(4) A) -> (C) { (C) = c3(A) }",
     "argument 'A' for parameter 'A' of 'c3' has size 4 in dimension 0, not 3", "A"),
    ("def e(float(N) A) -> (C) { C(i) = exp(A(i)) }\n"
     "def f(float(N) A) -> (D) { exp(i) = A(i)\n (D) = e(exp) }",
     "'e' calls the builtin function 'exp', but 'exp' names a tensor or size of 'f'",
     "(D) = e(exp)"),
])
def test_call_errors_are_located_at_the_call(caller, message, at):
    with pytest.raises(tc.TCSemanticError) as info:
        tc.define(MM + caller, filename="calls.tc")
    err = info.value
    assert message in err.message
    assert err.span.text() == at
    assert err.span.line > 3  # in the caller, not in mm


def test_call_syntax_errors():
    with pytest.raises(tc.TCSyntaxError, match="an argument of a TC function call is the name of "
                       "a tensor or scalar, not the expression 'A"):
        tc.define(MM + "def f(float(M,K) A, float(K,N) B) -> (C) { (C) = mm(A(0, 0), B) }")
    with pytest.raises(tc.TCSyntaxError, match="expected '=' after the results of a TC function"):
        tc.define(MM + "def f(float(M,K) A, float(K,N) B) -> (C) { (C) += mm(A, B) }")


def test_errors_inside_inlined_statements_point_at_the_callee_and_name_the_call():
    # `n` is a scalar input of `head`; the caller passes a rank-0 temporary, which a range bound
    # may not read: only the inlined statement is wrong
    source = """def head(float(N) A, int32 n) -> (O) {
  O(i) = A(i) where i in 0:n
}
def f(float(N) X, int32(N) I) -> (Z) {
  s max=! I(i)
  (Z) = head(X, s)
}"""
    with pytest.raises(tc.TCSemanticError) as info:
        tc.define(source, filename="calls.tc")
    err = info.value
    assert "a range bound may not read tensor 's'" in err.message
    assert (err.span.line, err.span.text()) == (2, "n")  # in head's source
    text = str(err)
    assert "calls.tc:2:28: error" in text
    assert "note: in 'head', inlined into 'f' by the call at calls.tc:6:3 (A -> X, n -> s, " \
           "O -> Z)" in text


def test_errors_inside_a_callee_are_its_own():
    # a callee that is wrong on its own is reported at its definition, without a call note
    with pytest.raises(tc.TCSemanticError) as info:
        tc.define("def g(float(N) A) -> (O) { O(i) = A(k) }\n"
                  "def f(float(N) X) -> (Z) { (Z) = g(X) }")
    assert info.value.span.line == 1 and "note: in 'g'" not in str(info.value)


def test_a_rank0_tensor_is_read_not_a_range_bound():
    # before calls existed, a rank-0 temporary in a where clause crashed range inference
    with pytest.raises(tc.TCSemanticError, match="a range bound may not read tensor 's'"):
        tc.define("def f(float(N) X) -> (Z) { s +=! X(i)\n Z(i) = X(i) where i in 0:s }")


def test_tensor_names_hide_function_names():
    # a tensor named like a TC function is read, not called (as tensors hide builtins)
    prog = tc.define(MM + """def f(float(N) mm, float(N) X) -> (Z) {
  Z(i) = mm(i) + X(i)
}""")
    a, b = f32(5), f32(5)
    np.testing.assert_allclose(prog.f(a, b), a + b, rtol=1e-6)


def test_ranges_cuda_comments_and_tuning_key_show_inlined_statements_in_the_callers_names():
    prog = tc.define(LAYERS)
    assert [r.source for r in prog.fcrelu.ranges()] == [
        "h(i, j) +=! x(i, k) * w(k, j)", "y(i, j) = fmax(h(i, j) + bias(j), 0)"]
    kernel = tc.compile(prog, "fcrelu", (6, 5), (5, 7), (7,), options=M(),
                        target="cuda-emulated")
    assert "// S1: h(i, j) +=! x(i, k) * w(k, j)" in kernel.cuda_source
    # the tuning cache's key covers the callees: changing one changes the caller's key
    from tcstage.tune.cache import tc_hash
    changed = tc.define(LAYERS.replace("fmax(X(i, j) + b(j), 0)", "fmax(X(i, j) - b(j), 0)"))
    assert tc_hash(changed.fcrelu) != tc_hash(prog.fcrelu)
    assert tc_hash(tc.define(LAYERS).fcrelu) == tc_hash(prog.fcrelu)


def test_literal_typed_results_strided_scalar_subscripts_padding_and_dimension_sizes():
    # `C(i) = 0` takes float from acc's later `+=` (the caller learns it too, before checking
    # the call that passes Y on); conv's stride is a scalar input of the caller (specialised);
    # pad reads its argument padded and uses `P.0` of its own output
    prog = tc.define("""
def acc(float(N,K) A) -> (C) {
  C(i) = 0
  C(i) += A(i, k)
}
def conv(float(W) I, float(KW) F, int32 s) -> (O) {
  O(x) +=! I(s * x + k) * F(k)
}
def pad(float(N) A) -> (P, L) {
  P(i) = A(i - 1) ?? 0 where i in 0:N+2
  L(i) = P(i) + P.0
}
def f(float(N,K) X, float(W) I, float(KW) F, int32 st) -> (Y, Z, Q, R) {
  (Y) = acc(X)
  (Z) = conv(I, F, st)
  (Q, R) = pad(Y)
}
""")
    X, I, F = f32(3, 4), f32(11), f32(3)
    Y = X.sum(axis=1)
    Z = np.array([sum(I[2 * x + k] * F[k] for k in range(3)) for x in range(5)])
    Q = np.concatenate([[0], Y, [0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        check(prog, "f", (X, I, F, 2), [Y, Z, Q, Q + len(Q)])
    assert prog.f.checked.tensors["Y"].type == prog.f.checked.tensors["Q"].type


def test_an_argument_typed_by_a_literal_must_still_match():
    with pytest.raises(tc.TCSemanticError, match="argument 'T' for parameter 'A' of 'mm' holds "
                       "int32, not float32"):
        tc.define(MM + "def f(float(K,N) B) -> (C) { T(i, k) = 0 where i in 0:2, k in 0:K\n"
                  " (C) = mm(T, B) }")


def test_a_call_after_a_statement_ending_in_a_name():
    # statements are separated by whitespace only: `... 0:K` then `(C) = mm(T, B)` is not the
    # read `K(C)`
    prog = tc.define(MM + """def f(float(K,N) B, float s) -> (C, D) {
  T(i, k) = s where i in 0:2, k in 0:K
  (C) = mm(T, B)
  U(i, j) = C(i, j) * s
  (D) = mm(U, B)
}""")
    B, s = f32(3, 3), np.float32(0.5)
    T = np.full((2, 3), s, np.float32)
    check(prog, "f", (B, s), [T @ B, (T @ B * s) @ B])
