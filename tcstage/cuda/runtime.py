"""Running a TC function as a generated CUDA kernel: binding a call's arguments to the kernel's
parameters, allocating outputs and temporaries, and launching (for now under CPU emulation).

Sizes are fixed to the call's values before scheduling, as the paper does, so each new shape
gets its own kernel (cached per shapes and scalar values).
"""

from __future__ import annotations

import numpy as np

from tcstage.cuda.codegen import CudaKernel, naive_kernel
from tcstage.cuda.emulate import emulate
from tcstage.halide.lower import Lowered
from tcstage.halide.solver import evaluate
from tcstage.poly.schedule import compute_schedule
from tcstage.poly.scop import check_bounds, extract_scop
from tcstage.program import TCFunction


def compile_naive(fn: TCFunction, *args, out=None, fusion="Preserve3Coincident"
                  ) -> tuple[CudaKernel, Lowered, dict]:
    """The naive (single-thread) kernel of fn for this call's shapes, the Funcs it came from,
    and those sizes."""
    binding = fn.bind(args, out, shapes_only=True)
    lowered = fn.lower(*args, out=out)
    scop = extract_scop(lowered, binding.sizes)
    check_bounds(scop)
    return naive_kernel(lowered, scop, compute_schedule(scop, fusion)), lowered, binding.sizes


def run_emulated(fn: TCFunction, *args, out=None, fusion="Preserve3Coincident"):
    """Runs fn's naive CUDA kernel under CPU emulation; returns outputs like fn(...)."""
    kernel, lowered, sizes = compile_naive(fn, *args, out=out, fusion=fusion)
    binding = fn.bind(args, out)
    values = {**sizes, **{k: int(v) for k, v in binding.scalars.items()
                          if isinstance(v, (int, np.integer))}}
    buffers = {}
    for name, t in fn.checked.tensors.items():
        if t.kind == "input":
            continue
        if name in binding.inout:
            buffers[name] = binding.inout[name]
            continue
        extents = tuple(evaluate(e, values) for e in lowered.ranges.tensors[name].extents)
        buffers[name] = np.zeros(extents, dtype=t.type.numpy)
    launch_args = []
    for p in kernel.parameters:
        if p.kind in ("output", "temp"):
            launch_args.append(buffers[p.source])
        elif p.kind == "input":
            launch_args.append(np.ascontiguousarray(binding.arrays[p.source]))
        elif p.kind == "scalar":
            launch_args.append(fn.checked.tensors[p.source].type.numpy.type(binding.scalars[p.source]))
        else:
            launch_args.append(np.int32(sizes[p.source]))
    emulate(kernel.source, kernel.name, kernel.grid, kernel.block, launch_args)
    results = [buffers[n] for n in fn.checked.outputs]
    return results[0] if len(results) == 1 else tuple(results)
