"""`tc.compare`: one TC function at one set of sizes under every schedule worth comparing, on the
same inputs, in one process: the naive kernel, the presets, manual options (given, and the lines
of `schedules/*.txt` written for this function at these sizes), the tuned options (the cache's,
else a short tuning run), a framework baseline (einsum where the TC is safely translatable,
else the Halide CPU back end) and the Halide CPU autoschedulers.

A Halide pipeline (`tc.from_halide`) is compared the same way, as `tc.compare(f, *inputs,
output_shape=...)`: its CUDA kernels as above, and on the CPU the schedules `f(...,
schedule=...)` offers (docs/halide.md). Its baseline is the pipeline with your own Halide
schedule where you pass one (`manual=`, another `from_halide` of the same pipeline, scheduled),
else tcstage's default CPU schedule; its reference, every intermediate computed at the root.

Every CUDA schedule is checked against the Halide CPU result (on the GPU, or emulated) and timed
on the GPU, or else its time is the cost model's prediction; the table says which. A schedule
that fails to compile is a row with the error.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
import warnings

import attrs
import numpy as np

from tcstage.errors import TCError
from tcstage.options import MappingOptions
from tcstage.tune import evaluate
from tcstage.tune.evaluate import fresh as _fresh
from tcstage.tune.tuner import PRESETS

CPU_RUNS = 5  # timed runs of a CPU schedule after a warm-up run (the median counts)
CHECKED_CPU = "cpu"  # a CPU row's outputs compared with the reference's, all of them
GPU_RUNS = 20


@attrs.frozen
class Row:
    """One schedule: `kind` is naive (the single-thread options), preset, manual, auto (the
    structural default behind options="auto"), tuned, baseline or cpu; `time` seconds per call
    (None when it failed), `measured` whether it was measured (on the GPU or this CPU) or else
    predicted by the cost model; `ratio` time / the baseline's for measured rows, time / the
    auto row's for predicted ones (a prediction is never divided by a measurement);
    `correct` True/False, or None when not checked; `checked` how it was checked ("gpu",
    "emulated", "sampled (...)", "cpu") or why not; `how` how the time was obtained."""

    name: str
    kind: str
    options: str
    time: float | None
    ratio: float | None
    correct: bool | None
    how: str
    detail: str = ""
    measured: bool = True
    checked: str = ""


KINDS = ("naive", "preset", "manual", "auto", "tuned", "baseline", "cpu")
_COLORS = {"naive": "tab:gray", "preset": "tab:blue", "manual": "tab:purple",
           "auto": "tab:cyan", "tuned": "tab:green", "baseline": "tab:red", "cpu": "tab:orange"}


@attrs.frozen
class CompareResult:
    function: str
    sizes: dict
    rows: tuple[Row, ...]
    baseline: str  # the baseline row's name
    tune: object = None  # the TuneResult of a tuning run made for the comparison, if one ran

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def measured(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.measured)

    @property
    def predicted(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if not r.measured)

    def table(self) -> str:
        """Two sections that share no column: measured times (against the baseline) and the
        cost model's predictions (against the auto row)."""
        lines = [f"{self.function} ({', '.join(f'{k}={v}' for k, v in self.sizes.items())}); "
                 f"baseline: {self.baseline}"]
        sections = [("measured", self.measured, f"vs {self.baseline}", "time per call"),
                    ("predicted by the cost model (H100), not measured: not comparable with "
                     "measured times", self.predicted, "vs auto", "predicted time per call")]
        for title, rows, versus, what in sections:
            if not rows:
                continue
            unit, scale = _unit([r.time for r in rows if r.time is not None])
            head = ("schedule", f"{what} ({unit})", versus, "correct", "checked", "how")
            body = [(r.name, "failed" if r.time is None else f"{r.time / scale:.4g}",
                     f"{r.ratio:.3g}x" if r.ratio is not None else "-",
                     {True: "yes", False: "WRONG", None: "-"}[r.correct],
                     _short(r.checked), r.how) for r in rows]
            widths = [max(len(x[k]) for x in [head, *body]) for k in range(len(head))]
            lines += ["", f"{title}:"]
            for k, cells in enumerate([head, *body]):
                lines.append("  ".join(c.ljust(w) if i in (0, 3, 4, 5) else c.rjust(w)
                                       for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
                if k == 0:
                    lines.append("  ".join("-" * w for w in widths))
        notes = [f"  {r.name}: {r.detail}" for r in self.rows if r.detail]
        if notes:
            lines += ["", "notes:", *notes]
        return "\n".join(lines)

    __str__ = table

    def plot(self, path) -> None:
        """A PNG: measured times and predicted times in panels of their own (log scale, units
        on the axes, a legend of the kinds of schedule; unchecked rows hatched), and, if a
        tuning run was made, its curve (best time against candidates evaluated)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import NullFormatter
        panels = [(title, [r for r in rows if r.time is not None and r.time > 0])
                  for title, rows in (("measured", self.measured),
                                      ("predicted by the cost model (H100)", self.predicted))]
        panels = [(t, rows) for t, rows in panels if rows]
        curve = self.tune.curve() if self.tune is not None else []
        count = max(len(panels) + bool(curve), 1)
        tallest = max([len(rows) for _, rows in panels] or [1])
        fig, axes = plt.subplots(1, count, figsize=(6.5 * count, max(3.5, 0.35 * tallest + 2)),
                                 squeeze=False)
        for ax, (title, rows) in zip(axes[0], panels):
            unit, scale = _unit([r.time for r in rows])
            names = [r.name + (" (WRONG)" if r.correct is False else
                               "" if r.correct else " (unchecked)") for r in rows]
            bars = ax.barh(range(len(rows)), [r.time / scale for r in rows],
                           color=[_COLORS.get(r.kind, "tab:gray") for r in rows],
                           edgecolor="black", linewidth=0.3)
            for bar, r in zip(bars, rows):
                if not r.correct:
                    bar.set_hatch("//")
            ax.set_yticks(range(len(rows)), names, fontsize=8)
            ax.invert_yaxis()
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # (labels on decades only)
            ax.set_xlabel(f"{'time' if rows[0].measured else 'predicted time'} per call "
                          f"({unit}, log scale)")
            ax.set_title(f"{self.function}: {title}", fontsize=10)
            handles = [Patch(color=_COLORS[k], label=k) for k in KINDS
                       if any(r.kind == k for r in rows)]
            if any(not r.correct for r in rows):
                handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                                     label="not checked or wrong"))
            ax.legend(handles=handles, fontsize=7, loc="lower right")
        if curve:
            ax = axes[0][len(panels)]
            xs, ys = zip(*curve)
            unit, scale = _unit(list(ys))
            evaluated = self.tune.counts()["evaluated"]
            ax.step([*xs, evaluated], [y / scale for y in (*ys, ys[-1])], where="post",
                    marker="o", label=f"best so far ({self.tune.strategy})")
            ax.set_xlabel("candidates evaluated (compiled; those pruned before compiling are "
                          "not counted)", fontsize=8)
            what = "time" if self.tune.measured_on != "model" else "predicted time"
            ax.set_ylabel(f"best {what} per call ({unit})")
            ax.set_title(f"tuning run ({self.tune.measured_on})", fontsize=10)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
        plt.close(fig)


def _unit(times) -> tuple[str, float]:
    """The unit that suits these seconds best: ('us', 1e-6), ('ms', 1e-3) or ('s', 1.0)."""
    typical = statistics.median(times) if times else 1e-6
    return ("s", 1.0) if typical >= 1 else ("ms", 1e-3) if typical >= 1e-3 else ("us", 1e-6)


def _short(checked: str) -> str:
    return checked if len(checked) <= 48 else checked[:45] + "..."


def compare(source, name=None, *inputs, options=(), schedules_dir="schedules", tune_budget=30,
            measure=None, cache=None, progress=True, plot=None, filename=None,
            output_shape=None, manual=None) -> CompareResult:
    """Compares schedules of TC function `name` of `source` (TC text or a Program) on `inputs`
    (arrays, or shape tuples for random inputs; scalars as values). A Halide pipeline has no
    name: `compare(f, *inputs, output_shape=..., manual=None)` (see the module's docstring).

    options: extra manual MappingOptions (objects or chain text). schedules_dir: where the
    `*.txt` schedule files are (lines `name | file:function | sizes | options`; those for this
    function, TC file when known, and exactly these sizes are compared). tune_budget: candidates
    of the tuning run made when the cache has no tuned options (0: none). measure: "gpu",
    "model" or None (the GPU if one works here). plot: a path for a PNG.
    """
    from tcstage.compiler import as_options, function_of
    from tcstage.inputs import as_out, random_inputs
    from tcstage.program import define
    from tcstage.inputs import is_shape
    from tcstage.tune.tuner import _measure
    if isinstance(source, str):
        source = define(source, filename or "<string>")
    program, fn, inputs = function_of(source, name, inputs, output_shape)
    if program is None:
        _check_manual(fn, manual)
    elif manual is not None:
        raise TCError("manual= is a Halide pipeline with your own schedule, for comparing a "
                      "pipeline (tc.from_halide); a TC function's manual schedules are options=")
    if program is not None and program.filename != "<string>":
        filename = filename or program.filename
    if isinstance(options, (str, MappingOptions)):
        options = (options,)
    manual_options = [as_options(o) for o in options]  # bad options are the caller's error
    binding = fn.bind(inputs, None, shapes_only=True)
    values = {**binding.sizes, **{k: v for k, v in binding.scalars.items()
                                  if not isinstance(v, np.ndarray)}}
    sizes = dict(values)
    random_args, random_outs = random_inputs(fn.checked, values, 0)
    given = all(not is_shape(a) for a in inputs) and any(isinstance(a, np.ndarray)
                                                          for a in inputs)
    args = tuple(inputs) if given else tuple(random_args)
    out = as_out(random_outs)
    measure = _measure(measure)

    schedules = [("single thread", "naive", MappingOptions(), "")]
    schedules += [(f"preset {p}", "preset", MappingOptions.named(p), "") for p in PRESETS]
    schedules += [(f"manual {k}", "manual", o, "") for k, o in enumerate(manual_options, 1)]
    schedules += [(n, "manual", o, where) for n, o, where in
                  schedule_lines(schedules_dir, fn.name, filename, sizes)]

    with _Bar(progress, len(schedules) + 8, fn.name) as bar:
        # Tuning first: its workers are forked, and CUDA must not have started in this process.
        tune, tuned, tuned_from = _tuned(program, fn, binding, args, out, measure, cache,
                                         tune_budget, progress, bar)
        if tuned is not None:
            schedules.append(("tuned", "tuned", tuned, tuned_from))
        bar.step("the Halide CPU reference")
        reference = evaluate.reference_outputs(fn, args, out)
        rows = []
        bar.step("auto")
        rows.append(_auto_row(fn, args, out, reference, measure))
        for label, kind, opts, where in schedules:
            bar.step(label)
            rows.append(_cuda_row(fn, args, out, reference, label, kind, opts, where, measure))
        bar.step("baseline")
        base = _baseline(fn, args, out, reference) if program is not None else \
            _pipeline_baseline(fn, args, reference, manual)
        cpu = []
        from tcstage.halide.jit import AUTOSCHEDULERS, STRUCTURED
        extra = () if program is not None else ("root",)
        for schedule in (STRUCTURED, *AUTOSCHEDULERS, *extra):
            bar.step(f"CPU {schedule}")
            cpu.append(_cpu_row(fn, args, out, reference, schedule))
    rows.append(base)
    rows += cpu
    # ratios within a section only: a measured time against the baseline, a predicted one
    # against the auto row's prediction
    auto = rows[0].time if not rows[0].measured else None
    rows = tuple(attrs.evolve(r, ratio=None if r.time is None else
                              r.time / base.time if r.measured and base.time else
                              r.time / auto if not r.measured and auto else None)
                 for r in rows)
    result = CompareResult(fn.name, sizes, rows, base.name, tune)
    if plot is not None:
        result.plot(plot)
    return result


def schedule_lines(directory, function: str, filename, sizes: dict):
    """(name, MappingOptions, where) of the schedule-file lines for this function (and TC file
    when known, by its base name) at exactly these sizes. Lines that do not parse are skipped."""
    found = []
    if not directory:
        return found
    for path in sorted(glob.glob(os.path.join(str(directory), "*.txt"))):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = [x.strip() for x in line.split("|")]
            if len(fields) != 4:
                continue
            label, where, text, chain = fields
            tc_file, _, fn_name = where.rpartition(":")
            if fn_name != function or (filename and tc_file and
                                       os.path.basename(tc_file) != os.path.basename(filename)):
                continue
            try:
                line_sizes = {k.strip(): int(v) for k, _, v in
                              (item.partition("=") for item in text.split(",") if item.strip())}
                if line_sizes != sizes:
                    continue
                found.append((label, MappingOptions.parse(chain), f"{path}:{number}"))
            except (ValueError, TCError):
                continue
    return found


def _tuned(program, fn, binding, args, out, measure, cache, budget, progress, bar):
    """(TuneResult or None, options or None, where from): the cache's tuned options for this
    device, else the best of a tuning run of `budget` candidates."""
    from tcstage.tune.model import H100
    from tcstage.tune.tuner import detect_gpu, autotune, tuned_options
    device = detect_gpu() if measure == "gpu" else f"model:{H100.name}"
    found = tuned_options(fn, binding, device, cache) if cache is not False else None
    if found is not None:
        return None, found, f"from the tuning cache ({device})"
    if not budget:
        return None, None, ""
    bar.step(f"tuning ({budget} candidates)")
    head = (program, fn.name) if program is not None else (fn,)  # (a pipeline has no name)
    with bar.paused():  # (never seeded with the manual lines it is compared with)
        result = autotune(*head, *args, out=_fresh(out), measure=measure,
                          budget=budget, cache=cache, progress=progress, manual_seeds=False)
    return result, result.options, (f"tuning run: {result.counts()['evaluated']} candidates "
                                    f"evaluated in {result.seconds:.1f} s, not seeded with "
                                    "the manual schedules")


def _auto_row(fn, args, out, reference, measure) -> Row:
    """What options="auto" compiles where the cache has nothing: the structural default (per
    launch of a kernel sequence, overlapped tiles where the model says they win)."""
    from tcstage.compiler import compile_cuda
    from tcstage.tune.heuristic import structural_default
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            options, per_launch, compiled, _ = structural_default(fn, args, out)
            if compiled is None:
                compiled = compile_cuda(fn, args, out, options, launch_options=per_launch)
    except TCError as e:
        return Row("auto (structural default)", "auto", "", None, None, None,
                   "failed to compile", evaluate._one_line(e), measure == "gpu")
    return _kernel_row(fn, args, out, reference, "auto (structural default)", "auto",
                       compiled, "what options='auto' compiles without tuned options",
                       measure)


def _cuda_row(fn, args, out, reference, label, kind, options, where, measure) -> Row:
    from tcstage.compiler import compile_cuda
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # options without effect go in the row's detail
            compiled = compile_cuda(fn, args, out, options)
    except TCError as e:
        return Row(label, kind, str(options), None, None, None, "failed to compile",
                   "; ".join(filter(None, [where, evaluate._one_line(e)])), measure == "gpu")
    return _kernel_row(fn, args, out, reference, label, kind, compiled, where, measure)


def _kernel_row(fn, args, out, reference, label, kind, compiled, where, measure) -> Row:
    """A compiled CUDA kernel checked against the reference (on the GPU, or emulated: whole,
    or a sample of its blocks where it is too large) and timed on the GPU or predicted."""
    from tcstage.cuda.runtime import Kernel
    from tcstage.tune import model
    text = str(compiled.options)
    gpu = measure == "gpu"
    notes = "; ".join(f"option {n}" for n in compiled.notes)
    detail = "; ".join(filter(None, [where, notes]))
    predicted = float(model.predict(compiled).time)
    how = "measured on the GPU" if gpu else "cost model (H100)"
    mode, why = ("gpu", "") if gpu else evaluate.how_to_check(evaluate.facts(compiled))
    if not mode:
        return Row(label, kind, text, predicted, None, None, how, detail, gpu, why)
    try:
        verdict = evaluate.check_kernel(Kernel(compiled, "cuda" if gpu else "cuda-emulated"),
                                        args, out, reference,
                                        evaluate.SAMPLE_RANDOM if mode == "sampled" else 0,
                                        runs=GPU_RUNS)
    except TCError as e:
        return Row(label, kind, text, None, None, None, "failed", "; ".join(
            filter(None, [detail, evaluate._one_line(e)])), gpu)
    correct = {"ok": True, "wrong": False}.get(verdict["status"])
    t = verdict.get("time") if gpu else predicted
    checked = verdict.get("checked", "") if correct is not None else verdict.get("detail", "")
    return Row(label, kind, text, t, None, correct, how, "; ".join(filter(None, [
        detail, verdict.get("detail", "") if correct is False else ""])), gpu, checked)


def _cpu_row(fn, args, out, reference, schedule) -> Row:
    from tcstage.halide.jit import STRUCTURED
    pipeline = not hasattr(fn, "source")
    label = {STRUCTURED: "CPU tcstage schedule" + ("" if pipeline else " (the default)"),
             "root": "CPU every intermediate at the root"}.get(schedule,
                                                               f"Halide CPU {schedule}")
    try:
        t, result = _timed(lambda: fn(*args, out=_fresh(out), schedule=schedule))
    except TCError as e:
        return Row(label, "cpu", "", None, None, None, "failed", evaluate._one_line(e))
    wrong = evaluate.compare(evaluate.as_tuple(result), reference, fn.checked.outputs)
    return Row(label, "cpu", "", t, None, not wrong, f"measured on the CPU (median of "
                                                     f"{CPU_RUNS})", wrong, checked=CHECKED_CPU)


def _baseline(fn, args, out, reference) -> Row:
    """einsum (PyTorch's if importable, else numpy's) when the TC translates safely, else the
    Halide CPU back end with its default schedule."""
    plan, why = einsum_plan(fn.checked)
    if plan is not None:
        try:
            import torch
        except ImportError:
            torch = None
        label = "torch.einsum (baseline)" if torch else "numpy.einsum (baseline)"
        try:
            t, result = _timed(lambda: run_einsum(plan, fn.checked, args, torch))
        except ValueError as e:  # extents that einsum cannot pair up: fall back
            why = f"einsum rejected the shapes: {e}"
        else:
            wrong = evaluate.compare(result, reference, fn.checked.outputs)
            return Row(label, "baseline", _plan_text(plan), t, None, not wrong,
                       f"measured on the CPU (median of {CPU_RUNS})", wrong,
                       checked=CHECKED_CPU)
    t, result = _timed(lambda: fn(*args, out=_fresh(out)))
    wrong = evaluate.compare(evaluate.as_tuple(result), reference, fn.checked.outputs)
    return Row("Halide CPU (baseline)", "baseline", "", t, None, not wrong,
               f"measured on the CPU (median of {CPU_RUNS})",
               f"the Halide CPU back end is the baseline: no einsum translation ({why})",
               checked=CHECKED_CPU)


def _check_manual(fn, manual) -> None:
    """`manual` must be the same pipeline as `fn` (its arguments and outputs), scheduled, or
    None."""
    from tcstage.halide.pipeline import HalideFunction
    if manual is None:
        return
    if not isinstance(manual, HalideFunction):
        raise TCError(f"manual= takes a tc.from_halide pipeline with your own Halide schedule; "
                      f"got {type(manual).__name__}")
    # (Arguments only: Halide names the Funcs of a second build apart, and a different
    # computation shows as a wrong row anyway.)
    if manual.arguments != fn.arguments or len(manual.outputs) != len(fn.outputs):
        raise TCError(f"manual= is not the same pipeline as '{fn.name}': it takes "
                      f"({', '.join(a.describe() for a in manual.arguments)}) with "
                      f"{len(manual.outputs)} output(s), '{fn.name}' takes "
                      f"({', '.join(a.describe() for a in fn.arguments)}) with "
                      f"{len(fn.outputs)}")


def _pipeline_baseline(fn, args, reference, manual) -> Row:
    """A Halide pipeline's baseline: your own schedule (`manual`, run as written), else
    tcstage's default CPU schedule."""
    if manual is not None:
        label, call = "Halide CPU, your schedule (baseline)", lambda: manual(
            *args, output_shape=fn.fixed_output_shapes, schedule="as_written")
    else:
        label, call = "CPU tcstage default (baseline)", lambda: fn(*args)
    try:
        t, result = _timed(call)
    except TCError as e:
        return Row(label, "baseline", "", None, None, None, "failed", evaluate._one_line(e))
    chosen = (manual or fn).last_cpu_kernel
    wrong = evaluate.compare(evaluate.as_tuple(result), reference, fn.checked.outputs)
    return Row(label, "baseline", "", t, None, not wrong,
               f"measured on the CPU (median of {CPU_RUNS})",
               "; ".join(filter(None, [f"ran {chosen.schedule}" if manual is None else "",
                                       wrong])), checked=CHECKED_CPU)


def einsum_plan(fn):
    """([(tensor, subscripts, operands)] per statement, '') when every statement of the checked
    function `fn` is `T(i..) +=! / = product of reads with plain index subscripts` of float
    tensors, each tensor written once and no `where`; else (None, why not)."""
    plan, written = [], set()
    for st in fn.statements:
        if st.tensor in written:
            return None, f"{st.tensor} is written by more than one statement"
        if not (st.reduction is None or (st.reduction == "+" and st.init)):
            op = f"{st.reduction}={'!' if st.init else ''}"
            return None, f"{st.tensor} is defined with {op}, not +=! or ="
        if st.reduction is None and st.reduction_vars:
            return None, f"{st.tensor} has right-only indices without a reduction"
        if st.where:
            return None, f"{st.tensor}'s statement has a where clause"
        if len(set(st.indices)) != len(st.indices):
            return None, f"{st.tensor} repeats an index on its left-hand side"
        reads = _product(st.rhs)
        if reads is None:
            return None, f"{st.tensor}'s right-hand side is not a product of tensor reads"
        for r in reads:
            if not all(type(a).__name__ == "IndexVar" for a in r.args):
                return None, f"{r.tensor} is read with a subscript that is not a plain index"
            if r.tensor == st.tensor or r.tensor not in fn.tensors:
                return None, f"{st.tensor} reads itself"
        if not all(fn.tensors[t].type.is_float for t in {st.tensor, *(r.tensor for r in reads)}):
            return None, f"{st.tensor}'s statement is not all floating point"
        written.add(st.tensor)
        names = list(dict.fromkeys([*st.indices, *(a.name for r in reads for a in r.args)]))
        if len(names) > 52:
            return None, "more indices than einsum letters"
        letter = {n: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]
                  for k, n in enumerate(names)}
        subscripts = ",".join("".join(letter[a.name] for a in r.args) for r in reads) + \
            "->" + "".join(letter[i] for i in st.indices)
        plan.append((st.tensor, subscripts, tuple(r.tensor for r in reads)))
    return plan, ""


def _product(e):
    """The reads of e if e is a product of tensor reads, else None."""
    from tcstage.lang import checked as C
    if isinstance(e, C.Read):
        return [e]
    if isinstance(e, C.Binary) and e.op == "*":
        lhs, rhs = _product(e.lhs), _product(e.rhs)
        return None if lhs is None or rhs is None else lhs + rhs
    return None


def run_einsum(plan, fn, args, torch=None) -> tuple:
    """The outputs of fn computed statement by statement with einsum (torch's when given).
    An index's extents must agree between operands: TC's range inference would take their
    intersection, einsum raises ValueError instead (the caller falls back)."""
    env = {t.name: a for t, a in zip(fn.inputs, args)}
    for tensor, subscripts, operands in plan:
        dtype = fn.tensors[tensor].type.numpy
        if torch is not None:
            try:
                value = torch.einsum(subscripts, *(torch.from_numpy(np.ascontiguousarray(
                    env[o])) for o in operands)).numpy()
            except RuntimeError as e:
                raise ValueError(str(e)) from None
        else:
            value = np.einsum(subscripts, *(env[o] for o in operands), optimize=True)
        env[tensor] = np.asarray(value).astype(dtype, copy=False)
    return tuple(env[o] for o in fn.outputs)


def _plan_text(plan) -> str:
    return "; ".join(f"{t} = einsum('{s}', {', '.join(o)})" for t, s, o in plan)


def _timed(call) -> tuple[float, object]:
    result = call()  # the first call compiles (Halide) or warms up
    times = []
    for _ in range(CPU_RUNS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result




class _Bar:
    """A rich progress bar over the comparison's steps (not during a tuning run, which has its
    own)."""

    def __init__(self, enabled: bool, total: int, function: str):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn(f"comparing {function}"), BarColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[step]}"),
                                transient=True)
            self.task = self.bar.add_task("compare", total=total, step="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, step=what)

    def paused(self):
        import contextlib
        bar = self.bar

        @contextlib.contextmanager
        def pause():
            if bar is not None:
                bar.stop()
            try:
                yield
            finally:
                if bar is not None:
                    bar.start()
        return pause()


__all__ = ["compare", "CompareResult", "Row", "einsum_plan", "run_einsum", "schedule_lines"]
