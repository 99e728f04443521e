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

The scheduler's ILPs can grow without bound on unlucky inputs; its work is bounded
(`budget.SCHEDULE`), and past that the statements simply run in program order
(`program_order`), with a TCWarning.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import select
import signal
import time

import attrs
import islpy as isl

from tcstage.errors import TCError, warn
from tcstage.poly import budget
from tcstage.poly.budget import WorkLimitExceeded, bounded
from tcstage.poly.scop import Scop, compute_dependences

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


def scheduled_scop(symbolic: Scop, fixed: Scop, fix_first: bool) -> tuple[Scop, isl.UnionMap]:
    """The scop to schedule and all its dependences: the one with symbolic sizes, as in TC,
    unless `fix_first`; the one with the call's sizes fixed if its analysis exceeds its budget
    (fixed sizes collapse the case splits of symbolic ones), with a TCWarning."""
    if not fix_first:
        try:
            return symbolic, compute_dependences(symbolic).all
        except WorkLimitExceeded as exceeded:
            warn(f"in '{symbolic.name}', {exceeded.message} with symbolic sizes: it is "
                 "scheduled for the sizes of this call, as with "
                 "fixParametersBeforeScheduling(True)")
    try:
        return fixed, compute_dependences(fixed).all
    except WorkLimitExceeded as exceeded:
        raise WorkLimitExceeded(f"in '{fixed.name}', {exceeded.message}, even for the sizes of "
                                "this call: the TC is too complex for tcstage's dependence "
                                "analysis") from None


def compute_schedule(scop: Scop, fusion="Preserve3Coincident", allow_skewing: bool = False,
                     dependences: isl.UnionMap | None = None,
                     fusion_seconds: float | None = None) -> isl.Schedule:
    """An isl schedule tree for the scop under the given fusion strategy; `dependences` (all
    of them) saves recomputing the scop's; the ILPs that fuse statements of several tensors
    get `fusion_seconds` in all (default FUSION_SECONDS). More than CHUNK statements (or
    CHUNK_TENSORS tensors) are scheduled a chunk at a time, in program order, and consecutive chunks fuse their outer
    bands where that is legal (`_chained`): the scheduler's ILPs grow much faster than the
    statements they hold."""
    strategy = _strategy_name(fusion)
    deps = scop.dependences().all if dependences is None else dependences
    coincidence = deps.subtract(reduction_dependences(scop))
    limits = {} if allow_skewing else {"max_coefficient": 1}

    def scheduled(statements) -> isl.Schedule:
        domain = _union_of([s.domain for s in statements])
        mine = deps.intersect_domain(domain).intersect_range(domain)
        constraints = (isl.ScheduleConstraints.on_domain(domain)
                       .set_context(scop.context)
                       .set_validity(mine)
                       .set_proximity(mine)
                       .set_coincidence(coincidence.intersect_domain(domain)
                                        .intersect_range(domain)))

        def run(**options) -> isl.Schedule:
            with _isl_options(**limits, **options), bounded(budget.SCHEDULE,
                                                            "the isl scheduler"):
                return constraints.compute_schedule()

        def fusing(**options) -> isl.Schedule | None:
            """run(), or None once fusing ILPs have used up their time (see FUSION_SECONDS)."""
            if clock["left"] <= 0:
                return None
            if len({s.tensor for s in statements}) < 2:
                return run(**options)
            key = (str(constraints), tuple(sorted({**limits, **options}.items())),
                   budget.SCHEDULE)
            start = time.monotonic()
            try:
                return _remembered(key, lambda: run(**options), clock["left"])
            finally:
                clock["left"] -= time.monotonic() - start

        if strategy == "Min":
            return run(serialize_sccs=1, whole_component=0)
        fused = fusing(serialize_sccs=0, whole_component=1)
        if fused is not None and (strategy == "Max" or _keeps_parallelism(fused, statements)):
            return fused
        return fusing(serialize_sccs=0, whole_component=0) or \
            run(serialize_sccs=1, whole_component=0)

    fusion_seconds = FUSION_SECONDS if fusion_seconds is None else fusion_seconds
    clock = {"left": fusion_seconds}

    statements = scop.statements
    chunks = [statements] if strategy == "Min" else _chunks(statements)  # Min: one ILP each
    try:
        parts = [(scheduled(chunk), chunk) for chunk in chunks]
        if clock["left"] <= 0:
            warn(f"in '{scop.name}', the isl scheduler's fusion took more than {fusion_seconds} s: "
                 "the statements it had not fused by then are scheduled apart, as under "
                 "scheduleFusionStrategy('Min')")
    except WorkLimitExceeded as exceeded:
        warn(f"in '{scop.name}', {exceeded.message}: its statements run one after another "
             "instead, each with its loops in TC order (nothing is fused)")
        return program_order(scop, deps)
    return _chained(parts, deps, coincidence, strategy)


