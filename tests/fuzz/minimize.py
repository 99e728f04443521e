"""Greedy delta debugging of a failing `Case`: smaller programs that fail the same way.

Each step tries one simplification (drop a statement, an output, a where clause, an unused
input; replace an expression by one of its operands or by a literal; shrink a size), keeps it
if the reference still finds the program well-formed and `fails(case)` still holds, and starts
over, until no step helps or the time budget is spent.
"""

from __future__ import annotations

import time

import attrs
import numpy as np

from . import nodes as N
from . import reference as R
from .programs import Case, make_case


# -- types, recomputed after an edit (the rules of nodes.py, with sema's self-reads) ----------

def _retype(e: N.Expr, types: dict, me: str | None) -> N.Expr:
    if isinstance(e, N.Read):
        args = tuple(_retype(a, types, me) for a in e.args)
        t = types.get(e.tensor, "self" if e.tensor == me else e.type)
        return attrs.evolve(e, args=args, type=t)
    kids = [_retype(k, types, me) for k in N.children(e)]
    if isinstance(e, (N.Binary, N.Call, N.Select)) and any(k.type == "self" for k in kids):
        other = next((k.type for k in kids if k.type not in ("self", "bool")), "float32")
        kids = [attrs.evolve(k, type=other) if k.type == "self" else k for k in kids]
    if isinstance(e, N.Unary):
        return N.unary(e.op, kids[0])
    if isinstance(e, N.Binary):
        return N.binary(e.op, *kids)
    if isinstance(e, N.Call):
        return N.call(e.fn, *kids)
    if isinstance(e, N.Select):
        return N.select(*kids)
    return e


def retype(p: N.Program) -> N.Program:
    types = {i.name: i.type for i in p.inputs}
    statements = []
    for st in p.statements:
        rhs = _retype(st.rhs, types, st.tensor)
        if rhs.type == "self":
            rhs = attrs.evolve(rhs, type="float32")
        statements.append(attrs.evolve(st, rhs=rhs))
        if st.tensor not in types:
            partial = attrs.evolve(p, statements=tuple(statements))
            types[st.tensor] = R.tensor_types(partial)[st.tensor]
    return attrs.evolve(p, statements=tuple(statements))


# -- candidate edits ---------------------------------------------------------------------------

def _paths(e: N.Expr, path=()):
    yield path, e
    for k, c in enumerate(N.children(e)):
        yield from _paths(c, path + (k,))


def _replace(e: N.Expr, path: tuple, new: N.Expr) -> N.Expr:
    if not path:
        return new
    kids = list(N.children(e))
    kids[path[0]] = _replace(kids[path[0]], path[1:], new)
    if isinstance(e, N.Read):
        return attrs.evolve(e, args=tuple(kids))
    if isinstance(e, N.Unary):
        return attrs.evolve(e, x=kids[0])
    if isinstance(e, N.Binary):
        return attrs.evolve(e, a=kids[0], b=kids[1])
    if isinstance(e, N.Call):
        return attrs.evolve(e, args=tuple(kids))
    return attrs.evolve(e, cond=kids[0], a=kids[1], b=kids[2])


def _literal_like(e: N.Expr) -> N.Expr:
    if N.is_float(e.type):
        return N.Num("1.0", 1.0, "float32")
    return N.Num("1", 1, "int32")


