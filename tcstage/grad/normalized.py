"""Softmax and log-softmax, written out in TC, recognised so that their gradients read the
output instead of computing the exponentials again.

Written out, softmax is a sum and a quotient over exponentials:

    E(n,c) = exp(U(n,c))        (or exp(...) inline in both statements below)
    S(n) +=! E(n,c)
    Y(n,c) = E(n,c) / S(n)

Statement by statement, reverse mode needs E and S in the backward (exp's derivative is E,
the quotient's are 1/S and -Y/S), and the backward function has only the forward's inputs
and outputs: it computes every exponential again, a pass as costly as the forward. Through the
three statements together the gradient needs only Y:

    d_U(n,c) = Y(n,c) * (d_Y(n,c) - P(n)),   P(n) = sum over c of d_Y(n,c) * Y(n,c)

and log-softmax, `S(n) +=! exp(A(n,c))`, `Y(n,c) = A(n,c) - log(S(n))`, likewise:

    d_A(n,c) = d_Y(n,c) - exp(Y(n,c)) * Q(n),   Q(n) = sum over c of d_Y(n,c)

(PyTorch's own backward formulas). `normalizations` finds these shapes where the closed form
is exactly the statements' gradient: S sums over the whole range of Y's other indices, and E
and S are read nowhere else, so no other gradient flows through them. `reverse` then emits the
closed form for Y's statement; S's and E's then receive no gradient from it (and pass none on,
but an output's own).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import attrs

from tcstage.grad import source as S
from tcstage.lang import checked as C


@attrs.frozen
class Normalization:
    """A softmax or log-softmax of the forward function, by statement number."""

    kind: str  # 'softmax' or 'log_softmax'
    output: int  # the statement writing Y
    total: int  # the statement writing S
    argument_at: int  # the statement whose right-hand side holds U (softmax) or A
    argument: C.Expr  # U or A, as that statement writes it
    kept: tuple[str, ...]  # Y's indices that S keeps (S's own, in order)
    # E's statement (softmax with E a tensor) maps Y's indices to its own, for writing the
    # gradient of U in E's indices; empty otherwise
    renaming: tuple[tuple[str, str], ...] = ()


def normalizations(fn: C.Function,
                   same_range: Callable[[int, str, int, str], bool]) -> dict[int, Normalization]:
    """Y's statement number -> its Normalization, for each softmax and log-softmax of `fn`.
    `same_range(n, v, k, w)`: whether index v of statement n and index w of statement k range
    over the same values."""
    writers: dict[str, list[int]] = {}
    readers: dict[str, set[int]] = {}
    for n, st in enumerate(fn.statements):
        writers.setdefault(st.tensor, []).append(n)
        for r in C.walk(st.rhs):
            if isinstance(r, C.Read):
                readers.setdefault(r.tensor, set()).add(n)
    found = {}
    for n, st in enumerate(fn.statements):
        if st.reduction is not None or st.scatter or writers[st.tensor] != [n] or \
                not fn.tensors[st.tensor].type.is_float:
            continue
        rule = _softmax(fn, n, writers, readers, same_range) or \
            _log_softmax(fn, n, writers, readers, same_range)
        if rule is not None:
            found[n] = rule
    return found


def _softmax(fn, n, writers, readers, same_range) -> Normalization | None:
    st = fn.statements[n]
    rhs = st.rhs
    if not (isinstance(rhs, C.Binary) and rhs.op == "/"):
        return None
    numerator = rhs.lhs
    summed = _total(fn, n, rhs.rhs, writers, readers, same_range,
                    lambda renamed: renamed == numerator)  # (S sums exactly the numerator)
    if summed is None:
        return None
    k, kept = summed
    if _is_exp(numerator):
        return Normalization("softmax", n, k, n, numerator.args[0], kept)
    if not (isinstance(numerator, C.Read) and _plain(numerator) and
            {a.name for a in numerator.args} == set(st.indices)):
        return None
    e_writers = writers.get(numerator.tensor, [])
    if len(e_writers) != 1 or readers.get(numerator.tensor, set()) - {n, k}:
        return None
    j = e_writers[0]
    e = fn.statements[j]
    if e.reduction is not None or e.scatter or e.reduction_vars or not _is_exp(e.rhs):
        return None
    renaming = tuple((a.name, w) for a, w in zip(numerator.args, e.indices))
    if not all(same_range(n, v, j, w) for v, w in renaming):
        return None
    return Normalization("softmax", n, k, j, e.rhs.args[0], kept, renaming)


def _log_softmax(fn, n, writers, readers, same_range) -> Normalization | None:
    rhs = fn.statements[n].rhs
    if not (isinstance(rhs, C.Binary) and rhs.op == "-" and isinstance(rhs.rhs, C.Call) and
            rhs.rhs.fn == "log" and len(rhs.rhs.args) == 1):
        return None
    argument = rhs.lhs
    summed = _total(fn, n, rhs.rhs.args[0], writers, readers, same_range,
                    lambda renamed: _is_exp(renamed) and renamed.args[0] == argument)
    if summed is None:
        return None
    k, kept = summed
    return Normalization("log_softmax", n, k, n, argument, kept)


def _total(fn, n, read, writers, readers, same_range, fits):
    """Where `read` (in statement n) is S(kept...), S's statement k sums over exactly Y's
    other indices a right-hand side that `fits` (written in Y's indices), and nothing but Y's
    statement reads S: (k, kept); else None."""
    st = fn.statements[n]
    if not (isinstance(read, C.Read) and _plain(read) and
            all(a.name in st.indices for a in read.args)):
        return None
    ks = writers.get(read.tensor, [])
    if len(ks) != 1 or readers.get(read.tensor, set()) != {n}:
        return None
    k = ks[0]
    s = fn.statements[k]
    if s.reduction != "+" or not s.init or s.scatter or k > n:
        return None
    kept = tuple(a.name for a in read.args)
    others = [v for v in st.indices if v not in kept]
    if len(s.reduction_vars) != len(others) or len(others) > 4:
        return None
    names = dict(zip(s.indices, kept))
    for order in itertools.permutations(others):
        mapping = names | dict(zip(s.reduction_vars, order))
        if all(same_range(n, mapping[w], k, w) for w in s.variables) and \
                fits(S.substitute(s.rhs, {w: C.IndexVar(v) for w, v in mapping.items()})):
            return k, kept
    return None


def _plain(read: C.Read) -> bool:
    names = [a.name for a in read.args if isinstance(a, C.IndexVar)]
    return len(names) == len(read.args) == len(set(names))


def _is_exp(e: C.Expr) -> bool:
    return isinstance(e, C.Call) and e.fn == "exp" and len(e.args) == 1
