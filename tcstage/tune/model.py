"""A static cost model: the predicted time per call of one compiled CUDA kernel, from what the
compiler knows (paper, Section 6: the tuner ranks candidates; this model ranks them without a
GPU, or prunes them before one runs them).

What is counted, walking the final schedule tree (`compiled.promoted.schedule`, copies and
barriers included), per leaf and per statement reaching it:

- instances: the statement's instances over every block, counted from its domain as a product
  of per-dimension extents (exact for boxes and full tiles; partial edge tiles of copies are
  counted full). Instances run by every thread (no thread filter) count once per thread.
- warp-level executions: instances / the average active lanes of the warps that run them (the
  block's threads that reach the leaf, laid out x fastest, 32 to a warp).
- per access, its memory (global, or the shared / private buffer promotion gave it) and the
  element stride between neighbouring threads along x, y and z: the schedule dimension mapped to
  each thread id is found from the mapping filters (`v = t mod n`), and the access's element
  difference when that dimension steps by one, all other schedule dimensions equal (the same
  loop iteration in both threads). From the strides, per warp: 32-byte sectors for global
  memory (coalescing), and the bank-conflict degree (distinct words in the busiest of 32 banks)
  for shared memory. An access whose difference is not one constant (an indirect subscript) is
  one sector per lane.
- L2 and DRAM traffic: a block's global footprint per tensor (box hull of what block 0
  touches, in sectors) times the blocks, at most the sectors requested (L1 reuse within a block);
  DRAM bytes per tensor at most its size (L2 reuse across blocks).
- arithmetic: operations of the statement's value per instance (flops; an add of a product is
  one FMA instruction).
- barriers: instances of the `__syncthreads()` extension statements.
- tensor cores (useTensorCores): the contraction keeps its loops in the tree, so its instances
  are counted as above, but its arithmetic goes to the tensor-core term (the dense half/bf16
  rate with float32 accumulation; mma.sync reaches a fraction of it), its instructions are a
  sixteenth (one mma.sync does 64 FMAs per lane, plus twelve operand loads), and its
  accumulator's accesses are left out (C is read and written once per reduction tile).
- parallel reductions: the statement's accesses to the reduced tensor are registers (its
  accumulator), left out; the combine's shuffles and barriers are the barriers above.

Occupancy: blocks per SM from the threads per block, registers (ptxas's, when `resources` is
given; else 32 plus the private buffers' words) and shared memory (the promotions', or ptxas's
static figure), against the device's limits; waves = ceil(blocks / (SMs * blocks per SM)).

Time: the largest of the throughput bounds of the busiest SM (instruction issue, FP32, L1
sectors, shared wavefronts), of the L2 and of DRAM, and the latency bound: waves times the
dependent chain of one thread (each instance waits for its loads; global latency from the
estimated L1 hit rate), plus the launch overhead. A kernel with few threads, or one block, comes
out latency bound, as it runs.
"""

from __future__ import annotations

import math
from collections import defaultdict

import attrs
import islpy as isl

import numpy as np

from tcstage.errors import TCError
from tcstage.poly import budget
from tcstage.poly.budget import WorkLimitExceeded, bounded
from tcstage.poly.count import box_extents, count, elements, max_int
from tcstage.poly.mapping import BLOCK_IDS, SYNC, THREAD_IDS

__all__ = ["Device", "H100", "H200", "Prediction", "device_by_name", "predict"]

_T = isl.schedule_node_type


# -- devices -------------------------------------------------------------------------------------

