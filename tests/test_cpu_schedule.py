"""The structure-aware CPU scheduler (tcstage/cpu/): every family it schedules (pointwise,
reductions of every kind, layers with epilogues) gives numpy's results at awkward sizes (1, primes,
below and just above a vector), under its default and explicit `CpuSchedule`s, and across the
sizes one shape-generic kernel serves; `CpuSchedule` text round-trips; bad options and schedule
names are TCErrors naming the problem; `explain()` says which schedule ran and why it fell back.

References are numpy in float64 (einsum, loops, np.add.at). A float32 sum of n terms is within
about n * eps * sum(|terms|) of the exact value, whatever the order of the additions: the checks
use that bound (with eps rounded up to 1e-6), so a wrong term or a lost point fails them.
"""

import re
import warnings

import halide as hl
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcstage as tc
from tcstage.cpu.options import TCScheduleError

rng = np.random.default_rng(2024)
# float32 lanes of this machine's vectors: 16 with AVX-512, 8 with AVX2
LANES = hl.get_jit_target_from_environment().natural_vector_size(hl.Float(32))


def f32(*shape, low=None, high=None):
    if low is not None:
        return rng.uniform(low, high, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def assert_sum_close(got, exact, magnitude, terms):
    """`got` (float32) within terms * 1e-6 * `magnitude` (the sum of the terms' absolute
    values) of the float64 `exact`."""
    got = np.asarray(got)
    assert got.shape == np.shape(exact), (got.shape, np.shape(exact))
    bound = 1e-6 * max(terms, 1) * np.asarray(magnitude) + 1e-6
    excess = np.abs(got.astype(np.float64) - exact) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.ndim else ()
    assert np.all(excess <= 0), (f"at {worst}: got {got[worst]}, expected {exact[worst]} "
                                 f"(allowed error {bound[worst] if np.ndim(bound) else bound})")


def call(fn, *args, **kwargs):
    """A call that fails on a TCWarning (a schedule falling back to unscheduled code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        return fn(*args, **kwargs)


def define(source):
    """The only function of `source` (warnings about unchecked subscripts silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        program = tc.define(source)
    (name,) = program.names
    return getattr(program, name)


def assert_pointwise_temp(got, A, S):
    """POINTWISE_TEMP's result: Halide may fuse T * 3 + max(T, 0) into one multiply-add,
    which rounds once instead of twice (a few ulps)."""
    T = A.astype(np.float64) * S
    np.testing.assert_allclose(got, np.maximum(T, 0) + T * 3, rtol=1e-6, atol=1e-7)


def first_line(fn, *args, **kwargs):
    return fn.explain(*args, **kwargs).splitlines()[0]


# --- the TCs and their references ---------------------------------------------------------

POINTWISE = "def relu2(float(N,M) A) -> (O) { O(i,j) = fmaxf(A(i,j), 0) * 2 }"
# a temporary: inlined into O by default, computed once with inlinePointwise(False)
POINTWISE_TEMP = """def pwt(float(N,M) A, float(M) S) -> (O) {
  T(i,j) = A(i,j) * S(j)
  O(i,j) = fmaxf(T(i,j), 0) + T(i,j) * 3
}"""
GEMM = "def gemm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
GRAM = "def gram(float(M,K) A) -> (C) { C(i,j) +=! A(i,k) * A(j,k) }"
TBMM = "def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) { Z(b,n,k) +=! X(b,n,m) * Y(b,k,m) }"
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
  O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * W1(f,c,kh,kw)
}"""
LUT = "def lut(float(E,D) LUT, int(B,L) I) -> (O) { O(i,j) +=! LUT(I(i,k),j) }"
MAXPOOL = """def maxpool(float(B,C,H,W) I) -> (O) {
  O(b,c,i,j) max=! I(b,c,2*i+kh,2*j+kw) where kh in 0:2, kw in 0:2
}"""
ROW_SUM = "def rowsum(float(N,M) A) -> (O) { O(i) +=! A(i,j) }"
SCALAR_SUM = "def total(float(N) A) -> (O) { O() +=! A(i) }"
MLP = """def mlp(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b,n) +=! I(b,m) * W1(n,m)
  O1(b,n) = fmaxf(O1(b,n) + B1(n), 0)
}"""
MLP2 = """def mlp2(float(B,M) I, float(N,M) W1, float(N) B1, float(P,N) W2, float(P) B2)
    -> (O1, O2) {
  O1(b,n) +=! I(b,m) * W1(n,m)
  O1(b,n) = fmaxf(O1(b,n) + B1(n), 0)
  O2(b,p) +=! O1(b,n) * W2(p,n)
  O2(b,p) = fmaxf(O2(b,p) + B2(p), 0)
}"""
PRODUCT = "def rowprod(float(N,M) A) -> (O) { O(i) *=! A(i,j) }"
MIN_PLUS = "def minplus(float(N,K) A, float(K,M) B) -> (O) { O(i,j) min=! A(i,k) + B(k,j) }"
INT_SUM = "def isum(int(N,M) A) -> (O) { O(j) +=! A(i,j) }"
DOUBLE_TMM = "def dtmm(double(M,K) A, double(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
SCATTER = """def h(float(N) A, int(K) I) -> (O) {
  O(i) = 0 where i in 0:N
  O(I(k)) += A(k) where k in 0:K
}"""


def check_gemm(fn, M, K, N, **kw):
    A, B = f32(M, K), f32(K, N)
    C = call(fn, A, B, **kw)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    assert_sum_close(C, A64 @ B64, np.abs(A64) @ np.abs(B64), K)


def check_tmm(fn, M, K, N, **kw):
    A, B = f32(M, K), f32(N, K)
    C = call(fn, A, B, **kw)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    assert_sum_close(C, A64 @ B64.T, np.abs(A64) @ np.abs(B64).T, K)


def check_tbmm(fn, B, N, M, K, **kw):
    X, Y = f32(B, N, M), f32(B, K, M)
    Z = call(fn, X, Y, **kw)
    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    assert_sum_close(Z, np.einsum("bnm,bkm->bnk", X64, Y64),
                     np.einsum("bnm,bkm->bnk", np.abs(X64), np.abs(Y64)), M)


def conv_reference(I, W):
    """Loops over the kernel window; each term an einsum over n, c, f."""
    n, c, h, w = I.shape
    f, _, kh, kw = W.shape
    out = np.zeros((n, f, h - kh + 1, w - kw + 1))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,fc->nfhw", I[:, :, i:i + h - kh + 1, j:j + w - kw + 1],
                             W[:, :, i, j])
    return out


def check_conv(fn, N, C, H, W, F, KH, KW, **kw):
    I, W1 = f32(N, C, H, W), f32(F, C, KH, KW)
    O = call(fn, I, W1, **kw)
    I64, W64 = I.astype(np.float64), W1.astype(np.float64)
    assert_sum_close(O, conv_reference(I64, W64), conv_reference(np.abs(I64), np.abs(W64)),
                     C * KH * KW)


def check_mlp(fn, B, M, N, **kw):
    I, W1, B1 = f32(B, M), f32(N, M), f32(N)
    O = call(fn, I, W1, B1, **kw)
    I64, W64, B64 = (x.astype(np.float64) for x in (I, W1, B1))
    # relu is 1-Lipschitz: the bound of the sum plus bias holds after it
    assert_sum_close(O, np.maximum(I64 @ W64.T + B64, 0),
                     np.abs(I64) @ np.abs(W64).T + np.abs(B64), M + 1)


def check_mlp2(fn, B, M, N, P, **kw):
    I, W1, B1, W2, B2 = f32(B, M), f32(N, M), f32(N), f32(P, N), f32(P)
    O1, O2 = call(fn, I, W1, B1, W2, B2, **kw)
    I64, W1_, B1_, W2_, B2_ = (x.astype(np.float64) for x in (I, W1, B1, W2, B2))
    exact1 = np.maximum(I64 @ W1_.T + B1_, 0)
    magnitude1 = np.abs(I64) @ np.abs(W1_).T + np.abs(B1_)
    assert_sum_close(O1, exact1, magnitude1, M + 1)
    # layer 2 sums N float32 terms of O1, each off by at most (M + 1) * 1e-6 * magnitude1
    assert_sum_close(O2, np.maximum(exact1 @ W2_.T + B2_, 0),
                     magnitude1 @ np.abs(W2_).T + np.abs(B2_), M + N + 2)


# --- 1. every family at awkward sizes, under the default schedule --------------------------

AWKWARD_2D = [(1, 1), (7, 13), (17, 29)]


@pytest.mark.parametrize("N,M", AWKWARD_2D)
def test_pointwise(N, M):
    fn = define(POINTWISE)
    A = f32(N, M)
    np.testing.assert_array_equal(call(fn, A), np.maximum(A, 0) * 2)
    assert first_line(fn, A).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,M", [(1, 1), (17, 29)])
@pytest.mark.parametrize("inline", [True, False])
def test_pointwise_temporary(N, M, inline):
    fn = define(POINTWISE_TEMP)
    A, S = f32(N, M), f32(M)
    schedule = tc.CpuSchedule().inlinePointwise(inline)
    assert_pointwise_temp(call(fn, A, S, schedule=schedule), A, S)
    text = fn.explain(A, S, schedule=schedule)
    assert text.startswith("CPU schedule: tcstage")
    assert ("inlined into its readers" in text) == inline


GEMM_SIZES = [(1, 1, 1), (1, 7, 17), (7, 13, 29), (16, 17, 33)]


@pytest.mark.parametrize("M,K,N", GEMM_SIZES)
def test_gemm_contraction_unpacked(M, K, N):
    fn = define(GEMM)
    check_gemm(fn, M, K, N)
    text = fn.explain(f32(M, K), f32(K, N))
    assert text.startswith("CPU schedule: tcstage")
    assert "packed" not in text  # B(k, n) is contiguous in the vectorised n


@pytest.mark.parametrize("M,K,N", GEMM_SIZES)
def test_tmm_contraction_packed(M, K, N):
    fn = define(TMM)
    check_tmm(fn, M, K, N)
    text = fn.explain(f32(M, K), f32(N, K))
    assert text.startswith("CPU schedule: tcstage")
    if N >= 16:  # vectorised in n, so B(n, k) is read across it: a packed panel
        assert "packed B" in text, text


@pytest.mark.parametrize("M,K,N,by_columns", [(20, 512, 1024, True), (20, 256, 512, False)])
def test_large_shared_operands_go_column_by_column(M, K, N, by_columns):
    """B(k, n) of 2 MiB (over the 1 MiB of COLUMN_ORDER_BYTES) is read column by column of
    tiles, each column's slice copied; 512 KiB keeps rows of tiles. numpy's product either
    way, in float64 against float32 results."""
    fn = define(GEMM)
    A, B = f32(M, K), f32(K, N)
    np.testing.assert_allclose(fn(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
    text = fn.explain(A, B)
    assert ("column by column of tiles, B copied per column" in text) == by_columns, text


@pytest.mark.parametrize("M,K", [(7, 13), (29, 16)])
def test_gram_reads_one_input_both_ways(M, K):
    # A(j, k) is packed, A(i, k) is not: both read the same input
    fn = define(GRAM)
    A = f32(M, K)
    A64 = A.astype(np.float64)
    assert_sum_close(call(fn, A), A64 @ A64.T, np.abs(A64) @ np.abs(A64).T, K)
    assert first_line(fn, A).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("B,N,M,K", [(1, 1, 1, 1), (3, 7, 13, 29), (2, 17, 5, 16),
                                     (5, 2, 8, 17)])
def test_tbmm_batched(B, N, M, K):
    fn = define(TBMM)
    check_tbmm(fn, B, N, M, K)
    assert first_line(fn, f32(B, N, M), f32(B, K, M)).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,C,H,W,F,KH,KW", [(1, 1, 1, 1, 1, 1, 1), (3, 2, 6, 9, 17, 2, 5)])
def test_convolution(N, C, H, W, F, KH, KW):
    fn = define(CONV)
    check_conv(fn, N, C, H, W, F, KH, KW)
    assert first_line(fn, f32(N, C, H, W), f32(F, C, KH, KW)).startswith("CPU schedule: tcstage")


def test_a_convolutions_tile_rows_are_output_channels():
    # `I(n,c,h+kh,w+kw)` loads a vector shifted by kw (two cache lines mostly) per row of
    # output rows; rows of output channels share one (8x16x32x32, 3x3: 0.61 -> 0.17 ms)
    fn = define(CONV)
    check_conv(fn, 2, 16, 32, 32, 16, 3, 3)
    text = fn.explain(f32(2, 16, 32, 32), f32(16, 16, 3, 3))
    # (16 rows with AVX-512's 28 accumulators; 6 rows of 2 vectors with AVX2's 12)
    assert re.search(r"x (\d+) rows of f\)", text), text


def strided_conv_reference(I, W, stride, pad):
    """Loops over the window, on a zero-padded copy; each term an einsum over n, c, f."""
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    f, _, kh, kw = W.shape
    oh, ow = (P.shape[2] - kh) // stride + 1, (P.shape[3] - kw) // stride + 1
    out = np.zeros((I.shape[0], f, oh, ow))
    for i in range(kh):
        for j in range(kw):
            window = P[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,fc->nfhw", window, W[:, :, i, j].astype(np.float64))
    return out


STRIDED = {
    (2, 1): """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! (I(n,c,2*h+kh-1,2*w+kw-1) ?? 0) * Wt(f,c,kh,kw)
    where h in 0:(H+1)/2, w in 0:(W+1)/2
}""",
    (2, 0): """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw) where h in 0:(H-KH)/2+1, w in 0:(W-KW)/2+1
}""",
    (3, 0): """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c,3*h+kh,3*w+kw) * Wt(f,c,kh,kw) where h in 0:(H-KH)/3+1, w in 0:(W-KW)/3+1
}"""}


@pytest.mark.parametrize("stride, pad", list(STRIDED))
def test_strided_convolutions_read_their_input_by_phase(stride, pad):
    """A convolution of stride s reads its input at `s*w + kw (- 1)`: a vector of that read
    cost s loads and shuffles to deinterleave them, every time. It reads a copy of the input
    split by phase instead (`I_phases` in explain), each phase contiguous; the weight gradient
    too (conv_s2's, 32x32x32x32 64x3x3 on the AVX2 EPYC: 11-13 -> 5.5-7 ms, PyTorch 4.2-5.2,
    ad hoc). At odd widths and below a vector, each output and gradient against numpy on
    np.pad."""
    fn = define(STRIDED[stride, pad])
    grad = tc.define(tc.gradient(STRIDED[stride, pad], "conv")).conv_grad
    for n, c, h, w, f in [(2, 3, 9, 2 * LANES + 3, 5), (1, 2, 5, 5, 3), (2, 4, 11, 3 * LANES, 7)]:
        I, Wt = f32(n, c, h, w), f32(f, c, 3, 3)
        want = strided_conv_reference(I, Wt, stride, pad)
        O = call(fn, I, Wt)
        np.testing.assert_allclose(O, want, rtol=1e-4, atol=1e-4)
        dO = f32(*O.shape)
        dI, dWt = grad(I, Wt, O, dO)
        P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        oh, ow = O.shape[2:]
        want_dWt = np.zeros(Wt.shape)
        for i in range(3):
            for j in range(3):
                window = P[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
                want_dWt[:, :, i, j] = np.einsum("nfhw,nchw->fc", dO, window)
        np.testing.assert_allclose(dWt, want_dWt, rtol=1e-4, atol=1e-3)
        want_dP = np.zeros(P.shape)
        for i in range(3):
            for j in range(3):
                want_dP[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += \
                    np.einsum("nfhw,fc->nchw", dO, Wt[:, :, i, j].astype(np.float64))
        np.testing.assert_allclose(dI, want_dP[:, :, pad:pad + h, pad:pad + w],
                                   rtol=1e-4, atol=1e-3)
    # (the narrow call's rows are narrower than the planned tiles: one rescheduled pipeline)
    assert fn.compile_count <= 2, fn.compile_count
    for text in fn.explain(I, Wt), grad.explain(I, Wt, O, dO):
        assert re.search(r"I_phases\S*: pointwise", text), text
    # (the input gradient's phases sum `cond ? x : 0` over 2x2 taps where 3x3 have 9: only
    # where the condition holds, those taps' loops outermost)
    assert re.search(r"d_I_phases\S*: reduction \(add\) over [^,]+, [^,]+, \S+ where its "
                     r"condition holds", grad.explain(I, Wt, O, dO))


PREDICATED = [
    # (a condition on a variable the value does not use: Halide would drop it with the loop)
    ("def f(float(N) A) -> (O) { O(i) +=! k < 3 ? A(i) : 0 where k in 0:5 }",
     lambda A: 3 * A, False),
    # (conditions on the innermost output index, which the schedules vectorise, stay selects)
    ("def f(float(N) A) -> (O) { O(i) +=! k <= i ? A(k) : 0 where k in 0:N, i in 0:N }",
     np.cumsum, False),
    ("def f(float(N,C) A) -> (O) { O(n) +=! c < n ? A(n,c) : 0 }",
     lambda A: np.array([A[n, :n].sum() for n in range(A.shape[0])]), False),
    ("def f(float(N,C) A, float(C,M) B) -> (O) { O(n,m) +=! c <= m ? A(n,c) * B(c,m) : 0 }",
     lambda A, B: A @ np.triu(B), False),
    ("def f(float(N,C) A, float(C,M) B) -> (O) { O(n,m) +=! c < n ? A(n,c) * B(c,m) : 0 }",
     lambda A, B: np.tril(A, -1) @ B, True),
    ("def f(float(N,C) A) -> (O) { O(n) +=! c % 3 != 1 ? A(n,c) : 0 }",
     lambda A: A[:, np.arange(A.shape[1]) % 3 != 1].sum(1), True),
]


@pytest.mark.parametrize("source, reference, skips", PREDICATED)
def test_a_sum_of_a_condition_skips_the_points_where_it_fails(source, reference, skips):
    """`O +=! cond ? x : 0` with a condition that reads nothing sums x where cond holds (an
    RDom predicate): a prefix sum, a row sum of a triangle, a product with a triangular
    matrix, each planned at one size and called at another, against numpy."""
    fn = define(source)
    for sizes in [(37, 41, 23), (9, 5, 17)]:
        args = [f32(sizes[0])] if "float(N) A" in source else \
            [f32(sizes[0], sizes[1])] + ([f32(sizes[1], sizes[2])] if "B" in source else [])
        want = reference(*[a.astype(np.float64) for a in args])
        np.testing.assert_allclose(call(fn, *args), want, rtol=1e-5, atol=1e-5)
    assert ("where its condition holds" in fn.explain(*args)) == skips, fn.explain(*args)


GCONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
  O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)
}"""


