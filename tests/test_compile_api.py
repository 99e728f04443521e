"""`tc.compile` and its kernel object, and what the mapping must guarantee: launch sizes
tightened to the iteration space, reductions never split across blocks, barriers where threads
exchange data (and the emulator catching their absence), unrolling within its budget."""

import importlib.util
import re
from pathlib import Path
import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage.cuda.emulate import EmulationRaceError, emulate
from tcstage.cuda.launch import _allocator, device_pointer

M = tc.MappingOptions
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
MLP2 = """def mlp2(float(B,M) I, float(O,M) W2, float(P,O) W3) -> (O2, O3) {
  O2(b,o) +=! I(b,m) * W2(o,m)
  O3(b,p) +=! O2(b,o) * W3(p,o)
}"""
rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_kernel_object_shows_what_was_generated():
    A, B = f32(12, 8), f32(10, 8)
    k = tc.compile(TMM, "tmm", A, B, options=M().tile(4, 4).mapToThreads(32, 32)
                   .mapToBlocks(64, 64), target="cuda-emulated")
    # 3 x 3 tiles and 4 x 4 points: sizes are tightened to what the iteration space needs
    assert k.grid == (3, 3, 1) and k.block == (4, 4, 1)
    assert "__global__" in k.cuda_source and "blockIdx.x" in k.cuda_source
    assert "__launch_bounds__(16)" in k.cuda_source
    assert "// def tmm" in k.cuda_source and "tile(4, 4)" in k.cuda_source
    assert "t0" in k.schedule_tree and "b0" in k.schedule_tree
    text = k.describe()
    assert "schedule (isl scheduler" in text and "grid (3, 3, 1)" in text
    assert set(k.timings) == {"lower", "extract", "dependences", "schedule", "tile", "map",
                              "promote", "codegen"}
    assert k.sizes == {"M": 12, "K": 8, "N": 10}
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k.run(A, B), A @ B.T, rtol=1e-5, atol=1e-5)
    assert "grid=(3, 3, 1)" in repr(k)


def test_options_as_text_or_preset_and_shapes_instead_of_arrays():
    by_text = tc.compile(TMM, "tmm", (12, 8), (10, 8),
                         options="MappingOptions().tile(4, 4).mapToThreads(4, 4)")
    assert by_text.options == M().tile(4, 4).mapToThreads(4, 4)
    assert tc.compile(TMM, "tmm", (12, 8), (10, 8), options="pointwise").options == \
        M.named("pointwise")
    with pytest.raises(tc.TCError, match="options must be"):
        tc.compile(TMM, "tmm", (12, 8), (10, 8), options=42)
    with pytest.raises(tc.TCError, match="unknown target 'opencl'"):
        tc.compile(TMM, "tmm", (12, 8), (10, 8), target="opencl")


def test_a_kernel_refuses_other_shapes():
    k = tc.compile(TMM, "tmm", (12, 8), (10, 8), target="cuda-emulated")
    with pytest.raises(tc.TCArgumentError, match="compiled for K=8, M=12, N=10; the arguments "
                                                 "give K=8, M=13, N=10"):
        k(f32(13, 8), f32(10, 8))


def test_in_out_outputs_are_updated_in_place_even_when_not_contiguous():
    prog = tc.define("def sgemm(float a, float(N,M) A, float(M,K) B) -> (C) {\n"
                     "  C(i,j) += a * A(i,k) * B(k,j)\n}")
    A, B = f32(5, 3), f32(3, 4)
    start = np.asfortranarray(f32(5, 4))
    expected = start + 2.0 * A @ B
    C = start.copy(order="F")
    k = tc.compile(prog, "sgemm", 2.0, A, B, out=C, options=M().tile(2, 2).mapToThreads(2, 2),
                   target="cuda-emulated")
    got = k(2.0, A, B, out=C)
    assert got is C
    np.testing.assert_allclose(C, expected, rtol=1e-5, atol=1e-5)


