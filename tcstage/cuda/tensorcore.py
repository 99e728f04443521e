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
// C[me x ne] += A[me x ke] * B[ke x ne] by the block's warps on tensor cores (a tile of at most
// TM x TN x TK); x[i * xi + j * xj] is element (i, j) of x.
template <int TM, int TN, int TK, typename T>
__device__ void mma_tile(float* C, long long cm, long long cn, const T* A, long long am,
                         long long ak, const T* B, long long bk, long long bn, int me, int ne,
                         int ke) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int warps = blockDim.x * blockDim.y * blockDim.z / 32;
  const int lane = tid % 32, group = lane >> 2, pair = 2 * (lane & 3);
  constexpr int FN = (TN + 7) / 8, PIECES = ((TM + 15) / 16) * FN;
  const T zero = T(0.0f);
  for (int f = tid / 32; f < PIECES; f += warps) {  // (the same for every lane of a warp)
    const int m0 = f / FN * 16, n0 = f % FN * 8;
    if (m0 >= me || n0 >= ne) continue;
    float c[4];
    for (int r = 0; r < 4; ++r) {
      const int m = m0 + group + (r >> 1) * 8, n = n0 + pair + (r & 1);
      c[r] = m < me && n < ne ? C[m * cm + n * cn] : 0.0f;
    }
    for (int k0 = 0; k0 < ke; k0 += 16) {
      unsigned a[4], b[2];
      for (int r = 0; r < 4; ++r) {
        const int m = m0 + group + (r & 1) * 8, k = k0 + pair + (r >> 1) * 8;
        a[r] = pack16x2(m < me && k < ke ? A[m * am + k * ak] : zero,
                        m < me && k + 1 < ke ? A[m * am + (k + 1) * ak] : zero);
      }
      for (int r = 0; r < 2; ++r) {
        const int n = n0 + group, k = k0 + pair + r * 8;
        b[r] = pack16x2(n < ne && k < ke ? B[k * bk + n * bn] : zero,
                        n < ne && k + 1 < ke ? B[(k + 1) * bk + n * bn] : zero);
      }
      mma_m16n8k16<T>(c, a, b, c);
    }
    for (int r = 0; r < 4; ++r) {
      const int m = m0 + group + (r >> 1) * 8, n = n0 + pair + (r & 1);
      if (m < me && n < ne) C[m * cm + n * cn] = c[r];
    }
  }
}
}  // namespace tc
"""


def tensor_core_code(tiles: tuple[TensorCoreTile, ...], scop, printer, c_type, index_text,
                     c_of) -> tuple[list[str], str]:
    """(macros, prelude) of the kernel's `_mma<i>` statements. printer: codegen's value
    printer (for the elements, promoted or global, at the tile's first point)."""
    if not tiles:
        return [], ""
    macros = []
    for tile in tiles:
        c = tile.contraction
        s = next(st for st in scop.statements if st.name == c.statement)
        n_args = tile.origin.dim(isl.dim_type.in_)
        args = [f"_{d}" for d in range(n_args)]
        halide = dict(zip(s.iterators, s.halide_iterators))
        dims = [c.m, c.n, c.k] + list(c.batch)
        origin = {v: f"({index_text(c_of(tile.origin.get_pw_aff(d), args))})"
                  for d, v in enumerate(dims)}
        extents = [index_text(c_of(tile.extent.get_pw_aff(d), args)) for d in range(3)]

        def at(access, write: bool, shift: str | None = None) -> str:
            # (a promoted tile's offsets are printed over the statement's iterators, bound
            # below to the first point: the same offsets for every element of the tile)
            local = {halide[v]: (f"({v} + 1)" if v == shift else v) for v in dims}
            return "&" + printer.element_at(c.statement, access, local, write)

        def stride(access, write, v) -> str:
            return f"({at(access, write, v)} - {at(access, write)})"

        lhs = ("lhs", s.lhs)
        a, b = ("read", c.a), ("read", c.b)
        call = (f"tc::mma_tile<{tile.sizes[0]}, {tile.sizes[1]}, {tile.sizes[2]}, "
                f"{c_type(c.dtype)}>("
                f"{at(lhs, True)}, {stride(lhs, True, c.m)}, {stride(lhs, True, c.n)}, "
                f"{at(a, False)}, {stride(a, False, c.m)}, {stride(a, False, c.k)}, "
                f"{at(b, False)}, {stride(b, False, c.k)}, {stride(b, False, c.n)}, "
                f"{', '.join(extents)})")
        macros.append(f"// tensor cores: {c.accumulator} += {c.a.text} * {c.b.text} over one "
                      f"tile (at most {' x '.join(map(str, tile.sizes))}), by every warp")
        index = index_text("int")
        first = ", ".join(f"{v} = {origin[v]}" for v in dims)
        macros.append(f"#define {MMA}{tile.index}({', '.join(args)}) "
                      f"{{ __syncthreads(); const {index} {first}; {call}; __syncthreads(); }}")
    return macros, PRELUDE