@pytest.mark.parametrize("F, W", [(16, 16), (24, 12), (20, 12), (16, 18), (16, 6), (10, 6)])
def test_narrow_rows_vectorise_the_output_channels(F, W):
    # Output rows narrower than a vector (14 of 16 lanes with AVX-512: vectors of 8 before,
    # half the machine's) vectorise the output channels where they fill three quarters of
    # whole vectors or more, the weights packed once (N32 G32 F16 C16 16x16: 12.2 -> 3.9 ms,
    # ad hoc); the tile's values are stored across the output's rows. With 16 lanes, 20
    # channels fill 20 of 32 lanes, and 16 output columns fill a vector: both keep the rows'
    # vectors. With AVX2's 8 lanes, rows narrower than two vectors count as narrow (tiles one
    # vector wide load an input vector and a weight per multiply-add: 45 -> 15 ms on an AMD
    # EPYC for the paper's grouped convolution, ad hoc).
    lanes = LANES
    narrow = lanes if lanes == 16 else 2 * lanes
    across = W - 2 < narrow and F >= lanes and F / (-(-F // lanes) * lanes) >= 0.75
    fn = define(GCONV)
    I, W1 = f32(3, 2, 5, 6, W), f32(2, F, 5, 3, 3)
    O = call(fn, I, W1)
    I64, W64 = I.astype(np.float64), W1.astype(np.float64)
    for g in range(2):
        assert_sum_close(O[:, g], conv_reference(I64[:, g], W64[g]),
                         conv_reference(np.abs(I64[:, g]), np.abs(W64[g])), 45)
    text = fn.explain(I, W1)
    assert ("lanes of f x" in text and "packed W1 once, whole (small)" in text) == across, text


@pytest.mark.parametrize("E,D,B,L", [(1, 1, 1, 1), (5, 13, 7, 3), (29, 17, 2, 8)])
def test_lookup_table_gather(E, D, B, L):
    fn = define(LUT)
    table, index = f32(E, D), rng.integers(0, E, (B, L)).astype(np.int32)
    exact = np.zeros((B, D))
    for i in range(B):
        for k in range(L):
            exact[i] += table[index[i, k]]
    magnitude = np.abs(table.astype(np.float64))[index].sum(axis=1)
    assert_sum_close(call(fn, table, index), exact, magnitude, L)
    assert first_line(fn, table, index).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("B,C,H,W", [(1, 1, 2, 2), (2, 3, 7, 9), (1, 2, 13, 35)])
def test_max_pooling(B, C, H, W):
    fn = define(MAXPOOL)
    I = f32(B, C, H, W)
    oh, ow = (H - 2) // 2 + 1, (W - 2) // 2 + 1
    exact = np.full((B, C, oh, ow), -np.inf, dtype=np.float32)
    for i in range(oh):
        for j in range(ow):
            for kh in range(2):
                for kw in range(2):
                    exact[:, :, i, j] = np.maximum(exact[:, :, i, j],
                                                   I[:, :, 2 * i + kh, 2 * j + kw])
    np.testing.assert_array_equal(call(fn, I), exact)
    assert first_line(fn, I).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,M", AWKWARD_2D)
def test_reduction_to_a_row(N, M):
    fn = define(ROW_SUM)
    A = f32(N, M)
    A64 = A.astype(np.float64)
    assert_sum_close(call(fn, A), A64.sum(axis=1), np.abs(A64).sum(axis=1), M)
    assert first_line(fn, A).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N", [1, 17, 100])
def test_reduction_to_a_scalar(N):
    fn = define(SCALAR_SUM)
    A = f32(N)
    got = call(fn, A)
    assert np.shape(got) == ()
    assert_sum_close(got, A.astype(np.float64).sum(), np.abs(A.astype(np.float64)).sum(), N)


def test_reduction_to_a_scalar_gets_the_structured_schedule():
    # (it once failed, f.compute_at(anchor, LoopLevel.root()), and fell back to Mullapudi2016)
    fn = define(SCALAR_SUM)
    A = f32(13)
    text = fn.explain(A)
    assert text.startswith("CPU schedule: tcstage"), text


@pytest.mark.parametrize("B,M,N", [(1, 1, 1), (7, 13, 29), (17, 5, 16), (3, 33, 17)])
def test_mlp_layer_with_bias_and_relu_epilogue(B, M, N):
    fn = define(MLP)
    check_mlp(fn, B, M, N)
    assert first_line(fn, f32(B, M), f32(N, M), f32(N)).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("source,args", [
    (MLP, lambda: (f32(1, 3), f32(5, 3), f32(5))),
    ("def f(float(N,M) A, float(N) B) -> (O) { O(i) +=! A(i,j)\n O(i) = O(i) * B(i) }",
     lambda: (f32(7, 13), f32(7))),
], ids=["mlp", "rowsum"])
def test_epilogues_of_small_tiles_compile_without_halide_warnings(source, args, capfd):
    fn = define(source)
    call(fn, *args())
    printed = capfd.readouterr()
    assert "has not been scheduled" not in printed.out + printed.err


@pytest.mark.parametrize("B,M,N,P", [(1, 1, 1, 1), (17, 8, 16, 33)])
def test_two_layer_mlp_both_outputs(B, M, N, P):
    fn = define(MLP2)
    check_mlp2(fn, B, M, N, P)
    text = fn.explain(f32(B, M), f32(N, M), f32(N), f32(P, N), f32(P))
    assert text.startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,M", [(1, 1), (7, 13), (33, 16)])
def test_product_reduction(N, M):
    fn = define(PRODUCT)
    A = f32(N, M, low=0.5, high=1.5) * rng.choice([-1, 1], (N, M)).astype(np.float32)
    exact = np.prod(A.astype(np.float64), axis=1)
    # each of the M - 1 products rounds by at most eps: a relative error below M * 1e-6
    np.testing.assert_allclose(call(fn, A), exact, rtol=1e-6 * M + 1e-7)
    assert first_line(fn, A).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,K,M", [(1, 1, 1), (7, 13, 29), (17, 3, 16)])
def test_min_plus_reduction(N, K, M):
    fn = define(MIN_PLUS)
    A, B = f32(N, K), f32(K, M)
    # each candidate is one float32 addition: the minimum is exact
    np.testing.assert_array_equal(call(fn, A, B), (A[:, :, None] + B[None, :, :]).min(axis=1))
    assert first_line(fn, A, B).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("N,M", [(1, 1), (13, 7), (5, 64)])
def test_integer_column_sum(N, M):
    fn = define(INT_SUM)
    A = rng.integers(-1000, 1000, (N, M)).astype(np.int32)
    np.testing.assert_array_equal(call(fn, A), A.sum(axis=0))
    assert first_line(fn, A).startswith("CPU schedule: tcstage")


@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (3, 8, 29)])
def test_double_precision_packed(M, K, N):
    fn = define(DOUBLE_TMM)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    C = call(fn, A, B)
    assert C.dtype == np.float64
    np.testing.assert_allclose(C, A @ B.T, rtol=1e-12, atol=1e-12 * K)
    assert first_line(fn, A, B).startswith("CPU schedule: tcstage")


