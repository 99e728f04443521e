"""tcstage.torch: TC functions as PyTorch operators, checked against PyTorch's own layers
(einsum, linear + relu, indexing, max_pool2d, conv2d) and PyTorch's op and gradient checkers."""

import pathlib
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import tcstage as tc  # noqa: E402
import tcstage.torch as tct  # noqa: E402
from tcstage.halide.solver import evaluate  # noqa: E402
from tcstage.lang.retype import retype, retype_source  # noqa: E402
from tcstage.lang.types import FLOAT16, FLOAT32, FLOAT64  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _example(name: str) -> str:
    return (EXAMPLES / name).read_text()


TMM_GRAD = """
def tmm_grad(float(M,K) A, float(N,K) B, float(M,N) C, float(M,N) d_C) -> (d_A, d_B) {
  d_A(m,k) +=! d_C(m,n) * B(n,k)
  d_B(n,k) +=! d_C(m,n) * A(m,k)
}"""
TBMM_GRAD = """
def tbmm_grad(float(B,N,M) X, float(B,K,M) Y, float(B,N,K) Z, float(B,N,K) d_Z) -> (d_X, d_Y) {
  d_X(b,n,m) +=! d_Z(b,n,k) * Y(b,k,m)
  d_Y(b,k,m) +=! d_Z(b,n,k) * X(b,n,m)
}"""
MLP1_GRAD = """
def MLP1_grad(float(B,M) I, float(N,M) W1, float(N) B1, float(B,N) O1, float(B,N) d_O1)
    -> (d_I, d_W1, d_B1) {
  g(b,n) = O1(b,n) > 0 ? d_O1(b,n) : 0
  d_I(b,m) +=! g(b,n) * W1(n,m)
  d_W1(n,m) +=! g(b,n) * I(b,m)
  d_B1(n) +=! g(b,n)
}"""
SCALE = "def scale(float(N) X, float a) -> (Y) { Y(i) = a * X(i) }"
SCALE_GRAD = """
def scale_grad(float(N) X, float a, float(N) Y, float(N) d_Y) -> (d_X, d_a) {
  d_X(i) = a * d_Y(i)
  d_a +=! d_Y(i) * X(i)
}"""


@pytest.fixture(scope="module")
def tmm():
    return tct.op(_example("tmm.tc"), "tmm", backward=TMM_GRAD)


@pytest.fixture(scope="module")
def mlp1():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tct.op(_example("mlp.tc"), "MLP1", backward=MLP1_GRAD)


@pytest.fixture(scope="module")
def lut2():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tct.op(_example("lut.tc"), "2LUT")


def _lut_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(10, 4, generator=g, dtype=dtype),
            torch.randint(0, 10, (3, 5), generator=g, dtype=torch.int32),
            torch.randn(8, 4, generator=g, dtype=dtype),
            torch.randint(0, 8, (3, 2), generator=g, dtype=torch.int32))


# -- forward against PyTorch --------------------------------------------------------------------

def test_tmm_matches_einsum(tmm):
    A, B = torch.randn(5, 7), torch.randn(6, 7)
    C = tmm(A, B)
    assert isinstance(C, torch.Tensor) and C.shape == (5, 6) and C.dtype == torch.float32
    torch.testing.assert_close(C, torch.einsum("mk,nk->mn", A, B))


def test_non_contiguous_inputs(tmm):
    A, B = torch.randn(7, 5).T, torch.randn(6, 14)[:, ::2]
    assert not A.is_contiguous() and not B.is_contiguous()
    torch.testing.assert_close(tmm(A, B), torch.einsum("mk,nk->mn", A, B))


def test_tbmm_matches_einsum():
    tbmm = tct.op(_example("tbmm.tc"), "tbmm", backward=TBMM_GRAD)
    X, Y = torch.randn(3, 4, 5), torch.randn(3, 2, 5)
    torch.testing.assert_close(tbmm(X, Y), torch.einsum("bnm,bkm->bnk", X, Y))


def test_mlp1_matches_linear_relu(mlp1):
    x, W, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    torch.testing.assert_close(mlp1(x, W, b), torch.relu(torch.nn.functional.linear(x, W, b)))


def test_several_outputs_and_integer_inputs(lut2):
    L1, I1, L2, I2 = _lut_inputs()
    O1, O2 = lut2(L1, I1, L2, I2)
    torch.testing.assert_close(O1, L1[I1.long()].sum(1))
    torch.testing.assert_close(O2, L2[I2.long()].sum(1))


def test_integer_only_operator():
    rowsum = tct.op("def rowsum(int64(N,M) X) -> (S) { S(n) +=! X(n,m) }", "rowsum")
    X = torch.randint(-50, 50, (4, 7), dtype=torch.int64)
    S = rowsum(X)
    assert S.dtype == torch.int64
    assert torch.equal(S, X.sum(1))


def test_scalar_inputs_in_subscripts():
    """sconv2d specialises on its int strides; the output shape follows them (real and fake)."""
    sconv = tct.op(_example("sconv2d.tc"), "sconv2d")
    I, Wt, B = torch.randn(2, 3, 9, 8), torch.randn(4, 3, 3, 2), torch.randn(4)
    want = torch.nn.functional.conv2d(I, Wt, B, stride=(2, 3))
    torch.testing.assert_close(sconv(2, 3, I, Wt, B), want)
    assert sconv(2, 3, *(t.to("meta") for t in (I, Wt, B))).shape == want.shape


