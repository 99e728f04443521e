"""Memory promotion: the paper's kernels with every combination of shared and private memory
(and the read-only cache) still equal numpy under emulation, promotion decisions follow the
paper's heuristics, copies bring only what is needed, and the barriers around copies are there
and needed. Tricky cases: in-place updates, overlapping reads and writes of one tensor, strided
and transposed accesses, tiles at the border of a size the tile does not divide, indirect reads
(the paper's two-stage promotion through index arrays).
"""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage.cuda.emulate import EmulationRaceError, emulate
from tcstage.cuda.nvcc import nvcc_path, ptx

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cuda_mapping import _EXAMPLES, KERNELS, check, random_options

M = tc.MappingOptions
rng = np.random.default_rng(11)

MEMORY = {
    "shared": lambda o: o.useSharedMemory(True),
    "private": lambda o: o.usePrivateMemory(True),
    "both": lambda o: o.useSharedMemory(True).usePrivateMemory(True).unrollCopyShared(True),
    "both+ldg": lambda o: o.useSharedMemory(True).usePrivateMemory(True).useReadOnlyCache(True),
}
BASES = {
    "strided": M().tile(2, 3, 2).mapToThreads(4, 2).mapToBlocks(2, 3).unroll(4),
    "imperfect": M().tile(2, 4, 2).mapToThreads(2, 2).mapToBlocks(3, 2)
    .tileImperfectlyNested(True).unroll(2),
    "wide": M().tile(4, 8).mapToThreads(8, 4).mapToBlocks(4, 4),
}


@pytest.mark.parametrize("memory", list(MEMORY))
@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_paper_kernels_with_promotion_match_numpy(kernel, base, memory):
    check(kernel, MEMORY[memory](BASES[base]))


# Register tiling: the reduction's tile loop and point loop outside each thread's sub-tile of
# outputs, the outputs in private memory across the whole reduction, operands staged per
# reduction tile in shared memory.
REGISTER = {
    "tiled-reduction": M().tile(4, 4, 2).mapToThreads(2, 2).mapToBlocks(2, 2)
    .useRegisterTiling(True).useSharedMemory(True).usePrivateMemory(True).unroll(4),
    "deeper-shared": M().tile(4, 4, 4, 2).mapToThreads(2, 2).mapToBlocks(3)
    .useRegisterTiling(True).useSharedMemory(True).usePrivateMemory(True).sharedDepth(3)
    .useReadOnlyCache(True).unroll(8),
}


@pytest.mark.parametrize("variant", list(REGISTER))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_paper_kernels_with_register_tiling_match_numpy(kernel, variant):
    check(kernel, REGISTER[variant])


_depth = st.none() | st.integers(0, 6)
random_memory = st.builds(
    lambda o, shared, private, registers, ldg, copies, sd, pd: (
        o.useSharedMemory(shared).usePrivateMemory(private).useRegisterTiling(registers)
        .useReadOnlyCache(ldg).unrollCopyShared(copies)
        ._with("shared_depth", sd)._with("private_depth", pd)),
    random_options, st.booleans(), st.booleans(), st.booleans(), st.booleans(),
    st.booleans(), _depth, _depth)


@settings(max_examples=_EXAMPLES, deadline=None, derandomize=_EXAMPLES <= 12,
          suppress_health_check=[HealthCheck.too_slow])
@given(kernel=st.sampled_from(sorted(KERNELS)), options=random_memory)
def test_random_memory_options(kernel, options):
    check(kernel, options, seed=2)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _compile(source, name, *args, options, out=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.compile(source, name, *args, options=options, target="cuda-emulated", out=out)


TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
PAPER_TMM = M().tile(4, 32).mapToThreads(32, 1).mapToBlocks(64, 128).useSharedMemory(True) \
    .usePrivateMemory(True).unroll(4)


def test_paper_tmm_listing_promotions():
    """The paper's Appendix A.4.1 kernel: shared_A[4][33], shared_B[32][33], private_C[4][1],
    one barrier after the copies, and C never read from global memory."""
    A, B = f32(128, 32), f32(256, 32)
    k = _compile(TMM, "tmm", A, B, options=PAPER_TMM)
    src = k.cuda_source
    assert "__shared__ float shared_A[4][33];" in src
    assert "__shared__ float shared_B[32][33];" in src
    assert "float private_C[4][1];" in src
    # no copy-in for C: every element is written (the reduction's identity) before it is read
    promos = {p.buffer: p for p in k.compiled.promoted.promotions}
    assert promos["private_C"].copy_in is None and promos["private_C"].copy_out
    assert promos["shared_A"].copy_out is None and promos["shared_B"].copy_out is None
    assert len(re.findall(r"_sync\d*\(\);", src)) == 1
    # C is written coalesced (n on threadIdx.x): not a shared-memory candidate
    assert any("shared C" in d and "coalesced" in d for d in k.compiled.promoted.declined)
    # the copies put the last subscript on threadIdx.x
    assert re.search(r"_0in\(b0, b1, 4 \* b0 \+ c\d, t0\)", src), src
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)
    text = k.describe()
    assert "shared A: shared_A[4][33] float32, tile 4 x 32, 528 bytes" in text
    assert "private C: private_C[4][1] float32, tile 4 x 1, 16 bytes per thread" in text


