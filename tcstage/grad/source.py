"""Checked expressions built, rewritten and printed back as TC source.

The backward pass builds its statements as checked expressions (`tcstage.lang.checked`) and
prints them; the printed text is then parsed and checked again by `tc.define` like any TC, so
types here are only a guide for folding (a literal's type is re-inferred from its context).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tcstage.lang import checked as C
from tcstage.lang.types import BOOL, FLOAT32, INT32

# -- building, with the folding that keeps generated text readable ----------------------------


def const(value, type=None) -> C.Const:
    if type is None:
        type = BOOL if isinstance(value, bool) else INT32 if isinstance(value, int) else FLOAT32
    return C.Const(value, type)


def is_const(e: C.Expr, value) -> bool:
    e = _uncast(e)
    return isinstance(e, C.Const) and not isinstance(e.value, bool) and e.value == value


def _uncast(e: C.Expr) -> C.Expr:
    while isinstance(e, C.Cast):
        e = e.operand
    return e


def _ints(a: C.Expr, b: C.Expr) -> tuple[int, int] | None:
    """Both integer constants (index arithmetic, folded: a coefficient `2 - 2` is zero, and a
    solver dividing by it wrote `% (2 - 2)`; gradient fuzz seed 972998)."""
    if isinstance(a, C.Const) and isinstance(b, C.Const) and \
            type(a.value) is int and type(b.value) is int:
        return a.value, b.value
    return None


def add(a: C.Expr, b: C.Expr) -> C.Expr:
    if (ints := _ints(a, b)) is not None:
        return const(ints[0] + ints[1])
    if is_const(a, 0):
        return b
    if is_const(b, 0):
        return a
    if isinstance(b, C.Unary) and b.op == "-":
        return sub(a, b.operand)
    if _negative(b):
        return sub(a, neg(b))
    if a == b:  # (the same term twice, as from a read used twice: `x * x`)
        return mul(const(2), a)
    return C.Binary("+", a, b, a.type)


def sub(a: C.Expr, b: C.Expr) -> C.Expr:
    if (ints := _ints(a, b)) is not None:
        return const(ints[0] - ints[1])
    if is_const(b, 0):
        return a
    if is_const(a, 0):
        return neg(b)
    if _negative(b) or isinstance(b, C.Unary) and b.op == "-":
        return add(a, neg(b))
    return C.Binary("-", a, b, a.type)


def _negative(e: C.Expr) -> bool:
    e = _uncast(e)
    return isinstance(e, C.Const) and not isinstance(e.value, bool) and e.value < 0


def mul(a: C.Expr, b: C.Expr) -> C.Expr:
    if (ints := _ints(a, b)) is not None:
        return const(ints[0] * ints[1])
    if is_const(a, 0) or is_const(b, 0):
        return const(0)
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if is_const(a, -1):
        return neg(b)
    if is_const(b, -1):
        return neg(a)
    return C.Binary("*", a, b, a.type)


def div(a: C.Expr, b: C.Expr) -> C.Expr:
    if is_const(b, 1):
        return a
    if is_const(a, 0):
        return const(0)
    return C.Binary("/", a, b, a.type)


def neg(a: C.Expr) -> C.Expr:
    if isinstance(a, C.Unary) and a.op == "-":
        return a.operand
    a0 = _uncast(a)
    if isinstance(a0, C.Const) and not isinstance(a0.value, bool):
        return const(-a0.value, a0.type)
    return C.Unary("-", a, a.type)


def compare(op: str, a: C.Expr, b: C.Expr) -> C.Expr:
    return C.Binary(op, a, b, BOOL)


def conj(conds: list[C.Expr]) -> C.Expr | None:
    out = None
    for c in conds:
        out = c if out is None else C.Binary("&&", out, c, BOOL)
    return out


def select(cond: C.Expr | None, then: C.Expr, other: C.Expr) -> C.Expr:
    if cond is None:
        return then
    if is_const(then, 0) and is_const(other, 0):
        return const(0)
    return C.Select(cond, then, other, then.type)


def call(fn: str, *args: C.Expr) -> C.Expr:
    return C.Call(fn, tuple(args), args[0].type)


def var(name: str) -> C.IndexVar:
    return C.IndexVar(name)


def is_zero(e: C.Expr) -> bool:
    return is_const(e, 0)


# -- rewriting --------------------------------------------------------------------------------


def rebuild(e: C.Expr, f: Callable[[C.Expr], C.Expr | None]) -> C.Expr:
    """e with every node n for which f(n) is not None replaced by f(n) (outermost first)."""
    out = f(e)
    if out is not None:
        return out
    if isinstance(e, C.Read):
        return C.Read(e.tensor, tuple(rebuild(a, f) for a in e.args), e.type)
    if isinstance(e, C.Call):
        return C.Call(e.fn, tuple(rebuild(a, f) for a in e.args), e.type)
    if isinstance(e, C.Unary):
        return C.Unary(e.op, rebuild(e.operand, f), e.type)
    if isinstance(e, C.Cast):
        return C.Cast(e.type, rebuild(e.operand, f))
    if isinstance(e, C.Binary):
        return C.Binary(e.op, rebuild(e.lhs, f), rebuild(e.rhs, f), e.type)
    if isinstance(e, C.Select):
        return C.Select(rebuild(e.cond, f), rebuild(e.then, f), rebuild(e.other, f), e.type)
    if isinstance(e, C.Padded):
        return C.Padded(rebuild(e.read, f), rebuild(e.value, f), e.type)
    return e


def substitute(e: C.Expr, values: Mapping[str, C.Expr]) -> C.Expr:
    """e with index variables replaced by expressions."""
    if not values:
        return e
    return rebuild(e, lambda n: values.get(n.name) if isinstance(n, C.IndexVar) else None)


def rename_tensors(e: C.Expr, names: Mapping[str, str]) -> C.Expr:
    def f(n):
        if isinstance(n, C.Read) and n.tensor in names:
            return C.Read(names[n.tensor], tuple(rename_tensors(a, names) for a in n.args), n.type)
        if isinstance(n, C.DimOf) and n.tensor in names:
            return C.DimOf(names[n.tensor], n.dim)
        return None
    return rebuild(e, f)


# -- affine subscripts ------------------------------------------------------------------------


def linear(e: C.Expr) -> tuple[dict, C.Expr] | None:
    """e as sum(coefficient * index variable) + rest, where coefficients and rest have no
    index variables; None where e is not of that form (a product of two indices, a read)."""
    e = _uncast(e)
    if isinstance(e, C.IndexVar):
        return {e.name: const(1)}, const(0)
    if not C.free_vars(e) and not C.has_read(e):
        return {}, e
    if isinstance(e, C.Unary) and e.op == "-":
        inner = linear(e.operand)
        if inner is None:
            return None
        return {v: neg(c) for v, c in inner[0].items()}, neg(inner[1])
    if isinstance(e, C.Binary) and e.op in ("+", "-"):
        a, b = linear(e.lhs), linear(e.rhs)
        if a is None or b is None:
            return None
        coeffs = dict(a[0])
        for v, c in b[0].items():
            c = c if e.op == "+" else neg(c)
            coeffs[v] = add(coeffs[v], c) if v in coeffs else c
        return coeffs, (add if e.op == "+" else sub)(a[1], b[1])
    if isinstance(e, C.Binary) and e.op == "*":
        a, b = linear(e.lhs), linear(e.rhs)
        if a is None or b is None or (a[0] and b[0]):
            return None
        scale, other = (b[1], a) if a[0] else (a[1], b)
        return {v: mul(scale, c) for v, c in other[0].items()}, mul(scale, other[1])
    return None


# -- printing ---------------------------------------------------------------------------------

_PRECEDENCE = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
               "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_TERNARY, _UNARY, _ATOM = 0, 7, 9


def to_tc(e: C.Expr) -> str:
    """TC text of e, with the parentheses C's precedence needs. Casts that lose information (to
    an integer or bool, or to a narrower float) are written out, `int32(x)`; widening ones are
    left to TC's implicit conversions."""
    return _fmt(e)[0]


