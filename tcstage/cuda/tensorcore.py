"""CUDA text of contraction tiles on tensor cores (poly/tensorcore.py places them).

`_mma<i>(loop values...)` runs, in every thread of the block, `tc::mma_tile`: the block's warps
share the 16 x 8 pieces of the C tile (piece f to warp f mod warps); a warp loads its piece of C
(float32, in global memory: `mma.sync` accumulates in registers, so C makes one round trip
per reduction tile), then for each 16-deep step of the reduction tile loads its fragments of A
and B, element by element in the layout the PTX ISA gives for `mma.m16n8k16` with `.row.col`
operands (lane = 4 * group + thread in group; A: rows group and group + 8, columns 2 * thread
(+1, +8, +9); B: column group, rows 2 * thread (+1, +8, +9); C: rows group and group + 8,
columns 2 * thread (+1)), and issues the instruction; then stores the piece back. Elements past
a partial tile's extent load as 0 and are not stored, so any sizes work. A, B and C are
addressed through a pointer to the tile's first element and one stride per dimension, which
covers row- and column-major operands, batches, and promoted shared-memory tiles alike.

Barriers around the call order it after the statements before it (the identity of C, copies
to shared memory) and before those after it, which ran on other threads.
"""

from __future__ import annotations

import islpy as isl

from tcstage.cuda.device_lib import MMA_LIB
from tcstage.poly.tensorcore import MMA, TensorCoreTile

PRELUDE = MMA_LIB + r"""namespace tc {
// Two 16-bit values in one 32-bit fragment register, the first in the low half.
template <typename T> __device__ __forceinline__ unsigned pack16x2(T lo, T hi) {  // (any T)
  return (unsigned)*reinterpret_cast<const unsigned short*>(&lo)
       | ((unsigned)*reinterpret_cast<const unsigned short*>(&hi) << 16);
}
// Pieces of C (16 x 8) per warp: WM x WN at a time, their accumulators in registers, so that
// each fragment of A serves WN instructions and each of B WM.
template <int TM, int TN> struct mma_shape {
  static constexpr int FM = (TM + 15) / 16, FN = (TN + 7) / 8;
  static constexpr int WM = FM < 2 ? FM : 2, WN = FN < 4 ? FN : 4;
  static constexpr int GN = (FN + WN - 1) / WN, GROUPS = ((FM + WM - 1) / WM) * GN;
};
// C[me x ne] += A[me x ke] * B[ke x ne] by the block's WARPS warps on tensor cores (a tile of
// at most TM x TN x TK); x[i * xi + j * xj] is element (i, j) of x. acc: the thread's
// accumulators, which persist between the calls for one tile of C: loaded from C when
// `first`, stored to C when `last`.
template <int TM, int TN, int TK, int WARPS, bool PERSIST, typename T>
__device__ __forceinline__ void mma_tile(float* acc, bool first, bool last, float* C,
                                         long long cm, long long cn, const T* A, long long am,
                                         long long ak, const T* B, long long bk, long long bn,
                                         int me, int ne, int ke) {
  using S = mma_shape<TM, TN>;
  constexpr int WM = S::WM, WN = S::WN, GN = S::GN, GROUPS = S::GROUPS;
  constexpr int PER_WARP = (GROUPS + WARPS - 1) / WARPS;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int lane = tid % 32, group = lane >> 2, pair = 2 * (lane & 3);
  // two neighbours along the reduction in one 32-bit load, where they are adjacent and aligned
  const bool a_pairs = ak == 1 && am % 2 == 0 && ((uintptr_t)A & 3) == 0;
  const bool b_pairs = bk == 1 && bn % 2 == 0 && ((uintptr_t)B & 3) == 0;
  const T zero = T(0.0f);
#pragma unroll
  for (int slot = 0; slot < PER_WARP; ++slot) {
    const int g = tid / 32 + slot * WARPS;  // (the same for every lane of a warp)
    if (g >= GROUPS) break;
    const int m0 = g / GN * WM * 16, n0 = g % GN * WN * 8;
    if (m0 >= me || n0 >= ne) continue;
    float own[WM][WN][4];  // (the accumulators when they do not persist between calls)
    float (&c)[WM][WN][4] = PERSIST
        ? *reinterpret_cast<float (*)[WM][WN][4]>(acc + slot * WM * WN * 4) : own;
    if (first || !PERSIST)
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int m = m0 + 16 * i + group + (r >> 1) * 8, n = n0 + 8 * j + pair + (r & 1);
            c[i][j][r] = m < me && n < ne ? C[m * cm + n * cn] : 0.0f;
          }
    for (int k0 = 0; k0 < ke; k0 += 16) {
      unsigned a[WM][4], b[WN][2];
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int m = m0 + 16 * i + group + (r & 1) * 8, k = k0 + pair + (r >> 1) * 8;
          a[i][r] = a_pairs && m < me && k + 1 < ke
              ? *reinterpret_cast<const unsigned*>(A + m * am + k)
              : pack16x2(m < me && k < ke ? A[m * am + k * ak] : zero,
                         m < me && k + 1 < ke ? A[m * am + (k + 1) * ak] : zero);
        }
#pragma unroll
      for (int j = 0; j < WN; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int n = n0 + 8 * j + group, k = k0 + pair + r * 8;
          b[j][r] = b_pairs && n < ne && k + 1 < ke
              ? *reinterpret_cast<const unsigned*>(B + n * bn + k)
              : pack16x2(n < ne && k < ke ? B[k * bk + n * bn] : zero,
                         n < ne && k + 1 < ke ? B[(k + 1) * bk + n * bn] : zero);
        }
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j) mma_m16n8k16<T>(c[i][j], a[i], b[j], c[i][j]);
    }
    if (last || !PERSIST)
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int m = m0 + 16 * i + group + (r >> 1) * 8, n = n0 + 8 * j + pair + (r & 1);
            if (m < me && n < ne) C[m * cm + n * cn] = c[i][j][r];
          }
  }
}
}  // namespace tc
"""