def test_meta_tensors_give_shapes_from_range_inference():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        pool = tct.op(_example("conv.tc"), "maxpool2x2")
    x = torch.randn(2, 3, 7, 9)
    torch.testing.assert_close(pool(x), torch.nn.functional.max_pool2d(x, 2))
    out = pool(torch.empty(2, 3, 7, 9, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 3, 3, 4)


# -- floating-point genericity ------------------------------------------------------------------

def test_float64_runs_in_double(mlp1):
    x, W, b = (torch.randn(4, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64),
               torch.randn(3, dtype=torch.float64))
    y = mlp1(x, W, b)
    assert y.dtype == torch.float64
    # closer than float32 could get (its rounding alone is ~1e-7 relative)
    torch.testing.assert_close(y, torch.relu(x @ W.T + b), rtol=1e-13, atol=1e-13)


def test_float16(tmm):
    A, B = torch.randn(4, 8).half(), torch.randn(3, 8).half()
    C = tmm(A, B)
    assert C.dtype == torch.float16
    torch.testing.assert_close(C.float(), A.float() @ B.float().T, rtol=1e-2, atol=1e-2)


def test_integer_tensors_keep_their_type_in_float64(lut2):
    O1, O2 = lut2(*_lut_inputs(torch.float64))
    L1, I1, _, _ = _lut_inputs(torch.float64)
    assert O1.dtype == O2.dtype == torch.float64
    torch.testing.assert_close(O1, L1[I1.long()].sum(1), rtol=1e-14, atol=1e-14)


def test_retype_rewrites_declared_floats_and_single_precision_builtins():
    text = ("def f(float(N) X, int32(N) I, half s) -> (Y) {\n"
            "  Y(i) = fmaxf(X(i) * s, 0) + expf(X(I(i)))\n}")
    assert retype_source(text, FLOAT64) == (
        "def f(double(N) X, int32(N) I, double s) -> (Y) {\n"
        "  Y(i) = fmax(X(i) * s, 0) + exp(X(I(i)))\n}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        typed = retype(tc.define(text), FLOAT16)
    fn = typed.f.checked
    assert str(fn.tensors["X"].type) == "float16" and str(fn.tensors["Y"].type) == "float16"
    assert str(fn.tensors["I"].type) == "int32"
    # (a program already of that type is itself: float32 tensors through a float TC defined
    # the whole module again, per operator, at its first call)
    program = tc.define("def g(float(N) X) -> (Y) { Y(i) = exp(X(i)) }")
    assert retype(program, FLOAT32) is program
    assert retype(program, FLOAT64) is not program


def test_compile_count_counts_each_pipeline_once():
    """A float32 call of a float TC runs the program as written (retyping it to its own type
    is the program itself): its forward and its backward are two pipelines, counted once each,
    however many batch sizes follow (the kernels are shape-generic)."""
    op = tct.op("def lin(float(B,K) X, float(N,K) W) -> (Y) { Y(b,n) +=! X(b,k) * W(n,k) }",
                "lin")
    W = torch.randn(5, 7, requires_grad=True)
    for batch in (4, 4, 9, 1):
        X = torch.randn(batch, 7, requires_grad=True)
        op(X, W).sum().backward()
        torch.testing.assert_close(W.grad, X.sum(0).expand(5, 7).clone(), rtol=1e-5,
                                   atol=1e-5)
        W.grad = None
    assert op.compile_count == 2


def test_bfloat16_runs_with_float32_sums(tmm):
    A, B = torch.randn(4, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    C = tmm(A, B)
    assert C.dtype == torch.bfloat16
    exact = A.double() @ B.double().T  # products exact, sums in float32, rounded once
    bound = 2 * 2**-8 * exact.abs() + 64 * 2**-24 * (A.double().abs() @ B.double().abs().T)
    assert ((C.double() - exact).abs() <= bound).all()


def test_a_float_dtype_tc_lacks_is_a_clear_error(tmm):
    with pytest.raises(tc.TCArgumentError, match="float8_e4m3fn.*half, bfloat16, float, double"):
        tmm(torch.randn(2, 3).to(torch.float8_e4m3fn), torch.randn(2, 3).to(torch.float8_e4m3fn))


# -- errors --------------------------------------------------------------------------------

def test_mixed_float_dtypes_are_refused(tmm):
    with pytest.raises(tc.TCArgumentError, match="one dtype; A is torch.float32, B is "
                                                 "torch.float64"):
        tmm(torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64))


def test_wrong_integer_dtype_rank_and_sizes(lut2, tmm):
    L1, I1, L2, I2 = _lut_inputs()
    with pytest.raises(tc.TCArgumentError, match="I1 of type int32 .*got torch.int64"):
        lut2(L1, I1.long(), L2, I2)
    with pytest.raises(tc.TCArgumentError, match="LUT1 as a floating-point tensor"):
        lut2(I1, I1, L2, I2)
    with pytest.raises(tc.TCArgumentError, match="rank 2"):
        tmm(torch.randn(2, 3, 1), torch.randn(2, 3))
    with pytest.raises(tc.TCArgumentError, match="size variable K"):
        tmm(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(tc.TCArgumentError, match="size variable K"):
        tmm(torch.empty(2, 3, device="meta"), torch.empty(2, 4, device="meta"))


def test_wrong_arity_and_argument_kinds_are_tc_errors(tmm):
    """They were the dispatcher's raw RuntimeErrors, quoting the hashed schema."""
    A, B = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(tc.TCArgumentError, match=r"'tmm' takes 2 inputs \(A, B\), got 1; missing B"):
        tmm(A)
    with pytest.raises(tc.TCArgumentError, match="takes 2 inputs"):
        tmm(A, B, B)
    with pytest.raises(tc.TCArgumentError, match="has no parameter 'C'"):
        tmm(A, C=B)
    with pytest.raises(tc.TCArgumentError, match="expects A as a torch.Tensor, got ndarray"):
        tmm(A.numpy(), B)
    scaled = tct.op("def s(int32 n, float(N) V) -> (O) { O(i) = V(i) * n }", "s")
    with pytest.raises(tc.TCArgumentError, match=r"expects n as a Python int \(int32\), got float"):
        scaled(2.5, B[0])
    assert torch.equal(scaled(n=2, V=B[0]), B[0] * 2)


def test_inout_outputs_cannot_be_operators():
    with pytest.raises(tc.TCError, match="starts from the caller's values"):
        tct.op("def acc(float(N) X) -> (Y) { Y(i) += X(i) }", "acc")


@pytest.mark.parametrize("text, message", [
    ("def tmm_grad(float(M,K) A, float(N,K) B, float(M,N) d_C) -> (d_A, d_B) "
     "{ d_A(m,k) +=! d_C(m,n) * B(n,k)  d_B(n,k) +=! d_C(m,n) * A(m,k) }",
     "takes 3 parameters; the backward of 'tmm' takes 4"),
    ("def tmm_grad(float(M,K) A, float(N) B, float(M,N) C, float(M,N) d_C) -> (d_A) "
     "{ d_A(m,k) +=! d_C(m,n) * A(m,k) }",
     r"parameter 2 of 'tmm_grad' \(B\) is forward input B, of rank 2"),
    ("def tmm_grad(float(M,K) A, int32(N,K) B, float(M,N) C, float(M,N) d_C) -> (d_A) "
     "{ d_A(m,k) +=! d_C(m,n) * A(m,k) }",
     "of type float32; it is declared int32"),
    ("def tmm_grad(float(M,K) A, float(N,K) B, float(M,N) C, float(M,N) d_C) -> (d_A) "
     "{ d_A(m,k) +=! d_C(m,n) * B(n,k) }",
     "returns 1 tensors; it must return one gradient per floating-point input"),
    ("def g1(float(M) A) -> (X) { X(i) = A(i) }\ndef g2(float(M) A) -> (X) { X(i) = A(i) }",
     "name the backward function 'tmm_grad'"),
])
def test_bad_backward_text_is_a_clear_error(text, message):
    with pytest.raises(tc.TCError, match=message) as info:
        tct.op(_example("tmm.tc"), "tmm", backward=text)
    if "parameter" in message:
        assert ("def tmm_grad(float32(M, K) A, float32(N, K) B, float32(M, N) C, "
                "float32(M, N) d_C) -> (d_A, d_B)") in str(info.value)


def test_backward_text_syntax_error_points_into_it():
    with pytest.raises(tc.TCSyntaxError, match="<backward>:1"):
        tct.op(_example("tmm.tc"), "tmm", backward="def tmm_grad(float(M,K) A -> (d_A) {}")


def test_no_gradient_is_an_error_only_when_differentiating():
    """tcstage.grad does not differentiate product reductions: the forward operator works, and
    asking for a gradient raises the generator's TCError naming the statement."""
    prod = tct.op("def prod(float(N,M) X) -> (P) { P(n) *=! X(n,m) }", "prod")
    X = torch.rand(3, 4, requires_grad=True)
    P = prod(X)
    torch.testing.assert_close(P, X.prod(1))
    with pytest.raises(tc.TCError, match=r"product reduction \('\*=!'\)"):
        P.sum().backward()


def test_double_backward_is_a_clear_error(tmm):
    A = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    B = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    (gA,) = torch.autograd.grad(tmm(A, B).sum(), A, create_graph=True)
    with pytest.raises(tc.TCError, match="double backward"):
        gA.sum().backward()


# -- autograd --------------------------------------------------------------------------------------

def test_the_backward_compiles_on_a_thread_while_the_forward_runs(monkeypatch):
    """A first forward whose input requires grad starts the backward kernel's compile on a
    thread of its own (TCOp._compile_backward_ahead): backward() compiles nothing more, and
    the gradients are einsum's. A forward without grad starts nothing."""
    import threading
    import tcstage.program as program
    made_on = []

    class Recorded(program.CpuKernel):
        def __init__(self, lowered, *args, **kwargs):
            made_on.append((lowered.fn.name, threading.current_thread().name))
            super().__init__(lowered, *args, **kwargs)
    monkeypatch.setattr(program, "CpuKernel", Recorded)
    # (a TC of this test's own: an operator, and its kernels, are made once per process)
    layer = tct.op("def ahead(float(M,K) A, float(N,K) B) -> (C) {\n"
                   "  C(m,n) +=! A(m,k) * B(n,k) * 3\n}", "ahead")
    with torch.no_grad():
        layer(torch.randn(4, 3), torch.randn(5, 3))
    assert made_on == [("ahead", threading.current_thread().name)]
    A = torch.randn(6, 5, requires_grad=True)
    B = torch.randn(7, 5, requires_grad=True)
    C = layer(A, B)
    # (with the forward's kernel on disk already, backward() could come before the thread got
    # as far as claiming the kernel, and then makes it itself: correct, but not this test's)
    for thread in threading.enumerate():
        if thread.name == "tcstage-compile-ahead_grad":
            thread.join()
    d_C = torch.randn(6, 7)
    C.backward(d_C)
    names = dict(made_on)
    assert names["ahead_grad"] == "tcstage-compile-ahead_grad"
    assert [n for n, _ in made_on].count("ahead_grad") == 1
    torch.testing.assert_close(C, 3 * torch.einsum("mk,nk->mn", A, B))
    torch.testing.assert_close(A.grad, 3 * d_C @ B.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(B.grad, 3 * d_C.T @ A.detach(), rtol=1e-5, atol=1e-5)


def test_gradients_match_pytorch(mlp1):
    x = torch.randn(4, 6, requires_grad=True)
    W = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    mlp1(x, W, b).square().sum().backward()
    refs = [t.detach().clone().requires_grad_() for t in (x, W, b)]
    torch.relu(torch.nn.functional.linear(*refs)).square().sum().backward()
    for t, r in zip((x, W, b), refs):
        torch.testing.assert_close(t.grad, r.grad)


def test_calls_with_parameters_take_the_memoised_path(mlp1, monkeypatch):
    """nn.Parameters are dense CPU tensors like any other: a call like an earlier one skips
    the checks and binding (each call with a Parameter took the full path, 40-70 us for a
    4-element add), recorded by autograd or not, and its gradients reach only the inputs
    that want one. Against PyTorch's linear + relu."""
    from tcstage.torch import ops
    layer = torch.nn.Linear(6, 3)
    x = torch.randn(5, 6)
    # (the first call of these shapes, and its backward's, take the full path)
    mlp1(x, layer.weight, layer.bias).square().sum().backward()
    full = []
    monkeypatch.setattr(ops, "_run_cpu", lambda *a: full.append(a))
    for k in range(3):
        x = torch.randn(5, 6)
        with torch.no_grad():
            torch.testing.assert_close(mlp1(x, layer.weight, layer.bias),
                                       torch.relu(layer(x)))
        layer.zero_grad()
        mlp1(x, layer.weight, layer.bias).square().sum().backward()
        refs = [p.detach().clone().requires_grad_() for p in (layer.weight, layer.bias)]
        torch.relu(torch.nn.functional.linear(x, *refs)).square().sum().backward()
        torch.testing.assert_close(layer.weight.grad, refs[0].grad)
        torch.testing.assert_close(layer.bias.grad, refs[1].grad)
        assert x.grad is None
    assert not full


def test_a_repeated_backward_goes_straight_to_its_kernel(mlp1, monkeypatch):
    """A backward like an earlier one, after a forward that took its memo, calls the backward
    kernel without the backward operator's own lookups (`_backward_calls`); output gradients
    of another layout (a transposed view, an expanded one) take the full path once, and each
    layout keeps its memo. Every gradient against PyTorch's linear + relu."""
    from tcstage.torch import ops
    weight, bias = torch.randn(3, 6, requires_grad=True), torch.randn(3, requires_grad=True)
    full = []
    backward_run = ops.TCOp._run

    def counted(self, *args, **kwargs):
        if self is mlp1.backward_op:
            full.append(args)
        return backward_run(self, *args, **kwargs)
    monkeypatch.setattr(ops.TCOp, "_run", counted)

    def check(d_out):
        x = torch.randn(5, 6, requires_grad=True)
        got = torch.autograd.grad(mlp1(x, weight, bias), (x, weight, bias), d_out)
        want = torch.autograd.grad(torch.relu(torch.nn.functional.linear(x, weight, bias)),
                                   (x, weight, bias), d_out)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)

    for _ in range(3):
        check(torch.randn(5, 3))
    assert len(full) <= 2  # (the first calls take the full path, once or twice, then none)
    before = len(full)
    check(torch.randn(3, 5).T)  # a transposed view: another key
    check(torch.randn(3).expand(5, 3))  # strides (0, 1)
    assert len(full) == before + 2
    check(torch.randn(5, 3))  # back to the first layout, then the others again
    check(torch.randn(3, 5).T)
    check(torch.randn(3).expand(5, 3))
    assert len(full) == before + 2


def test_tensors_left_by_a_finished_transform_are_taken(tmm):
    """torch.func transforms wrap tensors; one that escapes the transform (kept in a list by
    the function) outlives its level as a wrapper without storage. PyTorch's operators take
    what it wraps; so does a tcstage operator (the memo's key read its data pointer and
    raised)."""
    kept = []

    def f(a):
        kept.append(a)
        return (a * a).sum()
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    tmm(a, b)  # (so that the memoised path has this key)
    torch.func.grad(f)(a)
    torch.testing.assert_close(tmm(kept[0], b), a @ b.T)


@pytest.mark.parametrize("which", ["tmm", "tbmm", "MLP1"])
def test_gradcheck_float64(which, tmm, mlp1):
    g = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    if which == "tmm":
        layer, args = tmm, (rand(3, 4), rand(2, 4))
    elif which == "tbmm":
        layer = tct.op(_example("tbmm.tc"), "tbmm", backward=TBMM_GRAD)
        args = (rand(2, 3, 4), rand(2, 2, 4))
    else:
        # inputs away from the relu's kink, where the finite difference would straddle it
        layer, args = mlp1, (rand(3, 4), rand(5, 4), rand(5))
        with torch.no_grad():
            pre = args[0] @ args[1].T + args[2]
            args[2].add_(torch.where(pre.abs() < 0.05, 0.1, 0.0).amax(0))
    assert torch.autograd.gradcheck(layer, args)


@pytest.mark.parametrize("file, name, make_args", [
    ("tmm.tc", "tmm", lambda rand: (rand(3, 4), rand(2, 4))),
    ("mlp.tc", "MLP3", lambda rand: (rand(2, 3), rand(4, 3), rand(4), rand(3, 4), rand(3),
                                     rand(2, 3), rand(2))),
    ("lut.tc", "2LUT", lambda rand: (rand(10, 4), torch.randint(0, 10, (3, 5), dtype=torch.int32),
                                     rand(8, 4), torch.randint(0, 8, (3, 2), dtype=torch.int32))),
    ("conv.tc", "maxpool2x2", lambda rand: (rand(2, 2, 6, 5),)),
    ("sconv2d.tc", "sconv2d", lambda rand: (2, 3, rand(2, 2, 7, 8), rand(3, 2, 3, 2), rand(3))),
])
def test_gradcheck_float64_with_the_generated_backward(file, name, make_args):
    """backward=None: the backward TC tcstage.grad generates, registered as its own operator."""
    g = torch.Generator().manual_seed(2)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64).add_(0.1).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        layer = tct.op(_example(file), name)
    assert layer.backward_op is not None and layer.backward_op.name == f"{name}_grad"
    args = make_args(rand)
    assert torch.autograd.gradcheck(layer, args)
    torch.library.opcheck(layer.custom_op, args)


def test_scalar_inputs_get_no_gradient_but_tensors_do():
    scale = tct.op(SCALE, "scale", backward=SCALE_GRAD)
    X = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: scale(x, 2.5), (X,))
    scale(X, 3.0).sum().backward()
    torch.testing.assert_close(X.grad, torch.full_like(X, 3.0))


def test_gradient_of_the_wrong_shape_is_a_clear_error():
    # the user's d_A covers only k < 2 of A's K columns
    short = TMM_GRAD.replace("d_A(m,k) +=! d_C(m,n) * B(n,k)",
                             "d_A(m,k) +=! d_C(m,n) * B(n,k) where k in 0:2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (B read only for k < 2: known)
        layer = tct.op(_example("tmm.tc"), "tmm", backward=short)
    A = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(tc.TCError, match=r"gives d_A the shape \(3, 2\), but A has shape "
                                         r"\(3, 4\)"):
        layer(A, torch.randn(2, 4)).sum().backward()


# -- torch.library, torch.compile, torch.export --------------------------------------------

def test_operator_identity_and_name(tmm):
    assert tct.op(_example("tmm.tc"), "tmm", backward=TMM_GRAD) is tmm
    other = tct.op(_example("tmm.tc"), "tmm", options="MappingOptions().tile(4)",
                   backward=TMM_GRAD)
    assert other.op_name != tmm.op_name and other.op_name.startswith("tc_tmm_")
    assert tmm.op is getattr(torch.ops.tcstage, tmm.op_name).default
    assert str(tmm.op._schema).endswith("(Tensor A, Tensor B) -> Tensor")


def test_op_names_are_valid_identifiers(lut2):
    assert lut2.op_name.startswith("tc_2LUT_")  # a name that starts with a digit is prefixed


def test_opcheck_without_autograd(lut2, tmm):
    torch.library.opcheck(lut2.custom_op, _lut_inputs(torch.float64))
    torch.library.opcheck(tmm.custom_op, (torch.randn(3, 4), torch.randn(2, 4)))


def test_opcheck_with_autograd(tmm, mlp1):
    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(tmm.custom_op, (rand(3, 4), rand(2, 4)))
    torch.library.opcheck(mlp1.custom_op, (rand(3, 4), rand(5, 4), rand(5)))


def test_symbolic_shapes_follow_halide_arithmetic():
    """The SymInt evaluator agrees with the solver's integer evaluation (Euclidean division,
    min, max, select) on ints; on SymInts it is exercised by the compile/export tests."""
    a, b = ("var", "a"), ("var", "b")
    trees = [("div", ("sub", a, ("int", 7)), ("int", 2)), ("mod", a, ("int", -3)),
             ("div", a, ("int", -3)), ("max", ("min", a, b), ("int", 2)),
             ("select", ("lt", a, b), ("add", a, ("int", 1)), ("mul", b, ("int", 3))),
             ("div", a, ("int", 0)), ("cast", "int32", ("sub", b, a))]
    for tree in trees:
        for values in ({"a": 5, "b": 9}, {"a": -7, "b": 2}, {"a": 13, "b": 13}):
            assert tct.evaluate_symbolic(tree, values) == evaluate(tree, values), tree


def test_compile_fullgraph_with_dynamic_batch(mlp1):
    """No graph break (fullgraph), one graph for three batch sizes, forward and backward."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    W = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(3, requires_grad=True)

    def model(x):
        return mlp1(x, W, b).sum(dim=1) * 2
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for batch in (2, 5, 7):
        x = torch.randn(batch, 6, requires_grad=True)
        y = compiled(x)
        y.sum().backward()
        torch.testing.assert_close(y, torch.relu(x @ W.T + b).sum(1) * 2)
        assert x.grad.shape == x.shape
    assert counter.frame_count == 1
    assert torch._dynamo.explain(model)(torch.randn(3, 6)).graph_break_count == 0


@pytest.mark.slow
def test_compile_with_inductor_and_automatic_dynamic_shapes(mlp1):
    torch._dynamo.reset()
    W, b = torch.randn(3, 6), torch.randn(3)

    def model(x):
        return torch.tanh(mlp1(x, W, b))
    compiled = torch.compile(model, fullgraph=True)
    for batch in (2, 3, 4, 9):  # the second size makes the batch dimension dynamic
        x = torch.randn(batch, 6)
        torch.testing.assert_close(compiled(x), torch.tanh(torch.relu(x @ W.T + b)))


def test_export_with_dynamic_sizes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        pool = tct.op(_example("conv.tc"), "maxpool2x2")

    class Pool(torch.nn.Module):
        def forward(self, x):
            return pool(x)
    batch, height = torch.export.Dim("batch"), torch.export.Dim("height", min=4, max=64)
    exported = torch.export.export(Pool(), (torch.randn(2, 3, 7, 9),),
                                   dynamic_shapes={"x": {0: batch, 2: height}})
    assert f"torch.ops.tcstage.{pool.op_name}" in exported.graph_module.code
    x = torch.randn(5, 3, 12, 9)  # new batch and height, no re-export
    torch.testing.assert_close(exported.module()(x), torch.nn.functional.max_pool2d(x, 2))


# -- packaging and the GPU -----------------------------------------------------------------

def test_import_tcstage_does_not_import_torch():
    code = "import sys, tcstage; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.gpu
def test_cuda_matches_einsum(tmm):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU for PyTorch here")
    pytest.importorskip("pycuda")
    A, B = torch.randn(64, 32, device="cuda"), torch.randn(48, 32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # a non-default current stream: the launch is ordered on it
        C = tmm(A, B)
        ref = A @ B.T
    torch.cuda.synchronize()
    assert C.device == A.device
    torch.testing.assert_close(C, ref, rtol=1e-4, atol=1e-4)
    A64 = A.double().requires_grad_()
    B64 = B.double().requires_grad_()
    tmm(A64, B64).sum().backward()
    torch.testing.assert_close(A64.grad, torch.ones(64, 48, device="cuda", dtype=torch.float64)
                               @ B64.detach())


def test_generated_backward_without_a_gradient_for_some_inputs():
    """An input used only in a condition gets no gradient from the generated backward (it
    returns only d_Y); PyTorch sees None for it (its .grad stays None)."""
    op = tct.op("def f(float(N) X, float(N) Y) -> (O) { O(i) = X(i) > 0 ? Y(i) * 2 : 0 }", "f")
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    op(x, y).sum().backward()
    assert x.grad is None
    torch.testing.assert_close(y.grad, (x.detach() > 0).double() * 2)


# -- index tensors are checked, as PyTorch's gathers check them ---------------------------------

@pytest.mark.parametrize("bad", [10, -1, 100])
def test_an_index_out_of_its_table_is_an_index_error_naming_it(lut2, bad):
    LUT1, I1, LUT2, I2 = _lut_inputs()
    I2 = I2.clone()
    I2[2, 1] = bad
    with pytest.raises(IndexError, match=rf"index {bad} in I2\[2, 1\] is out of range for "
                                         r"dimension 0 of LUT2, which is \[0, 8\)"):
        lut2(LUT1, I1, LUT2, I2)
    with pytest.raises(IndexError):  # (PyTorch's own gather agrees it is out of range)
        torch.nn.functional.embedding(I2.long(), LUT2)


def test_the_backward_checks_its_indices_too(lut2):
    """The backward TC scatters through the same indices: called on its own with a bad one, it
    is refused as well, not clamped into a wrong gradient."""
    LUT1, I1, LUT2, I2 = (t.requires_grad_() if t.is_floating_point() else t
                          for t in _lut_inputs())
    O1, O2 = lut2(LUT1, I1, LUT2, I2)
    bad = I1.clone()
    bad[0, 0] = 10
    with pytest.raises(IndexError, match=r"I1\[0, 0\]"):
        lut2.backward_op(LUT1.detach(), bad, LUT2.detach(), I2, O1.detach(), O2.detach(),
                         torch.ones_like(O1), torch.ones_like(O2))


def test_labels_are_checked_over_the_elements_read():
    """Only the elements a statement reads are checked: L(n) for n in 0:2 here, so a bad
    label past them is no error, and one within them is."""
    with warnings.catch_warnings():  # (that L has at least 2 elements is not checked)
        warnings.simplefilter("ignore", tc.TCWarning)
        op = tct.op("def pick(float(N,C) X, int32(M) L) -> (O) { O(n) = X(n, L(n)) "
                    "where n in 0:2 }", "pick")
    X = torch.arange(12.0).reshape(2, 6)
    L = torch.tensor([5, 0, 99], dtype=torch.int32)
    torch.testing.assert_close(op(X, L), torch.tensor([5.0, 6.0]))
    L[1] = 6
    with pytest.raises(tc.TCIndexError, match=r"index 6 in L\[1\] .* dimension 1 of X"):
        op(X, L)


def test_an_operator_warns_only_of_its_own_function(monkeypatch):
    """An operator made from a module of several TCs (examples/nn.tc) neither warns of the
    others' unchecked index subscripts (it does not run them; their own operators check
    them), nor of its own, nor again when its first recorded call derives the forward that
    keeps its statistics (a copy of the whole module). Checked against PyTorch's group norm."""
    from tcstage.grad import memo
    monkeypatch.setattr(memo.DERIVED, "get", lambda key: None)  # (the derivation runs here)
    source = _example("nn.tc")
    with pytest.warns(tc.TCWarning, match="cross_entropy"):  # (the module's own warnings)
        tc.define(source)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        op = tct.op(source, "groupnorm")
        X = torch.randn(2, 2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
        G = torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
        B = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        op(X, G, B).pow(2).sum().backward()
    X0, G0, B0 = (t.detach().clone().requires_grad_() for t in (X, G, B))
    torch.nn.functional.group_norm(X0.reshape(2, 6, 2, 2), 2, G0.reshape(-1), B0.reshape(-1),
                                   eps=1e-5).pow(2).sum().backward()
    for ours, theirs in ((X, X0), (G, G0), (B, B0)):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_the_index_check_can_be_skipped(lut2):
    LUT1, I1, LUT2, I2 = _lut_inputs()
    I1 = I1.clone()
    I1[0, 0] = 10
    lut2.check_indices = False
    try:
        O1, _ = lut2(LUT1, I1, LUT2, I2)  # (no error: the read is clamped, as documented)
        assert O1.shape == (3, 4)
    finally:
        lut2.check_indices = True


def _operator_log():
    """A TorchDispatchMode recording the names of the operators dispatched under it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    return Log()


def test_plain_eager_calls_skip_the_dispatcher_and_every_mode_still_sees_the_operator(tmm):
    """A plain eager call (CPU tensors, nothing recording a graph, no mode) runs the operator's
    implementation directly; under a dispatch mode, the profiler or autograd it goes through
    the operator, as any other."""
    a, b = torch.randn(5, 7), torch.randn(3, 7)
    want = torch.einsum("mk,nk->mn", a, b)
    torch.testing.assert_close(tmm(a, b), want)

    with _operator_log() as log:
        torch.testing.assert_close(tmm(a, b), want)
    assert any(o.startswith(f"tcstage.{tmm.op_name}") for o in log.ops), log.ops
    with torch.profiler.profile() as prof:
        tmm(a, b)
    assert any(tmm.op_name in e.name for e in prof.events())
    # a graph for autograd: through the operator, whose gradient is PyTorch's
    a.requires_grad_(True)
    out = tmm(a, b)
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(0).expand(5, 7))
    with torch.no_grad():  # (nothing recorded: direct again)
        assert tmm(a, b).grad_fn is None


def test_recorded_eager_calls_skip_the_dispatcher_with_the_same_gradients(tmm):
    """An eager call that autograd records (a tensor or Parameter requiring grad, plain CPU
    tensors, no mode) runs through the operator's own autograd.Function instead of the
    dispatcher's autograd wrapper (70-100 us a call): its gradients equal the registered
    operator's and einsum's; a dispatch mode, the profiler and double backward still see the
    operator."""
    a = torch.nn.Parameter(torch.randn(5, 7, dtype=torch.float64))
    b = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(5, 3, dtype=torch.float64)
    out = tmm(a, b)
    assert type(out.grad_fn).__name__.startswith(f"tcstage_{tmm.op_name}"), out.grad_fn
    eager = torch.autograd.grad(out, (a, b), d_out)
    through_op = torch.autograd.grad(tmm.op(a, b), (a, b), d_out)
    assert type(tmm.op(a, b).grad_fn).__name__.startswith("GeneratedBackwardFor_")  # (the
    #                                                      operator's registered autograd)
    want = torch.autograd.grad(torch.einsum("mk,nk->mn", a, b), (a, b), d_out)
    for got, ref, want_ in zip(eager, through_op, want):
        torch.testing.assert_close(got, want_)
        torch.testing.assert_close(ref, want_)
    only_b = torch.autograd.grad(tmm(a.detach(), b), b, d_out)[0]  # (needs_input_grad)
    torch.testing.assert_close(only_b, want[1])

    with _operator_log() as log:
        tmm(a, b).sum().backward()
    assert any(o.startswith(f"tcstage.{tmm.op_name}") for o in log.ops), log.ops
    with torch.profiler.profile() as prof:
        tmm(a, b)
    assert any(tmm.op_name in e.name for e in prof.events())
    (g,) = torch.autograd.grad(tmm(a, b).sum(), a, create_graph=True)
    with pytest.raises(tc.TCError, match="double backward"):
        g.sum().backward()


def test_a_call_with_other_argument_types_is_checked_again(tmm):
    a, b = torch.randn(5, 7), torch.randn(3, 7)
    tmm(a, b)
    with pytest.raises(tc.TCArgumentError, match="expects B as a torch.Tensor, got float"):
        tmm(a, 1.0)
    with pytest.raises(tc.TCArgumentError, match="takes 2 inputs"):
        tmm(a)
    tmm(a, b)


def test_a_scalar_output_reaches_the_backward_operator_as_a_number():
    """A 0-dimensional output (a loss) is a scalar input of the backward TC: its tensor is the
    dispatcher's to convert, so that call goes through the operator even in plain eager mode
    (cross-entropy's gradient failed when it did not)."""
    layer = tct.op("def sumsq(float(N) X) -> (S) { S +=! X(i) * X(i) }", "sumsq")
    x = torch.randn(37, requires_grad=True)
    loss = layer(x)
    torch.testing.assert_close(loss, (x.detach() ** 2).sum())
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_indices_are_checked_on_every_call_of_a_memoised_layout(lut2):
    """The bounds are worked out once per set of sizes; each call still checks the values."""
    LUT1, I1, LUT2, I2 = _lut_inputs()
    for _ in range(3):
        lut2(LUT1, I1, LUT2, I2)
    bad = I2.clone()
    bad[2, 1] = -1
    with pytest.raises(IndexError, match=r"index -1 in I2\[2, 1\] .* \[0, 8\)"):
        lut2(LUT1, I1, LUT2, bad)


def test_an_index_changed_after_the_forward_is_refused_by_autograd(lut2):
    """The backward of a call does not check its indices again (the forward did): autograd
    saved them and refuses a backward after they were changed in place."""
    LUT1, I1, LUT2, I2 = (t.requires_grad_() if t.is_floating_point() else t
                          for t in _lut_inputs())
    O1, O2 = lut2(LUT1, I1, LUT2, I2)
    I1[0, 0] = 100
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (O1.sum() + O2.sum()).backward()


# Layers whose backward reads reductions of the forward (the class `tcstage.grad.keeping`
# serves), each with PyTorch's own form: (TC, name, input shapes, reference, kept temporaries)
KEEPING_FAMILY = {
    "rmsnorm": ("""def rmsnorm(float(N,C) X, float(C) G) -> (Y) {
        ms(n) +=! X(n,c) * X(n,c) / C
        Y(n,c) = G(c) * X(n,c) * rsqrt(ms(n) + 1e-6)
    }""", [(6, 11), (11,)],
        lambda x, g: g * x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6), ("ms",)),
    "softmax": ("""def softmax(float(N,C) X) -> (Y) {
        M(n) max=! X(n,c)
        E(n,c) = exp(X(n,c) - M(n))
        S(n) +=! E(n,c)
        Y(n,c) = E(n,c) / S(n)
    }""", [(5, 9)], lambda x: torch.softmax(x, 1), None),  # (its gradient reads Y alone)
    "logsumexp": ("""def logsumexp(float(N,C) X) -> (L) {
        M(n) max=! X(n,c)
        S(n) +=! exp(X(n,c) - M(n))
        L(n) = log(S(n)) + M(n)
    }""", [(7, 4)], lambda x: torch.logsumexp(x, 1), ("M", "S")),
    "batchnorm": ("""def batchnorm(float(N,C) X, float(C) G, float(C) B) -> (Y) {
        mean(c) +=! X(n,c) / N
        var(c) +=! (X(n,c) - mean(c)) * (X(n,c) - mean(c)) / N
        Y(n,c) = G(c) * (X(n,c) - mean(c)) * rsqrt(var(c) + 1e-5) + B(c)
    }""", [(10, 3), (3,), (3,)],
        lambda x, g, b: torch.nn.functional.batch_norm(x, None, None, g, b, training=True,
                                                        eps=1e-5), ("mean", "var")),
    "planenorm": ("""def planenorm(float(B,I,J) X) -> (Y) {
        mean(b) +=! X(b,i,j) / (I*J)
        var(b) +=! (X(b,i,j) - mean(b)) * (X(b,i,j) - mean(b)) / (I*J)
        Y(b,i,j) = (X(b,i,j) - mean(b)) * rsqrt(var(b) + 1e-5)
    }""", [(3, 4, 5)],
        lambda x: torch.nn.functional.layer_norm(x, (4, 5), eps=1e-5), ("mean", "var")),
    "l2normalize": ("""def l2normalize(float(N,C) X) -> (Y) {
        sq(n) +=! X(n,c) * X(n,c)
        Y(n,c) = X(n,c) / sqrt(sq(n) + 1e-6)
    }""", [(4, 13)], lambda x: x / torch.sqrt((x * x).sum(1, keepdim=True) + 1e-6),
        ("sq",)),
}


@pytest.mark.parametrize("layer", sorted(KEEPING_FAMILY))
def test_layers_that_keep_reductions_against_pytorch(layer):
    """Normalisations and their kin, each a reduction the output reads: through a recorded
    call (the keeping pair, where the backward reads kept reductions) and the plain pair, in
    float64, outputs and every input's gradient against PyTorch's, over repeated calls."""
    source, shapes, ref, kept = KEEPING_FAMILY[layer]
    g = torch.Generator().manual_seed(11)
    args = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
            for s in shapes]
    op = tct.op(source, layer)
    for _ in range(2):
        out = op(*args)
        d_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
        got = torch.autograd.grad(out, args, d_out)
        want_out = ref(*args)
        want = torch.autograd.grad(want_out, args, d_out)
        torch.testing.assert_close(out, want_out)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    pair = op._keeping()
    assert (pair and tuple(o.removesuffix("_kept") for o in
                           pair.forward_op.checked.outputs[pair.outputs:])) == kept
    with torch.no_grad():  # (the plain forward, unrecorded)
        torch.testing.assert_close(op(*args), ref(*args))


def test_a_scalar_output_gradient_follows_each_call():
    """A scalar output and its gradient reach the backward as numbers that change with every
    call (a loss): each backward uses its own."""
    op = tct.op("def sumsq(float(N) X) -> (L) { L +=! X(i) * X(i) }", "sumsq")
    for k, g in enumerate((1.0, -2.5, 0.125)):
        X = torch.linspace(-1, 1, 9, dtype=torch.float64).mul(k + 1).requires_grad_()
        (dX,) = torch.autograd.grad(op(X), X, torch.tensor(g, dtype=torch.float64))
        torch.testing.assert_close(dX, 2 * X.detach() * g)


@pytest.mark.parametrize("layer", ["layernorm", "groupnorm", "cross_entropy"])
def test_recorded_calls_keep_the_reductions_their_backward_reads(layer):
    """Where autograd records the call, the forward returns the reductions its generated
    backward would recompute (a norm's mean and variance, a cross-entropy's row maxima and
    sums: `tcstage.grad.keeping`) and the backward takes them; outputs and gradients, over
    repeated calls (the memoised path too), against PyTorch's layers."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=g, requires_grad=True)
    if layer == "layernorm":
        op = tct.op(_example("layers.tc"), "layernorm")
        args = (rand(37, 19), rand(19), rand(19))

        def ref(x, gamma, beta):
            return F.layer_norm(x, (19,), gamma, beta, eps=1e-5)
    elif layer == "groupnorm":
        op = tct.op(_example("nn.tc"), "groupnorm")
        args = (rand(3, 2, 3, 5, 7), rand(2, 3), rand(2, 3))

        def ref(x, gamma, beta):
            return F.group_norm(x.reshape(3, 6, 5, 7), 2, gamma.reshape(-1), beta.reshape(-1),
                                eps=1e-5).reshape(x.shape)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            op = tct.op(_example("nn.tc"), "cross_entropy")
        args = (rand(9, 5), torch.randint(0, 5, (9,), generator=g, dtype=torch.int32))

        def ref(x, label):
            return F.cross_entropy(x, label.long())
    wants = [a for a in args if a.requires_grad]
    for _ in range(3):
        out = op(*args)
        d_out = torch.randn(out.shape, generator=g)
        got = torch.autograd.grad(out, wants, d_out)
        want_out = ref(*args)
        want = torch.autograd.grad(want_out, wants, d_out)
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    kept = op._keeping()
    assert kept is not None and kept.forward_op.role == "kept forward"
    assert kept.forward_op.checked.outputs[1:] == tuple(
        f"{t}_kept" for t in (("M", "S") if layer == "cross_entropy" else ("mean", "var")))
