"""What each Func of a lowered TC computes, as the CPU scheduler needs to know it.

One pass over the pipeline's Funcs (Halide's own definitions, exported as trees by the native
helper) sorts each into a family:

- `pointwise`: a pure definition, perhaps followed by updates that rewrite every point in place
  (`O(i) = fmaxf(O(i), 0)` after a first statement);
- `reduction`: a pure initial value, one update that folds a reduction domain into every point
  (a `+=!`, `*=!`, `max=!` or `min=!` over the whole tensor: contractions, convolutions, table
  sums, pooling, row statistics), then pointwise updates (an epilogue such as a bias and relu);
- `other`: anything else (partial writes, scatters, several reductions into one tensor), which
  the structure-aware scheduler leaves to an autoscheduler.

For a reduction it also records how every read depends on the two innermost output dimensions,
which is what decides vectorisation and packing.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from tcstage.halide import _native
from tcstage.halide.solver import evaluate, inline_lets


@attrs.frozen
class Read:
    """One read in a definition: the Func (or input, `NAME_im`) and its subscripts as trees,
    innermost first."""

    func: str
    args: tuple

    def variables(self) -> set[str]:
        """The variables its subscripts mention."""
        return variables(self.args)

    def direct_variables(self) -> set[str]:
        """The variables its subscripts mention outside the values they read (a lookup
        table's `curve[image[x, y]]` mentions none)."""
        return variables(_without_reads(self.args))

    def dims_using(self, var: str) -> tuple[int, ...]:
        """The subscripts (innermost first) that mention variable `var`."""
        return tuple(k for k, a in enumerate(self.args) if var in variables(a))


@attrs.frozen
class FuncInfo:
    name: str
    args: tuple[str, ...]  # pure variables, innermost first
    family: str  # "pointwise" | "reduction" | "other"
    rvars: tuple[str, ...] = ()  # the reduction's variables, innermost first
    rvar_extents: tuple = ()  # their extents where constant (a pooling window), else None
    reads: tuple[Read, ...] = ()  # what it reads, the Func itself excluded (a reduction: what
    #                               its update reads; pointwise: what any definition reads)
    epilogue: int = 0  # pointwise updates after the reduction ("other": all its updates)
    operator: str = ""  # 'add', 'mul', 'max' or 'min' where the update is `R = R op value`
    #                     with a value that does not read R (Halide can then reassociate it);
    #                     else the top node of the update's value ('sub', ...)
    view: bool = False  # pointwise, and its value only reads (perhaps under a select or a
    #                     cast): a boundary condition or a wrapper, cheaper inlined than stored
    parallel: tuple[str, ...] = ()  # "other": the pure variables each of its updates writes
    #                                 at its own point, along which they may run in parallel
    operations: int = 0  # pointwise: the arithmetic its values compute, in nodes (subscripts
    #                      and the values they read not counted)
    calls: int = 0  # pointwise: the function calls among them (exp, sqrt, ...: each costs more)
    epilogue_reads: tuple[Read, ...] = ()  # a reduction: what its in-place updates read
    update_own: tuple[tuple[str, ...], ...] = ()  # "other": per update, `parallel`'s variables
    update_in_place: tuple[bool, ...] = ()  # "other": per update, whether it rewrites every
    #                                          point from itself (`O(n,c) += ...` after a scatter)
    update_inner_rvar: tuple[str, ...] = ()  # "other": per update, an RVar that is its
    #   innermost subscript alone ("" if none): a scatter of rows, `T(I(b,l), r_d) += ...`
    update_rvars: tuple[tuple[str, ...], ...] = ()  # "other": per update, its RVars,
    #                                                  innermost first
    rvar_extent_trees: tuple = ()  # a reduction: its RVars' extents as trees (an input's
    #                                extent, `A.extent.0`, where not constant)
    predicated: tuple[str, ...] = ()  # a reduction: the RVars its predicate (the points it
    #                                   skips) mentions, innermost first

    @property
    def contraction(self) -> bool:
        """Whether this is a reduction that register tiles pay for: an outer product summed, as
        in a matrix product or a convolution over channels. One read does not depend on its
        innermost output dimension and another read not on the next (so each value read
        serves a row or a column of a tile), over at least CONTRACTION_MIN_TERMS terms, or a
        count known only at run time. Not a filter window: a table of weights indexed by the
        tap alone is one read independent of both."""
        if self.family != "reduction" or len(self.args) < 2:
            return False
        terms = 1
        for extent in self.rvar_extents:
            terms = None if extent is None or terms is None else terms * extent
        if terms is not None and terms < CONTRACTION_MIN_TERMS:
            return False
        used = [read.variables() for read in self.reads]
        p0, p1 = self.args[0], self.args[1]
        return any(p0 not in a and p1 not in b and p0 in b and p1 in a
                   for a in used for b in used)

    @property
    def window(self) -> bool:
        """A reduction over a window (filter taps, resampling weights, a box): not a
        contraction, so it is computed as stencils are, not in register tiles."""
        return self.family == "reduction" and not self.contraction


CONTRACTION_MIN_TERMS = 32  # below this many terms a reduction is a small window


@attrs.frozen
class Structure:
    """Every Func of a pipeline, producers first; `readers`: Func name -> names of the Funcs
    that read it; `inputs`: the name of each input's Func (Halide's `NAME_im`) -> the
    input's name."""

    funcs: tuple[FuncInfo, ...]
    readers: Mapping[str, frozenset]
    inputs: Mapping[str, str]

    def info(self, name: str) -> FuncInfo:
        return next(f for f in self.funcs if f.name == name)


def analyse(outputs, defined) -> Structure:
    """The structure of the pipeline computing the Funcs `outputs`; `defined`: the names of
    the Funcs lowering defined (the others are its inputs' Funcs)."""
    inputs, funcs, readers = {}, [], {}
    for d in _native.pipeline_functions(outputs):
        if d["name"] not in defined:
            inputs[d["name"]] = d["definitions"][0]["values"][0][1]
            continue
        for definition in d["definitions"]:
            for r in _reads(definition):
                if r.func != d["name"]:
                    readers.setdefault(r.func, set()).add(d["name"])
        funcs.append(_classify(d))
    return Structure(tuple(funcs), {k: frozenset(v) for k, v in readers.items()}, inputs)


def _classify(d: dict) -> FuncInfo:
    name, args = d["name"], tuple(d["args"])
    defs = d["definitions"]
    pure_args = tuple(("var", a) for a in args)
    if d["extern"] or defs[0]["kind"] != "pure":
        return FuncInfo(name, args, "other")

    def in_place(u) -> bool:  # an update that rewrites each point from itself
        return not u["rvars"] and tuple(u["args"]) == pure_args and u["predicate"] == ("int", True)

    updates = defs[1:]
    if all(in_place(u) for u in updates):
        reads = tuple(r for u in defs for r in _reads(u) if r.func != name)
        view = not updates and all(_only_reads(v) for v in defs[0]["values"])
        values = [inline_lets(v) for u in defs for v in u["values"]]
        return FuncInfo(name, args, "pointwise", epilogue=len(updates), reads=reads, view=view,
                        operations=sum(map(_operations, values)),
                        calls=sum(map(_calls, values)))
    first, rest = updates[0], updates[1:]
    # (a predicate that reads nothing only skips points: the phases of a strided
    # convolution's input gradient, `lower`'s `cond ? x : 0`)
    if (first["rvars"] and tuple(first["args"]) == pure_args
            and not _reads_of(first["predicate"]) and all(in_place(u) for u in rest)
            and len(first["values"]) == 1):
        value = first["values"][0]
        operator = _combining(value, ("read", name, pure_args))
        reads = tuple(r for r in _reads(first) if r.func != name)
        extents = tuple(_constant(rv[2]) for rv in first["rvars"])
        return FuncInfo(name, args, "reduction", tuple(rv[0] for rv in first["rvars"]),
                        extents, reads, len(rest), operator, epilogue_reads=tuple(
                            r for u in rest for r in _reads(u) if r.func != name),
                        rvar_extent_trees=tuple(rv[2] for rv in first["rvars"]),
                        predicated=tuple(rv[0] for rv in first["rvars"]
                                         if rv[0] in variables(first["predicate"])))
    # A scatter or a scan: its updates may still write each point of some pure variables at
    # that point alone (a histogram per row: `h(bin(r, y), y) += 1` along y)
    # (Halide makes every read of the Func itself in them keep that point too)
    def own_of(u) -> tuple[str, ...]:  # the pure variables it writes at their own point
        return tuple(args[k] for k, a in enumerate(pure_args)
                     if len(u["args"]) == len(args) and u["args"][k] == a)
    def inner_rvar(u) -> str:  # an RVar written alone at the innermost subscript, else ""
        rvars = {rv[0] for rv in u["rvars"]}
        first = u["args"][0] if u["args"] else None
        if first and first[0] == "var" and first[1] in rvars and \
                not any(first[1] in variables(a) for a in u["args"][1:]):
            return first[1]
        return ""
    reads = tuple(r for u in defs for r in _reads(u) if r.func != name)
    return FuncInfo(name, args, "other", reads=reads, epilogue=len(updates),
                    parallel=tuple(a for a in args if all(a in own_of(u) for u in updates)),
                    update_own=tuple(own_of(u) for u in updates),
                    update_in_place=tuple(in_place(u) for u in updates),
                    update_inner_rvar=tuple(inner_rvar(u) for u in updates),
                    update_rvars=tuple(tuple(rv[0] for rv in u["rvars"]) for u in updates))


def _combining(value, self_read) -> str:
    """The operator folding values into the reduction (see FuncInfo.operator); lets around the
    update's value (Halide's common subexpressions) are looked through."""
    while isinstance(value, tuple) and value and value[0] == "let":
        value = value[3]
    if not isinstance(value, tuple) or not value:
        return ""
    if value[0] in ("add", "mul", "max", "min") and len(value) == 3:
        a, b = value[1], value[2]
        other = b if a == self_read else a if b == self_read else None
        if other is not None and self_read[1] not in _reads_of(other):
            return value[0]
    return value[0]


def _only_reads(tree) -> bool:
    """Whether a value computes nothing but which element to read: reads, constants, casts and
    selects of those (the subscripts may compute anything but reads)."""
    if not isinstance(tree, tuple) or not tree:
        return False
    if tree[0] == "read":  # (not a lookup: a subscript that reads, camera_pipe's tone curve
        #                     of its colour-corrected image, would recompute what it reads)
        return not any(_reads_of(a) for a in tree[2])
    if tree[0] in ("int", "float", "uint"):
        return True
    if tree[0] == "cast":
        return _only_reads(tree[2])
    if tree[0] == "select":
        return all(_only_reads(t) for t in tree[2:])
    return False


def _operations(tree) -> int:
    """How many arithmetic nodes a value computes outside its subscripts."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return 0
    if tree[0] in ("read", "var", "int", "uint", "float"):
        return 0
    return 1 + sum(_operations(t) for t in tree[1:] if isinstance(t, tuple))


def _calls(tree) -> int:
    """How many calls a value makes outside its subscripts."""
    if not isinstance(tree, tuple) or not tree:
        return 0
    if not isinstance(tree[0], str):  # (a call's arguments)
        return sum(map(_calls, tree))
    if tree[0] in ("read", "var", "int", "uint", "float"):
        return 0
    return (tree[0] == "call") + sum(_calls(t) for t in tree[1:] if isinstance(t, tuple))


def _reads_of(tree) -> set[str]:
    return {r.func for r in _reads({"values": (tree,), "args": ()})}


def _constant(tree) -> int | None:
    """The value of a tree without variables (an RDom's extent written as 1 - 0 + 1), else
    None."""
    if variables(tree):
        return None
    try:
        return int(evaluate(tree, {}))
    except (KeyError, TypeError, ValueError):
        return None


def _reads(definition: dict) -> list[Read]:
    """The reads of a definition, with Halide's lets (a clamped row bound to `t0` and used in
    two subscripts) written out, so that each subscript says what it reads."""
    found: list[Read] = []
    seen: set[int] = set()  # (lets written out share their value: a DAG, walked once)

    def walk(t):
        if not isinstance(t, tuple) or not t or id(t) in seen:
            return
        seen.add(id(t))
        if t[0] == "read":  # (a Tuple element, `f#k`, is a read of its Func here)
            found.append(Read(t[1].partition("#")[0], tuple(t[2])))
            for a in t[2]:
                walk(a)
            return
        # (a node's operands after its tag; a call's arguments are a tuple of trees, all of
        # them operands: `rsqrt(var(n) + eps)` read var, which went unseen)
        for x in (t[1:] if isinstance(t[0], str) else t):
            walk(x)

    for t in (*definition["values"], *definition["args"]):
        walk(inline_lets(t))
    return found


def _without_reads(t):
    """A tree (or a tuple of them) with every read replaced by a constant."""
    if not isinstance(t, tuple) or not t:
        return t
    if t[0] == "read":
        return ("int", 0)
    return tuple(_without_reads(x) if isinstance(x, tuple) else x for x in t)


def variables(t) -> set[str]:
    """The variables a tree (or a tuple of trees) mentions."""
    if not isinstance(t, tuple) or not t:
        return set()
    if t[0] == "var":
        return {t[1]}
    out: set[str] = set()
    for x in (t[1:] if isinstance(t[0], str) else t):
        if isinstance(x, tuple):
            out |= variables(x)
    return out
