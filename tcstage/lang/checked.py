"""The checked, typed form of a TC function that the rest of the compiler consumes.

Every name is resolved and every node carries its scalar type; implicit conversions are
explicit `Cast` nodes, so later passes never re-derive a type.
"""

from __future__ import annotations

from typing import Union

import attrs

from tcstage.errors import Span
from tcstage.lang.types import INT32, ScalarType

_span = attrs.field(eq=False, repr=False, default=None)


@attrs.frozen
class Const:
    value: int | float | bool
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class IndexVar:
    name: str
    span: Span | None = _span
    type: ScalarType = INT32


@attrs.frozen
class SizeVar:
    """A size variable of the signature (or `T.n` of an input), evaluating to that size."""

    name: str
    span: Span | None = _span
    type: ScalarType = INT32


@attrs.frozen
class ScalarParam:
    """A read of a 0-rank input such as `float a`."""

    name: str
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class Read:
    """`T(args)`: a read of an input, an earlier-defined tensor, or the tensor being written."""

    tensor: str
    args: tuple["Expr", ...]
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class DimOf:
    """`T.n` of a tensor defined in the function: its inferred extent along dimension n."""

    tensor: str
    dim: int
    span: Span | None = _span
    type: ScalarType = INT32


@attrs.frozen
class Unary:
    op: str  # '-' or '!'
    operand: "Expr"
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class Binary:
    op: str  # + - * / % == != < <= > >= && ||
    lhs: "Expr"
    rhs: "Expr"
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class Select:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class Call:
    """A builtin math function, by its canonical name (see `builtins.BUILTINS`)."""

    fn: str
    args: tuple["Expr", ...]
    type: ScalarType
    span: Span | None = _span


@attrs.frozen
class Cast:
    type: ScalarType
    operand: "Expr"
    span: Span | None = _span


@attrs.frozen
class Padded:
    """`T(args) ?? value`: the read of T where every subscript is within T, else `value`
    (Halide's constant_exterior boundary condition). The read never constrains range
    inference: T is as if extended by `value` in every direction."""

    read: Read
    value: "Expr"  # converted to read.type
    type: ScalarType
    span: Span | None = _span


Expr = Union[Const, IndexVar, SizeVar, ScalarParam, Read, DimOf, Unary, Binary, Select, Call, Cast,
             Padded]


@attrs.frozen
class Tensor:
    name: str
    kind: str  # 'input', 'output' or 'temp'
    type: ScalarType
    dims: tuple[str, ...]  # size variables for inputs; for in/out outputs their `T.n` names
    inout: bool = False  # an output whose initial values come from the caller (see sema)
    span: Span | None = _span
    # A float32 accumulator of lang/accumulate.py: the half or bfloat16 tensor whose values it
    # holds while a sum runs (it has that tensor's shape)
    accumulates: str | None = None
    # An input the function holds itself (a Halide pipeline's embedded hl.Buffer): a parameter
    # of the kernel that callers never pass (its values come with the binding)
    constant: bool = False

    @property
    def rank(self) -> int:
        return len(self.dims)


@attrs.frozen
class RangeConstraint:
    var: str
    lo: Expr  # inclusive
    hi: Expr  # exclusive
    span: Span | None = _span


@attrs.frozen
class Statement:
    tensor: str
    indices: tuple[str, ...]  # the left-hand side's index variables
    reduction_vars: tuple[str, ...]  # right-only index variables, in order of first use
    reduction: str | None  # '+', '*', 'min', 'max' or None for '='
    init: bool  # '!': start from the reduction's identity
    rhs: Expr
    where: tuple[RangeConstraint, ...]
    first_definition: bool
    span: Span | None = _span
    var_spans: dict = attrs.field(eq=False, repr=False, factory=dict)  # var -> first use
    # A statement inlined from a called function: its text in this function's names (its
    # span points into the callee's source). None for the function's own statements.
    text: str | None = attrs.field(eq=False, repr=False, default=None)
    # A scatter `T(I(i), j) += ...`: the left-hand subscripts, when they are not plain distinct
    # index variables (then `indices` is empty and every variable is a reduction variable).
    # Only an accumulating update (+=, *=, min=, max=) of a tensor defined earlier is one.
    scatter: tuple = ()

    @property
    def variables(self) -> tuple[str, ...]:
        return self.indices + self.reduction_vars

    @property
    def lhs_args(self) -> tuple:
        """The left-hand subscripts as expressions."""
        return self.scatter or tuple(IndexVar(v, span=self.var_spans.get(v)) for v in self.indices)


