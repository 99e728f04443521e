"""Stabilisers: `max=!` and `min=!` reductions that the outputs do not depend on.

A softmax subtracts its row's maximum before `exp` only to keep `exp` in range: the outputs
are the same whatever M is, so dY/dM is exactly 0. Differentiated as written, M's adjoint is
a sum that cancels to rounding error, spread over the row's maxima (a count of ties and two
more passes over the row in the gradient, and in the jvp). This pass proves the invariance,
and the gradient and the jvp then treat such an M as a constant: the same derivative exactly,
without those terms.

The proof is an abstract interpretation of the forward statements in order, with M shifted by
an unknown delta(i) per element M(i). Each value is then one of
- unchanged;
- shifted: value + k * delta(i);
- scaled: value * exp(k * delta(i));
where i is the subscript of M it came from. The rules are exact identities: exp of a shift
is a scaling, log of a scaling a shift; two shifts (or scalings) of the same delta add (or
multiply); a scaling survives a sum, a max or a min over indices that delta does not depend
on, a shift survives a max or a min there; a comparison of two equal shifts is unchanged.
Anything else is unknown, and M is a stabiliser only where every output comes out unchanged.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from tcstage.lang import checked as C

UNCHANGED, SHIFTED, SCALED = "unchanged", "shifted", "scaled"


@attrs.frozen
class _Effect:
    kind: str  # UNCHANGED, SHIFTED, SCALED
    k: Fraction = Fraction(0)
    at: tuple = ()  # the subscript of M that delta takes: expressions (or a tensor's dims)


_SAME = _Effect(UNCHANGED)


class _Unknown(Exception):
    """The value depends on delta in a way the rules do not cover."""


def stabilisers(fn: C.Function) -> frozenset[str]:
    """The tensors of `fn` defined by a single `max=!` or `min=!` statement whose values no
    output depends on (module docstring)."""
    counts: dict[str, int] = {}
    for st in fn.statements:
        counts[st.tensor] = counts.get(st.tensor, 0) + 1
    found = set()
    for st in fn.statements:
        t = fn.tensors[st.tensor]
        if counts[st.tensor] == 1 and st.init and st.reduction in ("max", "min") and \
                t.kind not in ("input", "output") and t.type.is_float and _invariant(fn, st.tensor):
            found.add(st.tensor)
    return frozenset(found)


def _invariant(fn: C.Function, m: str) -> bool:
    effects: dict[str, _Effect] = {m: _Effect(SHIFTED, Fraction(1),
                                              tuple(range(fn.tensors[m].rank)))}
    statements: dict[str, int] = {}
    try:
        for st in fn.statements:
            if st.tensor == m:
                continue
            statements[st.tensor] = statements.get(st.tensor, 0) + 1
            e = _statement(st, effects)
            if statements[st.tensor] > 1 or st.scatter:  # (only unchanged values mix)
                if e != _SAME or effects.get(st.tensor, _SAME) != _SAME:
                    raise _Unknown
            effects[st.tensor] = e
    except _Unknown:
        return False
    return all(effects.get(o, _SAME) == _SAME for o in fn.outputs)


def _statement(st: C.Statement, effects: dict) -> _Effect:
    """The effect on the tensor the statement writes, by the tensor's dimensions."""
    e = _expr(st.rhs, effects)
    if e.kind == UNCHANGED:
        return e
    if st.reduction is not None and not st.init:
        raise _Unknown  # (combined with the tensor's earlier values)
    if st.reduction_vars and (st.reduction == "*" or st.reduction == "+" and e.kind == SHIFTED):
        raise _Unknown  # (a product; a sum of shifts, which counts the reduction's extent)
    dims = []
    for a in e.at:  # (delta must be one per written point: at a written index, no other)
        if not (isinstance(a, C.IndexVar) and a.name in st.indices):
            raise _Unknown
        dims.append(st.indices.index(a.name))
    return _Effect(e.kind, e.k, tuple(dims))


def _read(r: C.Read, effects: dict) -> _Effect:
    e = effects.get(r.tensor, _SAME)
    if e.kind == UNCHANGED:
        return e
    return _Effect(e.kind, e.k, tuple(r.args[d] for d in e.at))


