"""A default schedule chosen from the TC's structure, for `options="auto"` when nothing is
cached: what a CUDA programmer writes first for a loop nest of this shape.

The largest statement decides: the one writing the most elements (its parallel work), then
the one with the most loop iterations. Its output loops (the indices of the
tensor it writes) are tiled, the innermost by 32 so that threadIdx.x walks the contiguous
dimension of the output (coalesced stores; row-major tensors), the one outside it by 8; outer
output loops get tiles of 1, so each block takes one of their values. A block is one tile:
32 x 8 threads. Blocks cover the tile loops (the mapper puts blockIdx.x on the outermost tile
loop). Reduction loops stay untiled and sequential per thread. When the statement reduces,
operands are reused across a tile, so tiles are promoted to shared memory and the accumulator to
a register; the innermost loops are unrolled by 4.

In a kernel sequence each launch gets the options its own largest statement calls for (the
compiler's `launch_options`): one set of tile sizes cannot fit statements of different ranks
(bilateral_grid's 4-dimensional grid and its 2-dimensional output), and blocks sized for one
launch's tiles would starve a larger one.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tcstage.errors import TCError
from tcstage.options import MappingOptions

WARP = 32


def heuristic_options(fn, reports, statements=None) -> MappingOptions:
    """fn: a TCFunction; reports: `fn.ranges(...)` at the call's sizes; `statements`: the
    indices of the TC statements to choose for (one launch of a kernel sequence), default all."""
    checked = fn.checked
    best, best_work = None, (-1, -1)
    for k, (st, report) in enumerate(zip(checked.statements, reports)):
        if statements is not None and k not in statements:
            continue
        extents = {v: max(int(hi) - int(lo), 1) for v, (lo, hi) in report.concrete.items()}
        # the most elements written first (the parallel work), then the most iterations
        work = (math.prod(extents[v] for v in st.indices if v in extents),
                math.prod(extents.values()))
        if work > best_work:
            best, best_work = (st, report), work
    if best is None:
        return MappingOptions()
    st, report = best
    extents = {v: max(int(hi) - int(lo), 1) for v, (lo, hi) in report.concrete.items()}
    outputs = [extents[v] for v in st.indices if v in extents]
    if not outputs:  # a full reduction to a scalar: one thread block cannot split it yet
        return MappingOptions()
    reduces = len(extents) > len(outputs)
    tiles = [1] * len(outputs)
    tiles[-1] = min(WARP, outputs[-1])
    if len(outputs) >= 2:
        tiles[-2] = min(8, outputs[-2])
    threads = [tiles[-1]] + ([tiles[-2]] if len(outputs) >= 2 else [])
    counts = [-(-e // t) for e, t in zip(outputs, tiles)]
    blocks = [min(c, 65535) for c in counts[:3]]
    blocks[0] = min(counts[0], 2**31 - 1)
    options = (MappingOptions().tile(*tiles).mapToThreads(*threads).mapToBlocks(*blocks)
               .unroll(4))
    if reduces:
        options = options.useSharedMemory(True).usePrivateMemory(True)
    return options


def structural_default(fn, inputs, out) -> tuple:
    """What `options="auto"` compiles where the cache has nothing for the call `fn(*inputs,
    out=out)` (shapes will do): (options, the function giving each launch of a kernel sequence
    its own, their compilation or None, the warnings it gave). With temporaries, overlapped
    tiles where the cost model predicts they win (then the winner is compiled already)."""
    from tcstage.inputs import call_shapes
    binding = fn.bind(inputs, out, shapes_only=True)
    values = {**binding.sizes, **{k: v for k, v in binding.scalars.items()
                                  if not isinstance(v, np.ndarray)}}  # (numpy scalars count)
    shapes, outs = call_shapes(fn.checked, values)
    reports = fn.ranges(*shapes, out=tuple(outs) or None)
    options = heuristic_options(fn, reports)

    @functools.cache  # (launches of overlapped tiles take the function's options)
    def own(statements: frozenset) -> MappingOptions:
        return heuristic_options(fn, reports, statements)

    def per_launch(_position, statements) -> MappingOptions:
        return own(frozenset(statements))
    if not any(t.kind == "temp" for t in fn.checked.tensors.values()):
        return options, per_launch, None, []
    chosen, compiled, said = _predicted_best(fn, inputs, out,
                                             [options, options.overlappedTiles(True)],
                                             per_launch)
    return chosen, per_launch, compiled, said


def _predicted_best(fn, inputs, out, candidates, per_launch=None) -> tuple:
    """The candidate options whose kernel the cost model (H100) predicts fastest, with that
    compilation and the warnings it gave: (options, Compiled, warnings); where one cannot be
    compiled or predicted, the others ((candidates[0], None, []) where none can)."""
    from tcstage.compiler import compile_cuda, held_warnings
    from tcstage.tune import model
    best, best_time = (candidates[0], None, []), math.inf
    for options in candidates:
        try:
            with held_warnings() as said:
                compiled = compile_cuda(fn, inputs, out, options, launch_options=per_launch)
                time = model.predict(compiled, model.H100).time
        except TCError:
            continue
        if time < best_time:
            best, best_time = (options, compiled, said), time
    return best
