"""Property tests for the kernels of the Tensor Comprehensions paper.

Each kernel runs on random sizes and random float32 data and is compared with a
reference written directly from the math in numpy (float64 einsum, slicing or
explicit loops), never with tcstage's own output.  Tolerances scale with a bound
on the magnitude of the summed terms: the same reference evaluated on the
absolute values of the float inputs.

Most runs use ``schedule=None`` (unscheduled Halide, quick to compile); each
kernel also runs once with the default (autoscheduled) pipeline.
"""

import functools
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcstage as tc

SOURCES = {
    "tmm": """
def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }
""",
    "tbmm": """
def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) { Z(b,n,k) +=! X(b,n,m) * Y(b,k,m) }
""",
    "conv2d": """
def conv2d(float(B,IP,H,W) in, float(OP,IP,KH,KW) weight) -> (out) { out(b,op,h,w) +=! in(b,ip,h+kh,w+kw) * weight(op,ip,kh,kw) }
""",
    "gconv": """
def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) { O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw) }
""",
    "maxpool2x2": """
def maxpool2x2(float(B,C,H,W) in) -> (out) { out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh) where kw in 0:2, kh in 0:2 }
""",
    "gather": """
def gather(float(N) X, int(A,B) I) -> (Z) { Z(i,j) = X(I(i,j)) }
""",
    "lut2": """
def lut2(float(E1,D) LUT1, int(B,L1) I1, float(E2,D) LUT2, int(B,L2) I2) -> (O1, O2) {
  O1(i,j) +=! LUT1(I1(i,k),j)
  O2(i,j) +=! LUT2(I2(i,k),j)
}
""",
    "mlp1": """
def mlp1(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b,n) = B1(n)
  O1(b,n) += I(b,m) * W1(n,m)
  O1(b,n) = fmaxf(O1(b,n), 0)
}
""",
    "mlp3": """
def mlp3(float(B,M) I, float(O,M) W2, float(O) B2, float(P,O) W3, float(P) B3, float(Q,P) W4, float(Q) B4) -> (O2, O3, O4) {
  O2(b,o) = B2(o)
  O2(b,o) += I(b,n) * W2(o,n)
  O2(b,o) = fmaxf(O2(b,o), 0)
  O3(b,p) = B3(p)
  O3(b,p) += O2(b,o) * W3(p,o)
  O3(b,p) = fmaxf(O3(b,p), 0)
  O4(b,q) = B4(q)
  O4(b,q) += O3(b,p) * W4(q,p)
  O4(b,q) = fmaxf(O4(b,q), 0)
}
""",
    "sconv2d": """
def sconv2d(int sh, int sw, float(N,C,H,W) I, float(F,C,KH,KW) Wt, float(F) B) -> (O) {
  O(n,f,h,w) +=! I(n,c, sh * h + kh, sw * w + kw) * Wt(f,c,kh,kw)
  O(n,f,h,w) = O(n,f,h,w) + B(f)
}
""",
    "outerProductMM": """
def outerProductMM(float(P,Q,R) A, float(S,R,T) B) -> (O) { O(p,s,q,t) +=! A(p,q,r) * B(s,r,t) }
""",
}



@functools.cache
def kernel(name):
    """Each program is defined once, on first use (so that one kernel tcstage rejects does
    not take the other kernels' tests down with it)."""
    with warnings.catch_warnings():
        # gather/lut2 warn that data-dependent subscripts are not range-checked
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define(SOURCES[name])[name]

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

dim = st.integers(1, 12)
small = st.integers(1, 5)
seeds = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------------------
# helpers


def rand(rng, *shape):
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def shape_args(args):
    """Arrays replaced by their shapes, scalars kept (for output_shapes)."""
    return [a.shape if isinstance(a, np.ndarray) else a for a in args]


DEFAULT = object()  # call without schedule=, i.e. with tcstage's default schedule


def check(fn, args, reference, schedule=None):
    """Run `fn`, compare with `reference` (a function of the arguments returning the
    list of expected outputs) and check output_shapes against the reference shapes."""
    ref = reference(*[a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32
                      else a for a in args])
    bound = reference(*[np.abs(a).astype(np.float64)
                        if isinstance(a, np.ndarray) and a.dtype == np.float32 else a
                        for a in args])
    expected_shapes = [r.shape for r in ref]
    assert all(0 not in s for s in expected_shapes), "test drew an empty output"

    assert fn.output_shapes(*args) == expected_shapes
    assert fn.output_shapes(*shape_args(args)) == expected_shapes

    out = fn(*args) if schedule is DEFAULT else fn(*args, schedule=schedule)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(outs) == len(ref)
    for o, r, b in zip(outs, ref, bound):
        assert isinstance(o, np.ndarray)
        assert o.dtype == np.float32
        assert o.shape == r.shape
        scale = max(1.0, float(np.max(np.abs(b))))
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4 * scale)


