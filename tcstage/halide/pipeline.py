"""Halide pipelines written in Python, as functions tcstage compiles: `tc.from_halide`.

A `HalideFunction` wraps the output Funcs of a pipeline. Its arguments are the pipeline's own
ImageParams and Params, in `hl.Pipeline.infer_arguments` order; its outputs start at 0 and have
the shapes a call asks for (`output_shape=`), since Halide computes whatever region is
requested.

- On the CPU a call runs the pipeline with Halide's JIT as the user scheduled it (no schedule:
  Halide's defaults), through an `hl.Callable`, so the user's Params are never set or changed.
- For CUDA, `specialized(output_shape)` fixes the outputs' boxes and the result behaves like a
  TC function for `tc.compile` / `tc.autotune`: its Funcs become the scop's statements, and
  each Func's iteration domain is the region Halide's own bounds inference requires of it
  (`_native.required_regions`, backward from the output boxes).

What becomes a statement. Every Func is a tensor computed over its region, except *views*:
pure Funcs that only pass another Func's or an input's value through (the ImageParam wrappers
Halide makes, `lambda` wrappers and everything `hl.BoundaryConditions` builds: a read with
clamped or selected subscripts, or a constant outside). Views are inlined into their readers,
so a boundary condition becomes a guarded or clamped read of the input, which the polyhedral
model sees (exactly where its subscripts are affine, as a may-read where they are not) and the
promotion copies as any other read.

Data-dependent writes (a histogram's `h(clamp(in(r), 0, 255)) += 1`) are may-writes in the
model, along the dimensions whose subscripts read data: the dependences then order every pair
of updates that may touch one element, so the kernel runs them one after another where they
may collide and in parallel where they cannot (per-row histograms); no atomics are needed.

Layout as everywhere in tcstage: numpy arrays are row-major, Halide lists dimensions innermost
first; an input's dimension `k` (numpy order) is named `<input>.<k>` among the sizes.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import os
import re
from collections.abc import Mapping, Sequence

import attrs
import halide as hl
import numpy as np

from tcstage.errors import TCArgumentError, TCError, warn
from tcstage.halide import _native
from tcstage.halide.exprs import halide_type
from tcstage.halide.stderr import halide_notes_dropped
from tcstage.cpu.options import CpuSchedule
from tcstage.cpu.scheduler import (NotScheduled, downsamples, plan_stencils,
                                   schedule_pipeline)
from tcstage.cpu.structure import analyse
from tcstage.halide.jit import (AUTOSCHEDULERS, OUTPUT_ALIGNMENT, STRUCTURED, _load_autoscheduler,
                                aligned_empty, halide_buffer, quiet_unscheduled_updates)
from tcstage.halide.lower import HALIDE_FAILURES, Lowered
from tcstage.halide.ranges import FunctionRanges, StatementRanges, TensorBounds
from tcstage.halide.solver import (Tree, evaluate, inline_lets, read_names, simplify,
                                   tree_to_expr, tree_to_str, tree_vars)
from tcstage.lang import checked as C
from tcstage.lang.types import BOOL, SCALAR_TYPES, ScalarType
from tcstage.program import Binding, StatementReport, array_info

# What `HalideFunction.__call__` takes as `schedule=`, and what "auto" gives a pipeline nobody
# scheduled: of the wheel's autoschedulers, the one that schedules in well under a second and
# beat computing everything at the root on every ported app (benchmarks/results/halide-cpu-*).
PIPELINE_SCHEDULES = ("auto", "as_written", "root", STRUCTURED)  # (and the autoschedulers)
CPU_SCHEDULES = (*PIPELINE_SCHEDULES, *AUTOSCHEDULERS)
DEFAULT_AUTOSCHEDULER = "Mullapudi2016"
# The structured scheduler's settings for pipelines: every Func computed once. Inlining the
# pointwise ones, as for TC, turns a stencil chain into one expression of dozens of clamped
# reads, which Halide's loop partitioning took minutes to compile (erode: 25 reads).
PIPELINE_STRUCTURED = CpuSchedule().inlinePointwise(False)

_VIEW_WRAPPERS = ("likely", "likely_if_innermost", "promise_clamped", "unsafe_promise_clamped")


SHAPING_SIZE_MAX = 16  # the largest shaping size (`_shaping_sizes`) compiled in as a constant


@attrs.frozen(eq=False)
class CpuPipeline:
    """A pipeline JIT-compiled for the CPU: the Callable, the schedule applied ("as_written",
    "root" or an autoscheduler), the sizes it was planned for, and why it is not the schedule
    asked for (empty if it is)."""

    call: hl.Callable
    schedule: str
    planned_for: tuple = ()  # ((size name, value), ...)
    note: str = ""
    report: tuple = ()  # tcstage's structured scheduler: one line per Func
    compiled_in: tuple = ()  # ((size name, value), ...): sizes the code holds as constants

    def serves(self, sizes: Mapping[str, int]) -> bool:
        """Whether a call with these sizes may run this code (its constants agree)."""
        return all(sizes.get(n) == v for n, v in self.compiled_in)


@attrs.frozen
class Argument:
    """One argument of the pipeline: an input buffer (rank >= 1) or a scalar Param."""

    name: str
    type: ScalarType
    rank: int  # 0 for a scalar

    @property
    def is_buffer(self) -> bool:
        return self.rank > 0

    def describe(self) -> str:
        return f"{self.type}({', '.join(f'{self.name}.{k}' for k in range(self.rank))}) " \
               f"{self.name}" if self.rank else f"{self.type} {self.name}"


def scalar_type(text: str, where: str) -> ScalarType:
    """A Halide type string ('uint8', 'float32', 'bool') as a tcstage type."""
    if text == "bool":
        return BOOL
    t = SCALAR_TYPES.get(text)
    if t is None:
        raise TCError(f"{where} has Halide type {text}, which tcstage does not support "
                      f"(supported: {', '.join(sorted({s.name for s in SCALAR_TYPES.values()}))})")
    return t


def from_halide(outputs, name: str | None = None) -> "HalideFunction":
    """The Halide pipeline computing `outputs` (one `hl.Func` or a list) as a tcstage function.
    Its arguments are found in the pipeline (`hl.Pipeline.infer_arguments`); `name` defaults to
    the first output's name."""
    funcs = [outputs] if isinstance(outputs, hl.Func) else list(outputs) \
        if isinstance(outputs, (list, tuple)) else None
    if not funcs or not all(isinstance(f, hl.Func) for f in funcs):
        raise TCError(f"tc.from_halide takes one halide.Func or a list of them; got "
                      f"{type(outputs).__name__}" + (
                          f" holding {', '.join(sorted({type(f).__name__ for f in funcs}))}"
                          if funcs else ""))
    for f in funcs:
        if not f.defined():
            raise TCError(f"tc.from_halide: Func '{display_name(f.name())}' has no definition")
    if len({f.name() for f in funcs}) != len(funcs):
        raise TCError("tc.from_halide: the same Func is given twice among the outputs")
    fn = HalideFunction(funcs, name or display_name(funcs[0].name()))
    for problem in cuda_refusals(fn):  # (said now, not at the first compile for CUDA)
        warn(f"{problem}: the CPU runs it, the CUDA path refuses it (docs/halide.md, "
             "'Supported subset')")
    return fn


def cuda_refusals(fn: "HalideFunction") -> list[str]:
    """What in the pipeline the CUDA path cannot take, one line per Func and construct."""
    if fn._dump is None:
        return [f"'{fn.name}' uses a Halide construct the polyhedral flow cannot read "
                f"({fn._dump_error})"]
    out = []
    for f in fn._dump:
        name = f"Func '{display_name(f['name'])}' of '{fn.name}'"
        if f["extern"]:
            out.append(f"{name} has an extern definition, which the polyhedral flow cannot "
                       "see into")
    return out


def as_pipeline(source):
    """A bare hl.Func (or a list of them) as tc.from_halide would make it; anything else as
    it is."""
    if isinstance(source, hl.Func) or isinstance(source, (list, tuple)) and source and \
            all(isinstance(f, hl.Func) for f in source):
        return from_halide(source)
    return source


