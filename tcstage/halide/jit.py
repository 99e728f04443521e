"""The CPU back end: Halide's JIT, with a real schedule from one of the wheel's autoschedulers.

A `CpuKernel` is compiled for one set of shapes (the autoscheduler plans for them through
`set_estimates`) and run on numpy arrays. The default autoscheduler is Mullapudi2016, which
needs no trained weights and schedules the TC kernels well; Adams2019 and Li2018 are available,
and `schedule=None` gives Halide's unscheduled code (every tensor computed at the root).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import halide as hl
import numpy as np

from tcstage.errors import TCArgumentError, TCError
from tcstage.halide.lower import Lowered, storage_type
from tcstage.halide.solver import evaluate

AUTOSCHEDULERS = ("Mullapudi2016", "Adams2019", "Li2018")
DEFAULT_SCHEDULE = "Mullapudi2016"
_loaded_plugins: set[str] = set()


def _load_autoscheduler(name: str) -> None:
    if name in _loaded_plugins:
        return
    if name not in AUTOSCHEDULERS:
        raise TCError(f"unknown CPU schedule '{name}'; choose one of "
                      f"{', '.join(AUTOSCHEDULERS)} or None for no schedule")
    path = os.path.join(os.path.dirname(hl.__file__), "lib64",
                        f"libautoschedule_{name.lower()}.so")
    if not os.path.exists(path):
        raise TCError(f"the halide package has no {name} autoscheduler (looked for {path})")
    hl.load_plugin(path)
    _loaded_plugins.add(name)


def _reversed_estimates(mins, extents) -> list[tuple[int, int]]:
    return [(int(m), max(1, int(e))) for m, e in reversed(list(zip(mins, extents)))]


class CpuKernel:
    """A TC function compiled by Halide's JIT for one set of input shapes."""

    def __init__(self, lowered: Lowered, values: Mapping[str, int], schedule: str | None):
        self.lowered = lowered
        self.schedule = schedule
        fn, ranges = lowered.fn, lowered.ranges
        self.output_bounds = []
        for name in fn.outputs:
            b = ranges.tensors[name]
            mins = tuple(evaluate(m, values) for m in b.mins)
            extents = tuple(evaluate(e, values) for e in b.extents)
            self.output_bounds.append((mins, extents))
        for name, p in lowered.params.items():
            t = fn.tensors[name]
            if t.rank:
                p.set_estimates(_reversed_estimates(
                    [0] * t.rank, [int(d) if d.isdigit() else values[d] for d in t.dims]))
        for name, p in lowered.inout_params.items():
            t = fn.tensors[name]
            p.set_estimates(_reversed_estimates([0] * t.rank, [values[d] for d in t.dims]))
        for f, (mins, extents) in zip(lowered.outputs, self.output_bounds):
            if mins:
                f.set_estimates(_reversed_estimates(mins, extents))
        self.pipeline = hl.Pipeline(lowered.outputs)
        target = hl.get_jit_target_from_environment()
        if schedule is None:
            for name, f in lowered.funcs.items():
                if fn.tensors[name].kind == "temp":
                    f.compute_root()
        else:
            _load_autoscheduler(schedule)
            # All three take 'parallelism' (Adams2019 and Li2018 assume 16 cores otherwise).
            # Never pass a parameter a plugin does not define: Halide aborts the process.
            params = {"parallelism": str(os.cpu_count() or 1)}
            self.pipeline.apply_autoscheduler(target, hl.AutoschedulerParams(schedule, params))
        self.pipeline.compile_jit(target)

    def __call__(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, object],
                 inout: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        low = self.lowered
        keep = []  # the buffers' memory must outlive the run: storage views may be copies
        for name, p in low.params.items():
            t = low.fn.tensors[name]
            if t.rank == 0:
                value = scalars[name]
                p.set(int(np.int64(np.uint64(value))) if t.type.name == "uint64" else value)
            else:
                keep.append(_storage_view(arrays[name], t.type))
                p.set(hl.Buffer(keep[-1]))
        for name, p in low.inout_params.items():
            keep.append(_storage_view(inout[name], low.fn.tensors[name].type))
            p.set(hl.Buffer(keep[-1]))
        outs, buffers = [], []
        for name, (mins, extents) in zip(low.fn.outputs, self.output_bounds):
            dtype = storage_type(low.fn.tensors[name].type).numpy
            out = aligned_empty(extents, dtype)
            buf = hl.Buffer(out)
            if mins:
                buf.set_min(list(reversed(mins)))
            outs.append(out)
            buffers.append(buf)
        try:
            self.pipeline.realize(buffers)
        except Exception as e:  # Halide reports a failed runtime check (e.g. a read out of bounds)
            raise TCArgumentError(f"running '{low.fn.name}' failed: {e}") from None
        finally:
            del keep
        return [o.view(low.fn.tensors[n].type.numpy) if o.dtype != low.fn.tensors[n].type.numpy
                else o for n, o in zip(low.fn.outputs, outs)]


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 128) -> np.ndarray:
    """An uninitialised C-order array whose data starts on an `alignment`-byte boundary.

    Halide's generated code may read an output back with aligned vector loads (a reduction's
    update reads the running values): on an unaligned numpy array that faulted (seen with
    vmovaps on AVX-512 and AVX2 hosts), so every output buffer is allocated aligned.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _storage_view(a: np.ndarray, t) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.int64) if t.name == "uint64" else a
