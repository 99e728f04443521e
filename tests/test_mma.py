"""The tensor core step of tcstage/cuda/device_lib.py: fragment layouts against PTX's tables, warp
GEMMs under emulation against numpy (float64), and the mma.sync instruction in nvcc's PTX."""

import numpy as np
import pytest

from tcstage.cuda.device_lib import MMA_LIB
from tcstage.cuda.emulate import EmulationError, compile_kernels, emulate
from tcstage.cuda.nvcc import nvcc_path, ptx

import nvcc_batches  # tests/

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
TYPES = {"bf16": BF16, "f16": np.dtype(np.float16)}
RNG = np.random.default_rng(16)

# The PTX ISA's tables for mma.m16n8k16 with .f16/.bf16 operands and .f32 accumulators, written
# out: (row, column) of each element a lane holds, for groupID g = lane // 4 and
# threadID_in_group t = lane % 4. Elements are listed low to high: a0..a7 fill registers a[0]..a[3]
# two at a time, the lower index in the lower 16 bits.


def a_elements(lane):
    g, t = lane // 4, lane % 4
    return [(g + 8 * (0 if i < 2 or 4 <= i < 6 else 1), 2 * t + (i & 1) + (8 if i >= 4 else 0))
            for i in range(8)]


def b_elements(lane):
    g, t = lane // 4, lane % 4
    return [(2 * t + (i & 1) + (8 if i >= 2 else 0), g) for i in range(4)]


def c_elements(lane):
    g, t = lane // 4, lane % 4
    return [(g + (8 if i >= 2 else 0), 2 * t + (i & 1)) for i in range(4)]


def pack(matrix: np.ndarray, elements) -> np.ndarray:
    """A lane's registers: pairs of 16-bit elements, the first in the low half."""
    bits = np.array([matrix[r, c] for r, c in elements]).view(np.uint16).astype(np.uint32)
    return bits[0::2] | (bits[1::2] << 16)


def test_the_tables_cover_each_matrix_once():
    for elements, shape in ((a_elements, (16, 16)), (b_elements, (16, 8)), (c_elements, (16, 8))):
        seen = [rc for lane in range(32) for rc in elements(lane)]
        assert sorted(seen) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    # a few entries spelled out: lane 5 is group 1, thread 1
    assert a_elements(5)[:2] == [(1, 2), (1, 3)] and a_elements(5)[6] == (9, 10)
    assert b_elements(5) == [(2, 1), (3, 1), (10, 1), (11, 1)]
    assert c_elements(31) == [(7, 6), (7, 7), (15, 6), (15, 7)]


def kernels(body: str) -> str:
    """`body` once per element type: T is the type, K the kernel's suffix."""
    return MMA_LIB + "".join(body.replace("KIND", k).replace("ELEM", t)
                             for k, t in (("bf16", "__nv_bfloat16"), ("f16", "half")))


RAW = kernels(r"""
// Each lane's fragments straight from the arrays (lane-major), one mma, D out the same way;
// and what the load helpers make of 16 x 16 and 16 x 8 tiles, and where C's elements lie.
__global__ void raw_KIND(float* d, const unsigned* a, const unsigned* b, const float* c,
                         unsigned* loaded_a, unsigned* loaded_b, int* c_rows, int* c_cols,
                         const ELEM* tile_a, const ELEM* tile_b) {
  int lane = threadIdx.x;
  unsigned fa[4], fb[2];
  float fc[4], fd[4];
  for (int i = 0; i < 4; ++i) { fa[i] = a[4 * lane + i]; fc[i] = c[4 * lane + i]; }
  for (int i = 0; i < 2; ++i) fb[i] = b[2 * lane + i];
  tc::mma_m16n8k16<ELEM>(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) d[4 * lane + i] = fd[i];
  tc::mma_load_a(fa, tile_a, 16, false);
  tc::mma_load_b(fb, tile_b, 8, false);
  for (int i = 0; i < 4; ++i) {
    loaded_a[4 * lane + i] = fa[i];
    c_rows[4 * lane + i] = tc::mma_row_c(i);
    c_cols[4 * lane + i] = tc::mma_col_c(i);
  }
  for (int i = 0; i < 2; ++i) loaded_b[2 * lane + i] = fb[i];
}
""")