class HalideFunction:
    """A Halide pipeline as a tcstage function (see the module's documentation)."""

    def __init__(self, outputs: list, name: str, output_shapes: tuple | None = None):
        self.outputs = list(outputs)
        self.name = name
        self.fixed_output_shapes = output_shapes
        try:
            arguments = hl.Pipeline(self.outputs).infer_arguments()
        except HALIDE_FAILURES as e:
            raise TCError(f"Halide could not read the pipeline '{name}': {str(e).strip()}") from e
        try:
            self._dump, self._dump_error = _native.pipeline_functions(self.outputs), None
        except HALIDE_FAILURES as e:  # the CPU runs it; only the polyhedral flow needs this
            self._dump, self._dump_error = None, str(e).strip()
        self._callable_arguments = arguments
        self.arguments = tuple(
            Argument(a.name, scalar_type(str(a.type), f"argument '{a.name}'"), a.dimensions)
            for a in arguments)
        # The CPU kernels: the main one per schedule, those rescheduled for sizes where it
        # failed, and which of those serves which sizes (see _rerun).
        self._cpu_kernels: dict[str, CpuPipeline] = {}
        self._cpu_rescheduled: dict[str, list[CpuPipeline]] = {}
        self._cpu_serving: dict[tuple, CpuPipeline] = {}
        # Calls whose arguments passed the bounds checks, by sizes, Param values and output
        # shapes: Halide's bounds inference costs milliseconds, far more than most calls.
        self._checked_calls: set[tuple] = set()
        self._auto_schedule: str | None = None  # what schedule="auto" resolved to
        self._normalized: dict[tuple, tuple] = {}  # output_shape as given -> normalized
        self.last_cpu_kernel: CpuPipeline | None = None  # what the last CPU call ran
        self._checked = None

    @functools.cached_property
    def constants(self) -> tuple[Argument, ...]:
        """The hl.Buffers the definitions read directly (not ImageParams): inputs of the CUDA
        kernel that callers never pass, bound to the Buffer's values at each call
        (`constant_values`). The CPU runs them through Halide, as written."""
        return tuple(a for a, _ in self._constant_arrays())

    def constant_values(self) -> dict[str, np.ndarray]:
        return {a.name: array for a, array in self._constant_arrays()}

    def _constant_arrays(self) -> list[tuple[Argument, np.ndarray]]:
        try:
            found = _native.embedded_buffers(self.outputs)
        except HALIDE_FAILURES as e:
            raise TCError(f"Halide could not read the Buffers of '{self.name}': "
                          f"{str(e).strip()}") from e
        out = []
        for name, (type_text, dims, data) in sorted(found.items()):
            t = scalar_type(type_text, f"Buffer '{name}'")
            if not dims or any(lo != 0 for lo, _ in dims):
                raise TCError(f"'{self.name}' reads the Buffer '{name}', whose "
                              + ("mins are " + str(tuple(lo for lo, _ in reversed(dims)))
                                 if dims else "rank is 0") + "; the CUDA path takes embedded "
                              "Buffers of rank 1 or more starting at 0 (pass it as an input "
                              "instead)")
            shape = tuple(e for _, e in reversed(dims))
            out.append((Argument(name, t, len(dims)),
                        np.frombuffer(data, dtype=t.numpy).reshape(shape)))
        return out

    @property
    def _functions(self) -> list[dict]:
        """Every Func as data (`_native.pipeline_functions`), producers first."""
        if self._dump is None:
            raise TCError(f"'{self.name}' uses a Halide construct the polyhedral flow cannot "
                          f"read ({self._dump_error}); it runs on the CPU only")
        return self._dump

    def __repr__(self) -> str:
        args = ", ".join(a.describe() for a in self.arguments)
        outs = ", ".join(display_name(f.name()) for f in self.outputs)
        return f"<Halide pipeline {self.name}({args}) -> ({outs})>"

    # -- arguments -----------------------------------------------------------------------------
    def _positional(self, args: Sequence, named: Mapping) -> list:
        by_name = {a.name: a for a in self.arguments}
        if len(args) > len(self.arguments):
            raise TCArgumentError(f"'{self.name}' takes {len(self.arguments)} argument(s) "
                                  f"({', '.join(by_name)}); got {len(args)}")
        values = list(args) + [_MISSING] * (len(self.arguments) - len(args))
        for key, value in named.items():
            if key not in by_name:
                raise TCArgumentError(f"'{self.name}' has no argument '{key}'; its arguments "
                                      f"are {', '.join(by_name) or 'none'}")
            k = list(by_name).index(key)
            if values[k] is not _MISSING:
                raise TCArgumentError(f"argument '{key}' of '{self.name}' is given twice")
            values[k] = value
        missing = [a.name for a, v in zip(self.arguments, values) if v is _MISSING]
        if missing:
            raise TCArgumentError(f"'{self.name}' is missing argument(s) {', '.join(missing)} "
                                  f"(its arguments, in order: {', '.join(by_name)})")
        return values

    def bind(self, args: Sequence, out=None, shapes_only: bool = False, named=None,
             constants: bool = True) -> Binding:
        """args (positional) and named (by parameter name) checked against the pipeline's
        ImageParams and Params; with `constants`, the embedded Buffers' values too (inputs of
        the CUDA kernel; the CPU's Halide callable holds its own)."""
        sizes, scalars, arrays = {}, {}, {}
        for a, value in zip(self.arguments, self._positional(args, named or {})):
            if a.is_buffer:
                shape, dtype = _shape_and_dtype(a, value, shapes_only)
                if len(shape) != a.rank:
                    raise TCArgumentError(f"argument '{a.name}' of '{self.name}' has "
                                          f"{a.rank} dimension(s); got shape {shape}")
                if dtype is not None and dtype != a.type.numpy:
                    raise TCArgumentError(f"argument '{a.name}' of '{self.name}' holds "
                                          f"{a.type}; got an array of {dtype}")
                sizes.update({f"{a.name}.{k}": int(e) for k, e in enumerate(shape)})
                arrays[a.name] = None if shapes_only and not hasattr(value, "shape") else value
            else:
                scalars[a.name] = _scalar(self.name, a, value)
        if constants and self._dump is not None and self.constants:
            for name, array in self.constant_values().items():
                sizes.update({f"{name}.{k}": e for k, e in enumerate(array.shape)})
                arrays[name] = array
        return PipelineBinding(sizes, scalars, arrays, {})

    @property
    def specialized_scalars(self) -> frozenset:
        """Every Param: the regions Funcs are computed over may depend on any of them
        (bilateral_grid's grid depth is 1 / r_sigma), and the CUDA path fixes the regions at
        compile time, so a kernel serves one value of each."""
        return frozenset(a.name for a in self.arguments if not a.is_buffer)

    def _output_boxes(self, output_shape, arrays=None) -> tuple:
        if output_shape is None and self.fixed_output_shapes is None and arrays:
            # the arrays to write give the shapes (a Tuple's elements share their Func's)
            if len(arrays) == 1 or len(arrays) == len(self.outputs):
                output_shape = arrays[0].shape if len(arrays) == 1 else \
                    [getattr(a, "shape", None) for a in arrays]
        if output_shape is None:
            shapes = self.fixed_output_shapes
        else:
            # (a memo for one output's shape as a tuple of ints, the common call: normalizing
            # costs microseconds; only exact ints, as 3.0 and True would hit 3's and 1's entry)
            plain = type(output_shape) is tuple and all(type(e) is int for e in output_shape)
            shapes = self._normalized.get(output_shape) if plain else None
            if shapes is None:
                shapes = normalize_output_shapes(self, output_shape)
                if plain and len(self._normalized) < 256:
                    self._normalized[output_shape] = shapes
        if shapes is None:
            raise TCArgumentError(
                f"'{self.name}' is a Halide pipeline: give the size of its output with "
                f"output_shape=(...) or out=" + (" (one shape per output, in a list)"
                                         if len(self.outputs) > 1 else ""))
        return shapes

    def specialized(self, output_shape) -> "HalideFunction":
        """This pipeline with its output shapes fixed, as `tc.compile` and `tc.autotune` need."""
        shapes = normalize_output_shapes(self, output_shape)
        if shapes == self.fixed_output_shapes:
            return self
        fixed = copy.copy(self)  # the same pipeline: its arguments, dump and CPU code shared
        fixed.fixed_output_shapes = shapes
        return fixed

    # -- running on the CPU --------------------------------------------------------------------
    def __call__(self, *args, output_shape=None, out=None, schedule="auto", **named):
        """Runs the pipeline on the CPU with Halide's JIT. Arguments: numpy arrays and Python
        numbers, in `infer_arguments` order or by name. Returns an array, or a tuple for
        several outputs (a Tuple-valued output gives one array per element, in place). `out`:
        the arrays to write instead (as numpy's out=; their shapes give the output shapes).

        schedule (see `CPU_SCHEDULES`): "auto" (the default) runs a pipeline you scheduled as
        you scheduled it, and schedules one you did not (no split, loop type or compute level
        anywhere), planned for the first call's sizes: with tcstage's structure-aware
        scheduler where the pipeline is a contraction or a stencil pipeline (docs/halide.md),
        else with Halide's Mullapudi2016 autoscheduler.
        "as_written" always runs your schedule (Halide's defaults where there is none:
        everything inlined); "root" computes every intermediate Func at the root and nothing
        more; "tcstage" or an autoscheduler's name applies that one. Every schedule tcstage
        applies goes to a copy of the pipeline: your Funcs and Params are left as they
        were (docs/halide.md, CPU schedules)."""
        applied = self._resolve_schedule(schedule)
        given = None if out is None else [out] if isinstance(out, np.ndarray) else list(out)
        shapes = self._output_boxes(output_shape, given)
        b = self.bind(args, named=named, constants=False)
        call = (tuple(b.sizes.items()), tuple(b.scalars.items()), tuple(shapes))
        if call not in self._checked_calls:
            regions = self.required_regions(b, shapes)
            _check_inputs(self, b, regions)
            _check_outputs(self, regions, shapes, TCArgumentError)
            if len(self._checked_calls) > 4096:
                self._checked_calls.clear()
            self._checked_calls.add(call)
        keep, values = [], []
        for a in self.arguments:
            if a.is_buffer:
                keep.append(np.ascontiguousarray(b.arrays[a.name]))
                values.append(halide_buffer(keep[-1]))
            else:
                values.append(b.scalars[a.name])
        outs = []
        written = None if given is None else iter(self._given_outputs(given, shapes))
        for dtypes, shape in zip(self._output_dtypes, shapes):
            for dtype in dtypes:  # (a Tuple output: an array per element, in order)
                # (aligned: vectorised code may read an output back with aligned loads)
                outs.append(next(written) if written else aligned_empty(shape, dtype))
                values.append(halide_buffer(outs[-1]))
        sizes = (applied, tuple(sorted(b.sizes.items())), tuple(shapes))
        kernel = self._cpu_serving.get(sizes) or self._cpu_kernel(applied, b, shapes)
        try:
            kernel.call(*values)
        except HALIDE_FAILURES as e:
            if kernel.schedule in ("as_written", "root"):
                raise _refusal(self, str(e).strip(), shapes) from None
            kernel = self._rerun(applied, b, shapes, values, str(e).strip())
            if len(self._cpu_serving) > 4096:  # (a memo for loops over a few sizes)
                self._cpu_serving.clear()
            self._cpu_serving[sizes] = kernel
        self.last_cpu_kernel = kernel
        if given is not None:  # (an unaligned array the caller gave was written through a copy)
            for mine, theirs in zip(outs, given):
                if mine is not theirs:
                    theirs[...] = mine
            outs = given
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _given_outputs(self, arrays: list, shapes) -> list[np.ndarray]:
        """The arrays a call writes its outputs into (out=, as numpy's: one per output, one per
        element of a Tuple output), checked; an array Halide's aligned vector loads could
        fault on is replaced by an aligned one, copied back after the call."""
        wanted = [(shape, dtype) for dtypes, shape in zip(self._output_dtypes, shapes)
                  for dtype in dtypes]
        if len(arrays) != len(wanted):
            raise TCArgumentError(f"out= of '{self.name}' needs {len(wanted)} array(s), one per "
                                  f"output (and per element of a Tuple output); got "
                                  f"{len(arrays)}")
        given = []
        for k, (a, (shape, dtype)) in enumerate(zip(arrays, wanted)):
            if not isinstance(a, np.ndarray):
                raise TCArgumentError(f"out[{k}] of '{self.name}' must be a numpy array; got "
                                      f"{type(a).__name__}")
            if a.shape != tuple(shape) or a.dtype != dtype:
                raise TCArgumentError(f"out[{k}] of '{self.name}' must be a {dtype} array of "
                                      f"shape {tuple(shape)}; got {a.dtype} {a.shape}")
            if not (a.flags.c_contiguous and a.flags.writeable):
                raise TCArgumentError(f"out[{k}] of '{self.name}' must be a writeable C-order "
                                      "array (np.ascontiguousarray makes one)")
            aligned = a.ctypes.data % OUTPUT_ALIGNMENT == 0
            given.append(a if aligned else aligned_empty(shape, dtype))
        return given

    @functools.cached_property
    def _output_dtypes(self) -> tuple[tuple[np.dtype, ...], ...]:
        """Per output, the numpy dtype of each of its elements (one unless a Tuple)."""
        return tuple(tuple(scalar_type(str(t), f"output '{display_name(f.name())}'").numpy
                           for t in f.types()) for f in self.outputs)

    def explain(self, *args, output_shape=None, schedule="auto", **named) -> str:
        """The CPU schedule a call with these arguments runs: which one, for which sizes it was
        planned, and why, where it is not the one asked for."""
        self(*args, output_shape=output_shape, schedule=schedule, **named)
        k = self.last_cpu_kernel
        text = f"CPU schedule: {k.schedule}"
        if k.planned_for:
            text += " (planned for " + ", ".join(f"{n}={v}" for n, v in k.planned_for) + ")"
        lines = [text] + ([f"note: {k.note}"] if k.note else []) + list(k.report)
        # (Func names as written: Halide appends $<n> to make them unique in a process)
        return "\n  ".join(re.sub(r"\$\d+\b", "", line) for line in lines)

    def _rerun(self, applied: str, b: Binding, shapes, values: list, failed: str) -> "CpuPipeline":
        """Runs a call whose sizes the main kernel of `applied` failed at: an autoscheduler's
        splits, planned for larger sizes, can reach past smaller inputs. A kernel rescheduled
        for earlier such sizes is tried first, then one planned for these sizes (or the root
        schedule where that fails too). Returns the kernel that ran."""
        rescheduled = self._cpu_rescheduled.setdefault(applied, [])
        sizes = self._call_sizes(b, shapes)
        for kernel in rescheduled:
            if not kernel.serves(sizes):
                continue
            try:
                kernel.call(*values)
                return kernel
            except HALIDE_FAILURES:
                continue
        kernel = self._cpu_kernel(applied, b, shapes, failed=failed)
        try:
            kernel.call(*values)
        except HALIDE_FAILURES as e:
            why = f"{kernel.note}, and failed there too ({str(e).strip()})"
            target = hl.get_jit_target_from_environment()
            kernel = CpuPipeline(self._jit_or_error(self._root_copy(), target), "root", (), why)
            try:
                kernel.call(*values)
            except HALIDE_FAILURES as e2:  # (the algorithm's bounds, not a schedule's splits)
                raise _refusal(self, str(e2).strip(), shapes) from None
            warn(f"'{self.name}' runs with every intermediate Func computed at the root, "
                 f"unscheduled otherwise, on the CPU at these sizes: {why}")
        rescheduled.append(kernel)
        return kernel

    def _resolve_schedule(self, schedule) -> str:
        """What `schedule=` asks for: "as_written", "root", "tcstage" or an autoscheduler."""
        if schedule == "auto":
            if self._auto_schedule is None:  # (decided once: the first call compiles for it)
                try:
                    scheduled = _native.scheduled_functions(self.outputs)
                except HALIDE_FAILURES:
                    scheduled = ["?"]
                self._auto_schedule = "as_written" if scheduled else \
                    STRUCTURED if self._structured_fits else DEFAULT_AUTOSCHEDULER
            return self._auto_schedule
        if isinstance(schedule, str):
            named = {s.lower(): s for s in CPU_SCHEDULES}.get(schedule.lower())
            if named is not None and named != "auto":
                return named
        raise TCError(f"schedule must be one of {', '.join(map(repr, CPU_SCHEDULES))} for a "
                      f"Halide pipeline; got {schedule!r}")

    @functools.cached_property
    def _input_wrappers(self) -> dict[str, str]:
        """The Funcs through which Halide reads the input buffers (`NAME_im`, a pure read of
        the buffer at the Func's own arguments) -> the buffer's name."""
        buffers = {a.name for a in self.arguments if a.is_buffer}
        found = {}
        for d in self._dump or ():
            defs, args = d["definitions"], tuple(("var", v) for v in d["args"])
            if len(defs) == 1 and defs[0]["kind"] == "pure" and len(defs[0]["values"]) == 1:
                value = defs[0]["values"][0]
                if value[0] == "read" and value[1] in buffers and tuple(value[2]) == args:
                    found[d["name"]] = value[1]
        return found

    @functools.cached_property
    def _structured_fits(self) -> bool:
        """Whether schedule="auto" takes tcstage's structure-aware scheduler (tcstage/cpu/):
        it has a family for every Func, and the pipeline is a contraction (register tiles) or
        one line-buffered stencil group per output. Small-window reductions (a 13-tap sum,
        resampling kernels, a 3x3 depthwise filter), several strip groups and scatters go to
        Mullapudi2016, which tiles and fuses them."""
        if self._dump is None:
            return False
        try:
            structure = analyse(self.outputs, {d["name"] for d in self._dump
                                               if d["name"] not in self._input_wrappers})
        except HALIDE_FAILURES:
            return False
        if all(f.family in ("pointwise", "other") or f.window for f in structure.funcs):
            # the stencil family where the pipeline is line-buffered strip groups, one per
            # output and one per STENCIL_DEPTH stages of a longer chain, with tables of weights
            # beside them (blur, erode, stencil_chain, resize, a separable Gaussian).
            # Mullapudi2016's tiling and fusion did better here where other reads break it up
            # (a channel read from a 2-D Func, x/2 subscripts)
            outputs = {f.name() for f in self.outputs}
            plan = plan_stencils(structure, outputs)
            # (a window reduction whose readers' rows it does not follow, resize's first
            # pass when upsampling, is best computed once in strips of its own)
            windows = {f.name for f in structure.funcs if f.window}
            # (scatters and scans must be tables, a histogram, a cumulative sum: the Funcs
            # they read are computed once, as roots, in parallel strips)
            others = {f.name for f in structure.funcs if f.family == "other"}
            read_by_others = {r.func for f in structure.funcs if f.name in others
                              for r in f.reads}
            # (one more pass may stand alone, and any number where each is read downsampled,
            # as a pyramid's levels: interpolate 1.05-1.2x its manual schedule, against 1.8x
            # with Mullapudi2016; passes read at their own rates by several groups,
            # local_laplacian's or bilateral_grid's, Mullapudi2016 tiles and fuses better)
            # (scans down columns that an output's column strips compute per strip, and the
            # Funcs between, computed per row of a strip: max_filter's)
            by_columns = {n for scan, between in plan.column_strips.values()
                          for n in (scan, *between)}
            passes = set(plan.roots) - (outputs | set(plan.deep) | set(plan.tables) | windows
                                        | read_by_others | by_columns)
            # (a boundary condition in a line buffer, `_clamps_column`, alone makes no group)
            return bool(set(plan.members) - set(plan.clamped) or plan.transposers) and (
                len(passes) <= 1 or all(downsamples(structure, p) for p in passes)) and \
                set(plan.once) <= set(plan.tables) | set(plan.scans_at) | by_columns
        return "other" not in {f.family for f in structure.funcs} and \
            any(f.contraction for f in structure.funcs)

    def _call_sizes(self, b: Binding, shapes) -> dict[str, int]:
        """The sizes a kernel's constants are checked against: the inputs' and (a kernel may
        hold an output's channels) the outputs'."""
        return {**b.sizes, **dict(self._output_sizes(shapes))}

    def _output_sizes(self, shapes) -> tuple[tuple[str, int], ...]:
        """(`out.k`, extent) for every dimension of every output, in tcstage's (numpy) order."""
        return tuple(zip(self._output_size_names, itertools.chain.from_iterable(shapes)))

    @functools.cached_property
    def _output_size_names(self) -> tuple[str, ...]:
        # (made once: every call checks its kernel's constants against the outputs' sizes)
        return tuple(f"{display_name(f.name())}.{k}" for f in self.outputs
                     for k in range(f.dimensions()))

    def _cpu_kernel(self, applied: str, b: Binding, shapes, failed: str = "") -> "CpuPipeline":
        """The pipeline compiled for the CPU with schedule `applied`: the main one, which serves
        every call it can, or (`failed`: why the main one did not serve) one planned for these
        sizes."""
        requested = applied
        main = self._cpu_kernels.get(requested)
        other_constants = ""
        sizes = self._call_sizes(b, shapes)
        if main is not None and not failed:
            if main.serves(sizes):
                return main
            for kernel in self._cpu_rescheduled.get(requested, ()):
                if kernel.compiled_in and kernel.serves(sizes):
                    return kernel
            other_constants = ", ".join(f"{n}={v}" for n, v in main.compiled_in)
        planned = tuple(sorted(b.sizes.items())) + self._output_sizes(shapes)
        note = f"the schedule planned for other sizes failed at these ({failed}); " \
               f"{applied} planned for these" if failed else \
            f"the schedule planned first holds {other_constants} as constants; {applied} " \
            "planned for these" if other_constants else ""
        target = hl.get_jit_target_from_environment()
        if applied == "as_written":
            kernel = CpuPipeline(self._jit_or_error(self.outputs, target), applied)
        elif applied == "root":
            kernel = CpuPipeline(self._jit_or_error(self._root_copy(), target), applied, (),
                                 note)
        else:
            kernel = None
            if applied == STRUCTURED:
                try:
                    # (planned again after a failure: without the alignment that may have
                    # reached past an unclamped input)
                    realized, report, constants = self._structured_copy(b, shapes, target,
                                                                        align=not failed)
                    kernel = CpuPipeline(self._jit(realized, target), applied, planned, note,
                                         tuple(report), constants)
                except (NotScheduled, *HALIDE_FAILURES) as e:
                    why = e.message if isinstance(e, NotScheduled) else \
                        f"the structured schedule failed ({str(e).strip()}; a bug in tcstage)"
                    note = "; ".join(filter(None, [note, f"{why}; {DEFAULT_AUTOSCHEDULER} "
                                                         "scheduled it"]))
                    applied = DEFAULT_AUTOSCHEDULER
            if kernel is None:
                try:
                    copies = self._autoscheduled_copy(applied, b, shapes, target)
                    kernel = CpuPipeline(self._jit(copies, target), applied, planned, note)
                except HALIDE_FAILURES as e:
                    why = f"the {applied} autoscheduler failed on it ({str(e).strip()})"
                    why = "; ".join(filter(None, [note, why]))
                    warn(f"'{self.name}' runs with every intermediate Func computed at the "
                         f"root, unscheduled otherwise, on the CPU: {why}")
                    kernel = CpuPipeline(self._jit_or_error(self._root_copy(), target), "root",
                                         (), why)
        if other_constants:
            self._cpu_rescheduled.setdefault(requested, []).append(kernel)
        elif not failed:
            self._cpu_kernels[requested] = kernel
        return kernel

    def _copy(self, constants: Mapping[str, int] | None = None
              ) -> tuple[list[hl.Func], dict[str, hl.Func]]:
        """A deep copy of the pipeline: its outputs, and every Func by name (the outputs only
        where the dump could not read the pipeline); `constants`: Halide's names of sizes
        (`A.extent.0`) the copy holds as these values."""
        names = [f.name() for f in self.outputs]
        names += [d["name"] for d in self._dump or () if d["name"] not in names]
        funcs = {n: hl.Func(f"{display_name(n)}_copy") for n in names}
        _native.deep_copy(self.outputs, funcs, dict(constants or {}))
        return [funcs[f.name()] for f in self.outputs], funcs

    @functools.cached_property
    def _shaping_sizes(self) -> tuple[tuple[str, str], ...]:
        """The input sizes that shape the computation rather than bound it: an extent a
        subscript is divided by or taken modulo (a channel multiplier), or one a reduction
        domain spans (a filter's taps). Halide's name (`A.extent.0`) and tcstage's (`A.3`) of
        each. Compiled in as constants, they let Halide see dense vectors (`d / 1`) and
        fixed trip counts; a call with other values gets code of its own."""
        ranks = {a.name: a.rank for a in self.arguments if a.is_buffer}
        found: set[str] = set()

        def walk(t):
            if isinstance(t, tuple) and t and isinstance(t[0], str):
                if t[0] in ("div", "mod") and len(t) == 3:
                    found.update(tree_vars(t[2]))
                for child in t[1:]:
                    walk(child)
            elif isinstance(t, (tuple, list)):
                for child in t:
                    walk(child)

        for d in self._dump or ():
            for definition in d["definitions"]:
                walk(tuple(definition["values"]))
                walk(tuple(definition["args"]))
                for rvar in definition["rvars"]:
                    found.update(tree_vars(rvar[2]))
        shaping = []
        for name in sorted(found):
            buffer, _, k = name.rpartition(".extent.")
            if buffer in ranks and k.isdigit() and int(k) < ranks[buffer]:
                shaping.append((name, f"{buffer}.{ranks[buffer] - 1 - int(k)}"))
        return tuple(sorted(shaping, key=lambda names: names[1]))

    def _root_copy(self) -> list[hl.Func]:
        """A copy with every intermediate Func that is a tensor (not a view, `_split`) computed
        at the root."""
        copies, _ = self._copy()
        try:
            _, kept, _ = self._structure
        except TCError:  # (a construct only the CPU runs): every Func the dump has
            kept = self._dump or []
        outputs = {f.name() for f in copies}
        funcs = dict.fromkeys(f.get("tuple", f["name"]) for f in kept)  # (a Tuple's Func once)
        tensors = [name for name in funcs if name not in outputs]
        if tensors:
            _native.compute_root(copies, tensors)
        return copies

    def _structured_copy(self, b: Binding, shapes, target, align: bool = True
                         ) -> tuple[list[hl.Func], list[str], tuple]:
        """A copy scheduled by tcstage's structure-aware scheduler for these sizes: the Funcs to
        realize, its report, and the sizes it holds as constants (`_shaping_sizes`)."""
        # (only small ones, a filter's taps, a channel multiplier: a histogram's RDom over an
        # image's width gains nothing from a constant, and each new width would compile anew)
        shaping = [(theirs, ours) for theirs, ours in self._shaping_sizes
                   if b.sizes[ours] <= SHAPING_SIZE_MAX]
        compiled_in = tuple((ours, b.sizes[ours]) for _, ours in shaping)
        copies, funcs = self._copy({theirs: b.sizes[ours] for theirs, ours in shaping})
        # Halide reads an ImageParam through a wrapper Func, NAME_im: the scheduler takes those
        # as the inputs (it packs them; unscheduled, they stay inlined).
        wrappers = self._input_wrappers
        images = {wrappers[n]: f for n, f in funcs.items() if n in wrappers}
        funcs = {n: f for n, f in funcs.items() if n not in wrappers}
        regions = self.required_regions(b, shapes)
        extents = {name: tuple(hi - lo + 1 for lo, hi in reversed(region))
                   for name, region in regions.items() if name in funcs}
        # (and the inputs' extents, by the names Halide's trees give them: an RDom over an
        # input, a matrix product's, is that long)
        extents.update({f"{a.name}.extent.{a.rank - 1 - k}": (b.sizes[f"{a.name}.{k}"],)
                        for a in self.arguments if a.is_buffer for k in range(a.rank)})
        realized, report, held = schedule_pipeline(copies, funcs, images, PIPELINE_STRUCTURED,
                                                   target, extents, os.cpu_count() or 1,
                                                   stencils=True, align=align)
        # (an output's channels held at their extents: `_output_sizes`'s names)
        compiled_in += tuple((f"{display_name(self.outputs[k].name())}.{len(shapes[k]) - 1 - j}",
                              e) for k, j, e in held)
        if compiled_in:
            report = [*report, "sizes compiled in as constants: "
                      + ", ".join(f"{n}={v}" for n, v in compiled_in)]
        return realized, report, compiled_in

    def _autoscheduled_copy(self, applied: str, b: Binding, shapes, target) -> list[hl.Func]:
        """A copy scheduled by Halide's autoscheduler `applied`, planned for these sizes."""
        copies, funcs = self._copy()
        _load_autoscheduler(applied)
        for f, shape in zip(copies, shapes):
            f.set_estimates([(0, max(1, int(e))) for e in reversed(shape)])
        buffers = {a.name: [(0, max(1, b.sizes[f"{a.name}.{k}"]))
                            for k in reversed(range(a.rank))]
                   for a in self.arguments if a.is_buffer}
        scalars = {a.name: _halide_constant(a.type, b.scalars[a.name])
                   for a in self.arguments if not a.is_buffer and a.name in b.scalars}
        # All three take 'parallelism' (Adams2019 and Li2018 assume 16 cores otherwise).
        params = {"parallelism": str(os.cpu_count() or 1)}
        _native.with_estimates(copies, buffers, scalars, lambda: hl.Pipeline(copies)
                               .apply_autoscheduler(target, hl.AutoschedulerParams(applied,
                                                                                   params)))
        quiet_unscheduled_updates(funcs.values())
        return copies

    def _jit(self, outputs: list, target) -> hl.Callable:
        pipeline = hl.Pipeline(outputs)
        with halide_notes_dropped():  # (the stencil family's line buffers: see the module)
            return pipeline.compile_to_callable(self._callable_arguments, target)

    def _jit_or_error(self, outputs: list, target) -> hl.Callable:
        try:
            return self._jit(outputs, target)
        except HALIDE_FAILURES as e:
            raise TCError(f"Halide could not compile '{self.name}' for the CPU: "
                          f"{str(e).strip()}") from e

    # -- Halide's bounds inference -------------------------------------------------------------
    def required_regions(self, binding: Binding, shapes) -> dict:
        """{Func or input name: [(min, max)] in numpy order, inclusive}: Halide's bounds
        inference backward from the output boxes, for the sizes and integer Params bound."""
        known = {}
        for a in self.arguments:
            if a.is_buffer:
                for k in range(a.rank):
                    known[f"{a.name}.min.{a.rank - 1 - k}"] = 0
                    known[f"{a.name}.extent.{a.rank - 1 - k}"] = binding.sizes[f"{a.name}.{k}"]
            elif a.name in binding.scalars:
                known[a.name] = _halide_constant(a.type, binding.scalars[a.name])
        boxes = [[(0, e - 1) for e in reversed(s)] for s in shapes]
        try:
            found = _native.required_regions(self.outputs, boxes, known)
        except HALIDE_FAILURES as e:
            raise TCError(f"Halide's bounds inference failed on '{self.name}': "
                          f"{str(e).strip()}") from e
        return {name: [tuple(_constant(t, name) for t in dim) for dim in reversed(dims)]
                for name, dims in found.items()}

    # -- the polyhedral flow --------------------------------------------------------------------
    @functools.cached_property
    def _structure(self) -> tuple:
        return _split(self)

    @property
    def checked(self) -> C.Function:
        """A TC-shaped signature of the pipeline (inputs, outputs, intermediate tensors and
        one statement per Func definition) for the passes that read one."""
        if self._checked is None:
            self._checked = _signature(self)
        return self._checked

    def output_shapes(self, *args, output_shape=None, **named) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self._output_boxes(output_shape)]

    def ranges(self, *args, out=None, output_shape=None, **named) -> list[StatementReport]:
        """Per Func definition, the range of each loop variable (outermost first): the Func's
        region for its pure variables, the RDom's bounds for reduction variables."""
        shapes = self._output_boxes(output_shape)
        b = self.bind(args, out, shapes_only=True, named=named)
        lowered = self.specialized(shapes).lower(*args, **named)
        values = {h: b.sizes[s] for h, s in lowered.sizes.items()}
        reports = []
        for st, (tensor, k, _) in zip(self.checked.statements, lowered.order):
            d = lowered.defs[tensor][k]
            bounds = lowered.ranges.tensors[tensor]
            concrete = {}
            for v in st.indices:  # pure variables: the Func's region along their dimension
                dim = [a for a in reversed(d["args"])].index(("var", v))
                lo = bounds.mins[dim][1]
                concrete[v] = (lo, lo + bounds.extents[dim][1])
            for v, lo, extent in reversed(d["rvars"]):
                lo = evaluate(lo, values)
                concrete[v] = (lo, lo + evaluate(extent, values))
            reports.append(StatementReport(
                tensor, f"{tensor}({', '.join(tree_to_str(a) for a in reversed(d['args']))})",
                {v: f"{a} <= {v} < {b_}" for v, (a, b_) in concrete.items()}, concrete))
        return reports

    def output_mins(self, *args, out=None, output_shape=None, **named) -> list:
        return [(0,) * len(s) for s in self._output_boxes(output_shape)]

    def lowered_for(self, args, named, out=None, dynamic=()) -> "PipelineLowered":
        """`lower`, as TCFunction.lowered_for takes a call (a pipeline's Funcs are Halide's
        own: an empty input is not told apart)."""
        return self.lower(*args, out=out, **named)

    def lower(self, *args, out=None, **named) -> "PipelineLowered":
        """The pipeline as the polyhedral middle end reads it, for these arguments' sizes."""
        shapes = self._output_boxes(None)
        b = self.bind(args, out, shapes_only=True, named=named)
        regions = self.required_regions(b, shapes)
        _check_inputs(self, b, regions)
        return _lower(self, b, shapes, regions)

    def describe(self) -> str:
        """Every Func's definitions, producers first, innermost dimension first as Halide
        writes them (the ImageParam and BoundaryConditions Funcs included)."""
        def text(t) -> str:
            return tree_to_str(_rewrite(inline_lets(t), lambda n: (
                "read", display_name(n[1]), n[2]) if n[0] == "read" else None))

        lines = []
        for f in self._functions:
            name = display_name(f["name"])
            lines.append(f"Func {name} ({', '.join(f['types'])}), arguments innermost first:")
            lines += [_definition_line(name, d, text) for d in f["definitions"]]
        return "\n".join(lines)

    @property
    def fingerprint(self) -> str:
        """A hash of the pipeline's definitions, arguments and output shapes (the key of
        compiled kernels and tuned options, as `tune.cache.tc_hash` is for TC)."""
        text = repr((_canonical(self._functions), self.fixed_output_shapes,
                     [(a.name, a.type.name, a.rank) for a in (*self.arguments,
                                                               *self.constants)]))
        return hashlib.sha256(text.encode()).hexdigest()


