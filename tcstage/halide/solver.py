"""Python face of Halide's symbolic solver (see ``tcstage.halide._native``).

Results of the native routines are *trees*: nested tuples whose first element
is a tag.  The tag set (a contract shared with the rest of tcstage):

=============================  ==============================================
``('int', v)``                 integer constant; ``v`` is a Python ``int``, or
                               ``True``/``False`` for a boolean constant
``('float', v)``               floating-point constant (a Python ``float``)
``('var', name)``              variable
``(op, a, b)``                 ``op`` in ``add sub mul div mod min max eq ne
                               lt le gt ge and or``
``('not', a)``                 logical negation
``('select', c, t, f)``        ``c ? t : f``
``('cast', type_str, a)``      conversion, ``type_str`` like ``'int32'``,
                               ``'uint8'``, ``'float32'``, ``'bool'``
``('read', name, (args...))``  read of a Func or input buffer (args innermost
                               first); never rebuilt or evaluated here
``('call', name, (args...))``  any other call (``abs``, ``likely``, math...)
``('let', name, value, body)`` local binding
=============================  ==============================================

``div`` and ``mod`` have Halide's integer semantics: the quotient rounds
toward negative infinity for a positive divisor and toward positive infinity
for a negative one (Euclidean division), so the remainder is never negative;
dividing or reducing by zero gives 0.

Helpers here rebuild a ``halide.Expr`` from a tree (:func:`tree_to_expr`),
print a tree as C-like text (:func:`tree_to_str`), evaluate it on Python
integers (:func:`evaluate`) and list its free variables (:func:`tree_vars`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, Union

import attrs
import halide as hl  # must come first: loads libHalide.so for _native

try:
    from tcstage.halide import _native
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "tcstage's native Halide extension (tcstage.halide._native) is missing or "
        "cannot be loaded. It is compiled when the package is installed; reinstall "
        "tcstage from its source tree with `pip install -e .` (or `pip install .`). "
        f"Original error: {exc}"
    ) from exc

__all__ = [
    "Interval",
    "Tree",
    "and_over_domain",
    "evaluate",
    "simplify",
    "solve_inner_interval",
    "tree_to_expr",
    "tree_to_str",
    "tree_vars",
]

#: An expression tree as described in the module docstring.
Tree = tuple

BINARY_TAGS = frozenset(
    ["add", "sub", "mul", "div", "mod", "min", "max", "eq", "ne", "lt", "le", "gt", "ge", "and", "or"]
)


@attrs.frozen
class Interval:
    """Inclusive range ``lo <= x <= hi`` of trees; ``None`` marks an unbounded end."""

    lo: Tree | None
    hi: Tree | None


# ---------------------------------------------------------------------------
# Thin wrappers over the native module


def solve_inner_interval(cond: hl.Expr, var: str) -> Interval:
    """Largest interval of ``var`` on which the boolean ``cond`` is known to hold.

    Bounds are inclusive and simplified.  An empty answer comes back as
    ``Interval(('int', 1), ('int', 0))``.
    """
    lo, hi = _native.solve_for_inner_interval(cond, var)
    if (lo, hi) == _EMPTY:  # the solver misses some unsimplified forms, such as 2*k - k
        tree = simplify(cond)
        lo, hi = _native.solve_for_inner_interval(
            tree_to_expr(tree, {v: hl.Var(v) for v in tree_vars(tree)}), var)
    return Interval(lo, hi)


_EMPTY = (("int", 1), ("int", 0))


def and_over_domain(cond: hl.Expr, domain: Mapping[str, tuple[Any, Any]]) -> Tree:
    """A condition free of ``domain``'s variables that implies ``cond`` for all of them.

    ``domain`` maps each variable name to its inclusive ``(lo, hi)`` bounds,
    given as ``halide.Expr`` or ``int``.  The result is simplified.
    """
    return _native.and_condition_over_domain(cond, {k: tuple(v) for k, v in domain.items()})


def to_tree(e: hl.Expr) -> Tree:
    """The tree of ``e``, unsimplified."""
    return _native.to_tree(e)


def simplify(e: hl.Expr) -> Tree:
    """Simplify ``e`` with Halide's simplifier and return its tree."""
    return _native.simplify(e)