def _edits(case: Case):
    """(description, program, values, inout_values) candidates, biggest cuts first."""
    p = case.program
    for k in range(len(p.statements)):
        st = p.statements[k]
        rest = p.statements[:k] + p.statements[k + 1:]
        outputs = tuple(o for o in p.outputs if any(s.tensor == o for s in rest))
        if outputs:
            inout = {o: s for o, s in p.inout_shapes.items() if o in outputs}
            yield f"drop statement {k}", attrs.evolve(p, statements=rest, outputs=outputs,
                                                      inout_shapes=inout)
        del st
    for o in p.outputs:
        if len(p.outputs) > 1 and o not in p.inout_shapes:
            yield f"drop output {o}", attrs.evolve(p, outputs=tuple(x for x in p.outputs
                                                                   if x != o))
    for k, st in enumerate(p.statements):
        for w in st.where:
            new = attrs.evolve(st, where=tuple(x for x in st.where if x is not w))
            yield f"drop where {w.var}", _with_statement(p, k, new)
    used = {r.tensor for st in p.statements for r in N.reads(st.rhs)} | {
        n.name for st in p.statements for n in N.walk(st.rhs) if isinstance(n, N.Scalar)} | {
        n.name for st in p.statements for w in st.where for n in (*N.walk(w.lo), *N.walk(w.hi))
        if isinstance(n, N.Scalar)}
    for i in p.inputs:
        if i.name not in used:
            yield f"drop input {i.name}", attrs.evolve(
                p, inputs=tuple(x for x in p.inputs if x is not i))
    for k, st in enumerate(p.statements):
        for path, node in _paths(st.rhs):
            for j, child in enumerate(N.children(node)):
                if not isinstance(node, N.Read):
                    yield f"statement {k}: keep operand {j}", _with_statement(
                        p, k, attrs.evolve(st, rhs=_replace(st.rhs, path, child)))
            if path and not isinstance(node, N.Num) and not _in_subscript(st.rhs, path):
                yield f"statement {k}: literal", _with_statement(
                    p, k, attrs.evolve(st, rhs=_replace(st.rhs, path, _literal_like(node))))
        if st.op != "=" and not st.reduction_vars and not (st.tensor in p.inout_shapes and
                                                           st is _first(p, st.tensor)):
            yield f"statement {k}: plain '='", _with_statement(p, k, attrs.evolve(
                st, op="=", init=True))


def _first(p: N.Program, tensor: str) -> N.Statement:
    return next(s for s in p.statements if s.tensor == tensor)


def _in_subscript(e: N.Expr, path: tuple) -> bool:
    for step in path:
        if isinstance(e, N.Read):
            return True
        e = N.children(e)[step]
    return False


def _with_statement(p: N.Program, k: int, st: N.Statement) -> N.Program:
    return attrs.evolve(p, statements=p.statements[:k] + (st,) + p.statements[k + 1:])


def _shrunk_sizes(case: Case):
    """Programs and values with one size variable one smaller."""
    p = case.program
    for name, value in sorted(p.sizes.items()):
        if value <= 1:
            continue
        values = {}
        for i in p.inputs:
            a = case.values[i.name]
            if isinstance(a, np.ndarray):
                a = a[tuple(slice(0, value - 1) if d == name else slice(None) for d in i.dims)]
                if i.index_bound == name:
                    a = np.minimum(a, value - 2).astype(a.dtype)
            values[i.name] = a
        yield f"size {name} = {value - 1}", attrs.evolve(p, sizes={**p.sizes, name: value - 1}), \
            values


# -- the loop --------------------------------------------------------------------------------

def minimize(case: Case, fails, budget_s: float = 600.0, log=None) -> Case:
    """The smallest case found in budget_s for which fails(case) holds."""
    deadline = time.monotonic() + budget_s
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        candidates = [(d, p, case.values) for d, p in _edits(case)] + list(_shrunk_sizes(case))
        for description, program, values in candidates:
            if time.monotonic() > deadline:
                break
            try:
                smaller = make_case(case.seed, retype(program), values, case.inout_values)
            except (R.Invalid, KeyError, ValueError, IndexError):
                continue
            if smaller.source == case.source and description.startswith("statement"):
                continue
            try:
                still = fails(smaller)
            except Exception:  # noqa: BLE001 - a different failure is not the same one
                still = False
            if still:
                if log:
                    log(f"{description}: {len(smaller.source)} characters")
                case, progress = smaller, True
                break
    return case
