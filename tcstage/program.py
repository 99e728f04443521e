"""The public face of the CPU flow: `define(source)` -> `Program` of `TCFunction`s.

A `TCFunction` checks its arguments against the signature, infers ranges (symbolically once, or
per value of the scalar inputs it specialises on), lowers to Halide and runs the JIT-compiled
pipeline, caching one compiled kernel per (specialised scalars, schedule): a kernel serves every
set of sizes, unless it is specialised to shapes (`specialize_shapes=True`), which adds the
shapes to the key. Tensors are numpy arrays, or CPU PyTorch tensors taken as numpy views; torch
is imported by the caller, never here.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import sys
import threading
from collections.abc import Mapping, Sequence

import attrs
import ml_dtypes
import numpy as np

from tcstage.errors import (TCArgumentError, TCError, TCSemanticError, deferred_warnings, warn,
                            warnings_deferred)
from tcstage.halide import ranges as R
from tcstage.halide.jit import (DEFAULT_SCHEDULE, OUTPUT_ALIGNMENT, PER_CALL, CpuKernel,
                                PreparedRun, aligned_empty, needs_large_buffers, schedule_name)
from tcstage.halide.aot import share_torch_threads
from tcstage.halide.lower import Lowered, lower, scalar_argument
from tcstage.halide.solver import evaluate
from tcstage.lang import ast, ellipsis
from tcstage.lang import checked as C
from tcstage.lang.accumulate import accumulate_in_float32
from tcstage.lang.parser import parse
from tcstage.lang.sema import check_module
from tcstage.lang.types import from_numpy

_DEFAULT = object()


def define(source: str, filename: str = "<string>", *,
           narrow_accumulation: bool = False) -> "Program":
    """Parses and checks every TC function in `source`; raises `TCError` on any mistake.

    Sums and products into half or bfloat16 tensors accumulate in float32 and are rounded once
    (docs/language.md); `narrow_accumulation=True` keeps the tensor's own type throughout."""
    for what, value in (("source", source), ("filename", filename)):
        if not isinstance(value, str):
            raise TCArgumentError(
                f"tc.define takes the TC {what} as a str, got {_describe(value)}",
                notes=("decode bytes first, e.g. data.decode('utf-8')",)
                if isinstance(value, (bytes, bytearray)) else ())
    if not isinstance(narrow_accumulation, (bool, np.bool_)):
        raise TCArgumentError(f"narrow_accumulation takes True or False, got "
                              f"{_describe(narrow_accumulation)}")
    module = parse(source, filename)
    polymorphic = [d for d in module.defs if ellipsis.is_polymorphic(d)]
    plain = attrs.evolve(module, defs=tuple(d for d in module.defs if d not in polymorphic))
    _no_calls_of(polymorphic, module)
    functions: dict = {}
    for name, fn in check_module(plain).items():
        functions[name] = TCFunction(fn if narrow_accumulation else accumulate_in_float32(fn),
                                     written=fn)
    for d in polymorphic:
        if d.name.name in functions or d.name.name in [e.name.name for e in polymorphic
                                                       if e is not d and e.span.start < d.span.start]:
            raise TCSemanticError(f"redefinition of TC function '{d.name.name}'", d.name.span)
        functions[d.name.name] = PolymorphicFunction(d, plain, bool(narrow_accumulation))
    ordered = {d.name.name: functions[d.name.name] for d in module.defs}
    return Program(ordered, source, filename, narrow_accumulation=bool(narrow_accumulation))


def _no_calls_of(polymorphic: list, module) -> None:
    """A call of a rank-polymorphic function from another TC function is refused: its rank
    would come from the caller's tensors, which inlining does not know yet."""
    names = {d.name.name for d in polymorphic}
    for d in module.defs:
        for s in d.statements:
            if isinstance(s, ast.TCCall) and s.callee.name in names:
                raise TCSemanticError(
                    f"'{s.callee.name}' is rank-polymorphic ('...' in its types), and a call "
                    "from another TC function cannot instantiate it", s.callee.span,
                    ("call it from Python, or write the caller's rank out in a copy of it",))


def _describe(value) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


class Program:
    """The functions of one TC source, by name: `prog.matmul` or `prog["matmul"]`."""

    def __init__(self, functions: dict[str, "TCFunction"], source: str | None = None,
                 filename: str = "<string>", narrow_accumulation: bool = False):
        self._functions = functions
        # the text it was defined from: what worker processes define again (Halide objects
        # do not pickle), and how (see `define`)
        self.source, self.filename = source, filename
        self.narrow_accumulation = narrow_accumulation

    @property
    def names(self) -> list[str]:
        return list(self._functions)

    def __getitem__(self, name: str) -> "TCFunction":
        try:
            return self._functions[name]
        except KeyError:
            raise TCError(f"no TC function named '{name}'; defined: {', '.join(self.names)}") \
                from None

    def __getattr__(self, name: str) -> "TCFunction":
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self):
        return iter(self._functions.values())

    def __repr__(self) -> str:
        return f"<tcstage.Program: {', '.join(self.names)}>"