# --- 2. explicit schedules ------------------------------------------------------------------

EXPLICIT = [
    "CpuSchedule().registerTile(1, 1)",
    "CpuSchedule().registerTile(3, 5)",
    "CpuSchedule().vectorize(4)",
    "CpuSchedule().vectorize(8)",
    "CpuSchedule().pack(False)",
    "CpuSchedule().parallel(False)",
    "CpuSchedule().unrollReduction(3)",
    "CpuSchedule().inlinePointwise(False)",
    "CpuSchedule().registerTile(2, 3).vectorize(4).unrollReduction(4).pack(False)"
    ".parallel(False)",
]


@pytest.mark.parametrize("text", [t for t in EXPLICIT if "inlinePointwise" not in t])
def test_explicit_schedules_on_contractions(text):
    schedule = tc.CpuSchedule.parse(text)
    tmm = define(TMM)
    check_tmm(tmm, 6, 7, 29, schedule=schedule)
    if "registerTile(3" in text or "vectorize(8)" in text:  # smaller than a tile: the
        check_tmm(tmm, 3, 17, 5, schedule=schedule)        # same kernel or one more
    assert first_line(tmm, f32(6, 7), f32(29, 7), schedule=schedule) \
        .startswith(f"CPU schedule: tcstage {schedule}")
    if "pack" not in text and "parallel" not in text:  # options that shape gemm's tiles too
        gemm = define(GEMM)
        check_gemm(gemm, 6, 7, 29, schedule=schedule)
        assert first_line(gemm, f32(6, 7), f32(7, 29), schedule=schedule) \
            .startswith(f"CPU schedule: tcstage {schedule}")


