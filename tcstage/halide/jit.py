"""The CPU back end: Halide's JIT, with tcstage's structure-aware schedule or one of the
wheel's autoschedulers.

A `CpuKernel` is one TC function compiled by Halide's JIT. By default it is shape-generic: the
input extents stay symbolic in the pipeline (only the sizes the signature fixes, such as
`float(N, 3)`, are bounds), the first call's shapes are the sizes the schedule is planned for
(and the autoschedulers' `set_estimates`, which bake nothing in), and every call allocates its
outputs for its own shapes, so one kernel serves every set of sizes. A kernel specialised to
shapes (`specialize_shapes=True`) has its inputs' bounds set to them as well, and serves only
those. The default schedule is tcstage's own (`tcstage/cpu/`, docs/cpu.md), a `CpuSchedule`;
a pipeline it has no family for goes to Mullapudi2016. Mullapudi2016, Adams2019 and Li2018 can
be asked for by name, and `schedule=None` gives Halide's unscheduled code (every tensor computed
at the root). A schedule that fails (an autoscheduler that rejects the pipeline, or code that
touches elements beyond small arrays) falls back to unscheduled code, with a `TCWarning`: for
good when the autoscheduler fails; when the code fails at some sizes (a schedule planned for
large sizes, run at sizes below its tiles or splits), a second schedule planned for small sizes
is tried first (see `CpuKernel`). Kernels are called through a Halide Callable.

Arrays go to Halide as they are where it can take them (read-only ones included) and as
C-ordered, aligned, native-endian copies where it cannot; tensors beyond Halide's int32
indexing (2**31 - 1 elements) are refused, checked for every call's sizes.
"""

from __future__ import annotations

import ctypes
import difflib
import math
import os
import re
from collections.abc import Mapping

import attrs
import halide as hl
import ml_dtypes
import numpy as np

from tcstage.cpu.options import CpuSchedule
from tcstage.cpu.scheduler import NotScheduled, RoundedRows, schedule_pipeline
from tcstage.errors import TCArgumentError, TCError, warn
from tcstage.halide.lower import HALIDE_FAILURES, Lowered, lower, scalar_argument, storage_type
from tcstage.halide import _native, aot
from tcstage.halide.solver import evaluate
from tcstage.halide.stderr import halide_notes_dropped

AUTOSCHEDULERS = ("Mullapudi2016", "Adams2019", "Li2018")
# tcstage's own structure-aware scheduler (tcstage/cpu/): CpuSchedule() with every parameter
# chosen from the TC's structure; the autoscheduler below takes the pipelines it has no family for.
STRUCTURED = "tcstage"
DEFAULT_SCHEDULE = STRUCTURED
FALLBACK_AUTOSCHEDULER = "Mullapudi2016"
_STRUCTURED_DEFAULT = CpuSchedule()
_loaded_plugins: set[str] = set()
# Halide addresses a buffer with int32 element indices (and allocates at most 2**31 - 1 bytes
# unless the target has LargeBuffers).
MAX_ELEMENTS = 2**31 - 1


def schedule_name(schedule) -> str | CpuSchedule | None:
    """What a `schedule=` argument asks for: a `CpuSchedule` (given as one, as its text, or as
    'tcstage' for the scheduler's own choices), an autoscheduler's name (any case), or None (None
    or 'none': no schedule)."""
    if schedule is None or isinstance(schedule, CpuSchedule):
        return schedule
    if isinstance(schedule, str):
        word = schedule.strip()
        if word.lower() == "none":
            return None
        if word.lower() == STRUCTURED:
            return _STRUCTURED_DEFAULT
        if "CpuSchedule" in word or word.startswith("."):
            return CpuSchedule.parse(word)
        for name in AUTOSCHEDULERS:
            if word.lower() == name.lower():
                return name
    names = [STRUCTURED, *AUTOSCHEDULERS, "none"]
    near = difflib.get_close_matches(str(schedule), names, n=1, cutoff=0.6)
    raise TCError(f"unknown CPU schedule {schedule!r}"
                  + (f"; did you mean '{near[0]}'?" if near else "")
                  + f". Choose '{STRUCTURED}' (the default), a tc.CpuSchedule or its text, one of "
                  f"Halide's autoschedulers ({', '.join(AUTOSCHEDULERS)}), or None (or 'none') "
                  "for no schedule")


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