def _normal(kind: str, k: Fraction, at: tuple) -> _Effect:
    return _SAME if k == 0 else _Effect(kind, k, at)


def _number(e: C.Expr) -> Fraction | None:
    e = e.operand if isinstance(e, C.Cast) else e
    if isinstance(e, C.Const) and not isinstance(e.value, bool):
        return Fraction(e.value)
    if isinstance(e, C.Unary) and e.op == "-":
        v = _number(e.operand)
        return None if v is None else -v
    return None


def _expr(e: C.Expr, effects: dict) -> _Effect:
    if isinstance(e, C.Read):
        if any(_expr(a, effects) != _SAME for a in e.args):
            raise _Unknown
        return _read(e, effects)
    if isinstance(e, C.Padded):
        if _read(e.read, effects) != _SAME or any(_expr(a, effects) != _SAME
                                                  for a in e.read.args):
            raise _Unknown  # (the padding value is not shifted)
        return _SAME
    if isinstance(e, (C.Const, C.IndexVar, C.SizeVar, C.ScalarParam, C.DimOf)):
        return _SAME
    if isinstance(e, C.Cast):
        inner = _expr(e.operand, effects)
        if inner != _SAME and not (e.type.is_float and e.operand.type.is_float):
            raise _Unknown
        return inner
    if isinstance(e, C.Unary):
        inner = _expr(e.operand, effects)
        if inner == _SAME:
            return inner
        if e.op != "-":
            raise _Unknown
        return _Effect(inner.kind, -inner.k if inner.kind == SHIFTED else inner.k, inner.at)
    if isinstance(e, C.Binary):
        return _binary(e, _expr(e.lhs, effects), _expr(e.rhs, effects))
    if isinstance(e, C.Select):
        if _expr(e.cond, effects) != _SAME:
            raise _Unknown
        a, b = _expr(e.then, effects), _expr(e.other, effects)
        if a != b:
            raise _Unknown
        return a
    if isinstance(e, C.Call):
        args = [_expr(a, effects) for a in e.args]
        if all(a == _SAME for a in args):
            return _SAME
        (a, *rest) = args
        if e.fn == "exp" and not rest and a.kind == SHIFTED:
            return _Effect(SCALED, a.k, a.at)
        if e.fn == "log" and not rest and a.kind == SCALED:
            return _Effect(SHIFTED, a.k, a.at)
        if e.fn in ("fmax", "max", "fmin", "min") and len(rest) == 1 and rest[0] == a:
            return a  # (max(x + d, y + d) = max(x, y) + d; and scaled by exp(...) > 0)
        raise _Unknown
    raise _Unknown


def _binary(e: C.Binary, a: _Effect, b: _Effect) -> _Effect:
    if a == _SAME and b == _SAME:
        return _SAME
    same_delta = a.kind == UNCHANGED or b.kind == UNCHANGED or a.at == b.at
    if not same_delta:
        raise _Unknown
    at = a.at or b.at
    op = e.op
    if op in ("+", "-"):
        sign = 1 if op == "+" else -1
        if a.kind != SCALED and b.kind != SCALED:  # (shifts add)
            return _normal(SHIFTED, a.k + sign * b.k, at)
        if a == b and a.kind == SCALED:  # (a sum of two values scaled alike)
            return a
        raise _Unknown
    if op == "*":
        if SHIFTED not in (a.kind, b.kind):  # (scalings multiply)
            return _normal(SCALED, a.k + b.k, at)
        if a.kind == SHIFTED and b == _SAME and (c := _number(e.rhs)) is not None:
            return _normal(SHIFTED, a.k * c, at)
        if b.kind == SHIFTED and a == _SAME and (c := _number(e.lhs)) is not None:
            return _normal(SHIFTED, b.k * c, at)
        raise _Unknown
    if op == "/":
        if SHIFTED not in (a.kind, b.kind):
            return _normal(SCALED, a.k - b.k, at)
        if a.kind == SHIFTED and b == _SAME and (c := _number(e.rhs)) not in (None, 0):
            return _normal(SHIFTED, a.k / c, at)
        raise _Unknown
    if op in ("==", "!=", "<", "<=", ">", ">=") and a == b:
        return _SAME  # (both sides shifted alike, or scaled alike by exp(...) > 0)
    raise _Unknown
