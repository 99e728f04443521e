"""Overlapped tiles (`overlappedTiles(True)`): one launch in which each block computes, in shared
memory, the values of every intermediate tensor that its tile of the outputs needs, halo
included, recomputing what neighbouring tiles also compute. This is Halide's
`compute_at(output, blockIdx)` on a GPU, and PolyMage's overlapped tiling, done on the scop.

The outputs (the function's output tensors) are cut into tiles by the tile sizes, on their
element coordinates: every statement writing an output runs in the tile of the element it
writes, so an update and its reduction's identity share a tile. Going back through the
statements in reverse program order, the elements of each intermediate tensor that a tile needs
are those its readers in that tile read, and its statements run in the tile for exactly the
instances that write them. A statement of the new scop is the old one with the tile
coordinates as its outermost iterators: `S0[o0, o1, y, x]` runs S0's instance (y, x) for tile
(o0, o1); an instance needed by several tiles runs once in each.

Its schedule is the tile band (one member per tiled output dimension, mapped to blocks), then
the statements in program order, each under a band of its own loops (mapped to threads), with
the barriers mapping places between them. Every intermediate lives in a buffer of the block
(promotion puts it in shared memory and never copies it in or out: `scratch`), so the tiles
share nothing but the inputs and write disjoint parts of the outputs. The dependences are the
function's, between instances of one tile (`build`): a tile runs everything its instances read.

The intermediates live in one pool of shared memory, laid out so that two share bytes only
where no statement lies within both lifetimes; a dependence from everything touching the first
to the second's writers makes mapping put a barrier between them.

Refused, with the reason as an option note (the function then compiles as without the option):
nothing to recompute (no intermediate tensor), outputs of different ranks, no tiled output
dimension, an output that a statement reads at an element other than the one it writes (a
neighbouring tile's), an intermediate computed from its own other elements (a recurrence),
recomputation beyond MAX_RECOMPUTE times the work of the statements, and a pool larger than a
block's shared memory.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import attrs
import islpy as isl

from tcstage.poly.count import elements, max_int
from tcstage.poly.launches import restricted
from tcstage.poly.promotion import _padded, _tile  # (the array tile promotion will take)
from tcstage.poly.scop import Access, Scop
from tcstage.poly.tiling import Tiled

# Recomputation beyond this (instances run / instances of the statements) costs more than the
# global round trips of a kernel sequence save, as stencil chains are often compute bound: a
# halo of 2 around a 32 x 32 tile is 1.3x, three such stages 2x; a tensor that each tile needs
# whole (a reduction over the image) is the number of tiles.
MAX_RECOMPUTE = 2.0
ALIGN = 16  # bytes: where each intermediate's buffer starts in the pool
# Parts a run may grow by while its refusals are ones more parts may lift (_Pending), before
# it stops: each attempt plans the whole run again, and a long pipeline whose stages of
# several ranks keep a run pending to its end made that quadratic in its length
# (local_laplacian's 90 statements: over 20 minutes at 2560 x 1536).
PENDING_PARTS = 8
NOTHING = "there is no intermediate tensor to recompute (every tensor written is an output)"


@attrs.frozen
class Overlap:
    scop: Scop  # the statements with their tile coordinates, in the tile-major schedule's order
    dependences: isl.UnionMap  # the function's, within each tile, and the pool's reuses
    tiled: Tiled  # the tile band, then a sequence of one band per statement
    scratch: frozenset  # the recomputed (intermediate) tensors: per block, shared memory only
    # per statement of the new scop: (name, instances run, instances of the original)
    work: tuple[tuple[str, int, int], ...]
    tiles: int = 0
    pool: dict = attrs.field(factory=dict)  # intermediate -> its offset in the shared pool
    reserved: dict = attrs.field(factory=dict)  # intermediate -> the bytes kept for it there
    pool_bytes: int = 0  # the pool's size: shared memory per block for the intermediates

    @property
    def recompute(self) -> float:
        """Instances run over the instances the function has: 1.0 recomputes nothing."""
        return _recompute(self.work)

    def describe(self) -> str:
        parts = ", ".join(f"{s} {run / max(1, own):.2f}x" for s, run, own in self.work
                          if run != own)
        return (f"overlapped tiles: {self.recompute:.2f}x the function's statement instances "
                f"run ({parts or 'nothing recomputed'}); "
                f"{', '.join(sorted(self.scratch))} per block in shared memory")


@attrs.frozen
class Plan:
    """What overlapped tiles of some statements would run, before any schedule is built."""

    tiles: tuple[str, ...]  # the tile coordinates' names
    tiled: tuple[int, ...]  # the output dimensions tiled
    sizes: tuple[int, ...]  # their tile sizes
    runs: dict  # statement -> {tile -> instance} (statements nothing needs are left out)
    origins: dict  # statement -> per loop, an isl.Aff of the tile: where it starts, or None
    scratch: frozenset  # the intermediates
    work: tuple[tuple[str, int, int], ...]  # as Overlap.work
    shared_bytes: int  # the intermediates' boxes per tile, laid out in one pool
    count: int = 0  # tiles
    pool: dict = attrs.field(factory=dict)  # intermediate -> its offset in the pool (bytes)
    reserved: dict = attrs.field(factory=dict)  # intermediate -> the bytes kept for it there
    lifetimes: dict = attrs.field(factory=dict)  # intermediate -> (first, last) statement

    @property
    def recompute(self) -> float:
        return _recompute(self.work)


def _recompute(work) -> float:
    return sum(w[1] for w in work) / max(1, sum(w[2] for w in work))


class _Pending(str):
    """A refusal that more statements in the group may lift."""


def plan(scop: Scop, outputs: Collection[str], temps: Collection[str],
         tile_sizes: Sequence[int], itemsize: Mapping[str, int],
         shared_limit: int, final: Collection[str] = ()) -> Plan | str:
    """Overlapped tiles of the statements of `scop` (the outputs: tensors in `outputs`, or
    written and not in `temps`), or why not: a text completing "overlappedTiles(True) has no
    effect: ...". `final`: the outputs no statement outside scop reads (the function's)."""
    statements = scop.statements
    written = list(dict.fromkeys(s.write.tensor for s in statements))
    scratch = [t for t in written if t in temps and t not in outputs]
    kept = [t for t in written if t not in scratch]
    if not scratch:
        return _Pending(NOTHING)
    ranks = {scop.tensor_extents[t].dim(isl.dim_type.set) for t in kept}
    if len(ranks) != 1:
        return _Pending(f"the outputs {', '.join(kept)} have different ranks, so no one tiling "
                        "of their elements serves them all")
    rank = ranks.pop()
    tiled = [k for k in range(min(rank, len(tile_sizes))) if tile_sizes[k] > 0]
    if not tiled:
        return "no dimension of the outputs is tiled (tile sizes of 0 or none)"
    for k, s in enumerate(statements):
        if not s.write.exact:
            return f"{s.name} writes {s.write.text} at a subscript that is not affine"
        # A tile runs each statement's instances after the last statement's: a read of a
        # tensor that a later statement updates in the same loop (a Tuple's elements, argmin's
        # index from its value's previous iteration) would see none of those updates (Halide
        # fuzz seed 952054)
        later = {t.write.tensor: t.name for t in statements[k + 1:]}
        for a in s.reads:
            if a.tensor in later and a.tensor in scratch:
                return (f"{s.name} reads {a.tensor}, which {later[a.tensor]} updates after it "
                        "in the same loop (the elements of a Tuple), and a tile computes one "
                        "statement after another")
        for a in s.reads:
            own = a.tensor == s.write.tensor and a.relation.is_equal(s.write.relation)
            if a.tensor in kept and a.tensor in written and not own:
                why = (f"{s.name} reads the output {a.tensor} as {a.text}, an element another "
                       "tile may write")
                return why if a.tensor in final else _Pending(why)
            if a.tensor in scratch and a.tensor == s.write.tensor and not own:
                return (f"{s.name} computes {a.tensor} from its other elements ({a.text}), a "
                        "recurrence that tiles cannot split")
    names = _fresh("o", len(tiled), {i for s in statements for i in s.iterators} |
                   set(scop.params))
    params = f"[{', '.join(scop.params)}]"

    try:
        need, runs, origins, valid = _walk(scop, kept, scratch, rank, tiled, tile_sizes, True)
    except isl.Error:  # a loop unbounded without its statement's bounds (see _walk)
        need, runs, origins, valid = _walk(scop, kept, scratch, rank, tiled, tile_sizes, False)
    need = {t: box.intersect_range(scop.tensor_extents[t]) for t, box in need.items()}
    work = tuple((s.name, _instances(runs[s.name]),
                  elements(s.domain.intersect_params(scop.context)))
                 for s in statements if s.name in runs)
    sizes = {t: -(-_buffer_elements(box, scop.context) * itemsize[t] // ALIGN) * ALIGN
             for t, box in need.items()}
    life = _lifetimes([s for s in statements if s.name in runs], need)
    pool, shared = _layout(sizes, life)
    found = Plan(tuple(names), tuple(tiled), tuple(int(tile_sizes[k]) for k in tiled), runs,
                 origins, frozenset(need), work, shared, elements(valid), pool, sizes, life)
    if found.recompute > MAX_RECOMPUTE:
        return (f"each tile would recompute so much of the intermediates that the kernel runs "
                f"{found.recompute:.1f}x the statement instances (at most {MAX_RECOMPUTE}x; "
                "smaller halos or larger tiles recompute less)")
    if shared > shared_limit:
        return (f"the intermediates' tiles ({_names(need)}) take {shared} bytes of "
                f"shared memory per block, over the {shared_limit} available: use smaller "
                "tiles, or split the function")
    return found


def overlap_groups(scop: Scop, parts: Sequence[Sequence[str]], outputs: Collection[str],
                   temps: Collection[str], tile_sizes: Sequence[int],
                   itemsize: Mapping[str, int], shared_limit: int,
                   notes: list) -> list[tuple[list[str], Plan | None]]:
    """The statements, in `parts` (poly/launches.py's groups: statements that depend on each
    other both ways, in dependence order), cut into consecutive groups, each with its plan of
    overlapped tiles or None. A group grows part by part while its plan holds (the tensors it
    writes that a statement outside it reads are its outputs); where a part cannot join, the
    group closes and a new one starts with the part. Neighbouring groups without a plan merge
    (they run as kernel sequences do). Why a part could not start a group goes to `notes`.

    Growing: from each start, the longest run of parts with a plan wins. A refusal that more
    parts may lift (_Pending: nothing to recompute yet, an output read at other elements or
    outputs of several ranks, where the readers making them outputs have not joined) lets the
    run grow on, for up to PENDING_PARTS parts; any other (too much recomputation or shared
    memory, a recurrence) ends it."""
    def attempt(names) -> Plan | str:
        inside = set(names)
        # what a statement outside reads, or writes (an update's earlier definition: the group
        # must find its elements in global memory), stays in global memory
        outside = {a.tensor for s in scop.statements if s.name not in inside
                   for a in (s.write, *s.reads)}
        sub = restricted(scop, names)
        return plan(sub, set(outputs) | outside, temps, tile_sizes, itemsize,
                    shared_limit, outputs)

    out: list[tuple[list[str], Plan | None]] = []
    start = 0
    while start < len(parts):
        best, why, held = None, None, start
        for end in range(start + 1, len(parts) + 1):
            names = [n for part in parts[start:end] for n in part]
            tried = attempt(names)
            if isinstance(tried, Plan):
                best, held = (end, names, tried), end
                continue
            why = tried
            if not isinstance(tried, _Pending) or end - held >= PENDING_PARTS:
                break  # more statements only add work and memory
        if best is None:
            notes.append(str(why))
            out.append((list(parts[start]), None))
            start += 1
            continue
        end, names, found = best
        out.append((names, found))
        start = end
    merged: list[tuple[list[str], Plan | None]] = []
    for names, p in out:
        if p is None and merged and merged[-1][1] is None:
            merged[-1] = (merged[-1][0] + names, None)
        else:
            merged.append((names, p))
    order = {s.name: k for k, s in enumerate(scop.statements)}
    return [(sorted(names, key=order.get), p) for names, p in merged]


def build(scop: Scop, found: Plan, dependences: isl.UnionMap) -> Overlap:
    """The scop of the plan's statements with their tile coordinates, its dependences and the
    tile-major schedule. `dependences`: those of the statements as they were. Each relates two
    instances in one tile: through an intermediate (one copy per tile), or through an output
    element, which one tile writes and reads (`plan` refuses the rest). A tile runs every
    instance whose value it reads, and every instance writing an element it needs, so the
    dependences among its instances are those of the function, with both ends in that tile."""
    params = f"[{', '.join(scop.params)}]"
    names = list(found.tiles)
    tile_space = ", ".join(names)
    expanded, drops, tiles = [], {}, {}
    for s in scop.statements:
        if s.name not in found.runs:
            continue
        domain = found.runs[s.name].wrap().flatten().set_tuple_name(s.name)
        for k, n in enumerate(names + list(s.iterators)):
            domain = domain.set_dim_name(isl.dim_type.set, k, n)
        loops = ", ".join(s.iterators)
        full = ", ".join(names + list(s.iterators))
        drop = isl.Map(f"{params} -> {{ {s.name}[{full}] -> {s.name}[{loops}] }}") \
            .intersect_domain(domain)
        drops[s.name] = drop
        tiles[s.name] = isl.Map(f"{params} -> {{ {s.name}[{full}] -> [{tile_space}] }}") \
            .intersect_domain(domain)

        def moved(a: Access) -> Access:
            return attrs.evolve(a, relation=drop.apply_range(a.relation))
        expanded.append(attrs.evolve(
            s, domain=domain, iterators=tuple(names) + s.iterators,
            halide_iterators=tuple(f"_tile_{n}" for n in names) + s.halide_iterators,
            write=moved(s.write), reads=tuple(moved(a) for a in s.reads)))
    lifted = isl.UnionMap.empty(scop.context.get_space())

    def lift(m: isl.Map) -> None:
        nonlocal lifted
        a = m.get_tuple_name(isl.dim_type.in_)
        b = m.get_tuple_name(isl.dim_type.out)
        if a in drops and b in drops:
            pairs = drops[a].apply_range(m).apply_range(drops[b].reverse()) \
                .intersect(tiles[a].apply_range(tiles[b].reverse()))
            lifted = lifted.union(isl.UnionMap.from_map(pairs.coalesce()))
    dependences.intersect_params(scop.context).foreach_map(lift)
    # intermediates sharing bytes of the pool: everything accessing the earlier one runs (in
    # every thread) before anything writes the later one, a dependence within each tile
    for earlier, later in _sharing(found):
        for a in expanded:
            if earlier not in {a.write.tensor, *(r.tensor for r in a.reads)}:
                continue
            for b in expanded:
                if b.write.tensor == later:
                    lifted = lifted.union(isl.UnionMap.from_map(
                        tiles[a.name].apply_range(tiles[b.name].reverse())))
    schedule = _schedule(expanded, names, scop.context, lifted, found.origins)
    new = attrs.evolve(scop, statements=tuple(expanded), schedule=schedule)
    return Overlap(new, lifted, Tiled(schedule, found.tiled, found.sizes),
                   found.scratch, found.work, found.count, found.pool, found.reserved,
                   found.shared_bytes)


def _lifetimes(statements, need) -> dict[str, tuple[int, int]]:
    """Per intermediate, the first and last statement (positions in program order) that
    access it."""
    life: dict[str, tuple[int, int]] = {}
    for k, s in enumerate(statements):
        for tensor in (s.write.tensor, *(a.tensor for a in s.reads)):
            if tensor in need:
                first, last = life.get(tensor, (k, k))
                life[tensor] = (min(first, k), max(last, k))
    return life


def _layout(sizes: Mapping[str, int], life: Mapping[str, tuple[int, int]]
            ) -> tuple[dict[str, int], int]:
    """Offsets of the intermediates in one pool of shared memory, and its size: two share
    bytes only where no statement lies within both lifetimes (the later one's first writer
    comes after the earlier one's last access; build() orders them with a barrier). First
    fit, in order of first use."""
    placed: list[tuple[str, int]] = []
    for tensor in sorted(sizes, key=lambda t: (life[t][0], -sizes[t], t)):
        first, last = life[tensor]
        busy = sorted((offset, offset + sizes[other]) for other, offset in placed
                      if life[other][0] <= last and first <= life[other][1])
        offset = 0
        for lo, hi in busy:
            if offset + sizes[tensor] <= lo:
                break
            offset = max(offset, hi)
        placed.append((tensor, offset))
    pool = dict(placed)
    return pool, max((pool[t] + sizes[t] for t in pool), default=0)


def _sharing(found) -> list[tuple[str, str]]:
    """(earlier, later) intermediates whose bytes in the pool overlap."""
    out = []
    for a, oa in found.pool.items():
        for b, ob in found.pool.items():
            if a < b and oa < ob + found.reserved[b] and ob < oa + found.reserved[a]:
                out.append((a, b) if found.lifetimes[a][1] < found.lifetimes[b][0] else (b, a))
    return out


def _buffer_elements(box: isl.Map, context: isl.Set) -> int:
    """Elements of the buffer promotion will give the box a tile needs: its array tile (the
    largest extent over the tiles, per dimension), padded as promotion pads it."""
    tile = _tile(box, context)
    return math.prod(_padded(tile.sizes)) if tile is not None else 0


def _schedule(statements, tiles: list[str], context: isl.Set,
              dependences: isl.UnionMap, origins: dict) -> isl.Schedule:
    """The tile band over every statement, then a sequence of the statements in program order,
    each under a band of its own loops (permutable where no dependence of the statement on
    itself goes backwards along a loop)."""
    domain = isl.UnionSet.empty(context.get_space())
    for s in statements:
        domain = domain.union(isl.UnionSet.from_set(s.domain))
    tile_band = None
    for k in range(len(tiles)):
        member = isl.UnionMap.empty(context.get_space())
        for s in statements:
            vec = ", ".join(s.iterators)
            member = member.union(isl.UnionMap(f"{{ {s.name}[{vec}] -> [{tiles[k]}] }}"))
        upa = isl.MultiUnionPwAff.from_union_map(member.intersect_domain(domain))
        tile_band = upa if tile_band is None else tile_band.flat_range_product(upa)
    node = isl.Schedule.from_domain(domain).get_root().child(0) \
        .insert_partial_schedule(tile_band).band_set_permutable(1)
    for k in range(len(tiles)):
        node = node.band_member_set_coincident(k, 1)
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(statements))
    for s in statements:
        filters = filters.add(isl.UnionSet.from_set(s.domain))
    node = node.child(0)
    if len(statements) > 1:
        node = node.insert_sequence(filters)
    for k, s in enumerate(statements):
        leaf = node.child(k).child(0) if len(statements) > 1 else node
        own = s.iterators[len(tiles):]
        if not own:
            continue
        band = None
        space = s.domain.get_space()
        params = ", ".join(space.get_dim_name(isl.dim_type.param, k)
                           for k in range(space.dim(isl.dim_type.param)))
        to_tile = isl.MultiAff(f"[{params}] -> {{ {s.name}[{', '.join(s.iterators)}] -> "
                               f"[{', '.join(tiles)}] }}")
        for j in range(len(own)):
            value = isl.PwAff.var_on_domain(isl.LocalSpace.from_space(space), isl.dim_type.set,
                                            len(tiles) + j)
            origin = origins[s.name][j]
            if origin is not None:
                value = value.sub(isl.PwAff.from_aff(origin.pullback_multi_aff(to_tile)))
            member = isl.MultiUnionPwAff.from_union_pw_aff(isl.UnionPwAff.from_pw_aff(
                value.intersect_domain(s.domain)))
            band = member if band is None else band.flat_range_product(member)
        leaf = leaf.insert_partial_schedule(band)
        self_deps = dependences.intersect_domain(isl.UnionSet.from_set(s.domain)) \
            .intersect_range(isl.UnionSet.from_set(s.domain))
        leaf = leaf.band_set_permutable(int(_forward(self_deps, len(tiles), len(own))))
        node = leaf.parent().parent() if len(statements) > 1 else leaf.parent()
    return node.get_schedule()


