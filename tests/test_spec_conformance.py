"""Every TC program of the spec documents (000, 001, 003, 004): the ones meant to run run and
match numpy; the ones meant to fail fail with the right error. Ranges are compared with the
spec's worked examples by evaluating both formulas over many sizes (where the spec is wrong,
the test says so: see docs/language.md)."""

import warnings

import numpy as np
import pytest

import tcstage as tc

rng = np.random.default_rng(2026)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def one(source):
    """The single function of a source, its warnings swallowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        prog = tc.define(source)
    return prog[prog.names[0]]


def ranges_of(fn, *shapes):
    """{var: (begin, end)} per statement for concrete shapes."""
    return [r.concrete for r in fn.ranges(*shapes)]


# ---------------------------------------------------------------- spec 001: range inference

def test_matmul_ranges_and_result():
    f = one("def mat_mul(float(I, K) B, float(K, J) C) -> A { A(i, j) +=! B(i, k) * C(k, j) }")
    assert ranges_of(f, (5, 7), (7, 3)) == [{"i": (0, 5), "j": (0, 3), "k": (0, 7)}]
    B, C = f32(5, 7), f32(7, 3)
    np.testing.assert_allclose(f(B, C), B @ C, rtol=1e-5, atol=1e-5)


def test_stencil_maximises_the_kernel_first():
    f = one("def st(float(N) B, float(M) K) -> (A) { A(i) +=! B(i + k) * K(k) }")
    # k covers all of K, so A is shorter than B: the behaviour the spec prefers.
    assert ranges_of(f, (10,), (3,)) == [{"i": (0, 8), "k": (0, 3)}]
    B, K = f32(10), f32(3)
    ref = np.array([sum(B[i + k] * K[k] for k in range(3)) for i in range(8)])
    np.testing.assert_allclose(f(B, K), ref, rtol=1e-5, atol=1e-5)


def test_unchecked_precondition_is_a_warning_with_the_condition():
    src = "def pre(float(I) B, float(K) C, float(J) D) -> (A) { A(i, j) = B(i) * C(i + j) * D(j) }"
    with pytest.warns(tc.TCWarning, match=r"C at subscript 'i \+ j'.*I \+ J - 1 <= K"):
        prog = tc.define(src)
    B, C, D = f32(3), f32(6), f32(4)
    np.testing.assert_allclose(prog.pre(B, C, D), B[:, None] * C[np.add.outer(range(3), range(4))]
                               * D[None, :], rtol=1e-6)


def test_precondition_halide_can_prove_is_not_reported():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        tc.define("def ok(float(I) B, float(I) D) -> (A) { A(i) = B(i) + D(i) }")


def test_lookup_table_warns_and_clamping_form_runs():
    src = "def lut(float(J) B, int(I) C) -> (A) { A(i) = B(C(i)) }"
    with pytest.warns(tc.TCWarning, match=r"'C\(i\)' of B depends on tensor values.*\[0, J\)"):
        prog = tc.define(src)
    B, C = f32(10), rng.integers(0, 10, 7).astype(np.int32)
    np.testing.assert_array_equal(prog.lut(B, C), B[C])
    clamped = one("def lut(float(J) B, int(I) C) -> (A) { A(i) = B(max(min(C(i), J-1), 0)) }")
    C2 = np.array([-5, 0, 3, 99], np.int32)
    np.testing.assert_array_equal(clamped(B, C2), B[np.clip(C2, 0, 9)])


def test_spec_lut_with_float_indices_is_a_type_error():
    # Spec 001 declares the look-up table's index tensor float; subscripts must be integers.
    with pytest.raises(tc.TCSemanticError, match="subscript must be an integer, not float32"):
        tc.define("def lut(float(J) B, float(I) C) -> A { A(i) = B(C(i)) }")


def test_inverted_indexing_spec_is_wrong_about_the_lower_bound():
    # The spec states 9 - I <= i < 11. From 0 <= 10 - i < I: i <= 10 and i >= 11 - I.
    f = one("def reverted(float(I) B) -> A { A(i) = B(10 - i) }")
    assert f.ranges()[0].symbolic["i"] == "11 - I <= i < 11"
    for size in range(1, 15):
        (lo, hi), = f.ranges((size,))[0].concrete.values()
        legal = [i for i in range(-30, 30) if 0 <= 10 - i < size]
        assert (lo, hi) == (min(legal), max(legal) + 1)
    B = f32(6)
    assert f.output_shapes(B) == [(6,)] and f.output_mins(B) == [(5,)]
    # Element 0 of the result is A(5) = B(5); element 5 is A(10) = B(0).
    np.testing.assert_array_equal(f(B), B[10 - np.arange(5, 11)])


def test_constant_stride():
    f = one("def subsample_2(float(I) B) -> A { A(i) = B(2*i) }")
    for size in range(1, 20):
        assert f.ranges((size,))[0].concrete["i"] == (0, (size + 1) // 2)  # spec: (I+1)/2
    B = f32(9)
    np.testing.assert_array_equal(f(B), B[::2])


def test_strided_with_offsets_intersects():
    f = one("def average_pool_2(float(I) B) -> A { A(i) = B(2*i) + B(2*i + 1) }")
    for size in range(1, 20):
        assert f.ranges((size,))[0].concrete["i"] == (0, size // 2)
    B = f32(9)
    np.testing.assert_allclose(f(B), B[0:8:2] + B[1:9:2], rtol=1e-6)


def test_where_clause_form_of_average_pool_needs_a_reduction():
    # The spec's "equivalent code" uses '=' although k appears only on the right.
    with pytest.raises(tc.TCSemanticError, match="'k' appears only on the right-hand side"):
        tc.define("def average_pool_2(float(I) B) -> A { A(i) = B(2*i + k) where k = [0, 2[ }")
    f = one("def average_pool_2(float(I) B) -> A { A(i) +=! B(2*i + k) where k = [0, 2[ }")
    for size in range(1, 20):
        assert f.ranges((size,))[0].concrete == {"i": (0, size // 2), "k": (0, 2)}
    B = f32(9)
    np.testing.assert_allclose(f(B), B[0:8:2] + B[1:9:2], rtol=1e-6)


def test_dynamic_stride_is_a_compile_time_error():
    with pytest.raises(tc.TCRangeError, match="'i'.*depends on tensor values") as e:
        tc.define("def subsample_2(float(I) B, int(1) S) -> A { A(i) = B(S(0)*i) }")
    assert "where" in str(e.value)


def test_dynamic_stride_with_where_clause_runs():
    f = one("def sub(float(I) B, int(1) S) -> (A) { A(i) = B(S(0)*i) where i in 0:I/2 }")
    B = f32(10)
    np.testing.assert_array_equal(f(B, np.array([2], np.int32)), B[0:10:2])


# ---------------------------------------------------------------- spec 000/004 examples

def test_004_mv_accumulates_into_the_callers_output():
    f = one("def mv(float(R,C) A, float(C) B) -> (o) {\no(i) += A(i,j) * B(j)\n}")
    A, B, o = f32(4, 5), f32(5), f32(4)
    expected = o + A @ B
    result = f(A, B, out=o)
    assert result is o
    np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(tc.TCArgumentError, match="output 'o'.*out="):
        f(A, B)


def test_004_mm_does_what_it_says():
    # The 004 "matrix multiply" reads A(i,j) * B(j,k) and reduces over k into R(i,j).
    f = one("def mm(float(X,Y) A, float(Y,Z) B) -> (R) {\nR(i,j) += A(i,j) * B(j,k)\n}")
    A, B, R = f32(3, 4), f32(4, 5), f32(3, 4)
    expected = R + A * B.sum(axis=1)[None, :]
    np.testing.assert_allclose(f(A, B, out=R), expected, rtol=1e-5, atol=1e-5)


def test_004_conv_and_maxpool():
    conv = one("def conv(float(B,IP,H,W) input, float(OP,IP,KH,KW) weight) -> (output) {\n"
               "output(b, op, h, w) += input(b, ip, h + kh, w + kw) * weight(op, ip, kh, kw)\n}")
    x, w = f32(2, 3, 6, 7), f32(4, 3, 2, 3)
    out0 = f32(2, 4, 5, 5)
    ref = out0 + sum(np.einsum("bihw,oi->bohw", x[:, :, kh:kh + 5, kw:kw + 5], w[:, :, kh, kw])
                     for kh in range(2) for kw in range(3))
    np.testing.assert_allclose(conv(x, w, out=out0.copy()), ref, rtol=1e-4, atol=1e-4)
    # As printed, the maxpool misses the closing brace of its body.
    src = ("def maxpool2x2(float(B,C,H,W) input) -> (output) {\n"
           "output(b,c,i,j) max= input(b,c,2*i + kw, 2*j + kh)\n"
           "where kw = [0, 2[, kh = [0, 2[\n")
    with pytest.raises(tc.TCSyntaxError, match="missing '}'"):
        tc.define(src)
    pool = one(src + "}")
    x = f32(2, 3, 7, 8)
    init = np.full((2, 3, 3, 4), -np.inf, np.float32)
    ref = x[:, :, :6, :8].reshape(2, 3, 3, 2, 4, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(pool(x, out=init), ref)


# ---------------------------------------------------------------- the paper (003)

def test_paper_mv_two_statements():
    f = one("def mv(float(M,K) A, float(K) x) -> (C) {\n  C(i) = 0\n  C(i) += A(i,k) * x(k)\n}")
    assert f.checked.tensors["C"].type.name == "float32"
    A, x = f32(6, 4), f32(4)
    np.testing.assert_allclose(f(A, x), A @ x, rtol=1e-5, atol=1e-5)


def test_paper_mv_one_line():
    f = one("def mv(float(M,K) A, float(K) x) -> (C) { C(i) +=! A(i,k) * x(k) }")
    A, x = f32(6, 4), f32(4)
    np.testing.assert_allclose(f(A, x), A @ x, rtol=1e-5, atol=1e-5)


def test_paper_sgemm_in_out():
    f = one("def sgemm(float a, float b, float(N,M) A, float(M,K) B) -> (C) {\n"
            "  C(i,j) = b * C(i,j)   # initialization\n"
            "  C(i,j) += a * A(i,k) * B(k,j)   # accumulation\n}")
    A, B, C = f32(3, 5), f32(5, 4), f32(3, 4)
    expected = 0.5 * C + 2.0 * (A @ B)
    np.testing.assert_allclose(f(2.0, 0.5, A, B, out=C), expected, rtol=1e-5, atol=1e-5)


def test_paper_gather_and_outer_product():
    g = one("def gather(float(N) X, int(A,B) I) -> (Z) { Z(i,j) = X(I(i,j)) }")
    X, I = f32(9), rng.integers(0, 9, (3, 4)).astype(np.int32)
    np.testing.assert_array_equal(g(X, I), X[I])
    o = one("def outerProductMM(float(P,Q,R) A, float(S,R,T) B) -> (O) {"
            " O(p,s,q,t) +=! A(p,q,r) * B(s,r,t) }")
    A, B = f32(2, 3, 4), f32(5, 4, 2)
    np.testing.assert_allclose(o(A, B), np.einsum("pqr,srt->psqt", A, B), rtol=1e-5, atol=1e-5)


def test_paper_conv1d_as_printed_misses_its_reduction():
    with pytest.raises(tc.TCSemanticError, match="'x' appears only on the right-hand side"):
        tc.define("def conv1d(float(M) I, float(N) K) -> (O) { O(i) = K(x) * I(i + x) }")
    f = one("def conv1d(float(M) I, float(N) K) -> (O) { O(i) +=! K(x) * I(i + x) }")
    I, K = f32(10), f32(3)
    np.testing.assert_allclose(f(I, K), np.correlate(I, K, "valid"), rtol=1e-5, atol=1e-5)


def test_paper_sconv2d_name_clash_and_fixed_version():
    with pytest.raises(tc.TCSemanticError, match="tensor 'W' has the name of a size variable"):
        tc.define("def sconv2d(int sh, int sw, float(N,C,H,W) I, float(F,C,KH,KW) W, "
                  "float(F) B) -> (O) {\n O(n,f,h,w) = B(f)\n"
                  " O(n,f,h,w) += I(n,c, sh * h + kh, sw * w + kw) * W(f,c,kh,kw)\n}")
    f = one(open_example("sconv2d.tc"))
    I, W, B = f32(2, 3, 11, 10), f32(4, 3, 3, 2), f32(4)
    for sh, sw in [(1, 1), (2, 3), (3, 2)]:
        Ho, Wo = (11 - 3) // sh + 1, (10 - 2) // sw + 1
        ref = np.zeros((2, 4, Ho, Wo), np.float32) + B[None, :, None, None]
        for kh in range(3):
            for kw in range(2):
                patch = I[:, :, kh:kh + sh * (Ho - 1) + 1:sh, kw:kw + sw * (Wo - 1) + 1:sw]
                ref += np.einsum("nchw,fc->nfhw", patch, W[:, :, kh, kw])
        assert f.output_shapes(sh, sw, I, W, B) == [ref.shape]
        np.testing.assert_allclose(f(sh, sw, I, W, B), ref, rtol=1e-4, atol=1e-4)


def test_paper_conv2d_maxpool_tmm_tbmm_and_lut():
    prog = tc.define(open_example("conv.tc") + open_example("tmm.tc") + open_example("tbmm.tc"))
    x = f32(2, 3, 8, 9)
    ref = x[:, :, :8, :8].reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(prog.maxpool2x2(x), ref)
    A, B = f32(5, 6), f32(7, 6)
    np.testing.assert_allclose(prog.tmm(A, B), A @ B.T, rtol=1e-5, atol=1e-5)
    X, Y = f32(3, 4, 5), f32(3, 6, 5)
    np.testing.assert_allclose(prog.tbmm(X, Y), np.einsum("bnm,bkm->bnk", X, Y), rtol=1e-5,
                               atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        lut = tc.define(open_example("lut.tc"))["2LUT"]
    L1, L2 = f32(20, 8), f32(30, 8)
    I1, I2 = rng.integers(0, 20, (4, 5)).astype(np.int32), rng.integers(0, 30, (4, 7)).astype(np.int32)
    O1, O2 = lut(L1, I1, L2, I2)
    np.testing.assert_allclose(O1, L1[I1].sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(O2, L2[I2].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_paper_mlp1_and_mlp3_as_written():
    prog = tc.define(open_example("mlp.tc"))
    I, W1, B1 = f32(4, 6), f32(5, 6), f32(5)
    np.testing.assert_allclose(prog.MLP1(I, W1, B1), np.maximum(I @ W1.T + B1, 0), rtol=1e-5,
                               atol=1e-5)
    W2, B2, W3, B3, W4, B4 = f32(7, 6), f32(7), f32(3, 7), f32(3), f32(2, 3), f32(2)
    O2, O3, O4 = prog.MLP3(I, W2, B2, W3, B3, W4, B4)
    r2 = np.maximum(I @ W2.T + B2, 0)
    r3 = np.maximum(r2 @ W3.T + B3, 0)
    r4 = np.maximum(r3 @ W4.T + B4, 0)
    for got, ref in [(O2, r2), (O3, r3), (O4, r4)]:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_paper_dconv_is_rejected():
    with pytest.raises(tc.TCSemanticError, match="'W1' has rank 4 but is read with 5"):
        tc.define("def dconv(float(N,F,H,W) I, float(F,GCI,KH,KW) W1, float(M) B) -> (O) {\n"
                  " O(n,o,h,w) +=! I(n,gci,h+kh,w+kw) * W1(gci % grp,o/grp,gci/grp,kh,kw)\n"
                  " O(n,o,h,w) = O(n,o,h,w) + B(m)\n}")


def test_paper_tc_calling_tc():
    # the first call of the paper's prodModel (Figure 15), inlined (tests/test_tc_calls.py)
    prog = tc.define(open_example("lut.tc") + """