@attrs.frozen
class Device:
    """The figures the model uses. Defaults: NVIDIA H100 SXM5 (sm_90), from NVIDIA's H100
    datasheet and the Hopper tuning guide: 132 SMs, 3.35 TB/s HBM3, 67 TFLOP/s FP32 (non-tensor,
    = 132 SMs * 128 FP32 lanes * 2 flops * 1.98 GHz boost), 228 KB shared memory per SM of which
    227 KB per block (opt-in), 64K 32-bit registers per SM, 255 per thread, 2048 threads and 32
    blocks per SM, 1024 threads per block, 50 MB L2. Latencies, L2 bandwidth and the launch
    overhead are estimates from published microbenchmarks (Chips and Cheese, Jia et al.'s
    dissection papers), not datasheet figures."""

    name: str = "H100"
    compute_capability: tuple[int, int] = (9, 0)
    sms: int = 132
    warp_size: int = 32
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    register_granularity: int = 256  # registers are allocated per warp in units of 256
    shared_per_sm: int = 228 * 1024  # bytes
    shared_per_block: int = 227 * 1024  # bytes, the opt-in maximum
    shared_reserved_per_block: int = 1024  # the system's share of each block's shared memory
    dram_bandwidth: float = 3.35e12  # bytes/s
    fp32_flops: float = 66.9e12  # flop/s, FMA as 2
    tensor_flops: float = 989e12  # flop/s, dense FP16/BF16 with FP32 accumulation (datasheet)
    clock: float = 1.98e9  # Hz (boost)
    l2_bytes: int = 50 * 1024 * 1024
    l2_bandwidth: float = 5.5e12  # bytes/s (estimate)
    l2_bytes_per_sm_clock: float = 64.0  # one SM's share of the L2's port (estimate)
    l1_bytes_per_clock: float = 128.0  # per SM: 4 sectors per cycle
    shared_banks: int = 32
    shared_bank_bytes: int = 4
    issue_per_clock: int = 4  # warp instructions per SM per cycle (4 schedulers)
    sector_bytes: int = 32
    l1_latency: float = 40.0  # cycles
    l2_latency: float = 260.0
    dram_latency: float = 560.0
    shared_latency: float = 30.0
    alu_latency: float = 4.0
    sync_latency: float = 40.0
    launch_overhead: float = 3e-6  # s, back-to-back launches (estimate)


H100 = Device()
# H200 SXM: the H100's GH100 chip with 141 GB of HBM3e at 4.8 TB/s (NVIDIA's H200 datasheet)
H200 = attrs.evolve(H100, name="H200", dram_bandwidth=4.8e12)
_DEVICES = {"H100": H100, "H200": H200}


def device_by_name(name: str) -> Device:
    """A known device by name ('H100', 'H200'; case and an 'NVIDIA ' prefix or a suffix such
    as ' SXM' or '-x1' do not matter)."""
    key = name.upper().replace("NVIDIA", "").strip()
    for known, device in _DEVICES.items():
        if key == known or key.startswith(known + " ") or key.startswith(known + "-"):
            return device
    raise TCError(f"unknown device '{name}' for the cost model; known: "
                  f"{', '.join(_DEVICES)}")


# -- the prediction ------------------------------------------------------------------------------

@attrs.frozen
class Prediction:
    time: float  # predicted seconds per call
    bound: str  # "memory", "compute" or "latency": what the largest term was
    terms: dict  # each bound's time (s): issue, fp32, l1, shared, l2, dram, latency, launch
    global_transactions: float  # 32-byte sectors requested from global memory (L1 level)
    global_instructions: float  # warp-level global loads and stores
    global_bytes: float  # bytes requested, sectors * 32
    l2_bytes: float
    dram_bytes: float
    shared_accesses: float  # warp-level shared loads and stores
    shared_wavefronts: float  # shared accesses times their conflict degree
    bank_conflict_factor: float  # wavefronts / accesses (1: no conflicts)
    flops: float
    syncs: float  # barrier executions per block
    threads_per_block: int
    blocks: int
    registers: int
    shared_bytes: int
    blocks_per_sm: int
    occupancy: float  # resident warps / the SM's maximum, 0..1
    waves: int
    # A kernel sequence: each launch's prediction, in order. The figures above then add up
    # the launches' (time, terms, traffic, flops); the launch shape is the slowest launch's.
    launches: tuple["Prediction", ...] = ()

    def describe(self) -> str:
        if self.launches:
            return "\n".join(
                [f"predicted {self.time * 1e6:.4g} us per call, {len(self.launches)} launches"]
                + [f"launch {k}: " + p.describe().replace("\n", "\n  ")
                   for k, p in enumerate(self.launches)])
        terms = ", ".join(f"{k} {v * 1e6:.3g}" for k, v in
                          sorted(self.terms.items(), key=lambda kv: -kv[1]))
        return "\n".join([
            f"predicted {self.time * 1e6:.4g} us per call, {self.bound} bound",
            f"  launch: {self.blocks} blocks of {self.threads_per_block} threads, "
            f"{self.registers} registers, {self.shared_bytes} B shared; {self.blocks_per_sm} "
            f"blocks/SM, occupancy {self.occupancy:.2f}, {self.waves} wave(s)",
            f"  global: {self.global_transactions:.4g} sectors in "
            f"{self.global_instructions:.4g} warp accesses "
            f"({self.global_transactions / max(self.global_instructions, 1):.3g} per access); "
            f"L2 {self.l2_bytes:.4g} B, DRAM {self.dram_bytes:.4g} B",
            f"  shared: {self.shared_accesses:.4g} warp accesses, conflict factor "
            f"{self.bank_conflict_factor:.3g}; {self.flops:.4g} flops; {self.syncs:.4g} "
            "barriers per block",
            f"  terms (us): {terms}",
        ])