class PolymorphicFunction:
    """A rank-polymorphic TC function (`...` in its types; docs/language.md, "Any rank"). Each
    call instantiates it for the rank of its arguments (lang/ellipsis.py): `instance(n)` is the
    ordinary TCFunction for a run of n dimensions, kept once made, and calls, shapes, ranges,
    lowering and `tc.compile` go through the instance their arguments choose."""

    def __init__(self, d: ast.Def, others, narrow_accumulation: bool):
        ellipsis.check_pattern(d)
        self.definition, self.name = d, d.name.name
        self._others, self._narrow = others, narrow_accumulation
        self._instances: dict[int, TCFunction] = {}
        self.instance(1)  # errors and warnings surface at definition time, for one dimension

    def __repr__(self) -> str:
        sig = ", ".join(p.type.span.text() + " " + p.name.name for p in self.definition.params)
        return f"<TC function {self.name}({sig}) -> " \
            f"({', '.join(r.name for r in self.definition.returns)}), any rank>"

    @property
    def parameters(self) -> list[str]:
        return [p.name.name for p in self.definition.params]

    def instance(self, length: int) -> "TCFunction":
        """The function written out for a `...` of `length` dimensions."""
        if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 0:
            raise TCArgumentError(f"instance() takes the number of dimensions '...' stands "
                                  f"for, an int >= 0, got {_describe(length)}")
        found = self._instances.get(int(length))
        if found is None:
            d = ellipsis.instantiate(self.definition, int(length))
            module = attrs.evolve(self._others, defs=(*self._others.defs, d))
            fn = check_module(module)[self.name]
            found = TCFunction(fn if self._narrow else accumulate_in_float32(fn), written=fn)
            self._instances[int(length)] = found
        return found

    def for_arguments(self, args: Sequence, named: Mapping | None = None) -> "TCFunction":
        """The instance a call with these arguments (arrays, shape tuples, scalars; in
        signature order, then by name) runs."""
        params = self.parameters
        bound = dict(zip(params, args)) | dict(named or {})
        shapes = {}
        for name, a in bound.items():
            info = array_info(a) if name in params else None
            if info is not None:
                shapes[name] = info[0]
            elif isinstance(a, (tuple, list)) and all(isinstance(n, (int, np.integer))
                                                      for n in a):
                shapes[name] = tuple(int(n) for n in a)
            elif type(a).__module__.split(".")[0] == "torch" and hasattr(a, "shape"):
                shapes[name] = tuple(a.shape)  # (SymInts under torch.compile: not int()ed)
            elif isinstance(a, (int, float, np.number, bool)):
                shapes[name] = ()
        return self.instance(ellipsis.run_length(self.definition, shapes))

    # the TCFunction interface, through the instance of the call
    def __call__(self, *args, out=None, **kwargs):
        named = {k: v for k, v in kwargs.items() if k in self.parameters}
        return self.for_arguments(args, named)(*args, out=out, **kwargs)

    def output_shapes(self, *args, out=None, **named):
        return self.for_arguments(args, named).output_shapes(*args, out=out, **named)

    def output_mins(self, *args, out=None, **named):
        return self.for_arguments(args, named).output_mins(*args, out=out, **named)

    def ranges(self, *args, out=None, **named):
        """Per statement, the inferred ranges of the instance the arguments choose (without
        arguments: of the one-dimensional instance)."""
        fn = self.for_arguments(args, named) if args or named else self.instance(1)
        return fn.ranges(*args, out=out, **named)

    def lower(self, *args, out=None, **named):
        return self.for_arguments(args, named).lower(*args, out=out, **named)

    def explain(self, *args, out=None, **kwargs):
        named = {k: v for k, v in kwargs.items() if k in self.parameters}
        return self.for_arguments(args, named).explain(*args, out=out, **kwargs)

    def bind(self, args: Sequence, out=None, shapes_only: bool = False, named=None):
        return self.for_arguments(args, named).bind(args, out, shapes_only, named)

    @property
    def checked(self):
        raise TCError(f"'{self.name}' is rank-polymorphic: it has a checked function per rank; "
                      f"use .instance(n) (n: the number of dimensions '...' stands for), or "
                      "pass arguments")


def resolve(fn, args: Sequence, named: Mapping | None = None):
    """The TCFunction a call of fn with these arguments runs: fn itself, or the instance of a
    rank-polymorphic one."""
    return fn.for_arguments(args, named) if isinstance(fn, PolymorphicFunction) else fn


@attrs.frozen
class Binding:
    """A call's arguments checked against the signature."""

    sizes: dict  # size variable (and in/out `T.n`) -> int
    scalars: dict  # scalar input -> value
    arrays: dict  # tensor input -> array (None when only shapes were given)
    inout: dict  # in/out output -> array

    def specialization(self, fn: "TCFunction") -> tuple:
        return tuple(sorted((s, int(self.scalars[s])) for s in fn.specialized_scalars))


@attrs.frozen
class StatementReport:
    """Inferred ranges of one statement, symbolic and (for a call's sizes) concrete."""

    tensor: str
    source: str
    symbolic: dict  # var -> 'lo <= var < hi'
    concrete: dict  # var -> (begin, end), half-open; empty without sizes

    def __str__(self) -> str:
        parts = [f"{self.source}"]
        for v, text in self.symbolic.items():
            extra = f"   = [{self.concrete[v][0]}, {self.concrete[v][1]})" if v in self.concrete else ""
            parts.append(f"    {text}{extra}")
        return "\n".join(parts)


