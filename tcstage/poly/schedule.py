"""Scheduling a scop with the isl scheduler and TC's fusion strategies (paper, Section 5.2).

Constraints: validity is every dependence (flow, anti, output); proximity is the same, so that
producers and consumers are scheduled close; coincidence is validity without the dependences a
reduction carries along its own reduction variables (TC treats those as permutable, not as
parallelism-breaking: the mapper keeps a reduction sequential per thread).

Fusion strategies map onto the options of mainline isl:
- `Max`: `schedule_whole_component`, fuse every statement of a component as far as validity
  allows;
- `Min`: `schedule_serialize_sccs`, keep strongly connected components apart;
- `Preserve3Coincident`: fuse like Max, but only where the outer band keeps as many coincident
  (parallel) members as the statements have, up to 3; otherwise schedule with isl's default
  clustering. TC's own version ran a callback inside isl's clustering (a patched isl); here
  the decision is taken on the whole result, which gives the same answer on the paper's
  kernels but can fuse less in programs where only some components would lose parallelism.

Without `allow_skewing`, schedule coefficients are limited to 1, which rules out skewing
(`i + j`) on the kernels TC targets.
"""

from __future__ import annotations

import contextlib

import islpy as isl

from tcstage.errors import TCError
from tcstage.poly.scop import Scop

STRATEGIES = ("Max", "Preserve3Coincident", "Min")