# -- walking the final tree -----------------------------------------------------------------------

@attrs.frozen
class _Leaf:
    domain: isl.UnionSet  # instances reaching it (block and thread ids as parameters)
    schedule: isl.UnionMap  # instance -> its prefix schedule


def _leaves(schedule: isl.Schedule) -> list[_Leaf]:
    """The leaves of the final tree with their instances and schedules, extension statements
    (copies, barriers) included: isl cannot compute these below extension nodes itself."""
    out = []

    def walk(n, domain, sched):
        kind = n.get_type()
        if kind == _T.filter:
            domain = domain.intersect(n.filter_get_filter())
            sched = sched.intersect_domain(domain)
        elif kind == _T.extension:
            ext = n.extension_get_extension()
            domain = domain.union(ext.range())
            sched = sched.union(ext.reverse())
        elif kind == _T.band:
            partial = isl.UnionMap.from_multi_union_pw_aff(n.band_get_partial_schedule())
            sched = sched.flat_range_product(partial.intersect_domain(domain))
        elif kind == _T.leaf:
            out.append(_Leaf(domain, sched))
        for i in range(n.n_children()):
            walk(n.child(i), domain, sched)

    root = schedule.get_root()
    domain = schedule.get_domain()
    walk(root.child(0), domain, root.child(0).get_prefix_schedule_union_map()
         .intersect_domain(domain))
    return out


def _sets(u: isl.UnionSet) -> list[isl.Set]:
    out = []
    u.foreach_set(out.append)
    return out


def _fix_params(obj, names_values: dict):
    if isinstance(obj, (isl.UnionSet, isl.UnionMap)):
        return obj.intersect_params(isl.Set(
            f"[{', '.join(names_values)}] -> {{ : "
            f"{' and '.join(f'{k} = {v}' for k, v in names_values.items())} }}"))
    for name, value in names_values.items():
        pos = obj.get_space().find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            obj = obj.fix_val(isl.dim_type.param, pos, isl.Val(value))
    return obj


def _drop_params(obj, names):
    for name in names:
        pos = obj.get_space().find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            obj = obj.project_out(isl.dim_type.param, pos, 1)
    return obj


def _has_param(obj, name) -> bool:
    return obj.get_space().find_dim_by_name(isl.dim_type.param, name) >= 0


# -- accesses ------------------------------------------------------------------------------------

@attrs.frozen
class _Ref:
    memory: str  # "global", "shared", "private"
    tensor: str  # the tensor (global) or buffer
    write: bool
    relation: isl.Map | None  # instance -> element (tensor or buffer coordinates); None: unknown
    shape: tuple[int, ...]  # for linearising
    itemsize: int
    scale: tuple[int, ...] = ()  # element differences are divided by these (buffer strides)
    exact: bool = True


def _statement_refs(stmt, by_ref, shapes, itemsize) -> list[_Ref]:
    out, seen = [], set()
    for access, write in [(a, False) for a in stmt.reads] + [(stmt.write, True)]:
        key = (access.text, write)
        if key in seen:  # nvcc loads a repeated subscript once
            continue
        seen.add(key)
        promo = by_ref.get((stmt.name, access.text))
        if promo is None:
            out.append(_Ref("global", access.tensor, write, access.relation,
                            shapes[access.tensor], itemsize[access.tensor], (), access.exact))
        elif promo.memory == "shared":
            relation = None if promo.gather is not None else access.relation
            out.append(_Ref("shared", promo.buffer, write, relation, promo.padded,
                            itemsize[access.tensor], promo.strides))
        else:
            out.append(_Ref("private", promo.buffer, write, None, promo.padded,
                            itemsize[access.tensor]))
    return out