@pytest.mark.parametrize("shuffles", [False, True], ids=["collective", "shuffles"])
@pytest.mark.parametrize("kind", list(TYPES))
def test_fragment_layout(kind, shuffles):
    """Elements go to the lanes PTX's tables name: the load helpers' registers are compared with
    registers packed by the tables, and an mma fed registers packed by the tables must give each
    lane the D elements the tables name. `shuffles`: the sm_75 path (TC_MMA_SHUFFLES)."""
    dtype = TYPES[kind]
    # Distinct small integers (exact in bf16 below 256) say where each element came from.
    tile_a = np.arange(256, dtype=np.float32).reshape(16, 16).astype(dtype)
    tile_b = (np.arange(128, dtype=np.float32).reshape(16, 8) - 128).astype(dtype)
    a = RNG.uniform(-1, 1, (16, 16)).astype(dtype)
    b = RNG.uniform(-1, 1, (16, 8)).astype(dtype)
    c = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    regs_a = np.stack([pack(a, a_elements(lane)) for lane in range(32)])
    regs_b = np.stack([pack(b, b_elements(lane)) for lane in range(32)])
    regs_c = np.stack([[c[r, col] for r, col in c_elements(lane)] for lane in range(32)])
    d = np.zeros((32, 4), np.float32)
    loaded_a, loaded_b = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32)
    c_rows, c_cols = np.zeros((32, 4), np.int32), np.zeros((32, 4), np.int32)
    k = compile_kernels(RAW, defines=["TC_MMA_SHUFFLES"] if shuffles else [])[f"raw_{kind}"]
    k(1, 32, [d, regs_a, regs_b, regs_c.astype(np.float32), loaded_a, loaded_b, c_rows, c_cols,
              tile_a, tile_b])
    np.testing.assert_array_equal(loaded_a, np.stack([pack(tile_a, a_elements(n))
                                                      for n in range(32)]))
    np.testing.assert_array_equal(loaded_b, np.stack([pack(tile_b, b_elements(n))
                                                      for n in range(32)]))
    np.testing.assert_array_equal(np.stack([c_rows, c_cols], -1),
                                  [c_elements(n) for n in range(32)])
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    got = np.zeros((16, 8))
    for lane in range(32):
        for i, (r, col) in enumerate(c_elements(lane)):
            got[r, col] = d[lane, i]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


GEMM = kernels(r"""
// D (M x N) = A B + C in one block, M, N <= 32 and K <= 32 multiples of 16, 16 and 8: warp w
// owns D's 16 x 8 tile (w / (N / 8), w % (N / 8)); A and B are staged through shared memory.
// a_km: A is stored [k][m]; b_nk: B is stored [n][k]; c_nm: C is given transposed; D is
// written both ways.
__global__ void gemm_KIND(float* D, float* Dt, const ELEM* A, const ELEM* B, const float* C,
                          int M, int N, int K, int a_km, int b_nk, int c_nm) {
  __shared__ ELEM As[32 * 32];
  __shared__ ELEM Bs[32 * 32];
  int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  for (int e = tid; e < M * K; e += nthreads) As[e] = A[e];
  for (int e = tid; e < K * N; e += nthreads) Bs[e] = B[e];
  __syncthreads();
  int warp = tid / 32, wm = warp / (N / 8), wn = warp % (N / 8);
  float acc[4];
  if (c_nm) tc::mma_load_c(acc, C + wn * 8 * M + wm * 16, M, true);
  else tc::mma_load_c(acc, C + wm * 16 * N + wn * 8, N, false);
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned a[4], b[2];
    if (a_km) tc::mma_load_a(a, As + k0 * M + wm * 16, M, true);
    else tc::mma_load_a(a, As + wm * 16 * K + k0, K, false);
    if (b_nk) tc::mma_load_b(b, Bs + wn * 8 * K + k0, K, true);
    else tc::mma_load_b(b, Bs + k0 * N + wn * 8, N, false);
    tc::mma_m16n8k16<ELEM>(acc, a, b, acc);
  }
  tc::mma_store_d(D + wm * 16 * N + wn * 8, N, false, acc);
  tc::mma_store_d(Dt + wn * 8 * M + wm * 16, M, true, acc);
}
""")


