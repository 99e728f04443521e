"""Regression tests for what the fuzz campaigns found (benchmarks/fuzz_campaign.py: differential
with tests/fuzz/mapping.py's options, narrow with tests/fuzz/narrow.py), each minimized, run as
emulated CUDA and compared with values computed by hand or by numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tcstage as tc

M = tc.MappingOptions


def test_a_reduction_is_not_split_where_a_statement_in_its_loop_needs_its_total():
    """Differential seed 20104: with P = 2 fixed before scheduling, the first sum has one value
    of its loop, and isl fused it with the second sum's loop; both sums went to the threads, so
    the first one's total reached O after the second's identity had reset O (2.375, not 1.625:
    the second `+=!` starts over)."""
    source = """def f(int(N) X, float(P, M) C) -> (O) {
      O() +=! C(l, l) where l in 0:P - 1
      O() +=! 0.5 * fabs(C(X(m), m)) where m in 0:M
    }"""
    X = np.array([0, 1, 1, 0], np.int32)
    C = np.array([[0.75, 2.0, 2.0, 0.25], [-0.25, -0.5, 1.75, 2.0]], np.float32)
    expected = 0.5 * sum(abs(float(C[X[m], m])) for m in range(4))  # 1.625
    for options in (M().mapToThreads(32).fixParametersBeforeScheduling(True),
                    M().mapToThreads(8, 16).fixParametersBeforeScheduling(True)):
        kernel = tc.compile(source, "f", X, C, options=options, target="cuda-emulated")
        assert float(kernel(X, C)) == expected


def test_a_pointwise_update_in_a_reductions_loop_waits_for_its_total():
    """Differential seed 20194 (the same cause): with K = 1 the max over Y had one value of
    its loop, fused with the statements after it; `- 7` ran on max's identity (the int32
    minimum, wrapping to 2147483641) before the total arrived."""
    source = """def f(float(S, 5) E, int(K) Y) -> (O) {
      O() max=! Y(q)
      O() = O() - 7
      O() += E(p, p - 1)
    }"""
    E = np.array([[1, -1, 0, 2, -2], [1, 0, -1, 0, 2], [0, 3, 1, -1, 2]], np.float32)
    Y = np.array([2], np.int32)
    expected = 2 - 7 + E[1, 0] + E[2, 1]  # -1
    kernel = tc.compile(source, "f", E, Y, options=M().mapToThreads(32, 4)
                        .fixParametersBeforeScheduling(True), target="cuda-emulated")
    assert int(kernel(E, Y)) == expected


def test_tensor_cores_without_threads_keep_a_one_thread_block():
    """Narrow seed 37: with no band on threads (no mapToThreads), the tensor-core request still
    rounded blockDim.x up to a warp, and with no thread filter every one of the 32 threads ran
    every statement; with the barriers that shared memory brings (the bias reads the promoted
    C) their 32 sums interleaved in the one float32 accumulator."""
    source = """def f(half(M, K) A, half(N, K) B, half(N) b) -> (C) {
      C(m, n) +=! A(m, k) * B(n, k)
      C(m, n) = C(m, n) + b(n)
    }"""
    A = np.arange(-6, 15, dtype=np.float16).reshape(3, 7) / 4
    B = np.arange(-9, 19, dtype=np.float16).reshape(4, 7) / 8
    b = np.arange(4, dtype=np.float16) / 2
    kernel = tc.compile(source, "f", A, B, b, options=M().useSharedMemory(True)
                        .useTensorCores(True), target="cuda-emulated")
    # (multiples of 1/32 below 64 in magnitude: exact in half, whatever the order)
    expected = A.astype(np.float64) @ B.astype(np.float64).T + b
    np.testing.assert_array_equal(kernel(A, B, b), expected)


def test_tensor_cores_refuse_a_row_loop_that_blocks_take_in_turn():
    """Narrow seed 141: without tile(), mapToBlocks(3) gives block b the rows b, b + 3, ...;
    the tensor-core tile took rows b to b + 15 as one box, so the three blocks computed
    overlapping tiles (a race, and sums added up to three times). Now the contraction keeps its
    CUDA-core loops and a note says why."""
    source = "def nn(half(M, K) A, half(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    A = (np.arange(16 * 16).reshape(16, 16) % 5 - 2).astype(np.float16)
    B = (np.arange(16 * 32).reshape(16, 32) % 7 - 3).astype(np.float16)
    with pytest.warns(tc.TCWarning, match="loop m of S1 takes values that are not consecutive"):
        kernel = tc.compile(source, "nn", A, B, options=M().mapToThreads(32, 8).mapToBlocks(3)
                            .useTensorCores(True), target="cuda-emulated")
    # (small integer products and sums: exact)
    np.testing.assert_array_equal(kernel(A, B), A.astype(np.float64) @ B.astype(np.float64))
    tiled = tc.compile(source, "nn", A, B, options=M().tile(16, 16, 16).mapToThreads(32, 8)
                       .mapToBlocks(3).useTensorCores(True), target="cuda-emulated")
    assert "tc::mma_tile" in tiled.cuda_source
    np.testing.assert_array_equal(tiled(A, B), A.astype(np.float64) @ B.astype(np.float64))


def test_a_scatter_after_an_unbounded_first_statement_gives_no_shape():
    """Frontend campaign, mutants 14342 and 22187 of the paper's MLP3: a first statement that
    cannot bound `b` looks for a later statement of the tensor to take its shape from; a
    scatter (`O(b, 1) += ...`: a constant subscript) has no left-hand variable per dimension,
    and its one-dimensional box for a two-dimensional tensor ended in an IndexError. Now it is
    passed over and the first statement's range error stands."""
    source = """def f(float(Q) Bias, float(B) X) -> (O) {
      O(b, q) = Bias(q)
      O(b, 1) += X(b)
    }"""
    with pytest.raises(tc.TCRangeError, match="cannot infer the range of 'b'"):
        tc.define(source)


