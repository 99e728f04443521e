"""Index tensors checked before a TC operator reads through them.

A subscript that is a tensor's value (`T(I(b,l), d)`, a label `X(n, L(n))`, a histogram's
`H(I(i)) += 1`) cannot be bounded by range inference: tcstage warns at definition time, and
the compiled code clamps it, so an out-of-range index would read or write a wrong element
silently. PyTorch raises IndexError for the same mistake, so tcstage.torch operators check the
values first (`check`), over exactly the elements the statement reads; `TCOp.check_indices =
False` skips it. The checked form is a read of an integer input at plain index variables used
whole as a subscript, which is what gathers, embeddings and scatters are written as; other
value-dependent subscripts (`T(I(i) + 1)`) keep the definition-time warning only.
"""

from __future__ import annotations

import attrs
import torch

from tcstage.errors import TCIndexError
from tcstage.halide import ranges as R
from tcstage.lang import checked as C
from tcstage.torch.shapes import evaluate_symbolic


@attrs.frozen
class IndexRead:
    """Integer input `index`, read at `variables` in statement `statement`, as the subscript of
    dimension `dim` of `table`."""

    index: str
    variables: tuple[str, ...]
    statement: int
    table: str
    dim: int
    text: str = attrs.field(eq=False, default="")  # the subscript as written

    def unchecked_warning(self, function: str) -> str:
        """The start of the definition-time warning this check makes untrue ("... depends on
        tensor values, which must lie in [0, E); this is not checked")."""
        return f"in '{function}', the subscript '{self.text}' of {self.table} depends on tensor"


def index_reads(fn: C.Function) -> tuple[IndexRead, ...]:
    """The checkable index reads of a function, each once."""
    found = []
    for n, st in enumerate(fn.statements):
        tables = [(r.tensor, r.args) for r in C.walk(st.rhs) if isinstance(r, C.Read)]
        tables += [(st.tensor, st.scatter)] if st.scatter else []
        for table, subscripts in tables:
            for d, a in enumerate(subscripts):
                if isinstance(a, C.Read) and _plain(a) and \
                        fn.tensors[a.tensor].kind == "input" and not a.type.is_float:
                    read = IndexRead(a.tensor, tuple(v.name for v in a.args), n, table, d,
                                     a.span.text() if a.span is not None else "")
                    if read not in found:
                        found.append(read)
    return tuple(found)


def _plain(read: C.Read) -> bool:
    names = [a.name for a in read.args if isinstance(a, C.IndexVar)]
    return len(names) == len(read.args) == len(set(names))


@attrs.frozen
class Bound:
    """One index read of function `function` at fixed sizes: the elements of call argument
    `position` in `window` must lie in [lo, hi) (`window` None: the whole tensor)."""

    function: str
    read: IndexRead
    position: int
    window: tuple[slice, ...] | None
    lo: int
    hi: int


def bounds(fn: C.Function, reads: tuple[IndexRead, ...], ranges: R.FunctionRanges,
           values: dict) -> tuple[Bound, ...]:
    """The bounds of `reads` at the sizes and scalars `values` binds (computed once per set of
    sizes: a call then costs a min/max per index tensor, nothing else)."""
    found = []
    position = {t.name: k for k, t in enumerate(fn.inputs)}
    for r in reads:
        window = []
        for v in r.variables:
            span = ranges.statements[r.statement].ranges[v]
            lo = int(evaluate_symbolic(span.lo, values))
            window.append(slice(max(lo, 0), int(evaluate_symbolic(span.hi, values)) + 1))
        extents = ranges.tensors[r.table]
        lo = int(evaluate_symbolic(extents.mins[r.dim], values))
        hi = lo + int(evaluate_symbolic(extents.extents[r.dim], values))
        dims = [int(d) if d.isdigit() else values[d] for d in fn.tensors[r.index].dims]
        whole = all(w.start == 0 and w.stop >= n for w, n in zip(window, dims))
        found.append(Bound(fn.name, r, position[r.index], None if whole else tuple(window),
                           lo, hi))
    return tuple(found)


def check(found: tuple[Bound, ...], args) -> None:
    """Raises TCIndexError where an index tensor in `args` (torch.Tensors, the call's arguments
    in signature order) holds a value outside the dimension it indexes, at an element the
    statement reads."""
    for b in found:
        part = args[b.position] if b.window is None else args[b.position][b.window]
        if part.numel() == 0:
            continue
        least, most = (int(x) for x in torch.aminmax(part))  # (ints: compared as tensors
        if b.lo <= least and most < b.hi:                      # they cost 4 us more)
            continue
        bad = ((part < b.lo) | (part >= b.hi)).nonzero()[0].tolist()
        where = bad if b.window is None else [w.start + k for w, k in zip(b.window, bad)]
        value = int(part[tuple(bad)])
        raise TCIndexError(
            f"'{b.function}': index {value} in {b.read.index}[{', '.join(map(str, where))}] is "
            f"out of range for dimension {b.read.dim} of {b.read.table}, which is "
            f"[{b.lo}, {b.hi})",
            notes=("skip this check (at your own risk: an index out of range then reads a "
                   "clamped element) with layer.check_indices = False",))
