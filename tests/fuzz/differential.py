"""One program through every path tcstage has, against the reference.

Paths: `tc.define`; the CPU call with the default schedule and with `schedule=None`;
`tc.compile(..., target="cuda-emulated")` and the emulated run for each MappingOptions (and
optionally nvcc on the CUDA source). The program is well-formed (the reference ran it), so:

- a `TCError` anywhere is a *rejected valid program* (`EmulationRaceError`: a *race*),
- any other exception is a *crash*,
- a result that differs from the reference in shape, dtype or values is a *mismatch*,
- a stage slower than `slow_s` is *slow* (the campaign kills and reports real hangs).
"""

from __future__ import annotations

import re
import time
import traceback
import warnings

import attrs
import numpy as np

import tcstage as tc

from . import mapping
from .programs import Case

_DEFAULT = object()
CPU_SCHEDULES = (_DEFAULT, None)


@attrs.frozen
class Finding:
    seed: int
    kind: str  # 'mismatch', 'crash', 'rejected', 'race', 'slow', 'hang'
    stage: str  # 'define', 'cpu', 'cpu-unscheduled', 'compile', 'emulate', 'nvcc'
    options: str | None
    error: str  # the exception's type, or 'mismatch'
    detail: str

    @property
    def signature(self) -> str:
        """What findings of one class share: kind, stage, error and the message's shape."""
        first = self.detail.strip().splitlines()[0] if self.detail.strip() else ""
        first = re.sub(r"'[^']*'", "'_'", first)
        first = re.sub(r"\b[A-Za-z_]*\d+[A-Za-z_\d$]*\b", "#", first)
        first = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", first)
        return f"{self.kind}/{self.stage}/{self.error}: {first[:120]}"

    def __str__(self) -> str:
        where = f" under {self.options}" if self.options else ""
        return f"seed {self.seed}: {self.kind} at {self.stage}{where}: {self.error}: {self.detail}"


def tolerance(dtypes) -> float:
    """The relative tolerance for a floating result computed from values of these types: the
    rounding of the least precise one. A double result computed from float32 values carries
    float32 rounding (Halide's float32 exp and numpy's differ in the last place; seed 468)."""
    size = min(np.dtype(t).itemsize for t in dtypes if np.issubdtype(np.dtype(t), np.floating))
    return {2: 1e-2, 4: 2e-4}.get(size, 1e-9)


def _expression_types(case: Case) -> set:
    """The floating types of the program's subexpressions: a float32 function of doubles
    (`expf(Y(i))`) rounds a double result to float32's precision (seed 20132: Halide's and
    CUDA's expf(2) and numpy's float32 exp(2) differ in the last place)."""
    from .nodes import is_float, walk
    return {e.type for st in case.program.statements for e in walk(st.rhs)
            if is_float(getattr(e, "type", "bool"))}


def compare(case: Case, got, what: str = "") -> str | None:
    """Why `got` (a call's result) differs from the reference, or None."""
    outs = got if isinstance(got, tuple) else (got,)
    names = case.program.outputs
    if len(outs) != len(names):
        return f"{len(outs)} results for {len(names)} outputs"
    for name, g in zip(names, outs):
        ref = case.expected.tensors[name]
        g = np.asarray(g)
        if g.shape != ref.extents:
            return f"{name}: shape {g.shape}, expected {ref.extents}"
        if g.dtype != ref.values.dtype:
            return f"{name}: dtype {g.dtype}, expected {ref.values.dtype}"
        mask = ref.defined
        expected, actual = ref.values, g
        if case.exact[name] or not np.issubdtype(g.dtype, np.floating):
            bad = mask & (actual != expected)
        else:
            scale = max(1.0, float(np.abs(expected[mask]).max(initial=0)))
            t = tolerance([g.dtype, *(np.asarray(v).dtype for v in case.values.values()),
                           *_expression_types(case)])
            bad = mask & ~np.isclose(actual, expected, rtol=t, atol=t * scale)
        if bad.any():
            at = tuple(int(x) for x in np.argwhere(bad)[0])
            index = tuple(a + m for a, m in zip(at, ref.mins))
            return (f"{name}{list(index)}: got {actual[at]!r}, expected {expected[at]!r} "
                    f"({int(bad.sum())} of {int(mask.sum())} elements differ"
                    f"{'' if case.exact[name] else ', tolerant'})")
    return None