@pytest.mark.parametrize("op", ["+=!", "+="])
def test_an_update_whose_ranges_need_the_shape_is_not_a_piece(op):
    """Differential seed 20567: a later statement with a `where` clause on a left-hand index is
    tried as a further piece, its ranges inferred without the tensor's shape; here only O's
    shape bounds k (B(v, k + x) alone leaves k and x ambiguous), and that inference's
    TCRangeError rejected a valid update. Such a statement cannot be seen to reach outside the
    pieces: it is an ordinary update, k in 0:L from O's shape, x in 0:6 - L from B."""
    source = f"""def f(float(S, L) C, float(S, 5) B) -> (O) {{
      O(n, r) = C(n, r)
      O(v, k) {op} B(v, k + x) where v in 0:2
    }}"""
    C = np.arange(12, dtype=np.float32).reshape(3, 4)
    B = np.arange(15, dtype=np.float32).reshape(3, 5)
    expected = C.copy()
    if op == "+=!":
        expected[:2] = 0
    for v in range(2):
        for k in range(4):
            expected[v, k] += B[v, k] + B[v, k + 1]  # x in 0:2
    np.testing.assert_array_equal(tc.define(source).f(C, B), expected)


FIBER_PROBE = r"""
extern "C" __global__ void fiber_pool_probe(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 3.0f - 1.0f;
}
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_emulated_launches_give_their_fiber_stacks_back():
    """The narrow campaign's worker process failed after about 900 kernels (an OSError: failed
    to map segment, 'cannot allocate fiber stacks'): each kernel's library, which stays loaded,
    kept a pool of fiber stacks (a 64 KiB mapping and a guard page each) after its launches,
    30000 in all, at the kernel's limit of 65530 mappings per process. A launch of 512 threads
    now leaves only the library's own mappings behind."""
    from tcstage.cuda.emulate import emulate

    def mappings() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    x = np.arange(1000, dtype=np.float32)
    out = np.zeros_like(x)
    before = mappings()
    emulate(FIBER_PROBE, "fiber_pool_probe", (2, 1, 1), (512, 1, 1), [out, x, x.size])
    assert mappings() - before < 100  # (1024 more, two per stack, while the pools stayed)
    np.testing.assert_array_equal(out, x * 3 - 1)