_MISSING = object()


@attrs.frozen
class PipelineBinding(Binding):
    """A pipeline's arguments; its specialisation keeps float Params exact (a kernel compiled
    for r_sigma = 0.1 must not serve 0.15)."""

    def specialization(self, fn) -> tuple:
        return tuple(sorted((s, self.scalars[s].item() if hasattr(self.scalars[s], "item")
                             else self.scalars[s]) for s in fn.specialized_scalars))


def _halide_constant(t: ScalarType, value) -> hl.Expr:
    """A Param's value as a Halide constant of its type."""
    if t.is_float:
        return hl.cast(halide_type(t), hl.f64(float(value)))
    if t.kind == "bool":
        return hl.cast(hl.Bool(), hl.u8(int(bool(value))))
    return hl.cast(hl.Int(t.bits) if t.kind == "int" else hl.UInt(t.bits), hl.i64(int(value)))


def _value_tree(t: ScalarType, value) -> Tree:
    """A Param's value as a tree of its type (the form `_native.to_tree` gives constants)."""
    if t.is_float:
        v = ("float", float(np.dtype(t.numpy).type(value)))
        return v if t.name == "float32" else ("cast", t.name, v)
    if t.kind == "bool":
        return ("int", bool(value))
    v = ("int", int(value))
    return v if t.name == "int32" else ("cast", t.name, v)