def _tensor_extents(fn, ranges, values: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The extents of every tensor of the function, for a call's sizes."""
    return {name: tuple(evaluate(e, values) for e in b.extents)
            for name, b in ranges.tensors.items() if fn.tensors[name].rank}


def needs_large_buffers(fn, ranges, values: Mapping[str, int]) -> bool:
    """Whether a call at these sizes has a tensor of more than 2**31 - 1 bytes (Halide's JIT
    then needs the LargeBuffers target feature). A tensor of more than 2**31 - 1 elements,
    which Halide cannot index, is a TCArgumentError."""
    large = False
    for name, shape in _tensor_extents(fn, ranges, values).items():
        elements = math.prod(max(0, e) for e in shape)
        if elements > MAX_ELEMENTS:
            raise TCArgumentError(
                f"'{fn.name}' would need {fn.tensors[name].kind} {name} of shape {shape} "
                f"({elements} elements); the CPU back end (Halide) addresses at most "
                f"2**31 - 1 elements per tensor")
        large |= elements * fn.tensors[name].type.bits // 8 > MAX_ELEMENTS
    return large


@attrs.frozen
class _CallPlan:
    """What a run needs to know of a function's tensors, worked out once per pipeline: a call
    then touches only its arrays (a small kernel's run is a few microseconds, so per-call
    lookups of types and dtypes were most of it)."""

    inputs: tuple  # (name, type, numpy dtype Halide's buffer takes, or None for a scalar)
    inouts: tuple  # (name, type)
    outputs: tuple  # (name, storage dtype, dtype returned: None where it is the storage's)

    @staticmethod
    def of(lowered: Lowered) -> "_CallPlan":
        fn = lowered.fn
        inputs = tuple((t.name, t.type, _native_storage(t.type) if t.rank else None)
                       for t in fn.inputs)
        inouts = tuple((n, fn.tensors[n].type) for n in lowered.inout_params)
        outputs = []
        for n in fn.outputs:
            stored, wanted = storage_type(fn.tensors[n].type).numpy, fn.tensors[n].type.numpy
            outputs.append((n, stored, None if stored == wanted else wanted))
        return _CallPlan(inputs, inouts, tuple(outputs))


def _native_storage(t) -> np.dtype:
    """The dtype of an input array Halide's buffer takes as it is (see _storage_view)."""
    return np.dtype(np.int64) if t.name == "uint64" else t.numpy.newbyteorder("=")


@attrs.frozen(eq=False)
class _Compiled:
    """One JIT-compiled pipeline and the Funcs and parameters it was built from."""

    lowered: Lowered
    call: object  # the compiled pipeline (an hl.Callable or an aot.AotPipeline): inputs, in/out
    #               values, then outputs
    schedule: str | CpuSchedule | None  # what was applied (an autoscheduler where the
    #                                     structured scheduler had no family for a Func)
    estimates: dict  # the sizes it was scheduled for
    note: str = ""  # why the schedule asked for was not the one applied
    report: tuple = ()  # the structured scheduler's decisions, one line per Func
    plan: _CallPlan = attrs.field(init=False)

    @plan.default
    def _plan(self) -> _CallPlan:
        return _CallPlan.of(self.lowered)


class CpuKernel:
    """A TC function compiled by Halide's JIT: for any sizes (the default), or for the shapes
    of `values` only (`specialize_shapes`).

    `values` (size variable -> int) are the sizes of the call that compiles it: the
    autoscheduler's estimates, and the bounds of a specialised kernel. `large_buffers`: compile
    for tensors of more than 2**31 - 1 bytes (`needs_large_buffers`). `compilations` counts the
    pipelines compiled, fallbacks included.

    A schedule planned for some sizes may not run at smaller ones: the autoschedulers split
    loops with ShiftInwards by factors up to the estimates (Mullapudi2016 by 16 where it can),
    and the code then touches
    elements before the start of a smaller tensor (Halide's run-time bounds check refuses it).
    Sizes where the schedule fails get a second shape-generic pipeline, scheduled as if the
    dimensions that shrank had extent 1 (so that it splits none of them and serves every
    smaller size as well), and unscheduled code only where that fails too, with a
    `TCWarning`."""

    def __init__(self, lowered: Lowered, values: Mapping[str, int], schedule: str | None, *,
                 specialize_shapes: bool = False, large_buffers: bool = False):
        self.fn, self.ranges = lowered.fn, lowered.ranges
        self.absent = lowered.absent
        self.specialize_shapes = specialize_shapes
        self.values = dict(values)
        target = hl.get_jit_target_from_environment()
        self.target = target.with_feature(hl.TargetFeature.LargeBuffers) if large_buffers \
            else target
        self.compilations = 0
        self._unscheduled: _Compiled | None = None
        self._rescheduled: list[_Compiled] = []  # scheduled for sizes where _main failed
        self._serving: dict[tuple, _Compiled] = {}  # those sizes -> the pipeline that ran
        self._bounds: dict[tuple, list] = {}  # sizes -> output_bounds (a memo)
        self._deferred_warnings: list[str] = []  # of a kernel made ahead (TCFunction)
        schedule = schedule_name(schedule)
        if aot.enabled():  # (the runtime compiles elsewhere while this kernel is scheduled)
            aot.start_runtime(self.target)
        self._fallback_note = ""  # why the structured scheduler handed over (see _compile)
        try:
            self._main = self._compile(lowered, schedule, self.values)
        except HALIDE_FAILURES as e:  # from the autoscheduler (see _compile)
            failed = f"the {schedule} autoscheduler"
            if isinstance(schedule, CpuSchedule):
                failed = (f"the {FALLBACK_AUTOSCHEDULER} autoscheduler (which took over: "
                          f"{self._fallback_note})")
            note = f"{failed} failed on it ({_halide_message(e)})"
            self._main = attrs.evolve(self._unscheduled_pipeline(), note=note)
            warn(f"'{self.fn.name}' runs unscheduled on the CPU: {note}")

    def defer_warnings(self, messages: list[str]) -> None:
        """Holds the warnings of making this kernel ahead, for the call that first uses it."""
        self._deferred_warnings = self._deferred_warnings + list(messages)

    def take_deferred_warnings(self) -> list[str]:
        taken, self._deferred_warnings = self._deferred_warnings, []
        return taken

    @property
    def schedule(self) -> str | CpuSchedule | None:
        """The schedule applied: a CpuSchedule, an autoscheduler's name, or None."""
        return self._main.schedule

    def explain(self) -> str:
        main = self._main
        if isinstance(main.schedule, CpuSchedule):
            head = f"CPU schedule: {STRUCTURED} {main.schedule}"
        else:
            head = f"CPU schedule: {main.schedule or 'none (Halide unscheduled code)'}"
        planned = ", ".join(f"{k}={v}" for k, v in sorted(main.estimates.items()))
        lines = [head + (f" (planned for {planned})" if planned else "")]
        if main.note:
            lines.append(f"  note: {main.note}")
        lines += [f"  {line}" for line in main.report]
        return "\n".join(lines)

    def _fresh(self, rounded=None) -> Lowered:
        """New Funcs (a schedule, even a failed attempt, changes the Funcs it is applied to);
        `rounded`: see `lower`."""
        return lower(self.fn, self.ranges, dict(self.ranges.scalars), cpu=True, rounded=rounded,
                     absent=self.absent)

    def _unscheduled_pipeline(self) -> _Compiled:
        """Halide's unscheduled code (a schedule only makes the code fast), compiled once."""
        if self._unscheduled is None:
            self._unscheduled = self._compile(self._fresh(), None, self.values)
        return self._unscheduled

    def _compile(self, lowered: Lowered, schedule: str | CpuSchedule | None,
                 estimates: Mapping[str, int]) -> _Compiled:
        """The JIT-compiled pipeline. A CpuSchedule the structured scheduler cannot apply (a
        Func outside its families; a failure, which is a bug) goes to FALLBACK_AUTOSCHEDULER,
        with the reason in the result's `note`. Halide's errors pass through where an
        autoscheduler was asked for (the caller falls back to none); without a schedule they are
        a TCError."""
        self.compilations += 1
        note = ""
        if isinstance(schedule, CpuSchedule):
            # Vectorising a row reduction (or summing it in memory order) needs Halide to
            # prove its update associative, which it cannot always do (`d_S(n) + (0 - x)`
            # under a let, in a softmax gradient): the Func it names goes without, then (an
            # error naming none) every Func does.
            no_row_vectors: set | None = set()
            rounded: dict[tuple[str, str], int] = {}  # (see `lower`)
            round_rows = columns = True
            while True:
                try:
                    self._bound_params(lowered, estimates)
                    realized, report, _ = schedule_pipeline(
                        lowered.outputs, _funcs_by_name(lowered), _images(lowered), schedule,
                        self.target, _func_extents(lowered, estimates), os.cpu_count() or 1,
                        no_row_vectors=no_row_vectors, round_rows=round_rows, columns=columns)
                    # (an update left to Halide's default, as a gradient's final negation of
                    # a row sum in softmax's: Halide warned of it on stderr at every compile)
                    quiet_unscheduled_updates(_funcs_by_name(lowered).values())
                    key = ("structured", str(schedule), sorted(estimates.items()),
                           self.specialize_shapes, sorted(no_row_vectors or ()),
                           no_row_vectors is None, os.cpu_count(), columns)
                    return _Compiled(lowered, _jit(hl.Pipeline(realized), lowered, self.target,
                                                   key),
                                     schedule, dict(estimates),
                                     report=_noting_rounded(report, rounded))
                except NotScheduled as e:
                    reason = e.message
                    break
                except RoundedRows as e:
                    key = _rounded_key(lowered, e.func, e.rvar)
                    if key is None or key in rounded:  # (a bug: scheduled without, then)
                        round_rows = False
                    else:
                        rounded[key] = e.lanes
                    lowered = self._fresh(rounded)
                except HALIDE_FAILURES as e:
                    reason = (f"the structured schedule failed ({_halide_message(e)}; a bug in "
                              "tcstage)")
                    # (Halide also refuses to reorder the RVars of such an update, or to
                    # rfactor it: see the scheduler's _lane_partials)
                    named = re.search(r"atomic\(\) on (\S+?)\.update", str(e)) or re.search(
                        r"schedule for (\S+?)\.update\(\d+\)[,:] can't (?:reorder RVars|"
                        r"perform rfactor)", str(e))
                    if no_row_vectors is None:
                        break
                    if columns and not named:  # (column sums with their rows: a bug, then;
                        columns = False        # computed as before)
                        lowered = self._fresh(rounded)
                        continue
                    # (by tensor name: every attempt lowers new Funcs, named 'd_S$7', 'd_S$8')
                    tensor = named.group(1).split("$")[0] if named else None
                    if tensor and tensor not in no_row_vectors and len(no_row_vectors) < 8:
                        no_row_vectors.add(tensor)
                    else:
                        no_row_vectors = None
                    lowered = self._fresh(rounded)
            self._fallback_note = reason
            note = f"{reason}; {FALLBACK_AUTOSCHEDULER} scheduled it"
            lowered, schedule = self._fresh(), FALLBACK_AUTOSCHEDULER
        try:
            return _Compiled(lowered, self._compile_pipeline(lowered, schedule, estimates),
                             schedule, dict(estimates), note)
        except HALIDE_FAILURES as e:
            if schedule is not None:
                raise
            raise TCError(f"Halide could not compile '{lowered.fn.name}' for the CPU: "
                          f"{_halide_message(e)}", notes=("this is a bug in tcstage",)) from e

    def _compile_pipeline(self, lowered: Lowered, schedule: str | None,
                          estimates: Mapping[str, int]) -> hl.Callable:
        self._bound_params(lowered, estimates)
        pipeline = hl.Pipeline(lowered.outputs)
        if schedule is None:
            final = {f.name() for f in lowered.outputs}
            for versions in lowered.versions.values():
                for v in versions:
                    if v.func.name() not in final:
                        v.func.compute_root()
        else:
            _load_autoscheduler(schedule)
            # All three take 'parallelism' (Adams2019 and Li2018 assume 16 cores otherwise).
            # Never pass a parameter a plugin does not define: Halide aborts the process.
            params = {"parallelism": str(os.cpu_count() or 1)}
            pipeline.apply_autoscheduler(self.target, hl.AutoschedulerParams(schedule, params))
            quiet_unscheduled_updates(v.func for vs in lowered.versions.values() for v in vs)
        key = ("autoscheduled", schedule, sorted(estimates.items()), self.specialize_shapes,
               os.cpu_count())
        return _jit(pipeline, lowered, self.target, key)

    def _bound_params(self, lowered: Lowered, estimates: Mapping[str, int]) -> None:
        """The autoschedulers' estimates, and the bounds Halide may rely on."""
        fn = lowered.fn
        for name, p in (*lowered.params.items(), *lowered.inout_params.items()):
            dims = fn.tensors[name].dims
            if not dims:
                continue
            extents = [int(d) if d.isdigit() else estimates[d] for d in dims]
            p.set_estimates(_reversed_estimates([0] * len(extents), extents))
            # The estimates only plan the schedule: the code stays correct for every size.
            # Sizes the signature fixes are bounds, and so are all of them in a kernel
            # specialised to its shapes. (With symbolic extents, a temporary that the
            # autoscheduler splits (ShiftInwards) has a realized region like
            # max(min(N, 8), 1) - 8, and lowering a subscript that reads it through nested
            # reads, T(T(T(T(T(I(i)))))), took time exponential in the depth: 90 s for 5
            # levels with Mullapudi2016, unbounded with Li2018; TCFunction specialises such
            # functions to their shapes by default.) Empty tensors keep symbolic bounds:
            # Li2018 aborts the process on a constant extent 0.
            if min(extents) > 0:
                for k, (d, e) in enumerate(zip(reversed(dims), reversed(extents))):
                    if self.specialize_shapes or d.isdigit():
                        p.dim(k).set_bounds(0, int(e))
        for f, (mins, extents) in zip(lowered.outputs, self.output_bounds(estimates)):
            if mins:
                f.set_estimates(_reversed_estimates(mins, extents))

    def output_bounds(self, values: Mapping[str, int]) -> list[tuple[tuple, tuple]]:
        """(mins, extents) of each output for a call's sizes."""
        tensors = self.ranges.tensors
        return [(tuple(evaluate(m, values) for m in tensors[name].mins),
                 tuple(evaluate(e, values) for e in tensors[name].extents))
                for name in self.fn.outputs]

    def __call__(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, object],
                 inout: Mapping[str, np.ndarray], values: Mapping[str, int] | None = None,
                 allocate=None, sorted_sizes: tuple | None = None) -> list[np.ndarray]:
        """Runs on a call's arrays; `values`: its sizes (those it was compiled at if None; a
        specialised kernel takes no others), `sorted_sizes` the same sorted into a tuple where
        the caller has it already. `allocate(shape, dtype)` makes the output arrays (aligned_empty
        by default; a PyTorch caller's allocator, so outputs are its tensors)."""
        values = self.values if values is None else values
        if self.specialize_shapes and values != self.values:
            raise TCError(f"a kernel of '{self.fn.name}' specialised to sizes {self.values} "
                          f"was called with {values}", notes=("this is a bug in tcstage",))
        sizes = tuple(sorted(values.items())) if sorted_sizes is None else sorted_sizes
        compiled = self._serving.get(sizes, self._main)
        bounds = self._bounds.get(sizes)
        if bounds is None:
            if len(self._bounds) > 4096:  # a memo for loops over a few sizes: keep it small
                self._bounds.clear()
            bounds = self._bounds[sizes] = self.output_bounds(values)
        run = (arrays, scalars, inout, bounds, allocate or aligned_empty)
        try:
            return _run(compiled, *run)
        except HALIDE_FAILURES as e:  # a failed runtime check (e.g. a read out of bounds)
            results = _widened_empty_outputs(compiled, run)
            if results is not None:
                return results
            if compiled.schedule is None:
                raise TCArgumentError(f"running '{self.fn.name}' failed: {_halide_message(e)}") \
                    from None
            return self._run_elsewhere(sizes, values, run, compiled, e)

    def prepared(self, sorted_sizes: tuple, inputs: list) -> "PreparedRun | None":
        """The run of the pipeline serving these sizes (a tuple of sorted items), made ready for
        arguments of fixed layouts once a call at these sizes ran (and so chose that pipeline):
        `inputs` per input, in signature order, (shape, numpy dtype) of a C-contiguous aligned
        array, a fixed scalar's value, or PER_CALL for a scalar passed with each call (as
        `scalar_argument` converts it). None where the pipeline is not a cached library's (the
        JIT has no prepared calls) or a value needs converting: in/out outputs, an output
        returned as another type than the one stored, an array of another dtype than Halide's
        buffer."""
        compiled = self._serving.get(sorted_sizes, self._main)
        plan = compiled.plan
        if not isinstance(compiled.call, aot.AotPipeline) or plan.inouts or \
                any(wanted is not None for *_, wanted in plan.outputs):
            return None
        layouts, scalars, passed = [], [], []
        for k, ((_, t, dtype), given) in enumerate(zip(plan.inputs, inputs)):
            if dtype is None:
                layouts.append(None)
                scalars.append(None if given is PER_CALL else scalar_argument(given, t))
                if given is PER_CALL:
                    passed.append(k)
                continue
            shape, given_dtype = given
            if given_dtype != dtype:
                return None
            layouts.append((shape, _dense_strides(shape), None, dtype))
            scalars.append(None)
            passed.append(k)
        outputs = []
        for (_, stored, _), (mins, extents) in zip(plan.outputs,
                                                   self.output_bounds(dict(sorted_sizes))):
            layouts.append((extents, _dense_strides(extents), mins if any(mins) else None,
                            stored))
            scalars.append(None)
            outputs.append((extents, np.dtype(stored)))
        return PreparedRun(compiled.call.prepare(layouts, scalars), tuple(passed),
                           tuple(outputs))

    def _run_elsewhere(self, sizes: tuple, values: dict, run: tuple, failed: _Compiled,
                       error: Exception) -> list[np.ndarray]:
        """The schedule `failed` did not run at these sizes: a pipeline scheduled for other
        sizes where it failed, else a new one scheduled for these (a shape-generic kernel), else
        the unscheduled code, whose failure is the arguments' fault."""
        if len(self._serving) > 4096:  # a memo of sizes, not a record: keep it small
            self._serving.clear()
        for other in self._rescheduled:
            if other is failed:
                continue
            try:
                results = _run(other, *run)
            except HALIDE_FAILURES:
                continue
            self._serving[sizes] = other
            return results
        # Planned for extent 1 in the dimensions that shrank, a schedule splits none of them,
        # so it serves every smaller size too: one more kernel for a loop whose sizes go down.
        # (A specialised kernel would get the same schedule again.)
        main = self._main.estimates
        estimates = {k: 1 if v < main.get(k, v) else v for k, v in values.items()}
        if not self.specialize_shapes and estimates != failed.estimates:
            try:
                other = self._compile(self._fresh(), failed.schedule, estimates)
                results = _run(other, *run)
            except HALIDE_FAILURES:
                pass
            else:
                self._rescheduled.append(other)
                self._serving[sizes] = other
                return results
        results = _run(self._unscheduled_pipeline(), *run, name=self.fn.name)
        self._serving[sizes] = self._unscheduled_pipeline()
        shown = ", ".join(f"{k}={v}" for k, v in sizes)
        warn(f"'{self.fn.name}' runs unscheduled on the CPU"
             + (f" at sizes {shown}" if sizes and not self.specialize_shapes else "")
             + f": the {failed.schedule} schedule failed at run time ({_halide_message(error)})")
        return results


