"""The CPU path compiles one shape-generic kernel per TC function (and scalar specialisation,
and schedule), reused for every set of sizes the signature allows; `specialize_shapes=True`
compiles one per set of shapes. References: numpy einsum and loops."""

import contextlib
import warnings

import numpy as np
import pytest

import tcstage as tc

rng = np.random.default_rng(13)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


TBMM = "def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) { Z(b,n,k) +=! X(b,n,m) * Y(b,k,m) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
MLP = """def mlp(float(B,M) I, float(N,M) W, float(N) Bias) -> (O) {
  O(b, n) +=! I(b, m) * W(n, m)
  O(b, n) = fmax(O(b, n) + Bias(n), 0)
}"""
CONV = """def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
}"""


def conv_reference(I, W):
    kh, kw = W.shape[2:]
    H, Wd = I.shape[2] - kh + 1, I.shape[3] - kw + 1
    windows = np.stack([np.stack([I[:, :, i:i + H, j:j + Wd] for j in range(kw)], -1)
                        for i in range(kh)], -2)  # n, c, h, w, kh, kw
    return np.einsum("nchwij,mcij->nmhw", windows, W)


@contextlib.contextmanager
def no_warnings():
    """Inside: a TCWarning (a schedule falling back to unscheduled code) fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        yield


def tbmm_loop(f, batches):
    W = f32(1, 7, 12)
    for B in batches:
        X = f32(B, 6, 12)
        Y = np.repeat(W, B, axis=0)
        np.testing.assert_allclose(f(X, Y), np.einsum("bnm,bkm->bnk", X, Y),
                                   rtol=1e-4, atol=1e-4)


def test_batch_sizes_from_the_first_up_compile_once():
    f = tc.define(TBMM).tbmm
    with no_warnings():
        tbmm_loop(f, [2, 5, 16, 3, 40, 2])
    assert f.compile_count == 1


def test_batch_sizes_below_the_schedules_split_compile_one_kernel_more():
    # Mullapudi2016 splits the batch of 16 by 16 (ShiftInwards), which cannot run at fewer: the
    # smaller sizes share a second kernel, planned for batch 1, and nothing falls back to
    # unscheduled code.
    f = tc.define(TBMM).tbmm
    with no_warnings():
        tbmm_loop(f, [16, 5, 1, 16, 2, 9])
        compiled = f.compile_count
        assert compiled <= 2
        tbmm_loop(f, [3, 16, 7, 1, 20])
    assert f.compile_count == compiled


def test_layers_over_an_epoch_with_a_short_last_batch():
    tmm, mlp = tc.define(TMM).tmm, tc.define(MLP).mlp
    B, W, bias = f32(10, 24), f32(10, 24), f32(10)
    with no_warnings():
        for epoch in range(2):
            for batch in [32, 32, 32, 7]:
                A = f32(batch, 24)
                np.testing.assert_allclose(tmm(A, B), A @ B.T, rtol=1e-4, atol=1e-4)
                np.testing.assert_allclose(mlp(A, W, bias), np.maximum(A @ W.T + bias, 0),
                                           rtol=1e-4, atol=1e-4)
            if epoch == 0:
                compiled = tmm.compile_count, mlp.compile_count
                assert max(compiled) <= 2
    assert (tmm.compile_count, mlp.compile_count) == compiled  # none in the second epoch


def test_output_shapes_computed_from_sizes_follow_every_call():
    # The output's extents (H - KH + 1) are evaluated per call, not taken from the first one.
    f = tc.define(CONV).conv
    W = f32(3, 2, 3, 3)
    with no_warnings():
        for n, h, w in [(2, 8, 9), (1, 5, 5), (3, 12, 7), (1, 3, 3)]:
            I = f32(n, 2, h, w)
            got = f(I, W)
            assert got.shape == (n, 3, h - 2, w - 2)
            np.testing.assert_allclose(got, conv_reference(I, W), rtol=1e-4, atol=1e-4)
    # (one kernel; with AVX2 its tiles' 4-lane vectors are wider than the 5x5 image's 3 output
    # columns, which get the one rescheduled pipeline CpuKernel keeps for smaller sizes)
    assert f.compile_count <= 2


def test_inout_outputs_at_varying_sizes():
    f = tc.define("def f(float(N) A) -> (O) { O(i) += A(i) * O(i) }").f
    for n in [6, 2, 11]:
        A, start = f32(n), f32(n)
        out = start.copy()
        assert f(A, out=out) is out
        np.testing.assert_allclose(out, start + A * start, rtol=1e-5, atol=1e-6)
    assert f.compile_count == 1


@pytest.mark.parametrize("args, message", [
    ((f32(4, 6, 12), f32(3, 7, 12)), "size variable B is 4 from X dimension 0 but 3 from Y"),
    ((f32(4, 6, 12), f32(4, 7, 11)), "size variable M is 12 from X dimension 2 but 11 from Y"),
    ((f32(4, 6), f32(4, 7, 12)), "expects X of rank 3"),
    ((f32(4, 6, 12).astype(np.float64), f32(4, 7, 12)), "expects X of type float"),
])
def test_signature_violations_after_compiling_give_the_same_errors(args, message):
    f = tc.define(TBMM).tbmm
    f(f32(2, 6, 12), f32(2, 7, 12))
    with pytest.raises(tc.TCArgumentError, match=message):
        f(*args)
    assert f.compile_count == 1


def test_sizes_fixed_by_the_signature_are_still_checked():
    f = tc.define("def f(float(N, 3) A) -> (S) { S(i) +=! A(i, j) }").f
    A = f32(5, 3)
    np.testing.assert_allclose(f(A), A.sum(1), rtol=1e-5)
    with pytest.raises(tc.TCArgumentError, match="A dimension 1 must have size 3, got 4"):
        f(f32(5, 4))
    np.testing.assert_allclose(f(A[:2]), A[:2].sum(1), rtol=1e-5)
    assert f.compile_count == 1


STRIDED = """def strided(float(N, W) I, int32 s) -> (O) {
  O(n, w) +=! I(n, s * w + k) where k in 0:2
}"""


def strided_reference(I, s):
    width = (I.shape[1] - 2) // s + 1
    return np.stack([I[:, s * w:s * w + 2].sum(1) for w in range(width)], 1)


def test_scalars_in_subscripts_still_specialise_but_sizes_do_not():
    f = tc.define(STRIDED).strided
    assert f.specialized_scalars == {"s"}
    for n, w, s in [(3, 10, 2), (5, 13, 2), (2, 9, 3), (4, 14, 3), (1, 10, 2)]:
        I = f32(n, w)
        np.testing.assert_allclose(f(I, s), strided_reference(I, s), rtol=1e-5)
    assert f.compile_count == 2  # one per value of s


def test_specialize_shapes_compiles_per_shape():
    f = tc.define(TMM).tmm
    B = f32(6, 5)
    for m in [4, 9, 4]:
        A = f32(m, 5)
        np.testing.assert_allclose(f(A, B, specialize_shapes=True), A @ B.T, rtol=1e-4,
                                   atol=1e-4)
    assert f.compile_count == 2
    A = f32(7, 5)
    np.testing.assert_allclose(f(A, B), A @ B.T, rtol=1e-4, atol=1e-4)  # the generic one
    np.testing.assert_allclose(f(f32(3, 5), B, specialize_shapes=False).shape, (3, 6))
    assert f.compile_count == 3


def test_specialize_shapes_takes_a_bool():
    with pytest.raises(tc.TCArgumentError, match="specialize_shapes takes True, False or None"):
        tc.define(TMM).tmm(f32(2, 2), f32(2, 2), specialize_shapes="yes")


def test_subscripts_reading_a_computed_tensor_specialise_by_default():
    # Halide's lowering of nested reads through a split temporary is exponential in their depth
    # with symbolic extents (test_hardening_cpu: compile in bounded time), so such functions
    # keep per-shape kernels unless asked otherwise.
    f = tc.define("def f(int32(N) I) -> (O) { T(i) = I(I(i))\n O(i) = T(T(i)) }").f
    assert f.specializes_shapes
    assert not tc.define(TMM).tmm.specializes_shapes
    for n in [8, 5]:
        I = rng.integers(0, n, n).astype(np.int32)
        T = I[I]
        np.testing.assert_array_equal(f(I, schedule=None), T[T])
    assert f.compile_count == 2
    I = rng.integers(0, 6, 6).astype(np.int32)
    np.testing.assert_array_equal(f(I, schedule=None, specialize_shapes=False), I[I][I[I]])
    np.testing.assert_array_equal(f(I[:4] % 4, schedule=None, specialize_shapes=False),
                                  (I[:4] % 4)[(I[:4] % 4)][(I[:4] % 4)[(I[:4] % 4)]])
    assert f.compile_count == 3


def test_a_schedule_planned_for_large_sizes_is_replanned_where_it_cannot_run():
    # Li2018 splits loops by factors up to the estimates (ShiftInwards): planned for 64 rows
    # its code reads before row 0 of a 2-row input, which Halide's bounds check refuses. Those
    # sizes get a schedule planned for them (one more compilation, no fallback to unscheduled
    # code) and keep it.
    f = tc.define(TMM).tmm
    B = f32(24, 16)
    with no_warnings():
        for m, compiled in [(64, 1), (2, 2), (2, 2), (64, 2), (1, 2)]:
            A = f32(m, 16)
            np.testing.assert_allclose(f(A, B, schedule="Li2018"), A @ B.T, rtol=1e-4,
                                       atol=1e-4)
            assert f.compile_count == compiled, m
