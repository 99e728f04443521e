"""CUDA device code that generated kernels include: one warp's tensor core step.

`MMA_LIB` is CUDA source (to paste into a kernel's translation unit, after its includes or with
its own) defining, in namespace `tc`, PTX's `mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32` for
T = bf16 and f16, and plain loads that fill a lane's fragments from a tile in memory (shared or
global) and store the result back:

    template <class T> void tc::mma_m16n8k16(float d[4], const unsigned a[4],
                                             const unsigned b[2], const float c[4]);
        D = A B + C for one warp: A 16 x 16 (m x k), B 16 x 8 (k x n), C and D 16 x 8 floats, each
        lane holding its fragments. T (`__nv_bfloat16` or `half`/`__half`) is the element type of
        A and B; d may be c (accumulate in place). Every lane of the warp must call it together.
    template <class T> void tc::mma_load_a(unsigned a[4], const T* p, int ld, bool col_major);
        A's fragment from the 16 x 16 tile at p: element (m, k) at p[m * ld + k] (row-major,
        stored [m][k]), or at p[k * ld + m] when col_major (stored [k][m]).
    template <class T> void tc::mma_load_b(unsigned b[2], const T* p, int ld, bool col_major);
        B's fragment from the 16 x 8 tile at p: element (k, n) at p[k * ld + n] (row-major,
        [k][n]), or at p[n * ld + k] when col_major ([n][k], the instruction's own ".col").
    template <class T> void tc::mma_load_c(float c[4], const T* p, int ld, bool col_major);
    template <class T> void tc::mma_store_d(T* p, int ld, bool col_major, const float d[4]);
        C's fragment from, and D's to, the 16 x 8 tile at p: element (m, n) at p[m * ld + n], or
        at p[n * ld + m] when col_major; T is any type that converts to and from float.
    int tc::mma_row_c(int i), tc::mma_col_c(int i);
        The tile row and column of element i (0..3) of this lane's C/D fragment, for epilogues
        that write D elsewhere (bounds checks, fused operations).
    unsigned tc::mma_lane();
        The calling thread's lane: its linear thread id in the block, modulo 32.

Fragments follow PTX's "Matrix Fragments for mma.m16n8k16 with floating point type" (groupID =
lane / 4, threadID_in_group = lane % 4; the lower 16 bits of a register hold the element with
the lower index). A: register r holds row groupID + 8 * (r % 2), columns
2 * threadID_in_group + 8 * (r / 2) and the next one. B: register r holds rows
2 * threadID_in_group + 8 * r and the next one, column groupID. C/D: element i is at row
groupID + 8 * (i / 2), column 2 * threadID_in_group + i % 2.

Three implementations, chosen by the preprocessor:
- nvcc for sm_80 and later (`__CUDA_ARCH__ >= 800`): the mma.sync instruction, inline PTX.
- The CPU emulator (its translation units define `TCEMU`): a warp collective of the emulator
  (`tcemu::mma_m16n8k16` in emu_runtime.h) that applies the fragment layout above. Each D element
  is C's plus the 16 products in k order, each product exact in float (the operands have at most
  11 significant bits) and each addition rounded to float; tensor cores add in an order and
  with internal roundings of their own, so results agree with a GPU's to rounding, not bit for
  bit: compare with tolerances.
- nvcc for older GPUs (sm_70, sm_75), or wherever `TC_MMA_SHUFFLES` is defined: the same
  product from warp shuffles (32 per step, each lane gathering two rows of A and two columns of
  B), with the emulator's order of additions; slow, but it compiles and is right everywhere.
  Tensor cores proper need sm_80.

The loads are plain element loads, two 16-bit loads per register: simple and correct for any
tile in any memory and layout; ldmatrix and vector loads are the faster path for later.
"""

from __future__ import annotations

__all__ = ["MMA_LIB", "MMA_SYMBOLS"]

# Names MMA_LIB defines in namespace tc (so that generated code can avoid them).
MMA_SYMBOLS = ("mma_traits", "mma_lane", "mma_pack", "mma_m16n8k16", "mma_by_shuffles",
               "mma_load_a", "mma_load_b", "mma_load_c", "mma_store_d", "mma_row_c", "mma_col_c")

MMA_LIB = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tc {
// The element types of A and B: their bits, their value, and the instruction for them.
template <class T> struct mma_traits;
template <> struct mma_traits<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned short bits(__nv_bfloat16 x) {
    return __bfloat16_as_ushort(x);
  }
  static __device__ __forceinline__ float value(unsigned short b) {
    return __bfloat162float(__ushort_as_bfloat16(b));
  }
#if defined(TCEMU)
  static const int emulated = ::tcemu::MMA_M16N8K16_BF16;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b,
                                             const float* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
#endif
};
template <> struct mma_traits<__half> {
  static __device__ __forceinline__ unsigned short bits(__half x) { return __half_as_ushort(x); }
  static __device__ __forceinline__ float value(unsigned short b) {
    return __half2float(__ushort_as_half(b));
  }
#if defined(TCEMU)
  static const int emulated = ::tcemu::MMA_M16N8K16_F16;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b,
                                             const float* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
#endif
};