def _widened_empty_outputs(compiled: "_Compiled", run: tuple) -> list[np.ndarray] | None:
    """The run of `run` with one element in each empty dimension of its outputs, returned as
    views of their true (empty) extents; None where no output is empty, or where that fails
    too. Halide's bounds inference takes a read of an output inside an empty loop (`U(k) =
    T(k, 1) where k in 0:P-1`, P = 1) to need T(., 1), outside T's empty extent, and failed
    the run (it then ran unscheduled, with a warning). The extra elements are computed and
    dropped; one that reads outside an input fails as before."""
    arrays, scalars, inout, bounds, allocate = run
    if inout or all(all(extents) for _, extents in bounds):
        return None
    widened = [(mins, tuple(max(e, 1) for e in extents)) for mins, extents in bounds]
    try:
        results = _run(compiled, arrays, scalars, inout, widened, allocate)
    except HALIDE_FAILURES:
        return None
    return [r[tuple(slice(0, e) for e in extents)] for r, (_, extents) in zip(results, bounds)]


PER_CALL = type("PerCall", (), {"__repr__": lambda self: "PER_CALL"})()
"""`CpuKernel.prepared`'s mark of a scalar input whose value comes with each call."""


@attrs.frozen(eq=False)
class PreparedRun:
    """A kernel's run at fixed sizes and argument layouts (`CpuKernel.prepared`): a call then
    passes the inputs' buffers (their addresses, or numpy arrays), the PER_CALL scalars' values
    and fresh outputs' buffers to `call`, a `_native.PreparedCall`, and nothing else is looked
    up. A nonzero status leaves the error to the full run (`CpuKernel.__call__`), which reports
    it."""

    call: object
    passed: tuple  # the indices of the inputs passed with each call: buffers, PER_CALL scalars
    outputs: tuple  # (shape, numpy dtype) of each output, C-contiguous