def _forward(deps: isl.UnionMap, skip: int, n: int) -> bool:
    """Whether every dependence moves forward or stays along each of n loops after the first
    `skip` iterators (a band of them can be tiled and permuted)."""
    if deps.is_empty():
        return True
    ok = True

    def check(m: isl.Map) -> None:
        nonlocal ok
        deltas = m.deltas()
        if any(_negative(deltas, k) for k in range(skip, skip + n)):
            ok = False
    deps.foreach_map(check)
    return ok


def _negative(deltas: isl.Set, k: int) -> bool:
    """Whether some difference is negative along dimension k."""
    space = deltas.get_space()
    negative = isl.Set.universe(space).add_constraint(
        isl.Constraint.inequality_alloc(isl.LocalSpace.from_space(space))
        .set_coefficient_val(isl.dim_type.set, k, isl.Val(-1)).set_constant_val(isl.Val(-1)))
    return not deltas.intersect(negative).is_empty()


def _instances(run: isl.Map) -> int:
    """Instances over all tiles of {tile -> instance}, each tile's counted as its box: the
    product of its extents, a function of the tile that is constant but near the edges."""
    per_tile = isl.PwQPolynomial.from_pw_aff(
        isl.PwAff.val_on_domain(run.domain(), isl.Val(1)))
    for k in range(run.dim(isl.dim_type.out)):
        extent = isl.PwQPolynomial.from_pw_aff(run.dim_max(k).sub(run.dim_min(k)))
        per_tile = per_tile.mul(extent.add(isl.PwQPolynomial.from_pw_aff(
            isl.PwAff.val_on_domain(run.domain(), isl.Val(1)))))
    total = 0
    for tiles, count in per_tile.get_pieces():
        if not count.involves_dims(isl.dim_type.in_, 0, tiles.dim(isl.dim_type.set)):
            total += int(count.get_constant_val().to_python()) * \
                int(tiles.count_val().to_python())
            continue
        values = []
        tiles.foreach_point(lambda p: values.append(int(count.eval(p).to_python())))
        total += sum(values)
    return total