@pytest.mark.parametrize("text", [t for t in EXPLICIT if "(1, 1)" not in t
                                  and "vectorize(8)" not in t and "(3)" not in t])
def test_explicit_schedules_on_layers(text):
    schedule = tc.CpuSchedule.parse(text)
    mlp = define(MLP)
    check_mlp(mlp, 7, 13, 29, schedule=schedule)
    assert first_line(mlp, f32(7, 13), f32(29, 13), f32(29), schedule=schedule) \
        .startswith(f"CPU schedule: tcstage {schedule}")
    if "registerTile" in text:
        mlp2 = define(MLP2)
        check_mlp2(mlp2, 7, 13, 29, 17, schedule=schedule)
        assert first_line(mlp2, f32(7, 13), f32(29, 13), f32(29), f32(17, 29), f32(17),
                          schedule=schedule).startswith(f"CPU schedule: tcstage {schedule}")


@pytest.mark.parametrize("text", [EXPLICIT[1], EXPLICIT[-1]])
def test_explicit_schedules_on_batches_convolution_and_pooling(text):
    schedule = tc.CpuSchedule.parse(text)
    tbmm, conv, pool = define(TBMM), define(CONV), define(MAXPOOL)
    check_tbmm(tbmm, 2, 9, 7, 18, schedule=schedule)
    check_conv(conv, 2, 3, 9, 19, 5, 3, 3, schedule=schedule)
    I = f32(2, 3, 9, 20)
    windows = np.stack([I[:, :, kh:8:2, kw:20:2] for kh in range(2) for kw in range(2)])
    np.testing.assert_array_equal(call(pool, I, schedule=schedule), windows.max(axis=0))
    assert first_line(conv, f32(2, 3, 9, 19), f32(5, 3, 3, 3), schedule=schedule) \
        .startswith(f"CPU schedule: tcstage {schedule}")


