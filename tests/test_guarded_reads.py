"""Guarded reads (issue 12): a read inside a branch of `c ? a : b` whose condition keeps its
subscripts within the tensor does not constrain range inference; where a guard does not (or
tcstage cannot tell) and the read narrows a range the other accesses would allow, a TCWarning
names the read and its statement. Before this, `(0 <= x && x < H) ? I(x) : 0` silently
narrowed the reduction of a padded convolution and gave a wrong result without a word.

References are numpy loops over np.pad'ed inputs; CUDA kernels run under emulation with
several mapping options (shared memory among them) and are compiled by nvcc (conftest).
"""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc

M = tc.MappingOptions
rng = np.random.default_rng(12)

CONV1D = """
def conv(float(H) I, float(K) Wt) -> (O) {
  O(h) +=! ((h+kh-1 >= 0 && h+kh-1 < H) ? I(h+kh-1) : 0) * Wt(kh) where h in 0:H
}"""

# the same guard, written as the negation of the outside test, and in the other branch
GUARD_SPELLINGS = {
    "and": "(h+kh-1 >= 0 && h+kh-1 < H) ? I(h+kh-1) : 0",
    "not-or": "!(h+kh-1 < 0 || h+kh-1 >= H) ? I(h+kh-1) : 0",
    "else-branch": "(h+kh < 1 || h+kh > H) ? 0 : I(h+kh-1)",
    "nested": "h+kh >= 1 ? (h+kh-1 < H ? I(h+kh-1) : 0) : 0",
}

CONV2D = """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! ((h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)
                     ? I(n, c, h+kh-1, w+kw-1) : 0) * Wt(f, c, kh, kw)
      where h in 0:H, w in 0:W
}"""


def conv1d_same(I, Wt):
    """'same' correlation: padding (K - 1) / 2 = 1 on each side for K = 3."""
    P = np.pad(I.astype(np.float64), 1)
    return np.array([sum(P[h + k] * Wt[k] for k in range(len(Wt))) for h in range(len(I))])


def conv2d_same(I, Wt):
    N, C, H, W = I.shape
    F, _, KH, KW = Wt.shape
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    O = np.zeros((N, F, H, W))
    for kh in range(KH):
        for kw in range(KW):
            O += np.einsum("nchw,fc->nfhw", P[:, :, kh:kh + H, kw:kw + W], Wt[:, :, kh, kw])
    return O


def no_warnings(src):
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        return tc.define(src)


@pytest.mark.parametrize("spelling", list(GUARD_SPELLINGS))
def test_guarded_read_does_not_narrow_the_reduction(spelling):
    """The regression: before, kh was inferred as 1 <= kh < 2 (from I(h+kh-1) over h in 0:H)
    and O was the centre tap alone."""
    src = CONV1D.replace(GUARD_SPELLINGS["and"], GUARD_SPELLINGS[spelling])
    fn = no_warnings(src).conv
    I, Wt = rng.standard_normal(7).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    [report] = fn.ranges(I, Wt)
    assert report.concrete == {"h": (0, 7), "kh": (0, 3)}
    np.testing.assert_allclose(fn(I, Wt), conv1d_same(I, Wt), rtol=1e-5, atol=1e-5)


def test_guarded_2d_convolution_on_the_cpu():
    I = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    Wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = no_warnings(CONV2D).conv2d(I, Wt)
    assert out.shape == (2, 4, 5, 6)
    np.testing.assert_allclose(out, conv2d_same(I, Wt), rtol=1e-4, atol=1e-4)