def _walk(scop: Scop, kept, scratch, rank: int, tiled, tile_sizes, relaxed: bool):
    """Per intermediate, {tile -> element} (a box per tile); per statement, {tile -> instance}
    and where each of its loops starts in a tile; the tiles. `relaxed`: see the comment."""
    statements = scop.statements
    params = f"[{', '.join(scop.params)}]"
    # From the outputs back through their readers to the intermediates. Relaxed: without the
    # bounds of the statements' pure loops (clipped only at the end), a tile's boxes are
    # affine in its coordinates; with them, isl splits every box into pieces at the edges of
    # the image, which made a 32-stage chain take 20 s. (Where a loop is unbounded without
    # them, as when a domain of one row lets `a0 = y` read `a0 = 0`, isl says so: not relaxed.)
    need: dict[str, isl.Map] = {}  # intermediate -> {tile -> element}: a box per tile
    runs: dict[str, isl.Map] = {}  # statement -> {tile -> instance}
    origins: dict[str, tuple] = {}  # statement -> per loop, its first value in a tile
    valid: isl.Set | None = None
    for s in reversed(statements):
        loose = _loose_domain(s) if relaxed else s.domain
        relation = _loose if relaxed else (lambda r: r)
        if s.write.tensor in kept:
            element = ", ".join(f"e{k}" for k in range(rank))
            tiles = ", ".join(f"floor(e{k} / {int(tile_sizes[k])})" for k in tiled)
            extent = scop.tensor_extents[s.write.tensor]
            untiled = " and ".join(f"{max_int(extent.dim_min(k).neg()) * -1} <= e{k} <= "
                                   f"{max_int(extent.dim_max(k))}"
                                   for k in range(rank) if k not in tiled) or "true"
            to_tile = isl.Map(f"{params} -> {{ {s.write.tensor}[{element}] -> [{tiles}] : "
                              f"{untiled} }}")
            run = relation(s.write.relation).apply_range(to_tile).reverse()
        elif s.write.tensor in need:
            run = need[s.write.tensor].apply_range(relation(s.write.relation).reverse())
        else:
            continue  # an intermediate nothing reads: not run
        run = run.intersect_range(loose).intersect_params(scop.context)
        if s.write.tensor in kept:  # the tiles: those holding an element of an output
            clipped = run.intersect_range(s.domain).domain()
            valid = clipped if valid is None else valid.union(clipped)
        else:
            run = run.intersect_domain(valid)
        # each loop counted from the tile's first value (affine in the tile where the loop
        # follows it, so threads split one tile's values), else from 0
        origins[s.name] = tuple(_affine(run.dim_min(k)) for k in range(len(s.iterators)))
        runs[s.name] = run.intersect_range(s.domain).coalesce()
        for a in s.reads:
            if a.tensor in scratch and a.tensor != s.write.tensor:
                footprint = run.apply_range(relation(a.relation))
                if a.tensor in need:
                    footprint = footprint.union(need[a.tensor])
                # a box per tile (the hull of the readers' stencils): a few more instances
                # than the exact union, in one piece that code generation handles in one loop
                need[a.tensor] = _box(footprint)
    return need, runs, origins, valid


