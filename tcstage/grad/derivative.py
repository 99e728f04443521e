"""Partial derivatives of a right-hand side with respect to each tensor read in it.

Reverse accumulation over one expression tree: the adjoint of the root is the gradient flowing
into the statement, and each rule below passes adjoints to the operands. The result lists the
differentiable leaves (reads of floating-point tensors and floating-point scalar inputs), each
with the expression its gradient receives; identical reads (`A(i,k) * A(i,k)`) are combined.

Points where a function is not differentiable follow PyTorch where it has a convention:
`fabs` has gradient 0 at 0, `fmax(x, y)` sends the gradient to x only where x > y (so relu,
`fmax(x, 0)`, has gradient 0 at 0) and to y otherwise, `fmin(x, y)` to x only where x < y;
floor, ceil, round and trunc have gradient 0.
"""

from __future__ import annotations

import math

from tcstage.errors import TCError
from tcstage.grad import source as S
from tcstage.lang import checked as C

_LN2, _LN10 = math.log(2.0), math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def differentiable(e: C.Expr) -> bool:
    """Whether e is a leaf that gets a gradient."""
    return isinstance(e, (C.Read, C.ScalarParam)) and e.type.is_float


def partials(rhs: C.Expr, seed: C.Expr, where: str,
             value: C.Expr | None = None) -> list[tuple[C.Expr, C.Expr]]:
    """[(leaf, d rhs / d leaf * seed)] for every differentiable leaf of rhs, in order of first
    appearance; `where` names the statement in errors. `value`: an expression equal to rhs
    that costs less (the tensor the statement wrote, read back), used where a rule needs the
    value itself: exp's derivative is exp, a quotient's divisor gets -adj * (a / b) / b."""
    found: dict[C.Expr, C.Expr] = {}
    _push(rhs, seed, found, where, {} if value is None else {rhs: value})
    return [(leaf, g) for leaf, g in found.items() if not S.is_zero(g)]


def _has_leaf(e: C.Expr) -> bool:
    return any(differentiable(n) for n in C.walk(e))


def _push(e: C.Expr, adj: C.Expr, found: dict, where: str, known: dict) -> None:
    if S.is_zero(adj) or not _has_leaf(e):
        return
    if differentiable(e):
        found[e] = S.add(found[e], adj) if e in found else adj
        return  # (a read's subscripts are integers: nothing flows into them)
    if isinstance(e, C.Cast):
        if e.type.is_float and e.operand.type.is_float:
            _push(e.operand, adj, found, where, known)
        return
    if isinstance(e, C.Padded):
        if _has_leaf(e.value):
            raise TCError(f"{where}: the gradient of the padding value of '{S.to_tc(e)}' is not "
                          "supported; pad with a constant")
        _push(e.read, adj, found, where, known)  # outside the tensor there is nothing to update
        return
    if isinstance(e, C.Unary):
        if e.op == "-":
            _push(e.operand, S.neg(adj), found, where, known)
        return  # '!' is boolean: no gradient
    if isinstance(e, C.Select):  # the condition only chooses
        _push(e.then, S.select(e.cond, adj, S.const(0)), found, where, known)
        _push(e.other, S.select(e.cond, S.const(0), adj), found, where, known)
        return
    if isinstance(e, C.Binary):
        _binary(e, adj, found, where, known)
        return
    if isinstance(e, C.Call):
        _call(e, adj, found, where, known)
        return
    # Const, IndexVar, SizeVar, DimOf, integer reads: constants for the gradient.


def _binary(e: C.Binary, adj: C.Expr, found: dict, where: str, known: dict) -> None:
    a, b = e.lhs, e.rhs
    value = known.get(e, e)  # (e itself, or what it equals: a read of the tensor it wrote)
    if not e.type.is_float:
        return  # comparisons, logic, integer arithmetic: piecewise constant
    if e.op == "+":
        _push(a, adj, found, where, known)
        _push(b, adj, found, where, known)
    elif e.op == "-":
        _push(a, adj, found, where, known)
        _push(b, S.neg(adj), found, where, known)
    elif e.op == "*":
        _push(a, S.mul(adj, b), found, where, known)
        _push(b, S.mul(adj, a), found, where, known)
    elif e.op == "/":
        _push(a, S.div(adj, b), found, where, known)
        _push(b, S.neg(S.div(S.mul(adj, value), b)), found, where, known)  # -adj * (a/b) / b
    else:
        raise TCError(f"{where}: '{e.op}' of floating-point values has no gradient in tcstage")


