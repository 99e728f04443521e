"""Typed TC expressions (`checked.Expr`) to `halide.Expr`.

One translation serves range inference (subscripts over symbolic variables, where a tensor read
means "data-dependent") and lowering (full right-hand sides, where reads become Func and
ImageParam calls). The caller supplies what names and reads mean.

Integer `/` and `%` are Halide's: division rounds toward negative infinity (for a positive
divisor) and the remainder is never negative, as the range-inference spec states for TC.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping

import halide as hl

from tcstage.halide import _native
from tcstage.halide.solver import HALIDE_BINARY
from tcstage.lang import checked as C
from tcstage.lang.types import ScalarType, integer_range


class DataDependent(Exception):
    """Raised when an expression needs a tensor's values, which range inference cannot use."""


def halide_type(t: ScalarType) -> hl.Type:
    if t.kind == "bool":
        return hl.Bool()
    return {"float": hl.Float, "bfloat": hl.BFloat, "int": hl.Int, "uint": hl.UInt}[t.kind](t.bits)


def constant(value, t: ScalarType) -> hl.Expr:
    if t.is_float:
        return hl.f64(value) if t.bits == 64 else hl.cast(halide_type(t), hl.f32(value))
    if t.kind == "bool":
        return hl.cast(hl.Bool(), hl.u8(int(bool(value))))
    return hl.cast(halide_type(t), hl.i64(int(value))) if t.kind == "int" or value < 2**63 \
        else hl.u64(value)


def cast(x: hl.Expr, t: ScalarType) -> hl.Expr:
    """x converted to t with tcstage's semantics (docs/language.md, Casts), on every back end:
    a float becomes an integer truncated toward zero and saturated to the integer's range, NaN
    giving 0 (C and Halide leave out-of-range conversions undefined; CUDA's hardware saturates
    but gives 0x8000000000000000 for a NaN to 64 bits, x86 gives the least integer), so the
    conversion itself only ever sees values in range."""
    target = halide_type(t)
    if not (x.type().is_float() and t.kind in ("int", "uint")):
        return hl.cast(target, x)
    nan = hl.is_nan(x)  # (of a half itself: Halide 21's is_nan of a half widened to float32
    if x.type().bits() == 16:  # is false on x86)
        x = hl.cast(hl.Float(32), x)
    low, high = integer_range(t)
    top, bottom = float(high + 1), float(low)  # powers of two (or 0): exact in every float type
    return hl.select(nan, hl.cast(target, 0),
                     hl.select(x >= top, constant(high, t),
                               hl.select(x < bottom, constant(low, t), hl.cast(target, x))))


def _erf(x):
    """Halide's erf takes float32 only (a polynomial of float32 accuracy): half and bfloat16 go
    through float32; double calls the C library's erf (CUDA's, in CUDA code), a call Halide's
    passes leave alone. (A series spelled out in Halide, 136 terms, was as accurate, but Halide's
    bounds inference never finished a gradient that compared its values: gradient fuzz seed
    975319.)"""
    if x.type() == hl.Float(64):
        out = hl.Expr(0.0)
        _native.math_call(out, "erf", x)
        return out
    return hl.erf(x) if x.type() == hl.Float(32) else hl.cast(x.type(), hl.erf(hl.f32(x)))


def _fmod(x, y):
    return x - y * hl.trunc(x / y)


_LET_NAMES = itertools.count()


def _named(value: hl.Expr, body: Callable[[hl.Expr], hl.Expr]) -> hl.Expr:
    """body(v), v a variable bound to value by a Let: for expressions that use a value more
    than once (a NaN test, then the value), so that nesting them does not grow the tree
    exponentially. (CUDA code sees the value shared: solver.inline_lets.)"""
    name = f"tc_let{next(_LET_NAMES)}"
    v, out = hl.Expr(0), hl.Expr(0)
    _native.variable(v, name, value)
    _native.let(out, name, value, body(v))
    return out


def _c_extremum(pick: Callable) -> Callable:
    """C's fmax/fmin for floats (docs/language.md, NaN): a NaN operand is ignored, and the
    result is NaN only when both are. Halide's own float max on x86 returns one operand or the
    other by position, and CUDA's half has no fmax: spelled out, all back ends agree."""
    def extremum(a, b):
        t = pick(a, b).type()  # Halide's type matching
        if not t.is_float():
            return pick(a, b)
        return _named(hl.cast(t, a), lambda a: _named(hl.cast(t, b), lambda b: hl.select(
            hl.is_nan(a), b, hl.select(hl.is_nan(b), a, pick(a, b)))))
    return extremum