def _canonical(functions: list[dict]) -> list:
    """The definitions with Func and RDom variable names replaced by their positions: Halide
    numbers both by creation order within the process (`blur$3`, `r12$x`)."""
    funcs = {f["name"]: f"f{k}" for k, f in enumerate(functions)}
    out = []
    for f in functions:
        for d in f["definitions"]:
            rvars = {n: f"r{k}" for k, (n, _, _) in enumerate(d["rvars"])}

            def canon(t):
                return _rewrite(t, lambda n: ("read", funcs.get(n[1], n[1]), n[2])
                                if n[0] == "read" else ("var", rvars[n[1]])
                                if n[0] == "var" and n[1] in rvars else None)

            out.append((funcs[f["name"]], f["args"], f["types"], d["kind"],
                        [canon(t) for t in (*d["args"], *d["values"], d["predicate"])],
                        [(canon(lo), canon(e)) for _, lo, e in d["rvars"]]))
    return out


def normalize_output_shapes(fn: HalideFunction, output_shape) -> tuple:
    """One shape per output, as a tuple of tuples of non-negative ints."""
    shapes = output_shape
    if len(fn.outputs) == 1 and _is_shape(shapes):
        shapes = [shapes]
    if not isinstance(shapes, (list, tuple)) or len(shapes) != len(fn.outputs) or \
            not all(_is_shape(s) for s in shapes):
        outs = ", ".join(f.name() for f in fn.outputs)
        raise TCArgumentError(f"output_shape of '{fn.name}' must be " + (
            "a tuple of sizes" if len(fn.outputs) == 1 else
            f"a list of {len(fn.outputs)} shapes, one per output ({outs})") +
            f"; got {output_shape!r}")
    result = []
    for f, s in zip(fn.outputs, shapes):
        if len(s) != f.dimensions():
            raise TCArgumentError(f"output '{display_name(f.name())}' of '{fn.name}' has "
                                  f"{f.dimensions()} dimension(s); output_shape gives {tuple(s)}")
        if any(int(e) < 1 for e in s):
            raise TCArgumentError(f"output_shape {tuple(s)} of '{display_name(f.name())}' has a "
                                  "size below 1")
        result.append(tuple(int(e) for e in s))
    return tuple(result)