def _strip_after_copies(source):
    """The source without the barrier that follows the copy-in."""
    return re.sub(r"_sync\d*\(\);", "", source, count=1)


def test_barrier_after_copy_in_is_needed():
    A, B = f32(16, 8), f32(32, 8)
    k = _compile(TMM, "tmm", A, B, options=M().tile(4, 32).mapToThreads(32, 1)
                 .mapToBlocks(4, 1).useSharedMemory(True))
    assert k.compiled.promoted.syncs == 1
    C = np.zeros((16, 32), np.float32)
    args = [C, A, B] + [np.int32(k.sizes[s]) for s in ("K", "M", "N")]
    assert [p.source for p in k.compiled.cuda.parameters] == ["C", "A", "B", "K", "M", "N"]
    emulate(k.cuda_source, k.name, k.grid, k.block, args)
    with pytest.raises(EmulationRaceError):
        emulate(_strip_after_copies(k.cuda_source), k.name, k.grid, k.block, args)


def test_tiles_loop_over_blocks_with_a_trailing_barrier():
    """Fewer blocks than tiles: each block loops over tiles, so the next tile's copy-in must
    wait until every thread is done with this one."""
    A, B = f32(24, 8), f32(32, 8)
    k = _compile(TMM, "tmm", A, B, options=M().tile(4, 32).mapToThreads(32, 1)
                 .mapToBlocks(2, 1).useSharedMemory(True))
    assert k.grid == (2, 1, 1)
    assert k.compiled.promoted.syncs == 2
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)
    C = np.zeros((24, 32), np.float32)
    args = [C, A, B] + [np.int32(k.sizes[s]) for s in ("K", "M", "N")]
    *_, last = re.finditer(r"_sync\d*\(\);", k.cuda_source)
    racy = k.cuda_source[:last.start()] + k.cuda_source[last.end():]
    with pytest.raises(EmulationRaceError):
        emulate(racy, k.name, k.grid, k.block, args)


def test_shared_memory_budget_is_respected():
    A, B = f32(64, 32), f32(64, 32)
    small = PAPER_TMM.maxSharedMemory(1000)
    k = _compile(TMM, "tmm", A, B, options=small)
    shared = [p for p in k.compiled.promoted.promotions if p.memory == "shared"]
    assert sum(p.nbytes for p in shared) <= 1000
    assert [p.tensor for p in shared] == ["A"]  # 528 bytes fit, then B's 4224 do not
    assert any("4224 bytes exceed the 472 bytes" in d for d in k.compiled.promoted.declined)
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)


def test_read_only_cache_loads_inputs_through_ldg():
    A, B = f32(16, 8), f32(32, 8)
    k = _compile(TMM, "tmm", A, B, options=M().tile(4, 32).mapToThreads(32).useReadOnlyCache(True))
    assert "__ldg(&A[" in k.cuda_source and "__ldg(&B[" in k.cuda_source
    assert "__ldg(&C" not in k.cuda_source  # outputs are written: never through the cache
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)


# -- tricky promotions ----------------------------------------------------------------------------

ALL = [M().tile(4, 4).mapToThreads(4, 2).mapToBlocks(2, 2).useSharedMemory(True)
       .usePrivateMemory(True),
       M().tile(3, 5).mapToThreads(5, 3).mapToBlocks(3, 2).useSharedMemory(True)
       .usePrivateMemory(True).unroll(8).unrollCopyShared(True),
       M().tile(8).mapToThreads(8).useSharedMemory(True).usePrivateMemory(True)
       .tileImperfectlyNested(True)]