def _copy_refs(name: str, promo, space: isl.Set, shapes, itemsize) -> list[_Ref]:
    """A copy statement's two sides: the tensor in global memory and the buffer."""
    copy_in = name == promo.copy_in
    rank = len(promo.sizes)
    n = space.dim(isl.dim_type.set)
    p = [f"p{k}" for k in range(n - rank)]
    a = [f"a{k}" for k in range(rank)]
    inst = f"{name}[{', '.join(p + a)}]"
    tensor_side = None
    if promo.gather is None:
        tensor_side = isl.Map(f"{{ {inst} -> {promo.tensor}[{', '.join(a)}] }}")
    item = itemsize[promo.tensor]
    out = [_Ref("global", promo.tensor, not copy_in, tensor_side, shapes[promo.tensor], item,
                (), tensor_side is not None)]
    if promo.memory == "shared":
        buffer_side = isl.Map(f"{{ {inst} -> {promo.buffer}[{', '.join(a)}] }}")
        scale = () if promo.gather is not None else promo.strides
        out.append(_Ref("shared", promo.buffer, copy_in, buffer_side, promo.padded, item, scale))
    return out


def _linear(delta: list[int], shape, scale) -> int:
    if scale:
        delta = [d // s if s else d for d, s in zip(delta, scale)]
    out, step = 0, 1
    for d, n in zip(reversed(delta), reversed(shape)):
        out += d * step
        step *= max(int(n), 1)
    return out


def _thread_strides(ref: _Ref, sched: isl.Map, dims: dict[int, int]) -> list[int | None]:
    """Per thread dimension d, the linear element stride between threads t_d and t_d + 1 in the
    same loop iteration: 0 where the access does not depend on t_d, None where it is not one
    constant (or isl could not tell within budget.COST_MODEL: a copy's domain in many pieces,
    uncoalesced, exhausted the memory). dims: thread dimension -> the schedule dimension
    mapped to it."""
    if ref.relation is None:
        return [None, None, None] if ref.memory == "global" else [0, 0, 0]
    if not ref.exact:
        return [None, None, None]
    try:
        with bounded(budget.COST_MODEL, "the cost model's coalescing analysis"):
            return _exact_thread_strides(ref, sched, dims)
    except WorkLimitExceeded:
        return [None, None, None]


def _exact_thread_strides(ref: _Ref, sched: isl.Map, dims: dict[int, int]) -> list[int | None]:
    out: list[int | None] = [0, 0, 0]
    forward = sched.reverse().apply_range(ref.relation.intersect_domain(sched.domain()))
    forward = forward.coalesce()
    n = sched.dim(isl.dim_type.out)
    v = [f"v{k}" for k in range(n)]
    for d, j in dims.items():
        w = [f"v{k} + 1" if k == j else f"v{k}" for k in range(n)]
        step = isl.Map(f"{{ [{', '.join(v)}] -> [{', '.join(w)}] }}")
        step = step.set_tuple_id(isl.dim_type.in_, sched.get_tuple_id(isl.dim_type.out)) \
            if sched.has_tuple_id(isl.dim_type.out) else step
        step = step.set_tuple_id(isl.dim_type.out, sched.get_tuple_id(isl.dim_type.out)) \
            if sched.has_tuple_id(isl.dim_type.out) else step
        pairs = forward.reverse().apply_range(step).apply_range(forward)
        deltas = _drop_params(pairs.deltas(), THREAD_IDS + BLOCK_IDS).coalesce()
        if deltas.is_empty():
            out[d] = 0
            continue
        points = _few_points(deltas)
        moving = [p for p in points if any(p)] if points is not None else []
        if points is None or len(moving) > 1 or (len(points) > 1 and not moving):
            out[d] = None
            continue
        # (one difference, or that and none: a subscript clamped at the image's edges, where
        # neighbouring threads read the same element, and step by the difference elsewhere)
        out[d] = _linear(list(moving[0]) if moving else list(points[0]), ref.shape, ref.scale)
    return out


def _few_points(s: isl.Set, most: int = 3) -> list[tuple[int, ...]] | None:
    """The points of a set with at most `most` of them, else None."""
    if not s.is_bounded() or s.count_val().to_python() > most:
        return None
    points: list[tuple[int, ...]] = []
    s.foreach_point(lambda p: points.append(tuple(
        int(p.get_coordinate_val(isl.dim_type.set, k).to_python())
        for k in range(s.dim(isl.dim_type.set)))))
    return points


# -- warps ---------------------------------------------------------------------------------------

def _warps(active: tuple[int, int, int], block: tuple[int, int, int]) -> list[list[tuple]]:
    """The active threads (t0 < active[0], ...) of a block, grouped by warp."""
    warps = defaultdict(list)
    for t2 in range(active[2]):
        for t1 in range(active[1]):
            for t0 in range(active[0]):
                warps[(t0 + block[0] * (t1 + block[1] * t2)) // 32].append((t0, t1, t2))
    return list(warps.values())


def _sectors(warps, strides, itemsize: int, sector: int) -> float:
    """Average sectors one warp-level access touches (base address sector-aligned)."""
    total = 0
    for lanes in warps:
        if any(s is None for s in strides):
            total += len(lanes)
            continue
        total += len({(sum(s * t for s, t in zip(strides, lane)) * itemsize) // sector
                      for lane in lanes})
    return total / len(warps)


def _conflicts(warps, strides, itemsize: int, banks: int, bank_bytes: int) -> float:
    """Average bank-conflict degree of one warp-level shared access: the most distinct words
    any bank serves (equal words are broadcast)."""
    total = 0
    words_per_item = max(1, itemsize // bank_bytes)
    for lanes in warps:
        if any(s is None for s in strides):
            total += 1
            continue
        words = set()
        for lane in lanes:
            first = sum(s * t for s, t in zip(strides, lane)) * itemsize // bank_bytes
            words.update(range(first, first + words_per_item))
        per_bank = defaultdict(int)
        for w in words:
            per_bank[w % banks] += 1
        total += max(per_bank.values())
    return total / len(warps)


# -- arithmetic ----------------------------------------------------------------------------------

_OPS = {"add", "sub", "mul", "div", "mod", "min", "max", "eq", "ne", "lt", "le", "gt", "ge",
        "and", "or", "not", "select", "neg"}


def _ops(tree) -> tuple[int, int]:
    """(operations, instructions) of a value tree: subscripts are not counted; a call (exp,
    ...) counts as 8 instructions; an add or sub of a product is one FMA."""
    if not isinstance(tree, tuple) or not tree:
        return 0, 0
    tag = tree[0]
    if tag in ("read", "int", "float", "var"):
        return 0, 0
    if tag == "cast":
        o, i = _ops(tree[2])
        return o, i + 1
    if tag == "call":
        ops = instrs = 0
        for a in tree[2]:
            o, i = _ops(a)
            ops, instrs = ops + o, instrs + i
        return ops + 1, instrs + 8
    ops = instrs = 0
    for a in tree[1:]:
        o, i = _ops(a)
        ops, instrs = ops + o, instrs + i
    if tag in _OPS:
        fused = tag in ("add", "sub") and any(isinstance(a, tuple) and a and a[0] == "mul"
                                              for a in tree[1:])
        return ops + 1, instrs + (0 if fused else 1)
    return ops, instrs


# -- the model -----------------------------------------------------------------------------------

@attrs.define
class _Counts:
    global_sectors: float = 0.0
    global_instrs: float = 0.0
    global_sectors_by_tensor: dict = attrs.Factory(lambda: defaultdict(float))
    footprint: dict = attrs.Factory(dict)  # tensor -> isl.Set of what block 0 touches
    shared_instrs: float = 0.0
    shared_wavefronts: float = 0.0
    alu_instrs: float = 0.0
    flops: float = 0.0
    tensor_flops: float = 0.0
    syncs: float = 0.0  # per block
    chain: float = 0.0  # cycles of one thread's dependent chain, global loads aside
    chain_loads: float = 0.0  # the global loads one thread waits for
    global_loads: float = 0.0  # thread-level, for the hit rate
    shared_loads: float = 0.0


def predict(compiled, device: Device = H100, resources: dict | None = None) -> Prediction:
    """The predicted time per call of `compiled` (a tcstage.compiler.Compiled) on `device`.
    `resources`: what tcstage.cuda.nvcc.resources reports for its source (registers, spills,
    static shared memory); without it registers are estimated from the private buffers. A
    kernel sequence is predicted launch by launch, each after the one before (sum)."""
    if compiled.launches:
        kernels = (resources or {}).get("kernels", {})
        return _sequence([predict(p, device, kernels.get(p.cuda.name) if kernels else None)
                          for p in compiled.launches])
    scop, promoted, mapped = compiled.scop, compiled.promoted, compiled.mapped
    grid, block = tuple(mapped.grid), tuple(mapped.block)
    blocks = math.prod(grid)
    threads = math.prod(block)
    dtypes = {n: t.type.name for n, t in compiled.lowered.fn.tensors.items()}
    itemsize = {n: np.dtype(d).itemsize for n, d in dtypes.items()}
    shapes = {}
    for name, extent in scop.tensor_extents.items():
        shapes[name] = tuple(box_extents(extent) or ())
    statements = {s.name: s for s in scop.statements}
    by_ref = {}
    copies = {}
    for p in promoted.promotions:
        for ref in p.references:
            by_ref[ref] = p
        for c in (p.copy_in, p.copy_out):
            if c:
                copies[c] = p
    counts = _Counts()
    block_zero = {b: 0 for b in BLOCK_IDS}
    on_tensor_cores = {t.contraction.statement: t.contraction.accumulator
                       for t in getattr(compiled, "tensor_tiles", ())}
    in_registers = {r.reduction.statement: r.reduction.tensor for r in mapped.reductions}
    for leaf in _leaves(promoted.schedule):
        for s in _sets(leaf.domain):
            name = s.get_tuple_name()
            tensor_cores = name in on_tensor_cores
            if name in statements:
                stmt = statements[name]
                refs = _statement_refs(stmt, by_ref, shapes, itemsize)
                kept = on_tensor_cores.get(name, in_registers.get(name))
                refs = [r for r in refs if r.tensor != kept]
                ops, instrs = _ops(stmt.value)
            elif name in copies:
                refs = _copy_refs(name, copies[name], s, shapes, itemsize)
                ops, instrs = 0, 0
            elif name.startswith(SYNC):
                sched = leaf.schedule.intersect_domain(isl.UnionSet.from_set(s))
                per_block = _drop_params(_fix_params(sched.range(), block_zero), THREAD_IDS)
                counts.syncs += sum(count(x) for x in _sets(per_block)) or 1
                continue
            else:
                continue
            _statement_at_leaf(counts, s, leaf, refs, ops, instrs, grid, block, blocks,
                               device, tensor_cores)
    return _time(counts, compiled, device, resources, grid, block, blocks, threads, shapes,
                 itemsize)


def _statement_at_leaf(counts: _Counts, s: isl.Set, leaf: _Leaf, refs, ops, instrs, grid,
                       block, blocks, device: Device, tensor_cores: bool = False) -> None:
    # every instance once, whichever block and thread runs it; threads that no filter
    # constrains run it all
    instances = count(_drop_params(s, BLOCK_IDS + THREAD_IDS))
    if not instances:
        return
    at_zero = _fix_params(s, {b: 0 for b in BLOCK_IDS})
    active, redundant = [1, 1, 1], 1
    for d, t in enumerate(THREAD_IDS):
        if block[d] <= 1:
            continue
        if not _has_param(at_zero, t):
            active[d] = block[d]
            redundant *= block[d]
            continue
        others = [x for x in THREAD_IDS if x != t]
        values = _drop_params(_drop_params(at_zero, others), BLOCK_IDS).params()
        pos = values.find_dim_by_name(isl.dim_type.param, t)
        as_set = isl.Set.from_params(values)
        as_set = as_set.move_dims(isl.dim_type.set, 0, isl.dim_type.param, pos, 1)
        top = max_int(as_set.dim_max(0))
        active[d] = min(block[d], (top or 0) + 1)
    executions = instances * redundant
    warps = _warps(tuple(active), block)
    n_active = math.prod(active)
    lanes = n_active / len(warps)
    warp_execs = executions / lanes
    per_thread = executions / (n_active * blocks)  # the chain of one thread
    # the schedule dimension each (spread) thread id is mapped to
    sched = isl.Map.from_union_map(
        leaf.schedule.intersect_domain(isl.UnionSet.from_set(at_zero)))
    dims = {}
    if any(a > 1 for a in active) and not redundant > 1:
        rng = sched.range()
        n = rng.dim(isl.dim_type.set)
        for d, t in enumerate(THREAD_IDS):
            if active[d] <= 1:
                continue
            for j in range(n):
                v = ", ".join(f"v{k}" for k in range(n))
                cond = isl.Set(f"[{t}] -> {{ [{v}] : (v{j} - {t}) mod {active[d]} = 0 }}")
                if rng.is_subset(cond.align_params(rng.get_space()).intersect_params(
                        rng.params())):
                    dims[d] = j
                    break
    plain = _drop_params(sched, THREAD_IDS)
    latency_global = latency_shared = False
    serial = 0.0  # cycles a warp's access waits for its sectors or conflicting words
    for ref in refs:
        if ref.memory == "private":
            continue
        strides = _thread_strides(ref, plain, dims) if dims else [0, 0, 0]
        for d in range(3):
            if active[d] > 1 and d not in dims and redundant == 1:
                strides[d] = None  # spread over threads in a way the model cannot follow
        if ref.memory == "global":
            per = _sectors(warps, strides, ref.itemsize, device.sector_bytes)
            counts.global_sectors += warp_execs * per
            counts.global_sectors_by_tensor[ref.tensor] += warp_execs * per
            counts.global_instrs += warp_execs
            serial += per * device.sector_bytes / device.l1_bytes_per_clock
            if not ref.write:
                latency_global = True
                counts.global_loads += executions
            if ref.relation is not None:
                touched = ref.relation.intersect_domain(
                    _drop_params(at_zero, THREAD_IDS)).range()
            else:
                touched = None
            if ref.tensor in counts.footprint and counts.footprint[ref.tensor] is not None \
                    and touched is not None:
                counts.footprint[ref.tensor] = counts.footprint[ref.tensor].union(touched)
            else:
                counts.footprint[ref.tensor] = touched if ref.tensor not in counts.footprint \
                    else None
        else:
            degree = _conflicts(warps, strides, ref.itemsize, device.shared_banks,
                                device.shared_bank_bytes)
            counts.shared_instrs += warp_execs
            counts.shared_wavefronts += warp_execs * degree
            serial += degree
            if not ref.write:
                latency_shared = True
                counts.shared_loads += executions
    if tensor_cores:
        counts.alu_instrs += warp_execs * (instrs + 1) / 16
        counts.tensor_flops += executions * ops
    else:
        counts.alu_instrs += warp_execs * (instrs + 1)  # + address arithmetic and the loop
        counts.flops += executions * ops
    # a thread waits for an instance's loads (issued together), then computes
    counts.chain += per_thread * (serial + (device.shared_latency if latency_shared else 0)
                                  + max(instrs, 1) * device.alu_latency)
    counts.chain_loads += per_thread if latency_global else 0


def _occupancy(device: Device, threads: int, registers: int, shared: int) -> int:
    """Resident blocks per SM."""
    warps = -(-threads // device.warp_size)
    limits = [device.max_blocks_per_sm, device.max_threads_per_sm // (warps * device.warp_size)]
    per_warp = -(-registers * device.warp_size // device.register_granularity) \
        * device.register_granularity
    limits.append((device.registers_per_sm // per_warp) // warps)
    if shared:
        if shared > device.shared_per_block:
            return 0
        limits.append(device.shared_per_sm // (shared + device.shared_reserved_per_block))
    if threads > device.max_threads_per_block or registers > device.max_registers_per_thread:
        return 0
    return max(0, min(limits))


def _time(counts: _Counts, compiled, device: Device, resources, grid, block, blocks, threads,
          shapes, itemsize) -> Prediction:
    promoted = compiled.promoted
    shared = compiled.shared_bytes
    private_words = sum(math.prod(p.padded) * max(1, np.dtype(p.dtype).itemsize // 4)
                        for p in promoted.promotions if p.memory == "private")
    spill = 0
    if resources:
        registers = int(resources.get("registers") or 0) or 32
        shared = max(shared, int(resources.get("shared") or 0))
        spill = int(resources.get("spill_stores") or 0) + int(resources.get("spill_loads") or 0)
    else:
        registers = min(device.max_registers_per_thread, 32 + private_words)
    per_sm = _occupancy(device, threads, registers, shared)
    warps_per_block = -(-threads // device.warp_size)
    occupancy = per_sm * warps_per_block * device.warp_size / device.max_threads_per_sm
    # spilled registers: local memory traffic through L1, once per thread
    counts.global_sectors += spill * threads * blocks / device.sector_bytes
    # L2: a block's footprint per tensor, in sectors, times the blocks; at most what is asked
    l2 = dram = 0.0
    for tensor, requested in counts.global_sectors_by_tensor.items():
        asked = requested * device.sector_bytes
        foot = counts.footprint.get(tensor)
        ext = box_extents(foot) if foot is not None and not foot.is_empty() else None
        if ext:
            row = -(-ext[-1] * itemsize[tensor] // device.sector_bytes) * device.sector_bytes
            per_block = math.prod(ext[:-1]) * row
            tensor_l2 = min(asked, per_block * blocks)
        else:
            tensor_l2 = asked
        l2 += tensor_l2
        size = math.prod(shapes.get(tensor) or (0,)) * itemsize[tensor]
        dram += min(tensor_l2, size) if size else tensor_l2
    clock = device.clock
    hit = 1.0 - min(1.0, l2 / max(counts.global_sectors * device.sector_bytes, 1.0))
    miss_latency = device.l2_latency + (dram / max(l2, 1.0)) * (device.dram_latency
                                                                - device.l2_latency)
    global_latency = hit * device.l1_latency + (1 - hit) * miss_latency
    if per_sm == 0:
        return _impossible(counts, grid, block, blocks, threads, registers, shared, l2, dram)
    waves = -(-blocks // (device.sms * per_sm))
    # the busiest SM's share of the work: ceil(blocks / SMs) blocks
    share = -(-blocks // device.sms) / blocks
    terms = {
        "issue": (counts.alu_instrs + counts.global_instrs + counts.shared_instrs) * share
        / device.issue_per_clock / clock,
        "fp32": counts.flops * share / (device.fp32_flops / device.sms),
        "tensor": counts.tensor_flops * share / (device.tensor_flops / device.sms),
        "l1": counts.global_sectors * device.sector_bytes * share
        / device.l1_bytes_per_clock / clock,
        "shared": counts.shared_wavefronts * share / clock,
        "l2": max(l2 / device.l2_bandwidth,
                  l2 * share / (device.l2_bytes_per_sm_clock * clock)),
        "dram": dram / device.dram_bandwidth,
    }
    # latency: the dependent chain of one thread (its loads waited for), wave after wave;
    # unrolled copies of a loop body issue their loads together (instruction-level parallelism)
    options = compiled.options
    ilp = max(1, min(options.unroll_factor, 16)) if compiled.mapped.unrolled else 1
    chain = (counts.chain + counts.chain_loads * global_latency) / ilp \
        + counts.syncs * device.sync_latency
    terms["latency"] = waves * chain / clock
    slowest = max(terms, key=terms.get)
    bound = {"issue": "compute", "fp32": "compute", "tensor": "compute",
             "latency": "latency"}.get(slowest, "memory")
    time = terms[slowest] + device.launch_overhead
    terms["launch"] = device.launch_overhead
    return Prediction(
        time=time, bound=bound, terms=terms, global_transactions=counts.global_sectors,
        global_instructions=counts.global_instrs,
        global_bytes=counts.global_sectors * device.sector_bytes, l2_bytes=l2, dram_bytes=dram,
        shared_accesses=counts.shared_instrs, shared_wavefronts=counts.shared_wavefronts,
        bank_conflict_factor=counts.shared_wavefronts / counts.shared_instrs
        if counts.shared_instrs else 1.0,
        flops=counts.flops + counts.tensor_flops, syncs=counts.syncs,
        threads_per_block=threads, blocks=blocks,
        registers=registers, shared_bytes=shared, blocks_per_sm=per_sm, occupancy=occupancy,
        waves=waves)


def _sequence(parts: list[Prediction]) -> Prediction:
    """The prediction of launches that run one after the other."""
    slowest = max(parts, key=lambda p: p.time)

    def total(field: str) -> float:
        return sum(getattr(p, field) for p in parts)
    terms = {}
    for p in parts:
        for k, v in p.terms.items():
            terms[k] = terms.get(k, 0.0) + v
    shared_accesses = total("shared_accesses")
    return attrs.evolve(
        slowest, time=total("time"), terms=terms,
        global_transactions=total("global_transactions"),
        global_instructions=total("global_instructions"), global_bytes=total("global_bytes"),
        l2_bytes=total("l2_bytes"), dram_bytes=total("dram_bytes"),
        shared_accesses=shared_accesses, shared_wavefronts=total("shared_wavefronts"),
        bank_conflict_factor=total("shared_wavefronts") / shared_accesses
        if shared_accesses else 1.0, flops=total("flops"), launches=tuple(parts))


def _impossible(counts, grid, block, blocks, threads, registers, shared, l2, dram) -> Prediction:
    """A kernel that cannot launch (too many threads, registers or shared bytes per block)."""
    return Prediction(
        time=math.inf, bound="invalid", terms={}, global_transactions=counts.global_sectors,
        global_instructions=counts.global_instrs, global_bytes=counts.global_sectors * 32,
        l2_bytes=l2, dram_bytes=dram, shared_accesses=counts.shared_instrs,
        shared_wavefronts=counts.shared_wavefronts, bank_conflict_factor=1.0,
        flops=counts.flops, syncs=counts.syncs, threads_per_block=threads, blocks=blocks,
        registers=registers, shared_bytes=shared, blocks_per_sm=0, occupancy=0.0, waves=0)