def _call(e: C.Call, adj: C.Expr, found: dict, where: str, known: dict) -> None:
    fn, args = e.fn, e.args
    x = args[0]
    one = S.const(1.0)
    e = known.get(e, e)  # (below, e is the call's value: a read of the tensor it wrote)

    def to_x(g):
        _push(x, g, found, where, known)

    if fn == "exp":
        to_x(S.mul(adj, e))
    elif fn == "exp2":
        to_x(S.mul(S.mul(adj, e), S.const(_LN2)))
    elif fn == "log":
        to_x(S.div(adj, x))
    elif fn == "log2":
        to_x(S.div(adj, S.mul(x, S.const(_LN2))))
    elif fn == "log10":
        to_x(S.div(adj, S.mul(x, S.const(_LN10))))
    elif fn == "sqrt":
        to_x(S.div(adj, S.mul(S.const(2.0), e)))
    elif fn == "rsqrt":
        to_x(S.div(S.mul(S.mul(S.const(-0.5), adj), e), x))
    elif fn == "tanh":
        to_x(S.mul(adj, S.sub(one, S.mul(e, e))))
    elif fn == "sigmoid":
        to_x(S.mul(S.mul(adj, e), S.sub(one, e)))
    elif fn == "sin":
        to_x(S.mul(adj, S.call("cos", x)))
    elif fn == "cos":
        to_x(S.neg(S.mul(adj, S.call("sin", x))))
    elif fn == "tan":
        to_x(S.mul(adj, S.add(one, S.mul(e, e))))
    elif fn == "asin":
        to_x(S.mul(adj, S.call("rsqrt", S.sub(one, S.mul(x, x)))))
    elif fn == "acos":
        to_x(S.neg(S.mul(adj, S.call("rsqrt", S.sub(one, S.mul(x, x))))))
    elif fn == "atan":
        to_x(S.div(adj, S.add(one, S.mul(x, x))))
    elif fn == "sinh":
        to_x(S.mul(adj, S.call("cosh", x)))
    elif fn == "cosh":
        to_x(S.mul(adj, S.call("sinh", x)))
    elif fn == "erf":
        to_x(S.mul(S.mul(adj, S.const(_TWO_OVER_SQRT_PI)), S.call("exp", S.neg(S.mul(x, x)))))
    elif fn in ("fabs", "abs"):
        zero = S.const(0)
        to_x(S.select(S.compare(">", x, zero), adj,
                      S.select(S.compare("<", x, zero), S.neg(adj), zero)))
    elif fn in ("floor", "ceil", "round", "trunc"):
        return
    elif fn == "pow":
        y = args[1]
        to_x(S.mul(S.mul(adj, y), S.call("pow", x, S.sub(y, one))))
        _push(y, S.mul(S.mul(adj, e), S.call("log", x)), found, where, known)
    elif fn in ("fmax", "max", "fmin", "min"):
        y = args[1]
        first = S.compare(">" if fn in ("fmax", "max") else "<", x, y)
        to_x(S.select(first, adj, S.const(0)))
        _push(y, S.select(first, S.const(0), adj), found, where, known)
    elif fn == "atan2":  # atan2(y, x) with y first
        y, x2 = args
        r2 = S.add(S.mul(x2, x2), S.mul(y, y))
        _push(y, S.div(S.mul(adj, x2), r2), found, where, known)
        _push(x2, S.neg(S.div(S.mul(adj, y), r2)), found, where, known)
    elif fn == "fmod":
        y = args[1]
        to_x(adj)
        _push(y, S.neg(S.mul(adj, S.call("trunc", S.div(x, y)))), found, where, known)
    else:
        raise TCError(f"{where}: the builtin '{fn}' has no gradient in tcstage")
