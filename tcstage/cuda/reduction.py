"""CUDA text of reductions split across the threads of a block (poly/mapping.py decides them).

Each thread combines its share of the reduction loop into an accumulator of its own, `_acc<i>`,
which the statement's macro reads and writes instead of the reduced element. After the loop,
`_rcomb<k>` combines the accumulators of the block:

    warp:   a tree of __shfl_down_sync steps (16, 8, 4, 2, 1 lanes): lane 0 holds the warp's
    block:  lane 0 of each warp stores it in shared memory; after a barrier, warp 0 combines
            those with a second tree
    tensor: thread 0 combines the block's value into the element (`O = O + v`), which keeps
            the statement's meaning: the identity of a `+=!` was stored before, an
            accumulating `+=` adds to what was there

Threads whose share is empty (past the loop's end, or on y and z, which the reduction's band
does not use) hold the identity, so the whole block takes part and every warp is whole (mapping
made blockDim.x a multiple of 32). A barrier before the block step orders the writes the loop
made (the identity, on whichever thread ran it) before thread 0's combine, and one after it
makes the element visible to the threads that read it next and frees the shared slots.

Split across G blocks as well (`ParallelReduction.across`), thread 0 of each block stores the
block's value in its slot of a scratch array, `_part<i>[element][block]`, and counts its
arrival in `_count<i>[element]` after a memory fence; the block that arrives last combines the
G slots in block order (a fixed order: the result does not depend on scheduling) into the
element, and sets the count back to 0 for the next launch. The runtime allocates both scratch
arrays zeroed (Parameter kind "scratch"). The element's identity (the first statement of a
`+=!`) runs in the blocks with index 0 on that dimension, which arrive before the last.
"""

from __future__ import annotations

import math

import attrs
import islpy as isl
import numpy as np

from tcstage.poly.mapping import REDUCTION_COMBINE, REDUCTION_INIT, WARP, ParallelReduction

PRELUDE = r"""namespace tc {
// A warp's values combined by `op` into lane 0 (every lane of the warp takes part).
template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int d = 16; d > 0; d /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, d));
  return v;
}
}  // namespace tc
"""


def identity_text(operator: str, dtype: str, literal) -> str:
    """The identity of the operator for the type as C (literal: codegen's float literal)."""
    if operator in ("add", "mul"):
        value = 0 if operator == "add" else 1
        return literal(float(value), dtype) if dtype.startswith(("float", "bfloat")) \
            else f"(({_int_c(dtype)}){value})"
    if dtype.startswith(("float", "bfloat")):
        return literal(math.inf if operator == "min" else -math.inf, dtype)
    info = np.iinfo(dtype)
    value = info.max if operator == "min" else info.min
    # (the most negative value has no literal of its own: -2^63 is `-(2^63 - 1) - 1`)
    text = f"({value + 1}LL - 1)" if value < 0 else f"{value}ULL" if dtype.startswith("uint") \
        else f"{value}LL"
    return f"(({_int_c(dtype)}){text})"


def _int_c(dtype: str) -> str:
    return f"{dtype}_t"


def combine_text(operator: str, a: str, b: str, dtype: str, c_type) -> str:
    """a op b as the statement's own macro prints it."""
    if operator == "add":
        return f"({a} + {b})"
    if operator == "mul":
        return f"({a} * {b})"
    if dtype in ("float16", "bfloat16"):  # (CUDA has no min(half, half))
        return f"tc::{operator}<{c_type(dtype)}>({a}, {b})"
    return f"{operator}({a}, {b})"


