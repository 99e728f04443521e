"""Tiling the outermost band of a schedule tree (paper, Section 5.3), or the outermost band of
each group of statements where they share no loop.

A permutable band with members `f_0 .. f_n` becomes a *tile band* `floor(f_k / T_k)` over the
tiled members, followed by a *point band* `f_k mod T_k` (tiled members) and `f_k` (untiled ones).
A size of 0, or a member past the last given size, leaves that member untiled: its whole range
lies in the point band, as if its tile were infinite. Putting every tile loop outside every
point loop is legal because the band is permutable.

Point loops count from 0 to T_k - 1, which is what thread mapping wants: `p mod threads = t`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import islpy as isl

from tcstage.poly.notes import OptionNote, call
from tcstage.poly.schedule import keeps_value, member_map, node_at, outermost_bands, path_of


@attrs.frozen
class Tiled:
    schedule: isl.Schedule
    tiled_members: tuple[int, ...]  # members of the original band(s) that were tiled
    tile_sizes: tuple[int, ...]  # their sizes
    notes: tuple[OptionNote, ...] = ()  # sizes that could not take effect


def tile_outer_band(schedule: isl.Schedule, sizes: Sequence[int], imperfectly_nested: bool = False,
                    dependences: isl.UnionMap | None = None) -> Tiled:
    """The schedule with its outermost band (or the outermost band of each group of statements
    that share no loop) tiled by `sizes`, outermost member first. With `imperfectly_nested`,
    the point band then sinks below the loops nested inside it where `dependences` allow."""
    tiled_members: tuple[int, ...] = ()
    bands = outermost_bands(schedule)
    paths = [path_of(b) for b in bands]
    notes = _unused_sizes(sizes, max((b.band_n_member() for b in bands), default=0))
    for path in paths:  # tiling one band leaves the paths of the others unchanged
        band = node_at(schedule, path)
        n = band.band_n_member()
        tiled = tuple(k for k in range(min(n, len(sizes))) if sizes[k] > 0)
        if not tiled:
            continue
        partial = band.band_get_partial_schedule()
        tile = point = None
        for k in range(n):
            upa = partial.get_union_pw_aff(k)
            if k in tiled:
                size = isl.Val(int(sizes[k]))
                tile = _append(tile, upa.scale_down_val(size).floor())
                point = _append(point, upa.mod_val(size))
            else:
                point = _append(point, upa)
        node = band.delete()
        node = node.insert_partial_schedule(point).band_set_permutable(1)
        node = node.insert_partial_schedule(tile).band_set_permutable(1)
        if imperfectly_nested:
            node = _sink(node.child(0), dependences).parent()
        schedule = node.get_schedule()
        tiled_members = max(tiled_members, tiled, key=len)
    return Tiled(schedule, tiled_members, tuple(int(sizes[k]) for k in tiled_members), notes)


def _unused_sizes(sizes: Sequence[int], loops: int) -> tuple[OptionNote, ...]:
    """A note when tile sizes (other than 0, which means "not tiled") go past the loops."""
    if not any(sizes[loops:]):
        return ()
    if not loops:
        return (OptionNote(call("tile", sizes), "there is no loop to tile"),)
    plural = "s" if loops > 1 else ""
    return (OptionNote(call("tile", sizes), f"the outermost band has {loops} loop{plural}, so the "
                       f"sizes after the first {loops} are ignored"),)


def _sink(point: isl.ScheduleNode, dependences: isl.UnionMap) -> isl.ScheduleNode:
    """Imperfectly nested tiling (paper, Section 5.3): a point band whose loops carry no
    dependence can be sunk below any other loop, so it moves down to every leaf of its subtree,
    restricted to that leaf's statements. Then the loops nested inside it (a reduction band, the
    members of a sequence) run outside the point loops, e.g. sgemm's `k` loop outside the (i, j)
    points of a tile. Only the leading members that no dependence crosses sink; the others
    stay in a band of their own above."""
    if point.child(0).get_type() == isl.schedule_node_type.leaf:
        return point  # nothing nested inside it
    deps = dependences.intersect_domain(point.get_domain()).intersect_range(point.get_domain())
    parallel = 0
    while parallel < point.band_n_member() and keeps_value(deps, None,
                                                           member_map(point, parallel)):
        parallel += 1
    if parallel == 0:
        return point
    if parallel < point.band_n_member():  # the leading parallel members sink, the rest stay
        point = point.band_split(parallel)
    partial = point.band_get_partial_schedule()

    def down(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.leaf:
            mine = partial.intersect_domain(node.get_domain())
            return node.insert_partial_schedule(mine).band_set_permutable(1)
        for i in range(node.n_children()):
            node = down(node.child(i)).parent()
        return node

    return down(point.delete())


def _append(mupa: isl.MultiUnionPwAff | None, upa: isl.UnionPwAff) -> isl.MultiUnionPwAff:
    single = isl.MultiUnionPwAff.from_union_pw_aff(upa)
    return single if mupa is None else mupa.flat_range_product(single)