class TCFunction:
    """One TC function: call it on numpy arrays, or ask for its shapes and ranges.

    `checked` is the function that compiles (with float32 accumulators for half and bfloat16
    sums, lang/accumulate.py), `written` the function as its source states it (what the
    gradient differentiates)."""

    def __init__(self, fn: C.Function, written: C.Function | None = None):
        self.checked = fn
        self.written = fn if written is None else written
        self.name = fn.name
        self.specialized_scalars = R.needs_specialization(fn)
        # The default of specialize_shapes: shape-generic kernels, except where a subscript
        # reads a tensor the function computes (see jit._compile_pipeline: Halide's lowering
        # of such reads is exponential in their nesting unless the shapes are bounds).
        self.specializes_shapes = _subscripts_read_computed_tensors(fn)
        self._ranges: dict[tuple, R.FunctionRanges] = {}
        self._kernels: dict[tuple, CpuKernel] = {}
        self._pending: dict[tuple, threading.Event] = {}  # kernels being made (_kernel_once)
        self._kernel_lock = threading.Lock()
        self._large_buffers: dict[tuple, bool] = {}  # (spec, sizes) -> needs_large_buffers
        self._layouts: dict[tuple, list] = {}  # (spec, sizes and scalars) -> _output_layout
        self._fast_calls: dict[tuple, _FastCall] = {}  # see _fast_key
        if not self.specialized_scalars:
            self._infer(())  # errors and warnings surface at definition time

    def __repr__(self) -> str:
        sig = ", ".join(f"{t.type}({', '.join(t.dims)}) {t.name}" if t.rank else f"{t.type} {t.name}"
                        for t in self.checked.inputs)
        return f"<TC function {self.name}({sig}) -> ({', '.join(self.checked.outputs)})>"

    # -- inference ---------------------------------------------------------------------------
    def _infer(self, spec: tuple) -> R.FunctionRanges:
        cached = self._ranges.get(spec)
        if cached is None:
            warned = cached = R.infer_ranges(self.checked, dict(spec)) \
                if self.written is self.checked else None
            if cached is None:  # errors and warnings name the tensors of the source, never
                # the float32 accumulators it compiles with
                warned = R.infer_ranges(self.written, dict(spec))
                cached = R.infer_ranges(self.checked, dict(spec))
            for p in warned.preconditions:
                warn(p.message)
            self._ranges[spec] = cached
        return cached

    @property
    def compile_count(self) -> int:
        """How many Halide pipelines calling this function has compiled for the CPU (a schedule
        that fails and falls back to unscheduled code counts both). It stays the same over
        calls that reuse a kernel: with shape-generic kernels (the default), calls at new
        sizes compile nothing."""
        return sum(k.compilations for k in self._kernels.values())

    def bind(self, args: Sequence, out=None, shapes_only: bool = False, named=None) -> Binding:
        """args (positional) and named (by TC name) checked against the signature (CPU
        PyTorch tensors are taken as numpy views)."""
        args, named, out, _ = _numpy_views(self.checked, args, named or {}, out, cuda_ok=True)
        return _bind(self.checked, _positional(self.checked, args, named or {}), out, shapes_only)

    # -- user API ------------------------------------------------------------------------------
    def output_shapes(self, *args, out=None, **named) -> list[tuple[int, ...]]:
        """Output shapes for inputs given as arrays or shapes (scalars as values)."""
        b = self.bind(args, out, shapes_only=True, named=named)
        return [shape for shape, _ in self._output_layout(b)]

    def output_mins(self, *args, out=None, **named) -> list[tuple[int, ...]]:
        """The index of each output's first element (0 unless a range starts elsewhere)."""
        b = self.bind(args, out, shapes_only=True, named=named)
        return [mins for _, mins in self._output_layout(b)]

    def ranges(self, *args, out=None, **named) -> list[StatementReport]:
        """Inferred index ranges per statement. Without arguments they are symbolic only
        (functions that specialise on scalar inputs need the arguments)."""
        if args or named:
            b = self.bind(args, out, shapes_only=True, named=named)
            fr, values = self._infer(b.specialization(self)), {**b.sizes, **_int_scalars(b)}
        else:
            if self.specialized_scalars:
                raise TCArgumentError(
                    f"'{self.name}' specialises on scalar input(s) "
                    f"{', '.join(sorted(self.specialized_scalars))}; pass the arguments to ranges()")
            fr, values = self._infer(()), None
        reports = []
        for st, sr in zip(self.checked.statements, fr.statements):
            concrete = {v: r.evaluate(values) for v, r in sr.ranges.items()} \
                if values is not None else {}
            reports.append(StatementReport(
                sr.tensor, C.statement_text(st),
                {v: r.text(v) for v, r in sr.ranges.items()}, concrete))
        return reports

    def lower(self, *args, out=None, **named) -> Lowered:
        """The Halide Funcs of this function (for the call's scalar specialisation)."""
        return self.lowered_for(args, named, out)

    def lowered_for(self, args, named, out=None, dynamic=()) -> Lowered:
        """`lower` for a call's arguments (arrays or shapes) by position and by name; inputs
        with no elements at these sizes, unless a size in `dynamic` (left to the kernel's
        caller) is what empties them, are never read (`absent_inputs`)."""
        if not (args or named):
            return lower(self.checked, self._infer(()), {})
        b = self.bind(args, out, shapes_only=True, named=named)
        self._output_layout(b)  # rejects impossible shapes and ranges for these sizes
        spec = b.specialization(self)
        return lower(self.checked, self._infer(spec), dict(spec),
                     absent=absent_inputs(self.checked, b.sizes, dynamic))

    def _cpu_kernel(self, args, named, out, schedule, specialize_shapes):
        """The CpuKernel serving a call (compiled on first use), its Binding, and the
        caller's PyTorch tensors (None for numpy arguments)."""
        # (as a CpuSchedule or a name: the default and the same schedule given share a kernel)
        schedule = schedule_name(DEFAULT_SCHEDULE if schedule is _DEFAULT else schedule)
        if specialize_shapes is None:
            specialize_shapes = self.specializes_shapes
        elif not isinstance(specialize_shapes, (bool, np.bool_)):
            raise TCArgumentError(f"specialize_shapes takes True, False or None, got "
                                  f"{_describe(specialize_shapes)}")
        args, named, out, torch_in = _numpy_views(self.checked, args, named, out, cuda_ok=False)
        b = _bind(self.checked, _positional(self.checked, args, named), out, False)
        for name, a in (*b.arrays.items(), *b.inout.items()):
            if not isinstance(a, np.ndarray):
                raise TCArgumentError(
                    f"{name} is a device array ({type(a).__name__}); calling the TC function "
                    "runs on the CPU and takes numpy arrays or CPU PyTorch tensors",
                    notes=("for the GPU: tc.compile(source, name, *inputs, target='cuda')",))
        spec = b.specialization(self)
        self._output_layout(b)  # rejects impossible output shapes before compiling
        sizes = tuple(sorted(b.sizes.items()))
        large = self._large_buffers.get((spec, sizes))
        if large is None:  # (refuses tensors Halide cannot index; memoised for loops)
            if len(self._large_buffers) > 4096:
                self._large_buffers.clear()
            large = needs_large_buffers(self.checked, self._infer(spec), b.sizes)
            self._large_buffers[spec, sizes] = large
        shapes = sizes if specialize_shapes else None
        # (inputs without elements: a kernel of their own, which never reads them; `lower`)
        absent = absent_inputs(self.checked, b.sizes)
        kernel = self._kernel_once((spec, schedule, large, shapes, absent), lambda: CpuKernel(
            lower(self.checked, self._infer(spec), dict(spec), cpu=True, absent=absent),
            b.sizes, schedule, specialize_shapes=bool(specialize_shapes), large_buffers=large))
        return kernel, b, torch_in

    def _kernel_once(self, key: tuple, make) -> CpuKernel:
        """The kernel of `key`, made by `make()` once however many threads ask: one that asks
        while another makes it waits for it (a backward kernel compiled ahead, `compile_ahead`).
        Warnings held for a kernel made ahead are issued to the first caller that gets it."""
        while True:
            with self._kernel_lock:
                kernel = self._kernels.get(key)
                pending = self._pending.get(key)
                if kernel is None and pending is None:
                    pending = self._pending[key] = threading.Event()
                    break
            if kernel is not None:
                for message in kernel.take_deferred_warnings():
                    warn(message)
                return kernel
            pending.wait()  # (made elsewhere; where that failed, made here, with its error)
        try:
            kernel = make()
            held = deferred_warnings()
            if held:  # (made ahead: its warnings go with it, before any caller can get it)
                kernel.defer_warnings(held)
                held.clear()
            with self._kernel_lock:
                self._kernels[key] = kernel
            return kernel
        finally:
            with self._kernel_lock:
                self._pending.pop(key).set()

    def compile_ahead(self, *args) -> threading.Thread:
        """Starts compiling, on a thread of its own, the CPU kernel that a plain call with
        arguments of these shapes and dtypes (their values do not matter) will run, and returns
        the thread. The call then waits for it rather than compiling again, and gets its
        warnings. Halide compiles without the GIL, so this runs alongside the caller's own
        compiles and kernels: tcstage.torch compiles a layer's backward while its forward
        compiles and runs. Errors are left to the call, which meets them again."""
        def work() -> None:
            with warnings_deferred():
                try:
                    self._cpu_kernel(args, {}, None, _DEFAULT, None)
                except Exception:  # (the call that needs the kernel raises it)
                    pass
        # (not a daemon: Python waits for it at exit, where a daemon thread in the middle of a
        # compile would be killed as it took the GIL back, aborting the process)
        thread = threading.Thread(target=work, name=f"tcstage-compile-{self.name}")
        thread.start()
        return thread

    def explain(self, *args, out=None, schedule=_DEFAULT, specialize_shapes: bool | None = None,
                **named) -> str:
        """What the CPU schedule of a call with these arguments does: the schedule applied
        (and why, where it is not the one asked for), then one line per Func from the
        structured scheduler (its family, tiles, packed operands, parallel loop)."""
        kernel, _, _ = self._cpu_kernel(args, named, out, schedule, specialize_shapes)
        return kernel.explain()

    def __call__(self, *args, out=None, schedule=_DEFAULT, specialize_shapes: bool | None = None,
                 **named):
        """Runs on the CPU. Tensors are numpy arrays or CPU PyTorch tensors (taken without a
        copy where Halide can read them; the results are then PyTorch tensors too), scalars
        Python or numpy numbers, given in signature order or by their TC names
        (`prog.tmm(A=a, B=b)`).
        `out` supplies in/out outputs (those that accumulate into the caller's values), as one
        array or a tuple in output order; they are updated in place. `schedule`: 'tcstage' (the
        default; docs/cpu.md), a `tc.CpuSchedule` or its text, one of `jit.AUTOSCHEDULERS`, or
        None (or 'none') for Halide's unscheduled code.
        `specialize_shapes`: False compiles one kernel for all sizes (the first call's sizes
        guide the autoscheduler), True one per set of shapes (Halide knows them as constants);
        None (the default) is False, except for functions whose subscripts read a tensor they
        compute (`self.specializes_shapes`).
        Returns an array, or a tuple for several outputs."""
        plain = out is None and not named and schedule is _DEFAULT and specialize_shapes is None
        key = _fast_key(args) if plain else None
        if key is not None:
            fast = self._fast_calls.get(key)
            if fast is not None:
                return fast(args)
        kernel, b, torch_in = self._cpu_kernel(args, named, out, schedule, specialize_shapes)
        results = kernel(b.arrays, b.scalars, b.inout, b.sizes,
                         allocate=_torch_aligned_empty if torch_in is not None else None)
        if key is not None and not torch_in and not b.inout:
            # (made after the run, which chose the pipeline serving these sizes)
            if len(self._fast_calls) > 1024:  # a memo for loops over a few shapes
                self._fast_calls.clear()
            self._fast_calls[key] = _FastCall.of(kernel, self.checked, b.sizes, args,
                                                 torch=torch_in is not None)
        for name, res in zip(self.checked.outputs, results):
            if name in b.inout:  # in/out outputs are updated in place, like numpy's out=
                b.inout[name][...] = res
        final = [b.inout.get(n, r) for n, r in zip(self.checked.outputs, results)]
        if torch_in is not None:  # the caller's own out= tensors, the others as torch views
            final = [torch_in.get(n) if n in torch_in else _as_torch(r)
                     for n, r in zip(self.checked.outputs, final)]
        return final[0] if len(final) == 1 else tuple(final)

    def _check_where_ranges(self, fr: R.FunctionRanges, values: Mapping[str, int]) -> None:
        """A where range whose end lies before its start is an error: ranges inferred through
        it would grow as it shrinks (`m in 0:s` with s = -1 gave N + 2 windows). An empty
        range (equal bounds) is valid: a reduction over it gives the identity."""
        for st, sr in zip(self.checked.statements, fr.statements):
            for w in st.where:
                begin, end = sr.ranges[w.var].evaluate(values)
                if end < begin:
                    used = sorted(n for n in values if n in _names_in(w))
                    given = ", ".join(f"{n} = {values[n]}" for n in used)
                    raise TCArgumentError(
                        f"the where range of '{w.var}' ends before it starts: {begin}:{end}"
                        + (f" for {given}" if given else ""), w.span,
                        (f"an empty range has equal bounds, such as "
                         f"'{w.var} in {begin}:{begin}'",))

    def _output_layout(self, b: Binding) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        spec = b.specialization(self)
        values = {**b.sizes, **_int_scalars(b)}
        key = (spec, tuple(sorted(values.items())))
        layout = self._layouts.get(key)
        if layout is None:  # (a memo for calls in a loop: it costs as much as a small kernel)
            if len(self._layouts) > 4096:
                self._layouts.clear()
            layout = self._layouts[key] = self._compute_output_layout(spec, values)
        return layout

    def _compute_output_layout(self, spec, values) -> list:
        fr = self._infer(spec)
        self._check_where_ranges(fr, values)
        layout = []
        for name in self.checked.outputs:
            tb = fr.tensors[name]
            extents = tuple(evaluate(e, values) for e in tb.extents)
            mins = tuple(evaluate(m, values) for m in tb.mins)
            bad = [k for k, e in enumerate(extents) if e < 0]
            if bad:
                k = bad[0]
                raise TCArgumentError(
                    f"output '{name}' would have a negative extent {extents[k]} in dimension {k} "
                    f"(inferred as {R.tree_to_str(tb.extents[k])}) for these inputs")
            layout.append((extents, mins))
        return layout


