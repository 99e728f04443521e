"""Kernel sequences: where a dependence crosses the loops around a function's statements, one
kernel of them all leaves blocks (which cannot wait for each other) and threads idle, down to
a single block; several kernels, launched one after the other, can each fill the GPU. This
pass decides the launches.

The statements are grouped into the strongly connected components of their dependence graph
(a group's statements depend on each other both ways: they belong to one kernel), in an order
every dependence follows (program order among independent ones). A kernel's parallelism is
what the options give its statements, scheduled, tiled and mapped: blocks (counted up to
FULL_GPU_BLOCKS, a full GPU) times threads per block. One kernel of everything is kept where
it has more than half the parallelism of the group with the most alone, fills the GPU if
that group does, and has more than one block if it has (`starved`). Otherwise the first
launch takes the first group, and each next group joins the current launch where that keeps
as much of the parallelism of its best group alone, else starts a new launch. So a TC or
pipeline whose statements map well together stays one launch (a softmax with its rows on
blocks), and inside each launch the fusion strategy still decides what is fused. Between
launches, what one writes and a later one reads stays in global memory, where every tensor of
a kernel lives anyway; each launch has its own grid, block, promotion and barriers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import islpy as isl

from tcstage.options import MappingOptions
from tcstage.poly.scop import Scop


def restricted(scop: Scop, names: Sequence[str]) -> Scop:
    """The scop of these statements only (their order kept)."""
    keep = set(names)
    statements = tuple(s for s in scop.statements if s.name in keep)
    domain = isl.UnionSet.empty(scop.context.get_space())
    for s in statements:
        domain = domain.union(isl.UnionSet.from_set(s.domain))
    return attrs.evolve(scop, statements=statements,
                        schedule=scop.schedule.intersect_domain(domain))


def statement_graph(scop: Scop, dependences: isl.UnionMap) -> dict[str, set[str]]:
    """Statement -> the statements that depend on it (other than itself)."""
    edges: dict[str, set[str]] = {s.name: set() for s in scop.statements}

    def edge(m: isl.Map) -> None:
        a = m.get_tuple_name(isl.dim_type.in_)
        b = m.get_tuple_name(isl.dim_type.out)
        if a != b and a in edges and b in edges:
            edges[a].add(b)
    dependences.foreach_map(edge)
    return edges


def groups(scop: Scop, dependences: isl.UnionMap) -> list[list[str]]:
    """The strongly connected components of the statement graph, each in program order, in an
    order every dependence follows (among independent components, that of their first
    statements in the program)."""
    order = {s.name: k for k, s in enumerate(scop.statements)}
    graph = statement_graph(scop, dependences)
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:  # Tarjan's algorithm (iterative: programs may be long)
        work = [(v, iter(sorted(graph[v], key=order.get)))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w], key=order.get))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    found.append(sorted(component, key=order.get))
    for s in scop.statements:
        if s.name not in index:
            visit(s.name)
    # topological order of the components, the earliest first statement first among the ready
    of = {v: k for k, c in enumerate(found) for v in c}
    preds: dict[int, set[int]] = {k: set() for k in range(len(found))}
    for v, successors in graph.items():
        for w in successors:
            if of[w] != of[v]:
                preds[of[w]].add(of[v])
    done, out = set(), []
    while len(out) < len(found):
        ready = [k for k in range(len(found)) if k not in done and preds[k] <= done]
        k = min(ready, key=lambda c: order[found[c][0]])
        done.add(k)
        out.append(found[k])
    return out


# Seconds the fusing ILPs get (poly/schedule.py) when a launch and the next group are weighed
# as one kernel. Where fusing them takes longer, the one kernel would run them apart, losing
# its blocks, so the group starts a launch of its own either way; interpolate's pyramid levels
# took 8 s (schedule.FUSION_SECONDS) at each of a dozen such steps.
MERGE_FUSION_SECONDS = 2.0


# Blocks that fill a GPU: two per SM of an H100 or H200 (132 SMs), so that one block's wait
# for memory hides behind another's work (the rule tests/test_gpu_fill.py holds launches to).
FULL_GPU_BLOCKS = 2 * 132


def fill(blocks: int) -> int:
    """Blocks as far as they count: beyond FULL_GPU_BLOCKS the GPU is full."""
    return min(blocks, FULL_GPU_BLOCKS)


def partition(scop: Scop, dependences: isl.UnionMap, options: MappingOptions,
              parallelism) -> list[list[str]]:
    """The statements of each launch, in launch order. `parallelism(names, merging=False)`
    is what the options give those statements as one kernel: (blocks, threads per block)
    (the compiler schedules, tiles and maps them to find it; `merging`: a launch and the next
    group, whose fusion gets less time, as one that does not come quickly will not keep their
    parallelism)."""
    parts = groups(scop, dependences)
    if len(parts) <= 1 or math.prod(options.blocks) <= 1:
        return [[s.name for s in scop.statements]]
    everything = [s.name for s in scop.statements]
    together = parallelism(everything)
    # (no group alone can have more than all the blocks and threads asked for: a kernel
    # with over half of that is kept without mapping the groups)
    most = (math.prod(options.blocks), max(math.prod(options.threads), 32))
    if not starved(together, most):
        return [everything]
    alone = [parallelism(p) for p in parts]
    if not starved(together, max(alone, key=amount)):
        return [everything]
    launches, current, best = [], list(parts[0]), alone[0]
    for part, own in zip(parts[1:], alone[1:]):
        if starved(parallelism(current + part, merging=True), max(best, own, key=amount)):
            launches.append(current)
            current, best = list(part), own
        else:
            current, best = current + part, max(best, own, key=amount)
    launches.append(current)
    order = {s.name: k for k, s in enumerate(scop.statements)}
    return [sorted(launch, key=order.get) for launch in launches]


def amount(parallelism: tuple[int, int]) -> int:
    """A kernel's (blocks, threads per block) as one number: its blocks as far as they fill
    a GPU, times its threads."""
    blocks, threads = parallelism
    return fill(blocks) * threads


def starved(together: tuple[int, int], apart: tuple[int, int]) -> bool:
    """Whether statements whose kernels of their own would have parallelism `apart` (blocks,
    threads per block) lose too much of it in one kernel, `together`: half or more, the blocks
    that fill a GPU, or all blocks but one (one SM would run it all). (Within a factor of two,
    one kernel wins where it still fills the GPU: it saves a launch and keeps what the fusion
    strategy fused; beyond it, idle SMs and threads cost more.)"""
    return 2 * amount(together) <= amount(apart) or \
        fill(together[0]) < FULL_GPU_BLOCKS <= fill(apart[0]) or together[0] == 1 < apart[0]