@attrs.frozen
class Scratch:
    """A zeroed array the runtime passes to the kernel (kind "scratch" parameters)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def reduction_code(reductions: tuple[ParallelReduction, ...], block: tuple[int, int, int],
                   element_text, c_type, literal, elements, scratch_prefix: str = ""):
    """(declarations, macros, accumulators: statement -> (tensor, C variable), scratch arrays)
    of the kernel's parallel reductions. element_text(tensor, element, args) prints the
    global element a function of the macro arguments gives; elements(tensor) its size;
    scratch_prefix sets the scratch arrays of one launch of a sequence apart."""
    declarations, macros, accumulators, scratch = [], [], {}, []
    if not reductions:
        return declarations, macros, accumulators, scratch
    threads = math.prod(block)
    warps = threads // WARP
    declarations.append("const int _tid = threadIdx.x + blockDim.x * (threadIdx.y + "
                        "blockDim.y * threadIdx.z);")
    if warps > 1:
        declarations.append("const int _lane = _tid % 32, _warp = _tid / 32;")
    bands: dict[int, list[tuple[int, ParallelReduction]]] = {}
    for i, r in enumerate(reductions):
        bands.setdefault(r.band, []).append((i, r))
    for k, members in sorted(bands.items()):
        n_prefix = members[0][1].element.dim(isl.dim_type.in_)
        args = [f"_{d}" for d in range(n_prefix)]
        inits, combines = [], []
        for i, r in members:
            red = r.reduction
            ty = c_type(red.dtype)
            acc = f"_acc{i}"
            accumulators[red.statement] = (red.tensor, acc)
            identity = identity_text(red.operator, red.dtype, literal)
            declarations.append(f"{ty} {acc};")
            op = f"[]({ty} a, {ty} b) {{ return {combine_text(red.operator, 'a', 'b', red.dtype, c_type)}; }}"
            inits.append(f"{acc} = {identity};")
            steps = [f"{acc} = tc::warp_reduce({acc}, {op});", "__syncthreads();"]
            if warps > 1:
                declarations.append(f"__shared__ {ty} _red{i}[{warps}];")
                steps += [f"if (_lane == 0) _red{i}[_warp] = {acc};", "__syncthreads();",
                          f"if (_warp == 0) {{ {acc} = _lane < {warps} ? _red{i}[_lane] : "
                          f"{identity}; {acc} = tc::warp_reduce({acc}, {op}); }}"]
            target = element_text(red.tensor, r.element, args)
            if r.across is None:
                steps += [f"if (_tid == 0) {target} = "
                          f"{combine_text(red.operator, target, acc, red.dtype, c_type)};",
                          "__syncthreads();"]
            else:
                d, n = r.across
                part, count = f"{scratch_prefix}_part{i}", f"{scratch_prefix}_count{i}"
                size = elements(red.tensor)
                scratch += [Scratch(part, red.dtype, (size, n)), Scratch(count, "uint32", (size,))]
                if "__shared__ bool _last;" not in declarations:
                    declarations.append("__shared__ bool _last;")
                slot = f"(&{target} - {target.split('[', 1)[0]})"
                total = combine_text(red.operator, "_v", f"__ldcg(&{part}[_slot * {n} + _b])",
                                     red.dtype, c_type)
                steps += [
                    f"if (_tid == 0) {{ const long long _slot = {slot}; "
                    f"{part}[_slot * {n} + blockIdx.{'xyz'[d]}] = {acc}; __threadfence(); "
                    f"_last = atomicAdd(&{count}[_slot], 1u) == {n - 1}u; }}",
                    "__syncthreads();",
                    f"if (_last && _tid == 0) {{ const long long _slot = {slot}; "
                    f"{ty} _v = __ldcg(&{target}); "
                    f"for (int _b = 0; _b < {n}; ++_b) _v = {total}; "
                    f"{target} = _v; {count}[_slot] = 0u; }}",
                    "__syncthreads();"]
            combines.append(" ".join(steps))
        macros.append(f"// parallel reduction {k}: each thread's accumulator set to the identity")
        macros.append(f"#define {REDUCTION_INIT}{k}({', '.join(args)}) {{ {' '.join(inits)} }}")
        macros.append(f"// parallel reduction {k}: warps, then the block, then the tensor")
        macros.append(f"#define {REDUCTION_COMBINE}{k}({', '.join(args)}) "
                      f"{{ {' '.join(combines)} }}")
    return declarations, macros, accumulators, scratch

