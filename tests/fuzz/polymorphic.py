"""Rank-polymorphic programs from the generator's (docs/language.md, "Any rank").

`lift(source)` puts a `...` in front of every tensor dimension list and subscript list of a
generated program (scalar inputs stay scalars), so that the lifted function maps the original
over any leading dimensions: at a run of shape R, output slice [r] is the original's output for
the input slices [r]. `check` runs the lifted program at a run of that shape, on the CPU and under
emulation, and compares every slice with the reference's result for its inputs. The slices
alternate between the case's values and the same with every float input negated (when the
reference accepts those too), so that a kernel mixing up slices is seen.

Programs reading `T.k` are not lifted (the run would shift the dimension numbers), nor those
whose statement first defining a tensor reads none (`O() = 1` lifted has nothing to give its
run a length).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

import tcstage as tc
from tcstage.lang import ast
from tcstage.lang.parser import parse

from . import differential as D
from .programs import Case, make_case
from .reference import Invalid


def lift(source: str) -> str | None:
    """The source with `...` leading every tensor's dimensions and subscripts, or None where
    that does not map the function over the run (`T.k` dimension references)."""
    module = parse(source)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for d in module.defs:
        scalars = {p.name.name for p in d.params if not p.type.dims}
        tensors = ({p.name.name for p in d.params} - scalars) | \
            {s.tensor.name for s in d.statements if isinstance(s, ast.Statement)}
        shaped = set()  # tensors whose first statement reads a lifted tensor
        for p in d.params:
            if p.type.dims:
                edits.append((p.type.dims[0].span.start, p.type.dims[0].span.start, "..., "))
        for s in d.statements:
            if not isinstance(s, ast.Statement):
                return None
            nodes = [*ast.walk(s.rhs), *(n for i in s.indices for n in ast.walk(i)),
                     *(n for w in s.where for x in (w.lo, w.hi) for n in ast.walk(x))]
            if any(isinstance(n, ast.DimRef) for n in nodes):
                return None
            lifted_reads = [n for n in nodes if isinstance(n, (ast.Apply, ast.Ident))
                            and getattr(n, "name", None) is not None
                            and (n.name.name if isinstance(n, ast.Apply) else n.name) in tensors]
            if s.tensor.name not in shaped and not lifted_reads:
                return None  # (nothing would give the run its ranges: `O(...) = 1`)
            shaped.add(s.tensor.name)
            edits.append(_subscripts(source, s.tensor, s.indices))
            for n in nodes:
                if isinstance(n, ast.Apply) and n.name.name in tensors:
                    edits.append(_subscripts(source, n.name, n.args))
                elif isinstance(n, ast.Ident) and n.name in tensors:  # a bare rank-0 read
                    edits.append((n.span.end, n.span.end, "(...)"))
    out, last = [], 0
    for start, end, text in sorted(set(edits)):
        out.append(source[last:start] + text)
        last = end
    return "".join(out) + source[last:]


def _subscripts(source: str, name: ast.Ident, args) -> tuple[int, int, str]:
    """The edit putting `...` first in the subscript list after `name` (`T(i)`, `T()`, `T`)."""
    if args:
        return args[0].span.start, args[0].span.start, "..., "
    after = name.span.end
    rest = source[after:]
    stripped = rest.lstrip()
    if stripped.startswith("("):  # `T()`
        open_ = after + len(rest) - len(stripped)
        return open_ + 1, open_ + 1, "..."
    return after, after, "(...)"  # `T` alone, a rank-0 tensor written bare


def slices(case: Case) -> list[Case]:
    """The case, and the case with its float tensor inputs negated where the reference accepts
    that too (scalar inputs are one value for every slice)."""
    negated = {k: -v if np.ndim(v) and np.issubdtype(np.asarray(v).dtype, np.floating) else v
               for k, v in case.values.items()}
    try:
        return [case, make_case(case.seed, case.program, negated, case.inout_values)]
    except Invalid:
        return [case]


def check(case: Case, run: tuple[int, ...], options=()) -> list[str]:
    """Problems of the lifted program at a run of shape `run` (empty list: none)."""
    source = lift(case.source)
    if source is None:
        return []
    variants = slices(case)
    cells = list(itertools.product(*map(range, run)))  # (a run of length 0: one cell, ())
    per_cell = [variants[k % len(variants)] for k in range(len(cells))]
    inputs = []
    for i, a in enumerate(case.args):
        if np.ndim(a):
            stacked = np.stack([np.asarray(c.args[i]) for c in per_cell])
            inputs.append(np.ascontiguousarray(stacked.reshape(*run, *np.shape(a))))
        else:
            inputs.append(a)
    starts = case.fresh_outs()
    if starts is not None:
        starts = starts if isinstance(starts, tuple) else (starts,)
        starts = tuple(np.ascontiguousarray(np.broadcast_to(o, (*run, *o.shape)))
                       for o in starts)
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        try:
            prog = tc.define(source)
        except tc.TCError as e:
            return [f"define: {e}"]
        stages = [("cpu", lambda: prog[case.name](*inputs, out=_copy(starts)))]
        for o in options:
            stages.append((f"emulate {o}", lambda o=o: tc.compile(
                prog, case.name, *inputs, out=_copy(starts), options=o,
                target="cuda-emulated")(*inputs, out=_copy(starts))))
        for stage, fn in stages:
            try:
                got = fn()
            except Exception as e:  # noqa: BLE001 - every exception is a problem
                problems.append(f"{stage}: {type(e).__name__}: {e}")
                continue
            got = got if isinstance(got, tuple) else (got,)
            for cell, c in zip(cells, per_cell):
                why = D.compare(c, tuple(g[cell] for g in got))
                if why:
                    problems.append(f"{stage}: slice {cell}: {why}")
                    break
    return problems


def _copy(starts):
    """Fresh copies of the in/out starting values (calls update them in place)."""
    if starts is None:
        return None
    copies = tuple(np.array(o) for o in starts)
    return copies[0] if len(copies) == 1 else copies
