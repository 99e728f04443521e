"""A small typed syntax tree of TC, independent of tcstage's, that prints itself as TC source.

Types follow docs/language.md: a float beats an integer, the wider of two floats or two integers
wins, literals are weak (they take the type of the operand beside them), comparisons and logic
give bool, and arithmetic on bool counts in int32. Each node carries its type, so the reference
interpreter converts operands exactly where a C-like language would.
"""

from __future__ import annotations

from typing import Union

import attrs

FLOAT_TYPES = ("float32", "float64")
INT_TYPES = ("int32", "int64")


def is_float(t: str) -> bool:
    return t.startswith("float")


def bits(t: str) -> int:
    return 1 if t == "bool" else int(t[-2:])


def promote(a: str, b: str) -> str:
    """The common type of two strongly typed operands."""
    if a == b:
        return a
    if is_float(a) or is_float(b):
        if is_float(a) and is_float(b):
            return a if bits(a) >= bits(b) else b
        return a if is_float(a) else b
    if a == "bool":
        return b
    if b == "bool":
        return a
    return a if bits(a) >= bits(b) else b


# -- nodes -----------------------------------------------------------------------------------

@attrs.frozen
class Num:
    """A literal as written (`text`), e.g. `0.5`, `.25f`, `0x3`."""

    text: str
    value: int | float
    type: str
    weak: bool = True


@attrs.frozen
class Var:
    """An index variable."""

    name: str
    type: str = "int32"
    weak: bool = False


@attrs.frozen
class Size:
    """A size variable of the signature."""

    name: str
    type: str = "int32"
    weak: bool = False


@attrs.frozen
class Dim:
    """`T.k`: the extent of dimension k of tensor T."""

    tensor: str
    k: int
    type: str = "int32"
    weak: bool = False


@attrs.frozen
class Scalar:
    """A read of a 0-rank input, by name."""

    name: str
    type: str
    weak: bool = False


@attrs.frozen
class Read:
    """`T(args)`; a rank-0 read prints as `T()`, or as plain `T` when `bare`."""

    tensor: str
    args: tuple
    type: str
    bare: bool = False
    weak: bool = False


@attrs.frozen
class Unary:
    op: str  # '-' or '!'
    x: "Expr"
    type: str
    weak: bool = False


@attrs.frozen
class Binary:
    op: str
    a: "Expr"
    b: "Expr"
    type: str  # the result type
    operand_type: str  # both operands are converted to it first
    weak: bool = False


@attrs.frozen
class Call:
    """A builtin; `fn` as written (`fmaxf`, `exp`), `canonical` without CUDA's `f` suffix."""

    fn: str
    canonical: str
    args: tuple
    type: str
    operand_type: str
    weak: bool = False


@attrs.frozen
class Select:
    cond: "Expr"
    a: "Expr"
    b: "Expr"
    type: str
    weak: bool = False


Expr = Union[Num, Var, Size, Dim, Scalar, Read, Unary, Binary, Call, Select]


def children(e: Expr) -> tuple:
    if isinstance(e, (Read, Call)):
        return e.args
    if isinstance(e, Unary):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def walk(e: Expr):
    yield e
    for c in children(e):
        yield from walk(c)


def index_vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def reads(e: Expr) -> list[Read]:
    return [n for n in walk(e) if isinstance(n, Read)]


# -- typed construction (the rules of docs/language.md) --------------------------------------

def unify(a: Expr, b: Expr) -> tuple[str, bool]:
    if a.weak and b.weak:
        return promote(a.type, b.type), True
    if a.weak:
        return (b.type if is_float(b.type) or not is_float(a.type) else "float32"), False
    if b.weak:
        return (a.type if is_float(a.type) or not is_float(b.type) else "float32"), False
    return promote(a.type, b.type), False


COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


def binary(op: str, a: Expr, b: Expr) -> Binary:
    t, weak = unify(a, b)
    if op in ("&&", "||"):
        return Binary(op, a, b, "bool", "bool", weak)
    if op in COMPARISONS:
        return Binary(op, a, b, "bool", t, weak)
    if t == "bool":
        t = "int32"
    return Binary(op, a, b, t, t, weak)


def unary(op: str, x: Expr) -> Unary:
    if op == "!":
        return Unary("!", x, "bool", x.weak)
    return Unary("-", x, "int32" if x.type == "bool" else x.type, x.weak)


FLOAT_BUILTINS_1 = ("exp", "log", "sqrt", "tanh", "sin", "cos", "floor", "ceil", "round",
                    "trunc", "fabs", "sigmoid", "exp2", "atan", "erf")
FLOAT_BUILTINS_2 = ("fmax", "fmin", "pow", "fmod", "atan2")
ANY_BUILTINS = {"max": 2, "min": 2, "abs": 1}


def call(fn: str, *args: Expr) -> Call:
    canonical = fn[:-1] if fn.endswith("f") and fn[:-1] in FLOAT_BUILTINS_1 + FLOAT_BUILTINS_2 \
        else fn
    if len(args) == 2:
        t, _ = unify(*args)
    else:
        t = args[0].type
    if canonical in ANY_BUILTINS:
        t = "int32" if t == "bool" else t
        return Call(fn, canonical, args, t, t)
    t = "float32" if fn != canonical or not is_float(t) else t
    return Call(fn, canonical, args, t, t)


