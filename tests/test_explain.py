"""Kernel.explain(): the per-option account, checked against facts worked out by hand for
the kernels below (loop sizes, which loop is contiguous, what can be promoted)."""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage import MappingOptions as M
from tcstage.cuda.nvcc import nvcc_path

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
MLP2 = """def mlp2(float(B,M) I, float(O,M) W2, float(P,O) W3) -> (O2, O3) {
  O2(b,o) +=! I(b,m) * W2(o,m)
  O3(b,p) +=! O2(b,o) * W3(p,o)
}"""
SCALE = "def scale(float(N) X) -> (Y) { Y(i) = X(i) * 2 }"
EXAMPLE = M().tile(32, 32).mapToThreads(32, 8).mapToBlocks(64, 64).useSharedMemory(True) \
    .unroll(4)


def f32(*shape):
    return np.zeros(shape, np.float32)


def compile_quietly(src, name, *inputs, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.compile(src, name, *inputs, options=options, target="cuda-emulated")


def rows(text: str) -> dict:
    """The explain text's lines by their option column."""
    return {line[:21].strip(): line[22:] for line in text.splitlines()[1:] if line[:1] != " "}


@pytest.fixture(scope="module")
def tmm():
    return compile_quietly(TMM, "tmm", f32(128, 64), f32(256, 64), options=EXAMPLE)


def barrier_calls(source: str) -> int:
    return len(re.findall(r"^\s*_sync\d*\(\);", source, flags=re.M))


def test_example_names_the_loop_of_each_index_and_the_grid_used(tmm):
    text = tmm.explain()
    # 128 / 32 = 4 tiles of m, 256 / 32 = 8 tiles of n; 32 x 8 threads
    assert text.splitlines()[0] == ("kernel tc_tmm for M=128, K=64, N=256: grid (4, 8, 1) x "
                                    "block (32, 8, 1) = 256 threads, 32 blocks")
    row = rows(text)
    assert row["tile(32, 32)"].startswith("tiles loops m, n of the outer band by 32 x 32")
    assert "kk not tiled" in row["tile(32, 32)"]
    # blockIdx.x takes the outermost tile loop (m), threadIdx.x the innermost point loop: n,
    # the last (contiguous) dimension of C
    blocks = row["mapToBlocks(64, 64)"]
    assert "blockIdx.x <- tile loop over m (4 tiles)" in blocks
    assert "blockIdx.y <- n (8 tiles)" in blocks
    assert "asked 64 x 64, 4 x 8 used (the iteration space has no more)" in blocks
    threads = row["mapToThreads(32, 8)"]
    assert threads.startswith("threadIdx.x <- n (32 values per tile), threadIdx.y <- m")
    assert "each thread runs 4" in threads  # 32 rows of m over 8 threads


def test_promotion_lines_name_the_promoted_tensors(tmm):
    promoted = tmm.compiled.promoted.promotions
    # by hand: A(m, kk) and B(n, kk) are read along kk by consecutive threads (not coalesced)
    # and reused across the tile; C(m, n) is coalesced on threadIdx.x = n
    assert sorted(p.tensor for p in promoted) == ["A", "B"]
    line = rows(tmm.explain())["useSharedMemory"]
    for p in promoted:
        assert f"{p.tensor}: 32 x 64 tile in {p.buffer}[32][65]" in line
    assert "not promoted: C (C(m, n)): every access is coalesced" in line


def test_barrier_count_matches_the_source(tmm):
    # one barrier: after the copies of A and B (the scope runs once per block, no loop)
    assert barrier_calls(tmm.cuda_source) == 1
    line = rows(tmm.explain())["barriers"]
    assert line.startswith("1 __syncthreads(): after the copy-in of A, B")


def test_barrier_between_dependent_statements():
    k = compile_quietly(MLP2, "mlp2", f32(3, 5), f32(16, 5), f32(4, 16),
                        options=M().scheduleFusionStrategy("Min").mapToThreads(16))
    assert barrier_calls(k.cuda_source) == 1  # O3 reads rows of O2 other threads wrote
    line = rows(k.explain())["barriers"]
    assert line.startswith("1 __syncthreads(): after S1 (writes O2)")


def test_unroll_without_effect_says_why(tmm):
    no_effect = rows(tmm.explain())["no effect"]
    # kk is not tiled and not mapped: 64 iterations per thread, more than 4
    assert "unroll(4): nothing unrolled: the innermost loop kk runs 64 times per thread, " \
        "more than 4" in no_effect


def test_options_without_effect_are_listed_with_the_reason():
    k = compile_quietly(TMM, "tmm", f32(128, 64), f32(256, 64),
                        options=M().tile(8, 8, 8, 8).mapToThreads(32, 8, 4).unrollGpuTile(True))
    no_effect = rows(k.explain())["no effect"]
    # the band has three loops (m, n, kk); kk is a reduction, so only m and n take threads
    assert "tile(8, 8, 8, 8): the outermost band has 3 loops" in no_effect
    assert "mapToThreads(32, 8, 4): only 2 loops can be split across threads" in no_effect
    assert "threadIdx.z stays 1" in no_effect
    assert "unrollGpuTile(True): tcstage does not implement it" in no_effect


def test_private_memory_with_nothing_to_promote():
    # each thread reads X(i) and writes Y(i) once: nothing is used twice
    k = compile_quietly(SCALE, "scale", f32(64),
                        options=M().mapToThreads(64).usePrivateMemory(True))
    assert k.compiled.promoted.promotions == ()
    row = rows(k.explain())
    assert "usePrivateMemory" not in row
    assert "usePrivateMemory: nothing promoted (" in row["no effect"]
    assert "no element is used twice by a thread" in row["no effect"]
    assert row["mapToThreads(64)"].startswith("threadIdx.x <- i (64 values)")


def test_naive_kernel_explains_itself():
    k = compile_quietly(SCALE, "scale", f32(10), options=None)
    lines = k.explain().splitlines()
    assert lines[0].endswith("grid (1, 1, 1) x block (1, 1, 1) = 1 thread, 1 block")
    assert lines[1].startswith("one thread in one block: no mapping options given")
    assert lines[2].startswith("GPU use (H100)        1 block on 132 SMs: 1 SMs busy (1%)")
    assert len(lines) == 5  # (GPU use: blocks, occupancy, bytes and bound)


def test_gpu_use_says_how_the_launch_fills_the_device():
    """Issue 26's static report, per launch: blocks against the SMs, threads per block, the
    bytes moved against the least the tensors hold (counted by hand: A, B and C once, float32),
    and the model's bound; the device is a choice, ptxas's figures where asked and nvcc is
    here."""
    tmm = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
    options = M().tile(4, 32).mapToThreads(32, 1).mapToBlocks(32, 32).usePrivateMemory(True)
    k = compile_quietly(tmm, "tmm", (128, 1024), (1024, 1024), options=options)
    text = k.explain()
    use = text[text.index("GPU use (H100)"):]
    assert "1024 blocks on 132 SMs: 132 SMs busy (100%), 7.8 blocks per SM" in use
    assert "32 threads per block" in use
    least = (128 * 1024 + 1024 * 1024 + 128 * 1024) * 4
    assert f"against the {least / 1e6:.3g} MB its tensors hold" in use
    assert re.search(r"(memory|compute|latency) bound, [0-9.]+ us predicted", use)
    assert "GPU use (H200)" in k.explain(device="H200")
    if nvcc_path() is not None:
        assert "registers per thread (ptxas)" in k.explain(ptxas=True)


# -- the texts TC's option sets showed to be wrong (issue 25) ----------------------------------

SOFTMAX = """def softmax(float(N, C) X) -> (Mx, E, S, Y) {
    Mx(n) max=! X(n, c)
    E(n, c) = exp(X(n, c) - Mx(n))
    S(n) +=! E(n, c)
    Y(n, c) = E(n, c) / S(n)
}"""


def test_long_option_calls_keep_the_table_aligned_and_never_acting_options_warn_once():
    options = M().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2).unroll(4) \
        .outerScheduleFusionStrategy("Max").matchLibraryCalls(True) \
        .intraTileScheduleFusionStrategy("Max").outerScheduleFusionStrategy("Min")
    with pytest.warns(tc.TCWarning) as record:
        k = tc.compile(SOFTMAX, "softmax", f32(6, 40), options=options, target="cuda-emulated")
    never = [str(w.message) for w in record if "never act" in str(w.message)]
    assert len(never) == 1
    assert "matchLibraryCalls(True): no library calls" in never[0]
    assert 'intraTileScheduleFusionStrategy("Max"): tcstage does not ' \
        "reschedule" in never[0]
    lines = k.explain().splitlines()[1:]
    long_label = lines.index('outerScheduleFusionStrategy("Min")')  # alone on its line
    assert lines[long_label + 1].startswith(" " * 22 + "the isl scheduler's fusion")
    for line in lines:
        assert line == lines[long_label] or line[21] == " " and line[22] != " ", line
    assert "tiles loops n, c of each of the 6 groups' outer bands" in lines[0]
    # with the outer bands fused, the loop on threadIdx.x is n in three statements and c in
    # the last: both named, with the tensors they write
    k = compile_quietly(SOFTMAX, "softmax", f32(6, 40),
                        options=M().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2))
    assert "threadIdx.x <- n (of Mx, E, S) and c (of Y)" in k.explain()


def test_unrolling_only_loops_of_one_iteration_is_no_effect():
    k = compile_quietly(TMM, "tmm", f32(8, 4), f32(8, 4),
                        options=M().tile(1, 1).mapToThreads(1).mapToBlocks(8, 8).unroll(2)
                        .tile(1, 1, 1))
    row = rows(k.explain())
    assert "unroll(2)" not in row
    assert "unroll(2): nothing unrolled" in row["no effect"]
    assert "mapped to blocks)" not in row["no effect"]
