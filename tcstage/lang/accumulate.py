"""Sums and products into half and bfloat16 tensors accumulate in float32.

A `+` or `*` reduction over index variables (or a scatter) into a half or bfloat16 tensor
(`O(i) +=! A(i, j)` with A half) loses everything below the running value's last significant
bit: in bfloat16 a sum of ones stops at 256. So, as PyTorch and tensor cores do, a checked
function is rewritten once, before range inference, and both back ends and every printed
intermediate see the same program:

    O(i) +=! A(i, j)          becomes     O_acc(i) +=! A(i, j)     (float32, with the right-
                                          O(i) = O_acc(i)           hand side in float32 too)

The right-hand side's half and bfloat16 arithmetic is done in float32 as well (the products of
a contraction are exact there), its reads converted; conversions to integers and comparisons
keep their narrow operands, so a statement's integer values do not change. The result is
rounded to the tensor's type once, at the end.

A reduction that starts from values the tensor already has (`+=` without `!`, a second
statement into the tensor, a scatter `O(I(i)) += ...`, or an in/out output) copies the whole
tensor into the accumulator first and back after, so every point keeps its value exactly:

    O_acc(i) = O(i);  O_acc(i) += A(i, j);  O(i) = O_acc(i)

(an in/out output's first statement is then `O(i) = O(i)`, the caller's values).

A statement without reduction variables gives each element one value (one rounding, as any
pointwise statement) and is kept. `min` and `max` are kept too: they round nothing (the
minimum of narrow values is one of them). `tc.define(..., narrow_accumulation=True)` skips the
rewrite.
"""

from __future__ import annotations

import attrs

from tcstage.lang import checked as C
from tcstage.lang.builtins import BUILTINS
from tcstage.lang.types import FLOAT32, ScalarType

WIDENED = ("+", "*")
_INDEX_NAMES = ("i", "j", "k", "l", "m", "n", "p", "q", "r", "s")


def accumulate_in_float32(fn: C.Function) -> C.Function:
    """fn with every `+`/`*` reduction into a half or bfloat16 tensor accumulated in float32
    (see the module docstring); fn itself where it has none."""
    if not any(_widened(fn, st) for st in fn.statements):
        return fn
    taken = _names(fn)
    tensors = dict(fn.tensors)
    statements: list[C.Statement] = []
    for st in fn.statements:
        if not _widened(fn, st):
            statements.append(st)
            continue
        t = fn.tensors[st.tensor]
        acc = C.fresh_name(f"{st.tensor}_acc", taken)
        tensors[acc] = C.Tensor(acc, "temp", FLOAT32, ("",) * t.rank, span=t.span,
                                accumulates=t.name)
        # A read of the tensor in its own statement sees the running value (the accumulator's),
        # except in its first statement, where it sees the caller's values (the tensor's, kept
        # as they are until the result is copied back).
        reads_self = any(isinstance(r, C.Read) and r.tensor == t.name for r in C.walk(st.rhs))
        rhs = widen(st.rhs if st.first_definition else _reads_renamed(st.rhs, t.name, acc))
        reduction = attrs.evolve(st, tensor=acc, rhs=rhs, text=_renamed_text(st, acc))
        if st.init and st.first_definition and not reads_self:
            # a tensor made by this reduction: accumulate, then round
            statements += [reduction,
                           _assign(st, t.name, st.indices, acc, FLOAT32, t.type, True)]
            continue
        index = st.indices if not st.scatter else _fresh_indices(t.rank, taken)
        if st.first_definition:  # an in/out output: the caller's values, then the update
            statements.append(_assign(st, t.name, index, t.name, t.type, t.type, True))
        statements += [_assign(st, acc, index, t.name, t.type, FLOAT32, True),
                       attrs.evolve(reduction, first_definition=False),
                       _assign(st, t.name, index, acc, FLOAT32, t.type, False)]
    return attrs.evolve(fn, tensors=tensors, statements=tuple(statements))