# ---------------------------------------------------------------------------
# Tree -> halide.Expr


def _type_from_str(s: str) -> hl.Type:
    base, _, lanes_s = s.partition("x")
    lanes = int(lanes_s) if lanes_s else 1
    if base == "bool":
        return hl.Bool(lanes)
    for prefix, ctor in (("uint", hl.UInt), ("int", hl.Int), ("bfloat", hl.BFloat), ("float", hl.Float)):
        if base.startswith(prefix) and base[len(prefix):].isdigit():
            return ctor(int(base[len(prefix):]), lanes)
    raise ValueError(f"unknown type string {s!r} in tree")


def _to_expr(value: Any) -> hl.Expr:
    # hl.Expr has no copy constructor from Python; wrap anything else.
    return value if isinstance(value, hl.Expr) else hl.Expr(value)


def _constant(t: hl.Type, value) -> hl.Expr:
    if t.is_float():
        return hl.f64(value) if t.bits() == 64 else hl.cast(t, hl.f32(value))
    if t.is_uint() and t.bits() == 64:
        return hl.u64(int(value))
    return hl.cast(t, hl.i64(int(value)))


def _as_bool_expr(e: hl.Expr) -> hl.Expr:
    # Boolean constants may have been written as plain ints (('int', 1));
    # Halide's logical operators need real booleans.
    return e if e.type().is_bool() else (e != 0)


# Halide names float math calls after their type ('sqrt_f32', 'pow_f64', ...).
_FLOAT_SUFFIXES = ("_f16", "_f32", "_f64")
_HL_CALLS = {
    "abs", "absd", "sqrt", "exp", "log", "pow", "floor", "ceil", "round", "trunc",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh",
    "asinh", "acosh", "atanh", "is_nan", "is_inf", "is_finite", "likely",
}


def _call_to_expr(name: str, args: list[hl.Expr], env: Mapping[str, Any]) -> hl.Expr:
    fn = env.get(name) if isinstance(env, Mapping) else None
    if callable(fn) and not isinstance(fn, (hl.Expr, hl.Var)):
        return _to_expr(fn(*args))
    base = name
    for suffix in _FLOAT_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    if base in _HL_CALLS and hasattr(hl, base):
        return _to_expr(getattr(hl, base)(*args))
    if base == "likely_if_innermost":
        return hl.likely(args[0])
    raise ValueError(f"cannot rebuild a halide.Expr for call {name!r}: unknown function")


#: Halide's operator for each binary tag (int `div`/`mod` are Halide's floor forms).
HALIDE_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "mod": operator.mod, "min": hl.min, "max": hl.max, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "and": lambda a, b: _as_bool_expr(a) & _as_bool_expr(b),
    "or": lambda a, b: _as_bool_expr(a) | _as_bool_expr(b),
}


