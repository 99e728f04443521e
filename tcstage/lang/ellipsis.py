"""Rank-polymorphic TC: SaC's `...` index patterns (docs/language.md, "Any rank").

In a signature, `...` in a tensor type stands for a run of zero or more dimensions
(`float(..., N) X`); in a statement, `...` in a subscript list stands for the index variables of
that run, in order (`Y(..., i) = X(..., i) / S(...)`). Every `...` of a function denotes the
same run. A call fixes the run's length from its arguments' ranks, and this module writes the
function out for that length (`instantiate`): the run becomes size variables `D0, D1, ...` in
the types and index variables `d0, d1, ...` in the subscripts (fresh names where the function
uses these), each with the span of the `...` it replaces, so that errors point at it. Nothing
after this pass knows about `...`: range inference, lowering, kernels and caches see an ordinary
function of that rank.
"""

from __future__ import annotations

import attrs

from tcstage.errors import TCArgumentError, TCSemanticError
from tcstage.lang import ast

RUN = "..."  # the name a `...` dimension has in a parsed type


def is_polymorphic(d: ast.Def) -> bool:
    """Whether the definition has a `...` in a type or a statement."""
    if any(dim.name == RUN for p in d.params for dim in p.type.dims):
        return True
    return any(isinstance(n, ast.Dots) for s in d.statements if isinstance(s, ast.Statement)
               for n in _statement_nodes(s))


def check_pattern(d: ast.Def) -> None:
    """The errors that do not depend on the run's length, located at the `...` concerned."""
    typed = [p for p in d.params if any(dim.name == RUN for dim in p.type.dims)]
    tensors = {p.name.name for p in d.params} | {s.tensor.name for s in d.statements
                                                 if isinstance(s, ast.Statement)}
    for s in d.statements:
        if isinstance(s, ast.TCCall):
            continue
        for w in s.where:
            for n in (*ast.walk(w.lo), *ast.walk(w.hi)):
                if isinstance(n, ast.Dots):
                    raise TCSemanticError("'...' cannot be bounded by a where clause: it stands "
                                          "for a run of index variables whose ranges come from "
                                          "the tensors it indexes", n.span)
        for list_, owner in _subscript_lists(s):
            runs = [a for a in list_ if isinstance(a, ast.Dots)]
            if len(runs) > 1:
                raise TCSemanticError("a subscript list has at most one '...'", runs[1].span)
            if runs and owner not in tensors:
                raise TCSemanticError(f"'...' stands for a run of subscripts, so it goes in a "
                                      f"tensor's subscript list; '{owner}' is not a tensor",
                                      runs[0].span)
            if runs and not typed:
                raise TCSemanticError(
                    "'...' in a subscript needs a '...' in the signature, which gives the run "
                    "its length, as in 'float(..., N) X'", runs[0].span)
        allowed = {id(a) for list_, _ in _subscript_lists(s) for a in list_}
        for n in _statement_nodes(s):
            if isinstance(n, ast.Dots) and id(n) not in allowed:
                raise TCSemanticError("'...' stands for the run of index variables of a "
                                      "subscript list, as in 'X(..., i)'; it is not a value",
                                      n.span)


def run_length(d: ast.Def, shapes: dict[str, tuple[int, ...] | None]) -> int:
    """The length of the run for a call whose tensor arguments have these shapes (by parameter
    name; None where not known), or a TCArgumentError naming the tensors that disagree, in the
    run's length or its sizes, or the one whose rank is too small for its pattern."""
    found: list[tuple[str, int, int]] = []  # (parameter, its rank, the run's length)
    runs: dict[str, tuple[int, ...]] = {}  # parameter -> the sizes its `...` stands for
    for p in d.params:
        dims = p.type.dims
        if not any(dim.name == RUN for dim in dims) or shapes.get(p.name.name) is None:
            continue
        shape = shapes[p.name.name]
        rank, fixed = len(shape), len(dims) - 1
        if rank < fixed:
            raise TCArgumentError(
                f"'{p.name.name}' has rank {rank}, too small for its type "
                f"'{p.type.span.text()}', which names {fixed} dimension"
                f"{'s' if fixed != 1 else ''} besides '...'", span=p.type.span)
        found.append((p.name.name, rank, rank - fixed))
        start = [dim.name for dim in dims].index(RUN)
        runs[p.name.name] = tuple(shape[start:start + rank - fixed])
    if not found:
        raise TCArgumentError(f"'{d.name.name}' is rank-polymorphic: the length of its '...' "
                              "comes from the arguments, and none was given for a tensor whose "
                              "type has '...'", span=d.name.span)
    first = found[0]
    for other in found[1:]:
        if other[2] != first[2]:
            raise TCArgumentError(
                f"the '...' of '{first[0]}' stands for {first[2]} dimension"
                f"{'s' if first[2] != 1 else ''} (rank {first[1]}), that of '{other[0]}' for "
                f"{other[2]} (rank {other[1]}); every '...' of '{d.name.name}' is the same run",
                span=d.name.span)
        sizes = (*runs[other[0]], *runs[first[0]])
        if all(isinstance(n, int) for n in sizes) and runs[other[0]] != runs[first[0]]:
            # (symbolic sizes, PyTorch's under torch.compile, are checked by the instance)
            raise TCArgumentError(
                f"the '...' of '{first[0]}' stands for sizes {runs[first[0]]}, that of "
                f"'{other[0]}' for {runs[other[0]]}; every '...' of '{d.name.name}' is the same "
                "run", span=d.name.span)
    return first[2]