def absent_inputs(fn: C.Function, sizes: Mapping[str, int], dynamic=()) -> frozenset:
    """The inputs with no elements at `sizes` (a dimension of size 0), but for those that a
    size in `dynamic` empties: what `lower` may take as never read."""
    return frozenset(
        t.name for t in fn.inputs if t.rank and any(
            d == "0" or d in sizes and sizes[d] == 0 and d not in dynamic for d in t.dims))


def _fast_key(args) -> tuple | None:
    """What a call's checks, specialisation and compiled kernel depend on, for plain calls
    (numpy arrays, dense CPU PyTorch tensors or Parameters, and Python or numpy scalars in
    signature order): each array's shape, dtype, strides and flags, each scalar's type, and
    its value but for a float's (no size depends on one, and a float such as a loss changes
    with every call: the memo passes it with each call). None for anything else (lists,
    other tensors), which takes the full path. (Tensors are tested first: a call from
    tcstage.torch passes nothing else, and each test costs 0.1-0.2 us.)"""
    key = []
    torch = _torch()
    tensors = (torch.Tensor, torch.nn.Parameter) if torch is not None else ()
    for a in args:
        kind = type(a)
        if kind in tensors:
            # (no is_conj(): only a complex tensor has the bit, and no call with one passes)
            try:
                if not a.is_cpu or a.layout != torch.strided or a.is_neg() or \
                        a.data_ptr() % a.element_size():
                    return None
            except RuntimeError:  # (a tensor without storage: a torch.func transform's)
                return None
            key.append((a.shape, a.dtype, a.stride()))
        elif kind is np.ndarray:
            key.append((a.shape, a.dtype, a.strides, a.flags.writeable, a.flags.aligned))
        elif kind is float or isinstance(a, np.floating):
            key.append(kind)
        elif kind in (int, bool) or isinstance(a, np.generic):
            key.append((kind, a))
        else:
            return None
    return tuple(key)