# Statements the isl scheduler takes at once. Its ILP over a component grows superlinearly
# (100 in-place updates of one tensor: 1.5 s in one piece; 200: 15 s).
CHUNK = 24
# Seconds that the ILPs which fuse statements of several tensors may take in one schedule
# (isl's operation count misses most of their work: see CHUNK_TENSORS). They run in a forked
# process that is stopped at the limit; the rest is then scheduled without fusion, which takes
# milliseconds. interpolate's pyramid (x / 2, 2x + 1 between 3-d Funcs) needs minutes otherwise.
FUSION_SECONDS = 8.0

# The fusing ILPs' results (a schedule, or None: not done within the seconds given, which are
# kept with it) by their constraints' text, isl options and work budget, most recent last. One
# compilation schedules the same chunk many times: kernel sequences (poly/launches.py) schedule
# a growing run of statements, whose chunks but the last are those of the run before;
# options="auto" compiles twice.
_fusion_results: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
FUSION_RESULTS_KEPT = 512


def _remembered(key: tuple, compute, seconds: float) -> isl.Schedule | None:
    """within_seconds(compute, seconds), or what it gave before for `key` (a timeout only
    where it had about as many seconds: an ILP that did not end within a time will not within
    a second more)."""
    if key in _fusion_results:
        found, given = _fusion_results[key]
        if found is not None or given + 1.0 >= seconds:
            _fusion_results.move_to_end(key)
            return found
    found = within_seconds(compute, seconds)
    _fusion_results[key] = (found, seconds)
    while len(_fusion_results) > FUSION_RESULTS_KEPT:
        _fusion_results.popitem(last=False)
    return found

# ... and tensors it writes: fusing a chain of stencils over 4-d domains (bilateral_grid's blurs
# of a Halide pipeline) took the ILP 0.04 s for 3 of them, 17 s for 4 and minutes for 6, work
# that isl's operation count (the budget) hardly sees. The paper's kernels write at most 3.
CHUNK_TENSORS = 3


def _chunks(statements) -> list:
    """Consecutive runs of statements, each within CHUNK statements and CHUNK_TENSORS written
    tensors."""
    out, current, tensors = [], [], set()
    for s in statements:
        if current and (len(current) == CHUNK or len(tensors | {s.tensor}) > CHUNK_TENSORS):
            out.append(tuple(current))
            current, tensors = [], set()
        current.append(s)
        tensors.add(s.tensor)
    return out + [tuple(current)] if current else out


