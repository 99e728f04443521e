"""The CPU emulator for CUDA kernels: semantics, race and divergence detection, argument checks."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tcstage as tc

from tcstage.cuda import emulate as emu
from tcstage.cuda.emulate import (EmulationError, EmulationRaceError, compile_kernels, emulate,
                                  parse_kernels)
from tcstage.cuda.nvcc import compile_check, nvcc_path
from tcstage.errors import TCError

import nvcc_batches  # tests/


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tcstage-cache")


@pytest.fixture(autouse=True)
def private_cache(_private_tuning_cache, module_cache, monkeypatch):
    """Compiled kernels go to a fresh cache of this module's (not the session's shared one),
    so the tests exercise compiling and caching."""
    monkeypatch.setattr(emu, "cache_dir", getattr(emu.cache_dir, "original", emu.cache_dir))
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(module_cache))


RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


VADD = r"""
__global__ void vadd(float* __restrict__ c, const float* __restrict__ a, const float* __restrict__ b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
"""

MATMUL = r"""
#define TILE 16
// C = A B, A is M x K, B is K x N, all row-major.
__global__ void __launch_bounds__(256) matmul(float* __restrict__ C, const float* __restrict__ A,
                                              const float* __restrict__ B, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ka = t * TILE + tx, kb = t * TILE + ty;
    As[ty][tx] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
    Bs[ty][tx] = (kb < K && col < N) ? B[kb * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}
"""

# The same without the barrier after the compute step: a fast thread overwrites the tile while
# others still read it.
MATMUL_NO_SECOND_BARRIER = MATMUL.replace(
    "acc += As[ty][k] * Bs[k][tx];\n    __syncthreads();", "acc += As[ty][k] * Bs[k][tx];")

REDUCE = r"""
__global__ void block_sum(float* __restrict__ out, const float* __restrict__ in, int n) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  unsigned i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0.0f;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}
"""

IDS = r"""
__global__ void ids(int* __restrict__ out) {
  int gx = blockIdx.x * blockDim.x + threadIdx.x;
  int gy = blockIdx.y * blockDim.y + threadIdx.y;
  int gz = blockIdx.z * blockDim.z + threadIdx.z;
  int W = gridDim.x * blockDim.x, H = gridDim.y * blockDim.y;
  int* o = out + 4 * ((gz * H + gy) * W + gx);
  o[0] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z;
  o[1] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z;
  o[2] = blockDim.x + 10 * blockDim.y + 100 * blockDim.z;
  o[3] = gridDim.x + 10 * gridDim.y + 100 * gridDim.z;
}
"""

RACY = r"""
__global__ void last_writer(int* out) {
  out[0] = threadIdx.x;
}
"""

SHIFT = r"""
__global__ void shift(float* __restrict__ out, const float* __restrict__ in) {
  __shared__ float s[64];
  int t = threadIdx.x;
  s[t] = in[blockIdx.x * 64 + t];
  BARRIER
  out[blockIdx.x * 64 + t] = s[(t + 1) % 64];
}
"""
SHIFT_OK = SHIFT.replace("BARRIER", "__syncthreads();")
SHIFT_RACY = SHIFT.replace("BARRIER", "// no __syncthreads() here")

DIVERGENT = r"""
__global__ void divergent(float* out) {
  out[threadIdx.x] = 1.0f;
  if (threadIdx.x < 5) __syncthreads();
  out[threadIdx.x] += 1.0f;
}
"""

TWO_BARRIERS = r"""
__global__ void two_barriers(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}
"""

MATH = r"""
__device__ __forceinline__ float relu(float x) { return fmaxf(x, 0.0f); }

__global__ void math(float* __restrict__ out, const float* __restrict__ x, int* __restrict__ iout,
                     const int* __restrict__ ix, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = __ldg(&x[i]);
  float* o = out + 16 * i;
  o[0] = expf(v);  o[1] = logf(fabsf(v) + 1.0f);  o[2] = sqrtf(fabsf(v));
  o[3] = rsqrtf(fabsf(v) + 1.0f);  o[4] = tanhf(v);  o[5] = relu(v);
  o[6] = fminf(v, 0.5f);  o[7] = floorf(v);  o[8] = ceilf(v);
  o[9] = powf(fabsf(v), 1.5f);  o[10] = sinf(v);  o[11] = cosf(v);
  o[12] = max(v, -0.25f);  o[13] = min(v, 0.25f);  o[14] = __expf(v);  o[15] = exp(v);
  int k = ix[i];
  iout[2 * i] = max(k, 3);
  iout[2 * i + 1] = min(k, -3);
}
"""

TMM = r"""
__global__ void tmm_256_32_128(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B) {
  int b0 = blockIdx.y, b1 = blockIdx.x;
  int t1 = threadIdx.x;
  __shared__ float shared_A[4][33];
  __shared__ float shared_B[32][33];
  float private_C[4][1];
  for (int c2 = 0; c2 <= 3; c2 += 1) for (int k = 0; k < 32; k += 1) if (t1 == 0) shared_A[c2][k] = A[(4 * b0 + c2) * 32 + k];
  for (int c2 = 0; c2 <= 31; c2 += 1) shared_B[c2][t1] = B[(32 * b1 + c2) * 32 + t1];
  __syncthreads();
  for (int c2 = 0; c2 <= 3; c2 += 1) {
    private_C[c2][0] = 0.0f;
    for (int c4 = 0; c4 <= 31; c4 += 1)
      private_C[c2][0] = private_C[c2][0] + shared_A[c2][c4] * shared_B[t1][c4];
  }
  __syncthreads();
  for (int c2 = 0; c2 <= 3; c2 += 1) C[(4 * b0 + c2) * 256 + (32 * b1 + t1)] = private_C[c2][0];
}
"""

ATOMIC_SUM = r"""
__global__ void atomic_sum(float* __restrict__ total, int* __restrict__ count, const float* __restrict__ x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { atomicAdd(total, x[i]); atomicAdd(count, 1); }
}
"""

TYPES = r"""
#include <cstdint>
__global__ void types(double* __restrict__ d, int64_t* __restrict__ l, unsigned char* __restrict__ u,
                      bool* __restrict__ flags, double scale, int64_t offset, unsigned int mask) {
  int i = threadIdx.x;
  d[i] = d[i] * scale;
  l[i] = l[i] + offset;
  u[i] = (unsigned char)(u[i] & mask);
  flags[i] = d[i] > 0.0;
}
"""

CHECKS = r"""
#include <cassert>
__global__ void checks(int* out, int mode) {
  out[threadIdx.x] = threadIdx.x;
  if (mode == 1 && threadIdx.x == 3) __trap();
  if (mode == 2) assert(threadIdx.x < 7);
}
"""

BIG_LOCALS = r"""
__global__ void big_locals(float* out, int n) {
  float scratch[40000];  // 160 KB per thread: more than the default fiber stack
  for (int i = 0; i < n; ++i) scratch[i] = i * 0.5f + threadIdx.x;
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += scratch[n - 1 - i];
  out[threadIdx.x] = s;
}
"""

HALF = r"""
#include <cuda_fp16.h>
__global__ void scale_half(half* __restrict__ out, const half* __restrict__ in, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half(__half2float(in[i]) * s);
}
"""

FAULTS = r"""
__device__ int deep(int n) {
  volatile char frame[512];
  frame[0] = (char)n;
  return n > 1000000 ? 0 : deep(n + 1) + frame[0];
}

__global__ void faults(int* out, long long offset, int divisor, int mode) {
  int t = threadIdx.x;
  if (mode == 0) out[t + offset] = 1;
  if (mode == 1) out[t] = 100 / (divisor - t);
  if (mode == 2) out[t] = deep(t);
}
"""

# Valid CUDA, every one; nvcc must accept them all.
ALL_KERNELS = {
    "vadd": VADD, "matmul": MATMUL, "matmul_racy": MATMUL_NO_SECOND_BARRIER, "reduce": REDUCE,
    "ids": IDS, "racy": RACY, "shift_ok": SHIFT_OK, "shift_racy": SHIFT_RACY,
    "divergent": DIVERGENT, "two_barriers": TWO_BARRIERS, "math": MATH, "tmm": TMM,
    "atomic_sum": ATOMIC_SUM, "types": TYPES, "checks": CHECKS, "big_locals": BIG_LOCALS,
    "half": HALF, "faults": FAULTS,
}


# --- semantics ---------------------------------------------------------------------------------


def test_vector_add_with_ragged_grid():
    n = 1000
    a, b = rand(n), rand(n)
    c = np.full(n + 5, -7.0, np.float32)[:n]  # a view: the kernel writes it in place
    emulate(VADD, "vadd", (4, 1, 1), (256, 1, 1), [c, a, b, n])
    np.testing.assert_array_equal(c, a + b)
    # 3 blocks of 333 threads cover 999 elements: the last is untouched.
    c2 = np.zeros(n, np.float32)
    emulate(VADD, "vadd", (3, 1, 1), (333, 1, 1), [c2, a, b, n])
    np.testing.assert_array_equal(c2[:999], (a + b)[:999])
    assert c2[999] == 0


# GCC 12.2 at -O1 compiled this kernel right but its launcher to a bare `ret`: after ivopts, one
# address is based on -f1, which GCC's late pure/const and modref analyses took for a NULL
# dereference ("terminating BB"), so the store was never seen and the call was deleted as pure.
# Reduced from Halide fuzz seed 950132, where one of four launches silently did nothing.
STRIDED_DIFFERENCE = r"""#include <cstdint>
extern "C" __global__ void strided_difference(const uint8_t* f1, int16_t* f2) {
  for (int c0 = 0; c0 <= 16; c0 += 1)
    for (int c1 = 0; c1 <= 6; c1 += 1)
      f2[c1 * 17 + c0] = f1[(c1 + 4) * 20 + c0 + 2] - f1[(c1 + 1) * 40 + c0 + 2];
}
"""


def test_a_kernel_the_host_compiler_took_for_pure_still_runs():
    f1 = np.arange(400, dtype=np.uint8)
    f2 = np.full(7 * 17, 77, np.int16)
    emulate(STRIDED_DIFFERENCE, "strided_difference", (1, 1, 1), (1, 1, 1), [f1, f2])
    c1, c0 = np.meshgrid(np.arange(7), np.arange(17), indexing="ij")
    expected = (f1[(c1 + 4) * 20 + c0 + 2].astype(np.int16)
                - f1[(c1 + 1) * 40 + c0 + 2].astype(np.int16))
    np.testing.assert_array_equal(f2.reshape(7, 17), expected)


@pytest.mark.parametrize("m,k,n", [(37, 45, 50), (16, 16, 16), (5, 70, 3)])
def test_tiled_matmul(m, k, n):
    A, B = rand(m, k), rand(k, n)
    C = np.zeros((m, n), np.float32)
    emulate(MATMUL, "matmul", ((n + 15) // 16, (m + 15) // 16, 1), (16, 16, 1), [C, A, B, m, n, k])
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)


def test_block_reduction():
    n = 1000
    x = rand(n)
    blocks = (n + 255) // 256
    out = np.zeros(blocks, np.float32)
    emulate(REDUCE, "block_sum", (blocks, 1, 1), (256, 1, 1), [out, x, n])
    expected = np.add.reduceat(x.astype(np.float64), np.arange(0, n, 256))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_block_reduction_with_ucontext_fibers():
    """The portable fiber switch (swapcontext) behaves like the x86-64 one."""
    n = 600
    x = rand(n)
    out = np.zeros(3, np.float32)
    kernel = compile_kernels(REDUCE, defines=["TCEMU_USE_UCONTEXT"])["block_sum"]
    kernel((3, 1, 1), (256, 1, 1), [out, x, n], schedules=("forward", "reverse", "shuffle"))
    expected = np.add.reduceat(x.astype(np.float64), np.arange(0, n, 256))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("grid,block", [((3, 2, 1), (4, 5, 1)), ((2, 3, 2), (3, 2, 4))])
def test_multidimensional_indices(grid, block):
    W, H, D = (g * b for g, b in zip(grid, block))
    out = np.full((D, H, W, 4), -1, np.int32)
    emulate(IDS, "ids", grid, block, [out])
    z, y, x = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    (bx, tx), (by, ty), (bz, tz) = (divmod(v, b) for v, b in zip((x, y, z), block))
    np.testing.assert_array_equal(out[..., 0], bx + 10 * by + 100 * bz)
    np.testing.assert_array_equal(out[..., 1], tx + 10 * ty + 100 * tz)
    assert (out[..., 2] == block[0] + 10 * block[1] + 100 * block[2]).all()
    assert (out[..., 3] == grid[0] + 10 * grid[1] + 100 * grid[2]).all()


def test_paper_tmm_kernel():
    M, K, N = 128, 32, 256
    A, B = rand(M, K), rand(N, K)
    C = np.zeros((M, N), np.float32)
    emulate(TMM, "tmm_256_32_128", (N // 32, M // 4, 1), (32, 1, 1), [C, A, B])
    np.testing.assert_allclose(C, A @ B.T, rtol=1e-4, atol=1e-4)


def test_math_functions():
    n = 50
    x = rand(n) * 2
    ix = RNG.integers(-10, 10, n).astype(np.int32)
    out = np.zeros((n, 16), np.float32)
    iout = np.zeros((n, 2), np.int32)
    emulate(MATH, "math", (2, 1, 1), (32, 1, 1), [out, x, iout, ix, n])
    ax = np.abs(x)
    expected = [np.exp(x), np.log(ax + 1), np.sqrt(ax), 1 / np.sqrt(ax + 1), np.tanh(x),
                np.maximum(x, 0), np.minimum(x, 0.5), np.floor(x), np.ceil(x), ax ** 1.5,
                np.sin(x), np.cos(x), np.maximum(x, -0.25), np.minimum(x, 0.25), np.exp(x),
                np.exp(x)]
    np.testing.assert_allclose(out, np.stack(expected, axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(iout, np.stack([np.maximum(ix, 3), np.minimum(ix, -3)], axis=1))


def test_float_atomics_are_not_reported_as_races():
    n = 5000
    x = rand(n)
    total, count = np.zeros(1, np.float32), np.zeros(1, np.int32)
    emulate(ATOMIC_SUM, "atomic_sum", (20, 1, 1), (256, 1, 1), [total, count, x, n])
    assert count[0] == n
    np.testing.assert_allclose(total[0], x.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


def test_parameter_types_and_scalars():
    d, l = rand(8, dtype=np.float64), np.arange(8, dtype=np.int64)
    u, flags = np.arange(250, 258, dtype=np.int64).astype(np.uint8), np.zeros(8, bool)
    d0, l0, u0 = d.copy(), l.copy(), u.copy()
    emulate(TYPES, "types", 1, 8, [d, l, u, flags, 2.5, np.int64(2**40), 0x0F])
    np.testing.assert_array_equal(d, d0 * 2.5)
    np.testing.assert_array_equal(l, l0 + 2**40)
    np.testing.assert_array_equal(u, u0 & 0x0F)
    np.testing.assert_array_equal(flags, d > 0)


def test_stack_grows_for_large_thread_local_arrays():
    kernel = compile_kernels(BIG_LOCALS)["big_locals"]
    assert kernel.stack_size > 160_000
    n = 40000
    out = np.zeros(64, np.float32)
    kernel(1, 64, [out, n])
    expected = (np.arange(n, dtype=np.float64) * 0.5).sum() + n * np.arange(64)
    np.testing.assert_allclose(out, expected, rtol=1e-3)  # float32 sums of 40000 terms


def test_half_arrays():
    x = rand(100).astype(np.float16)
    out = np.zeros(100, np.float16)
    emulate(HALF, "scale_half", 4, 32, [out, x, 3.0, 100])
    np.testing.assert_array_equal(out, (x.astype(np.float32) * 3).astype(np.float16))


def test_in_place_argument_aliasing():
    n = 100
    a, b = rand(n), rand(n)
    expected = a + b
    emulate(VADD, "vadd", 1, 128, [a, a, b, n])  # c and a are one array
    np.testing.assert_array_equal(a, expected)
    with pytest.raises(TCError, match="overlap"):
        emulate(VADD, "vadd", 1, 128, [a[1:], a[:-1], b[:-1], n - 1])


def test_out_of_bounds_writes_are_reported():
    unchecked = VADD.replace("if (i < n) ", "")
    c, a, b = np.zeros(100, np.float32), rand(100), rand(100)
    message = r"out of bounds of argument 'c' \(100 elements\): at flat indices 100 to 127"
    with pytest.raises(EmulationError, match=message):
        emulate(unchecked, "vadd", 1, 128, [c, a, b, 100])
    assert (c == 0).all()


@pytest.mark.parametrize("ucontext", [False, True])
def test_faults_end_the_launch_with_an_error(ucontext):
    kernel = compile_kernels(FAULTS, defines=["TCEMU_USE_UCONTEXT"] if ucontext else [])["faults"]
    out = np.zeros(8, np.int32)
    with pytest.raises(EmulationError, match=r"invalid memory access at 0x\w+ in block \(0,0,0\)"):
        kernel(1, 8, [out, 1 << 40, 1, 0])
    with pytest.raises(EmulationError, match=r"integer division by zero.*thread \(5,0,0\)"):
        kernel(1, 8, [out, 0, 5, 1])
    with pytest.raises(EmulationError, match=r"stack overflow in block \(0,0,0\), thread \(0,"):
        kernel(1, 8, [out, 0, 5, 2])
    kernel(1, 8, [out, 0, 100, 1])  # the emulator carries on after a fault
    np.testing.assert_array_equal(out, 100 // (100 - np.arange(8)))


def test_launches_from_several_python_threads():
    from concurrent.futures import ThreadPoolExecutor
    kernel = compile_kernels(REDUCE)["block_sum"]
    inputs = [rand(2000) for _ in range(6)]

    def run(x):
        out = np.zeros(8, np.float32)
        kernel(8, 256, [out, x, x.size])
        return out
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, inputs))
    for x, out in zip(inputs, results):
        expected = np.add.reduceat(x.astype(np.float64), np.arange(0, 2000, 256))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_without_race_check_runs_in_place():
    out = np.zeros(1, np.int32)
    emulate(RACY, "last_writer", 1, 32, [out], check_races=False)
    assert out[0] == 31  # forward order: the last thread writes last


def test_compiled_kernels_are_cached_on_disk(monkeypatch):
    compile_kernels(VADD)
    cached = [f for f in os.listdir(emu.cache_dir()) if f.endswith(".so")]
    assert cached
    emu._libraries.clear()  # as in a new process: the .so comes from the disk cache

    def no_compiler(*args, **kwargs):
        raise AssertionError("recompiled a cached kernel")
    monkeypatch.setattr(subprocess, "run", no_compiler)
    monkeypatch.setattr(emu, "_compiler_version", lambda cxx: emu._versions[cxx])
    c, a, b = np.zeros(10, np.float32), rand(10), rand(10)
    emulate(VADD, "vadd", 1, 16, [c, a, b, 10])
    np.testing.assert_array_equal(c, a + b)


def test_runtime_header_is_precompiled_once_and_a_damaged_one_is_done_without(monkeypatch,
                                                                             tmp_path):
    if "clang" in emu._compiler_version(emu._compiler()):
        pytest.skip("the precompiled header is GCC's")
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(emu, "_libraries", {})
    monkeypatch.setattr(emu, "_pch_ready", {})
    compile_kernels(VADD)
    (pch,) = [d for d in os.listdir(emu.cache_dir()) if d.startswith("pch-")]
    gch = os.path.join(emu.cache_dir(), pch, "emu_runtime.h.gch")
    assert os.path.getsize(gch) > 1 << 20
    # A truncated .gch (a full disk, a killed writer) makes GCC fail: the kernel is compiled
    # without it, and the damaged file is removed.
    with open(gch, "r+b") as f:
        f.truncate(100_000)
    c, a, b = np.zeros(10, np.float32), rand(10), rand(10)
    emulate(VADD.replace("c[i] = a[i] + b[i]", "c[i] = b[i] + a[i]"), "vadd", 1, 16,
            [c, a, b, 10])
    np.testing.assert_array_equal(c, a + b)
    assert not os.path.exists(gch)


def test_parse_kernels():
    sig = parse_kernels(MATMUL + TMM)
    assert set(sig) == {"matmul", "tmm_256_32_128"}
    params = sig["matmul"].params
    assert [p.name for p in params] == ["C", "A", "B", "M", "N", "K"]
    assert [(p.pointer, p.const, str(p.dtype)) for p in params[:4]] == [
        (True, False, "float32"), (True, True, "float32"), (True, True, "float32"),
        (False, False, "int32")]
    assert "not support" in parse_kernels("__global__ void k(float** p) {}")["k"].unsupported


# --- races, divergence, traps ------------------------------------------------------------------


def test_racy_kernel_names_the_argument():
    out = np.zeros(1, np.int32)
    with pytest.raises(EmulationRaceError, match=r"argument 'out' differs at flat index 0") as e:
        emulate(RACY, "last_writer", 1, 32, [out])
    assert "data race" in str(e.value) and isinstance(e.value, TCError)
    assert out[0] == 0  # the caller's array is left alone


def test_missing_barrier_is_a_race():
    x = rand(3 * 64)
    out = np.zeros(3 * 64, np.float32)
    emulate(SHIFT_OK, "shift", 3, 64, [out, x])
    np.testing.assert_array_equal(out.reshape(3, 64), np.roll(x.reshape(3, 64), -1, axis=1))
    with pytest.raises(EmulationRaceError, match="'out'.*__syncthreads"):
        emulate(SHIFT_RACY, "shift", 3, 64, [np.zeros(3 * 64, np.float32), x])


def test_missing_trailing_barrier_in_tiled_matmul_is_a_race():
    m, k, n = 20, 40, 20
    A, B, C = rand(m, k), rand(k, n), np.zeros((m, n), np.float32)
    with pytest.raises(EmulationRaceError, match="'C'"):
        emulate(MATMUL_NO_SECOND_BARRIER, "matmul", (2, 2, 1), (16, 16, 1), [C, A, B, m, n, k])


def test_divergent_barrier():
    with pytest.raises(TCError, match=r"divergent __syncthreads in block \(1,0,0\)"):
        emulate(DIVERGENT, "divergent", 2, 32, [np.zeros(32, np.float32)], schedules=("reverse",))
    with pytest.raises(EmulationError, match=r"divergent __syncthreads in block \(0,0,0\).*line 4"):
        emulate(DIVERGENT, "divergent", 1, 32, [np.zeros(32, np.float32)])


def test_barriers_at_different_sites_are_divergent():
    with pytest.raises(EmulationError, match=r"divergent __syncthreads.*line 4.*line 6"):
        emulate(TWO_BARRIERS, "two_barriers", 1, 8, [np.zeros(8, np.float32)])


def test_trap_and_assert_end_the_launch():
    out = np.zeros(8, np.int32)
    emulate(CHECKS, "checks", 1, 8, [out, 0])
    np.testing.assert_array_equal(out, np.arange(8))
    with pytest.raises(EmulationError, match=r"__trap\(\) in block \(0,0,0\), thread \(3,0,0\)"):
        emulate(CHECKS, "checks", 1, 8, [out, 1])
    with pytest.raises(EmulationError, match=r"assertion 'threadIdx.x < 7' failed.*\(7,0,0\)"):
        emulate(CHECKS, "checks", 1, 8, [out, 2])


# --- errors -------------------------------------------------------------------------------------


def test_argument_dtype_mismatch_names_the_parameter():
    n = 10
    c, b = np.zeros(n, np.float32), rand(n)
    with pytest.raises(TCError, match=r"parameter 'a' .*float32.*float64"):
        emulate(VADD, "vadd", 1, 16, [c, rand(n, dtype=np.float64), b, n])
    with pytest.raises(TCError, match=r"parameter 'n' .*int32 scalar"):
        emulate(VADD, "vadd", 1, 16, [c, b, b, 10.0])
    with pytest.raises(TCError, match=r"parameter 'n' .*cannot hold"):
        emulate(VADD, "vadd", 1, 16, [c, b, b, 2**31])
    with pytest.raises(TCError, match=r"parameter 'c' .*numpy array"):
        emulate(VADD, "vadd", 1, 16, [3, b, b, n])
    with pytest.raises(TCError, match=r"parameter 'c' .*C-contiguous"):
        emulate(VADD, "vadd", 1, 16, [np.zeros(2 * n, np.float32)[::2], b, b, n])
    with pytest.raises(TCError, match="takes 4 arguments"):
        emulate(VADD, "vadd", 1, 16, [c, b, b])


def test_bad_launches_and_unknown_kernels():
    c = np.zeros(4, np.float32)
    with pytest.raises(TCError, match="at most 1024"):
        emulate(VADD, "vadd", 1, (32, 33, 1), [c, c, c, 4])
    with pytest.raises(TCError, match="found: vadd"):
        emulate(VADD, "vector_add", 1, 1, [c, c, c, 4])
    with pytest.raises(TCError, match="dynamic shared memory"):
        dynamic = "extern __shared__ float s[];\n__global__ void k(float* x) { x[0] = s[0]; }"
        emulate(dynamic, "k", 1, 1, [c])


def test_compile_error_carries_the_compiler_message():
    bad = VADD.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + undefined_thing;")
    with pytest.raises(TCError, match=r"(?s)could not compile.*kernel\.cu:4.*undefined_thing"):
        emulate(bad, "vadd", 1, 16, [np.zeros(4, np.float32)] * 3 + [4])


# --- nvcc ---------------------------------------------------------------------------------------


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_kernels_compile_with_nvcc():
    """All in a few nvcc calls (tests/nvcc_batches.py); a rejected kernel is named with its
    diagnostics."""
    rejected = nvcc_batches.check_all(list(ALL_KERNELS.values()))
    assert rejected == {}, [(n, rejected[k]) for n, k in ALL_KERNELS.items() if k in rejected]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_nvcc_reports_errors():
    with pytest.raises(TCError, match=r"(?s)nvcc rejected.*kernel\.cu.*undefined_thing"):
        compile_check(VADD.replace("b[i];", "undefined_thing;"))


def test_compile_check_without_nvcc(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert compile_check(VADD + "// not checked") is False


def test_the_kernel_cache_lives_under_tcstage_cache_dir(monkeypatch, tmp_path):
    """$TCSTAGE_CACHE_DIR/emu, beside the tuning cache (XDG_CACHE_HOME is the fallback)."""
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert emu.cache_dir() == str(tmp_path / "mine" / "emu")
    monkeypatch.delenv("TCSTAGE_CACHE_DIR")
    assert emu.cache_dir() == str(tmp_path / "xdg" / "tcstage" / "emu")


def _cached_library(source: str) -> str:
    """The cache's library for `source`, built by another process (this one must not map a
    file the test then damages: truncating a mapped library is a SIGBUS here)."""
    before = set(os.listdir(emu.cache_dir())) if os.path.isdir(emu.cache_dir()) else set()
    subprocess.run([sys.executable, "-c", "import sys; from tcstage.cuda.emulate import "
                    "compile_kernels; compile_kernels(sys.stdin.read())"],
                   input=source, text=True, check=True, env=dict(os.environ))
    (name,) = [f for f in set(os.listdir(emu.cache_dir())) - before if f.endswith(".so")]
    return os.path.join(emu.cache_dir(), name)


@pytest.mark.parametrize("damage", ["empty", "half", "planted", "no digest"])
def test_a_damaged_or_foreign_cached_kernel_is_rebuilt_with_a_warning(monkeypatch, tmp_path,
                                                                      damage):
    """A cached library is loaded only where its bytes match the digest recorded when it was
    built: a zero-byte or half-written file (a full disk, a killed copy: loading it gave a
    raw OSError or SIGBUS) or another library under its name (whose constructor would run) is
    removed, with a TCWarning, and the kernel is built again."""
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(emu, "_libraries", {})
    source = VADD.replace("c[i] = a[i] + b[i]", f"c[i] = a[i] + b[i] + 0 * {len(damage)}")
    path = _cached_library(source)
    size = os.path.getsize(path)
    if damage == "empty":
        open(path, "wb").close()
    elif damage == "half":
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif damage == "planted":
        other = _cached_library(VADD.replace("a[i] + b[i]", "b[i] + a[i] + 0"))
        shutil.copy(other, path)  # (another kernel's library under this one's name)
    else:
        os.remove(path[:-3] + ".sha256")
    emu._libraries.clear()  # as in a new process
    c, a, b = np.zeros(10, np.float32), rand(10), rand(10)
    with pytest.warns(tc.TCWarning, match="not the one tcstage built"):
        emulate(source, "vadd", 1, 16, [c, a, b, 10])
    np.testing.assert_array_equal(c, a + b)
    assert os.path.getsize(path) == size


def test_an_unwritable_kernel_cache_warns_and_compiles_elsewhere(monkeypatch, tmp_path):
    """A cache directory that cannot be written (read-only, or a file in the way) is left
    alone: a TCWarning says so once, and kernels are compiled into a directory of the
    process's own."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(blocker))
    monkeypatch.setattr(emu, "_libraries", {})
    monkeypatch.setattr(emu._CACHE, "writable", {})
    c, a, b = np.zeros(10, np.float32), rand(10), rand(10)
    with pytest.warns(tc.TCWarning, match="cannot write its kernel cache"):
        emulate(VADD.replace("c[i] = a[i] + b[i]", "c[i] = a[i] + b[i] + 0"), "vadd", 1, 16,
                [c, a, b, 10])
    np.testing.assert_array_equal(c, a + b)
    assert blocker.read_text() == "not a directory"
