"""Mapping a (tiled) schedule tree to CUDA blocks and threads (paper, Section 5.4), with the
`__syncthreads()` and the unrolling the mapping calls for.

The mapping is written into the tree the way the paper's Figure 3.e shows it: block and thread
indices are isl parameters (`b0, b1, b2` for `blockIdx.x, .y, .z`, `t0, t1, t2` for
`threadIdx`), and a filter node above a mapped band keeps the instances whose member value
`v` satisfies `v mod size = id`. isl's AST generator then turns the band's loop into a strided
loop starting at the id, or into no loop at all when the size covers the range.

Blocks: the leading members of the outermost band (the tile band after tiling) that no
dependence crosses, `blockIdx.x` on the first. Blocks cannot synchronise with each other, so a
member is mapped only if every dependence keeps its value. Where the statements form groups with
no dependence between them, so that no band encloses them all (the paper's 2LUT), each group's
outermost band is mapped the same way onto one shared grid.

Threads: in each branch of the tree, the innermost band with a member that can be split across
threads, `threadIdx.x` on its innermost such member (the paper's rule). A member can be mapped if
no dependence between two instances of the band's subtree that run in the same block (equal
block-mapped values) changes its value: reductions stay sequential per thread, and no
synchronisation is needed inside a mapped band. Every branch uses the same thread dimensions;
statements under no mapped band run on thread (0, 0, 0).

Synchronisation: a sequence above mapped bands gets `__syncthreads()` after a child when a
dependence goes from it to a later child between two different threads, and, when it sits
inside a loop with such a dependence among its children, at the end of every iteration in which
any child runs (the next iteration may read what this one wrote; a barrier ending the last
child runs only where that child does). A set's children run in any order and depend on each
other only across iterations: it gets the end-of-iteration barrier alone. All threads of a
block reach these barriers: only loops and sequences that do not depend on the thread ids lie
above them.

Sizes are tightened to what the iteration space needs: a dimension with 10 tiles gets 10 blocks,
not 64; a member with 26 values gets 26 threads, not 32. A loop whose range grows with a dynamic
size (a size the compiler leaves free) gets the number asked for, and the launch computes the
grid for the call's sizes (`launch_grid`), so no size of the kernel depends on a dynamic one.

Register tiling (`useRegisterTiling`): in a thread-mapped band that is permutable and not
mapped to blocks, the members threads do not split (a reduction) move outermost, so that each
thread runs one reduction step over all its points before the next.

Parallel reductions (`parallelReductions`; poly/reduction.py): where a band's free members
give no thread (unset, the default) or less than a warp of the threads asked for (at least 32;
`parallelReductions(True)`), and no band around it would give that many either, its innermost
loop of a `+`, `*`, `min` or `max` reduction
with more values than those threads goes to threadIdx.x instead, on a power of two of
threads (at most those asked for, at least a warp). The loops before it become a band of their
own above it (the reduced element must be a function of the loops around the thread band, so
that each thread keeps one accumulator per element); the loops after it stay sequential in
each thread. Marks `reduce<k>` become, once the tree is complete, two extension statements
around the thread band, `_rinit<k>` (each thread's accumulator set to the identity) and
`_rcomb<k>` (warp shuffles, then shared memory, then thread 0 combines into the element);
every thread of the block runs both, since only loops that do not depend on the thread ids lie
above them. blockDim.x becomes a multiple of 32, so that every warp is whole.

Unrolling (`unroll(n)`): from the innermost loops outwards, a loop is unrolled while the product
of the unrolled trip counts along any path stays at most n.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import attrs
import islpy as isl

from tcstage.options import MAX_THREADS_PER_BLOCK, MappingOptions
from tcstage.poly.notes import OptionNote, call
from tcstage.poly.reduction import Reduction, element_of_prefix, relaxed_dependences
from tcstage.poly.schedule import (UNBOUNDED, keeps_value, member_map, node_at,
                                   outermost_bands, path_of, value_count)

BLOCK_IDS = ("b0", "b1", "b2")  # blockIdx.x, .y, .z
THREAD_IDS = ("t0", "t1", "t2")  # threadIdx.x, .y, .z
SYNC = "_sync"  # the extension statement that prints as __syncthreads()
WARP = 32
# Fewer blocks than this leave SMs idle (132 on an H100 or H200): only then does an unset
# parallelReductions split a reduction across blocks too
FEW_BLOCKS = 128
REDUCE = "reduce"  # mark above a reduction's thread band, until its init and combine are grafted
REDUCTION_INIT, REDUCTION_COMBINE = "_rinit", "_rcomb"  # extension statements, + the band's k
# Marks left for memory promotion: KERNEL + n sits below each block-mapped band (where a block's
# work on one tile begins; its first n members are on blocks), THREADS + k above each thread
# filter (k: the band member on threadIdx.x).
KERNEL = "kernel"
THREADS = "threads_x"

_T = isl.schedule_node_type


@attrs.frozen
class Mapped:
    schedule: isl.Schedule  # with mapping filters, barriers and unroll marks
    context: isl.Set  # the sizes and the ranges of the block and thread ids
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    block_bands: int  # bands mapped to blocks (several for independent groups of statements)
    thread_bands: int  # bands mapped to threads
    syncs: int  # barriers inserted
    unrolled: int  # loops marked for unrolling
    notes: tuple[OptionNote, ...] = ()  # thread or block sizes that no loop could use
    # For explaining the mapping (poly/explain.py). Loops are band members as relations,
    # instance -> value (schedule.member_map), united over the bands mapped alike.
    block_loops: tuple[isl.UnionMap, ...] = ()  # the loop on blockIdx.x, .y, .z (dims used)
    thread_loops: tuple[isl.UnionMap, ...] = ()  # the loop on threadIdx.x, .y, .z (dims used)
    # per barrier: ("after", statements of the child it follows: a later child depends on
    # them across threads) or ("iteration", statements of the sequence it ends, in a loop)
    barriers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unrolled_loops: tuple[tuple[isl.UnionMap, int], ...] = ()  # with their trips per thread
    # the loops where unrolling stopped: (loop, trips per thread, copies of the body already)
    unroll_stops: tuple[tuple[isl.UnionMap, int, int], ...] = ()
    # per block-mapped band, per grid dimension: (its loop, the n of its filter `v mod n = b`),
    # from which launch_grid finds the blocks with work at a call's dynamic sizes
    block_filters: tuple[tuple[tuple[isl.UnionMap, int], ...], ...] = ()
    reductions: tuple["ParallelReduction", ...] = ()  # reductions split across threads


@attrs.frozen
class ParallelReduction:
    """One statement reduced across the threads of a block: under thread band `band` (the k of
    its `_rinit<k>` / `_rcomb<k>` statements), whose `threads` x-threads each combine a share
    into an accumulator; `element` gives the reduced element from the values of the loops
    around the band (the extension statements' arguments)."""

    band: int
    reduction: Reduction
    threads: int
    element: isl.PwMultiAff  # [loop values around the band] -> tensor[element]
    across: tuple[int, int] | None = None  # (grid dimension d, blocks G) also splitting it


@attrs.frozen
class _ThreadBand:
    members: tuple[int, ...]  # band members, the one on threadIdx.x first
    sizes: tuple[int, ...]  # threads along each
    reductions: tuple[str, ...] = ()  # a parallel reduction's statements (members: its loop)
    count: int = 0  # a parallel reduction's loop: its values
    spreads: bool = False  # whether its blocks could split it too (see _ThreadDecisions.block)
    across: tuple[int, int] | None = None  # (grid dimension, blocks) splitting it, if any


def map_to_gpu(schedule: isl.Schedule, dependences: isl.UnionMap, context: isl.Set,
               options: MappingOptions, scop=None,
               reductions: dict[str, Reduction] | None = None,
               whole_warps: bool = False) -> Mapped:
    """The schedule mapped to blocks and threads as `options` ask (sizes fixed in `context`);
    `reductions` (poly/reduction.py, statements of `scop`) may be split across threads;
    `whole_warps` makes blockDim.x a multiple of 32 (for tensor cores' warp instructions)."""
    schedule = schedule.intersect_domain(schedule.get_domain().intersect_params(context))
    schedule, blocks = _map_blocks(schedule, dependences, options.blocks)
    splittable = reductions if options.parallel_reductions is not False and scop is not None \
        else {}
    decide = _ThreadDecisions(dependences, blocks, options.threads, scop, splittable or {},
                              forced=options.parallel_reductions is True)
    if splittable and math.prod(options.threads) >= WARP:
        schedule = _distribute_reductions(schedule.get_root(), (), decide).get_schedule()
    n_threads = decide.visit(schedule.get_root(), ())
    grid = list(blocks.grid)
    block = decide.block(grid, options.blocks)
    rounded = -(-block[0] // WARP) * WARP  # (threads past a band's size have no work)
    # (only where some band went to threads: with none, no statement has a thread filter, and
    # every thread of a rounded-up block would run all of them; tensor cores need one anyway)
    if whole_warps and n_threads and rounded * block[1] * block[2] <= MAX_THREADS_PER_BLOCK:
        block[0] = rounded
    insert = _Insert(decide, decide.cross_thread(schedule.get_domain(), n_threads), n_threads,
                     options.unroll_factor, options.use_register_tiling)
    node = insert.visit(schedule.get_root(), (), under_threads=False, in_loop=False)[0]
    node = _pin_to_first_block(node, decide)
    node, parallel = _graft_reductions(node, scop, decide.reductions, insert.reductions)
    grid = tuple(grid)
    ids = [f"0 <= {b} < {g}" for b, g in zip(BLOCK_IDS, grid)]
    ids += [f"0 <= {t} < {s}" for t, s in zip(THREAD_IDS, block)]
    ranges = isl.Set(f"[{', '.join(BLOCK_IDS + THREAD_IDS)}] -> {{ : {' and '.join(ids)} }}")
    split = sorted({decide.reductions[n].tensor for b in decide.bands.values()
                    for n in b.reductions})
    if split and any(size > 1 and block[d] == 1 for d, size in enumerate(options.threads)):
        unused = [f"threadIdx.{'xyz'[d]}" for d, size in enumerate(options.threads)
                  if size > 1 and block[d] == 1]
        notes = (OptionNote(call("mapToThreads", options.threads), (
            f"threadIdx.x went to the loop of the reduction into {', '.join(split)}, split across "
            f"the "
            f"block's threads (parallelReductions), which uses threadIdx.x alone, so "
            f"{' and '.join(unused)} {'stay' if len(unused) > 1 else 'stays'} 1; "
            "parallelReductions(False) keeps reductions sequential and gives the threads to "
            "the loops free of dependences")),)
    else:
        notes = _unused_dimensions("mapToThreads", options.threads, block, "threadIdx",
                                   "split across threads (not one that carries a dependence, "
                                   "such as a reduction, takes a single value, or goes to "
                                   "blocks)")
    single = [d for d, size in enumerate(options.blocks) if size > 1 and grid[d] == 1]
    if single:
        notes += (OptionNote(call("mapToBlocks", options.blocks), "; ".join(
            f"blockIdx.{'xyz'[d]} stays 1: "
            f"{blocks.why.get(d, 'no loop goes to it')}" for d in single)),)
    return Mapped(node.get_schedule(), context.intersect_params(ranges).params(),
                  grid, tuple(block), len(blocks.bands), len(decide.bands), insert.syncs,
                  insert.unrolled, notes, blocks.loops, _united(decide.loops),
                  tuple(insert.barriers), tuple(insert.unrolled_loops), tuple(insert.stops),
                  blocks.filters, parallel)


def _united(per_band: list[list[isl.UnionMap]]) -> tuple[isl.UnionMap, ...]:
    """Per dimension, the union of each band's loop on it."""
    out: list[isl.UnionMap] = []
    for loops in filter(None, per_band):  # (None: a band given up)
        for d, loop in enumerate(loops):
            if d == len(out):
                out.append(loop)
            else:
                out[d] = out[d].union(loop)
    return tuple(out)


def _unused_dimensions(option: str, wanted: Sequence[int], got: Sequence[int], ids: str,
                       how: str) -> tuple[OptionNote, ...]:
    """A note when sizes above 1 were asked for dimensions that no loop went to."""
    unused = [f"{ids}.{'xyz'[d]}" for d, size in enumerate(wanted) if size > 1 and got[d] == 1]
    if not unused:
        return ()
    used = sum(1 for g in got if g > 1)
    can = f"only {used} loop{'s' if used != 1 else ''} can" if used else "no loop can"
    return (OptionNote(call(option, wanted),
                       f"{can} be {how}, so "
                       f"{' and '.join(unused)} {'stay' if len(unused) > 1 else 'stays'} 1"),)


# -- blocks ----------------------------------------------------------------------------------------

@attrs.frozen
class _Blocks:
    bands: dict  # tree path of each block-mapped band -> {member: blocks along it}
    grid: tuple[int, int, int]
    values: isl.UnionMap | None  # instance -> its block-mapped member values
    loops: tuple[isl.UnionMap, ...] = ()  # per grid dimension used, its loop (all bands)
    filters: tuple = ()  # Mapped.block_filters
    why: dict = attrs.field(factory=dict)  # grid dimension -> why it has a single block


def _block_bands(schedule, deps) -> tuple[list[isl.ScheduleNode], bool]:
    """The bands whose members may go to blocks: the outermost band, or, where the statements
    fall into several groups (the paper's 2LUT; a softmax whose normalisation the scheduler
    left in loops of its own), the outermost band of each group, all sharing the grid; and
    whether dependences connect the groups (then only members that every dependence between
    them keeps, member by member across the bands, go to blocks: blocks cannot wait for each
    other, but a dependence that stays within a block is ordered by a barrier)."""
    bands = outermost_bands(schedule)
    if not bands or not functools.reduce(isl.UnionSet.union, [b.get_domain() for b in bands]) \
            .is_equal(schedule.get_domain()):
        return [], False  # statements outside every band would run in every block
    if len(bands) > 1:
        domains = [b.get_domain() for b in bands]
        for i, source in enumerate(domains):
            for j, sink in enumerate(domains):
                if i != j and not deps.intersect_domain(source).intersect_range(sink).is_empty():
                    return bands, True
    return bands, False


def _map_blocks(schedule, deps, blocks: Sequence[int]) -> tuple[isl.Schedule, _Blocks]:
    """Filters the leading dependence-free members of the block bands onto the grid."""
    chosen = {}
    bands, connected = _block_bands(schedule, deps)
    # Size k goes to member k, as in TC, also where that loop has a single value (one tile):
    # `mapToBlocks(1, 8)` on tmm at M = 32 with `tile(32, 8)` is one block along m and 8
    # along n, not 1 along n (the sizes once shifted past single-valued loops)
    # why a dimension asked for more than one block got one (the OptionNote's text)
    why: dict[int, str] = {}
    ordinal = ("first", "second", "third")
    if not bands:
        why = {d: "a dependence crosses every loop around all the statements, so no loop can "
                  "go to blocks (blocks cannot synchronise)" for d in range(len(blocks))}

    def stopped(k: int, n_members: int) -> None:
        for d in range(k, len(blocks)):
            why[d] = (f"the outer band's {ordinal[k]} loop carries a dependence (blocks cannot "
                      "synchronise)") if k < n_members else \
                f"the outer band has {n_members} loop{'s' if n_members != 1 else ''}"

    if connected:  # one mapping for all: member k of every band, as one loop
        members = []
        n_members = min(b.band_n_member() for b in bands)
        for k in range(min(n_members, len(blocks))):
            member = functools.reduce(isl.UnionMap.union, [member_map(b, k) for b in bands])
            if not keeps_value(deps, None, member):
                break
            count = max(value_count(member_map(b, k)) for b in bands)
            members.append((k, min(blocks[k], count)))
        stopped(len(members), n_members)
        # (none: one block runs them all, one kernel scope above them, as for one band)
        chosen = {path_of(b): members for b in bands} if members else {}
    for band in bands if not connected else ():
        members = []
        for k in range(min(band.band_n_member(), len(blocks))):
            member = member_map(band, k)
            if not keeps_value(deps, None, member):
                break
            members.append((k, min(blocks[k], value_count(member))))
        stopped(len(members), band.band_n_member())
        chosen[path_of(band)] = members
    for members in chosen.values():
        for d, (k, size) in enumerate(members):
            if size == 1:
                why.setdefault(d, f"its loop, the outer band's {ordinal[k]}, has a single value "
                                  "at these sizes (one tile)")
    grid = [1, 1, 1]
    for members in chosen.values():
        for d, (_, size) in enumerate(members):
            grid[d] = max(grid[d], size)
    # the ids up to the last dimension with more than one block (mapToBlocks(1, 2) uses b1
    # while b0 stays 0): a band pins every id it does not map to 0, or it ran in every block
    n_dims = max((d + 1 for d, g in enumerate(grid) if g > 1), default=0)
    if not n_dims:  # one block: its work on one tile still begins below each tile band
        for path in chosen or [()]:
            schedule = node_at(schedule, path).child(0).insert_mark(isl.Id(KERNEL)).get_schedule()
        return schedule, _Blocks({}, (1, 1, 1), None, why=why)
    bands, values, per_band = {}, None, []
    for path, members in chosen.items():  # inserting in one branch leaves the others' paths
        band = node_at(schedule, path)
        # the loops as written, before the filter pins them to the block ids
        per_band.append([member_map(band, k) for k, _ in members])
        filter_ = band.get_domain()
        for d, (k, size) in enumerate(members):
            filter_ = filter_.intersect(_modulo_filter(band, k, size, BLOCK_IDS[d]))
        zero = [f"{b} = 0" for b in BLOCK_IDS[len(members):n_dims]] or ["true"]
        filter_ = filter_.intersect_params(
            isl.Set(f"[{', '.join(BLOCK_IDS[:n_dims])}] -> {{ : {' and '.join(zero)} }}"))
        band = band.insert_filter(filter_).child(0)
        # the mark's name counts the leading members that blocks take (promotion stays below)
        blocked = max(k for k, _ in members) + 1 if members else 0
        band = band.child(0).insert_mark(isl.Id(f"{KERNEL}{blocked}")).parent()
        schedule = band.get_schedule()
        bands[path_of(band)] = dict(members)
        own = None
        for k, _ in members:
            part = member_map(band, k)
            own = part if own is None else own.flat_range_product(part)
        if own is not None:
            values = own if values is None else values.union(own)
    filters = tuple(tuple(zip(loops, (size for _, size in members)))
                    for loops, members in zip(per_band, chosen.values()))
    return schedule, _Blocks(bands, tuple(grid), values, _united(per_band), filters, why)


# -- threads: deciding -------------------------------------------------------------------------

class _ThreadDecisions:
    """Which band of each branch goes to threads; keyed by tree path (child indices)."""

    def __init__(self, deps, blocks: _Blocks, threads: Sequence[int], scop=None,
                 reductions: dict[str, Reduction] | None = None, forced: bool = False):
        self.deps, self.blocks, self.threads = deps, blocks, tuple(threads)
        # a reduction may take the threads where the free loops give fewer than this: a warp
        # with parallelReductions(True), else only where they take none (TC's kernel otherwise)
        self.room = WARP if forced else 2
        self.forced = forced
        self.scop, self.reductions = scop, reductions or {}
        self.relaxed = relaxed_dependences(deps, scop, self.reductions) if self.reductions \
            else deps
        self.reduction_ids: dict[tuple[int, ...], tuple[int, isl.UnionPwAff]] = {}
        self.bands: dict[tuple[int, ...], _ThreadBand] = {}
        self.mapped_below: dict[tuple[int, ...], int] = {}
        self.thread_ids: list[tuple[isl.UnionSet, list[isl.UnionPwAff]]] = []
        self.loops: list[list[isl.UnionMap]] = []  # per thread band, its loop on each dimension
        self._counts: dict[tuple[tuple[int, ...], int], int] = {}

    def count(self, node: isl.ScheduleNode, path: tuple[int, ...], k: int) -> int:
        """How many values member k of the band at path takes (filters and marks added while
        inserting do not change it, so deciding and inserting share one computation)."""
        key = (path, k)
        if key not in self._counts:
            self._counts[key] = value_count(member_map(node, k))
        return self._counts[key]

    def renumber(self, path: tuple[int, ...], order: Sequence[int]) -> None:
        """The band at path now has member order[k] at position k."""
        counts = {k: self._counts[(path, k)] for k in order if (path, k) in self._counts}
        for new, old in enumerate(order):
            if old in counts:
                self._counts[(path, new)] = counts[old]

    def visit(self, node: isl.ScheduleNode, path: tuple[int, ...]) -> int:
        below = max((self.visit(node.child(i), path + (i,)) for i in range(node.n_children())),
                    default=0)
        self.mapped_below[path] = below
        if below or node.get_type() != _T.band:
            return below
        band = self.choose(node, path, self.blocks.bands.get(path, {}))
        if band is None:
            return 0
        self.bands[path] = band
        return len(band.members)

    def block(self, grid: list[int], blocks_asked: Sequence[int]) -> list[int]:
        """blockDim: per dimension, the most threads a band uses. With parallel reductions,
        x is a whole number of warps (threads past a band's own size have no work in it), and
        reductions give up threads where the other dimensions leave too few.

        One parallel reduction whose loop has more values than its threads may also be split
        across blocks, on the first grid dimension the block bands leave to it where
        mapToBlocks asks for blocks there (grid is updated): each block's share then goes to
        a scratch slot, and the last block to finish combines the slots in block order (so
        the result does not depend on which block finishes when). Only where nothing else in
        the kernel reads the reduced tensor, each element is reduced under one value of the
        loops around the band, and no size is dynamic."""
        block = [1, 1, 1]
        for band in self.bands.values():
            if not band.reductions:
                for d, size in enumerate(band.sizes):
                    block[d] = max(block[d], size)
        reducing = {p: b for p, b in self.bands.items() if b.reductions}
        if not reducing:
            return block
        room = 1 << (MAX_THREADS_PER_BLOCK // (block[1] * block[2])).bit_length() - 1
        x = block[0]
        for path, band in reducing.items():
            band = attrs.evolve(band, sizes=(min(band.sizes[0], room),))
            self.bands[path] = band
            index, loop = self.reduction_ids[path]  # (the ids the barriers are placed by)
            self.thread_ids[index] = (self.thread_ids[index][0],
                                      [loop.mod_val(isl.Val(band.sizes[0]))])
            x = max(x, band.sizes[0])
        x = -(-x // WARP) * WARP
        if room < WARP or x * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
            # (y and z leave no room for whole warps: the reductions stay sequential)
            for path in reducing:
                del self.bands[path]
                index, _ = self.reduction_ids.pop(path)
                self.thread_ids[index] = self.loops[index] = None
            return block
        block[0] = x
        # (past every dimension a loop is on, a loop of a single tile included: blockIdx.y
        # of TC's moments2_2D_1D tile(1, 4608) at K=4608 holds r_k's only tile)
        d = max([len(self.blocks.loops)] + [i + 1 for i, g in enumerate(grid) if g > 1])
        # Left unset, parallelReductions splits across blocks only where the parallel loops'
        # blocks are too few to fill a GPU (a row sum of 32 rows: 4x faster on an H200 split
        # 32 ways); TC's Sum_2D_1D options ask 72 blocks more per row of 1024 rows, for nothing
        few = self.forced or math.prod(grid) < FEW_BLOCKS
        for path, band in self.bands.items():
            if few and band.reductions and band.spreads and d < len(blocks_asked) \
                    and blocks_asked[d] > 1 and band.count > band.sizes[0]:
                across = min(blocks_asked[d], -(-band.count // band.sizes[0]))
                self.bands[path] = attrs.evolve(band, across=(d, across))
                grid[d] = across
                break
        return block

    def free_members(self, node, path, on_blocks) -> tuple[list[int], list[int]]:
        """The band's members threads may split (innermost first) and their thread counts."""
        domain = node.get_domain()
        deps = self.deps.intersect_domain(domain).intersect_range(domain)
        block_map = self.blocks.values.intersect_domain(domain) if self.blocks.values else None
        if block_map is not None and block_map.is_empty():
            block_map = None  # a group of statements that runs in block 0 only
        members, sizes = [], []
        for k in reversed(range(node.band_n_member())):
            if k in on_blocks:
                continue
            count = self.count(node, path, k)
            if count <= 1 or not keeps_value(deps, block_map, member_map(node, k)):
                continue
            members.append(k)
            sizes.append(min(self.threads[len(sizes)], count))
            if len(members) == len(self.threads):
                break
        return members, sizes

    def outer_threads(self, node, path) -> int:
        """The most threads a band around node could give by its free loops (the paper's
        rule maps the innermost band with some; a reduction below must not take their place
        where they would fill a warp)."""
        best = 1
        while path:
            node, path = node.parent(), path[:-1]
            if node.get_type() == _T.band:
                _, sizes = self.free_members(node, path, self.blocks.bands.get(path, {}))
                best = max(best, math.prod(sizes))
        return best

    def choose(self, node: isl.ScheduleNode, path: tuple[int, ...], on_blocks: Sequence[int]
               ) -> _ThreadBand | None:
        domain = node.get_domain()
        block_map = self.blocks.values.intersect_domain(domain) if self.blocks.values else None
        if block_map is not None and block_map.is_empty():
            block_map = None  # a group of statements that runs in block 0 only
        members, sizes = self.free_members(node, path, on_blocks)
        wanted = math.prod(self.threads)
        if self.reductions and wanted >= WARP and math.prod(sizes) < self.room \
                and self.outer_threads(node, path) < min(self.room, wanted):
            band = self._reduction(node, path, on_blocks, domain, block_map)
            # (only where the reduction has more values for the threads than the free loops)
            if band is not None and band.count > math.prod(sizes):
                return band
            if band is not None:
                self.thread_ids.pop()
                self.loops.pop()
                del self.reduction_ids[path]
        if math.prod(sizes) <= 1:
            return None
        partial = node.band_get_partial_schedule()
        self.thread_ids.append((domain, [partial.get_union_pw_aff(k).mod_val(isl.Val(size))
                                         for k, size in zip(members, sizes)]))
        self.loops.append([member_map(node, k) for k in members])
        return _ThreadBand(tuple(members), tuple(sizes))

    def _reduction(self, node, path, on_blocks, domain, block_map, probe: bool = False
                   ) -> _ThreadBand | None:
        """The band's innermost reduction loop on threadIdx.x, if it can be one: a loop that
        only the splittable reductions' dependences keep from the threads, after every
        block-mapped member, with each reduction's element fixed by the loops before it."""
        names = [n for n in self.reductions
                 if not domain.extract_set(self.scop_space(n)).is_empty()]
        if not names:
            return None
        relaxed = self.relaxed.intersect_domain(domain).intersect_range(domain)
        for k in reversed(range(node.band_n_member())):
            if k in on_blocks or any(b > k for b in on_blocks):
                continue
            count = self.count(node, path, k)
            if count <= 1 or count == UNBOUNDED or \
                    not keeps_value(relaxed, block_map, member_map(node, k)):
                continue
            outer = node.get_prefix_schedule_union_map().intersect_domain(domain)
            for j in range(k):
                outer = outer.flat_range_product(member_map(node, j))
            if any(element_of_prefix(outer, self.scop, n) is None for n in names):
                continue
            if self._waits_for_total(names, relaxed, outer):
                continue
            if probe:
                return _ThreadBand((k,), (0,), tuple(sorted(names)))
            asked = 1 << min(math.prod(self.threads), MAX_THREADS_PER_BLOCK).bit_length() - 1
            threads = min(asked, max(WARP, 1 << (int(count) - 1).bit_length()))
            loop = node.band_get_partial_schedule().get_union_pw_aff(k)
            self.reduction_ids[path] = (len(self.thread_ids), loop)
            self.thread_ids.append((domain, [loop.mod_val(isl.Val(threads))]))
            self.loops.append([member_map(node, k)])
            return _ThreadBand((k,), (threads,), tuple(sorted(names)), int(count),
                               self._spreads(names, outer, domain))
        return None

    def _waits_for_total(self, names, relaxed: isl.UnionMap, outer: isl.UnionMap) -> bool:
        """Whether another statement of the band depends on one of these reductions under the
        same values of the loops around the reduction loop. Split, a reduction's updates reach
        its tensor only at the combine after the loop, which such a statement runs before. The
        loop keeps the value of these dependences where the reduction has a single value of
        it (seed 20104: `O() +=! C(l, l) where l in 0:1` then a second `O() +=! ...`,
        whose identity overwrote O in the same loop's value 0 before the first total came)."""
        same_outer = outer.apply_range(outer.reverse())
        for name in names:
            own = isl.UnionSet.from_set(self.statement_domain(name))
            others = outer.domain().subtract(own)
            if not relaxed.intersect_domain(own).intersect_range(others) \
                    .intersect(same_outer).is_empty():
                return True
        return False

    def _spreads(self, names, outer: isl.UnionMap, domain: isl.UnionSet) -> bool:
        """Whether blocks may split these reductions too (blocks cannot wait for each other):
        every size is fixed (a dynamic grid is computed at launch from the block bands alone);
        no other statement reads their tensors; they read nothing the kernel computes; the
        band holds nothing else but their identities (which run in the first blocks only);
        and each element is reduced under one value of the loops around the band (the last
        block's count is per element)."""
        context = self.scop.context
        if not all(context.plain_get_val_if_fixed(isl.dim_type.param, i).is_int()
                   for i in range(context.dim(isl.dim_type.param))):
            return False
        tensors = {self.reductions[n].tensor for n in names}
        computed = {s.write.tensor for s in self.scop.statements}
        for s in self.scop.statements:
            if domain.extract_set(s.domain.get_space()).is_empty():
                continue
            if s.name not in names and (s.write.tensor not in tensors
                                        or any(a.tensor in tensors for a in s.reads)):
                return False
        for name in names:
            tensor = self.reductions[name].tensor
            statement = next(s for s in self.scop.statements if s.name == name)
            if any(a.tensor in computed and a.tensor != tensor for a in statement.reads):
                return False
            if any(s.name != name and any(a.tensor == tensor for a in s.reads)
                   for s in self.scop.statements):
                return False
            element = element_of_prefix(outer, self.scop, name)
            if element is None or not isl.Map.from_pw_multi_aff(element).is_injective():
                return False
        return True

    def visit_bands_below(self, node: isl.ScheduleNode) -> bool:
        """Whether a band lies below node."""
        return any(_has_band(node.child(i)) for i in range(node.n_children()))

    def distribution_point(self, node, path) -> tuple[int, list[isl.UnionSet]] | None:
        """Where _distribute_reductions splits the band at path: the reduction loop that
        would go to threads if the statements after the reductions were in loops of their
        own, when they are what keeps it from the threads and distributing is legal."""
        child = node.child(0)
        while child.get_type() == _T.mark:
            child = child.child(0)
        if child.get_type() not in (_T.sequence, _T.set):
            return None
        domain = node.get_domain()
        on_blocks = self.blocks.bands.get(path, {})
        block_map = self.blocks.values.intersect_domain(domain) if self.blocks.values else None
        if block_map is not None and block_map.is_empty():
            block_map = None
        deps = self.deps.intersect_domain(domain).intersect_range(domain)
        free = [self.count(node, path, k) for k in range(node.band_n_member())
                if k not in on_blocks and self.count(node, path, k) > 1
                and keeps_value(deps, block_map, member_map(node, k))]
        if math.prod(min(f, t) for f, t in zip(free, self.threads)) >= self.room:
            return None
        if self._reduction(node, path, on_blocks, domain, block_map, probe=True) is not None:
            return None  # (the reductions go to threads as they are)
        # (a filter's own domain is what reaches it: its child's is what it lets through)
        parts = [child.child(i).child(0).get_domain() for i in range(child.n_children())]
        reducing = [i for i, part in enumerate(parts)
                    if any(not part.extract_set(self.scop_space(n)).is_empty()
                           for n in self.reductions)]
        if not reducing:
            return None
        for k in reversed(range(node.band_n_member())):
            if k in on_blocks or any(b > k for b in on_blocks) or self.count(node, path, k) <= 1:
                continue
            outer = node.get_prefix_schedule_union_map().intersect_domain(domain)
            for j in range(k):
                outer = outer.flat_range_product(member_map(node, j))
            member = member_map(node, k)
            if not all(keeps_value(self.relaxed.intersect_domain(parts[i])
                                   .intersect_range(parts[i]), block_map, member)
                       for i in reducing):
                continue
            order = dependence_order(parts, deps, outer)
            return None if order is None else (k, order)
        return None

    def scop_space(self, statement: str) -> isl.Space:
        return next(s.domain.get_space() for s in self.scop.statements if s.name == statement)

    def statement_domain(self, statement: str) -> isl.Set:
        return next(s.domain for s in self.scop.statements if s.name == statement)

    def cross_thread(self, domain: isl.UnionSet, n_threads: int) -> isl.UnionMap:
        """The dependences whose two ends run on different threads of a block."""
        if not n_threads:
            return isl.UnionMap.empty(self.deps.get_space())
        ids, mapped = None, None
        for band_domain, values in filter(None, self.thread_ids):  # (None: a band given up)
            own = None
            for d in range(n_threads):
                part = isl.UnionMap.from_union_pw_aff(values[d]).intersect_domain(band_domain) \
                    if d < len(values) else _constant(band_domain, 0)
                own = part if own is None else own.flat_range_product(part)
            ids = own if ids is None else ids.union(own)
            mapped = band_domain if mapped is None else mapped.union(band_domain)
        if mapped is None:  # (every band given up: all on thread 0)
            return isl.UnionMap.empty(self.deps.get_space())
        rest = domain.subtract(mapped)  # statements on thread (0, 0, 0)
        zeros = _constant(rest, 0)
        for _ in range(n_threads - 1):
            zeros = zeros.flat_range_product(_constant(rest, 0))
        ids = ids.union(zeros)
        # each dependence's two ends' thread ids, compared pair by pair: the relation between
        # every two instances on one thread has a piece per pair of statements (13 s for 60)
        source = self.deps.domain_map().apply_range(ids)  # [x -> y] -> ids(x)
        sink = self.deps.range_map().apply_range(ids)  # [x -> y] -> ids(y)
        return self.deps.subtract(source.intersect(sink).domain().unwrap())


# -- threads: inserting filters, barriers and unroll marks --------------------------------------

class _Insert:
    def __init__(self, decide: _ThreadDecisions, deps, n_threads: int, unroll: int,
                 register_tiling: bool):
        self.decide, self.deps, self.n_threads, self.unroll = decide, deps, n_threads, unroll
        self.register_tiling = register_tiling
        self.syncs = self.unrolled = 0
        # per reduce mark: its statements, threads and blocks (ThreadBand.across)
        self.reductions: list[tuple[tuple[str, ...], int, tuple[int, int] | None]] = []
        self.barriers: list[tuple[str, tuple[str, ...]]] = []  # Mapped.barriers
        self.unrolled_loops: list[tuple[isl.UnionMap, int]] = []
        self.stops: list[tuple[isl.UnionMap, int, int]] = []
        self.ends_with_sync: set[tuple[int, ...]] = set()  # subtrees whose last act is a barrier

    def visit(self, node, path, *, under_threads: bool, in_loop: bool):
        """Transforms the subtree at node; returns (node at the same position, unrolled copies
        along the longest path, whether every loop below is unrolled)."""
        kind = node.get_type()
        band = self.decide.bands.get(path)
        inner_loop = in_loop or (kind == _T.band and self._iterates(node, path))
        results = []
        for i in range(node.n_children()):
            child, copies, full = self.visit(node.child(i), path + (i,),
                                             under_threads=under_threads or band is not None,
                                             in_loop=inner_loop)
            node = child.parent()
            results.append((copies, full))
        copies = max((c for c, _ in results), default=1)
        full = all(f for _, f in results)
        if kind in (_T.sequence, _T.set) and not under_threads and self.n_threads \
                and self.decide.mapped_below[path]:
            node = self._barriers(node, path, in_loop)
        elif node.n_children() == 1 and path + (0,) in self.ends_with_sync:
            self.ends_with_sync.add(path)
        if kind == _T.band and band is not None and band.reductions:
            return self._reduction(node, path, band), copies, False
        if kind == _T.band:
            on_blocks = self.decide.blocks.bands.get(path, {})
            if band is not None and self.register_tiling and not on_blocks:
                node, band = self._sequential_first(node, path, band)
            node, copies, full = self._unroll(node, path, band, on_blocks, copies, full)
            if band is not None:
                node = node.insert_filter(self._thread_filter(node, band))
                node = node.insert_mark(isl.Id(f"{THREADS}{band.members[0]}"))
        if kind == _T.leaf and self.n_threads and not under_threads:
            node = node.insert_filter(node.get_domain().intersect_params(self._zero_threads(0)))
        return node, copies, full

    def _reduction(self, node, path, band: _ThreadBand):
        """A parallel reduction's band: the members before its thread loop split off above it
        (with the kernel mark of a block-mapped band, which belongs below the blocks' loops),
        then the thread filter and the marks. Returns the node at the band's position."""
        k = band.members[0]
        inner = _split(node, k) if k else node
        threads = _ThreadBand((0,), band.sizes, band.reductions)
        inner = inner.insert_filter(self._thread_filter(inner, threads))
        if band.across is not None:  # blocks take consecutive runs of threads' values
            d, n = band.across
            inner = inner.insert_filter(_modulo_filter(inner.child(0), 0, n, BLOCK_IDS[d],
                                                       every=band.sizes[0]))
        inner = inner.insert_mark(isl.Id(f"{THREADS}0"))
        inner = inner.insert_mark(isl.Id(f"{REDUCE}{len(self.reductions)}"))
        self.reductions.append((band.reductions, band.sizes[0], band.across))
        return inner.ancestor(inner.get_tree_depth() - node.get_tree_depth()) if k else inner

    def _sequential_first(self, node, path, band: _ThreadBand):
        """Register tiling: the band's members that threads do not split move outermost (a
        permutable band allows any order), so that each thread runs a reduction step over all
        its points before the next step. Returns the band and its thread members renumbered."""
        n = node.band_n_member()
        order = [k for k in range(n) if k not in band.members] + \
            [k for k in range(n) if k in band.members]
        if order == list(range(n)) or not node.band_get_permutable():
            return node, band
        partial = node.band_get_partial_schedule()
        permuted = partial
        for new, old in enumerate(order):
            permuted = permuted.set_union_pw_aff(new, partial.get_union_pw_aff(old))
        coincident = [node.band_member_get_coincident(k) for k in order]
        node = node.delete().insert_partial_schedule(permuted).band_set_permutable(True)
        for new, flag in enumerate(coincident):
            node = node.band_member_set_coincident(new, flag)
        self.decide.renumber(path, order)
        members = tuple(order.index(k) for k in band.members)
        band = _ThreadBand(members, band.sizes)
        self.decide.bands[path] = band
        return node, band

    def _iterates(self, band_node, path) -> bool:
        """Whether a band's loops may run more than once in a block (a barrier inside then
        separates iterations)."""
        grid = self.decide.blocks.bands.get(path, {})
        for k in range(band_node.band_n_member()):
            if self.decide.count(band_node, path, k) > grid.get(k, 1):
                return True
        return False

    def _thread_filter(self, node, band: _ThreadBand) -> isl.UnionSet:
        out = node.get_domain()
        for d, (k, size) in enumerate(zip(band.members, band.sizes)):
            out = out.intersect(_modulo_filter(node, k, size, THREAD_IDS[d]))
        return out.intersect_params(self._zero_threads(len(band.members)))

    def _zero_threads(self, first: int) -> isl.Set:
        ids = THREAD_IDS[:self.n_threads]
        zero = [f"{t} = 0" for t in ids[first:]] or ["true"]
        return isl.Set(f"[{', '.join(ids)}] -> {{ : {' and '.join(zero)} }}")

    def _barriers(self, node, path, in_loop: bool):
        """Barriers in a sequence (or set) above the thread-mapped bands: after a child that a
        later child depends on across threads, and at the end of each iteration of the loops
        around it where a dependence among its children crosses threads."""
        n = node.n_children()
        synced = [path + (i, 0) in self.ends_with_sync for i in range(n)]
        # (a filter's own domain is what reaches it, before it filters: take its child's)
        domains = [node.child(i).child(0).get_domain() for i in range(n)]
        after = []
        # a set's children run in any order, so a barrier between them orders nothing; nothing
        # depends across them within one iteration either (or the scheduler made a sequence)
        for i in range(n - 1 if node.get_type() == _T.sequence else 0):
            later = functools.reduce(isl.UnionSet.union, domains[i + 1:])
            if not synced[i] and \
                    not self.deps.intersect_domain(domains[i]).intersect_range(later).is_empty():
                after.append(i)
        whole = node.get_domain()
        # The last child's own barrier ends an iteration only if that child runs in every
        # iteration in which the sequence runs anything.
        ends_synced = synced[-1] and _prefix_values(node.child(n - 1).child(0)).is_equal(
            _prefix_values(node))
        at_end = in_loop and not ends_synced and \
            not self.deps.intersect_domain(whole).intersect_range(whole).is_empty()
        if in_loop and (ends_synced or at_end):
            self.ends_with_sync.add(path)
        depth = node.get_tree_depth()
        grafts = [(i, sync_graft(node.child(i).child(0))) for i in after]
        for i, graft in grafts:
            grafted = node.child(i).child(0).graft_after(graft)
            node = grafted.ancestor(grafted.get_tree_depth() - depth)
            self.syncs += 1
            self.barriers.append(("after", _statements(domains[i])))
        if at_end:  # after the whole sequence, in every iteration in which any child runs
            grafted = node.graft_after(sync_graft(node))
            node = grafted.ancestor(grafted.get_tree_depth() - depth)
            self.syncs += 1
            self.barriers.append(("iteration", _statements(whole)))
        return node

    def _unroll(self, node, path, band: _ThreadBand | None, on_blocks, copies: int, full: bool):
        if self.unroll <= 1:
            return node, copies, False
        threads = dict(zip(band.members, band.sizes)) if band else {}
        for k in reversed(range(node.band_n_member())):
            trips = _trips(self.decide.count(node, path, k), threads.get(k, 1))
            if not full or copies * trips > self.unroll or k in on_blocks:
                if full and k not in on_blocks:
                    self.stops.append((member_map(node, k), trips, copies))
                return node, copies, False
            node = node.band_member_set_ast_loop_type(k, isl.ast_loop_type.unroll)
            copies *= trips
            self.unrolled += 1
            self.unrolled_loops.append((member_map(node, k), trips))
        return node, copies, full


def dependence_order(parts: list[isl.UnionSet], deps: isl.UnionMap, outer: isl.UnionMap
                     ) -> list[isl.UnionSet] | None:
    """The groups of instances in an order that lets each group's loops run after the whole
    loops of the groups before it (loop distribution) under one value of the loops `outer`
    gives: the order of the dependences between them, the given order where none orders two;
    None where dependences go both ways. (A band's values ordered the groups before, and a
    sequence below it only broke ties.)"""
    same = outer.apply_range(outer.reverse())

    def before(i, j) -> bool:  # some instance of group j must precede one of group i
        return not deps.intersect_domain(parts[j]).intersect_range(parts[i]) \
            .intersect(same).is_empty()
    order, left = [], list(range(len(parts)))
    while left:
        ready = [i for i in left if not any(before(i, j) for j in left if j != i)]
        if not ready:
            return None
        order.append(ready[0])
        left.remove(ready[0])
    return [parts[i] for i in order]


def _distribute_reductions(node: isl.ScheduleNode, path: tuple[int, ...],
                           decide: _ThreadDecisions) -> isl.ScheduleNode:
    """Loop distribution for parallel reductions: an innermost band whose reduction loop only
    the statements after the reduction (which read its total: the rounding of a narrow
    accumulator, a normalisation) keep from the threads is split before that loop, and the
    loops from it on are distributed over the groups of statements below (a sequence node
    above copies of them, `insert_sequence`), in an order no dependence goes back against: the
    dependences' between them (the band's values ordered them before), the sequence's where
    none orders two. Returns the node at path."""
    for i in range(node.n_children()):
        node = _distribute_reductions(node.child(i), path + (i,), decide).parent()
    if node.get_type() != _T.band or decide.visit_bands_below(node):
        return node
    point = decide.distribution_point(node, path)
    if point is None:
        return node
    k, groups = point
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(groups))
    for g in groups:
        filters = filters.add(g)
    if not k:
        return node.insert_sequence(filters)
    depth = node.get_tree_depth()
    inner = _split(node, k).insert_sequence(filters)
    return inner.ancestor(inner.get_tree_depth() - depth)


def _split(band: isl.ScheduleNode, k: int) -> isl.ScheduleNode:
    """The band's members from k on as a band of their own below the others (returned); a
    kernel mark that was right below the band (a block-mapped one's) moves between the two,
    below the blocks' loops, where a block's work on one tile begins."""
    inner = band.band_split(k).child(0)
    below = inner.child(0)
    if below.get_type() == _T.mark and below.mark_get_id().get_name().startswith(KERNEL):
        mark = below.mark_get_id()
        inner = below.delete().parent().insert_mark(mark).child(0)
    return inner


def _pin_to_first_block(node: isl.ScheduleNode, decide: _ThreadDecisions) -> isl.ScheduleNode:
    """With a reduction split across blocks on grid dimension d, every other statement runs
    in the blocks with blockIdx d = 0 only (the reduction's own filter spreads its instances)."""
    for band in decide.bands.values():
        if band.across is None:
            continue
        d = band.across[0]
        root = node.root()
        domain = root.domain_get_domain()
        spread = functools.reduce(isl.UnionSet.union, [
            isl.UnionSet.from_set(s.domain) for s in decide.scop.statements
            if s.name in band.reductions])
        first = isl.Set(f"[{BLOCK_IDS[d]}] -> {{ : {BLOCK_IDS[d]} = 0 }}")
        keep = domain.intersect(spread).union(domain.subtract(spread).intersect_params(first))
        return root.child(0).insert_filter(keep).root()
    return node


def _graft_reductions(node: isl.ScheduleNode, scop, reductions: dict[str, Reduction],
                      bands: list[tuple[tuple[str, ...], int, tuple[int, int] | None]]
                      ) -> tuple[isl.ScheduleNode, tuple[ParallelReduction, ...]]:
    """Each `reduce<k>` mark replaced by the reduction's init before its subtree and combine
    after it, once per value of the loops around it (then every thread runs them)."""
    out = []
    while True:
        found = _find_mark(node.root(), REDUCE)
        if found is None:
            return node.root(), tuple(out)
        k = int(found.mark_get_id().get_name()[len(REDUCE):])
        prefix = found.get_prefix_schedule_union_map().intersect_domain(found.get_domain())
        names, threads, across = bands[k]
        for name in names:
            out.append(ParallelReduction(k, reductions[name], threads,
                                         element_of_prefix(prefix, scop, name), across))
        values = prefix.range()
        found = found.graft_before(instances(values, f"{REDUCTION_INIT}{k}"))  # (still the mark)
        found = found.graft_after(instances(values, f"{REDUCTION_COMBINE}{k}"))
        node = found.delete()


def _has_band(node: isl.ScheduleNode) -> bool:
    return node.get_type() == _T.band or \
        any(_has_band(node.child(i)) for i in range(node.n_children()))


def _find_mark(node: isl.ScheduleNode, prefix: str) -> isl.ScheduleNode | None:
    if node.get_type() == _T.mark and node.mark_get_id().get_name().startswith(prefix):
        return node
    for i in range(node.n_children()):
        found = _find_mark(node.child(i), prefix)
        if found is not None:
            return found
    return None


def instances(values: isl.UnionSet, name: str) -> isl.ScheduleNode:
    """An extension adding statement `name[v]` at each value v of the loops around a node."""
    sets: list[isl.Set] = []
    values.foreach_set(sets.append)
    extension = None
    for s in sets or [isl.Set("{ [] }")]:
        m = isl.Map.identity(s.get_space().map_from_set()).intersect_domain(s) \
            .set_tuple_name(isl.dim_type.out, name)
        part = isl.UnionMap.from_map(m)
        extension = part if extension is None else extension.union(part)
    return isl.ScheduleNode.from_extension(extension)


def sync_graft(node: isl.ScheduleNode, tag: int | None = None) -> isl.ScheduleNode:
    """An extension adding one barrier at node, per iteration of the loops around it; a tag
    tells apart barriers grafted into one sequence (isl filters them by statement name)."""
    prefix = node.get_prefix_schedule_union_map().intersect_domain(node.get_domain()).range()
    sync = isl.Set(f"{{ {SYNC}{'' if tag is None else tag}[] }}")
    extension = isl.UnionMap.empty(sync.get_space().params())
    sets = []
    prefix.foreach_set(sets.append)
    for s in sets or [isl.Set("{ [] }")]:
        extension = extension.union(isl.UnionMap.from_map(isl.Map.from_domain_and_range(s, sync)))
    return isl.ScheduleNode.from_extension(extension)


# -- launching with dynamic sizes -----------------------------------------------------------------

def launch_grid(mapped: Mapped, sizes: isl.Set) -> tuple[int, int, int]:
    """The grid for the sizes fixed in `sizes` (a parameter set giving every size left free in
    the kernel, its dynamic sizes, a value). A block-mapped loop's filter is `value mod n =
    blockIdx`, with n fixed at compile time, independent of the dynamic sizes; at these sizes
    only the blocks that some value reaches have work: max(value mod n) + 1 of them (n when
    the loop has n values or more, ceil(extent / tile) for a tile loop from 0), the most over
    the bands mapped alike. Blocks past them would only test their loops and end."""
    grid = [1, 1, 1]
    for band in mapped.block_filters:
        for d, (loop, n) in enumerate(band):
            values = loop.intersect_params(sizes).range()
            residues = values.apply(isl.UnionMap(f"{{ [v] -> [w] : w = v mod {n} }}"))
            sets: list[isl.Set] = []
            residues.foreach_set(sets.append)
            for r in sets:
                top = r.dim_max_val(0) if not r.is_empty() else None
                if top is not None:  # (bounded: the sizes are all fixed now)
                    grid[d] = max(grid[d], int(top.to_python()) + 1)
    return tuple(min(g, m) for g, m in zip(grid, mapped.grid))


def _trips(count: int | float, threads: int) -> int | float:
    """The iterations a thread runs of a loop with count values split over threads (a loop
    whose count grows with a dynamic size has no fixed number: UNBOUNDED, never unrolled)."""
    return count if count == UNBOUNDED else -(-int(count) // threads)


# -- helpers -------------------------------------------------------------------------------------

def _prefix_values(node: isl.ScheduleNode) -> isl.UnionSet:
    """The values the loops around node take where some instance reaches it."""
    return node.get_prefix_schedule_union_map().intersect_domain(node.get_domain()).range()


def _statements(domain: isl.UnionSet) -> tuple[str, ...]:
    """The names of the statements (not copies or barriers) with instances in domain."""
    names = []
    domain.foreach_set(lambda s: names.append(s.get_tuple_name()))
    return tuple(sorted(n for n in names if n and not n.startswith("_")))


def _constant(domain: isl.UnionSet, value: int) -> isl.UnionMap:
    """Every instance of domain -> [value]."""
    return isl.UnionMap.from_domain_and_range(domain, isl.UnionSet(f"{{ [{value}] }}"))



def _modulo_filter(node: isl.ScheduleNode, k: int, size: int, ident: str,
                   every: int = 1) -> isl.UnionSet:
    """The instances of node's domain whose member k value v has floor(v / every) mod size =
    ident."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(k)
    if every > 1:
        upa = upa.scale_down_val(isl.Val(every)).floor()
    upa = upa.mod_val(isl.Val(size))
    equal = isl.Set(f"[{ident}] -> {{ [v] : v = {ident} }}")
    return isl.UnionMap.from_union_pw_aff(upa).intersect_domain(node.get_domain()) \
        .intersect_range(isl.UnionSet.from_set(equal)).domain()
