"""Tensor cores (`useTensorCores`): contraction tiles run as warp-level `mma.sync` steps.

A *contraction* is a reduction statement `C(...) = C(...) + A(...) * B(...)` (a `+=!` of a
product of two reads, each possibly converted to float) where A and B are both half or both
bfloat16, C is float32 (the float32 accumulator that narrow reductions get by default, or a
float tensor), and the subscripts of the three are affine: then the loops that index C and A
but not B can be rows (M), those of C and B but not A columns (N), those of A and B but not C
the reduction (K). Each tile takes, per role, the loop with the most values in it; every other
loop (a batch, a second row loop of a Kronecker product, a convolution's kernel window) must
take one value per tile. tmm, tbmm and MLP layers have one of each; a convolution tiled by 1
over its window is an implicit GEMM (rows: its output positions along one axis, columns: its
filters, reduction: its input channels).

After memory promotion, the band of thread-mapped point loops running the contraction (one
block's work on one tile of C for one tile of the reduction) loses the contraction's instances,
and an extension statement `_mma<i>` takes their place after it, once per value of the loops
around it: the whole block computes the tile with the tensor cores (cuda/tensorcore.py): its
warps share the 16 x 8 pieces of the C tile and run `mma.sync.m16n8k16` steps over the
reduction tile, reading A and B where promotion left them (shared memory tiles or global
memory), C in global memory. Tiles may be partial (at the edges of C or K): the fragments are
loaded with zeros past them and stored back only within them.

Where the kernel does not allow it, the contraction keeps its CUDA-core loops and a note says
why (poly/notes.py): no contraction, other types, a statement that reads the contraction's
result under the same tile loops that cannot run around it, a loop outside the three roles
with more than one value per tile (tile it by 1), or a tile whose points are not one box
of consecutive values (a loop that blocks take in turn, untiled).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import islpy as isl

from tcstage.halide.solver import tree_vars
from tcstage.poly.mapping import THREAD_IDS, dependence_order, instances
from tcstage.poly.notes import OptionNote
from tcstage.poly.scop import Access, Scop, Statement

NARROW = ("float16", "bfloat16")
MMA_M, MMA_N, MMA_K = 16, 8, 16  # the shape of one mma.sync step
NOTE = "useTensorCores(True)"
MMA = "_mma"  # the extension statement, + its index


@attrs.frozen
class Contraction:
    statement: str
    accumulator: str  # C, the tensor written
    a: Access  # the read with rows and reduction (M, K)
    b: Access  # the read with reduction and columns (K, N)
    # isl iterator names: the loops that could be each role (a tile picks one per role, the
    # one with the most values in it; the others, and every other loop, take one per tile)
    rows: tuple[str, ...]  # in C and A, not B
    columns: tuple[str, ...]  # in C and B, not A
    reduction: tuple[str, ...]  # in A and B, not C
    dtype: str  # the operands' type: float16 or bfloat16


@attrs.frozen
class TensorCoreTile:
    """One `_mma<index>` statement: the contraction over the box of points that one value of
    the loops around it (its arguments) covers."""

    index: int
    contraction: Contraction
    # the row, column and reduction loops, the reduction loops run as a loop of calls, then
    # the loops with one value per tile
    dims: tuple[str, ...]
    origin: isl.PwMultiAff  # [loop values] -> [dims]: the box's first point
    extent: isl.PwMultiAff  # [loop values] -> [m, n, k, looped...]: the box's extents
    sizes: tuple[int, int, int]  # the largest extents of m, n and k (the tile sizes)
    looped: int = 0  # how many of dims, after the first three, the calls loop over
    # Where the innermost loop around the tile is the reduction's tile loop and the others fix
    # the tile of C, consecutive calls accumulate one tile of C: the accumulators stay in
    # registers between them, loaded from C at the first and stored at the last. These give
    # that loop's first and last value from the other loops' values (None: every call loads
    # and stores C).
    first: isl.PwAff | None = None
    last: isl.PwAff | None = None


def find_contractions(scop: Scop, halide_names: Mapping[str, str],
                      dtypes: Mapping[str, str]) -> tuple[dict[str, Contraction], list[str]]:
    """The contractions of the scop by statement, and why other reductions are not ones."""
    found, why = {}, []
    for s in scop.statements:
        if not s.reduction_vars:
            continue
        reason = _contraction(s, halide_names, dtypes)
        if isinstance(reason, Contraction):
            found[s.name] = reason
        else:
            why.append(f"{s.name} ({s.tensor}): {reason}")
    return found, why


def _strip_cast(tree):
    while isinstance(tree, tuple) and tree[0] == "cast" and tree[1] == "float32":
        tree = tree[2]
    return tree


def _contraction(s: Statement, halide_names, dtypes) -> Contraction | str:
    value = s.value
    if not (isinstance(value, tuple) and value[0] == "add"):
        return "not a sum"
    product = None
    for x, y in ((value[1], value[2]), (value[2], value[1])):
        if isinstance(x, tuple) and x[0] == "read" and halide_names.get(x[1]) == s.tensor \
                and tuple(x[2]) == tuple(s.lhs):
            product = y
    if product is None or not (isinstance(product, tuple) and product[0] == "mul"):
        return "not a sum of products"
    a_tree, b_tree = _strip_cast(product[1]), _strip_cast(product[2])
    if not (a_tree[0] == "read" and b_tree[0] == "read"):
        return "a factor is not a tensor read"
    if dtypes.get(s.tensor) != "float32":
        return f"its accumulator is {dtypes.get(s.tensor)}, not float32"
    reads = {(halide_names.get(r.halide_name), tuple(r.subscripts)): r for r in s.reads}
    a = reads.get((halide_names.get(a_tree[1]), tuple(reversed(a_tree[2]))))
    b = reads.get((halide_names.get(b_tree[1]), tuple(reversed(b_tree[2]))))
    if a is None or b is None:
        return "its reads could not be matched"
    if dtypes.get(a.tensor) not in NARROW or dtypes.get(a.tensor) != dtypes.get(b.tensor):
        return f"its operands are {dtypes.get(a.tensor)} and {dtypes.get(b.tensor)}, not both " \
               "half or both bfloat16"
    if not (a.exact and b.exact and s.write.exact):
        return "a subscript depends on tensor values"
    names = dict(zip(s.halide_iterators, s.iterators))

    def variables(subscripts) -> set[str]:  # the loops the (affine) subscripts involve
        return {names[v] for sub in subscripts for v in tree_vars(sub) if v in names}

    c, av, bv = variables(s.lhs), variables(a.subscripts), variables(b.subscripts)
    order = s.iterators  # (innermost last: a tie goes to the inner loop)
    rows = tuple(v for v in order if v in c and v in av and v not in bv)
    columns = tuple(v for v in order if v in c and v in bv and v not in av)
    reduction = tuple(v for v in order if v in av and v in bv and v not in c)
    if not (rows and columns and reduction):
        return "it has no " + ("row" if not rows else "column" if not columns else
                               "reduction") + " loop (a loop that indexes C and A but not B, " \
            "C and B but not A, or A and B but not C)"
    # (B(n, k) * A(m, k) works too: the roles follow the subscripts, not the order)
    return Contraction(s.name, s.tensor, a, b, rows, columns, reduction, dtypes[a.tensor])



def map_tensor_cores(schedule: isl.Schedule, scop: Scop,
                     contractions: Mapping[str, Contraction], deps: isl.UnionMap,
                     threads: int = 32
                     ) -> tuple[isl.Schedule, tuple[TensorCoreTile, ...], tuple[OptionNote, ...]]:
    """The contractions' point bands handed to `_mma<i>` statements where they can be.

    Where other statements share the point band (the identity of C before, its rounding to
    half after, under the same tile loops when a reduction tile is partial), the band is first
    distributed over them (each statement's points after the whole of the ones it depends on:
    mapping.dependence_order), so that the whole contraction can run between them."""
    tiles, notes = [], []
    if contractions and threads % 32:
        return schedule, (), (OptionNote(NOTE, f"the block's {threads} threads are not whole "
                                         "warps (mma.sync runs on whole warps)"),)
    for name, contraction in contractions.items():
        statement = next(s for s in scop.statements if s.name == name)
        node = _innermost_band(schedule.get_root(), statement.domain.get_space())
        if node is None:
            notes.append(OptionNote(NOTE, f"{name} runs under no band"))
            continue
        # the thread-mapped band: below a filter (loops nested deeper, a convolution's window,
        # are points of the tile too)
        while node.parent().get_type() == isl.schedule_node_type.band:
            node = node.parent()
        parent = node.parent()
        if parent.get_type() != isl.schedule_node_type.filter or \
                not _on_threads(parent.filter_get_filter()):
            notes.append(OptionNote(NOTE, f"the points of {name} are not mapped to threads "
                                    "(mapToThreads)"))
            continue
        result = _tile(parent, statement, contraction, len(tiles))
        if isinstance(result, str):
            notes.append(OptionNote(NOTE, result))
            continue
        tile, filter_node = result
        mine = isl.UnionSet.from_set(statement.domain)
        values = _prefix(filter_node).intersect_domain(mine).range()
        tile = _with_run(tile, values)
        mma = instances(values, f"{MMA}{tile.index}")
        # The contraction's points stay in the tree (code generation visits a branch only at
        # the loop values where it has instances), with a macro that does nothing.
        band = filter_node.child(0)
        below = band.child(0)
        while below.get_type() == isl.schedule_node_type.band:  # (a convolution's window)
            below = below.child(0)
        if below.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set) \
                and below.n_children() > 1:
            parts = [below.child(i).filter_get_filter() for i in range(below.n_children())]
            order = dependence_order(parts, deps, _prefix(filter_node))
            if order is None:
                notes.append(OptionNote(NOTE, f"{name} shares its loops with statements that "
                                        "cannot run before or after all of it"))
                continue
            filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(order))
            for part in order:
                filters = filters.add(part)
            sequence = band.insert_sequence(filters)
            at = next(i for i, part in enumerate(order)
                      if not part.extract_set(statement.domain.get_space()).is_empty())
            schedule = sequence.child(at).child(0).graft_after(mma).get_schedule()
        else:
            schedule = filter_node.graft_after(mma).get_schedule()
        tiles.append(tile)
    return schedule, tuple(tiles), tuple(notes)


def _with_run(tile: TensorCoreTile, values: isl.UnionSet) -> TensorCoreTile:
    """tile with `first` and `last` where its calls for one tile of C are consecutive: the
    innermost loop value moves the reduction's origin and no other one (see TensorCoreTile)."""
    n = tile.origin.dim(isl.dim_type.in_)
    sets: list[isl.Set] = []
    values.foreach_set(sets.append)
    if n == 0 or len(sets) != 1:
        return tile
    # (whether the value moves with the innermost loop: without it, it is no longer a function)
    innermost = [not isl.Map.from_pw_aff(tile.origin.get_pw_aff(d))
                 .project_out(isl.dim_type.in_, n - 1, 1).is_single_valued()
                 for d in range(tile.origin.dim(isl.dim_type.out))]
    if not innermost[2] or any(innermost[:2] + innermost[3:]):
        return tile
    # [outer loop values] -> [innermost value]: its least and greatest per tile of C
    run = _split_last(sets[0].reset_tuple_id())
    return attrs.evolve(tile, first=run.lexmin_pw_multi_aff().get_pw_aff(0),
                        last=run.lexmax_pw_multi_aff().get_pw_aff(0))