@attrs.frozen(eq=False)
class _FastCall:
    """A call whose arguments have the key (`_fast_key`) of one that was checked and bound
    already: it goes straight to the kernel, with the sizes that call found. (The full path
    costs about 20 us per call with numpy arrays and 60 with tensors, as much as a small
    kernel.) With PyTorch tensors among the arguments (`torch`), the outputs are PyTorch's.
    Where the key fixes every layout the pipeline takes as it is (`prepared`), a call passes
    the arrays' addresses to the compiled library and allocates the outputs, nothing more;
    otherwise tensors are read through numpy views, as on the full path."""

    kernel: CpuKernel
    fn: C.Function
    sizes: dict
    torch: bool = False
    prepared: PreparedRun | None = None
    # (per argument `prepared` passes, a float scalar's conversion, None for a buffer; empty
    # where no float scalar is passed)
    conversions: tuple = ()
    sorted_sizes: tuple = attrs.field(init=False)
    torch_dtypes: tuple = attrs.field(init=False)  # of the outputs, where prepared and torch

    @sorted_sizes.default
    def _sorted(self) -> tuple:
        return tuple(sorted(self.sizes.items()))

    @torch_dtypes.default
    def _torch_dtypes(self) -> tuple:
        if self.prepared is None or not self.torch:
            return ()
        return tuple(_as_torch(np.empty(0, dtype)).dtype for _, dtype in self.prepared.outputs)

    @staticmethod
    def of(kernel: CpuKernel, fn: C.Function, sizes: dict, args, torch: bool) -> "_FastCall":
        """The memo of a call with these arguments, after it ran."""
        if torch:  # (PyTorch is loaded: kernels run on its OpenMP team; aot.py)
            share_torch_threads()
        inputs, conversions = [], {}
        for t, a in zip(fn.inputs, args):
            if not t.rank and (type(a) is float or isinstance(a, np.floating)):
                inputs.append(PER_CALL)  # (a float: its value comes with each call)
                conversions[len(inputs) - 1] = functools.partial(scalar_argument, t=t.type)
            elif not t.rank and (type(a) in (int, bool) or isinstance(a, np.generic)):
                inputs.append(a)  # (a number: the memo's key holds its value, baked in)
            elif not t.rank:  # (a 0-dimensional tensor or array for a scalar, as a rank-
                inputs = None  # polymorphic function's instance at rank 0 takes: its value
                break          # changes from call to call under the same key)
            elif type(a) is np.ndarray and a.flags.c_contiguous and a.flags.aligned:
                inputs.append((a.shape, a.dtype))
            elif type(a) is not np.ndarray and a.is_contiguous():
                inputs.append((tuple(a.shape), _tensor_view(a).dtype))
            else:
                inputs = None
                break
        fast = _FastCall(kernel, fn, sizes, torch)
        prepared = kernel.prepared(fast.sorted_sizes, inputs) if inputs is not None else None
        if prepared is not None:
            fast = attrs.evolve(fast, prepared=prepared, conversions=tuple(
                conversions.get(k) for k in prepared.passed) if conversions else ())
        return fast

    def __call__(self, args):
        prepared = self.prepared
        if prepared is not None:
            if self.conversions:
                hosts = [a if type(a) is np.ndarray else a.data_ptr() if convert is None
                         else convert(a)
                         for a, convert in zip(map(args.__getitem__, prepared.passed),
                                               self.conversions)]
            else:
                hosts = [a if type(a) is np.ndarray else a.data_ptr()
                         for a in map(args.__getitem__, prepared.passed)]
            outputs = []
            if self.torch:
                empty = _torch().empty
                for (shape, like), dtype in zip(prepared.outputs, self.torch_dtypes):
                    # (sizes as arguments: a tuple costs PyTorch's parser 0.7 us more)
                    out = empty(*shape, dtype=dtype) if shape else empty(shape, dtype=dtype)
                    host = out.data_ptr()
                    if host % OUTPUT_ALIGNMENT:  # (PyTorch's allocator aligns to 64: never)
                        out = _as_torch(_torch_aligned_empty(shape, like))
                        host = out.data_ptr()
                    outputs.append(out)
                    hosts.append(host)
            else:
                for shape, dtype in prepared.outputs:
                    outputs.append(aligned_empty(shape, dtype))
                hosts += outputs
            if prepared.call(hosts) == 0:
                return outputs[0] if len(outputs) == 1 else tuple(outputs)
            # (a failure: the full run below says what failed, or runs another pipeline)
        arrays, scalars = {}, {}
        for t, a in zip(self.fn.inputs, args):
            if not t.rank:
                scalars[t.name] = a
            elif self.torch and type(a) is not np.ndarray:
                arrays[t.name] = _tensor_view(a)
            else:
                arrays[t.name] = a
        results = self.kernel(arrays, scalars, {}, self.sizes, sorted_sizes=self.sorted_sizes,
                              allocate=_torch_aligned_empty if self.torch else None)
        if self.torch:
            results = [_as_torch(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)


def _tensor_view(tensor) -> np.ndarray:
    """A numpy view of a dense CPU tensor's memory (bfloat16 through its bits)."""
    if tensor.requires_grad:  # (numpy() refuses it; detach() costs more than the test)
        tensor = tensor.detach()
    if tensor.dtype is _torch().bfloat16:
        return tensor.view(_torch().int16).numpy().view(_BFLOAT16)
    return tensor.numpy()


def _subscripts_read_computed_tensors(fn: C.Function) -> bool:
    """Whether a subscript of a read reads a tensor the function computes (`T(T(i))`)."""
    computed = {n for n, t in fn.tensors.items() if t.kind != "input"}
    return any(inner.tensor in computed
               for st in fn.statements
               for r in C.walk(st.rhs) if isinstance(r, C.Read)
               for a in r.args
               for inner in C.walk(a) if isinstance(inner, C.Read))


def _torch_aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An output array in memory PyTorch allocates (so a torch caller's outputs are its own
    tensors), aligned as Halide's outputs must be (jit.aligned_empty)."""
    torch, alignment = _torch(), OUTPUT_ALIGNMENT
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8)
    start = (-raw.data_ptr()) % alignment
    return raw.numpy()[start:start + nbytes].view(dtype).reshape(shape)