def run_names(d: ast.Def, length: int) -> tuple[list[str], list[str]]:
    """(size variables, index variables) of the run: `D0, D1, ...` and `d0, d1, ...`, with a
    trailing '_' repeated until no name of the function is taken."""
    taken = _names(d)

    def fresh(base: str) -> list[str]:
        suffix = ""
        while any(f"{base}{k}{suffix}" in taken for k in range(length)):
            suffix += "_"
        return [f"{base}{k}{suffix}" for k in range(length)]
    return fresh("D"), fresh("d")


def instantiate(d: ast.Def, length: int, names: tuple[list[str], list[str]] | None = None
                ) -> ast.Def:
    """The definition with its `...` written out for a run of `length` dimensions (`names`:
    its size and index variables, `run_names` by default)."""
    sizes, indices = names or run_names(d, length)

    def dims(t: ast.TensorType) -> tuple[ast.Ident, ...]:
        out = []
        for dim in t.dims:
            out += [ast.Ident(n, dim.span) for n in sizes] if dim.name == RUN else [dim]
        return tuple(out)

    def subscripts(args) -> tuple:
        out = []
        for a in args:
            out += [ast.Ident(n, a.span) for n in indices] if isinstance(a, ast.Dots) \
                else [expr(a)]
        return tuple(out)

    def expr(e):
        if isinstance(e, ast.Apply):
            return attrs.evolve(e, args=subscripts(e.args))
        if isinstance(e, ast.Unary):
            return attrs.evolve(e, operand=expr(e.operand))
        if isinstance(e, ast.Binary):
            return attrs.evolve(e, lhs=expr(e.lhs), rhs=expr(e.rhs))
        if isinstance(e, ast.Ternary):
            return attrs.evolve(e, cond=expr(e.cond), then=expr(e.then), other=expr(e.other))
        if isinstance(e, ast.Padded):
            return attrs.evolve(e, read=expr(e.read), value=expr(e.value))
        return e

    params = tuple(attrs.evolve(p, type=attrs.evolve(p.type, dims=dims(p.type)))
                   for p in d.params)
    statements = []
    for s in d.statements:
        if isinstance(s, ast.Statement):
            equivalent = s.equivalent and attrs.evolve(s.equivalent,
                                                       args=subscripts(s.equivalent.args))
            s = attrs.evolve(s, indices=subscripts(s.indices), rhs=expr(s.rhs),
                             equivalent=equivalent)
        statements.append(s)
    return attrs.evolve(d, params=params, statements=tuple(statements))


# -- walking the syntax tree -------------------------------------------------------------------

def _statement_nodes(s: ast.Statement) -> list:
    out = [n for i in s.indices for n in ast.walk(i)] + list(ast.walk(s.rhs))
    if s.equivalent is not None:
        out += [n for a in s.equivalent.args for n in ast.walk(a)]
    return out


def _subscript_lists(s: ast.Statement) -> list[tuple[tuple, str]]:
    """Every subscript list of the statement with the name it subscripts: its left-hand side,
    each read (a builtin call's arguments too: checked to be a tensor's), the annotation's."""
    lists = [(s.indices, s.tensor.name)]
    lists += [(n.args, n.name.name) for n in ast.walk(s.rhs) if isinstance(n, ast.Apply)]
    lists += [(n.args, n.name.name) for i in s.indices for n in ast.walk(i)
              if isinstance(n, ast.Apply)]
    return lists


def _names(d: ast.Def) -> set[str]:
    names = {d.name.name} | {r.name for r in d.returns}
    for p in d.params:
        names.add(p.name.name)
        names |= {dim.name for dim in p.type.dims}
    for s in d.statements:
        if isinstance(s, ast.TCCall):
            names |= {r.name for r in s.results} | {a.name for a in s.args}
            continue
        names.add(s.tensor.name)
        names |= {w.var.name for w in s.where}
        bounds = [x for w in s.where for x in (*ast.walk(w.lo), *ast.walk(w.hi))]
        for n in _statement_nodes(s) + bounds:
            if isinstance(n, ast.Ident):
                names.add(n.name)
            elif isinstance(n, ast.Apply):
                names.add(n.name.name)
    return names
