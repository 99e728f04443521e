"""Kernel sequences (tcstage/poly/launches.py): where one kernel of a function's statements would
get too few blocks because a dependence crosses the loops that could go to blocks, the compiler
launches several kernels in order, each with its own grid. Values are checked against numpy
under emulation (every kernel also goes through nvcc, conftest.py); the launch facts against
what the options ask for."""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage.compiler import compile_cuda
from tcstage.poly.launches import starved
from tcstage.tune import model

M = tc.MappingOptions

BLUR = """
def blur(float(H,W) I) -> (B, O) {
  B(y,x) = I(y,x) + I(y,x+1) + I(y,x+2)  where y in 0:H, x in 0:W-2
  O(y,x) = B(y,x) + B(y+1,x) + B(y+2,x)  where y in 0:H-2, x in 0:W-2
}
"""

NORMALIZE = """
def normalize(float(N,C) X) -> (S, Y) {
  S() +=! X(n,c)
  Y(n,c) = X(n,c) / S()
}
"""

SOFTMAX = """
def softmax(float(N,D) X) -> (Mx, E, S, Y) {
  Mx(n) max=! X(n,d)
  E(n,d) = exp(X(n,d) - Mx(n))
  S(n) +=! E(n,d)
  Y(n,d) = E(n,d) / S(n)
}
"""

BLUR_OPTIONS = M().tile(32, 32).mapToThreads(32, 8).mapToBlocks(8, 8)


