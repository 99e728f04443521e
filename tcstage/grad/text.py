"""The backward function as TC text, polished until range inference takes it as written.

The statements of the backward pass are kept as data (`GradStatement`) until printed. Two
fixes then make the text a TC that `tc.define` accepts without warnings, and readable:

- A read whose bounds range inference cannot prove in the backward function gets `?? 0`: the
  backward signature does not say how new output sizes (`out_2`) relate to the input sizes, so a
  read such as `in(b, ip, h + kh, w + kw)` with `h < out_2` is not provably within `in`, though
  at the points visited it always is. Padding a recomputed forward statement's read stops it
  bounding that statement's indices, so those statements state their ranges.
- Where clauses that range inference would infer anyway are dropped, keeping any whose
  inferred range would differ (checked by inferring both texts).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from tcstage.errors import TCError
from tcstage.grad import source as S
from tcstage.halide import ranges as R
from tcstage.lang import checked as C


@attrs.frozen
class GradStatement:
    """One statement of the backward function."""

    tensor: str
    indices: tuple  # left-hand index names
    op: str  # '=', '+=!', '+='
    rhs: C.Expr
    where: tuple  # (var, lo, hi) with lo, hi checked expressions
    padded: frozenset = frozenset()  # texts of reads printed as `read ?? 0`
    scatter: tuple = ()  # left-hand subscripts (checked expressions) of a scatter

    def text(self) -> str:
        rhs = self.rhs
        if self.padded:
            rhs = S.rebuild(rhs, lambda n: C.Padded(n, S.const(0), n.type)
                            if isinstance(n, C.Read) and S.to_tc(n) in self.padded else None)
        indices = [S.to_tc(a) for a in self.scatter] if self.scatter else self.indices
        lhs = f"{self.tensor}({', '.join(indices)})" if indices else self.tensor
        text = f"{lhs} {self.op} {S.to_tc(rhs)}"
        if self.where:
            text += " where " + ", ".join(f"{v} in {S.to_tc(lo)}:{S.to_tc(hi)}"
                                           for v, lo, hi in self.where)
        return text


def render(head: str, body) -> str:
    """The function: `head` (comments and `def ...{`), one statement per line, `}`."""
    return head + "".join(f"  {st.text()}\n" for st in body) + "}\n"


def polish(head: str, body: list, recomputed: int,
           state_ranges: Callable[[int, GradStatement], GradStatement], where: str) -> str:
    """The text of the backward function whose statements are `body` (the first `recomputed`
    of them copied from the forward function; `state_ranges(k, st)` gives statement k, where it
    is such a copy, a where clause for each index). `where` names the function in errors."""
    body = list(body)
    first_line = head.count("\n") + 1
    for _ in range(4):
        missing = unchecked_reads(render(head, body), where)
        if not missing:
            break
        for line, read in missing:
            k = line - first_line
            if read.partition("(")[0].strip() == body[k].tensor:
                # (a statement's read of the tensor it writes, where its where clause may run
                # past the tensor's shape: no `??` there, and the write shares the condition,
                # which the forward function warns of already)
                continue
            body[k] = attrs.evolve(body[k], padded=body[k].padded | {read})
            # (padding stops a read bounding its indices: a copy of a forward statement states
            # them, as `state_ranges` gives them; it leaves other statements as they are)
            body[k] = state_ranges(k, body[k])
    return render(head, without_needless_where(head, body, recomputed))


def unchecked_reads(text: str, where: str) -> set[tuple[int, str]]:
    """(line, read text) of the reads whose bounds range inference cannot prove."""
    try:
        found = _inferred(text).preconditions
    except TCError as e:  # a bug of the generator: say so, with the text
        raise TCError(f"{where}: the generated backward function is not a valid TC ({e}); "
                      f"please report this with the forward TC.\n{text}") from None
    return {(p.span.line, p.span.text()) for p in found
            if p.span is not None and "stays within" in p.message}


def without_needless_where(head: str, body: list, start: int) -> list:
    """body with the where clauses of statements from `start` on dropped where range inference
    infers the same range without them (an index read plainly from a tensor of that extent)."""
    full = _statement_ranges(render(head, body))
    trial = list(body)
    for k in range(start, len(body)):
        st = body[k]
        reads = C.guarded_reads(st.rhs) + [g for a in st.scatter for g in C.guarded_reads(a)]
        plain = {a.name for g in reads if not g.guards and not g.padded
                 and S.to_tc(g.read) not in st.padded
                 for a in g.read.args if isinstance(a, C.IndexVar)}
        trial[k] = attrs.evolve(st, where=tuple(w for w in st.where if w[0] not in plain))
    for _ in range(3):
        try:
            ranges = _statement_ranges(render(head, trial))
        except TCError:
            return body
        changed = False
        for k in range(start, len(body)):
            wrong = {v for v, r in full[k].items()
                     if not (equal_trees(r.lo, ranges[k][v].lo)
                             and equal_trees(r.hi, ranges[k][v].hi))}
            if wrong:
                keep = {w[0] for w in trial[k].where} | wrong
                trial[k] = attrs.evolve(trial[k], where=tuple(
                    w for w in body[k].where if w[0] in keep))
                changed = True
        if not changed:
            return trial
    return body


def equal_trees(a, b) -> bool:
    """Whether two range trees, or two tuples of them (a (lo, hi) pair), are equal."""
    if a == b:
        return True
    if isinstance(a, tuple) and a and isinstance(a[0], tuple):  # tuples of trees
        return len(a) == len(b) and all(equal_trees(x, y) for x, y in zip(a, b))
    return R.simplify_tree(("sub", a, b)) == R.ZERO


def _inferred(text: str) -> R.FunctionRanges:
    """Range inference of the one function in `text` (scalars in subscripts set to 2)."""
    from tcstage.lang.parser import parse
    from tcstage.lang.sema import check_module
    (checked,) = check_module(parse(text, "<gradient>")).values()
    return R.infer_ranges(checked, {s: 2 for s in R.needs_specialization(checked)})


def _statement_ranges(text: str) -> list[dict]:
    return [sr.ranges for sr in _inferred(text).statements]