# ---------------------------------------------------------------------------
# references, written from the math


def ref_tmm(A, B):
    return [np.einsum("mk,nk->mn", A, B)]


def ref_tbmm(X, Y):
    return [np.einsum("bnm,bkm->bnk", X, Y)]


def ref_conv2d(inp, weight):
    B, IP, H, W = inp.shape
    OP, _, KH, KW = weight.shape
    Ho, Wo = H - KH + 1, W - KW + 1
    out = np.zeros((B, OP, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            out += np.einsum("bihw,oi->bohw", inp[:, :, kh:kh + Ho, kw:kw + Wo],
                             weight[:, :, kh, kw])
    return [out]


def ref_gconv(I, W1):
    N, G, C, H, W = I.shape
    _, F, _, KH, KW = W1.shape
    Ho, Wo = H - KH + 1, W - KW + 1
    out = np.zeros((N, G, F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            out += np.einsum("ngchw,gfc->ngfhw", I[:, :, :, kh:kh + Ho, kw:kw + Wo],
                             W1[:, :, :, kh, kw])
    return [out]


def ref_maxpool(x):
    B, C, H, W = x.shape
    Ho, Wo = H // 2, W // 2
    windows = x[:, :, :2 * Ho, :2 * Wo].reshape(B, C, Ho, 2, Wo, 2)
    return [windows.max(axis=(3, 5))]


def ref_gather(X, I):
    Z = np.empty(I.shape)
    for i in range(I.shape[0]):
        for j in range(I.shape[1]):
            Z[i, j] = X[I[i, j]]
    return [Z]


def ref_lut2(LUT1, I1, LUT2, I2):
    def bag(lut, idx):
        out = np.zeros((idx.shape[0], lut.shape[1]))
        for i in range(idx.shape[0]):
            for k in range(idx.shape[1]):
                out[i] += lut[idx[i, k]]
        return out
    return [bag(LUT1, I1), bag(LUT2, I2)]


def relu(x):
    return np.maximum(x, 0.0)


def ref_mlp1(I, W1, B1):
    return [relu(I @ W1.T + B1[None, :])]


def ref_mlp3(I, W2, B2, W3, B3, W4, B4):
    O2 = relu(I @ W2.T + B2)
    O3 = relu(O2 @ W3.T + B3)
    O4 = relu(O3 @ W4.T + B4)
    return [O2, O3, O4]


def ref_sconv2d(sh, sw, I, Wt, B):
    N, C, H, W = I.shape
    F, _, KH, KW = Wt.shape
    Ho, Wo = (H - KH) // sh + 1, (W - KW) // sw + 1
    out = np.zeros((N, F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            patch = I[:, :, kh:kh + sh * (Ho - 1) + 1:sh, kw:kw + sw * (Wo - 1) + 1:sw]
            assert patch.shape[2:] == (Ho, Wo)
            out += np.einsum("nchw,fc->nfhw", patch, Wt[:, :, kh, kw])
    return [out + B[None, :, None, None]]


def ref_outer(A, B):
    return [np.einsum("pqr,srt->psqt", A, B)]


# ---------------------------------------------------------------------------
# argument strategies: each draws sizes and returns the argument list


@st.composite
def tmm_args(draw):
    rng = np.random.default_rng(draw(seeds))
    M, N, K = draw(dim), draw(dim), draw(dim)
    return [rand(rng, M, K), rand(rng, N, K)]


@st.composite
def tbmm_args(draw):
    rng = np.random.default_rng(draw(seeds))
    B, N, M, K = draw(small), draw(dim), draw(dim), draw(dim)
    return [rand(rng, B, N, M), rand(rng, B, K, M)]


@st.composite
def conv2d_args(draw):
    rng = np.random.default_rng(draw(seeds))
    B, IP, OP = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    KH, KW = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    H, W = draw(st.integers(KH, 12)), draw(st.integers(KW, 12))
    return [rand(rng, B, IP, H, W), rand(rng, OP, IP, KH, KW)]


@st.composite
def gconv_args(draw):
    rng = np.random.default_rng(draw(seeds))
    N, G, C, F = (draw(st.integers(1, 3)) for _ in range(4))
    KH, KW = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H, W = draw(st.integers(KH, 10)), draw(st.integers(KW, 10))
    return [rand(rng, N, G, C, H, W), rand(rng, G, F, C, KH, KW)]


@st.composite
def maxpool_args(draw):
    rng = np.random.default_rng(draw(seeds))
    B, C = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    H, W = draw(st.integers(2, 12)), draw(st.integers(2, 12))
    return [rand(rng, B, C, H, W)]


@st.composite
def gather_args(draw):
    rng = np.random.default_rng(draw(seeds))
    N, A, B = draw(dim), draw(dim), draw(dim)
    return [rand(rng, N), rng.integers(0, N, size=(A, B), dtype=np.int32)]


@st.composite
def lut2_args(draw):
    rng = np.random.default_rng(draw(seeds))
    E1, E2, D, B, L1, L2 = (draw(dim) for _ in range(6))
    return [rand(rng, E1, D), rng.integers(0, E1, size=(B, L1), dtype=np.int32),
            rand(rng, E2, D), rng.integers(0, E2, size=(B, L2), dtype=np.int32)]


@st.composite
def mlp1_args(draw):
    rng = np.random.default_rng(draw(seeds))
    B, M, N = draw(dim), draw(dim), draw(dim)
    return [rand(rng, B, M), rand(rng, N, M), rand(rng, N)]


@st.composite
def mlp3_args(draw):
    rng = np.random.default_rng(draw(seeds))
    B, M, O, P, Q = (draw(dim) for _ in range(5))
    return [rand(rng, B, M), rand(rng, O, M), rand(rng, O), rand(rng, P, O), rand(rng, P),
            rand(rng, Q, P), rand(rng, Q)]


def _sconv_args(rng, sh, sw, N, C, F, KH, KW, H, W):
    return [sh, sw, rand(rng, N, C, H, W), rand(rng, F, C, KH, KW), rand(rng, F)]


@st.composite
def sconv2d_args(draw):
    rng = np.random.default_rng(draw(seeds))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    N, C, F = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    KH, KW = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    H, W = draw(st.integers(KH, 12)), draw(st.integers(KW, 12))
    return _sconv_args(rng, sh, sw, N, C, F, KH, KW, H, W)


@st.composite
def outer_args(draw):
    rng = np.random.default_rng(draw(seeds))
    P, Q, R, S, T = (draw(st.integers(1, 8)) for _ in range(5))
    return [rand(rng, P, Q, R), rand(rng, S, R, T)]


KERNELS = {
    "tmm": (tmm_args, ref_tmm),
    "tbmm": (tbmm_args, ref_tbmm),
    "conv2d": (conv2d_args, ref_conv2d),
    "gconv": (gconv_args, ref_gconv),
    "maxpool2x2": (maxpool_args, ref_maxpool),
    "gather": (gather_args, ref_gather),
    "lut2": (lut2_args, ref_lut2),
    "mlp1": (mlp1_args, ref_mlp1),
    "mlp3": (mlp3_args, ref_mlp3),
    "sconv2d": (sconv2d_args, ref_sconv2d),
    "outerProductMM": (outer_args, ref_outer),
}


# ---------------------------------------------------------------------------
# property tests (unscheduled Halide)


def _property_test(name):
    strategy, reference = KERNELS[name]

    @SETTINGS
    @given(args=strategy())
    def test(args):
        check(kernel(name), args, reference)

    test.__name__ = f"test_{name}_random"
    return test


test_tmm_random = _property_test("tmm")
test_tbmm_random = _property_test("tbmm")
test_conv2d_random = _property_test("conv2d")
test_gconv_random = _property_test("gconv")
test_maxpool2x2_random = _property_test("maxpool2x2")
test_gather_random = _property_test("gather")
test_lut2_random = _property_test("lut2")
test_mlp1_random = _property_test("mlp1")
test_mlp3_random = _property_test("mlp3")
test_sconv2d_random = _property_test("sconv2d")
test_outerProductMM_random = _property_test("outerProductMM")


# ---------------------------------------------------------------------------
# each kernel once through the default (autoscheduled) pipeline


DEFAULT_SCHEDULE_CASES = {
    "tmm": lambda rng: [rand(rng, 9, 7), rand(rng, 11, 7)],
    "tbmm": lambda rng: [rand(rng, 3, 5, 6), rand(rng, 3, 7, 6)],
    "conv2d": lambda rng: [rand(rng, 2, 3, 9, 8), rand(rng, 4, 3, 3, 2)],
    "gconv": lambda rng: [rand(rng, 2, 2, 3, 7, 6), rand(rng, 2, 3, 3, 3, 2)],
    "maxpool2x2": lambda rng: [rand(rng, 2, 3, 9, 6)],
    "gather": lambda rng: [rand(rng, 10), rng.integers(0, 10, size=(5, 7), dtype=np.int32)],
    "lut2": lambda rng: [rand(rng, 9, 6), rng.integers(0, 9, size=(4, 5), dtype=np.int32),
                         rand(rng, 7, 6), rng.integers(0, 7, size=(4, 3), dtype=np.int32)],
    "mlp1": lambda rng: [rand(rng, 5, 8), rand(rng, 6, 8), rand(rng, 6)],
    "mlp3": lambda rng: [rand(rng, 4, 9), rand(rng, 7, 9), rand(rng, 7), rand(rng, 5, 7),
                         rand(rng, 5), rand(rng, 6, 5), rand(rng, 6)],
    "sconv2d": lambda rng: _sconv_args(rng, 2, 3, 2, 3, 4, 3, 2, 10, 11),
    "outerProductMM": lambda rng: [rand(rng, 3, 4, 5), rand(rng, 2, 5, 6)],
}


@pytest.mark.parametrize("name", sorted(DEFAULT_SCHEDULE_CASES))
def test_default_schedule(name):
    rng = np.random.default_rng(1234)
    check(kernel(name), DEFAULT_SCHEDULE_CASES[name](rng), KERNELS[name][1], schedule=DEFAULT)


# ---------------------------------------------------------------------------
# range inference: strides specialised on their values, floor semantics


@pytest.mark.parametrize("sh,sw,H,W,KH,KW", [
    (2, 2, 7, 8, 2, 3),    # H-KH = 5, W-KW = 5: neither a multiple of 2
    (3, 2, 10, 9, 2, 2),   # H-KH = 8 (8 % 3 = 2), W-KW = 7
    (3, 3, 6, 12, 2, 4),   # 4 % 3 = 1, 8 % 3 = 2
    (1, 3, 5, 5, 5, 1),    # single output row; W-KW = 4
    (2, 1, 4, 4, 4, 4),    # kernel as large as the image: one output point
    (3, 1, 12, 7, 1, 3),   # KH = 1
])
def test_sconv2d_strides_not_dividing(sh, sw, H, W, KH, KW):
    rng = np.random.default_rng(sh * 1000 + H * 10 + W)
    check(kernel("sconv2d"), _sconv_args(rng, sh, sw, 2, 2, 3, KH, KW, H, W), ref_sconv2d)


def test_sconv2d_stride_change_same_shapes():
    """Same arrays, different stride values: each value gets its own ranges/kernel."""
    rng = np.random.default_rng(7)
    I, Wt, B = rand(rng, 1, 2, 9, 8), rand(rng, 3, 2, 2, 3), rand(rng, 3)
    for sh, sw in [(1, 1), (2, 3), (3, 2), (1, 1), (2, 3)]:
        check(kernel("sconv2d"), [sh, sw, I, Wt, B], ref_sconv2d)


def test_sconv2d_output_shapes_sweep():
    """Largest h with sh*h + KH-1 <= H-1, found by brute force (no compilation)."""
    def extent(n, k, s):
        return max(h for h in range(n) if s * h + k - 1 <= n - 1) + 1
    f = kernel("sconv2d")
    for sh in (1, 2, 3):
        for sw in (1, 2, 3):
            for H in range(1, 13):
                for KH in range(1, H + 1):
                    W, KW = H + 1 - (KH > 1), max(1, KH - 1)
                    shapes = f.output_shapes(sh, sw, (2, 3, H, W), (5, 3, KH, KW), (5,))
                    assert shapes == [(2, 5, extent(H, KH, sh), extent(W, KW, sw))], \
                        (sh, sw, H, W, KH, KW)


def test_conv_and_pool_output_shapes_sweep():
    for H in range(1, 13):
        for KH in range(1, H + 1):
            assert kernel("conv2d").output_shapes((1, 2, H, 12), (3, 2, KH, 1)) == \
                [(1, 3, H - KH + 1, 12)]
            assert kernel("gconv").output_shapes((1, 2, 3, 12, H), (2, 4, 3, 1, KH)) == \
                [(1, 2, 4, 12, H - KH + 1)]
        if H >= 2:
            for W in range(2, 13):
                assert kernel("maxpool2x2").output_shapes((2, 3, H, W)) == [(2, 3, H // 2, W // 2)]