def within_seconds(compute, seconds: float) -> isl.Schedule | None:
    """compute() in a forked process, its schedule sent back as text; None if it takes more
    than `seconds` (the process is killed) or fails there (the caller then schedules without
    fusion, and a real error shows again in the parent)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, and leave without running the parent's cleanup
        status = 1
        try:
            os.close(read)
            text = str(compute()).encode()
            with os.fdopen(write, "wb") as out:
                out.write(text)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return None
            data = os.read(read, 1 << 20)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, b"".join(chunks).decode()) \
        if chunks else None


@attrs.frozen
class _Group:
    """Consecutive chunks whose outer bands become one: their schedules and statements, and
    the band they share (statement instance -> its first `members` members, over the group)."""

    parts: tuple  # (schedule, statements) per chunk
    domain: isl.UnionSet
    band: isl.UnionMap | None
    members: int  # 0: the group cannot fuse with the next chunk
    coincident: int  # leading members of the shared band no coincidence dependence crosses


def _chained(parts, deps: isl.UnionMap, coincidence: isl.UnionMap, strategy: str) -> isl.Schedule:
    """The schedules of consecutive chunks of statements (with their statements), in sequence;
    consecutive chunks whose outer bands can be one band share it (not under Min, and under
    Preserve3Coincident only where it keeps the members the statements can run in parallel)."""
    groups: list[_Group] = []
    for part in parts:
        joined = groups and strategy != "Min" and _joined(groups[-1], part, deps, coincidence,
                                                          strategy)
        if joined:
            groups[-1] = joined
        else:
            groups.append(_alone(part, coincidence))
    out = None
    for group in groups:
        schedule = group.parts[0][0] if len(group.parts) == 1 else _fused(group)
        out = schedule if out is None else out.sequence(schedule)
    return out


def _top_band(schedule: isl.Schedule) -> isl.ScheduleNode | None:
    node = schedule.get_root().child(0)
    if node.get_type() != isl.schedule_node_type.band or not node.band_get_permutable():
        return None
    return node


def _first(band: isl.UnionMap, members: int) -> isl.UnionMap:
    """The band's first `members` members (of however many it has)."""
    n = isl.Set.from_union_set(band.range()).dim(isl.dim_type.set) if not band.is_empty() \
        else members
    if n == members:
        return band
    d = [f"d{k}" for k in range(n)]
    return band.apply_range(isl.UnionMap(f"{{ [{', '.join(d)}] -> [{', '.join(d[:members])}] }}"))


def _alone(part, coincidence: isl.UnionMap) -> _Group:
    schedule, statements = part
    domain = schedule.get_domain()
    node = _top_band(schedule)
    if node is None:
        return _Group((part,), domain, None, 0, 0)
    band = isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule()) \
        .intersect_domain(domain)
    members = node.band_n_member()
    own = coincidence.intersect_domain(domain).intersect_range(domain)
    return _Group((part,), domain, band, members, _unchanged(own, band, members))


def _joined(group: _Group, part, deps: isl.UnionMap, coincidence: isl.UnionMap,
            strategy: str) -> _Group | None:
    """The group with the chunk added under its outer band, or None where the dependences
    from the group to the chunk do not all go forward (or stay) along each shared member (the
    sequence below the band orders the chunks), or where the band would lose parallelism."""
    new = _alone(part, coincidence)
    members = min(group.members, new.members)
    if not members:
        return None
    band = _first(group.band, members).union(_first(new.band, members))
    across = deps.intersect_range(new.domain).intersect_domain(group.domain)
    distances = across.apply_domain(band).apply_range(band).deltas()
    d = [f"d{k}" for k in range(members)]
    forward = isl.Set(f"{{ [{', '.join(d)}] : {' and '.join(f'{v} >= 0' for v in d)} }}")
    if not distances.is_subset(isl.UnionSet.from_set(forward)):
        return None
    across = coincidence.intersect_range(new.domain).intersect_domain(group.domain)
    parallel = min(group.coincident, new.coincident, _unchanged(across, band, members))
    statements = [s for _, chunk in (*group.parts, part) for s in chunk]
    wanted = min(3, min(len(s.iterators) - len(s.reduction_vars) for s in statements))
    if strategy == "Preserve3Coincident" and parallel < wanted:
        return None
    return _Group((*group.parts, part), group.domain.union(new.domain), band, members,
                  parallel)