def _affine(bound: isl.PwAff) -> isl.Aff | None:
    """bound as one affine function, or None where it has several pieces."""
    pieces = bound.get_pieces()
    if len(pieces) != 1:
        return None
    return pieces[0][1]


def _loose_domain(s) -> isl.Set:
    """s's domain without the bounds of its pure loops (its reduction loops keep theirs,
    unless they depend on the pure ones: then the domain as it is)."""
    loose = s.domain
    for k, name in enumerate(s.iterators):
        if name not in s.reduction_vars:
            loose = loose.drop_constraints_involving_dims(isl.dim_type.set, k, 1)
    return loose if _reductions_bounded(loose, s) else s.domain


def _reductions_bounded(loose: isl.Set, s) -> bool:
    pure = [k for k, name in enumerate(s.iterators) if name not in s.reduction_vars]
    rest = loose
    for k in reversed(pure):
        rest = rest.project_out(isl.dim_type.set, k, 1)
    return rest.is_bounded()


def _loose(relation: isl.Map) -> isl.Map:
    """An access relation without its constraints on the instances alone (the domain's
    bounds): those that tie the element to the instance stay. (Not isl's gist: with a domain
    of one row, it turns `a0 = y` into `a0 = 0`.) With local variables (a floor), the relation
    as it is."""
    n = relation.dim(isl.dim_type.out)
    out = None
    for piece in relation.get_basic_maps():
        if piece.dim(isl.dim_type.div):
            return relation
        kept = isl.BasicMap.universe(piece.get_space())
        for c in piece.get_constraints():
            if c.involves_dims(isl.dim_type.out, 0, n):
                kept = kept.add_constraint(c)
        kept = isl.Map.from_basic_map(kept)
        out = kept if out is None else out.union(kept)
    return out if out is not None else relation


def _box(footprint: isl.Map) -> isl.Map:
    """{tile -> element} of the smallest box, per tile, holding footprint's elements there."""
    if not footprint.dim(isl.dim_type.out):
        return footprint  # (a scalar)
    box = None
    for k in range(footprint.dim(isl.dim_type.out)):
        between = isl.Map.from_pw_aff(footprint.dim_min(k)).apply_range(
            isl.Map("{ [lo] -> [e] : e >= lo }")).intersect(
            isl.Map.from_pw_aff(footprint.dim_max(k)).apply_range(
                isl.Map("{ [hi] -> [e] : e <= hi }")))
        box = between if box is None else box.flat_range_product(between)
    return box.set_tuple_name(isl.dim_type.out, footprint.get_tuple_name(isl.dim_type.out))


def _names(tensors) -> str:
    """Some names, for a message: the first few, sorted."""
    names = sorted(tensors)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _fresh(prefix: str, n: int, taken: set[str]) -> list[str]:
    out, k = [], 0
    while len(out) < n:
        name = f"{prefix}{k}"
        if name not in taken:
            out.append(name)
        k += 1
    return out