def tree_to_expr(tree: Tree, env: Mapping[str, Any]) -> hl.Expr:
    """Rebuild a ``halide.Expr`` from ``tree``.

    Variables are looked up in ``env`` (values: ``hl.Expr``, ``hl.Var``,
    ``hl.RVar`` or ints).  Unknown calls may also be supplied in ``env`` as
    Python callables taking and returning Exprs.  Integer constants become
    int32 (bools stay bool), float constants become float32.  ``let`` nodes
    are substituted.
    """
    tag = tree[0]
    if tag == "int":
        v = tree[1]
        if isinstance(v, bool):
            return hl.Expr(v)
        return hl.Expr(int(v))
    if tag == "float":
        return hl.Expr(float(tree[1]))
    if tag == "var":
        name = tree[1]
        try:
            value = env[name]
        except KeyError:
            raise ValueError(
                f"tree_to_expr: variable {name!r} is not bound in the environment "
                f"(known: {sorted(env)})"
            ) from None
        return _to_expr(value)
    if tag in BINARY_TAGS:
        return HALIDE_BINARY[tag](tree_to_expr(tree[1], env), tree_to_expr(tree[2], env))
    if tag == "not":
        return hl.logical_not(_as_bool_expr(tree_to_expr(tree[1], env)))
    if tag == "select":
        c = _as_bool_expr(tree_to_expr(tree[1], env))
        return hl.select(c, tree_to_expr(tree[2], env), tree_to_expr(tree[3], env))
    if tag == "cast":
        target = _type_from_str(tree[1])
        if tree[2][0] in ("int", "float"):  # a typed constant: build it in its type, exactly
            return _constant(target, tree[2][1])
        return hl.cast(target, tree_to_expr(tree[2], env))
    if tag == "call":
        args = [tree_to_expr(a, env) for a in tree[2]]
        return _call_to_expr(tree[1], args, env)
    if tag == "let":
        value = tree_to_expr(tree[2], env)
        inner = dict(env)
        inner[tree[1]] = value
        return tree_to_expr(tree[3], inner)
    raise ValueError(f"unknown tree tag {tag!r}")


# ---------------------------------------------------------------------------
# Tree -> text

# C precedence levels (higher binds tighter).
_PREC = {
    "or": 1,
    "and": 2,
    "eq": 3, "ne": 3,
    "lt": 4, "le": 4, "gt": 4, "ge": 4,
    "add": 5, "sub": 5,
    "mul": 6, "div": 6, "mod": 6,
}
_UNARY_PREC = 7
_ATOM_PREC = 8
_OPS = {
    "or": " || ", "and": " && ",
    "eq": " == ", "ne": " != ",
    "lt": " < ", "le": " <= ", "gt": " > ", "ge": " >= ",
    "add": " + ", "sub": " - ",
    "mul": "*", "div": "/", "mod": " % ",
}
# Operators for which a op (b op c) == (a op b) op c, so the parentheses
# around a right operand with the same operator can be dropped.
_ASSOCIATIVE = frozenset(["add", "mul", "and", "or"])


def _is_neg_int(t: Tree) -> bool:
    return t[0] == "int" and not isinstance(t[1], bool) and t[1] < 0


def _is_neg_const(t: Tree) -> bool:
    return _is_neg_int(t) or (t[0] == "float" and math.copysign(1.0, t[1]) < 0)


def _fmt(tree: Tree) -> tuple[str, int]:
    """Text of ``tree`` and the precedence of its outermost operator."""
    tag = tree[0]
    if tag == "int":
        v = tree[1]
        if isinstance(v, bool):
            return ("true" if v else "false"), _ATOM_PREC
        return str(v), (_UNARY_PREC if v < 0 else _ATOM_PREC)
    if tag == "float":
        v = float(tree[1])
        return repr(v), (_UNARY_PREC if math.copysign(1.0, v) < 0 else _ATOM_PREC)
    if tag == "var":
        return str(tree[1]), _ATOM_PREC
    if tag in ("min", "max"):
        return f"{tag}({tree_to_str(tree[1])}, {tree_to_str(tree[2])})", _ATOM_PREC
    if tag in _PREC:
        a, b = tree[1], tree[2]
        # Fold a negative constant into the operator: a + -3 -> a - 3.
        if tag in ("add", "sub") and _is_neg_int(b):
            tag = "sub" if tag == "add" else "add"
            b = ("int", -b[1])
        prec = _PREC[tag]
        a_txt, a_prec = _fmt(a)
        b_txt, b_prec = _fmt(b)
        if a_prec < prec:
            a_txt = f"({a_txt})"
        same_assoc = b[0] == tag and tag in _ASSOCIATIVE
        if b_prec < prec or (b_prec == prec and not same_assoc) or _is_neg_const(b):
            b_txt = f"({b_txt})"
        return f"{a_txt}{_OPS[tag]}{b_txt}", prec
    if tag == "not":
        txt, p = _fmt(tree[1])
        if p < _UNARY_PREC:
            txt = f"({txt})"
        return f"!{txt}", _UNARY_PREC
    if tag == "select":
        return "select(" + ", ".join(tree_to_str(t) for t in tree[1:4]) + ")", _ATOM_PREC
    if tag == "cast":
        return f"{tree[1]}({tree_to_str(tree[2])})", _ATOM_PREC
    if tag in ("call", "read"):
        return f"{tree[1]}(" + ", ".join(tree_to_str(t) for t in tree[2]) + ")", _ATOM_PREC
    if tag == "let":
        return f"(let {tree[1]} = {tree_to_str(tree[2])} in {tree_to_str(tree[3])})", _ATOM_PREC
    raise ValueError(f"unknown tree tag {tag!r}")