def _unchanged(deps: isl.UnionMap, band: isl.UnionMap, members: int) -> int:
    """How many leading members of the band no dependence changes."""
    distances = deps.apply_domain(band).apply_range(band).deltas()
    d = [f"d{k}" for k in range(members)]
    for k in range(members):
        crossing = isl.UnionSet(f"{{ [{', '.join(d)}] : d{k} != 0 }}")
        if not distances.intersect(crossing).is_empty():
            return k
    return members


def _fused(group: _Group) -> isl.Schedule:
    """One permutable band of the members the chunks share, over what is left of each chunk's
    schedule, in sequence."""
    partial = below = None
    for schedule, _ in group.parts:
        node = _top_band(schedule)
        if node.band_n_member() > group.members:
            node = node.band_split(group.members)
        mine = node.band_get_partial_schedule()
        partial = mine if partial is None else partial.union_add(mine)
        rest = node.delete().get_schedule()
        below = rest if below is None else below.sequence(rest)
    node = below.insert_partial_schedule(partial).get_root().child(0).band_set_permutable(1)
    for k in range(group.coincident):
        node = node.band_member_set_coincident(k, 1)
    return node.get_schedule()


def _union_of(sets) -> isl.UnionSet:
    return functools.reduce(isl.UnionSet.union, map(isl.UnionSet.from_set, sets))


def program_order(scop: Scop, dependences: isl.UnionMap) -> isl.Schedule:
    """A schedule without the scheduler's ILP: the statements in sequence, each with its loops
    in TC order (the order the dependences were computed in, so always legal). The leading
    loops that no dependence of a statement on itself crosses form one permutable band, all
    coincident, which can be tiled and mapped; every other loop is a band of its own."""
    schedule = None
    for s in scop.statements:
        domain = isl.UnionSet.from_set(s.domain)
        own = dependences.intersect_domain(domain).intersect_range(domain).deltas()
        free = 0
        while free < len(s.iterators) and _zero_along(own, s, free):
            free += 1
        groups = ([s.iterators[:free]] if free else []) + [[v] for v in s.iterators[free:]]
        part = isl.Schedule.from_domain(domain)
        vec = ", ".join(s.iterators)
        for group in reversed(groups):  # each band goes above the ones inserted before it
            part = part.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(
                isl.UnionMap(f"{{ {s.name}[{vec}] -> [{', '.join(group)}] }}")))
        if free:
            band = part.get_root().child(0).band_set_permutable(1)
            for k in range(free):
                band = band.band_member_set_coincident(k, 1)
            part = band.get_schedule()
        schedule = part if schedule is None else schedule.sequence(part)
    return schedule


def _zero_along(deltas: isl.UnionSet, statement, k: int) -> bool:
    """Whether every distance vector of the statement's own dependences is 0 in loop k."""
    d = [f"d{i}" for i in range(len(statement.iterators))]
    crossing = isl.UnionSet(f"{{ {statement.name}[{', '.join(d)}] : d{k} != 0 }}")
    return deltas.intersect(crossing).is_empty()


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


def _keeps_parallelism(schedule: isl.Schedule, statements) -> bool:
    wanted = min(3, min(len(s.iterators) - len(s.reduction_vars) for s in statements))
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


UNBOUNDED = math.inf  # value_count of a loop whose range grows with a dynamic size


def value_count(member: isl.UnionMap) -> int | float:
    """How many consecutive values the member takes (max - min + 1), over all parameters;
    UNBOUNDED where a parameter left free (a dynamic size) has no upper bound."""
    values = member.range()
    if values.is_empty():
        return 0
    sets = []
    values.foreach_set(sets.append)
    lo = hi = None
    for s in sets:
        s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
        a, b = s.dim_min_val(0), s.dim_max_val(0)
        if not (a.is_int() and b.is_int()):
            return UNBOUNDED
        a, b = a.to_python(), b.to_python()
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