def _widened(fn: C.Function, st: C.Statement) -> bool:
    """Whether st accumulates several values into a narrow element (with no reduction
    variable, each element takes one value: one rounding, as in a pointwise statement)."""
    return st.reduction in WIDENED and bool(st.reduction_vars) \
        and fn.tensors[st.tensor].type.is_narrow_float


def widen(e: C.Expr) -> C.Expr:
    """e's floating-point value computed in float32 where e computes in half or bfloat16 (or
    float32): narrow reads, parameters and literals are converted, arithmetic retyped. Integer
    and boolean subexpressions (subscripts, comparisons, conversions to integers) and double
    ones are kept as they are."""
    t = e.type
    if not t.is_float or t.bits > 32:
        return e
    if isinstance(e, C.Const):
        return C.Const(e.value, FLOAT32, span=e.span)
    if isinstance(e, (C.Read, C.ScalarParam, C.Padded)):
        return e if t == FLOAT32 else C.Cast(FLOAT32, e, span=e.span)
    if isinstance(e, C.Cast):
        inner = widen(e.operand)
        return inner if inner.type == FLOAT32 else C.Cast(FLOAT32, inner, span=e.span)
    if isinstance(e, C.Unary):
        return C.Unary(e.op, widen(e.operand), FLOAT32, span=e.span)
    if isinstance(e, C.Binary):
        return C.Binary(e.op, widen(e.lhs), widen(e.rhs), FLOAT32, span=e.span)
    if isinstance(e, C.Select):
        return C.Select(e.cond, widen(e.then), widen(e.other), FLOAT32, span=e.span)
    if isinstance(e, C.Call):
        return C.Call(e.fn, tuple(widen(a) for a in e.args), FLOAT32, span=e.span)
    raise AssertionError(f"unexpected floating-point expression {e!r}")


def _reads_renamed(e: C.Expr, tensor: str, acc: str) -> C.Expr:
    """e with its reads of `tensor` made reads of the float32 `acc` (converted back to the
    tensor's type, which `widen` then drops)."""
    if isinstance(e, C.Read) and e.tensor == tensor:
        return C.Cast(e.type, C.Read(acc, e.args, FLOAT32, span=e.span), span=e.span)
    kids = C.children(e)
    if not kids:
        return e
    new = tuple(_reads_renamed(k, tensor, acc) for k in kids)
    if all(a is b for a, b in zip(new, kids)):
        return e
    return C.with_children(e, new)


def _assign(st: C.Statement, tensor: str, index: tuple[str, ...], source: str,
            source_type: ScalarType, to: ScalarType, first: bool) -> C.Statement:
    """`tensor(index) = source(index)` (source of type `source_type`), converted to `to`,
    attributed to statement st (errors point at it)."""
    args = tuple(C.IndexVar(v, span=st.span) for v in index)
    read = C.Read(source, args, source_type, span=st.span)
    text = f"{tensor}({', '.join(index)}) = {source}({', '.join(index)})"
    return C.Statement(tensor, tuple(index), (), None, False, _converted(read, to), (),
                       first_definition=first, span=st.span,
                       var_spans={v: st.var_spans.get(v, st.span) for v in index}, text=text)


def _converted(e: C.Expr, to: ScalarType) -> C.Expr:
    return e if e.type == to else C.Cast(to, e, span=e.span)


def _renamed_text(st: C.Statement, acc: str) -> str:
    """The statement's text with its tensor renamed to the accumulator."""
    text = C.statement_text(st)
    return acc + text[len(st.tensor):] if text.startswith(st.tensor) else f"{acc}: {text}"


def _names(fn: C.Function) -> set[str]:
    names = set(fn.tensors) | set(fn.size_vars) | set(BUILTINS) | {fn.name}
    for t in fn.tensors.values():
        names |= set(t.dims)
    for st in fn.statements:
        names |= set(st.variables)
    return names


def _fresh_indices(rank: int, taken: set[str]) -> tuple[str, ...]:
    free = [n for n in _INDEX_NAMES if n not in taken]
    return tuple(free[k] if k < len(free) else C.fresh_name(f"i{k}", taken) for k in range(rank))