@pytest.mark.parametrize("options", ALL)
def test_in_place_update_copies_old_values_in(options):
    """sgemm updates C in place: C is read before it is written, so its tile is copied in."""
    src = """def sgemm(float a, float b, float(N,M) A, float(M,K) B) -> (C) {
      C(n,k) = b * C(n,k)
      C(n,k) += a * A(n,m) * B(m,k)
    }"""
    A, B, C0 = f32(9, 6), f32(6, 11), f32(9, 11)
    k = _compile(src, "sgemm", 1.5, 0.5, A, B, options=options, out=C0.copy())
    got = k(1.5, 0.5, A, B, out=C0.copy())
    np.testing.assert_allclose(got, 0.5 * C0 + 1.5 * A @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", ALL)
def test_overlapping_reads_and_a_written_temporary(options):
    """T is written by one thread and read at shifted positions by its neighbours; A is read
    through two overlapping references."""
    src = """def smooth(float(N) A) -> (T, O) {
      T(i) = A(i) + A(i + 1) where i in 0:N-1
      O(i) +=! T(i + k) where k in 0:3, i in 0:N-3
    }"""
    A = f32(23)
    k = _compile(src, "smooth", A, options=options)
    T, O = k(A)
    Tr = A[:-1] + A[1:]
    np.testing.assert_allclose(T, Tr, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(O, Tr[:-2] + Tr[1:-1] + Tr[2:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", ALL)
def test_transposed_and_strided_reads(options):
    src = """def tr(float(N,M) A, float(K) X) -> (O) {
      O(i,j) = A(j,i) + X(2*i + j)
    }"""
    A, X = f32(7, 13), f32(40)
    k = _compile(src, "tr", A, X, options=options)
    i, j = np.meshgrid(np.arange(13), np.arange(7), indexing="ij")
    np.testing.assert_allclose(k(A, X), A.T + X[2 * i + j], rtol=1e-6, atol=1e-6)


def test_transposed_reused_read_goes_to_shared_memory():
    """Reused (two overlapping references, one group) and not coalesced (the last subscript
    follows threadIdx.y): a 33 x 32 tile, rows padded to 33 against bank conflicts."""
    src = "def tr(float(N,M) A) -> (O) { O(i,j) = A(j,i) + A(j+1,i) where j in 0:N-1 }"
    A = f32(65, 64)
    k = _compile(src, "tr", A, options=M().tile(32, 32).mapToThreads(32, 8)
                 .useSharedMemory(True))
    [p] = [p for p in k.compiled.promoted.promotions if p.tensor == "A"]
    assert p.memory == "shared" and p.sizes == (33, 32) and p.padded == (33, 33)
    assert len(p.references) == 2
    np.testing.assert_allclose(k(A), A[:-1].T + A[1:].T, rtol=1e-6)
    # a single transposed read is used once: nothing to gain from a copy
    once = _compile("def t1(float(N,M) A) -> (O) { O(i,j) = A(j,i) }", "t1", A,
                    options=M().tile(32, 32).mapToThreads(32, 8).useSharedMemory(True))
    assert not once.compiled.promoted.promotions


@pytest.mark.parametrize("options", ALL)
def test_border_tiles_of_sizes_the_tile_does_not_divide(options):
    src = """def conv(float(N,H) I, float(KH) W) -> (O) {
      O(n,h) +=! I(n, h + kh) * W(kh)
    }"""
    I, W = f32(11, 17), f32(3)
    k = _compile(src, "conv", I, W, options=options)
    ref = sum(I[:, kh:kh + 15] * W[kh] for kh in range(3))
    np.testing.assert_allclose(k(I, W), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", ALL)
def test_indirect_reads(options):
    src = """def gather(float(E,D) L, int32(B,N) I) -> (O) {
      O(b,d) +=! L(I(b,n), d)
    }"""
    L, I = f32(13, 6), rng.integers(0, 13, (5, 4)).astype(np.int32)
    k = _compile(src, "gather", L, I, options=options)
    np.testing.assert_allclose(k(L, I), L[I].sum(axis=1), rtol=1e-5, atol=1e-5)
    # a 4000-row table fits no buffer whole, and each gathered row is summed once
    big = f32(4000, 4)
    k = _compile(src, "gather", big, I, options=options)
    np.testing.assert_allclose(k(big, I), big[I].sum(axis=1), rtol=1e-5, atol=1e-5)
    assert not any(p.tensor == "L" for p in k.compiled.promoted.promotions)
    assert any(d.startswith("shared L") and "no element is used twice" in d
               for d in k.compiled.promoted.declined)


# The paper's O[1 + Idx[i][j]][k], used by every m: the rows are gathered once per block.
GATHER = """def ind(float(E,K) O, int32(I,J) Idx, float(K,M) W) -> (R) {
  R(i,j,m) +=! O(1 + Idx(i,j), k) * W(k,m)
}"""


def _gather_inputs(rows=5000):
    O = f32(rows, 8)
    Idx = rng.integers(0, rows - 1, (6, 5)).astype(np.int32)
    return O, Idx, f32(8, 7)


@pytest.mark.parametrize("options", ALL + [M().tile(2, 4, 8).mapToThreads(8, 4)
                                           .mapToBlocks(3, 2).useSharedMemory(True)])
def test_two_stage_promotion_of_an_indirectly_read_table(options):
    O, Idx, W = _gather_inputs()
    k = _compile(GATHER, "ind", O, Idx, W, options=options)
    np.testing.assert_allclose(k(O, Idx, W), np.einsum("ijk,km->ijm", O[1 + Idx], W),
                               rtol=1e-5, atol=1e-5)


def test_gathered_buffer_takes_the_index_tile_as_dimensions():
    """shared_O[i][j][k] = O[1 + Idx[i][j]][k]: the buffer's first dimensions are the index
    array's 2 x 4 tile, the last the affine k; the copy reads Idx, the computation does not."""
    O, Idx, W = _gather_inputs()
    k = _compile(GATHER, "ind", O, Idx, W, options=M().tile(2, 4, 8).mapToThreads(8, 4)
                 .mapToBlocks(3, 2).useSharedMemory(True))
    [p] = k.compiled.promoted.promotions
    assert (p.tensor, p.memory, p.sizes, p.padded) == ("O", "shared", (2, 4, 8), (2, 4, 9))
    assert p.gather.index_tensors == ("Idx",) and "gathered through Idx" in p.describe()
    copy = next(line for line in k.cuda_source.splitlines() if line.startswith("#define _0in"))
    assert "Idx[" in copy and "shared_O[" in copy
    compute = next(line for line in k.cuda_source.splitlines() if line.startswith("#define S1"))
    assert "Idx" not in compute and "shared_O[" in compute
    # Idx's own reference is now needed by no statement: not promoted in its own right
    assert any(d.startswith("shared Idx") and "index" in d for d in k.compiled.promoted.declined)


def test_references_through_one_index_share_a_gathered_buffer():
    """O(Idx(i), k) and O(Idx(i), k + 1) gather the same rows: one buffer of 9 columns, not
    two of 8. (Halide binds the repeated clamped index to a let; the scop inlines it, or the
    subscript would look unknown and the table would stay in global memory.)"""
    src = """def g(float(E,L) O, int32(I) Idx, float(K,M) W) -> (R) {
      R(i,m) +=! O(Idx(i), k) * O(Idx(i), k + 1) * W(k,m)
    }"""
    O, Idx, W = f32(3000, 9), rng.integers(0, 3000, 12).astype(np.int32), f32(8, 6)
    k = _compile(src, "g", O, Idx, W, options=M().tile(4, 8).mapToThreads(8, 4)
                 .mapToBlocks(3).useSharedMemory(True))
    [p] = [p for p in k.compiled.promoted.promotions if p.tensor == "O"]
    assert p.gather and p.sizes == (4, 9) and len(p.references) == 2
    G = O[Idx]
    np.testing.assert_allclose(k(O, Idx, W), (G[:, :8] * G[:, 1:]) @ W, rtol=1e-5, atol=1e-5)


def test_gathering_needs_read_only_tables_and_indices():
    """A table or an index array the kernel writes may change between copy and use: neither
    is gathered, and the results stay right."""
    options = M().tile(2, 4).mapToThreads(4, 2).mapToBlocks(2, 2).useSharedMemory(True)
    written_table = """def g(float(E,K) T0, int32(I) Idx, float(K,M) W) -> (T, R) {
      T(e,k) = 2 * T0(e,k)
      R(i,m) +=! T(Idx(i), k) * W(k,m)
    }"""
    T0, Idx, W = f32(3000, 4), rng.integers(0, 3000, 6).astype(np.int32), f32(4, 5)
    k = _compile(written_table, "g", T0, Idx, W, options=options)
    assert not any(p.gather for p in k.compiled.promoted.promotions)
    np.testing.assert_allclose(k(T0, Idx, W)[1], 2 * T0[Idx] @ W, rtol=1e-5, atol=1e-5)
    written_index = """def g(float(E,K) T, int32(I) Idx0, float(K,M) W) -> (Idx, R) {
      Idx(i) = Idx0(i) + 1
      R(i,m) +=! T(Idx(i), k) * W(k,m)
    }"""
    Idx0 = rng.integers(0, 2999, 6).astype(np.int32)
    k = _compile(written_index, "g", T0, Idx0, W, options=options)
    assert not any(p.gather for p in k.compiled.promoted.promotions)
    np.testing.assert_allclose(k(T0, Idx0, W)[1], T0[Idx0 + 1] @ W, rtol=1e-5, atol=1e-5)


def test_private_promotion_refuses_elements_other_threads_read():
    """O2 is written by one thread per element and read by all threads of the next layer: it
    cannot live in one thread's registers."""
    src = """def mlp2(float(B,M) I, float(O,M) W2, float(P,O) W3) -> (O2, O3) {
      O2(b,o) +=! I(b,m) * W2(o,m)
      O3(b,p) +=! O2(b,o) * W3(p,o)
    }"""
    I, W2, W3 = f32(3, 5), f32(16, 5), f32(4, 16)
    k = _compile(src, "mlp2", I, W2, W3, options=M().scheduleFusionStrategy("Max")
                 .mapToThreads(16).usePrivateMemory(True))
    assert not any(p.tensor == "O2" and p.memory == "private"
                   for p in k.compiled.promoted.promotions)
    O2, O3 = k(I, W2, W3)
    np.testing.assert_allclose(O2, I @ W2.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(O3, I @ W2.T @ W3.T, rtol=1e-4, atol=1e-4)


def test_an_updates_reads_are_told_apart_by_their_own_variable_names():
    """Differential seed 300140: the update `O0(kh, m) +=! ... I0(kh) ... I0(r)` reuses the
    first definition's variables, so Halide's `r` is this statement's kh; both reads were
    named 'I0(r)', one private copy of I0(kh) served the reduction's I0(r) too (wrong values,
    a race). Reference: the sums by hand."""
    src = """def f(float(M) W, int(K, K) E, int(K) I0) -> (O0) {
      O0(r, kh) = E(kh, kh) + I0(r)
      O0(kh, m) +=! I0(kh) ? W(m) : I0(r)
    }"""
    W, E, I0 = np.array([-1.0], np.float32), np.array([[0, 3], [0, 3]], np.int32), \
        np.array([-1, 0], np.int32)
    # O0(kh, 0) = sum over r of (I0(kh) != 0 ? int(W(0)) : I0(r)): row 0 gives -1 + -1, row 1
    # gives I0(0) + I0(1) = -1; O0(kh, 1) keeps E(1, 1) + I0(kh)
    expected = np.array([[-2, 2], [-1, 3]], np.int32)
    k = _compile(src, "f", W, E, I0, options=M().mapToThreads(4, 64).mapToBlocks(2, 1, 8)
                 .usePrivateMemory(True))
    np.testing.assert_array_equal(k(W, E, I0), expected)


# -- register tiling --------------------------------------------------------------------------

TILED_TMM = M().tile(32, 32, 8).mapToThreads(8, 8).mapToBlocks(4, 4).useSharedMemory(True) \
    .usePrivateMemory(True).unroll(16)


def _macro_calls(source: str, name: str) -> list[str]:
    return re.findall(rf"\b{name}\(([^;]*)\);", source.split("const int b0")[1])


def test_register_tiling_keeps_each_thread_sub_tile_in_registers():
    """Each of the 8 x 8 threads owns a 4 x 4 sub-tile of C (rows t1, t1 + 8, ...: a strided
    tile stored densely), accumulated in private memory across all of K and written once; A and
    B come through shared memory 8 columns at a time; and one reduction step updates the
    whole sub-tile (16 unrolled updates with the same k) before the next."""
    A, B = f32(128, 64), f32(96, 64)
    k = _compile(TMM, "tmm", A, B, options=TILED_TMM.useRegisterTiling(True))
    np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)
    by_tensor = {(p.tensor, p.memory): p for p in k.compiled.promoted.promotions}
    c = by_tensor["C", "private"]
    assert (c.sizes, c.strides, c.copy_in, c.copy_out is not None) == ((4, 4), (8, 8), None,
                                                                       True)
    assert by_tensor["A", "shared"].sizes == (32, 8) and by_tensor["B", "shared"].sizes == (32, 8)
    updates = _macro_calls(k.cuda_source, "S1")
    assert len(updates) == 16 and len({u.split(", ")[-1] for u in updates}) == 1
    assert len(_macro_calls(k.cuda_source, "_2out")) == 16  # after the reduction, not in it
    # without it, each thread finishes one output's step before the next: k varies fastest
    plain = _compile(TMM, "tmm", A, B, options=TILED_TMM)
    assert len({u.split(", ")[-1] for u in _macro_calls(plain.cuda_source, "S1")}) > 1
    np.testing.assert_allclose(plain(A, B), A @ B.T, rtol=1e-4, atol=1e-4)


def test_private_depth_above_the_reduction_tile_loop():
    """privateDepth(2) puts the scope between the block loops and the reduction's tile loop
    (the tile band is split there): C is copied out once, after the whole reduction. A depth
    above the block loops stays below them."""
    A, B = f32(64, 32), f32(64, 32)
    for depth in (2, 0):
        k = _compile(TMM, "tmm", A, B, options=TILED_TMM.privateDepth(depth))
        np.testing.assert_allclose(k(A, B), A @ B.T, rtol=1e-4, atol=1e-4)
        [c] = [p for p in k.compiled.promoted.promotions if p.memory == "private"]
        # one copy per value of the two block loops, none per reduction tile
        assert (c.tensor, c.sizes, c.copy_in, c.prefix_dims) == ("C", (4, 4), None, 2)


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc to see the PTX")
def test_register_tiled_tmm_compiles_to_registers_and_reused_shared_loads():
    """What nvcc makes of it (PTX for sm_90): with register tiling the 4 x 4 outputs live in
    registers (no local memory) and each shared-memory load feeds two multiply-adds (4 + 4
    loads, 16 FMAs per step); without it, the outputs spill to local memory and each FMA needs
    more than one shared load."""
    shapes = ((1024, 1024), (1024, 1024))
    options = M().tile(64, 64, 16).mapToThreads(16, 16).mapToBlocks(16, 16) \
        .useSharedMemory(True).usePrivateMemory(True).privateDepth(2).unroll(16)
    counts = {}
    for register in (True, False):
        k = _compile(TMM, "tmm", *shapes, options=options.useRegisterTiling(register))
        code = ptx(k.cuda_source)
        counts[register] = {op: len(re.findall(pattern, code)) for op, pattern in (
            ("shared", r"ld\.shared\.f32"), ("fma", r"fma\.rn\.f32"),
            ("local", r"(ld|st)\.local"))}
    tiled, plain = counts[True], counts[False]
    assert tiled["local"] == 0 and tiled["fma"] >= 2 * tiled["shared"] > 0, counts
    assert plain["local"] > 0 and plain["fma"] < plain["shared"], counts


def test_a_copy_in_waits_for_other_threads_writes_before_the_scope():
    """Differential seed 70057, minimised: T0's identity (-inf) is written by several threads,
    then one thread copies T0 into shared memory for the max=!: without a barrier before the
    copy-in it read elements other threads had not written yet (a race the emulator saw)."""
    source = """def f(float(P, Q, P) Z) -> (O0) {
  O0(i) = Z(i, i, i)
  T0(p, kh) max=! Z(p, p, p + kh)
}"""
    z = np.random.default_rng(0).standard_normal((6, 6, 6)).astype(np.float32)
    options = tc.MappingOptions().tile(0, 4).mapToThreads(4).mapToBlocks(3).unroll(4) \
        .useSharedMemory(True).usePrivateMemory(True).sharedDepth(1).useReadOnlyCache(True) \
        .outerScheduleFusionStrategy("Min")
    kernel = tc.compile(source, "f", z, options=options, target="cuda-emulated")
    assert "shared_T0" in kernel.cuda_source
    np.testing.assert_array_equal(kernel(z), z[np.arange(6), np.arange(6), np.arange(6)])