// The calling thread's lane (warps are consecutive linear thread ids).
__device__ __forceinline__ unsigned mma_lane() {
#if defined(TCEMU)
  return ((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % 32u;
#else
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#endif
}

template <class T> __device__ __forceinline__ unsigned mma_pack(T lo, T hi) {
  return (unsigned)mma_traits<T>::bits(lo) | ((unsigned)mma_traits<T>::bits(hi) << 16);
}

// D = A B + C from shuffles alone: lane (g, t) gathers rows g and g + 8 of A from lanes
// 4g .. 4g + 3 and columns 2t and 2t + 1 of B from lanes 4 (2t + h) .. 4 (2t + h) + 3.
template <class T> __device__ __forceinline__ void mma_by_shuffles(
    float* d, const unsigned* a, const unsigned* b, const float* c) {
  const unsigned lane = mma_lane(), g = lane >> 2, t = lane & 3;
  float rows[2][16], cols[2][16];
  for (int j = 0; j < 4; ++j) {
    for (int r = 0; r < 4; ++r) {
      unsigned w = __shfl_sync(0xffffffffu, a[r], 4 * g + j);
      int k = 2 * j + 8 * (r >> 1);
      rows[r & 1][k] = mma_traits<T>::value((unsigned short)(w & 0xffffu));
      rows[r & 1][k + 1] = mma_traits<T>::value((unsigned short)(w >> 16));
    }
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 2; ++r) {
        unsigned w = __shfl_sync(0xffffffffu, b[r], 4 * (2 * t + h) + j);
        int k = 2 * j + 8 * r;
        cols[h][k] = mma_traits<T>::value((unsigned short)(w & 0xffffu));
        cols[h][k + 1] = mma_traits<T>::value((unsigned short)(w >> 16));
      }
    }
  }
  float out[4];
  for (int i = 0; i < 4; ++i) {
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += rows[i >> 1][k] * cols[i & 1][k];
    out[i] = acc;
  }
  for (int i = 0; i < 4; ++i) d[i] = out[i];  // after every read of c: d may be c
}

// D = A B + C for the warp (A 16 x 16, B 16 x 8, C and D 16 x 8 floats); T: __nv_bfloat16 or
// __half. Every lane of the warp calls it together.
template <class T> __device__ __forceinline__ void mma_m16n8k16(
    float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
#if defined(TC_MMA_SHUFFLES)
  mma_by_shuffles<T>(d, a, b, c);
#elif defined(TCEMU)
  ::tcemu::mma_m16n8k16(mma_traits<T>::emulated, d, a, b, c, __LINE__, __COUNTER__);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  mma_traits<T>::mma(d, a, b, c);
#else
  mma_by_shuffles<T>(d, a, b, c);  // tensor cores' mma.sync with these types needs sm_80
#endif
}

// A (16 x 16, m x k) at p: (m, k) at p[m * ld + k], or p[k * ld + m] when col_major.
template <class T> __device__ __forceinline__ void mma_load_a(
    unsigned a[4], const T* p, int ld, bool col_major) {
  const unsigned lane = mma_lane(), g = lane >> 2, t = lane & 3;
  for (int r = 0; r < 4; ++r) {
    int m = g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);
    a[r] = col_major ? mma_pack(p[k * ld + m], p[(k + 1) * ld + m])
                     : mma_pack(p[m * ld + k], p[m * ld + k + 1]);
  }
}

// B (16 x 8, k x n) at p: (k, n) at p[k * ld + n], or p[n * ld + k] when col_major.
template <class T> __device__ __forceinline__ void mma_load_b(
    unsigned b[2], const T* p, int ld, bool col_major) {
  const unsigned lane = mma_lane(), n = lane >> 2, t = lane & 3;
  for (int r = 0; r < 2; ++r) {
    int k = 2 * t + 8 * r;
    b[r] = col_major ? mma_pack(p[n * ld + k], p[n * ld + k + 1])
                     : mma_pack(p[k * ld + n], p[(k + 1) * ld + n]);
  }
}

// Where element i (0..3) of this lane's C/D fragment lies in the 16 x 8 tile.
__device__ __forceinline__ int mma_row_c(int i) { return (int)(mma_lane() >> 2) + 8 * (i >> 1); }
__device__ __forceinline__ int mma_col_c(int i) { return 2 * (int)(mma_lane() & 3) + (i & 1); }

// C from, and D to, the 16 x 8 tile at p: (m, n) at p[m * ld + n], or p[n * ld + m] when
// col_major.
template <class T> __device__ __forceinline__ void mma_load_c(
    float c[4], const T* p, int ld, bool col_major) {
  for (int i = 0; i < 4; ++i) {
    int m = mma_row_c(i), n = mma_col_c(i);
    c[i] = (float)(col_major ? p[n * ld + m] : p[m * ld + n]);
  }
}
template <class T> __device__ __forceinline__ void mma_store_d(
    T* p, int ld, bool col_major, const float d[4]) {
  for (int i = 0; i < 4; ++i) {
    int m = mma_row_c(i), n = mma_col_c(i);
    (col_major ? p[n * ld + m] : p[m * ld + n]) = T(d[i]);
  }
}
}  // namespace tc
"""