def test_reductions_split_only_where_parallel_reductions_allow():
    prog = tc.define("def rowsum(float(N,K) A) -> (S) { S(n) +=! A(n,k) }")
    A = f32(6, 40)
    options = M().tile(2, 8).mapToBlocks(64, 64).mapToThreads(32, 32)
    k = tc.compile(prog, "rowsum", A, options=options.parallelReductions(False),
                   target="cuda-emulated")
    assert k.grid == (3, 1, 1)  # only n; k carries the reduction
    assert k.block == (2, 1, 1)
    np.testing.assert_allclose(k(A), A.sum(axis=1), rtol=1e-5, atol=1e-5)
    # left unset, n's 2 values of a tile take threads, as TC maps them: no split
    k = tc.compile(prog, "rowsum", A, options=options, target="cuda-emulated")
    assert k.grid == (3, 1, 1) and k.block == (2, 1, 1)
    np.testing.assert_allclose(k(A), A.sum(axis=1), rtol=1e-5, atol=1e-5)
    # forced, the 8 values of a k tile outnumber n's 2: threads split k, blocks keep n
    k = tc.compile(prog, "rowsum", A, options=options.parallelReductions(True),
                   target="cuda-emulated")
    assert k.grid == (3, 1, 1) and k.block == (32, 1, 1)
    np.testing.assert_allclose(k(A), A.sum(axis=1), rtol=1e-5, atol=1e-5)


def _strip_barriers(source: str) -> str:
    return re.sub(r"^\s*_sync\(\);\n", "", source, flags=re.M)


def test_barriers_separate_dependent_statements_and_are_needed():
    prog = tc.define(MLP2)
    I, W2, W3 = f32(3, 5), f32(16, 5), f32(4, 16)
    k = tc.compile(prog, "mlp2", I, W2, W3, options=M().scheduleFusionStrategy("Min")
                   .mapToThreads(16), target="cuda-emulated")
    assert k.compiled.mapped.syncs >= 1 and "_sync();" in k.cuda_source
    O2 = I @ W2.T
    got = k(I, W2, W3)
    np.testing.assert_allclose(got[0], O2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], O2 @ W3.T, rtol=1e-4, atol=1e-4)
    # Without them the second layer reads values other threads have not written yet: the
    # emulator, which runs threads in two orders, must notice.
    racy = _strip_barriers(k.cuda_source)
    buffers = [np.zeros((3, 16), np.float32), np.zeros((3, 4), np.float32)]
    args = buffers + [I, W2, W3] + [np.int32(k.sizes[s]) for s in ("B", "M", "O", "P")]
    assert [p.source for p in k.compiled.cuda.parameters][5:] == ["B", "M", "O", "P"]
    with pytest.raises(EmulationRaceError):
        emulate(racy, k.name, k.grid, k.block, args)


def test_no_barrier_where_each_thread_keeps_its_own_data():
    prog = tc.define(TMM + "\ndef relu_tmm(float(M,K) A, float(N,K) B) -> (C) {\n"
                     "  C(m,n) +=! A(m,kk) * B(n,kk)\n  C(m,n) = fmaxf(C(m,n), 0)\n}")
    k = tc.compile(prog, "relu_tmm", f32(8, 4), f32(8, 4),
                   options=M().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2, 2),
                   target="cuda-emulated")
    assert "_sync();" not in k.cuda_source and k.compiled.mapped.syncs == 0


def _copies(source: str, statement: str) -> int:
    return len(re.findall(rf"^\s*{statement}\(", source, flags=re.M))


def test_unroll_stays_within_its_budget():
    A, B = f32(4, 8), f32(4, 8)
    base = M().tile(4, 4).mapToThreads(4, 4)
    rolled = tc.compile(TMM, "tmm", A, B, options=base.unroll(4), target="cuda-emulated")
    assert _copies(rolled.cuda_source, "S1") == 1  # 8 reduction steps do not fit in 4
    unrolled = tc.compile(TMM, "tmm", A, B, options=base.unroll(8), target="cuda-emulated")
    assert _copies(unrolled.cuda_source, "S1") == 8 and "for" not in \
        unrolled.cuda_source.split("threadIdx.y;")[1]
    np.testing.assert_allclose(unrolled(A, B), A @ B.T, rtol=1e-5, atol=1e-5)


def test_naive_options_give_one_thread():
    k = tc.compile(TMM, "tmm", (3, 2), (4, 2), target="cuda-emulated")
    assert k.grid == k.block == (1, 1, 1) and "threadIdx" not in k.cuda_source


class FakeDeviceArray:
    """Just enough of `__cuda_array_interface__` to test binding without a GPU."""

    def __init__(self, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (4096, False),
                                         "strides": strides, "version": 3}


