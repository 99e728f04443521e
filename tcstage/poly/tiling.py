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

from tcstage.poly.schedule import node_at, outermost_bands, path_of


@attrs.frozen
class Tiled:
    schedule: isl.Schedule
    tiled_members: tuple[int, ...]  # members of the original band(s) that were tiled
    tile_sizes: tuple[int, ...]  # their sizes


def tile_outer_band(schedule: isl.Schedule, sizes: Sequence[int]) -> Tiled:
    """The schedule with its outermost band (or the outermost band of each group of statements
    that share no loop) tiled by `sizes`, outermost member first."""
    tiled_members: tuple[int, ...] = ()
    paths = [path_of(b) for b in outermost_bands(schedule)]
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
        schedule = node.insert_partial_schedule(tile).band_set_permutable(1).get_schedule()
        tiled_members = max(tiled_members, tiled, key=len)
    return Tiled(schedule, tiled_members, tuple(int(sizes[k]) for k in tiled_members))


def _append(mupa: isl.MultiUnionPwAff | None, upa: isl.UnionPwAff) -> isl.MultiUnionPwAff:
    single = isl.MultiUnionPwAff.from_union_pw_aff(upa)
    return single if mupa is None else mupa.flat_range_product(single)