def _fn(source, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define(source), name


def _blur_reference(I):
    B = I[:, :-2] + I[:, 1:-1] + I[:, 2:]
    return B, B[:-2] + B[1:-1] + B[2:]


def _kernel(fn, args, options, **kw):
    program, name = fn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.compile(program, name, *args, options=options, target="cuda-emulated", **kw)


def _compiled(fn, args, options):
    program, name = fn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return compile_cuda(program[name], args, options=options)


def test_a_stencil_chain_runs_as_two_launches_that_each_fill_their_grid():
    I = np.zeros((256, 256), np.float32)
    k = _kernel(_fn(BLUR, "blur"), [I], BLUR_OPTIONS)
    launches = k.launches
    # as one kernel, y carries B -> O and only x's 8 tiles go to blocks; alone each stage
    # takes the 8 x 8 asked for
    assert [launch.grid for launch in launches] == [(8, 8, 1), (8, 8, 1)]
    assert [launch.block for launch in launches] == [(32, 8, 1), (32, 8, 1)]
    assert [launch.statements for launch in launches] == [  # as written
        ("B(y,x) = I(y,x) + I(y,x+1) + I(y,x+2) where y in 0:H, x in 0:W-2",),
        ("O(y,x) = B(y,x) + B(y+1,x) + B(y+2,x) where y in 0:H-2, x in 0:W-2",)]
    assert [launch.name for launch in launches] == ["tc_blur_0", "tc_blur_1"]
    assert all(launch.shared_bytes == 0 for launch in launches)  # static buffers only
    assert k.grid == launches[0].grid and k.block == launches[0].block
    for launch in launches:  # every launch's code is in the one source
        assert re.search(rf"__global__ void (__launch_bounds__\(\d+\) )?{launch.name}\(",
                         k.cuda_source)


@pytest.mark.parametrize("shape", [(37, 45), (3, 3), (70, 33)])
def test_a_sequence_computes_what_numpy_does(shape):
    rng = np.random.default_rng(sum(shape))
    I = rng.standard_normal(shape).astype(np.float32)
    k = _kernel(_fn(BLUR, "blur"), [I], M().tile(8, 8).mapToThreads(8, 4).mapToBlocks(4, 4))
    B, O = k(I)
    want_B, want_O = _blur_reference(I)
    np.testing.assert_allclose(B, want_B, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(O, want_O, rtol=1e-5, atol=1e-5)


def test_a_dependence_across_every_loop_no_longer_means_one_block():
    """S() is read by every Y(n, c): as one kernel nothing could go to blocks."""
    rng = np.random.default_rng(1)
    X = rng.random((64, 48)).astype(np.float32) + 0.5
    options = M().tile(8, 16).mapToThreads(16, 8).mapToBlocks(8, 3)
    k = _kernel(_fn(NORMALIZE, "normalize"), [X], options)
    grids = [launch.grid for launch in k.launches]
    assert len(grids) == 2 and np.prod(grids[1]) == 8 * 3, grids
    assert k.launches[1].statements == ("Y(n,c) = X(n,c) / S()",)
    S, Y = k(X)
    np.testing.assert_allclose(S, X.sum(dtype=np.float64), rtol=1e-5)
    np.testing.assert_allclose(Y, X / X.sum(dtype=np.float64), rtol=1e-5)


def test_statements_that_map_to_blocks_together_stay_one_launch():
    """Softmax's rows go to blocks in one kernel: no reason to split it."""
    X = np.random.default_rng(2).standard_normal((130, 20)).astype(np.float32)
    k = _kernel(_fn(SOFTMAX, "softmax"), [X], M().tile(1).mapToThreads(32).mapToBlocks(130))
    assert len(k.launches) == 1
    assert k.launches[0].grid == k.grid == (130, 1, 1)
    Y = k(X)[-1]
    E = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(Y, E / E.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_single_block_asked_for_stays_one_launch():
    k = _kernel(_fn(BLUR, "blur"), [np.zeros((40, 40), np.float32)],
                M().tile(8, 8).mapToThreads(8, 8).mapToBlocks(1))
    assert len(k.launches) == 1 and k.grid == (1, 1, 1)


def test_dynamic_sizes_give_each_launch_its_own_grid():
    I = np.random.default_rng(3).standard_normal((40, 35)).astype(np.float32)
    k = _kernel(_fn(BLUR, "blur"), [I], M().tile(8, 8).mapToThreads(8, 8).mapToBlocks(16, 16),
                dynamic=["H"])
    assert len(k.launches) == 2
    small = I[:19]
    B, O = k(small)
    want_B, want_O = _blur_reference(small)
    np.testing.assert_allclose(O, want_O, rtol=1e-5, atol=1e-5)
    grids = [k._part_grid(p, {"H": 19, "W": 35}) for p in k.compiled.parts]
    # 19 rows of B in tiles of 8 are 3 tiles, 17 rows of O also 3; 33 columns are 5 tiles
    assert grids == [(3, 5, 1), (3, 5, 1)] or grids == [(5, 3, 1), (5, 3, 1)], grids


def test_the_cost_model_adds_up_the_launches():
    compiled = _compiled(_fn(BLUR, "blur"), [np.zeros((256, 256), np.float32)], BLUR_OPTIONS)
    whole = model.predict(compiled)
    parts = [model.predict(p) for p in compiled.launches]
    assert len(whole.launches) == 2
    assert whole.time == pytest.approx(sum(p.time for p in parts))
    assert whole.dram_bytes == pytest.approx(sum(p.dram_bytes for p in parts))
    assert whole.describe().splitlines()[0].endswith("2 launches")


def test_describe_and_explain_cover_every_launch():
    I = np.zeros((64, 64), np.float32)
    k = _kernel(_fn(BLUR, "blur"), [I], M().tile(16, 16).mapToThreads(16, 16).mapToBlocks(4, 4))
    assert k.describe().count("kernel: tc_blur_") == 2
    text = k.explain()
    assert "2 launches" in text and "launch 0" in text and "launch 1" in text


def test_the_split_rule():
    # one kernel is kept where it has more than half the blocks its statements would apart,
    # as long as it fills an H100 (two blocks per SM) if they would
    assert starved((1, 1), (2, 1)) and starved((8, 32), (64, 32)) and starved((64, 1), (128, 1))
    assert not starved((65, 1), (128, 1)) and not starved((128, 1), (128, 1))
    assert not starved((1, 1), (1, 1)) and not starved((1, 256), (1, 256))
    assert not starved((200, 256), (263, 256)) and starved((200, 256), (264, 256))
    assert not starved((264, 256), (10 ** 6, 256))  # (blocks beyond a full GPU do not count)
    assert starved((264, 32), (264, 256))
    # and never a single block where they would have more (local_laplacian's coarsest levels:
    # 1 block of 208 threads against 40 of 8)
    assert starved((1, 208), (40, 8)) and not starved((2, 208), (40, 8))


def test_auto_gives_each_launch_the_options_of_its_own_statements(tmp_path, monkeypatch):
    """options="auto" (nothing tuned): a 2-d sum then a 4-d elementwise statement. One set of
    tile sizes cannot fit both ranks, so each launch takes the structural default of its own
    largest statement; the function's options are those of the statement writing the most."""
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path))
    source = """
def mixed(float(N, C, H, W) X) -> (S, Y) {
  S(n, c) +=! X(n, c, h, w)
  Y(n, c, h, w) = X(n, c, h, w) / S(n, c)
}
"""
    X = np.random.default_rng(4).random((4, 8, 64, 64), dtype=np.float32) + 0.5
    k = _kernel(_fn(source, "mixed"), [X], "auto")
    first, second = k.compiled.parts
    assert k.compiled.options.tile_sizes == (1, 1, 8, 32)
    assert first.options.tile_sizes == (4, 8) and second.options.tile_sizes == (1, 1, 8, 32)
    assert [launch.grid for launch in k.launches] == [(1, 1, 1), (4, 8, 8)]
    assert k.launches[1].block == (32, 8, 1)
    S, Y = k(X)
    np.testing.assert_allclose(S, X.sum((2, 3)), rtol=1e-4)
    np.testing.assert_allclose(Y, X / X.sum((2, 3))[:, :, None, None], rtol=1e-4)


def test_a_list_of_options_maps_each_launch_with_its_own():
    """options=[...]: one set per launch, in launch order (the first also decides the
    launches); each launch is mapped as its set says and Launch.options names it."""
    source = """
def mixed(float(N, C, H, W) X) -> (S, Y) {
  S(n, c) +=! X(n, c, h, w)
  Y(n, c, h, w) = X(n, c, h, w) / S(n, c)
}
"""
    X = np.random.default_rng(5).random((4, 8, 16, 64), dtype=np.float32) + 0.5
    fn = _fn(source, "mixed")
    first = M().tile(2, 4).mapToThreads(4, 2).mapToBlocks(2, 2)
    second = M().tile(1, 1, 8, 32).mapToThreads(32, 8).mapToBlocks(4, 8, 2)
    k = _kernel(fn, [X], [first, "MappingOptions().tile(1, 1, 8, 32).mapToThreads(32, 8)"
                          ".mapToBlocks(4, 8, 2)"])
    assert [launch.options for launch in k.launches] == [first, second]
    assert [launch.grid for launch in k.launches] == [(2, 2, 1), (4, 8, 2)]
    assert [launch.block for launch in k.launches] == [(4, 2, 1), (32, 8, 1)]
    S, Y = k(X)
    np.testing.assert_allclose(S, X.sum((2, 3)), rtol=1e-4)
    np.testing.assert_allclose(Y, X / X.sum((2, 3))[:, :, None, None], rtol=1e-4)
    # one set for them all is the same as before, and compiles apart from the list's
    alone = _kernel(fn, [X], first)
    assert [launch.options for launch in alone.launches] == [first, first]


def test_a_list_of_options_of_the_wrong_length_names_the_launches():
    I = np.zeros((64, 64), np.float32)
    with pytest.raises(tc.TCError, match=r"3 sets of options were given, one per launch, but "
                       r"under the first set 'blur' runs as 2 launch\(es\) \(launch 0: B; "
                       r"launch 1: O\)"):
        _kernel(_fn(BLUR, "blur"), [I], [BLUR_OPTIONS] * 3)


@pytest.mark.parametrize("options, message", [
    ([], r"options=\[\] gives no options"),
    ([BLUR_OPTIONS, "auto"], r"options\[1\] is 'auto'"),
    ([BLUR_OPTIONS, "MappingOptions().tile(32"], r"options\[1\]: "),
    ([BLUR_OPTIONS.overlappedTiles(True), BLUR_OPTIONS], r"overlappedTiles\(True\) plans its "
                                                          r"launches from one set"),
])
def test_a_bad_list_of_options_is_refused_before_compiling(options, message):
    I = np.zeros((64, 64), np.float32)
    with pytest.raises(tc.TCError, match=message):
        _kernel(_fn(BLUR, "blur"), [I], options)
