"""The CPU back end: Halide's JIT, with a real schedule from one of the wheel's autoschedulers.

A `CpuKernel` is compiled for one set of shapes (the autoscheduler plans for them through
`set_estimates`, and the inputs' bounds are set to them) and run on numpy arrays. The default
autoscheduler is Mullapudi2016, which needs no trained weights and schedules the TC kernels
well; Adams2019 and Li2018 are available, and `schedule=None` gives Halide's unscheduled code
(every tensor computed at the root). A schedule that fails (an autoscheduler that rejects the
pipeline, or code that touches elements beyond small arrays) falls back to unscheduled code,
with a `TCWarning`.

Arrays go to Halide as they are where it can take them (read-only ones included) and as
C-ordered, aligned, native-endian copies where it cannot; tensors beyond Halide's int32
indexing (2**31 - 1 elements) are refused.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping

import halide as hl
import numpy as np

from tcstage.errors import TCArgumentError, TCError, warn
from tcstage.halide.lower import HALIDE_FAILURES, Lowered, lower, set_scalar, storage_type
from tcstage.halide.solver import evaluate

AUTOSCHEDULERS = ("Mullapudi2016", "Adams2019", "Li2018")
DEFAULT_SCHEDULE = "Mullapudi2016"
_loaded_plugins: set[str] = set()
# Halide addresses a buffer with int32 element indices (and allocates at most 2**31 - 1 bytes
# unless the target has LargeBuffers).
MAX_ELEMENTS = 2**31 - 1


def schedule_name(schedule) -> str | None:
    """The autoscheduler a `schedule=` argument names (any case; None or 'none': no
    schedule)."""
    if schedule is None:
        return None
    if isinstance(schedule, str):
        if schedule.lower() == "none":
            return None
        for name in AUTOSCHEDULERS:
            if schedule.lower() == name.lower():
                return name
    near = difflib.get_close_matches(str(schedule), [*AUTOSCHEDULERS, "none"], n=1, cutoff=0.6)
    raise TCError(f"unknown CPU schedule {schedule!r}"
                  + (f"; did you mean '{near[0]}'?" if near else "")
                  + f" Choose one of {', '.join(AUTOSCHEDULERS)}, or None (or 'none') for no "
                  "schedule")


def _load_autoscheduler(name: str) -> None:
    if name in _loaded_plugins:
        return
    path = os.path.join(os.path.dirname(hl.__file__), "lib64",
                        f"libautoschedule_{name.lower()}.so")
    if not os.path.exists(path):
        raise TCError(f"the halide package has no {name} autoscheduler (looked for {path})")
    hl.load_plugin(path)
    _loaded_plugins.add(name)


def _reversed_estimates(mins, extents) -> list[tuple[int, int]]:
    return [(int(m), max(1, int(e))) for m, e in reversed(list(zip(mins, extents)))]


def _tensor_extents(lowered: Lowered, values: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The extents of every tensor of the function, for a call's sizes."""
    return {name: tuple(evaluate(e, values) for e in b.extents)
            for name, b in lowered.ranges.tensors.items() if lowered.fn.tensors[name].rank}