def _guarded(fn: Callable, special: Callable) -> Callable:
    """fn for floats narrower than double, whose Halide polynomials (exp, log) give finite
    garbage at NaN and infinity on the CPU (exp(inf) = 0, log(NaN) = 89): a NaN passes
    through, and `special(v)` gives (condition, value) for the infinite results. Double goes to
    libm, which is right. The form select(is_nan(v), v, select(c, K, fn(v))) is what CUDA code
    prints as fn(v) alone (cuda/codegen.py), CUDA's functions being right already."""
    def guarded(x):
        if x.type() == hl.Float(64) or not x.type().is_float():
            return fn(x)
        t = fn(x).type()

        def body(v):
            condition, value = special(v)
            return hl.select(hl.is_nan(v), hl.cast(t, v),
                             hl.select(condition, hl.cast(t, value), fn(v)))
        return _named(x, body)
    return guarded


def _pow(x, y):
    """pow for floats narrower than double through libm's double pow (Halide's float
    polynomial gets C's special cases wrong: pow(0, -1) = 0, pow(2, inf) = 0, pow(NaN, 2) =
    inf), rounded once to the float type; CUDA code prints it as powf (cuda/codegen.py)."""
    t = hl.pow(x, y).type()
    if t == hl.Float(64) or not t.is_float():
        return hl.pow(x, y)
    return hl.cast(t, hl.pow(hl.f64(x), hl.f64(y)))


_INFINITY = math.inf
_exp = _guarded(hl.exp, lambda v: (v > 89, _INFINITY))  # exp(89) overflows float


def _at_infinity(v):  # the logarithms of +inf (is_inf is strict: fast-math cannot drop it)
    return hl.is_inf(v) & (v > 0), _INFINITY


_log = _guarded(hl.log, _at_infinity)
# (each guarded whole: a NaN that reaches Halide's arithmetic on the CPU may come out as any
# value, its fast-math flags assuming none appears)
_log2 = _guarded(lambda x: hl.log(x) / hl.log(hl.cast(x.type(), 2)), _at_infinity)
_log10 = _guarded(lambda x: hl.log(x) / hl.log(hl.cast(x.type(), 10)), _at_infinity)
_sigmoid = _guarded(lambda x: 1 / (1 + hl.exp(-x)), lambda v: (v < -89, 0))

# tanh(x) / x as a polynomial in x*x on [0, 0.625]: a least-squares fit of relative error in
# float64 at Chebyshev nodes, then evaluated in float32 (within 1.3 ulp of the float64 tanh).
_TANH_SMALL = (0.9999999959362108, -0.333332587436628, 0.1333109135364583,
               -0.05371849428574989, 0.020583502859891106, -0.005652359072351912)


def _tanh(x):
    """tanh for floats narrower than double, in float32 arithmetic that Halide vectorises:
    the polynomial above for |x| < 0.625 (where 1 - 2 / (exp(2|x|) + 1) would cancel), that
    form through Halide's vectorised exp up to |x| = 9, 1 beyond, the sign restored, NaN kept.
    Halide's own tanh calls libm's tanhf once per element: 8x slower than its exp, on the
    gelu of issue 29. Within 2 ulp of float64's tanh over float32's range
    (tests/test_narrow_types.py). Double goes to libm."""
    t = x.type()
    if t == hl.Float(64) or not t.is_float():
        return hl.tanh(x)

    def body(v):
        a = hl.abs(v)
        y = a * a
        p = hl.f32(_TANH_SMALL[-1])
        for c in reversed(_TANH_SMALL[:-1]):
            p = p * y + hl.f32(c)
        big = hl.select(a > 9, hl.f32(1), 1 - 2 / (hl.exp(2 * a) + 1))
        r = hl.select(a < hl.f32(0.625), a * p, big)
        return hl.cast(t, hl.select(hl.is_nan(v), v, hl.select(v < 0, -r, r)))
    return _named(hl.f32(x), body)