def test_schedule_given_as_object_or_text_is_one_kernel():
    fn = define(TMM)
    for schedule in [tc.CpuSchedule().registerTile(1, 2), "CpuSchedule().registerTile(1, 2)",
                     "tc.CpuSchedule().registerTile(1, 2)", ".registerTile(1,2)"]:
        check_tmm(fn, 13, 7, 29, schedule=schedule)
        assert first_line(fn, f32(13, 7), f32(29, 7), schedule=schedule) \
            .startswith("CPU schedule: tcstage CpuSchedule().registerTile(1, 2)")
    assert fn.compile_count == 1


@pytest.mark.parametrize("schedule", ["Mullapudi2016", None, "none"])
def test_other_schedules_agree(schedule):
    fn = define(MLP)
    check_mlp(fn, 7, 13, 29, schedule=schedule)


# --- 3. one shape-generic kernel over many sizes ---------------------------------------------

@pytest.mark.parametrize("name", ["gemm", "tmm", "mlp", "pointwise"])
def test_one_kernel_from_large_to_smaller_and_larger_sizes(name):
    sizes = [(48, 40, 80), (1, 1, 1), (5, 3, 7), (17, 9, 16), (2, 40, 3), (13, 29, 81),
             (64, 50, 100), (3, 1, 17)]
    if name == "gemm":
        fn = define(GEMM)
        for M, K, N in sizes:
            check_gemm(fn, M, K, N)
    elif name == "tmm":
        fn = define(TMM)
        for M, K, N in sizes:
            check_tmm(fn, M, K, N)
    elif name == "mlp":
        fn = define(MLP)
        for B, M, N in sizes:
            check_mlp(fn, B, M, N)
    else:
        fn = define(POINTWISE)
        for N, _, M in sizes:
            A = f32(N, M)
            np.testing.assert_array_equal(call(fn, A), np.maximum(A, 0) * 2)
    assert fn.compile_count <= 2