def test_device_arrays_bind_by_shape_and_dtype():
    prog = tc.define(TMM)
    fake_a, fake_b = FakeDeviceArray((3, 2)), FakeDeviceArray((4, 2))
    assert prog.tmm.output_shapes(fake_a, fake_b) == [(3, 4)]
    with pytest.raises(tc.TCArgumentError, match="type float32"):
        prog.tmm(FakeDeviceArray((3, 2), "<f8"), fake_b)
    with pytest.raises(tc.TCArgumentError, match="device array .*runs on the CPU"):
        prog.tmm(fake_a, fake_b)
    k = tc.compile(prog, "tmm", fake_a, fake_b, target="cuda-emulated")
    with pytest.raises(tc.TCArgumentError, match="cuda-emulated.*numpy"):
        k(fake_a, fake_b)
    assert device_pointer(fake_a, "A") == 4096
    with pytest.raises(tc.TCArgumentError, match="not C-contiguous"):
        device_pointer(FakeDeviceArray((3, 2), strides=(4, 12)), "A")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_outputs_for_torch_inputs_are_torch_tensors_of_every_kernel_dtype():
    # (the GPU launch allocates outputs with this; a CPU tensor stands in for a CUDA one)
    import ml_dtypes
    import torch
    zeros = _allocator([np.zeros(1), torch.ones(1)], gpuarray=None)
    for dtype, want in ((np.float32, torch.float32), (np.float16, torch.float16),
                        (ml_dtypes.bfloat16, torch.bfloat16), (np.int64, torch.int64)):
        t = zeros((2, 3), np.dtype(dtype))
        assert isinstance(t, torch.Tensor) and t.dtype == want and t.shape == (2, 3)
        assert not t.any()


@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None,
                    reason="pycuda is installed: tests/test_gpu.py runs the kernels instead")
def test_cuda_target_compiles_without_pycuda_and_says_what_is_missing():
    k = tc.compile(TMM, "tmm", (3, 2), (4, 2), options=M().mapToThreads(4))
    assert "__global__" in k.cuda_source
    with pytest.raises(tc.TCError, match=r"pycuda.*\n.*pip install 'tcstage\[cuda\]'"):
        k(f32(3, 2), f32(4, 2))


def test_warnings_do_not_leak_from_compilation():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tc.compile(TMM, "tmm", (3, 2), (4, 2), options=M().tile(2).mapToThreads(2))