@attrs.frozen
class Function:
    name: str
    inputs: tuple[Tensor, ...]  # in signature order, 0-rank scalars included
    outputs: tuple[str, ...]
    tensors: dict  # name -> Tensor (inputs, outputs and temporaries)
    size_vars: dict  # size variable -> (input tensor, dimension) of its first occurrence
    statements: tuple[Statement, ...]
    span: Span | None = _span
    # The functions whose calls were inlined into this one (each once): their statements are
    # among `statements`, their source is not within `span`.
    callees: tuple = attrs.field(eq=False, repr=False, default=())

    @property
    def caller_inputs(self) -> tuple[Tensor, ...]:
        """The inputs callers pass, in signature order (not the constants the function holds)."""
        return tuple(t for t in self.inputs if not t.constant)

    @property
    def scalar_inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs if t.rank == 0)


def statement_text(st: Statement) -> str:
    """The statement as TC text, in its function's names, on one line."""
    text = st.text if st.text is not None else st.span.text() if st.span is not None else None
    return " ".join(text.split()) if text is not None else st.tensor


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Read, Call)):
        return e.args
    if isinstance(e, (Unary, Cast)):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Select):
        return (e.cond, e.then, e.other)
    if isinstance(e, Padded):
        return (e.read, e.value)
    return ()


def with_children(e: Expr, new: tuple[Expr, ...]) -> Expr:
    """e with its children (in `children` order) replaced by `new`."""
    if isinstance(e, (Read, Call)):
        return attrs.evolve(e, args=tuple(new))
    if isinstance(e, Padded):
        return attrs.evolve(e, read=new[0], value=new[1])
    if isinstance(e, (Unary, Cast)):
        return attrs.evolve(e, operand=new[0])
    if isinstance(e, Binary):
        return attrs.evolve(e, lhs=new[0], rhs=new[1])
    if isinstance(e, Select):
        return attrs.evolve(e, cond=new[0], then=new[1], other=new[2])
    return e


def fresh_name(base: str, taken: set) -> str:
    """base, or base_1, base_2, ...: the first not in taken, which it joins."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def walk(e: Expr):
    """Every node of e, parents before children."""
    yield e
    for c in children(e):
        yield from walk(c)


def free_vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, IndexVar)}


def has_read(e: Expr) -> bool:
    return any(isinstance(n, Read) for n in walk(e))


@attrs.frozen
class Guard:
    """A condition under which a read happens: the read is evaluated only where `cond` is
    `holds` (it sits in that branch of a `c ? a : b`)."""

    cond: Expr
    holds: bool


@attrs.frozen
class GuardedRead:
    read: Read
    guards: tuple[Guard, ...]  # every enclosing branch condition, outermost first
    padded: bool  # the read of a `T(args) ?? value`: it happens only within T


def guarded_reads(e: Expr) -> list[GuardedRead]:
    """Every read of e with the branch conditions that guard it, in the order of `walk`.
    A select's condition is always evaluated; reads in a read's subscripts share its guards."""
    out: list[GuardedRead] = []

    def go(e: Expr, guards: tuple[Guard, ...], padded: bool) -> None:
        if isinstance(e, Read):
            out.append(GuardedRead(e, guards, padded))
            for a in e.args:
                go(a, guards, False)
        elif isinstance(e, Select):
            go(e.cond, guards, False)
            go(e.then, guards + (Guard(e.cond, True),), False)
            go(e.other, guards + (Guard(e.cond, False),), False)
        elif isinstance(e, Padded):
            go(e.read, guards, True)
            go(e.value, guards, False)
        else:
            for c in children(e):
                go(c, guards, False)

    go(e, (), False)
    return out


def conjuncts(g: Guard) -> list[Guard]:
    """g as a conjunction of simpler guards: `a && b` holding is `a` and `b` holding, `a || b`
    failing is `a` and `b` failing, `!a` holding is `a` failing."""
    e, holds = g.cond, g.holds
    if isinstance(e, Unary) and e.op == "!":
        return conjuncts(Guard(e.operand, not holds))
    if isinstance(e, Binary) and e.op == ("&&" if holds else "||"):
        return conjuncts(Guard(e.lhs, holds)) + conjuncts(Guard(e.rhs, holds))
    return [g]