def _torch():
    """PyTorch if the caller has imported it (a torch tensor can exist only then), else None."""
    return sys.modules.get("torch")


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _as_torch(a: np.ndarray):
    """A PyTorch tensor over a's memory (torch.from_numpy, which knows no ml_dtypes bfloat16:
    that goes through its bits)."""
    torch = _torch()
    if a.dtype == _BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _numpy_views(fn: C.Function, args: Sequence, named: Mapping, out, cuda_ok: bool):
    """The arguments with every CPU PyTorch tensor replaced by a numpy view of its memory (no
    copy; `.detach()`ed first). Returns (args, named, out, torch_out): torch_out is None when
    no argument was a torch tensor, else the out= tensors by output name (the call returns
    them, updated in place). CUDA tensors stay as they are where `cuda_ok` (shape-only calls
    read them through __cuda_array_interface__), else they are a TCArgumentError."""
    torch = _torch()
    if torch is None:
        return args, named, out, None
    seen = []

    def view(value, what: str, written: bool = False):
        if not isinstance(value, torch.Tensor):
            return value
        seen.append(value)
        if value.device.type != "cpu":
            if cuda_ok:
                return value
            raise TCArgumentError(
                f"{what} is a PyTorch tensor on {value.device}; calling the TC function runs on "
                "the CPU and takes numpy arrays or CPU tensors",
                notes=(f"move it with {what}.cpu(), or for the GPU: "
                       "tc.compile(source, name, *inputs, target='cuda')",))
        if value.layout != torch.strided:
            raise TCArgumentError(f"{what} is a {value.layout} PyTorch tensor; tcstage takes "
                                  "dense (strided) tensors", notes=(f"use {what}.to_dense()",))
        if written and value.requires_grad:
            raise TCArgumentError(f"out= tensor {what} requires grad; tcstage writes it in "
                                  "place, which autograd cannot follow",
                                  notes=(f"pass {what}.detach() to update it anyway",))
        tensor = value.detach().resolve_conj().resolve_neg()
        if tensor.dtype == torch.bfloat16:  # (numpy has no bfloat16: its bits, as ml_dtypes')
            return tensor.view(torch.int16).numpy().view(_BFLOAT16)
        try:
            return tensor.numpy()
        except (TypeError, RuntimeError) as e:  # a dtype numpy lacks: bfloat16, float8, ...
            raise TCArgumentError(f"{what} is a PyTorch tensor of dtype {value.dtype}, which "
                                  f"numpy cannot view ({str(e).strip()})",
                                  notes=(f"convert it with {what}.float()",)) from None

    names = [t.name for t in fn.inputs]
    args = tuple(view(a, names[k] if k < len(names) else f"argument {k + 1}")
                 for k, a in enumerate(args))
    named = {n: view(a, n) for n, a in named.items()}
    inouts = [n for n in fn.outputs if fn.tensors[n].inout]
    torch_out = {}
    if isinstance(out, (tuple, list)):
        views = []
        for k, a in enumerate(out):
            name = inouts[k] if k < len(inouts) else f"out[{k}]"
            views.append(view(a, name, written=True))
            if views[-1] is not a:
                torch_out[name] = a
        out = type(out)(views)
    elif out is not None:
        name = inouts[0] if inouts else "out"
        viewed = view(out, name, written=True)
        if viewed is not out:
            torch_out[name] = out
        out = viewed
    return args, named, out, (torch_out if seen else None)


