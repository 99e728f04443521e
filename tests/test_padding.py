"""Padding in TC (issue 12): `T(args) ?? v` is T's element where the subscripts are within T,
else v (Halide's constant_exterior). Such a read never narrows a range, so a padded, strided
convolution is one statement whose output size comes from its where clause; the plain
subscripts (`n`, `c`) of a `??` read still give their ranges where nothing else does.

References: np.pad and explicit loops/einsum. CUDA kernels run under emulation with several
mapping options (shared memory among them) and are compiled by nvcc (conftest).
"""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc

M = tc.MappingOptions
rng = np.random.default_rng(120)

CONVS = """
def same(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) ?? 0 * Wt(f, c, kh, kw) where h in 0:H, w in 0:W
}
def strided(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! I(n, c, 2*h + kh - 1, 2*w + kw - 1) ?? 0 * Wt(f, c, kh, kw) where h in 0:(H + 2 - KH)/2 + 1, w in 0:(W + 2 - KW)/2 + 1
}
"""


def conv_ref(I, Wt, stride, pad, value=0.0):
    """Cross-correlation of the np.pad'ed input, as PyTorch's conv2d computes it."""
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)),
               constant_values=value)
    N, C, H, W = P.shape
    F, _, KH, KW = Wt.shape
    Ho, Wo = (H - KH) // stride + 1, (W - KW) // stride + 1
    O = np.zeros((N, F, Ho, Wo))
    for h in range(Ho):
        for w in range(Wo):
            window = P[:, :, stride * h:stride * h + KH, stride * w:stride * w + KW]
            O[:, :, h, w] = np.einsum("nchw,fchw->nf", window, Wt)
    return O


@pytest.fixture(scope="module")
def convs():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)  # nothing to warn about
        return tc.define(CONVS)


@pytest.mark.parametrize("H,W", [(7, 6), (6, 5), (1, 2)])
def test_same_padded_convolution_is_h_by_w(convs, H, W):
    I = rng.standard_normal((2, 3, H, W)).astype(np.float32)
    Wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    assert convs.same.output_shapes(I, Wt) == [(2, 4, H, W)]
    np.testing.assert_allclose(convs.same(I, Wt), conv_ref(I, Wt, 1, 1), rtol=1e-4, atol=1e-4)
    [report] = convs.same.ranges(I, Wt)
    assert report.concrete == {"n": (0, 2), "f": (0, 4), "h": (0, H), "w": (0, W),
                               "c": (0, 3), "kh": (0, 3), "kw": (0, 3)}