def _split_last(s: isl.Set) -> isl.Map:
    """A set of [v0, ..., vn-1] as the map [v0, ..., vn-2] -> [vn-1]."""
    n = s.dim(isl.dim_type.set)
    return isl.Map.from_range(s).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, n - 1)


def _consecutive(values: isl.Map, lo: isl.PwMultiAff, hi: isl.PwMultiAff) -> bool:
    """Whether a loop's values per tile ([loop values around] -> [value]) are every integer
    from the least to the greatest. A loop that blocks split without tiling runs b, b + G,
    b + 2G, ... in block b: the tile's extent, greatest - least + 1, would cover the other
    blocks' values too (narrow fuzz seed 141: three blocks computed overlapping tiles)."""
    order = isl.Space.set_alloc(values.get_ctx(), 0, 1)
    between = isl.Map.from_pw_multi_aff(lo).apply_range(isl.Map.lex_le(order)).intersect(
        isl.Map.from_pw_multi_aff(hi).apply_range(isl.Map.lex_ge(order)))
    return between.is_subset(values)


def _on_threads(filter_set: isl.UnionSet) -> bool:
    """Whether a filter is mapping's thread filter (its conditions name the thread ids)."""
    space = filter_set.get_space()
    return any(space.find_dim_by_name(isl.dim_type.param, t) >= 0 for t in THREAD_IDS)