_UNARY: dict[str, Callable] = {
    "exp": _exp, "log": _log, "sqrt": hl.sqrt, "rsqrt": lambda x: 1 / hl.sqrt(x),
    "tanh": hl.tanh, "sin": hl.sin, "cos": hl.cos, "tan": hl.tan, "asin": hl.asin,
    "acos": hl.acos, "atan": hl.atan, "sinh": hl.sinh, "cosh": hl.cosh, "erf": _erf,
    "exp2": lambda x: _pow(hl.cast(x.type(), 2), x), "log2": _log2, "log10": _log10,
    "floor": hl.floor, "ceil": hl.ceil, "round": hl.round, "trunc": hl.trunc,
    "fabs": hl.abs, "sigmoid": _sigmoid,
}


# The CPU's own forms: Halide vectorises them, where its tanh calls libm per element. (The CUDA
# path keeps Halide's, which it prints as CUDA's tanhf: this form, printed whole, would grow
# exponentially when nested, as its value is used several times and C has no let.)
_CPU_UNARY: dict[str, Callable] = {"tanh": _tanh}


_BINARY: dict[str, Callable] = {
    "pow": _pow, "fmax": _c_extremum(hl.max), "fmin": _c_extremum(hl.min), "atan2": hl.atan2,
    "fmod": _fmod, "max": _c_extremum(hl.max), "min": _c_extremum(hl.min),
}


def to_halide(e: C.Expr, names: Mapping[str, hl.Expr],
              read: Callable[[C.Read, list[hl.Expr]], hl.Expr] | None = None,
              dim: Callable[[C.DimOf], hl.Expr] | None = None,
              padded: Callable[[C.Padded, list[hl.Expr], hl.Expr], hl.Expr] | None = None,
              cpu: bool = False) -> hl.Expr:
    """Translates e. `names` gives index variables, size variables and scalar inputs;
    `read` builds a tensor read from its translated subscripts (None: raise DataDependent);
    `dim` gives `T.n` of a defined tensor; `padded` builds `T(args) ?? value` from the
    translated subscripts and value. `cpu`: for the CPU back end alone (`_CPU_UNARY`)."""

    def go(e: C.Expr) -> hl.Expr:
        if isinstance(e, C.Const):
            return constant(e.value, e.type)
        if isinstance(e, (C.IndexVar, C.SizeVar)):
            return names[e.name]
        if isinstance(e, C.ScalarParam):
            return names[e.name]
        if isinstance(e, C.Read):
            if read is None:
                raise DataDependent(e)
            return read(e, [go(a) for a in e.args])
        if isinstance(e, C.Padded):
            if read is None or padded is None:
                raise DataDependent(e)
            return padded(e, [go(a) for a in e.read.args], go(e.value))
        if isinstance(e, C.DimOf):
            if dim is None:
                raise DataDependent(e)
            return dim(e)
        if isinstance(e, C.Cast):
            return cast(go(e.operand), e.type)
        if isinstance(e, C.Unary):
            x = go(e.operand)
            return hl.logical_not(x) if e.op == "!" else -x
        if isinstance(e, C.Binary):
            a, b = go(e.lhs), go(e.rhs)
            return _binary(e.op, a, b)
        if isinstance(e, C.Select):
            return hl.select(go(e.cond), go(e.then), go(e.other))
        if isinstance(e, C.Call):
            args = [go(a) for a in e.args]
            if e.fn == "abs":
                return hl.cast(args[0].type(), hl.abs(args[0]))
            # (the CPU's own forms only where the argument calls no builtin: they use their
            # argument several times, and nested ones grew exponentially in Halide's lowering)
            own = cpu and not any(isinstance(n, (C.Call, C.Select)) for a in e.args
                                  for n in C.walk(a))
            fn = (own and _CPU_UNARY.get(e.fn)) or _UNARY.get(e.fn) or _BINARY[e.fn]
            return hl.cast(halide_type(e.type), fn(*args))
        raise AssertionError(f"unexpected expression {e!r}")

    return go(e)


# TC's binary operators, as the tags of `solver.HALIDE_BINARY`.
_TAGS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "==": "eq", "!=": "ne",
         "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "&&": "and", "||": "or"}


def _binary(op: str, a: hl.Expr, b: hl.Expr) -> hl.Expr:
    return HALIDE_BINARY[_TAGS[op]](a, b)