class CpuKernel:
    """A TC function compiled by Halide's JIT for one set of input shapes."""

    def __init__(self, lowered: Lowered, values: Mapping[str, int], schedule: str | None):
        self.lowered = lowered
        self.schedule = schedule = schedule_name(schedule)
        fn, ranges = lowered.fn, lowered.ranges
        extents = _tensor_extents(lowered, values)
        target = hl.get_jit_target_from_environment()
        for name, shape in extents.items():
            elements = math.prod(max(0, e) for e in shape)
            if elements > MAX_ELEMENTS:
                raise TCArgumentError(
                    f"'{fn.name}' would need {fn.tensors[name].kind} {name} of shape {shape} "
                    f"({elements} elements); the CPU back end (Halide) addresses at most "
                    f"2**31 - 1 elements per tensor")
            if elements * fn.tensors[name].type.bits // 8 > MAX_ELEMENTS:
                target = target.with_feature(hl.TargetFeature.LargeBuffers)
        self.output_bounds = []
        for name in fn.outputs:
            b = ranges.tensors[name]
            self.output_bounds.append((tuple(evaluate(m, values) for m in b.mins),
                                       tuple(evaluate(e, values) for e in b.extents)))
        self.values, self.target = dict(values), target
        try:
            self.pipeline = self._compile()
        except HALIDE_FAILURES as e:  # from the autoscheduler (see _compile)
            self._unscheduled()
            warn(f"'{fn.name}' runs unscheduled on the CPU: the {schedule} autoscheduler "
                 f"failed on it ({_halide_message(e)})")

    def _unscheduled(self) -> None:
        """Falls back to Halide's unscheduled code: a schedule only makes the code fast. The
        failed attempt may have scheduled some Funcs, so this starts from fresh ones."""
        fn, ranges = self.lowered.fn, self.lowered.ranges
        self.schedule = None
        self.lowered = lower(fn, ranges, dict(ranges.scalars))
        self.pipeline = self._compile()

    def _compile(self) -> hl.Pipeline:
        """The JIT-compiled pipeline. Halide's errors pass through where a schedule was asked
        for (the caller falls back to none); without one they are a TCError."""
        try:
            return self._compile_pipeline()
        except HALIDE_FAILURES as e:
            if self.schedule is not None:
                raise
            raise TCError(f"Halide could not compile '{self.lowered.fn.name}' for the CPU: "
                          f"{_halide_message(e)}", notes=("this is a bug in tcstage",)) from e

    def _compile_pipeline(self) -> hl.Pipeline:
        lowered, fn, values, target = self.lowered, self.lowered.fn, self.values, self.target
        params = [(p, [int(d) if d.isdigit() else values[d] for d in fn.tensors[name].dims])
                  for name, p in (*lowered.params.items(), *lowered.inout_params.items())
                  if fn.tensors[name].rank]
        for p, extents in params:
            p.set_estimates(_reversed_estimates([0] * len(extents), extents))
            # The kernel serves only these shapes, so Halide is told them. With symbolic
            # extents, a temporary that the autoscheduler splits (ShiftInwards) has a realized
            # region like max(min(N, 8), 1) - 8, and lowering a subscript that reads it
            # through nested reads, T(T(T(T(T(I(i)))))), took time exponential in the depth
            # (90 s for 5 levels with Mullapudi2016, unbounded with Li2018). Empty tensors
            # keep symbolic bounds: Li2018 aborts the process on a constant extent 0.
            if min(extents) > 0:
                for k, e in enumerate(reversed(extents)):
                    p.dim(k).set_bounds(0, int(e))
        for f, (mins, extents) in zip(lowered.outputs, self.output_bounds):
            if mins:
                f.set_estimates(_reversed_estimates(mins, extents))
        pipeline = hl.Pipeline(lowered.outputs)
        if self.schedule is None:
            final = {f.name() for f in lowered.outputs}
            for versions in lowered.versions.values():
                for v in versions:
                    if v.func.name() not in final:
                        v.func.compute_root()
        else:
            _load_autoscheduler(self.schedule)
            # All three take 'parallelism' (Adams2019 and Li2018 assume 16 cores otherwise).
            # Never pass a parameter a plugin does not define: Halide aborts the process.
            params = {"parallelism": str(os.cpu_count() or 1)}
            pipeline.apply_autoscheduler(target, hl.AutoschedulerParams(self.schedule, params))
        pipeline.compile_jit(target)
        return pipeline

    def __call__(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, object],
                 inout: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        low = self.lowered
        keep = []  # the buffers' memory must outlive the run: storage views may be copies
        for name, p in low.params.items():
            t = low.fn.tensors[name]
            if t.rank == 0:
                value = scalars[name]
                set_scalar(p, value, t.type)
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
        except HALIDE_FAILURES as e:  # a failed runtime check (e.g. a read out of bounds)
            if self.schedule is None:
                raise TCArgumentError(f"running '{low.fn.name}' failed: {_halide_message(e)}") \
                    from None
            # Autoschedulers may split a loop by more than its extent, so that the code
            # touches elements beyond the arrays. If the unscheduled code runs, the schedule
            # was at fault, not the arguments.
            failed = f"the {self.schedule} schedule failed at run time ({_halide_message(e)})"
            self._unscheduled()
            results = self(arrays, scalars, inout)
            warn(f"'{low.fn.name}' runs unscheduled on the CPU: {failed}")
            return results
        finally:
            del keep
        return [o.view(low.fn.tensors[n].type.numpy) if o.dtype != low.fn.tensors[n].type.numpy
                else o for n, o in zip(low.fn.outputs, outs)]


def _halide_message(e: Exception) -> str:
    text = str(e).strip()
    return text if text not in ("", "Error:") else f"{type(e).__name__} without a message"


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
    """a as an array `hl.Buffer` takes, with a's values: C-contiguous (Halide's innermost
    stride is 1), aligned and in native byte order (copied only where it is not), uint64 as
    int64 bits (Halide's Python buffers have no uint64). A read-only array is used in place
    through a writable alias: Halide only reads inputs and the old values of in/out outputs."""
    native = a.dtype.newbyteorder("=")
    if a.dtype != native or not (a.flags.c_contiguous and a.flags.aligned):
        a = np.array(a, dtype=native, order="C")
    if not a.flags.writeable:
        a = _writable_alias(a)
    return a.view(np.int64) if t.name == "uint64" else a


class _Alias:
    """Exposes an array's memory through the array interface with the read-only flag off;
    holds the array, so the memory outlives the alias."""

    def __init__(self, a: np.ndarray):
        self.array = a
        self.__array_interface__ = {**a.__array_interface__,
                                    "data": (a.__array_interface__["data"][0], False)}


def _writable_alias(a: np.ndarray) -> np.ndarray:
    return np.asarray(_Alias(a))