def _strategy_name(strategy) -> str:
    name = getattr(strategy, "name", strategy)
    for s in STRATEGIES:
        if str(name).lower() == s.lower():
            return s
    raise TCError(f"unknown fusion strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


@contextlib.contextmanager
def _isl_options(**values):
    """Sets isl scheduler options on the default context, restoring them afterwards."""
    ctx = isl.DEFAULT_CONTEXT
    saved = {k: getattr(ctx, f"get_schedule_{k}")() for k in values}
    try:
        for k, v in values.items():
            getattr(ctx, f"set_schedule_{k}")(v)
        yield
    finally:
        for k, v in saved.items():
            getattr(ctx, f"set_schedule_{k}")(v)


def reduction_dependences(scop: Scop) -> isl.UnionMap:
    """Pairs of instances of one reduction statement that differ only in reduction variables."""
    out = isl.UnionMap.empty(scop.context.get_space())
    for s in scop.statements:
        if not s.reduction_vars:
            continue
        src = ", ".join(s.iterators)
        dst = ", ".join(v if v not in s.reduction_vars else v + "_" for v in s.iterators)
        params = ", ".join(scop.params)
        out = out.union(isl.UnionMap(f"[{params}] -> {{ {s.name}[{src}] -> {s.name}[{dst}] }}"))
    return out


def compute_schedule(scop: Scop, fusion="Preserve3Coincident", allow_skewing: bool = False,
                     dependences: isl.UnionMap | None = None) -> isl.Schedule:
    """An isl schedule tree for the scop under the given fusion strategy; `dependences` (all
    of them) saves recomputing the scop's."""
    strategy = _strategy_name(fusion)
    deps = scop.dependences().all if dependences is None else dependences
    coincidence = deps.subtract(reduction_dependences(scop))
    constraints = (isl.ScheduleConstraints.on_domain(scop.domain)
                   .set_context(scop.context)
                   .set_validity(deps)
                   .set_proximity(deps)
                   .set_coincidence(coincidence))
    limits = {} if allow_skewing else {"max_coefficient": 1}

    def run(**options) -> isl.Schedule:
        with _isl_options(**limits, **options):
            return constraints.compute_schedule()

    if strategy == "Min":
        return run(serialize_sccs=1, whole_component=0)
    fused = run(serialize_sccs=0, whole_component=1)
    if strategy == "Max" or _keeps_parallelism(fused, scop):
        return fused
    return run(serialize_sccs=0, whole_component=0)


def outer_band(schedule: isl.Schedule) -> isl.ScheduleNode | None:
    node = schedule.get_root().child(0)
    while node.get_type() != isl.schedule_node_type.band:
        if node.n_children() != 1:
            return None
        node = node.child(0)
    return node


def outermost_bands(schedule: isl.Schedule) -> list[isl.ScheduleNode]:
    """The band enclosing every statement; or, where the tree splits into a sequence or set
    first (groups of statements with no common loop), the outermost band of each group."""
    band = outer_band(schedule)
    if band is not None:
        return [band]
    node = schedule.get_root()
    while node.n_children() == 1:
        node = node.child(0)
    bands = []
    for i in range(node.n_children() if node.get_type() in (isl.schedule_node_type.sequence,
                                                             isl.schedule_node_type.set) else 0):
        branch = node.child(i)
        while branch.n_children() == 1 and branch.get_type() != isl.schedule_node_type.band:
            branch = branch.child(0)
        if branch.get_type() == isl.schedule_node_type.band:
            bands.append(branch)
    return bands


def path_of(node: isl.ScheduleNode) -> tuple[int, ...]:
    """The child positions leading from the root to node."""
    path = []
    while node.has_parent():
        path.append(node.get_child_position())
        node = node.parent()
    return tuple(reversed(path))


def node_at(schedule: isl.Schedule, path: tuple[int, ...]) -> isl.ScheduleNode:
    node = schedule.get_root()
    for i in path:
        node = node.child(i)
    return node


def coincident_members(band: isl.ScheduleNode) -> int:
    """How many leading members of the band are coincident (parallel)."""
    count = 0
    for k in range(band.band_n_member()):
        if not band.band_member_get_coincident(k):
            break
        count += 1
    return count


def _keeps_parallelism(schedule: isl.Schedule, scop: Scop) -> bool:
    wanted = min(3, min(len(s.iterators) - len(s.reduction_vars) for s in scop.statements))
    band = outer_band(schedule)
    if band is None:  # nothing fused at all: no parallelism was traded for fusion
        return True
    return coincident_members(band) >= wanted


def respects(schedule: isl.Schedule, dependences: isl.UnionMap) -> bool:
    """Whether every dependence goes forward in the schedule's order."""
    order = schedule.get_map()
    before = dependences.apply_domain(order).apply_range(order)
    return before.is_subset(_lex_lt(before)) if not before.is_empty() else True


def _lex_lt(relation: isl.UnionMap) -> isl.UnionMap:
    out = isl.UnionMap.empty(relation.get_space())
    maps = []
    relation.foreach_map(maps.append)
    for m in maps:
        out = out.union(isl.UnionMap.from_map(isl.Map.lex_lt(m.get_space().domain())))
    return out


# -- band members as relations ----------------------------------------------------------------

def member_map(node: isl.ScheduleNode, k: int) -> isl.UnionMap:
    """Statement instance -> [value of band member k], over the band's domain."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(k)
    return isl.UnionMap.from_union_pw_aff(upa).intersect_domain(node.get_domain())


def value_count(member: isl.UnionMap) -> int:
    """How many consecutive values the member takes (max - min + 1), over all parameters."""
    values = member.range()
    if values.is_empty():
        return 0
    sets = []
    values.foreach_set(sets.append)
    lo = hi = None
    for s in sets:
        s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
        a, b = s.dim_min_val(0).to_python(), s.dim_max_val(0).to_python()
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return int(hi - lo + 1)


def keeps_value(deps: isl.UnionMap, outer: isl.UnionMap | None, member: isl.UnionMap) -> bool:
    """Whether every dependence whose ends agree on `outer` also agrees on `member`."""
    values = member if outer is None else outer.flat_range_product(member)
    pairs = deps.apply_domain(values).apply_range(values)
    if pairs.is_empty():
        return True
    deltas = pairs.deltas()
    sets = []
    deltas.foreach_set(sets.append)
    for s in sets:
        n = s.dim(isl.dim_type.set)
        names = [f"d{i}" for i in range(n)]
        same = " and ".join([f"{v} = 0" for v in names[:-1]] + [f"{names[-1]} != 0"])
        differ = isl.Set(f"{{ [{', '.join(names)}] : {same} }}")
        if not s.intersect(differ).is_empty():
            return False
    return True