def _dense_strides(shape: tuple) -> tuple:
    """The strides, in elements, of a C-contiguous array of `shape`."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _func_extents(lowered: Lowered, values: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The extents of every Func lowering defined (innermost first), for these sizes."""
    tensors = _tensor_extents(lowered.fn, lowered.ranges, values)
    extents = {}
    for name, versions in lowered.versions.items():
        for v in versions:
            extents[v.func.name()] = tuple(reversed(tensors.get(name, ())))
    for name, f in zip(lowered.fn.outputs, lowered.outputs):
        extents.setdefault(f.name(), tuple(reversed(tensors.get(name, ()))))
    for pad in lowered.pads:  # (an input's padded Func: about the input's extents, the
        tensor, stride = lowered.pad_strides[pad.name()]  # innermost split by phase)
        inner, *outer = reversed(tensors.get(tensor, (1,)))
        extents[pad.name()] = (inner,) + tuple(outer) if stride == 1 else \
            (-(-inner // stride), stride, *outer)
    # (and each input's, by the names Halide's trees give them, `A.extent.0`: a reduction's
    # extent is often an input's, as a matrix product's K)
    for name, p in lowered.params.items():
        if isinstance(p, hl.ImageParam):
            for k, e in enumerate(reversed(tensors.get(name, ()))):
                extents[f"{p.name()}.extent.{k}"] = (e,)
    return extents


def _jit(pipeline: hl.Pipeline, lowered: Lowered, target: hl.Target, key: tuple):
    """The pipeline compiled to a callable taking the inputs in signature order, then the
    in/out outputs' values, then the output buffers: from the disk cache (tcstage/halide/aot.py,
    where `key` says how the pipeline was scheduled), else a JIT Callable. (Either costs a few
    microseconds per call where Pipeline.realize costs tens, and keeps no argument values
    between calls, so concurrent calls of one kernel do not share its Params.)"""
    arguments = [lowered.params[t.name] for t in lowered.fn.inputs]
    arguments += [lowered.inout_params[name] for name in lowered.inout_params]

    def compiled():
        if aot.enabled():
            return aot.compile_pipeline(pipeline, arguments, target, (
                repr(lowered.fn), sorted(lowered.ranges.scalars), *key)
                + ((("absent", *sorted(lowered.absent)),) if lowered.absent else ()))
        return pipeline.compile_to_callable(arguments, target)
    if any(t.type.is_float and t.type.bits == 16 for t in lowered.fn.tensors.values()):
        with halide_notes_dropped():
            return compiled()
    return compiled()


def _run(compiled: _Compiled, arrays, scalars, inout, output_bounds, allocate=None,
         name: str | None = None) -> list[np.ndarray]:
    """Runs the pipeline on numpy arrays into fresh outputs of `output_bounds`. `name`:
    Halide's failures are the arguments' fault (a TCArgumentError naming the function)."""
    plan = compiled.plan
    values = []  # the pipeline's arguments: arrays (kept alive until it returns) and numbers
    for tname, t, dtype in plan.inputs:
        if dtype is None:
            values.append(scalar_argument(scalars[tname], t))
            continue
        a = arrays[tname]
        flags = a.flags
        if not (a.dtype == dtype and flags.c_contiguous and flags.aligned and flags.writeable):
            a = _storage_view(a, t)
        else:
            a = _unit_inner_stride(a)
        values.append(a)
    written = len(values)  # (the in/out outputs and the outputs follow)
    for tname, t in plan.inouts:
        values.append(_storage_view(inout[tname], t))
    outs, mins = [], {}
    for (tname, stored, _), (lo, extents) in zip(plan.outputs, output_bounds):
        out = (allocate or aligned_empty)(extents, stored)
        if any(lo):
            mins[len(values)] = lo
        outs.append(out)
        values.append(out)
    try:
        if not any(v.size for v in values[written:]):
            pass  # (no element to compute; a schedule's splits may not fit an empty loop)
        elif isinstance(compiled.call, aot.AotPipeline):
            compiled.call.run(values, mins)
        else:
            buffers = [halide_buffer(v) if isinstance(v, np.ndarray) else v for v in values]
            for k, lo in mins.items():
                buffers[k].set_min(list(reversed(lo)))
            compiled.call(*buffers)
    except HALIDE_FAILURES as e:
        if name is None:
            raise
        raise TCArgumentError(f"running '{name}' failed: {_halide_message(e)}") from None
    return [o if wanted is None else o.view(wanted)
            for (_, _, wanted), o in zip(plan.outputs, outs)]


def quiet_unscheduled_updates(funcs) -> None:
    """Marks the updates of `funcs` an autoscheduler left alone (a scatter's, which it cannot
    make parallel) as meant to be unscheduled: otherwise Halide warns about them on stderr."""
    for f in funcs:
        for k in range(f.num_update_definitions()):
            try:
                f.update(k).unscheduled()
            except HALIDE_FAILURES:  # it was scheduled
                pass


def _funcs_by_name(lowered: Lowered) -> dict[str, hl.Func]:
    found = {v.func.name(): v.func for vs in lowered.versions.values() for v in vs}
    found.update({f.name(): f for f in (*lowered.outputs, *lowered.pads)})
    return found


def _noting_rounded(report, rounded: Mapping[tuple[str, str], int]) -> tuple[str, ...]:
    """The scheduler's lines, each rounded reduction's saying so."""
    def note(line):
        tensor = line.split(":")[0].split("$")[0]
        return "".join(f"; its sum over {v} runs to a multiple of {m} (whole vectors, adding "
                       f"nothing past {v}'s range)" for (t, v), m in rounded.items() if t == tensor)
    return tuple(line + note(line) for line in report)


def _rounded_key(lowered: Lowered, func: str, rvar: str) -> tuple[str, str] | None:
    """(tensor, TC reduction index) of a Func's RVar, as `lower`'s `rounded` names it."""
    tensor = lowered.halide_names().get(func)
    for st, names in zip(lowered.fn.statements, lowered.var_names):
        if st.tensor == tensor and rvar in names:
            return tensor, names[rvar]
    return None


def _images(lowered: Lowered) -> dict[str, hl.ImageParam]:
    return {p.name(): p for p in (*lowered.params.values(), *lowered.inout_params.values())
            if isinstance(p, hl.ImageParam)}


def _halide_message(e: Exception) -> str:
    text = str(e).strip()
    return text if text not in ("", "Error:") else f"{type(e).__name__} without a message"


# Halide's generated code may read an output back with aligned vector loads (a reduction's
# update reads the running values): on an unaligned numpy array that faulted (seen with vmovaps
# on AVX-512 and AVX2 hosts), so every output buffer is allocated aligned. Halide assumes at
# most the native vector width (CodeGen_LLVM's dense loads), 64 bytes with AVX-512, and 64 is
# PyTorch's CPU allocator's alignment: its tensors are outputs as they come.
OUTPUT_ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype,
                  alignment: int = OUTPUT_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-order array whose data starts on an `alignment`-byte boundary (an
    output buffer's: see OUTPUT_ALIGNMENT)."""
    dtype = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * dtype.itemsize + alignment, dtype=np.uint8)
    # (a view made by the constructor: slicing, view() and reshape() cost 2.6 us together,
    # raw.ctypes.data 4.5, on a call of 12 us; `_native.address` 0.1)
    return np.ndarray(shape, dtype, raw, (-_native.address(raw)) % alignment)


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
    a = _unit_inner_stride(a)
    return a.view(np.int64) if t.name == "uint64" else a


def _unit_inner_stride(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array as Halide takes it, its innermost stride one element. numpy calls
    an array contiguous whatever the stride of a dimension of extent 1 (`c[:, None]` has 0
    there) and gives an empty array 0 in every dimension; Halide refused both. No element is
    a stride away from another there, so the view (same memory) takes dense strides."""
    if not a.ndim or a.strides[-1] == a.itemsize or (a.shape[-1] != 1 and a.size):
        return a
    strides = (*a.strides[:-1], a.itemsize) if a.size else \
        tuple(s * a.itemsize for s in _dense_strides(a.shape))
    return np.lib.stride_tricks.as_strided(a, strides=strides)


class _HalideType(ctypes.Structure):  # halide_type_t (HalideRuntime.h)
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _RawBuffer(ctypes.Structure):  # the head of halide_buffer_t (HalideRuntime.h)
    _fields_ = [("device", ctypes.c_uint64), ("device_interface", ctypes.c_void_p),
                ("host", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("type", _HalideType)]


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_HALIDE_UINT, _HALIDE_BFLOAT = 1, 4  # halide_type_code_t


def halide_buffer(a: np.ndarray) -> hl.Buffer:
    """An `hl.Buffer` over a's memory (no copy). numpy's buffer protocol has no bfloat16, so a
    bfloat16 array is wrapped as uint16 and the buffer's type code set to bfloat16: the
    pipeline's inputs and outputs keep their own type, with no reinterpretation in the Funcs
    that the CUDA path reads too. (halide_buffer_t's layout is the C ABI of every Halide
    pipeline, so it does not move between releases.)"""
    if a.dtype != _BFLOAT16:
        return hl.Buffer(a)
    buf = hl.Buffer(a.view(np.uint16))
    raw = _RawBuffer.from_address(buf._get_raw_halide_buffer_t())
    moved = a.size and raw.host != a.ctypes.data
    if (raw.type.code, raw.type.bits) != (_HALIDE_UINT, 16) or moved:
        raise TCError("cannot pass a bfloat16 array to Halide: its buffer does not have the "
                      "layout tcstage expects", notes=("this is a bug in tcstage",))
    raw.type.code = _HALIDE_BFLOAT
    return buf


class _Alias:
    """Exposes an array's memory through the array interface with the read-only flag off;
    holds the array, so the memory outlives the alias."""

    def __init__(self, a: np.ndarray):
        self.array = a
        self.__array_interface__ = {**a.__array_interface__,
                                    "data": (a.__array_interface__["data"][0], False)}


def _writable_alias(a: np.ndarray) -> np.ndarray:
    return np.asarray(_Alias(a))