def _loses_information(e: C.Cast) -> bool:
    to, of = e.type, e.operand.type
    return not to.is_float or (of.is_float and (to.bits < of.bits or to.kind != of.kind))


def _fmt(e: C.Expr) -> tuple[str, int]:
    if isinstance(e, C.Cast):
        if _loses_information(e):
            return f"{e.type.name}({to_tc(e.operand)})", _ATOM
        return _fmt(e.operand)
    if isinstance(e, C.Const):
        v = e.value
        if isinstance(v, bool):
            return ("1" if v else "0"), _ATOM
        if isinstance(v, float):
            text = repr(v)
            text = text if any(c in text for c in ".en") else text + ".0"
            return (text, _ATOM) if v >= 0 else (f"({text})", _ATOM)
        return (str(v), _ATOM) if v >= 0 else (f"({v})", _ATOM)
    if isinstance(e, (C.IndexVar, C.SizeVar, C.ScalarParam)):
        return e.name, _ATOM
    if isinstance(e, C.DimOf):
        return f"{e.tensor}.{e.dim}", _ATOM
    if isinstance(e, C.Read):
        if not e.args:
            return e.tensor, _ATOM
        return f"{e.tensor}({', '.join(to_tc(a) for a in e.args)})", _ATOM
    if isinstance(e, C.Call):
        return f"{e.fn}({', '.join(to_tc(a) for a in e.args)})", _ATOM
    if isinstance(e, C.Padded):
        return f"({_fmt(e.read)[0]} ?? {_operand(e.value, _UNARY + 1)})", _ATOM
    if isinstance(e, C.Unary):
        inner = _operand(e.operand, _UNARY)
        return f"{e.op}{inner}" if not inner.startswith("-") else f"{e.op}({inner})", _UNARY
    if isinstance(e, C.Binary):
        p = _PRECEDENCE[e.op]
        # Left-associative: the right operand needs parentheses at equal precedence.
        return f"{_operand(e.lhs, p)} {e.op} {_operand(e.rhs, p + 1)}", p
    if isinstance(e, C.Select):
        return (f"{_operand(e.cond, _TERNARY + 1)} ? {_operand(e.then, _TERNARY + 1)} : "
                f"{_operand(e.other, _TERNARY)}"), _TERNARY
    raise TypeError(f"cannot print {type(e).__name__}")


def _operand(e: C.Expr, least: int) -> str:
    text, p = _fmt(e)
    return text if p >= least else f"({text})"