def tree_to_str(tree: Tree) -> str:
    """Readable C-like infix text with as few parentheses as C precedence allows.

    Examples: ``11 - I``, ``(I + 1)/2``, ``min(N, M)``, ``0 <= i && i < N``.
    """
    return _fmt(tree)[0]


# ---------------------------------------------------------------------------
# Evaluation on Python numbers

Number = Union[int, float]


def _div(a: Number, b: Number) -> Number:
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            if a == 0 or math.isnan(a):
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    if b == 0:
        return 0
    # Euclidean division: remainder in [0, |b|).
    q = a // b  # floor
    if b < 0 and a - q * b != 0:
        q += 1
    return q


def _mod(a: Number, b: Number) -> Number:
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            return math.nan
        return a - b * math.floor(a / b)
    if b == 0:
        return 0
    return a - _div(a, b) * b


def _cast(type_str: str, v: Number) -> Number:
    t = _type_from_str(type_str)
    if t.is_bool():
        return bool(v)
    if t.is_float() or t.is_bfloat():
        return float(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise ValueError(f"cannot cast {v} to {type_str}")
        v = int(v)  # truncates toward zero, like C
    bits = t.bits()
    v = int(v) & ((1 << bits) - 1)
    if t.is_int() and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


_PY_CALLS = {
    "abs": abs,
    "absd": lambda a, b: abs(a - b),
    "likely": lambda a: a,
    "likely_if_innermost": lambda a: a,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "pow": math.pow,
    "floor": lambda a: float(math.floor(a)), "ceil": lambda a: float(math.ceil(a)),
    "trunc": lambda a: float(math.trunc(a)),
    "round": lambda a: float(round(a)),  # Halide rounds half to even too
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "tanh": math.tanh,
    "atan2": math.atan2,
}


@attrs.frozen
class Arithmetic:
    """The operations `evaluate` computes a tree with, by tag. One walker serves Python
    numbers (`PYTHON_ARITHMETIC`) and PyTorch's symbolic sizes (`tcstage.torch.shapes`).

    Arguments by tag: "int"/"float" the constant; "cast" (type text, value); "call" (name,
    argument values); "and"/"or" (a, thunk of b) and "select" (cond, thunk, thunk), so that
    Python can short-circuit; the rest their operands' values. A tag missing from `ops` raises
    `unsupported(tree)`, an unbound variable `missing(name)`."""

    ops: Mapping[str, Any]
    missing: Any  # name -> the exception to raise
    unsupported: Any  # tree -> the exception to raise


def _python_call(name: str, args: list) -> Number:
    base = name
    for suffix in _FLOAT_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    fn = _PY_CALLS.get(base)
    if fn is None:
        raise ValueError(f"evaluate: cannot evaluate call to {name!r}")
    return fn(*args)


PYTHON_ARITHMETIC = Arithmetic(
    ops={
        "int": lambda v: v, "float": lambda v: v,
        "add": operator.add, "sub": operator.sub, "mul": operator.mul,
        "div": _div, "mod": _mod, "min": min, "max": max,
        "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
        "gt": operator.gt, "ge": operator.ge,
        "and": lambda a, b: bool(a) and bool(b()), "or": lambda a, b: bool(a) or bool(b()),
        "not": operator.not_, "select": lambda c, then, other: then() if c else other(),
        "cast": _cast, "call": _python_call,
    },
    missing=lambda name: ValueError(f"evaluate: no value given for variable {name!r}"),
    unsupported=lambda tree: ValueError(f"unknown tree tag {tree[0]!r}"),
)


def evaluate(tree: Tree, values: Mapping[str, Any], arithmetic: Arithmetic = PYTHON_ARITHMETIC):
    """Evaluate ``tree`` with ``values`` bound to its variables.

    By default integers are unbounded Python ints (no int32 wrap-around except through
    explicit casts); division and modulo follow Halide (Euclidean, ``x/0 == 0``,
    ``x % 0 == 0``).  Comparisons and logical operators yield Python bools.  Another
    `arithmetic` evaluates the same trees on other numbers.
    """
    tag = tree[0]
    op = arithmetic.ops.get(tag)
    if tag in BINARY_TAGS and op is not None and tag not in ("and", "or"):  # the common case
        return op(evaluate(tree[1], values, arithmetic), evaluate(tree[2], values, arithmetic))
    if tag == "var":
        try:
            return values[tree[1]]
        except KeyError:
            raise arithmetic.missing(tree[1]) from None
    if tag == "let":
        inner = dict(values)
        inner[tree[1]] = evaluate(tree[2], values, arithmetic)
        return evaluate(tree[3], inner, arithmetic)
    if op is None:
        raise arithmetic.unsupported(tree)
    if tag in ("int", "float"):
        return op(tree[1])
    if tag == "cast":
        return op(tree[1], evaluate(tree[2], values, arithmetic))
    if tag == "call":
        return op(tree[1], [evaluate(a, values, arithmetic) for a in tree[2]])
    if tag == "not":
        return op(evaluate(tree[1], values, arithmetic))
    if tag == "select":
        return op(evaluate(tree[1], values, arithmetic),
                  lambda: evaluate(tree[2], values, arithmetic),
                  lambda: evaluate(tree[3], values, arithmetic))
    return op(evaluate(tree[1], values, arithmetic),  # "and", "or"
              lambda: evaluate(tree[2], values, arithmetic))


# ---------------------------------------------------------------------------


def substitute(tree: Tree, name: str, value: Tree) -> Tree:
    """tree with the free variable `name` replaced by the tree `value`."""
    def rewrite(t: Tree, again) -> Tree:  # (map, not a generator: two frames a level)
        if t[0] == "var":
            return value if t[1] == name else t
        if t[0] in ("int", "float"):
            return t
        if t[0] in ("read", "call"):
            return (t[0], t[1], tuple(map(again, t[2])))
        if t[0] == "cast":
            return ("cast", t[1], again(t[2]))
        if t[0] == "let":
            body = t[3] if t[1] == name else again(t[3])
            return ("let", t[1], again(t[2]), body)
        return (t[0], *map(again, t[1:]))
    return _shared(tree, rewrite)


def inline_lets(tree: Tree) -> Tree:
    """tree without let-expressions, each bound name replaced by its value. Halide's CSE binds
    repeated subexpressions (a clamped index used twice) to lets; the polyhedral model needs
    every subscript written out to see what it accesses. (The value is shared, not copied,
    where its name was used: the result is a DAG of the let-tree's size, however often each
    value is used, C's fmax of fmax of ... included.)"""
    return _shared(tree, _inlined)


def _inlined(tree: Tree, again) -> Tree:
    if not isinstance(tree, tuple) or not tree or tree[0] in ("int", "float", "var"):
        return tree
    if tree[0] == "let":
        return inline_lets(substitute(tree[3], tree[1], again(tree[2])))
    if tree[0] in ("read", "call"):
        return (tree[0], tree[1], tuple(map(again, tree[2])))
    if tree[0] == "cast":
        return ("cast", tree[1], again(tree[2]))
    return (tree[0], *map(again, tree[1:]))


def _shared(tree: Tree, rewrite) -> Tree:
    """rewrite(tree, again) applied once per distinct node of a tree that shares nodes
    (`again` recurses): what a node became is reused wherever the node appears again."""
    done: dict[int, tuple] = {}  # id(node) -> (node, result); the node kept alive for its id

    def again(t):
        hit = done.get(id(t))
        if hit is None:
            hit = done[id(t)] = (t, rewrite(t, again))
        return hit[1]
    return again(tree)


def read_names(tree: Tree) -> frozenset[str]:
    """Names of the Funcs and buffers that ``tree`` reads (in subscripts too)."""
    if not isinstance(tree, tuple) or not tree or tree[0] in ("int", "float", "var"):
        return frozenset()
    if tree[0] in ("read", "call"):
        inner = frozenset().union(*(read_names(a) for a in tree[2]))
        return inner | {tree[1]} if tree[0] == "read" else inner
    return frozenset().union(*(read_names(a) for a in tree[1:] if isinstance(a, tuple)))


def tree_vars(tree: Tree) -> frozenset[str]:
    """Names of the free variables of ``tree`` (let-bound names excluded)."""
    tag = tree[0]
    if tag in ("int", "float"):
        return frozenset()
    if tag == "var":
        return frozenset([tree[1]])
    if tag == "cast":
        return tree_vars(tree[2])
    if tag in ("call", "read"):
        out: frozenset[str] = frozenset()
        for a in tree[2]:
            out |= tree_vars(a)
        return out
    if tag == "let":
        return tree_vars(tree[2]) | (tree_vars(tree[3]) - {tree[1]})
    if tag in BINARY_TAGS or tag in ("not", "select"):
        out = frozenset()
        for a in tree[1:]:
            out |= tree_vars(a)
        return out
    raise ValueError(f"unknown tree tag {tag!r}")


# ---------------------------------------------------------------------------
# Tree -> isl syntax (for Presburger questions and polyhedral extraction)

_ISL_OPS = {"add": "+", "sub": "-", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=",
            "ne": "!=", "and": "and", "or": "or"}


def isl_name(name: str) -> str:
    """A name isl accepts for a variable (Halide's names carry '.' and '$')."""
    return "_" + "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def tree_to_isl(tree: Tree, names: Mapping[str, str]) -> str:
    """``tree`` in isl's affine syntax, variables renamed by ``names``.

    Raises ValueError where the tree is not quasi-affine (a product of variables, a division by
    a non-constant, a read or a call).
    """
    tag = tree[0]
    if tag == "int":
        return str(int(tree[1]))
    if tag == "var":
        if tree[1] not in names:
            raise ValueError(f"variable {tree[1]!r} has no isl name")
        return names[tree[1]]
    if tag in _ISL_OPS:
        return f"({tree_to_isl(tree[1], names)} {_ISL_OPS[tag]} {tree_to_isl(tree[2], names)})"
    if tag == "not":
        return f"(not {tree_to_isl(tree[1], names)})"
    if tag in ("min", "max"):
        return f"{tag}({tree_to_isl(tree[1], names)}, {tree_to_isl(tree[2], names)})"
    if tag == "mul" and (tree[1][0] == "int" or tree[2][0] == "int"):
        return f"({tree_to_isl(tree[1], names)} * {tree_to_isl(tree[2], names)})"
    if tag in ("div", "mod") and tree[2][0] == "int" and tree[2][1] > 0:
        a = tree_to_isl(tree[1], names)
        return f"floor({a} / {tree[2][1]})" if tag == "div" else f"({a} mod {tree[2][1]})"
    if tag == "cast" and tree[1].startswith("int"):
        return tree_to_isl(tree[2], names)
    raise ValueError(f"not affine: {tree_to_str(tree)}")