def test_one_kernel_pooling_and_convolution_over_sizes():
    pool, conv = define(MAXPOOL), define(CONV)
    for B, C, H, W in [(2, 3, 40, 66), (1, 1, 2, 2), (1, 2, 5, 9), (3, 1, 41, 70)]:
        I = f32(B, C, H, W)
        oh, ow = (H - 2) // 2 + 1, (W - 2) // 2 + 1
        windows = np.stack([I[:, :, kh:kh + 2 * oh:2, kw:kw + 2 * ow:2]
                            for kh in range(2) for kw in range(2)])
        np.testing.assert_array_equal(call(pool, I), windows.max(axis=0))
    for N, C, H, W, F in [(2, 3, 20, 40, 16), (1, 1, 3, 3, 1), (1, 2, 6, 10, 3),
                          (2, 3, 22, 45, 17)]:
        check_conv(conv, N, C, H, W, F, 3, 3)
    assert pool.compile_count <= 2 and conv.compile_count <= 2


# --- 4. CpuSchedule as text ------------------------------------------------------------------

@st.composite
def schedules(draw):
    vectors = draw(st.integers(0, 8))
    rows = draw(st.integers(0, min(32, 64 // vectors) if vectors else 32))
    s = tc.CpuSchedule()
    if draw(st.booleans()):
        s = s.registerTile(vectors, rows)
    if draw(st.booleans()):
        s = s.vectorize(draw(st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64])))
    if draw(st.booleans()):
        s = s.unrollReduction(draw(st.integers(1, 16)))
    for option in ("pack", "parallel", "inlinePointwise"):
        if draw(st.booleans()):
            s = getattr(s, option)(draw(st.booleans()))
    return s


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_schedule_text_round_trip(schedule):
    text = str(schedule)
    assert text.startswith("CpuSchedule()")
    back = tc.CpuSchedule.parse(text)
    assert back == schedule and hash(back) == hash(schedule)
    assert str(back) == text
    assert tc.CpuSchedule.parse("tc." + text) == schedule
    assert repr(schedule) == text


def test_default_prints_bare_and_options_print_in_order():
    assert str(tc.CpuSchedule()) == "CpuSchedule()"
    s = tc.CpuSchedule().parallel(False).registerTile(2, 6).vectorize(8)
    assert str(s) == "CpuSchedule().registerTile(2, 6).vectorize(8).parallel(False)"
    # a later call replaces an earlier one; setting a default prints nothing
    assert tc.CpuSchedule().vectorize(4).vectorize(0) == tc.CpuSchedule()
    assert str(tc.CpuSchedule().pack(True)) == "CpuSchedule()"


@pytest.mark.parametrize("text,expected", [
    ("tc.CpuSchedule().registerTile(2, 6).pack(false)",
     tc.CpuSchedule().registerTile(2, 6).pack(False)),
    ("tcstage.CpuSchedule().parallel(true)", tc.CpuSchedule().parallel(True)),
    ("  CpuSchedule() . vectorize( 16 ) .inlinePointwise(False)  ",
     tc.CpuSchedule().vectorize(16).inlinePointwise(False)),
    (".unrollReduction(+4)", tc.CpuSchedule().unrollReduction(4)),
    ("CpuSchedule()", tc.CpuSchedule()),
    ("", tc.CpuSchedule()),
])
def test_parse_accepts(text, expected):
    assert tc.CpuSchedule.parse(text) == expected


def bad(build, *words):
    with pytest.raises(TCScheduleError) as info:
        build()
    assert isinstance(info.value, tc.TCError)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize("build,words", [
    (lambda: tc.CpuSchedule().vectorize(6), ("vectorize", "6", "power of two")),
    (lambda: tc.CpuSchedule().vectorize(128), ("vectorize", "128")),
    (lambda: tc.CpuSchedule().vectorize(True), ("vectorize", "integer")),
    (lambda: tc.CpuSchedule().registerTile(0, -1), ("registerTile", "-1")),
    (lambda: tc.CpuSchedule().registerTile(9, 1), ("registerTile", "9")),
    (lambda: tc.CpuSchedule().registerTile(8, 16), ("registerTile", "128")),
    (lambda: tc.CpuSchedule().unrollReduction(0), ("unrollReduction", "0")),
    (lambda: tc.CpuSchedule().unrollReduction(2.0), ("unrollReduction", "integer")),
    (lambda: tc.CpuSchedule().pack(2), ("pack", "2")),
    (lambda: tc.CpuSchedule().parallel("yes"), ("parallel", "'yes'")),
    (lambda: tc.CpuSchedule().inlinePointwise(0), ("inlinePointwise",)),
])
def test_bad_values(build, words):
    bad(build, *words)


@pytest.mark.parametrize("text,words", [
    ("CpuSchedule().vectorize(6)", ("vectorize", "power of two")),
    ("CpuSchedule().registerTile(0, -1)", ("registerTile", "-1")),
    ("CpuSchedule().vectorise(8)", ("vectorise", "did you mean 'vectorize'")),
    ("CpuSchedule().registertile(2, 2)", ("registertile", "did you mean 'registerTile'")),
    ("CpuSchedule().pack(2)", ("pack", "2")),
    ("CpuSchedule().pack(yes)", ("pack", "'yes'")),
    ("CpuSchedule().vectorize(8", ("unexpected",)),
    ("CpuSchedule().vectorize(8); rm", ("unexpected", "';'")),
    ("CpuSchedule().registerTile(2)", ("registerTile",)),
    ("CpuSchedule().pack(True, False)", ("pack",)),
    ("CpuSchedule().vectorize(4.5)", ("vectorize", "4.5")),
])
def test_bad_text(text, words):
    bad(lambda: tc.CpuSchedule.parse(text), *words)


def test_parse_takes_only_text():
    bad(lambda: tc.CpuSchedule.parse(tc.CpuSchedule()), "string")


# --- 5. the schedule= argument ---------------------------------------------------------------

@pytest.mark.parametrize("name,suggestion", [("Mulapudi2016", "Mullapudi2016"),
                                             ("tcstag", "tcstage"), ("fastest", None),
                                             (42, None)])
def test_unknown_schedule_name(name, suggestion):
    fn = define(GEMM)
    with pytest.raises(tc.TCError) as info:
        fn(f32(3, 4), f32(4, 5), schedule=name)
    message = str(info.value)
    assert "unknown CPU schedule" in message and repr(name) in message, message
    assert "tcstage" in message and "Mullapudi2016" in message and "none" in message
    if suggestion:
        assert f"did you mean '{suggestion}'" in message, message


def test_bad_schedule_text_is_a_schedule_error():
    fn = define(GEMM)
    with pytest.raises(TCScheduleError, match="vectorize"):
        fn(f32(3, 4), f32(4, 5), schedule="CpuSchedule().vectorize(3)")


def test_structured_schedule_by_name_any_case_is_the_default():
    fn = define(TMM)
    for name in ["tcstage", "TCSTAGE", "TcStage", " tcstage ", tc.CpuSchedule()]:
        check_tmm(fn, 3, 13, 17, schedule=name)
        assert first_line(fn, f32(3, 13), f32(17, 13), schedule=name) \
            .startswith("CPU schedule: tcstage CpuSchedule()")
    assert fn.compile_count == 1  # all of them the same schedule: one kernel


def test_the_default_and_an_explicit_tcstage_share_one_kernel():
    fn = define(TMM)
    check_tmm(fn, 3, 13, 17)
    check_tmm(fn, 3, 13, 17, schedule="tcstage")
    assert fn.compile_count == 1


# --- 6. explain() and the fallback -----------------------------------------------------------

def test_explain_gemm_names_the_structured_schedule_and_each_func():
    fn = define(GEMM)
    A, B = f32(13, 7), f32(7, 29)
    check_gemm(fn, 13, 7, 29)
    lines = fn.explain(A, B).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage CpuSchedule()")
    assert not any(line.strip().startswith("note:") for line in lines)
    assert any("reduction (add)" in line for line in lines[1:]), lines


def scatter_reference(A, I):
    exact, magnitude = np.zeros(len(A)), np.zeros(len(A))
    np.add.at(exact, I, A[:len(I)].astype(np.float64))
    np.add.at(magnitude, I, np.abs(A[:len(I)].astype(np.float64)))
    return exact, magnitude


@pytest.mark.parametrize("N,K", [(2, 1), (13, 7), (29, 29), (17, 5), (1, 1), (300, 200)])
def test_a_scatter_is_computed_definition_by_definition_at_every_size(N, K):
    """A TC's scatter gets the structured schedule: its zero fill vectorised and parallel, the
    scatter serial; Mullapudi2016, which it had before, failed on a single element (and ran
    unscheduled with a warning). Every size of a kernel planned for the first runs it."""
    fn = define(SCATTER)
    first = None
    for n, k in [(N, K), (max(1, N // 3), max(1, min(K // 2, N // 3))), (1, 1)]:  # (K <= N)
        A, I = f32(n), rng.integers(0, n, k).astype(np.int32)
        with warnings.catch_warnings():
            warnings.simplefilter("error", tc.TCWarning)
            assert_sum_close(call(fn, A, I), *scatter_reference(A, I), k)
        first = first or fn.explain(A, I).splitlines()
    assert first[0].startswith("CPU schedule: tcstage"), first
    assert not any(line.strip().startswith("note:") for line in first), first
    assert "computed once, definition by definition: pointwise" in first[1], first
    assert first[1].endswith("; serial") and ("in vectors of" in first[1]) == (N >= LANES), \
        first


def test_a_failing_fallback_is_named_in_the_warning():
    # (Mullapudi2016 fails on this pipeline at extents 1: the call warns and runs Halide's
    # unscheduled code)
    fn, A, I = define(SCATTER), f32(1), np.zeros(1, np.int32)
    with pytest.warns(tc.TCWarning, match="runs unscheduled") as record:
        got = fn(A, I, schedule="Mullapudi2016")
    assert_sum_close(got, *scatter_reference(A, I), 1)
    message = next(str(w.message) for w in record if "runs unscheduled" in str(w.message))
    assert "Mullapudi2016" in message and "CpuSchedule() autoscheduler" not in message, message


@pytest.mark.parametrize("source,inputs,reference", [
    # a partial write: O(i) for i in 1:N+1 only
    ("def shift(float(N) A) -> (O) { O(i) = 0 where i in 0:N+2\n"
     " O(i) = A(i-1) where i in 1:N+1 }",
     lambda: (f32(11),), lambda A: np.concatenate([[0], A, [0]])),
    # two reductions into one tensor
    ("def two(float(N,M) A, float(N,M) B) -> (O) { O(i) +=! A(i,j)\n O(i) += B(i,j) }",
     lambda: (f32(7, 13), f32(7, 13)), lambda A, B: A.sum(1) + B.sum(1)),
    # two reductions into one scalar (any_rank's layer norm gradient crashed the scheduler)
    ("def total(float(N) A, float(N) B) -> (s) { s +=! A(i)\n s += B(i) * B(i) }",
     lambda: (f32(37), f32(37)), lambda A, B: A.sum() + (B * B).sum()),
])
def test_other_families_are_computed_definition_by_definition(source, inputs, reference):
    fn = define(source)
    args = inputs()
    exact = reference(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(call(fn, *args), exact, rtol=1e-5, atol=1e-5)
    lines = fn.explain(*args).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage") and "note:" not in lines[1], lines
    assert "computed once, definition by definition" in lines[1] or \
        "a scalar, computed once, serially" in lines[1], lines
    smaller = [a[:max(1, a.shape[0] // 2)] for a in args]  # (the kernel planned above)
    exact = reference(*(a.astype(np.float64) for a in smaller))
    np.testing.assert_allclose(call(fn, *smaller), exact, rtol=1e-5, atol=1e-5)


def test_scatter_gradients_serve_calls_smaller_than_their_plan():
    """The gradients of cross-entropy (a scatter of -1/N at the labels among row updates) and
    of a mean embedding bag (rows scattered into the table), planned at training sizes and
    then called at a last, smaller batch: Mullapudi2016's schedule failed there and the calls
    ran unscheduled with a warning. Against numpy."""
    from pathlib import Path
    source = (Path(__file__).parent.parent / "examples" / "nn.tc").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        ce = tc.define(tc.gradient(source, "cross_entropy")).cross_entropy_grad
        bag = tc.define(tc.gradient(source, "embedding_bag_mean")).embedding_bag_mean_grad
    for N, C in [(256, 512), (7, 512), (7, 13), (1, 1)]:
        X, L = f32(N, C), rng.integers(0, C, N).astype(np.int32)
        E = np.exp(X - X.max(1, keepdims=True))
        want = E / E.sum(1, keepdims=True)
        want[np.arange(N), L] -= 1
        np.testing.assert_allclose(call(ce, X, L, np.float32(1), np.float32(1)), want / N,
                                   rtol=1e-4, atol=1e-6)
    for E, D, B, Lb in [(1000, 64, 256, 50), (10, 7, 3, 2), (5, 1, 1, 1)]:
        T, I, dO = f32(E, D), rng.integers(0, E, (B, Lb)).astype(np.int32), f32(B, D)
        want = np.zeros((E, D))
        np.add.at(want, I.ravel(), np.repeat(dO / Lb, Lb, axis=0))
        np.testing.assert_allclose(call(bag, T, I, np.zeros((B, D), np.float32), dO), want,
                                   rtol=1e-5, atol=1e-6)
    lines = bag.explain(T, I, np.zeros((B, D), np.float32), dO).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage") and "a scatter of rows" in lines[1], lines


def test_half_width_vectors_only_where_they_cost_half():
    """A 26-wide output row (tbmm's K) in vectors of 8 lanes: counting a 4-lane vector as half
    the work (true of 256 against 512 bits with AVX-512), 7 of them waste least; with AVX2,
    128 and 256 bits issue alike, and those 4-lane vectors ran tbmm at 3.8x PyTorch's time
    on an AMD EPYC. There two 8-lane vectors (the last tile overlapping) waste least."""
    from tcstage.cpu.scheduler import _tile
    assert _tile(26, 8, 2, half_is_cheaper=True) == (4, 1)
    assert _tile(26, 8, 2, half_is_cheaper=False) == (8, 2)
    if LANES == 8:  # (an AVX2 machine)
        text = define(TBMM).explain(f32(4, 26, 72), f32(4, 26, 72))
        assert "2 vectors of 8 lanes" in text, text