def test_independent_groups_share_the_grid():
    """2LUT's two bags have no common loop and no dependence between them: each group's
    outermost band is tiled and mapped onto the same grid, as in the paper's kernel."""
    source = (Path(__file__).parent.parent / "examples" / "lut.tc").read_text()
    L1, L2 = f32(9, 6), f32(5, 6)
    I1 = rng.integers(0, 9, (4, 3)).astype(np.int32)
    I2 = rng.integers(0, 5, (4, 2)).astype(np.int32)
    with pytest.warns(tc.TCWarning, match="depends on tensor values"):
        k = tc.compile(source, "2LUT", L1, I1, L2, I2, options=M().tile(2, 2).mapToThreads(2)
                       .mapToBlocks(8, 8), target="cuda-emulated")
    assert k.grid == (2, 3, 1) and k.block == (2, 1, 1)
    assert k.compiled.mapped.block_bands == 2 and k.compiled.mapped.syncs == 0
    O1, O2 = k(L1, I1, L2, I2)
    np.testing.assert_allclose(O1, L1[I1].sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(O2, L2[I2].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_imperfectly_nested_tiling_sinks_point_loops_below_the_reduction():
    """The paper's Figure 3.d: with tileImperfectlyNested the (b, n) point loops of a tile move
    below the reduction loop, which then runs once per tile instead of once per point."""
    source = (Path(__file__).parent.parent / "examples" / "mlp.tc").read_text()
    I, W, B = f32(8, 12), f32(16, 12), f32(16)
    base = M().tile(4, 8).mapToThreads(2, 2)

    def loops_around_update(options):
        k = tc.compile(source, "MLP1", I, W, B, options=options, target="cuda-emulated")
        np.testing.assert_allclose(k(I, W, B), np.maximum(I @ W.T + B, 0), rtol=1e-4,
                                   atol=1e-4)
        lines = k.cuda_source.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("S1("))
        return [line.strip() for line in lines[at - 3:at]]

    flat = loops_around_update(base)
    assert "<= 11" in flat[-1]  # the reduction (M = 12) is the innermost loop
    sunk = loops_around_update(base.tileImperfectlyNested(True))
    assert "<= 11" in sunk[0] and "t1" in sunk[1] and "t0" in sunk[2]


def test_prepared_calls_reuse_their_arrays():
    A, B = f32(6, 3), f32(5, 3)
    k = tc.compile(TMM, "tmm", A, B, options=M().tile(2, 2).mapToThreads(2, 2),
                   target="cuda-emulated")
    call = k.prepare(A, B)
    C = call()
    np.testing.assert_allclose(C, A @ B.T, rtol=1e-5, atol=1e-5)
    A[...] = 0  # inputs are bound by reference on the CPU: a new launch sees new values
    call.launch()
    assert call.results() is C and not C.any()


# -- TC's Python spellings (issue 25) -----------------------------------------------------------

def test_tcs_preset_constructor():
    M = tc.MappingOptions
    assert M("single_thread") == M().tile(1) and M("mlp") == M.mlp() and M("Group-Conv") == M.group_conv()
    # TC's starting points, as tc/core/cuda/cuda_mapping_options.cc defines them
    assert str(M("naive")) == "MappingOptions().tile(32, 32, 32).mapToThreads(32, 8)" \
        ".mapToBlocks(256, 256)"
    assert M("convolution") == M().tile(4, 8, 8, 8).mapToThreads(4, 16, 4) \
        .mapToBlocks(256, 256, 256)
    assert M("conv", unroll_factor=2) == M.conv().unroll(2)
    with pytest.raises(tc.TCError, match=r"unknown named mapping options 'nave' \(did you mean "
                                          r"'naive'\?\)"):
        M("nave")
    with pytest.raises(tc.TCError, match="MappingOptions takes a preset name"):
        M(32)


def test_options_in_tcs_argument_order_name_the_keyword():
    src = "def f(float(N) A) -> (B) { B(i) = A(i) }"
    for options in ("single_thread", tc.MappingOptions().tile(4)):
        with pytest.raises(tc.TCArgumentError, match=r"tcstage takes the options by keyword.*"
                                                      r"options=\.\.\."):
            tc.compile(src, "f", options, np.ones(4, np.float32), target="cuda-emulated")


def test_a_discarded_chain_is_reported():
    """TC's options change in place (`o.tile(...)`); tcstage's return new ones, so TC code
    that drops the result compiles the starting point (TC's naive options, or one thread):
    the compile says so. A starting point named as text is asked for knowingly."""
    src = "def f(float(N) A) -> (B) { B(i) = A(i) * 2 }"
    a = np.arange(8, dtype=np.float32)
    for start, block in (("naive", (8, 1, 1)), ("single_thread", (1, 1, 1))):
        o = tc.MappingOptions(start)
        o.tile(4).mapToThreads(4)  # TC's style: the result is lost
        with pytest.warns(tc.TCWarning, match=f"exactly the '{start}' starting point.*immutable"):
            k = tc.compile(src, "f", a, options=o, target="cuda-emulated")
        assert k.block == block
        np.testing.assert_array_equal(k(a), a * 2)
    with pytest.warns(tc.TCWarning, match=r"MappingOptions\(\), the single-thread options: one "
                                          "thread in one block"):
        tc.compile(src, "f", a, options=tc.MappingOptions(), target="cuda-emulated")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        tc.compile(src, "f", a, options="single_thread", target="cuda-emulated")
        tc.compile(src, "f", a, options="naive", target="cuda-emulated")
    # Options equal to a starting point that a chain, the tuner (which reads its best back
    # as text) or a parse made are not a lost chain (at size 1 the tuner's best can be a
    # starting point itself, 'pointwise', and passing it on warned)
    for made in (tc.MappingOptions.parse(str(tc.MappingOptions.named("mlp"))),
                 tc.MappingOptions().tile(4).tile(1).mapToThreads(128).mapToBlocks(128)
                 .outerScheduleFusionStrategy("Max")):
        assert made == tc.MappingOptions.named("mlp")
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", tc.TCWarning)
            tc.compile(src, "f", a, options=made, target="cuda-emulated")
        assert not [w for w in said if "immutable" in str(w.message)]