# Floats of accumulators a thread may keep between calls (registers: a warp's 2 x 4 pieces take
# 32); a tile with more pieces per warp loads and stores C at every call instead.
PERSISTENT_WORDS = 128


def accumulators(tile: TensorCoreTile, threads: int) -> int:
    """The floats of one thread's persistent accumulators (mma_tile's acc): its warp's groups
    of pieces, at most 2 x 4 pieces of 4 floats each (mma_shape)."""
    fm, fn = -(-tile.sizes[0] // 16), -(-tile.sizes[1] // 8)
    wm, wn = min(fm, 2), min(fn, 4)
    groups = -(-fm // wm) * -(-fn // wn)
    return -(-groups // (threads // 32)) * wm * wn * 4


def tensor_core_code(tiles: tuple[TensorCoreTile, ...], scop, printer, c_type, index_text,
                     c_of, threads: int) -> tuple[list[str], list[str], str]:
    """(declarations, macros, prelude) of the kernel's `_mma<i>` statements. printer:
    codegen's value printer (for the elements, promoted or global, at the tile's first
    point); threads: the block's."""
    if not tiles:
        return [], [], ""
    macros, declarations = [], []
    for tile in tiles:
        c = tile.contraction
        s = next(st for st in scop.statements if st.name == c.statement)
        n_args = tile.origin.dim(isl.dim_type.in_)
        args = [f"_{d}" for d in range(n_args)]
        halide = dict(zip(s.iterators, s.halide_iterators))
        dims = list(tile.dims)
        m, n, k = dims[:3]
        looped = dims[3:3 + tile.looped]
        origin = {v: f"({index_text(c_of(tile.origin.get_pw_aff(d), args))})"
                  for d, v in enumerate(dims)}
        extents = [index_text(c_of(tile.extent.get_pw_aff(d), args))
                   for d in range(3 + tile.looped)]

        def at(access, write: bool, shift: str | None = None) -> str:
            # (a promoted tile's offsets are printed over the statement's iterators, bound
            # below to the first point: the same offsets for every element of the tile)
            local = {halide[v]: (f"({v} + 1)" if v == shift else v) for v in dims}
            return "&" + printer.element_at(c.statement, access, local, write)

        def stride(access, write, v) -> str:
            return f"({at(access, write, v)} - {at(access, write)})"

        lhs = ("lhs", s.lhs)
        a, b = ("read", c.a), ("read", c.b)
        words = accumulators(tile, threads)
        # (between the calls for one tile of C: over its reduction tiles where that loop is the
        # innermost argument, over a convolution's window within one call)
        persist = (tile.first is not None or tile.looped > 0) and words <= PERSISTENT_WORDS
        acc = f"_cacc{tile.index}" if persist else "nullptr"
        if persist:
            declarations.append(f"float {acc}[{words}];")
        if persist and tile.first is not None:
            first = f"(_{n_args - 1} == {index_text(c_of(tile.first, args[:-1]))})"
            last = f"(_{n_args - 1} == {index_text(c_of(tile.last, args[:-1]))})"
        else:
            first = last = "true"
        # a loop of calls over the other reduction loops: the first call loads, the last stores
        counters = [f"_l{j}" for j in range(tile.looped)]
        for j, counter in enumerate(counters):
            first += f" && {counter} == 0"
            last += f" && {counter} == {extents[3 + j]} - 1"
        call = (f"tc::mma_tile<{tile.sizes[0]}, {tile.sizes[1]}, {tile.sizes[2]}, "
                f"{threads // 32}, {'true' if persist else 'false'}, {c_type(c.dtype)}>("
                f"{acc}, {first}, {last}, "
                f"{at(lhs, True)}, {stride(lhs, True, m)}, {stride(lhs, True, n)}, "
                f"{at(a, False)}, {stride(a, False, m)}, {stride(a, False, k)}, "
                f"{at(b, False)}, {stride(b, False, k)}, {stride(b, False, n)}, "
                f"{', '.join(extents[:3])})")
        macros.append(f"// tensor cores: {c.accumulator} += {c.a.text} * {c.b.text} over one "
                      f"tile (at most {' x '.join(map(str, tile.sizes))}), by every warp")
        index = index_text("int")
        fixed = ", ".join(f"{v} = {origin[v]}" for v in dims if v not in looped)
        loops = "".join(f"for (int {counter} = 0; {counter} < {extents[3 + j]}; ++{counter}) "
                        f"{{ const {index} {v} = {origin[v]} + {counter}; "
                        for j, (counter, v) in enumerate(zip(counters, looped)))
        macros.append(f"#define {MMA}{tile.index}({', '.join(args)}) "
                      f"{{ __syncthreads(); const {index} {fixed}; {loops}{call}; "
                      f"{'}' * len(looped)} __syncthreads(); }}")
    return declarations, macros, PRELUDE