def select(cond: Expr, a: Expr, b: Expr) -> Select:
    t, weak = unify(a, b)
    return Select(cond, a, b, t, weak)


# -- statements and programs -----------------------------------------------------------------

@attrs.frozen
class Where:
    """`var in lo:hi`; printed in the older `var = [lo, hi[` form when `old_syntax`."""

    var: str
    lo: Expr
    hi: Expr
    old_syntax: bool = False


@attrs.frozen
class Statement:
    tensor: str
    lhs: tuple[str, ...]
    op: str  # '=', '+', '*', 'min', 'max'
    init: bool  # the '!' of a reduction
    rhs: Expr
    where: tuple[Where, ...] = ()
    bare_lhs: bool = False  # a rank-0 left-hand side written without '()'
    # A scatter (docs/language.md, "Scatter statements"): the left-hand subscripts as
    # expressions, `lhs` is empty and every variable is a reduction variable.
    scatter: tuple | None = None

    @property
    def lhs_vars(self) -> set[str]:
        """Variables of the left-hand side: the plain ones, or those of a scatter's subscripts."""
        if self.scatter is None:
            return set(self.lhs)
        return {v for a in self.scatter for v in index_vars(a)}

    @property
    def variables(self) -> tuple[str, ...]:
        rhs_vars = sorted((index_vars(self.rhs) | {w.var for w in self.where} | self.lhs_vars)
                          - set(self.lhs))
        return self.lhs + tuple(rhs_vars)

    @property
    def reduction_vars(self) -> tuple[str, ...]:
        return self.variables[len(self.lhs):]


@attrs.frozen
class Input:
    """A parameter: `dims` are size variables or constant sizes ('3'); rank 0 is a scalar.
    `index_bound` (a size variable or constant) marks an integer tensor whose values index a
    dimension of that size."""

    name: str
    type: str
    dims: tuple[str, ...]
    index_bound: str | None = None


@attrs.frozen
class Program:
    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    statements: tuple[Statement, ...]
    sizes: dict  # size variable -> value
    inout_shapes: dict = attrs.field(factory=dict)  # in/out output -> the shape passed as out=
    scalar_values: dict = attrs.field(factory=dict)  # scalar input -> value

    @property
    def source(self) -> str:
        return render_program(self)


# -- printing ----------------------------------------------------------------------------------

_LEVEL = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
          "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_UNARY, _PRIMARY = 7, 8


def _level(e: Expr) -> int:
    if isinstance(e, Select):
        return 0
    if isinstance(e, Binary):
        return _LEVEL[e.op]
    if isinstance(e, Unary):
        return _UNARY
    return _PRIMARY


def _wrap(e: Expr, at_least: int) -> str:
    text = render(e)
    return text if _level(e) >= at_least else f"({text})"


def render(e: Expr) -> str:
    """C-precedence printing with the fewest parentheses (so the parser's precedence is tested)."""
    if isinstance(e, Num):
        return e.text
    if isinstance(e, (Var, Size, Scalar)):
        return e.name
    if isinstance(e, Dim):
        return f"{e.tensor}.{e.k}"
    if isinstance(e, Read):
        if e.bare:
            return e.tensor
        return f"{e.tensor}({', '.join(render(a) for a in e.args)})"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(render(a) for a in e.args)})"
    if isinstance(e, Unary):
        inner = _wrap(e.x, _UNARY)
        # '- -1' keeps its space only for readability; '--' is not a TC token either way.
        return f"{e.op}{inner}" if not inner.startswith("-") else f"{e.op} {inner}"
    if isinstance(e, Binary):
        level = _LEVEL[e.op]
        return f"{_wrap(e.a, level)} {e.op} {_wrap(e.b, level + 1)}"
    if isinstance(e, Select):
        return f"{_wrap(e.cond, 1)} ? {render(e.a)} : {render(e.b)}"
    raise TypeError(e)


def render_statement(s: Statement) -> str:
    op = "=" if s.op == "=" else f"{s.op}={'!' if s.init else ''}"
    if s.scatter is not None:
        lhs = f"{s.tensor}({', '.join(render(a) for a in s.scatter)})"
    else:
        lhs = s.tensor if s.bare_lhs else f"{s.tensor}({', '.join(s.lhs)})"
    text = f"{lhs} {op} {render(s.rhs)}"
    if s.where:
        parts = [f"{w.var} = [{render(w.lo)}, {render(w.hi)}[" if w.old_syntax
                 else f"{w.var} in {render(w.lo)}:{render(w.hi)}" for w in s.where]
        text += " where " + ", ".join(parts)
    return text


def _type_name(t: str) -> str:
    return {"float32": "float", "float64": "double", "int32": "int"}.get(t, t)


def render_program(p: Program) -> str:
    params = ", ".join(f"{_type_name(i.type)}({', '.join(i.dims)}) {i.name}" if i.dims
                       else f"{_type_name(i.type)} {i.name}" for i in p.inputs)
    body = "\n".join(f"  {render_statement(s)}" for s in p.statements)
    return f"def {p.name}({params}) -> ({', '.join(p.outputs)}) {{\n{body}\n}}\n"