def prodModel(float(E1,D) LUT1, int(B,L1) I1, float(E2,D) LUT2, int(B,L2) I2) -> (C1, C2) {
  (C1,C2) = 2LUT(LUT1,I1,LUT2,I2)
}""")
    rng = np.random.default_rng(0)
    lut1, lut2 = rng.random((7, 4), dtype=np.float32), rng.random((5, 4), dtype=np.float32)
    i1, i2 = rng.integers(0, 7, (3, 2), dtype=np.int32), rng.integers(0, 5, (3, 6), dtype=np.int32)
    c1, c2 = prog.prodModel(lut1, i1, lut2, i2)
    np.testing.assert_allclose(c1, lut1[i1].sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(c2, lut2[i2].sum(axis=1), rtol=1e-5)


def test_maxpool_without_where_is_ambiguous():
    with pytest.raises(tc.TCRangeError, match="ambiguous") as e:
        tc.define("def maxpool2x2(float(B,C,H,W) in) -> (out) {"
                  " out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh) }")
    assert "where" in str(e.value)


def open_example(name):
    from pathlib import Path
    return (Path(__file__).parent.parent / "examples" / name).read_text()


def test_a_literal_start_takes_its_type_from_the_first_decided_statement():
    # D starts as a literal, then float; C starts as a literal and accumulates D: C is float
    # too (it was int32, learned from D's provisional type, and truncated 0.75 to 0), and so
    # is E, whose first statement reads D before D was decided
    f = tc.define("""def f(float(N) A) -> (C, E) {
  D(i) = 0 where i in 0:N
  C(i) = 0 where i in 0:N
  E(i) = D(i) * 2
  C(i) += D(i)
  D(i) += A(i)
}""").f
    C, E = f(np.full(3, 0.75, np.float32))
    assert C.dtype == np.float32 and E.dtype == np.float32
    np.testing.assert_array_equal(C, [0, 0, 0])  # (C read D before A was added: 0)


def test_a_chain_of_literal_starts_takes_its_types_in_order():
    """T starts as a literal and sums W times an int C; B starts as a literal and sums T. B
    is float64 like T: it took T's provisional int32 (both were learned in one pass) and
    truncated W's values (gradient fuzz seed 973668). Against numpy."""
    f = tc.define("""def g(double(K) W, double(K) V) -> (B) {
  C(q) = V(q) > 0 ? 1 : 0
  T(y) = 0 where y in 0:K
  T(i) += W(i) * C(i)
  B(y) = 0 where y in 0:K
  B(k) += T(k)
}""").g
    assert {n: str(t.type) for n, t in f.checked.tensors.items() if n in "CTB"} == \
        {"C": "int32", "T": "float64", "B": "float64"}
    W, V = np.array([1.5, 2.5, 3.5]), np.array([1.0, -1.0, 1.0])
    out = f(W, V)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, W * (V > 0))