def _error(e: BaseException) -> tuple[str, str, str]:
    """(kind, error type, detail) of an exception a stage raised."""
    name = type(e).__name__
    if isinstance(e, tc.TCError):
        kind = "race" if name == "EmulationRaceError" else "rejected"
        return kind, name, str(e)
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{f.filename.split('/tcstage/')[-1]}:{f.lineno} in {f.name}"
                  for f in reversed(tb) if "/tcstage/" in f.filename), "")
    return "crash", name, f"{e} [{where}]" if where else str(e)


class _Runner:
    def __init__(self, case: Case, progress, slow_s: float):
        self.case, self.progress, self.slow_s = case, progress, slow_s
        self.findings: list[Finding] = []

    def stage(self, stage: str, options, fn):
        """fn() with its failure recorded; returns (ok, value)."""
        if self.progress:
            self.progress(stage, options)
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            kind, error, detail = _error(e)
            self.findings.append(Finding(self.case.seed, kind, stage, _text(options), error,
                                         detail))
            return False, None
        took = time.perf_counter() - start
        if took > self.slow_s:
            self.findings.append(Finding(self.case.seed, "slow", stage, _text(options),
                                         "slow", f"{took:.1f} s"))
        return True, value

    def result(self, stage: str, options, got) -> None:
        why = compare(self.case, got)
        if why:
            self.findings.append(Finding(self.case.seed, "mismatch", stage, _text(options),
                                         "mismatch", why))


def _outside_reference(case: Case, finding: Finding) -> bool:
    """Whether a rejection at define is of a program the reference does not model: a
    TCPartitionError where a later statement of a tensor has a `where` clause on one of its
    left-hand indices, which tcstage may read as a further piece of a partition
    (docs/language.md), decided for every large size, while the reference runs the sizes it
    has (seeds 20117, 20516: overlapping pieces, a documented error). The generator refuses
    such statements only for scatter programs (reference.run's refuse_pieces)."""
    if finding.error != "TCPartitionError":
        return False
    seen = set()
    for st in case.program.statements:
        if st.tensor in seen and st.scatter is None and {w.var for w in st.where} & set(st.lhs):
            return True
        seen.add(st.tensor)
    return False


def _text(options) -> str | None:
    if isinstance(options, list):  # one set per launch: Python that builds the list
        return "[" + ", ".join(map(str, options)) + "]"
    return None if options is None else str(options)