def _is_shape(s) -> bool:
    return isinstance(s, (list, tuple)) and all(
        isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in s)


def _shape_and_dtype(a: Argument, value, shapes_only: bool):
    if shapes_only and _is_shape(value):
        return tuple(int(e) for e in value), None
    info = array_info(value)
    if info is None:
        raise TCArgumentError(f"argument '{a.name}' is an input buffer of {a.type}; expected "
                              f"an array, got {type(value).__name__}")
    return info


def _scalar(fn: str, a: Argument, value):
    if hasattr(value, "shape") and getattr(value, "shape", ()) != ():
        raise TCArgumentError(f"argument '{a.name}' of '{fn}' is a scalar {a.type}; got an "
                              f"array of shape {value.shape}")
    if isinstance(value, (bool, np.bool_)) and a.type.kind != "bool":
        raise TCArgumentError(f"argument '{a.name}' of '{fn}' is {a.type}; got a bool")
    if a.type.is_int and a.type.kind != "bool":
        if not isinstance(value, (int, np.integer)):
            raise TCArgumentError(f"argument '{a.name}' of '{fn}' is {a.type}; got "
                                  f"{type(value).__name__} {value!r}")
        low, high = _int_range(a.type.numpy)
        if not low <= int(value) <= high:
            raise TCArgumentError(f"argument '{a.name}' of '{fn}' is {a.type}; {value} does "
                                  "not fit")
        return int(value)
    if not isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_)):
        raise TCArgumentError(f"argument '{a.name}' of '{fn}' is {a.type}; got "
                              f"{type(value).__name__}")
    return value


