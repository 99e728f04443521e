"""Reductions that threads (and blocks) may split: which statements are reductions, and which of
their dependences a parallel reduction makes harmless.

A statement is a *splittable reduction* when its value is `T(lhs) op rest` (or `rest op T(lhs)`)
with `op` one of `+`, `*`, `min`, `max`, the read of its own tensor T at exactly the element it
writes, and `rest` not reading T: Halide's update of a TC `+=!`, `*=!`, `min=!` or `max=!`
(or the same without `!`). Threads can then each combine their share of the reduction
variables' values into an accumulator of their own, and the block combine the accumulators
(poly/mapping.py places this, cuda/reduction.py prints it). The accumulators replace every
access the statement makes to T, so its dependences through T (on itself, and from the
statements before it that set T's element: the identity of a `+=!`) no longer order its
instances; the combine that follows the loop orders them with what comes after.

Floating-point `+` and `*` are reassociated by this (docs/cuda.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import islpy as isl

from tcstage.halide.solver import Tree
from tcstage.poly.scop import Scop, reads_in

OPERATORS = ("add", "mul", "min", "max")


@attrs.frozen
class Reduction:
    statement: str  # the update statement (S1)
    tensor: str  # the tensor it reduces into
    operator: str  # one of OPERATORS
    dtype: str  # the tensor's element type (the accumulator's)


def splittable_reductions(scop: Scop, halide_names: Mapping[str, str],
                          dtypes: Mapping[str, str]) -> dict[str, Reduction]:
    """The splittable reductions of the scop, by statement name (halide_names: Halide Func or
    buffer name -> tensor; dtypes: tensor -> element type name)."""
    out = {}
    for s in scop.statements:
        if not s.reduction_vars or not isinstance(s.value, tuple) or s.value[0] not in OPERATORS:
            continue
        if dtypes.get(s.tensor, "bool") == "bool":
            continue
        op, a, b = s.value
        for own, rest in ((a, b), (b, a)):
            if _reads_own_element(own, s.tensor, s.lhs, halide_names) and \
                    all(halide_names.get(name) != s.tensor for name in _read_names(rest)):
                out[s.name] = Reduction(s.name, s.tensor, op, dtypes[s.tensor])
                break
    return out


def _reads_own_element(tree: Tree, tensor: str, lhs: tuple, halide_names) -> bool:
    return isinstance(tree, tuple) and tree[0] == "read" and \
        halide_names.get(tree[1]) == tensor and tuple(tree[2]) == tuple(lhs)


def _read_names(tree: Tree) -> set[str]:
    return {r[1] for r in reads_in([tree])}


def relaxed_dependences(deps: isl.UnionMap, scop: Scop, reductions: Mapping[str, Reduction]
                        ) -> isl.UnionMap:
    """deps without those a parallel reduction makes harmless: between two instances of a
    reduction statement, and into one from a statement that writes the reduced tensor without
    reading it (the identity before a `+=!`). What remains must still keep a loop's value for
    threads to split it."""
    by_name = {s.name: s for s in scop.statements}
    harmless = isl.UnionMap.empty(deps.get_space())
    total = isl.UnionMap.empty(deps.get_space())
    for name, r in reductions.items():
        sink = isl.UnionSet.from_set(by_name[name].domain)
        sources = [s.domain for s in scop.statements
                   if s.name == name or (s.write.tensor == r.tensor
                                         and all(a.tensor != r.tensor for a in s.reads))]
        for source in sources:
            harmless = harmless.union(isl.UnionMap.from_domain_and_range(
                isl.UnionSet.from_set(source), sink))
        # A dependence out of a reduction into anything else stays: its sink needs the total.
        # Exact dataflow records only the last update as its source (each update depended on
        # the one before); with those chains gone, every update of the element is a source.
        write = isl.UnionMap.from_map(by_name[name].write.relation)
        same = write.apply_range(write.reverse())  # update -> updates of its element
        out = deps.intersect_domain(sink).subtract(harmless)
        total = total.union(same.apply_range(out))
    return deps.subtract(harmless).union(total)


def element_of_prefix(prefix: isl.UnionMap, scop: Scop, statement: str) -> isl.PwMultiAff | None:
    """The element the statement writes as a function of the schedule prefix (the values of the
    loops around a band), or None if one prefix value writes several elements (then the
    statement's instances under the band cannot share one accumulator per thread)."""
    s = next(s for s in scop.statements if s.name == statement)
    write = isl.UnionMap.from_map(s.write.relation)
    element = prefix.intersect_domain(isl.UnionSet.from_set(s.domain)).reverse() \
        .apply_range(write)
    if element.is_empty() or not element.is_single_valued():
        return None
    maps: list[isl.Map] = []
    element.foreach_map(maps.append)
    if len(maps) != 1:
        return None
    return isl.PwMultiAff.from_map(maps[0])