def _names_in(w: C.RangeConstraint) -> set[str]:
    """The names a where range's text mentions (to show the values of its sizes and scalars)."""
    return set(re.findall(r"[A-Za-z_]\w*", w.span.text())) if w.span is not None else set()


def _int_scalars(b: Binding) -> dict:
    return {k: int(v) for k, v in b.scalars.items() if isinstance(v, (int, np.integer))}


def _positional(fn: C.Function, args: Sequence, named: Mapping[str, object]) -> tuple:
    """The arguments in signature order: `args` first, then `named` by TC input name."""
    if not named:
        return tuple(args)
    inputs = [t.name for t in fn.inputs]
    slots = dict(zip(inputs, args))
    for name, value in named.items():
        if name not in inputs:
            near = difflib.get_close_matches(name, inputs, n=1)
            raise TCArgumentError(
                f"'{fn.name}' has no input named '{name}'"
                + (f"; did you mean '{near[0]}'?" if near else "")
                + f" Its inputs: {', '.join(inputs)}")
        if name in slots:
            raise TCArgumentError(f"'{fn.name}' got input '{name}' twice: as positional argument "
                                  f"{inputs.index(name) + 1} and by name")
        slots[name] = value
    missing = [n for n in inputs if n not in slots]
    if missing:
        raise TCArgumentError(f"'{fn.name}' is missing input{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)} (it takes {', '.join(inputs)})")
    return tuple(slots[n] for n in inputs)