@pytest.mark.parametrize("layouts", [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, 0)],
                         ids=["mk-kn", "km-kn", "mk-nk", "km-nk"])
@pytest.mark.parametrize("shape", [(32, 16, 32), (16, 32, 16), (32, 8, 16)])
@pytest.mark.parametrize("kind", list(TYPES))
def test_warp_gemm(kind, shape, layouts):
    """2 to 4 warps, each D = A B + C over its tile through the load helpers. The tolerance:
    float32 sums of K exact products."""
    dtype = TYPES[kind]
    (m, n, k), (a_km, b_nk, c_nm) = shape, layouts
    a = RNG.uniform(-2, 2, (m, k)).astype(dtype)
    b = RNG.uniform(-2, 2, (k, n)).astype(dtype)
    c = RNG.uniform(-2, 2, (m, n)).astype(np.float32)
    d, dt = np.zeros((m, n), np.float32), np.zeros((n, m), np.float32)
    warps = m // 16 * (n // 8)
    emulate(GEMM, f"gemm_{kind}", 1, (32, warps),
            [d, dt, np.ascontiguousarray(a.T if a_km else a),
             np.ascontiguousarray(b.T if b_nk else b), np.ascontiguousarray(c.T if c_nm else c),
             m, n, k, a_km, b_nk, c_nm], schedules=("forward", "reverse", "shuffle"))
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    tolerance = k * 2.0 ** -23 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
                                  + np.abs(c))
    assert np.all(np.abs(d - want) <= tolerance)
    np.testing.assert_array_equal(dt, d.T)


def test_shuffle_path_adds_in_the_emulators_order():
    """The sm_75 path (shuffles) and the emulator's collective read the fragments each its own
    way and add in the same order: they agree bit for bit."""
    m, n, k = 32, 16, 32
    a = RNG.standard_normal((m, k)).astype(BF16)
    b = RNG.standard_normal((k, n)).astype(BF16)
    c = RNG.standard_normal((m, n)).astype(np.float32)
    results = []
    for defines in ([], ["TC_MMA_SHUFFLES"]):
        d, dt = np.zeros((m, n), np.float32), np.zeros((n, m), np.float32)
        compile_kernels(GEMM, defines=defines)["gemm_bf16"](
            1, (32, 4), [d, dt, a, b, c, m, n, k, 0, 0, 0])
        results.append(d)
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("block,diverge,message", [
    (48, "", r"mask 0xffffffff names lanes past the block's 48 threads"),
    (64, "if (threadIdx.x % 32 >= 16) { __syncthreads(); return; }",
     r"divergent warp collective.*mma\.sync\.m16n8k16 \(bf16\).*lane 16 of its warp.*"
     r"__syncthreads\(\)"),
    (32, "if (threadIdx.x == 7) return;", r"waits for a thread that has returned.*names lane 7"),
])
def test_mma_needs_the_whole_warp(block, diverge, message):
    src = MMA_LIB + r"""
__global__ void partial(float* d) {
  DIVERGE
  unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  tc::mma_m16n8k16<__nv_bfloat16>(c, a, b, c);
  d[threadIdx.x] = c[0];
}
""".replace("DIVERGE", diverge)
    with pytest.raises(EmulationError, match=rf"kernel 'partial'(?s:.*){message}"):
        emulate(src, "partial", 1, block, [np.zeros(block, np.float32)])


# --- nvcc ---------------------------------------------------------------------------------------

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
MMA_F32 = "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32"


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptx_has_the_mma_instructions(arch):
    text = ptx(GEMM, arch=arch)
    for kind in TYPES:
        assert MMA_F32.format(kind) in text
    assert "shfl.sync" not in text


@needs_nvcc
def test_older_gpus_get_shuffles():
    """CUDA 13's oldest target, sm_75, has no bf16 mma.sync; the library falls back to
    shuffles there, so generated kernels still compile."""
    text = ptx(GEMM, arch="sm_75")
    assert "mma.sync" not in text and "shfl.sync" in text


@needs_nvcc
def test_kernels_compile_with_nvcc():
    rejected = nvcc_batches.check_all([RAW, GEMM])
    assert rejected == {}, rejected