def check(case: Case, options=(), *, cpu_schedules=CPU_SCHEDULES, nvcc: bool = False,
          progress=None, slow_s: float = 60.0) -> list[Finding]:
    """Every finding for `case` on the CPU (each schedule) and under emulation (each options)."""
    run = _Runner(case, progress, slow_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        ok, prog = run.stage("define", None, lambda: tc.define(case.source))
        if not ok:
            if _outside_reference(case, run.findings[-1]):
                run.findings.pop()
            return run.findings
        fn = prog[case.name]
        for schedule in cpu_schedules:
            stage = "cpu" if schedule is _DEFAULT else f"cpu-{schedule or 'unscheduled'}"
            kwargs = {} if schedule is _DEFAULT else {"schedule": schedule}
            ok, got = run.stage(stage, None,
                                lambda: fn(*case.args, out=case.fresh_outs(), **kwargs))
            if ok:
                run.result(stage, None, got)
        if cpu_schedules:
            ok, mins = run.stage("cpu", None,
                                 lambda: fn.output_mins(*case.args, out=case.fresh_outs()))
            expected = [case.expected.tensors[o].mins for o in case.program.outputs]
            if ok and [tuple(m) for m in mins] != expected:
                run.findings.append(Finding(case.seed, "mismatch", "cpu", None, "mismatch",
                                            f"output_mins {mins}, expected {expected}"))
        todo = list(options)
        for options in todo:  # (a kernel of several launches adds its per-launch list)
            ok, kernel = run.stage("compile", options, lambda: tc.compile(
                prog, case.name, *case.args, out=case.fresh_outs(), options=options,
                target="cuda-emulated"))
            if not ok:
                continue
            todo += mapping.per_launch(options, kernel)
            if nvcc:
                from tcstage.cuda.nvcc import compile_check
                run.stage("nvcc", options, lambda: compile_check(kernel.cuda_source))
            ok, got = run.stage("emulate", options,
                                lambda: kernel(*case.args, out=case.fresh_outs()))
            if ok:
                run.result("emulate", options, got)
    return run.findings


# -- reproducers -----------------------------------------------------------------------------

def _literal(a) -> str:
    if isinstance(a, np.ndarray):
        return f"np.array({a.tolist()!r}, dtype=np.{a.dtype})"
    return repr(a)


def reproducer(case: Case, finding: Finding) -> str:
    """A standalone script that shows `finding` (the expected values come from the reference,
    the explicit-loop interpreter of tests/fuzz/reference.py)."""
    args = ",\n        ".join(_literal(a) for a in case.args)
    outs = case.fresh_outs()
    outs_text = "None" if outs is None else (
        _literal(outs) if not isinstance(outs, tuple) else
        "(" + ", ".join(_literal(o) for o in outs) + ",)")
    expected = ",\n            ".join(
        f"{_literal(case.expected.tensors[o].values)}" for o in case.program.outputs)
    if finding.stage in ("compile", "emulate", "nvcc"):
        given = finding.options if finding.options.startswith("[") else repr(finding.options)
        call = (f"MappingOptions = tc.MappingOptions\n"
                f"kernel = tc.compile(prog, {case.name!r}, *args, out=outs(), "
                f"options={given}, target='cuda-emulated')\n"
                f"got = kernel(*args, out=outs())")
    elif finding.stage == "cpu-unscheduled":
        call = f"got = prog[{case.name!r}](*args, out=outs(), schedule=None)"
    else:
        call = f"got = prog[{case.name!r}](*args, out=outs())"
    return f'''"""{finding.kind} at {finding.stage} (fuzz seed {case.seed}).
{finding.error}: {finding.detail.splitlines()[0] if finding.detail else ''}
Regenerate: sys.path.insert(0, 'tests'); from fuzz import programs; programs.case({case.seed})
"""
import numpy as np
import tcstage as tc

source = """{case.source}"""
args = [{args}]


def outs():
    starting = {outs_text}
    return None if starting is None else (
        tuple(np.array(o) for o in starting) if isinstance(starting, tuple) else np.array(starting))


# reference values (explicit loops over the ranges spec 001 gives; elements no statement writes
# are not compared)
expected = [{expected}]
prog = tc.define(source)
{call}
got = got if isinstance(got, tuple) else (got,)
for g, e in zip(got, expected):
    print(g.shape, g.dtype, "expected", e.shape, e.dtype)
    print("max difference", np.max(np.abs(g.astype(float) - e.astype(float)), initial=0)
          if g.shape == e.shape else "shapes differ")
'''


def fails_like(finding: Finding):
    """A predicate for minimize: does a case fail the way `finding` did (same kind, stage and
    error; for crashes and rejections also the same message shape)?"""
    options = [tc.MappingOptions.parse(finding.options)] if finding.options else []
    schedules = {"cpu": (_DEFAULT,), "cpu-unscheduled": (None,)}.get(finding.stage, ())

    def fails(case: Case) -> bool:
        found = check(case, options if finding.stage in ("compile", "emulate", "nvcc") else (),
                      cpu_schedules=schedules)
        return any(f.kind == finding.kind and f.stage == finding.stage and f.error == finding.error
                   and (f.kind in ("mismatch", "hang", "slow") or f.signature == finding.signature)
                   for f in found)
    return fails
