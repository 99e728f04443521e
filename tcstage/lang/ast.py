"""The syntax tree the parser builds: exactly what was written, with a span on every node.

Names are not resolved here: `Ident` may later turn out to be an index variable, a size
variable or a scalar input, and `Apply` a tensor read or a builtin call. `sema` decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Union

import attrs

from tcstage.errors import Source, Span


@attrs.frozen
class Number:
    text: str
    span: Span


@attrs.frozen
class Ident:
    name: str
    span: Span


@attrs.frozen
class Apply:
    """`name(args)`: a tensor read or a builtin call."""

    name: Ident
    args: tuple["Expr", ...]
    span: Span


@attrs.frozen
class DimRef:
    """`T.n`: the size of dimension n of tensor T."""

    tensor: Ident
    dim: int
    span: Span


@attrs.frozen
class Unary:
    op: str  # '-' or '!'
    operand: "Expr"
    span: Span


@attrs.frozen
class Binary:
    op: str
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@attrs.frozen
class Ternary:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span


@attrs.frozen
class Padded:
    """`T(args) ?? value`: T's element where the subscripts are within T, else value."""

    read: "Expr"  # an Apply, checked to be a tensor read
    value: "Expr"
    span: Span


@attrs.frozen
class Dots:
    """`...` in a subscript list: the index variables of the function's `...` run (a
    rank-polymorphic TC, lang/ellipsis.py replaces it before checking)."""

    span: Span


Expr = Union[Number, Ident, Apply, DimRef, Unary, Binary, Ternary, Padded, Dots]


def walk(e: Expr) -> Iterator[Expr]:
    """e and every expression below it, parents first, in source order (without recursion:
    an expression may be nested as deeply as the parser allows)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, Apply):
            children = n.args
        elif isinstance(n, Unary):
            children = (n.operand,)
        elif isinstance(n, Binary):
            children = (n.lhs, n.rhs)
        elif isinstance(n, Ternary):
            children = (n.cond, n.then, n.other)
        elif isinstance(n, Padded):
            children = (n.read, n.value)
        else:
            continue
        stack.extend(reversed(children))


@attrs.frozen
class RangeConstraint:
    """`var in lo:hi` (also written `var = [lo, hi[`): lo <= var < hi."""

    var: Ident
    lo: Expr
    hi: Expr
    span: Span


@attrs.frozen
class Equivalent:
    """`<=> name(args)`: the original TC's annotation naming a library call that computes the
    same statement (`<=> matmul(A(i,k), B(k,j))`). Kept as written; it changes no code."""

    name: Ident
    args: tuple[Expr, ...]
    span: Span


@attrs.frozen
class Statement:
    """`tensor(indices) op rhs [<=> name(args)] where ...` with op one of '=', '+=', '*=',
    'min=', 'max='. A rank-0 tensor may be written without its empty index list (`O +=! ...`).

    `init` is the '!' suffix: initialise with the operator's identity before reducing.
    """

    tensor: Ident
    indices: tuple["Expr", ...]  # index variables; other expressions make a scatter
    op: str
    init: bool
    rhs: Expr
    where: tuple[RangeConstraint, ...]
    span: Span
    equivalent: Equivalent | None = None
    # Set on a statement inlined from another function (whose source its spans point into):
    # its text in the names of the function it now belongs to.
    text: str | None = None

    @property
    def reduction(self) -> str | None:
        """'+', '*', 'min' or 'max', or None for a plain assignment."""
        return None if self.op == "=" else self.op[:-1]


@attrs.frozen
class TCCall:
    """`(a, b) = f(x, y)` (also `a, b = f(x, y)`): a call of another TC function of the same
    source. `sema` inlines it: the callee's statements, renamed, take its place. The form
    `a = f(x)` parses as a `Statement` whose right-hand side is an `Apply`; sema tells the two
    apart by whether `f` names a TC function."""

    results: tuple[Ident, ...]
    callee: Ident
    args: tuple[Ident, ...]
    span: Span


@attrs.frozen
class TensorType:
    scalar: Ident  # the spelling, e.g. 'float'
    dims: tuple[Ident, ...]  # size variables; empty for a 0-rank scalar
    span: Span


@attrs.frozen
class Param:
    type: TensorType
    name: Ident
    span: Span


@attrs.frozen
class Def:
    name: Ident
    params: tuple[Param, ...]
    returns: tuple[Ident, ...]
    statements: tuple[Statement | TCCall, ...]
    span: Span


@attrs.frozen
class Module:
    defs: tuple[Def, ...]
    source: Source