@pytest.mark.parametrize("H,W", [(7, 6), (5, 8), (3, 3)])
def test_strided_padded_convolution(convs, H, W):
    """stride 2, padding 1: PyTorch's (H + 2 - KH) / 2 + 1 outputs per dimension."""
    I = rng.standard_normal((1, 2, H, W)).astype(np.float32)
    Wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    expected = conv_ref(I, Wt, 2, 1)
    assert convs.strided.output_shapes(I, Wt) == [expected.shape]
    np.testing.assert_allclose(convs.strided(I, Wt), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,stride,H,W", [("same", 1, 33, 20), ("strided", 2, 17, 35)])
def test_a_padded_input_is_computed_once_on_the_cpu(convs, name, stride, H, W):
    """On the CPU, `I(...) ?? 0` reads a padded copy of I computed once (Halide's
    constant_exterior, dense), not a select and clamped subscripts per element in the
    convolution's inner loop, which gathered its vectors (8x slower at 32x32x32x32): image by
    image, per step of the convolution's parallel loop over n, so that each image's copy is
    still in cache when the convolution reads it. Sizes past a vector and a tile, one prime;
    the values against np.pad's."""
    I = rng.standard_normal((2, 5, H, W)).astype(np.float32)
    Wt = rng.standard_normal((16, 5, 3, 3)).astype(np.float32)
    f = tc.define(CONVS)[name]  # (planned for these sizes: the fixture's kernels are not)
    np.testing.assert_allclose(f(I, Wt), conv_ref(I, Wt, stride, 1), rtol=1e-4, atol=1e-4)
    lines = f.explain(I, Wt).splitlines()
    # (read by a stride, the copy is split by phase: see test_cpu_schedule's strided tests)
    copy = "I_padded" if stride == 1 else "I_phases"
    assert any(line.strip().split(":")[0].split("$")[0] == copy and
               "pointwise, computed per n of O" in line and "its parallel loop" in line
               for line in lines), lines
    # (strided, the register tile's rows are output channels, which no input read uses:
    # each vector of the input, loaded from one phase of the copy, serves the whole tile)
    assert stride == 1 or any("rows of f)" in line for line in lines), lines
    # (16 rows of f each read their own weight: the weights are copied with f innermost, so
    # that a tile's weights share one address; the padded copy is vectorised)
    assert any("rows of f)" in line and "Wt copied once with f innermost" in line
               for line in lines), lines
    assert any(line.strip().startswith(copy) and "in vectors of" in line
               for line in lines), lines


@pytest.mark.parametrize("name", ["same", "strided"])
def test_a_padded_copy_tests_only_the_dimensions_a_read_can_leave(convs, name, tmp_path):
    """`I(n, c, h + kh - 1, w + kw - 1) ?? 0` never leaves I along n or c (they run over
    exactly I's sizes): the padded copy tests h and w alone. A test along n, which Halide
    cannot rule out (the output's sizes are parameters of their own), made it split the loop
    over n into three copies of the whole convolution (before, inside and past I), and LLVM
    took twice as long to compile it (padconv's forward: 1.6 -> 0.8 s of CPU). Seen in
    Halide's lowered statement: no loop over n has a prologue or an epilogue."""
    import halide as hl
    from tcstage.halide.lower import lower
    f = convs[name]
    I = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    Wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = f.bind([I, Wt], None, shapes_only=True)
    lowered = lower(f.checked, f._infer(b.specialization(f)), {}, cpu=True)
    path = str(tmp_path / "lowered.stmt")
    hl.Pipeline(list(lowered.outputs)).compile_to_lowered_stmt(
        path, list(lowered.params.values()), hl.StmtOutputFormat.Text, hl.get_host_target())
    text = open(path).read()
    assert not re.findall(r"\.n\.(?:prologue|epilogue)", text)
    # (and the values: the convolution against np.pad's)
    np.testing.assert_allclose(f(I, Wt), conv_ref(I, Wt, 1 if name == "same" else 2, 1),
                               rtol=1e-4, atol=1e-4)


def test_padding_with_a_value_that_varies_keeps_the_guarded_read():
    """A padding value computed per point is no constant exterior: the read stays a select
    in the statement."""
    fn = tc.define("def f(float(H) I) -> (O) { O(h) = I(h - 1) ?? h where h in 0:H + 2 }").f
    I = rng.standard_normal(37).astype(np.float32)
    expected = np.concatenate([[0], I, [38]]).astype(np.float32)
    np.testing.assert_array_equal(fn(I), expected)
    assert "padded" not in fn.explain(I)


OPTIONS = [
    M(),
    M().tile(1, 2, 4, 4).mapToThreads(4, 4).mapToBlocks(2, 2).useSharedMemory(True),
    M().tile(1, 1, 2, 3).mapToThreads(3, 2).mapToBlocks(2, 4).useSharedMemory(True)
    .usePrivateMemory(True).unroll(4),
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("name,stride", [("same", 1), ("strided", 2)])
def test_padded_convolutions_under_cuda_emulation(convs, name, stride, options):
    I = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    Wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (options without effect)
        k = tc.compile(convs, name, I, Wt, options=options, target="cuda-emulated")
    np.testing.assert_allclose(k(I, Wt), conv_ref(I, Wt, stride, 1), rtol=1e-4, atol=1e-4)
    # The padded read is guarded and its subscripts clamped: every access, and so every
    # element a shared-memory copy brings in, is within I.
    scop = k.compiled.scop
    for s in scop.statements:
        for a in s.reads:
            assert a.exact and a.relation.range().is_subset(scop.tensor_extents[a.tensor])
    if options.use_shared_memory:
        assert any(p.tensor == "I" and p.memory == "shared"
                   for p in k.compiled.promoted.promotions)
    # the read of I happens only under its in-bounds condition
    assert "? shared_I[" in k.cuda_source or "? I[" in k.cuda_source


def test_padding_value_and_1d_shift():
    """`I(h - 1) ?? -1.5` over h in 0:H + 2 is I with -1.5 before and after (np.pad)."""
    fn = tc.define("def f(float(H) I) -> (O) { O(h) = I(h - 1) ?? -1.5 where h in 0:H + 2 }").f
    I = rng.standard_normal(5).astype(np.float32)
    expected = np.pad(I, 1, constant_values=-1.5)
    np.testing.assert_array_equal(fn(I), expected)
    k = tc.compile("def f(float(H) I) -> (O) { O(h) = I(h - 1) ?? -1.5 where h in 0:H + 2 }",
                   "f", I, options=M().tile(2).mapToThreads(2).mapToBlocks(4)
                   .useSharedMemory(True), target="cuda-emulated")
    np.testing.assert_array_equal(k(I), expected)


def test_a_padded_read_never_narrows():
    """A(i) ?? 0 + B(i): B gives i its range, A is read as 0 beyond its end (spec 001 would
    intersect the two ranges)."""
    fn = tc.define("def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) ?? 0 + B(i) }").f
    A, B = np.arange(3, dtype=np.float32), np.arange(10, 16, dtype=np.float32)
    np.testing.assert_array_equal(fn(A, B), B + np.array([0, 1, 2, 0, 0, 0], np.float32))


def test_binds_to_the_read():
    """`I(x) ?? 0 * W(k)` is `(I(x) ?? 0) * W(k)`, and `-I(x) ?? 3` is `-(I(x) ?? 3)`."""
    fn = tc.define("""def f(float(H) I, float(K) Wt) -> (O) {
      O(h) +=! -I(h + k - 1) ?? 3 * Wt(k) where h in 0:H }""").f
    I, Wt = rng.standard_normal(6).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    P = np.pad(I.astype(np.float64), 1, constant_values=3)
    expected = [sum(-P[h + k] * Wt[k] for k in range(3)) for h in range(6)]
    np.testing.assert_allclose(fn(I, Wt), expected, rtol=1e-5, atol=1e-5)


def test_data_dependent_subscript_under_padding():
    """Out-of-range index values give the padding value, in bounds they read A; no precondition
    warning, since the read cannot leave A."""
    src = "def f(float(N) A, int32(N) J) -> (O) { O(i) = A(J(i)) ?? 7 }"
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        fn = tc.define(src).f
    A, J = np.arange(4, dtype=np.float32), np.array([3, 0, 9, -1], np.int32)
    np.testing.assert_array_equal(fn(A, J), [3, 0, 7, 7])
    k = tc.compile(src, "f", A, J, target="cuda-emulated")
    np.testing.assert_array_equal(k(A, J), [3, 0, 7, 7])


@pytest.mark.parametrize("src,message", [
    ("def f(float(N) A) -> (O) { O(h) = exp(A(h)) ?? 0 }",
     "'??' gives the value of a tensor read outside the tensor, so it must follow a tensor read"),
    ("def f(float(N) A) -> (O) { O(h) = A(h) \n O(h) = O(h) ?? 0 }",
     "'??' on 'O', the tensor this statement writes"),
    ("def f(int32(N) A) -> (O) { O(h) = A(h - 1) ?? 0.5 where h in 0:N }",
     "the value after '??' is 0.5, but 'A' holds int32"),
    ("def f(float(N) A) -> (O) { O(h) +=! A(h + k - 1) ?? 0 where k in 0:3 }",
     "a read 'T(...) ?? v' never limits a range"),
])
def test_errors(src, message):
    with pytest.raises(tc.TCError) as e:
        tc.define(src)
    assert message in str(e.value)
    assert e.value.span is not None


def test_repeat_edge_by_clamping_the_subscript():
    """Halide's repeat_edge, spelled as a clamp: isl proves the subscript within I, so it does
    not narrow kh (before, the solver's interval reasoning took kh to 0:2, silently)."""
    src = """def f(float(H) I, float(K) Wt) -> (O) {
      O(h) +=! I(max(min(h + kh - 1, H - 1), 0)) * Wt(kh) where h in 0:H }"""
    I, Wt = rng.standard_normal(6).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    P = np.pad(I.astype(np.float64), 1, mode="edge")
    expected = [sum(P[h + k] * Wt[k] for k in range(3)) for h in range(6)]
    fn = tc.define(src).f
    assert fn.ranges(I, Wt)[0].concrete["kh"] == (0, 3)
    np.testing.assert_allclose(fn(I, Wt), expected, rtol=1e-5, atol=1e-5)
    k = tc.compile(src, "f", I, Wt, options=M().tile(2).mapToThreads(2).useSharedMemory(True),
                   target="cuda-emulated")
    np.testing.assert_allclose(k(I, Wt), expected, rtol=1e-5, atol=1e-5)