@functools.lru_cache(maxsize=None)
def _int_range(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _constant(t, name: str) -> int:
    if t is not None and t[0] != "int":  # (an extent under strict_float: see _folded)
        t = _folded(t)
    if t is None or t[0] != "int":
        raise TCError(f"Halide's bounds inference gives '{name}' a region that is not a "
                      f"constant ({'unbounded' if t is None else tree_to_str(t)}) for these "
                      "sizes: bound its subscripts (clamp them, or read through a "
                      "BoundaryCondition)")
    return int(t[1])


def _check_inputs(fn: HalideFunction, b: Binding, regions: dict) -> None:
    """Every input region the pipeline reads lies within the array bound to it."""
    for a in fn.arguments:
        if not a.is_buffer or a.name not in regions:
            continue
        shape = tuple(b.sizes[f"{a.name}.{k}"] for k in range(a.rank))
        for k, ((lo, hi), extent) in enumerate(zip(regions[a.name], shape)):
            if lo < 0 or hi >= extent:
                raise TCArgumentError(
                    f"'{fn.name}' reads input '{a.name}' at indices {lo}..{hi} along dimension "
                    f"{k} (numpy order) for these output shapes, and '{a.name}' has shape "
                    f"{shape}", notes=("give a larger input or a smaller output_shape, or read "
                                       "the input through hl.BoundaryConditions",))


def _check_outputs(fn: HalideFunction, regions: dict, shapes, error=TCError) -> None:
    """Each output is needed only over the box asked for: Halide computes an output over its
    buffer, and refuses a call where the pipeline writes or reads one beyond it."""
    for f, shape in zip(fn.outputs, shapes):
        region = regions.get(f.name())
        if region and any(lo < 0 or hi >= e for (lo, hi), e in zip(region, shape)):
            raise error(_outside_output(fn, f.name(), region, shape))


_ACCESSED = re.compile(r"(Input|Output) buffer (\S+) is accessed at (-?\d+), which is "
                       r"(?:before the min|beyond the max) \((-?\d+)\) in dimension (\d+)")


def _refusal(fn: HalideFunction, failed: str, shapes) -> TCArgumentError:
    """The error for a call Halide's JIT refused. Halide bounds what an update writes from its
    index expressions alone, more loosely than tcstage's check before the call (which bounds
    a Func's values too): `f[clamp(1 / g[x], 0, 7)] += 1` writes indices 0..1 for any g, and
    Halide's runtime check counts -1..1. Such a refusal is said in numpy terms."""
    m = _ACCESSED.search(failed)
    if m is None:
        return TCArgumentError(f"running '{fn.name}' failed: {failed}")
    kind, name, at, _, dim = m.groups()
    rank = {f.name(): f.dimensions() for f in fn.outputs}.get(name) if kind == "Output" else \
        next((a.rank for a in fn.arguments if a.name == name), None)
    where = f"dimension {rank - 1 - int(dim)} (numpy order)" if rank else f"dimension {dim}"
    shape = dict(zip((f.name() for f in fn.outputs), shapes)).get(name)
    if kind == "Output":
        return TCArgumentError(
            f"Halide refuses to run '{fn.name}': by its bounds, output '{display_name(name)}' "
            f"is needed at index {at} along {where}, outside its output_shape {shape}",
            notes=("Halide bounds an update's writes and other Funcs' reads from their index "
                   "expressions, not from the values those take; clamp the indices into the "
                   "output's box, or ask for a larger output_shape",))
    return TCArgumentError(
        f"Halide refuses to run '{fn.name}': by its bounds, input '{display_name(name)}' is "
        f"read at index {at} along {where}, outside the array given",
        notes=("give a larger input, or read it through hl.BoundaryConditions",))


def _outside_output(fn: HalideFunction, name: str, region, shape) -> str:
    """Why output `name` is needed over `region`, beyond its output_shape: its updates write
    there, or other Funcs read it there (an output that another output reads)."""
    readers = sorted(display_name(d["name"]) for d in fn._dump or ()
                     if d["name"] != name and _reads(d["definitions"], name))
    updates = any(d["name"] == name and len(d["definitions"]) > 1 for d in fn._dump or ())
    why = [w for w, found in (("its updates write there", updates or not readers),
                              (f"{', '.join(map(repr, readers))} read it there", readers))
           if found]
    return (f"output '{display_name(name)}' of '{fn.name}' is needed over {_box_text(region)} "
            f"(numpy order), beyond its output_shape {shape}: {' and '.join(why)}; Halide "
            f"computes an output over the box asked for only, so ask for a larger output_shape")


def _reads(tree, name: str) -> bool:
    """Whether a definition (nested tuples, lists and dicts) reads Func `name`."""
    if isinstance(tree, dict):
        return any(_reads(v, name) for v in tree.values())
    if isinstance(tree, (tuple, list)):
        if len(tree) > 1 and tree[0] == "read" and isinstance(tree[1], str) and \
                tree[1].partition("#")[0] == name:  # (f#k: an element of Tuple f)
            return True
        return any(_reads(v, name) for v in tree)
    return False


# -- the scop's view of the pipeline ---------------------------------------------------------


@attrs.define(eq=False)
class PipelineLowered(Lowered):
    """`Lowered` for a Halide pipeline: definitions come from the native dump (views inlined,
    input mins 0, integer Params as their values), not from Funcs lowered by tcstage."""

    defs: dict = attrs.Factory(dict)  # tensor -> its definitions (func_definitions format)
    read_names: dict = attrs.Factory(dict)  # Func or buffer name in the trees -> tensor
    sizes: dict = attrs.Factory(dict)  # Halide extent symbol -> size name

    def definitions(self, tensor: str) -> list[dict]:
        return self.defs[tensor]

    def halide_names(self) -> dict[str, str]:
        return dict(self.read_names)

    def size_symbols(self) -> dict[str, str]:
        return dict(self.sizes)

    def describe(self) -> str:
        lines = []
        for tensor, defs in self.defs.items():
            t = self.fn.tensors[tensor]
            b = self.ranges.tensors[tensor]
            box = ", ".join(f"{lo[1]}..{lo[1] + e[1] - 1}"  # innermost first, as the arguments
                            for lo, e in reversed(list(zip(b.mins, b.extents))))
            lines.append(f"Func {tensor} ({t.kind}, {t.type}) over [{box}], arguments "
                         "innermost first:")
            lines += [_definition_line(tensor, d, tree_to_str) for d in defs]
        return "\n".join(lines)


def _definition_line(name: str, d: dict, text) -> str:
    """`  f(args) = value where <RDom bounds> if <predicate>`, trees printed by `text`."""
    lhs = ", ".join(text(a) for a in d["args"])
    value = ", ".join(text(v) for v in d["values"])
    rdom = "".join(f" where {text(lo)} <= {n} < {text(lo)} + {text(ext)}"
                   for n, lo, ext in d["rvars"])
    pred = "" if d["predicate"] == ("int", True) else f" if {text(d['predicate'])}"
    return f"  {name}({lhs}) = {value}{rdom}{pred}"


def _is_view(f: dict, outputs: set) -> bool:
    """A pure Func that passes one read through: `g(x) = h(x)`, a read with computed
    subscripts (clamped, mirrored), or a select between such a read and constants."""
    if f["name"] in outputs or len(f["definitions"]) != 1 or len(f["types"]) != 1:
        return False
    d = f["definitions"][0]
    if d["rvars"] or d["predicate"] != ("int", True) or \
            any(a != ("var", n) for a, n in zip(d["args"], f["args"])):
        return False

    def passes(t) -> bool:
        tag = t[0]
        if tag == "read":
            return True
        if tag == "call" and t[1] in _VIEW_WRAPPERS:
            return passes(t[2][0])
        if tag == "select":
            branches = [b for b in t[2:] if not _constant_tree(b)]
            return len(branches) == 1 and passes(branches[0])
        return False

    return passes(inline_lets(d["values"][0]))


def _constant_tree(t) -> bool:
    return t[0] in ("int", "float") or t[0] == "cast" and t[2][0] in ("int", "float")


def _rewrite(tree, leaf):
    """tree with every node that `leaf` maps (to a non-None tree) replaced, bottom-up after
    children."""
    if not isinstance(tree, tuple) or not tree:
        return tree
    tag = tree[0]
    if tag in ("int", "float", "var"):
        out = tree
    elif tag in ("read", "call"):
        out = (tag, tree[1], tuple(_rewrite(a, leaf) for a in tree[2]))
    elif tag == "cast":
        out = ("cast", tree[1], _rewrite(tree[2], leaf))
    elif tag == "let":
        out = ("let", tree[1], _rewrite(tree[2], leaf), _rewrite(tree[3], leaf))
    else:
        out = (tag, *(_rewrite(c, leaf) for c in tree[1:]))
    new = leaf(out)
    return out if new is None else new


def _substitute(tree, values: Mapping[str, Tree]):
    return _rewrite(tree, lambda t: values.get(t[1]) if t[0] == "var" else None)


def display_name(name: str) -> str:
    """A Func's name as its author wrote it: Halide appends `$<n>` to make names unique."""
    return re.sub(r"\$\d+$", "", name)


def _tensor_names(fn: HalideFunction, kept: list[dict]) -> dict[str, str]:
    """Func name -> a C identifier for its tensor, unique among the arguments' names."""
    used = {a.name for a in (*fn.arguments, *fn.constants)}
    names = {}
    for f in kept:
        base = re.sub(r"\W", "_", display_name(f["name"])) or "f"
        name, k = base, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names[f["name"]] = name
    return names


def _split(fn: HalideFunction):
    """(views by name, the Funcs that become tensors, producers first, tensor name of each
    Func); computed once per pipeline (`HalideFunction._structure`)."""
    outputs = {f.name() for f in fn.outputs}
    refused = cuda_refusals(fn)
    if refused:
        raise TCError(refused[0])
    views, kept = {}, []
    for f in fn._functions:
        if _is_view(f, outputs):
            views[f["name"]] = f
        else:
            kept += _elements(f)
    return views, kept, _tensor_names(fn, kept)


def _elements(f: dict) -> list[dict]:
    """A Tuple-valued Func as one Func per element, `name#k` (as the trees read them), each a
    tensor of its own; a Func of one value as it is."""
    if len(f["types"]) == 1:
        return [f]
    return [{**f, "name": f"{f['name']}#{k}", "types": [t], "tuple": f["name"],
             "definitions": [{**d, "values": (d["values"][k],)} for d in f["definitions"]]}
            for k, t in enumerate(f["types"])]


def _statement_order(fn: HalideFunction, kept: list[dict]) -> list[tuple[dict, int, tuple]]:
    """(Func, definition index, the loop nest it shares) per statement, in program order. A
    Tuple's elements run one definition at a time, all of one definition in one loop nest
    (Halide updates them together, point by point), an element that reads another element
    before it: each reads the others' values from before the definition, as Halide evaluates
    every value before it stores any."""
    out, i = [], 0
    while i < len(kept):
        f = kept[i]
        if "tuple" not in f:
            out += [(f, k, None) for k in range(len(f["definitions"]))]
            i += 1
            continue
        elements = [g for g in kept[i:] if g.get("tuple") == f["tuple"]]
        i += len(elements)
        for k in range(len(f["definitions"])):
            out += [(g, k, (f["tuple"], k)) for g in _readers_first(fn, elements, k)]
    return out


def _readers_first(fn: HalideFunction, elements: list[dict], k: int) -> list[dict]:
    names = {g["name"] for g in elements}
    reads = {g["name"]: (read_names(g["definitions"][k]["values"][0]) & names) - {g["name"]}
             for g in elements}
    order: list[dict] = []
    while len(order) < len(elements):
        placed = {g["name"] for g in order}
        ready = [g for g in elements if g["name"] not in placed and all(
            h in placed for h in names if g["name"] in reads[h])]
        if not ready:
            raise TCError(f"definition {k} of the Tuple Func '{display_name(elements[0]['tuple'])}'"
                          f" of '{fn.name}' has elements that read each other in a cycle; the "
                          "CUDA path writes one element after another and cannot order them")
        order.append(ready[0])
    return order


def _output_tensors(fn: HalideFunction, names: dict) -> list[list[str]]:
    """Per output Func, its tensors (one per Tuple element)."""
    return [[names[e["name"]] for e in _elements({"name": f.name(), "types": f.types(),
                                                   "definitions": []})] for f in fn.outputs]


def _signature(fn: HalideFunction) -> C.Function:
    _, kept, names = fn._structure
    outputs = [t for ts in _output_tensors(fn, names) for t in ts]
    tensors, inputs, size_vars = {}, [], {}
    for a in (*fn.arguments, *fn.constants):
        dims = tuple(f"{a.name}.{k}" for k in range(a.rank))
        tensors[a.name] = C.Tensor(a.name, "input", a.type, dims,
                                   constant=a in fn.constants)
        inputs.append(tensors[a.name])
        size_vars.update({d: (a.name, k) for k, d in enumerate(dims)})
    statements = []
    for f in kept:
        name = names[f["name"]]
        t = scalar_type(f["types"][0], f"Func '{display_name(f['name'])}'")
        tensors[name] = C.Tensor(name, "output" if name in outputs else "temp", t,
                                 ("",) * len(f["args"]))
    for f, k, _ in _statement_order(fn, kept):
        d = f["definitions"][k]
        indices = tuple(a[1] for a in reversed(d["args"]) if a[0] == "var" and a[1] in f["args"])
        rvars = tuple(n for n, _, _ in reversed(d["rvars"]) if n not in indices)
        t = tensors[names[f["name"]]].type
        statements.append(C.Statement(names[f["name"]], indices, rvars, None, False,
                                      C.Const(0, t), (), k == 0))
    return C.Function(fn.name, tuple(inputs), tuple(outputs), tensors, size_vars,
                      tuple(statements))


def _lower(fn: HalideFunction, b: Binding, shapes, regions: dict) -> PipelineLowered:
    views, kept, names = fn._structure
    checked = fn.checked
    known: dict[str, Tree] = {}
    for a in (*fn.arguments, *fn.constants):
        if a.is_buffer:
            known.update({f"{a.name}.min.{k}": ("int", 0) for k in range(a.rank)})
        elif a.name in fn.specialized_scalars:
            known[a.name] = _value_tree(a.type, b.scalars[a.name])

    def inline(tree):
        def leaf(t):
            if t[0] == "call" and t[1] in _VIEW_WRAPPERS:
                return t[2][0]
            if t[0] == "var":
                return known.get(t[1])
            if t[0] == "read" and t[1] in views:
                v = views[t[1]]
                value = inline_lets(v["definitions"][0]["values"][0])
                return inline(_substitute(value, dict(zip(v["args"], t[2]))))
            return None
        return _rewrite(inline_lets(tree), leaf)

    defs, order, var_names, statement = {}, [], [], 0
    bounds = {}
    for a in (*fn.arguments, *fn.constants):
        if a.is_buffer:
            bounds[a.name] = TensorBounds(tuple(("int", 0) for _ in range(a.rank)),
                                          tuple(("var", f"{a.name}.{k}") for k in range(a.rank)))
    shape_of = {t: shape for ts, shape in zip(_output_tensors(fn, names), shapes) for t in ts}
    order_of = _statement_order(fn, kept)
    together = {(f["name"], k): key for f, k, key in order_of}
    for f in kept:
        tensor = names[f["name"]]
        func = f.get("tuple", f["name"])  # (Halide's regions are per Func)
        region = regions.get(func)
        if region is None:  # nothing the outputs need reads it
            region = [(0, -1)] * len(f["args"])
        if tensor in shape_of:
            shape = shape_of[tensor]
            if any(lo != 0 or hi != e - 1 for (lo, hi), e in zip(region, shape)):
                raise TCError(_outside_output(fn, func, region, shape))
        bounds[tensor] = TensorBounds(tuple(("int", lo) for lo, _ in region),
                                      tuple(("int", hi - lo + 1) for lo, hi in region))
        defs[tensor] = []
        for k, d in enumerate(f["definitions"]):
            rewritten = {  # (what the domain is made of folded: it must be affine)
                "kind": d["kind"], "args": tuple(_folded(inline(a)) for a in d["args"]),
                "values": tuple(inline(v) for v in d["values"]),
                "predicate": _folded(inline(d["predicate"])),
                "rvars": tuple((n, _folded(inline(lo)), _folded(inline(e)))
                               for n, lo, e in d["rvars"])}
            if all(v == _UNDEF for v in rewritten["values"]):
                # hl.undef: the definition writes nothing (its elements are left for the
                # updates to write; reading one first is undefined in Halide too)
                rewritten.update(predicate=("lt", ("int", 1), ("int", 0)), values=tuple(
                    _value_tree(scalar_type(t, f"Func '{display_name(f['name'])}'"), 0)
                    for t in f["types"]))
            rewritten["together"] = together[(f["name"], k)]
            defs[tensor].append(rewritten)
    for f, k, _ in order_of:
        order.append((names[f["name"]], k, statement))
        var_names.append({n: n.replace("$", ".") for n, _, _ in f["definitions"][k]["rvars"]})
        statement += 1
    read_names = {f["name"]: names[f["name"]] for f in kept}
    buffers = [a for a in (*fn.arguments, *fn.constants) if a.is_buffer]
    read_names.update({a.name: a.name for a in buffers})
    sizes = {f"{a.name}.extent.{a.rank - 1 - k}": f"{a.name}.{k}"
             for a in buffers for k in range(a.rank)}
    spec = b.specialization(fn)
    ranges = FunctionRanges(tuple(StatementRanges(t, {}) for t, _, _ in order), bounds, (),
                            spec, {})
    return PipelineLowered(checked, ranges, {}, {}, {t: None for t in defs}, [], order,
                           var_names, {}, defs=defs, read_names=read_names, sizes=sizes)


_UNDEF = ("call", "undef", ())


_STRICT = {"strict_add": "add", "strict_sub": "sub", "strict_mul": "mul", "strict_div": "div",
           "strict_min": "min", "strict_max": "max", "strict_lt": "lt", "strict_le": "le",
           "strict_eq": "eq"}


def _plain_float(t: Tree) -> Tree | None:
    return (_STRICT[t[1]], *t[2]) if t[0] == "call" and t[1] in _STRICT else None


def _folded(tree: Tree) -> Tree:
    """tree with each constant part computed by Halide's simplifier, in its own types: an RDom
    extent from a float Param (`ceil(3 * sigma)`), once the Param's value is in, is a number
    the polyhedral model can use."""
    if tree[0] == "var" or _constant_tree(tree):
        return tree
    if not tree_vars(tree) and not read_names(tree):
        try:  # (strict_float's operations on constants round as the plain ones do: each is
            # one IEEE operation; Halide's simplifier folds only the plain ones)
            return simplify(tree_to_expr(_rewrite(tree, _plain_float), {}))
        except (ValueError, RuntimeError):  # (a call Halide cannot rebuild: left as it is)
            return tree
    if tree[0] in ("read", "call"):
        return (tree[0], tree[1], tuple(_folded(a) for a in tree[2]))
    if tree[0] == "cast":
        return ("cast", tree[1], _folded(tree[2]))
    if tree[0] == "let":
        return tree
    return (tree[0], *(_folded(a) for a in tree[1:]))


def _box_text(region) -> str:
    return "[" + ", ".join(f"{lo}..{hi}" for lo, hi in region) + "]"