def _bind(fn: C.Function, args: Sequence, out, shapes_only: bool) -> Binding:
    if len(args) != len(fn.inputs):
        names = ", ".join(t.name for t in fn.inputs)
        raise TCArgumentError(f"'{fn.name}' takes {len(fn.inputs)} input"
                              f"{'s' if len(fn.inputs) != 1 else ''} ({names}), got {len(args)}")
    sizes: dict[str, int] = {}
    origin: dict[str, str] = {}
    scalars, arrays = {}, {}
    for t, a in zip(fn.inputs, args):
        if t.rank == 0:
            scalars[t.name] = _scalar(fn, t, a)
            continue
        shape = _shape_of(fn, t, a, shapes_only)
        if not shapes_only or array_info(a) is not None:
            arrays[t.name] = a if array_info(a) is not None else None
        for k, (d, n) in enumerate(zip(t.dims, shape)):
            where = f"{t.name} dimension {k}"
            if d.isdigit():
                if n != int(d):
                    raise TCArgumentError(f"{where} must have size {d}, got {n}")
            elif d in sizes and sizes[d] != n:
                raise TCArgumentError(
                    f"size variable {d} is {sizes[d]} from {origin[d]} but {n} from {where}")
            else:
                sizes.setdefault(d, n)
                origin.setdefault(d, where)
    inout = _bind_inout(fn, out, sizes, shapes_only)
    return Binding(sizes, scalars, arrays, inout)


def _bind_inout(fn: C.Function, out, sizes: dict, shapes_only: bool) -> dict:
    inouts = [fn.tensors[n] for n in fn.outputs if fn.tensors[n].inout]
    if out is None:
        if inouts:
            t = inouts[0]
            raise TCArgumentError(
                f"output '{t.name}' of '{fn.name}' starts from the caller's values (its first "
                "statement reads it or accumulates without '!'); pass them with out=")
        return {}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(inouts):
        raise TCArgumentError(f"out= takes {len(inouts)} array(s), for "
                              f"{', '.join(t.name for t in inouts) or 'no in/out output'}; "
                              f"got {len(outs)}")
    bound = {}
    for t, a in zip(inouts, outs):
        shape = _shape_of(fn, t, a, shapes_only)
        if isinstance(a, np.ndarray) and not a.flags.writeable:
            raise TCArgumentError(f"out= array for '{t.name}' is read-only")
        if array_info(a) is not None:
            bound[t.name] = a
        sizes.update({d: n for d, n in zip(t.dims, shape)})
    return bound


def array_info(a) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of a numpy array or of a device array exposing `__cuda_array_interface__`
    (PyTorch CUDA tensors, CuPy arrays, pycuda GPUArrays); None for anything else."""
    if isinstance(a, np.ndarray):
        return a.shape, a.dtype
    if type(a).__module__.split(".")[0] == "torch" and str(getattr(a, "dtype", "")) == \
            "torch.bfloat16" and a.is_cuda:  # (its interface says "|V2", or raises, by version)
        return tuple(a.shape), _BFLOAT16
    iface = getattr(a, "__cuda_array_interface__", None)
    if isinstance(iface, dict) and "shape" in iface and "typestr" in iface:
        return tuple(int(n) for n in iface["shape"]), np.dtype(iface["typestr"])
    return None


def _shape_of(fn: C.Function, t: C.Tensor, a, shapes_only: bool) -> tuple[int, ...]:
    info = array_info(a)
    if info is not None:
        shape, dtype = info
        if len(shape) != t.rank:
            raise TCArgumentError(f"'{fn.name}' expects {t.name} of rank {t.rank} "
                                  f"({t.type}({', '.join(t.dims)})), got an array of shape "
                                  f"{shape}")
        got = from_numpy(dtype)
        if got != t.type:
            module = "ml_dtypes" if t.type.kind == "bfloat" else "numpy"  # (numpy has none)
            raise TCArgumentError(f"'{fn.name}' expects {t.name} of type {t.type} "
                                  f"({module} {t.type.numpy}), got {dtype}",
                                  notes=(f"convert with {t.name}.astype({module}."
                                         f"{t.type.numpy})",))
        return shape
    if shapes_only and isinstance(a, (tuple, list)) and all(
            isinstance(n, (int, np.integer)) for n in a):
        if len(a) != t.rank:
            raise TCArgumentError(f"'{fn.name}' expects {t.name} of rank {t.rank}, got shape "
                                  f"{tuple(a)}")
        if any(n < 0 for n in a):
            raise TCArgumentError(f"shape {tuple(a)} of {t.name} has a negative size")
        return tuple(int(n) for n in a)
    what = "an array or a shape tuple" if shapes_only else \
        "an array (numpy, or a device array with __cuda_array_interface__)"
    raise TCArgumentError(f"'{fn.name}' expects {t.name} as {what}, got {type(a).__name__}")


def _scalar(fn: C.Function, t: C.Tensor, a):
    if isinstance(a, np.ndarray) and a.ndim == 0:
        a = a[()]
    if isinstance(a, (bool, np.bool_)) and t.type.kind != "bool":
        raise TCArgumentError(f"scalar input {t.name} is {t.type}, got a bool")
    if t.type.is_float and (isinstance(a, (int, float, np.integer, np.floating))
                            or isinstance(a, np.generic) and from_numpy(a.dtype) is not None
                            and from_numpy(a.dtype).is_float):  # (an ml_dtypes bfloat16)
        return float(a)
    if t.type.kind in ("int", "uint") and isinstance(a, (int, np.integer)):
        info = np.iinfo(t.type.numpy)
        if not info.min <= int(a) <= info.max:
            raise TCArgumentError(f"scalar input {t.name} is {t.type}; {a} is out of its range")
        return int(a)
    if t.type.kind == "bool" and isinstance(a, (bool, np.bool_)):
        return bool(a)
    raise TCArgumentError(f"scalar input {t.name} of '{fn.name}' is {t.type}, got "
                          f"{type(a).__name__} {a!r}")