def _prefix(filter_node: isl.ScheduleNode) -> isl.UnionMap:
    """The loop values around a (thread) filter node of the instances that reach it, all the
    block's (isl's get_domain cannot see past the extension nodes that promotion adds above;
    the prefix schedule can, and it is taken before the filter's own thread conditions)."""
    return filter_node.get_prefix_schedule_union_map()


def _innermost_band(node: isl.ScheduleNode, space: isl.Space) -> isl.ScheduleNode | None:
    """The deepest band whose instances include some of the statement's."""
    found = None
    if node.get_type() == isl.schedule_node_type.band and \
            not node.band_get_partial_schedule().domain().extract_set(space).is_empty():
        found = node
    for i in range(node.n_children()):
        deeper = _innermost_band(node.child(i), space)
        if deeper is not None:
            found = deeper
    return found


def _tile(filter_node: isl.ScheduleNode, s: Statement, c: Contraction, index: int
          ) -> tuple[TensorCoreTile, isl.ScheduleNode] | str:
    """The box of points per value of the loops around filter_node, or why there is none."""
    prefix = _prefix(filter_node).intersect_domain(isl.UnionSet.from_set(s.domain))
    maps: list[isl.Map] = []
    prefix.foreach_map(maps.append)
    if len(maps) != 1:
        return f"the points of {s.name} fall into several pieces"
    points = maps[0].reverse()  # loop values -> instances
    position = {v: k for k, v in enumerate(s.iterators)}
    n_vars = len(s.iterators)
    along = {v: points.project_out(isl.dim_type.out, position[v] + 1, n_vars - position[v] - 1)
             .project_out(isl.dim_type.out, 0, position[v]).reset_tuple_id(isl.dim_type.out)
             for v in s.iterators}
    # the points of one tile must be the box of their projections
    box = along[s.iterators[0]]
    for v in s.iterators[1:]:
        box = box.flat_range_product(along[v])
    if not box.is_equal(points.reset_tuple_id(isl.dim_type.out)):
        return f"the points of {s.name} under one tile are not a box"
    first, size, most = {}, {}, {}
    for v in s.iterators:
        lo, hi = along[v].lexmin_pw_multi_aff(), along[v].lexmax_pw_multi_aff()
        if not _consecutive(along[v], lo, hi):
            return (f"loop {dict(zip(s.iterators, s.halide_iterators))[v]} of {s.name} takes "
                    "values that are not consecutive in one tile (blocks take its values in "
                    "turn: tile it)")
        first[v] = lo
        size[v] = hi.get_pw_aff(0).sub(lo.get_pw_aff(0)).add_constant_val(isl.Val(1))
        top = isl.Map.from_pw_aff(size[v]).range().dim_max_val(0)
        if not top.is_int():
            return f"the tiles of {s.name} have no fixed size (a dynamic size?)"
        most[v] = int(top.to_python())
    # each role: its loop with the most values per tile (the inner one in a tie)
    roles = [max(reversed(loops), key=lambda v: most[v])
             for loops in (c.rows, c.columns, c.reduction)]
    loops = {v: n for v, n in zip(s.iterators, s.halide_iterators)}
    # other reduction loops with several values per tile (a convolution's window) become a
    # loop of calls, all into the same accumulators; any other loop must have one value
    looped = tuple(v for v in s.iterators if v not in roles and most[v] != 1
                   and v in c.reduction)
    for v in s.iterators:
        if v not in roles and v not in looped and most[v] != 1:
            return (f"loop {loops[v]} of {s.name} takes {most[v]} values per tile; tensor cores "
                    "take one row, one column and reduction loops (tile the others by 1)")
    dims = tuple(roles) + looped + tuple(v for v in s.iterators
                                         if v not in roles and v not in looped)
    origin_pma = first[dims[0]]
    for v in dims[1:]:
        origin_pma = origin_pma.flat_range_product(first[v])
    extent_pma = isl.PwMultiAff.from_pw_aff(size[dims[0]])
    for v in dims[1:3 + len(looped)]:
        extent_pma = extent_pma.flat_range_product(isl.PwMultiAff.from_pw_aff(size[v]))
    return TensorCoreTile(index, c, dims, origin_pma, extent_pma,
                          tuple(most[v] for v in roles), len(looped)), filter_node