OPTIONS = [
    M(),
    M().tile(4).mapToThreads(4).mapToBlocks(2).useSharedMemory(True),
    M().tile(4, 2).mapToThreads(2).mapToBlocks(3).useSharedMemory(True).usePrivateMemory(True),
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_guarded_1d_convolution_under_cuda_emulation(options):
    I, Wt = rng.standard_normal(10).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    k = tc.compile(CONV1D, "conv", I, Wt, options=options, target="cuda-emulated")
    np.testing.assert_allclose(k(I, Wt), conv1d_same(I, Wt), rtol=1e-5, atol=1e-5)
    # every access the kernel makes (and so every element a copy brings in) is within I
    scop = k.compiled.scop
    for s in scop.statements:
        for a in s.reads:
            assert a.relation.range().is_subset(scop.tensor_extents[a.tensor]), a.text
    if options.use_shared_memory:
        assert any(p.tensor == "I" and p.memory == "shared"
                   for p in k.compiled.promoted.promotions)


@pytest.mark.parametrize("options", [
    M().tile(1, 2, 4, 4).mapToThreads(4, 4).mapToBlocks(2, 2).useSharedMemory(True),
    M().tile(1, 1, 2, 3).mapToThreads(3, 2).mapToBlocks(2, 4).useSharedMemory(True)
    .usePrivateMemory(True).unroll(4),
], ids=str)
def test_guarded_2d_convolution_under_cuda_emulation(options):
    I = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    Wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    k = tc.compile(CONV2D, "conv2d", I, Wt, options=options, target="cuda-emulated")
    np.testing.assert_allclose(k(I, Wt), conv2d_same(I, Wt), rtol=1e-4, atol=1e-4)


def _warnings_of(src):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = tc.define(src).f
    return fn, [str(w.message) for w in caught if issubclass(w.category, tc.TCWarning)]


def test_a_guard_that_misses_the_bound_narrows_with_a_warning():
    """`<= H` lets h+kh-1 reach H: the read still keeps the range in bounds (so kh loses its
    last tap), and the warning says so, naming the read, the guard and the statement."""
    fn, messages = _warnings_of("""def f(float(H) I, float(K) Wt) -> (O) {
      O(h) +=! ((h+kh-1 >= 0 && h+kh-1 <= H) ? I(h+kh-1) : 0) * Wt(kh) where h in 0:H }""")
    [m] = messages
    assert "the read I(h+kh-1)" in m and "'h+kh-1 >= 0 && h+kh-1 <= H'" in m
    assert "statement 'O(h) +=!" in m and "the guard does not keep it within I" in m
    assert "the other accesses allow 0 <= kh < K" in m


def test_a_guard_on_tensor_values_that_narrows_warns():
    fn, messages = _warnings_of("""def f(float(H) I, float(H) Mask, float(K) Wt) -> (O) {
      O(h) +=! (Mask(h) > 0 ? I(h+kh-1) : 0) * Wt(kh) where h in 0:H }""")
    [m] = messages
    assert "the read I(h+kh-1)" in m and "'Mask(h) > 0'" in m
    assert "cannot decide whether the guard keeps it within I" in m


@pytest.mark.parametrize("src", [
    # the mask is read unguarded in the condition: it bounds i as the guarded reads do
    "def f(float(N) X, bool(N) Mask) -> (Z) { Z(i) = Mask(i) && X(i) > 0 ? X(i) : -X(i) }",
    # B(i) bounds i in both branches; i > 0 keeps B(i - 1) above 0
    "def f(float(N) B) -> (A) { A(i) = i > 0 ? B(i) - B(i-1) : B(i) }",
    # the guarded read alone gives h's upper bound: a shift by one, with O(0) = 0
    "def f(float(H) I) -> (O) { O(h) = h >= 1 ? I(h-1) : 0 }",
])
def test_guards_that_narrow_nothing_are_silent(src):
    _, messages = _warnings_of(src)
    assert messages == []


def test_a_guard_proving_one_side_leaves_the_other_to_range_inference():
    """`h >= 1` keeps I(h-1) above I's first element, so only `h-1 < H` constrains h: O has
    H + 1 elements, O(0) = 0 and O(h) = I(h-1)."""
    fn, _ = _warnings_of("def f(float(H) I) -> (O) { O(h) = h >= 1 ? I(h-1) : 0 }")
    I = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(fn(I), np.concatenate([[0], I]).astype(np.float32))
    k = tc.compile("def f(float(H) I) -> (O) { O(h) = h >= 1 ? I(h-1) : 0 }", "f", I,
                   options=M().tile(2).mapToThreads(2).mapToBlocks(3).useSharedMemory(True),
                   target="cuda-emulated")
    np.testing.assert_array_equal(k(I), np.concatenate([[0], I]).astype(np.float32))


def test_where_ranges_count_as_facts_of_the_guard():
    """The guard `h - k + 1 >= 0` proves the lower side of I(h - k + 1); the upper side
    follows from the where clause alone (h < H and k >= 1), which holds wherever the read
    happens: the read constrains nothing, and there is nothing to warn about."""
    src = """def f(float(H) I) -> (O) {
      O(h) +=! (h - k + 1 >= 0 ? I(h - k + 1) : 0) where h in 0:H, k in 1:3 }"""
    fn, messages = _warnings_of(src)
    assert messages == []
    I = rng.standard_normal(6).astype(np.float32)
    expected = [sum(I[h - k + 1] for k in (1, 2) if h - k + 1 >= 0) for h in range(6)]
    np.testing.assert_allclose(fn(I), expected, rtol=1e-6)
    [report] = fn.ranges(I)
    assert re.sub(r"\s", "", report.symbolic["k"]) == "1<=k<3"


@pytest.mark.parametrize("where", ["n in 0:N, c in 0:2", "c in 0:2", "n in 0:N, c in 1:3"])
def test_a_guarded_read_of_the_point_written_is_not_clamped(where):
    """`T(n,c) = (M(n,c) > 0 ? T(n,c) : 0) where ...`: the read of T at the point written lies
    in T wherever the write does. Clamping its subscripts (the where range may run past C, so
    range inference warns) moved a pure variable, which Halide refuses: an internal error. The
    jvp of `M(n,c) min= X(n,c) + 1 where c in 0:2` generates this read."""
    src = f"""def h(float(N,C) X, float(N,C) M) -> (T) {{
      T(n,c) = X(n,c)
      T(n,c) = (M(n,c) > 0.0 ? T(n,c) : 0) + X(n,c) where {where}
    }}"""
    X = rng.standard_normal((3, 4)).astype(np.float32)
    Mv = rng.standard_normal((3, 4)).astype(np.float32)
    lo, hi = (1, 3) if "1:3" in where else (0, 2)
    want = X.copy()
    for n in range(3):
        for c in range(lo, hi):
            want[n, c] = (X[n, c] if Mv[n, c] > 0 else 0) + X[n, c]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (the where range may pass C)
        f = tc.define(src).h
    np.testing.assert_allclose(f(X, Mv), want, rtol=1e-6)
    np.testing.assert_allclose(f(X, Mv, schedule=None), want, rtol=1e-6)
