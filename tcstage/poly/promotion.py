"""Memory promotion (paper, Section 5.5 and Appendix A.3): array tiles copied to shared memory
per block and to private memory (registers) per thread, with the copies and barriers written
into the mapped schedule tree as extension nodes.

Where: at each *kernel scope*, the mark that mapping leaves below a block-mapped band (or at the
top when nothing is mapped to blocks): everything below it is one block's work on one tile.
`sharedDepth(d)` / `privateDepth(d)` put the scope where d band members lie above it: down a
chain of single-child nodes, never below a thread-mapped band, or up into the tile band, never
above its block-mapped members (splitting a band there). The *prefix* `p` is the value of the
band members above the scope: a copy runs once per prefix value.

What: for each tensor, its references under the scope are grouped. References whose footprints
overlap, one of them writing, must share one buffer; others are merged when the box of the
union is smaller than the two boxes. A group's *array tile* is the smallest box of constant
size whose offset is a (piecewise quasi-affine) function of the prefix that covers the group's
footprint; per dimension, the lexicographic minimum of the footprint is the offset and the
largest extent over all prefixes is the size, divided by the stride all elements share (a
thread's rows t, t + 16, ... are stored densely). An indirect read of a read-only tensor
through a read-only index tensor is also seen *gathered* (the paper's two-stage promotion):
its buffer is indexed by the index tensor's elements, `shared_O[i][j][k] = O[1 + Idx[i][j]][k]`;
the smaller of the two views' tiles is kept. Other non-affine references have no tile, and
neither has a footprint that grows with a dynamic size (one left free for the kernel to serve
every value of it): a buffer's size never depends on one.

Shared memory, greedily in order of first reference while the budget lasts, takes a group if
it has a tile, its elements are used more than once in the block, and some reference is not
coalesced: consecutive x threads do not access consecutive elements of the last dimension (a
gathered group needs no such reference, as in the paper).
Copy-in brings the elements that are read before the block writes them, copy-out writes back
what the block wrote; copies put the last dimension on threadIdx.x (coalesced), and the last
dimension of a rank >= 2 buffer is padded to an odd length against bank conflicts. Barriers:
after the copy-in, before the copy-out, after the copy-out when statements outside the scope
access the tensor (a barrier mapping placed inside the scope, which ordered the original
writes before them, now comes before the copy-out), and after the scope when it runs in a
loop; the barriers mapping placed for dependences between threads stay, and they order the
promoted accesses in the same way.

Private memory takes, per thread, a group with a tile that the thread uses more than once,
whose elements no other thread touches when it is written, in any instance of the scope or
outside it (a thread-private group: its copy-out comes after the scope's barriers), within
PRIVATE_ELEMENTS elements per thread. Its copies run in the thread that owns them and are
unrolled, so that with the compute loops unrolled too (`unroll`) nvcc keeps the buffer in
registers; otherwise it lives in local memory (cached, still per thread). Under register
tiling (mapping moved the reduction outside each thread's points) the private scope defaults to
just below the blocks, so a thread's outputs stay private across the whole reduction.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import attrs
import islpy as isl
import numpy as np

from tcstage.errors import warn
from tcstage.options import MappingOptions
from tcstage.poly import budget
from tcstage.poly.budget import WorkLimitExceeded, bounded
from tcstage.poly.mapping import KERNEL, THREAD_IDS, THREADS, Mapped, sync_graft
from tcstage.poly.notes import OptionNote, call
from tcstage.poly.schedule import path_of
from tcstage.halide.solver import tree_to_str, tree_vars
from tcstage.poly.scop import Access, Scop, Statement, reads_in

SHARED_BYTES = 48 * 1024  # static shared memory a block may declare without opting in
PRIVATE_ELEMENTS = 64  # per thread: more would spill registers
_T = isl.schedule_node_type


@attrs.frozen
class Gather:
    """How the buffer of an indirectly read tensor is indexed (the paper's two-stage promotion):
    `shared_O[i][j][k]` holds `O[1 + Idx[i][j]][k]`. Per tensor dimension, None where the
    subscript is affine (one buffer dimension, as usual), else the indirect subscript (a Halide
    tree) with its one read of an index tensor (the read node), whose element coordinates
    replace the subscript as buffer dimensions."""

    subscripts: tuple  # per tensor dimension: None or (subscript tree, index read node)
    index_tensors: tuple[str, ...]

    def buffer_subscripts(self, args: Sequence) -> list:
        """A reference's subscripts (TC order) -> its subscripts in the buffer."""
        out = []
        for arg, gathered in zip(args, self.subscripts):
            if gathered is None:
                out.append(arg)
            else:
                (read,) = [n for n in reads_in([arg]) if n[1] == gathered[1][1]]
                out.extend(reversed(read[2]))
        return out

    def tensor_subscripts(self, element: Sequence) -> list:
        """A buffer element (trees, TC order) -> the tensor element a copy reads there: each
        indirect subscript with its index read moved to the element's coordinates."""
        out, k = [], 0
        for gathered in self.subscripts:
            if gathered is None:
                out.append(element[k])
                k += 1
            else:
                tree, read = gathered
                rank = len(read[2])
                at = ("read", read[1], tuple(reversed(element[k:k + rank])))
                out.append(_replace(tree, read, at))
                k += rank
        return out


@attrs.frozen
class Reference:
    statement: str
    text: str  # Access.text: identifies the reference within its statement
    write: bool
    exact: bool
    relation: isl.Map  # instance -> tensor element (a gathered one: -> buffer element)
    gather: Gather | None = None
    direct: isl.Map | None = None  # a gathered one's access to the tensor itself (may-access)
    index_reads: tuple[str, ...] = ()  # a gathered one's index reads (texts), which its
    # buffer makes unnecessary


@attrs.frozen
class Promotion:
    """One group of references served from a buffer."""

    tensor: str
    memory: str  # 'shared' or 'private'
    buffer: str  # the C array
    dtype: str
    sizes: tuple[int, ...]  # the array tile
    padded: tuple[int, ...]  # the declared buffer
    references: tuple[tuple[str, str], ...]  # (statement, reference text)
    offsets: dict  # statement -> its tile offsets (isl.PwAff over the statement's instances)
    copy_in: str | None  # copy statement names
    copy_out: str | None
    copy_offsets: tuple  # the offsets as isl.PwAff over the copy's prefix dims
    prefix_dims: int
    strides: tuple[int, ...]  # element a is at (a - offset) / stride in the buffer
    gather: Gather | None = None

    @property
    def elements(self) -> int:
        return math.prod(self.padded)

    @property
    def nbytes(self) -> int:
        return self.elements * np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        tile = " x ".join(map(str, self.sizes)) or "1"
        refs = "; ".join(f"{s}: {t}" for s, t in dict.fromkeys(self.references))
        copies = ", ".join(c for c, name in (("copy-in", self.copy_in), ("copy-out",
                                                                           self.copy_out)) if name)
        dims = "".join(f"[{d}]" for d in self.padded)
        how = f" gathered through {', '.join(self.gather.index_tensors)}" \
            if self.gather else ""
        if any(k > 1 for k in self.strides):
            how += f" (strides {' x '.join(map(str, self.strides))})"
        return (f"{self.memory} {self.tensor}: {self.buffer}{dims} {self.dtype}, tile {tile}"
                f"{how}, "
                f"{self.nbytes} bytes{' per thread' if self.memory == 'private' else ''}; "
                f"{copies or 'no copies'}; references {refs}")


@attrs.frozen
class Promoted:
    schedule: isl.Schedule  # with copies and barriers; marks removed
    promotions: tuple[Promotion, ...]
    declined: tuple[str, ...]  # why other groups were not promoted, for `tcstage show`
    syncs: int
    notes: tuple[OptionNote, ...] = ()  # depths that could not take effect
    # per barrier (for poly/explain.py): (why, the tensors copied), why one of "after copy-in",
    # "before copy-out", "after copy-out" (statements outside the scope access them) or "loop"
    # (the scope runs in a loop: the next iteration's copies overwrite the buffers)
    barriers: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def shared_bytes(self) -> int:
        """The promoted tiles' shared memory per block."""
        return sum(p.nbytes for p in self.promotions if p.memory == "shared")

    def describe(self) -> str:
        lines = [f"promotion: {self.shared_bytes} bytes of shared memory per block, {self.syncs} "
                 "barrier(s) for copies"]
        lines += [f"  {p.describe()}" for p in self.promotions]
        lines += [f"  not promoted: {why}" for why in self.declined]
        return "\n".join(lines)


def promote(scop: Scop, mapped: Mapped, options: MappingOptions, dtypes: dict,
            keep_global: frozenset = frozenset(), shared_only: frozenset = frozenset(),
            scratch: frozenset = frozenset(), scratch_bytes: int = 0) -> Promoted:
    """Promotes array tiles of `mapped` as `options` ask; dtypes: tensor -> element type name.
    Tensors in keep_global are never promoted, those in shared_only never to private memory
    (the tensor cores' warps read a contraction's operands from anywhere in a block's tile,
    and write its accumulator in global memory). Tensors in `scratch` live in the block alone
    (overlapped tiles, poly/overlap.py): each goes to shared memory, with or without
    useSharedMemory, and is never copied in or out; their buffers share a pool of
    `scratch_bytes` that overlap.py laid out, which the other promotions leave alone."""
    shared_only = shared_only | scratch
    state = _State(scop, mapped, options, dtypes, keep_global, shared_only, scratch,
                   scratch_bytes)
    node = mapped.schedule.get_root()
    scopes = _find(node, KERNEL)
    try:
        with bounded(budget.PROMOTION, "memory promotion"):
            for path in scopes:  # promoting under one scope leaves the paths of the others
                state.promote_at(path)
    except WorkLimitExceeded as exceeded:  # promotion is an optimisation: go without it
        warn(f"in '{scop.name}', {exceeded.message}: every tensor stays in global memory")
        state = _State(scop, mapped, options, dtypes, keep_global, shared_only, scratch,
                       scratch_bytes)
        state.declined.append(f"everything: {exceeded.message}")
    schedule = _strip_marks(state.schedule.get_root()).get_schedule()
    notes = [OptionNote(call(option, [depth]), f"has no effect without {use}(True)")
             for option, depth, use, used in (
                 ("sharedDepth", options.shared_depth, "useSharedMemory",
                  options.use_shared_memory),
                 ("privateDepth", options.private_depth, "usePrivateMemory",
                  options.use_private_memory)) if depth is not None and not used]
    return Promoted(schedule, tuple(state.promotions), tuple(state.declined), state.syncs,
                    tuple(dict.fromkeys(notes + state.notes)), tuple(state.barriers))


@attrs.frozen
class _Plan:
    """What to graft at one position: extension trees before and after it, and a last one
    after everything else there."""

    path: tuple[int, ...]
    promotions: list
    before: list
    after: list
    last: isl.ScheduleNode | None


class _State:
    def __init__(self, scop, mapped, options, dtypes, keep_global=frozenset(),
                 shared_only=frozenset(), scratch=frozenset(), scratch_bytes=0):
        self.scop, self.mapped, self.options, self.dtypes = scop, mapped, options, dtypes
        self.keep_global, self.shared_only, self.scratch = keep_global, shared_only, scratch
        self.itemsize = {t: np.dtype(d).itemsize for t, d in dtypes.items()}
        self.shared_left = min(SHARED_BYTES, options.max_shared_memory
                               if options.max_shared_memory is not None else SHARED_BYTES) \
            - scratch_bytes
        self.schedule = mapped.schedule
        self.promotions: list[Promotion] = []
        self.declined: list[str] = []
        self.syncs = 0
        self.barriers: list[tuple[str, tuple[str, ...]]] = []  # Promoted.barriers
        self.buffers: set[str] = set()
        self.written = {s.write.tensor for s in scop.statements}
        self.views: dict[tuple, str] = {}  # gathered views: (tensor, subscripts) -> tuple name
        self.unneeded: set[tuple[str, str]] = set()  # index reads served by gathered buffers
        self.notes: list[OptionNote] = []
        context = scop.context  # its free parameters are dynamic sizes
        self.dynamic = tuple(scop.param_sizes[p] for p in scop.params if not context
                             .plain_get_val_if_fixed(isl.dim_type.param,
                                                     context.find_dim_by_name(
                                                         isl.dim_type.param, p)).is_int())

    # -- one scope ---------------------------------------------------------------------------------
    def promote_at(self, path: tuple[int, ...]) -> None:
        """Decides on the untouched tree (isl cannot analyse below extension nodes), then grafts
        the deeper scope's copies first so that the shallower scope's path stays valid."""
        private_depth = self.options.private_depth
        if private_depth is None and self.options.use_register_tiling:
            private_depth = 0  # just below the blocks: a thread's outputs over the reduction
        wanted = [(m, d) for m, use, d in (
            ("shared", self.options.use_shared_memory or bool(self.scratch),
             self.options.shared_depth),
            ("private", self.options.use_private_memory, private_depth)) if use]
        # Finding a scope may split a band. Splitting the tile band above the mark leaves the
        # path of that band (the anchor) as it is; the first pass makes every split, the second
        # finds each scope in the final tree.
        kernel = _node_at(self.schedule, path)
        anchor = path[:-1] if kernel.parent().get_type() == _T.band else path
        scopes = {}
        for _ in range(2):
            for memory, depth in wanted:
                node = _descend(_kernel_below(_node_at(self.schedule, anchor)), depth)
                self.schedule = node.get_schedule()
                scopes[memory] = path_of(node)
        for memory, depth in wanted:
            asked = self.options.shared_depth if memory == "shared" else \
                self.options.private_depth
            placed = _node_at(self.schedule, scopes[memory]).get_schedule_depth()
            if asked is not None and placed != asked:
                self.notes.append(_depth_note(memory, asked, placed))
        self.unneeded = set()  # per scope
        plans = []
        shared_tensors: set[str] = set()
        if "shared" in scopes:
            plan = self._shared(_node_at(self.schedule, scopes["shared"]))
            shared_tensors = {p.tensor for p in plan.promotions}
            plans.append(plan)
        if "private" in scopes:
            plans.append(self._private(_node_at(self.schedule, scopes["private"]),
                                       shared_tensors))
        for plan in sorted(plans, key=lambda p: -len(p.path)):
            node = _node_at(self.schedule, plan.path)
            depth = node.get_tree_depth()
            for graft in plan.before:
                node = node.graft_before(graft)
            for graft in reversed(plan.after):
                node = node.graft_after(graft)
            if plan.last is not None:  # after everything at this position, copies included
                node = _last_in_sequence(node).graft_after(plan.last) \
                    if plan.before or plan.after else node.graft_after(plan.last)
            self.schedule = node.ancestor(node.get_tree_depth() - depth).get_schedule()

    def _references(self, domain: isl.UnionSet) -> dict[str, list[Reference]]:
        """The references of the statements in domain, per tensor in order of appearance
        (indirect reads that can be gathered in their gathered view)."""
        out: dict[str, list[Reference]] = {}
        # a tensor reduced across threads is combined into global memory by thread 0 after its
        # loop: a buffer's copy-out would overwrite it
        reduced = {r.reduction.tensor for r in self.mapped.reductions} | self.keep_global
        for s in self.scop.statements:
            mine = domain.extract_set(s.domain.get_space())
            if mine.is_empty():
                continue
            for a, write in [(r, False) for r in s.reads] + [(s.write, True)]:
                if a.tensor in reduced:
                    continue
                ref = Reference(s.name, a.text, write, a.exact, a.relation.intersect_domain(mine))
                if not a.exact and not write:
                    ref = self._gathered(s, a, ref) or ref
                out.setdefault(a.tensor, []).append(ref)
        return out

    def _gathered(self, statement: Statement, access: Access, ref: Reference) -> Reference | None:
        """ref seen as a read of a buffer indexed by index-tensor elements (Gather), or None
        where the paper's two-stage promotion does not apply: the tensor and its index tensors
        must be read-only, and each non-affine subscript must read one element of an index
        tensor at affine subscripts and depend on the loops through that read alone."""
        if access.tensor in self.written or not access.subscripts:
            return None
        loops = set(statement.halide_iterators)
        domain = ref.relation.domain()
        parts, subscripts, key, indices = [], [], [], []
        for k, tree in enumerate(access.subscripts):
            reads = list(reads_in([tree]))
            if not reads:
                own = _dimension(access.relation, k)
                if not own.is_single_valued():  # not affine, and no index tensor to gather by
                    return None
                parts.append(own)
                subscripts.append(None)
                key.append("")
                continue
            if len(reads) != 1:
                return None
            read = reads[0]
            index = next((r for r in statement.reads if r.halide_name == read[1]
                          and r.subscripts == tuple(reversed(read[2]))), None)
            if index is None or not index.exact or index.tensor in self.written \
                    or tree_vars(_replace(tree, read, ("int", 0))) & loops:
                return None
            parts.append(index.relation.reset_tuple_id(isl.dim_type.out))
            subscripts.append((tree, read))
            key.append(f"{index.tensor}:{tree_to_str(_replace(tree, read, ('var', '_')))}")
            indices.append(index)
        relation = parts[0]
        for part in parts[1:]:
            relation = relation.flat_range_product(part)
        view = self.views.setdefault((access.tensor, tuple(key)),
                                     f"{access.tensor}_gathered{len(self.views)}")
        relation = relation.set_tuple_name(isl.dim_type.out, view).intersect_domain(domain)
        gather = Gather(tuple(subscripts), tuple(dict.fromkeys(i.tensor for i in indices)))
        return attrs.evolve(ref, exact=True, relation=relation, direct=ref.relation,
                            gather=gather, index_reads=tuple(i.text for i in indices))

    def _candidates(self, node, domain, memory: str):
        """The groups of references at node (of the instances in domain), with their tiles:
        (label for messages, tensor, references, tile or None, prefix map). Groups that are
        only index reads of gathered buffers already chosen are declined here."""
        prefix = node.get_prefix_schedule_union_map().intersect_domain(domain)
        context = self.mapped.context
        for tensor, refs in self._references(domain).items():
            spaces: dict[str, list[Reference]] = {}  # the tensor, or a gathered view of it
            for r in refs:
                spaces.setdefault(r.relation.get_tuple_name(isl.dim_type.out), []).append(r)
            for same in spaces.values():
                if tensor in self.scratch:  # (its write overlaps every read: one group)
                    grouped = [(same, _tile(_footprint(same, prefix), context))]
                elif memory == "shared" and not self.options.use_shared_memory:
                    continue  # (shared memory only for the block's own tensors)
                else:
                    grouped = _groups(same, prefix, context)
                for group, tile in grouped:
                    label = f"{memory} {tensor} ({', '.join(sorted({r.text for r in group}))})"
                    if all((r.statement, r.text) in self.unneeded for r in group):
                        self.declined.append(f"{label}: read only to index promoted gathered "
                                             "tensors")
                        continue
                    if group[0].gather is not None:
                        group, tile = _smaller_view(group, tile, prefix, context)
                    yield label, tensor, group, tile, prefix

    # -- shared memory -----------------------------------------------------------------------------
    def _shared(self, node) -> "_Plan":
        domain = node.get_domain()
        if math.prod(self.mapped.block) > 1 and all(
                loop.intersect_domain(domain).is_empty() for loop in self.mapped.thread_loops):
            # one thread runs the scope's statements (no band of theirs is mapped to threads,
            # so the others skip them): nothing is shared, and a barrier there would wait for
            # threads that never come (Halide fuzz seed 950078: a histogram under sharedDepth)
            for label, *_ in self._candidates(node, domain, "shared"):
                self.declined.append(f"{label}: one thread runs its statements here")
            return _Plan(path_of(node), [], [], [], None)
        leaves = _leaves(node)
        chosen = []
        candidates = self._candidates(node, domain, "shared")  # (lazily: see _candidates)
        if self.scratch:  # the block's own first
            candidates = sorted(candidates, key=lambda c: c[1] not in self.scratch)
        for label, tensor, refs, tile, prefix in candidates:
            if tile is None:
                self._no_tile(label, refs, "shared")
                continue
            if tensor in self.scratch:
                pass  # the block's own: shared memory whether reused or coalesced or not
            elif not _reused(refs, prefix):
                self.declined.append(f"{label}: no element is used twice in a block")
                continue
            # the paper drops the coalescing test for gathered tensors: their rows are scattered
            elif refs[0].gather is None and all(_coalesced(r, leaves) for r in refs):
                self.declined.append(f"{label}: every access is coalesced")
                continue
            sizes = tile.sizes
            padded = _padded(sizes, tensor in self.shared_only - self.scratch
                             and self.itemsize[tensor] == 2)
            nbytes = math.prod(padded) * self.itemsize[tensor]
            if tensor in self.scratch:  # (in the pool, already counted)
                chosen.append((tensor, refs, tile, prefix, padded))
                continue
            if nbytes > self.shared_left:
                self.declined.append(f"{label}: {nbytes} bytes exceed the {self.shared_left} "
                                     "bytes of shared memory left")
                continue
            self.shared_left -= nbytes
            chosen.append((tensor, refs, tile, prefix, padded))
            self.unneeded |= _index_reads(refs)
        made, copies_in, copies_out = self._build("shared", chosen)
        copied_in = tuple(p.tensor for p in made if p.copy_in is not None)
        copied_out = tuple(p.tensor for p in made if p.copy_out is not None)
        outside_refs = self._outside(domain)[0] if copies_in or copies_out else {}
        # a barrier before the copy-in where statements outside the scope write a tensor it
        # copies: other threads' writes (a `max=!`'s identity, differential seed 70057) must
        # be done before one thread reads them into shared memory
        written_outside = tuple(t for t in copied_in
                                if any(r.write for r in outside_refs.get(t, ())))
        before = ([self._sync(node, "before copy-in", written_outside)] if written_outside
                  else []) + copies_in + \
            ([self._sync(node, "after copy-in", copied_in)] if copies_in else [])
        # barrier first: other threads wrote the data; and one after, where statements outside
        # the scope access a tensor copied out (the barrier that ordered them after the
        # original writes may lie inside the scope, before the copy-out)
        escapes = any(p.copy_out is not None and p.tensor in outside_refs for p in made)
        after = ([self._sync(node, "before copy-out", copied_out)] if copies_out else []) \
            + copies_out + ([self._sync(node, "after copy-out", copied_out)] if escapes else [])
        # in a loop, the next iteration's copies overwrite what this one may still read
        last = self._sync(node, "loop", tuple(p.tensor for p in made)) \
            if made and _runs_in_loop(node, domain, self.mapped.context) else None
        return _Plan(path_of(node), made, before, after, last)

    def _no_tile(self, label: str, refs, memory: str) -> None:
        """Declines a group with no tile. Exact references have a box of fixed size wherever
        every size is fixed; with dynamic sizes, a footprint that grows with them has none, and
        is never promoted (its buffer would depend on them): a note says so."""
        per = " per thread" if memory == "private" else ""
        dynamic = self.dynamic if all(r.exact for r in refs) else ()
        if not dynamic:
            self.declined.append(f"{label}: no fixed-size tile{per}")
            return
        names = ", ".join(dynamic)
        self.declined.append(f"{label}: no fixed-size tile{per}, its size grows with the dynamic "
                             f"size(s) {names}")
        option = "useSharedMemory" if memory == "shared" else "usePrivateMemory"
        self.notes.append(OptionNote(call(option, [True]), f"{label[len(memory) + 1:]} is not "
                                     f"promoted: its tile{per} grows with the dynamic size(s) "
                                     f"{names} (tile the loops over them, or promote deeper)"))

    def _sync(self, node, why: str, tensors: tuple[str, ...]) -> isl.ScheduleNode:
        self.syncs += 1
        self.barriers.append((why, tensors))
        return sync_graft(node, self.syncs)

    # -- private memory ----------------------------------------------------------------------------
    def _private(self, node, shared_tensors: set[str]) -> "_Plan":
        leaves = _leaves(node)
        per_thread = None  # every instance with its thread ids as parameters
        for leaf in leaves:
            d = leaf.domain
            per_thread = d if per_thread is None else per_thread.union(d)
        if per_thread is None or not _has_thread_ids(per_thread):
            return _Plan(path_of(node), [], [], [], None)
        thread_map = _thread_map(per_thread)
        # A thread's private copy is right only if no other thread writes what it holds or
        # reads what it writes, through this group or any other reference to the tensor.
        references = self._references(per_thread)
        outside = None  # the kernel's references beyond the scope, once a written group asks
        budget = PRIVATE_ELEMENTS
        chosen = []
        for label, tensor, refs, tile, prefix in self._candidates(node, per_thread, "private"):
            if tensor in shared_tensors or tensor in self.shared_only:
                continue
            if tile is None:
                self._no_tile(label, refs, "private")
                continue
            every = references[tensor]
            if any(r.write for r in every) and not _thread_private(every, prefix, thread_map):
                self.declined.append(f"{label}: other threads access elements of {tensor} that "
                                     "are written here")
                continue
            if any(r.write for r in refs):
                outside = outside or self._outside(per_thread)
                if _other_threads_elsewhere(every, thread_map, *outside, tensor):
                    self.declined.append(f"{label}: other threads access elements of {tensor} "
                                         "that are written here, in another instance of this "
                                         "scope or outside it")
                    continue
            if not _reused(refs, prefix):
                self.declined.append(f"{label}: no element is used twice by a thread")
                continue
            count = math.prod(tile.sizes)
            if count > budget:
                self.declined.append(f"{label}: {count} elements exceed the {budget} private "
                                     "elements per thread left")
                continue
            budget -= count
            chosen.append((tensor, refs, tile, prefix, tile.sizes))
            self.unneeded |= _index_reads(refs)
        made, before, after = self._build("private", chosen)
        return _Plan(path_of(node), made, before, after, None)

    def _outside(self, scope_domain: isl.UnionSet) -> tuple[dict, isl.UnionMap | None]:
        """The references, per tensor, of the kernel's statement instances that do not run in
        the scope whose instances are scope_domain, and their thread ids (thread_map)."""
        leaves = _leaves(self.schedule.get_root())
        outside = functools.reduce(isl.UnionSet.union, (leaf.domain for leaf in leaves)) \
            .subtract(scope_domain)
        if outside.is_empty():
            return {}, None
        return self._references(outside), _thread_map(outside)

    # -- building ----------------------------------------------------------------------------------
    def _build(self, memory: str, chosen):
        """The promotions of the chosen groups, with their copy-in and copy-out trees."""
        made, copies_in, copies_out = [], [], []
        for tensor, refs, tile, prefix, padded in chosen:
            promotion, copy_in, copy_out = self._make(tensor, memory, refs, tile, padded, prefix)
            made.append(promotion)
            threads = memory == "shared"
            if copy_in is not None:
                copies_in.append(self._copy_tree(copy_in, promotion, threads))
            if copy_out is not None:
                copies_out.append(self._copy_tree(copy_out, promotion, threads))
        return made, copies_in, copies_out

    def _make(self, tensor, memory, refs, tile: "_Tile", padded, prefix):
        """The Promotion and its copy-in / copy-out footprints ({prefix -> element})."""
        base = f"{memory}_{tensor}"
        buffer, k = base, 1
        while buffer in self.buffers:
            buffer, k = f"{base}_{k}", k + 1
        self.buffers.add(buffer)
        n = len(self.promotions)
        offsets, sizes = tile.offsets, tile.sizes
        offset_map = isl.Map.from_pw_multi_aff(offsets)
        per_statement = {}
        for r in refs:
            if r.statement in per_statement:
                continue
            own = prefix.intersect_domain(isl.UnionSet.from_set(r.relation.domain()))
            at = isl.Map.from_union_map(own).apply_range(offset_map)
            pma = isl.PwMultiAff.from_map(at)
            per_statement[r.statement] = tuple(pma.get_at(k) for k in range(len(sizes)))
        if tensor in self.scratch:  # computed in the block before it is read, dead after it
            live_in = written = None
        else:
            live_in = _live_in(refs, prefix, self.scop)
            written = _footprint([r for r in refs if r.write], prefix)
        copy_in = copy_out = None
        if live_in is not None and not live_in.is_empty():
            copy_in = (f"_{n}in", live_in)
        if written is not None and not written.is_empty():
            copy_out = (f"_{n}out", written)
        n_prefix = offsets.dim(isl.dim_type.in_)
        copy_offsets = tuple(offsets.get_at(k) for k in range(len(sizes)))
        promotion = Promotion(tensor, memory, buffer, self.dtypes[tensor], sizes, padded,
                              tuple((r.statement, r.text) for r in refs), per_statement,
                              copy_in and copy_in[0], copy_out and copy_out[0], copy_offsets,
                              n_prefix, tile.strides, refs[0].gather)
        self.promotions.append(promotion)
        return promotion, copy_in, copy_out

    def _copy_tree(self, copy, promotion: Promotion, threads: bool) -> isl.ScheduleNode:
        """An extension node adding the copy statement, one instance per element and prefix,
        with its loops over the tile (last dimension innermost, on threadIdx.x)."""
        name, footprint = copy
        # [prefix -> element] -> element - offset(prefix), as a piecewise function: computed as
        # a relation (deltas of pairs), it split into hundreds of pieces on skewed schedules,
        # and isl's AST generation took minutes over them
        space = footprint.get_space()
        offsets = _offsets_pma(promotion.copy_offsets, footprint) \
            .pullback_multi_aff(isl.MultiAff.domain_map(space))
        relative = isl.PwMultiAff.from_multi_aff(isl.MultiAff.range_map(space)).sub(offsets) \
            .intersect_domain(footprint.wrap()).coalesce().reset_tuple_id(isl.dim_type.out)
        if any(s > 1 for s in promotion.strides):  # buffer coordinates, not distances
            d = [f"d{k}" for k in range(len(promotion.strides))]
            q = [f"floor({v}/{s})" if s > 1 else v for v, s in zip(d, promotion.strides)]
            relative = isl.PwMultiAff(f"{{ [{', '.join(d)}] -> [{', '.join(q)}] }}") \
                .pullback_pw_multi_aff(relative)
        relative = isl.Map.from_pw_multi_aff(relative).flatten_domain() \
            .set_tuple_name(isl.dim_type.in_, name)
        extension = footprint.domain_map().reverse().flatten_range() \
            .set_tuple_name(isl.dim_type.out, name)
        root = isl.ScheduleNode.from_extension(isl.UnionMap.from_map(extension))
        rank = len(promotion.sizes)
        node = root.child(0)
        if rank:
            node = node.insert_partial_schedule(
                isl.MultiUnionPwAff.from_union_map(isl.UnionMap.from_map(relative)))
            if not threads or self.options.unroll_copy_shared:
                for k in range(rank):
                    node = node.band_member_set_ast_loop_type(k, isl.ast_loop_type.unroll)
        used = [THREAD_IDS[d] for d in range(3) if self.mapped.block[d] > 1] if threads else []
        if used:  # the last dimension on threadIdx.x; thread ids left over copy nothing
            conds = [f"(r{rank - 1 - i} - {t}) mod {self.mapped.block[THREAD_IDS.index(t)]} = 0"
                     if i < rank else f"{t} = 0" for i, t in enumerate(used)]
            dims = ", ".join(f"r{k}" for k in range(rank))
            on_thread = isl.Set(f"[{', '.join(used)}] -> {{ [{dims}] : {' and '.join(conds)} }}")
            node = node.insert_filter(
                isl.UnionSet.from_set(relative.intersect_range(on_thread).domain()))
        return node.ancestor(node.get_tree_depth())


# -- footprints and tiles ---------------------------------------------------------------------

_UNKNOWN = object()  # a tile not computed yet (None is no tile)


def _groups(refs: list[Reference], prefix, context):
    """refs (of one tensor, or one gathered view) in groups, with their tiles: references that
    must share a buffer, and groups whose union has a smaller box than the two. Groups merge
    one pair at a time, first pair first. Footprints are kept per group, tiles computed when a
    comparison needs them, and a pair found apart is not compared again until one of the two
    grows (recomputing every pair after every merge, 31 in-place updates took seconds)."""
    groups = [[r] for r in refs]
    prints = [_footprint(g, prefix) for g in groups]
    tiles: list = [_UNKNOWN] * len(groups)
    fresh = itertools.count()
    versions = [next(fresh) for _ in groups]  # a group gets a new version when it grows
    apart: set[tuple[int, int]] = set()  # pairs of versions that stay apart

    def tile(k: int) -> _Tile | None:
        if tiles[k] is _UNKNOWN:
            tiles[k] = _tile(prints[k], context)
        return tiles[k]

    def merge_first_pair() -> bool:
        for i, j in itertools.combinations(range(len(groups)), 2):
            if (versions[i], versions[j]) in apart:
                continue
            union = prints[j] if prints[i] is None else \
                prints[i] if prints[j] is None else prints[i].union(prints[j])
            union_tile = _UNKNOWN
            if not _must_group(groups[i] + groups[j], prints[i], prints[j]):
                union_tile = _tile(union, context)
                if not _smaller(union_tile, tile(i), tile(j)):
                    apart.add((versions[i], versions[j]))
                    continue
            groups[i], prints[i], tiles[i] = groups[i] + groups[j], union, union_tile
            versions[i] = next(fresh)
            del groups[j], prints[j], tiles[j], versions[j]
            return True
        return False

    while merge_first_pair():
        pass
    return [(g, tile(k)) for k, g in enumerate(groups)]


def _smaller_view(group: list[Reference], tile, prefix, context):
    """A gathered group and its tile, or the same references seen directly (their indirect
    subscripts reaching the whole tensor) where that tile is no larger: a small table may fit
    whole."""
    direct = [attrs.evolve(r, exact=False, relation=r.direct, gather=None, direct=None,
                           index_reads=()) for r in group]
    direct_tile = _tile(_footprint(direct, prefix), context)
    if direct_tile is not None and (tile is None or
                                    math.prod(direct_tile.sizes) <= math.prod(tile.sizes)):
        return direct, direct_tile
    return group, tile


def _index_reads(refs) -> set[tuple[str, str]]:
    """(statement, text) of the index reads of gathered references: once their buffer holds
    the gathered elements, the kernel no longer reads these indices."""
    return {(r.statement, t) for r in refs for t in r.index_reads}


def _dimension(relation: isl.Map, k: int) -> isl.Map:
    """instance -> [a_k]: one subscript of an access."""
    n = relation.dim(isl.dim_type.out)
    return relation.project_out(isl.dim_type.out, k + 1, n - k - 1) \
        .project_out(isl.dim_type.out, 0, k).reset_tuple_id(isl.dim_type.out)


def _replace(tree, old, new):
    """tree with every occurrence of the subtree old replaced by new."""
    if tree == old:
        return new
    if isinstance(tree, tuple):
        return tuple(_replace(t, old, new) for t in tree)
    return tree


def _footprint(refs: Sequence[Reference], prefix: isl.UnionMap) -> isl.Map | None:
    """{prefix -> element} over the references."""
    out = None
    for r in refs:
        part = isl.UnionMap.from_map(r.relation).apply_domain(prefix)
        out = part if out is None else out.union(part)
    return isl.Map.from_union_map(out) if out is not None and not out.is_empty() else None


@attrs.frozen
class _Tile:
    """An array tile: element a of the footprint is at (a - offsets) / strides in the buffer."""

    offsets: isl.PwMultiAff  # {prefix -> tensor[...]}
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def _tile(footprint: isl.Map | None, context: isl.Set) -> _Tile | None:
    """The footprint's array tile, or None where no box of fixed size covers it. Along a
    dimension where every element the footprint has lies on one residue of a stride (a thread's
    share of a strided mapping: rows t, t + 16, t + 32, ...) the buffer keeps only those."""
    if footprint is None:
        return None
    footprint = footprint.intersect_params(context)
    n = footprint.dim(isl.dim_type.out)
    lows, sizes, strides = None, [], []
    for k in range(n):
        one = footprint.project_out(isl.dim_type.out, k + 1, n - k - 1) \
            .project_out(isl.dim_type.out, 0, k)
        lo = one.lexmin_pw_multi_aff()
        # the largest distance from the offset, over every prefix and parameter value
        distances = isl.Map.from_pw_multi_aff(lo).range_product(one).range().unwrap().deltas()
        extent = distances.dim_max_val(0)
        if not extent.is_int():
            return None
        stride = _stride(one)
        sizes.append(extent.to_python() // stride + 1)
        strides.append(stride)
        lows = lo if lows is None else lows.flat_range_product(lo)
    if lows is None:
        space = footprint.get_space()
        lows = isl.PwMultiAff.from_map(
            isl.Map.from_domain_and_range(footprint.domain(), isl.Set.universe(
                space.range())))
    tensor = footprint.get_tuple_id(isl.dim_type.out)
    return _Tile(lows.set_tuple_id(isl.dim_type.out, tensor), tuple(sizes), tuple(strides))


def _stride(one: isl.Map) -> int:
    """The stride of the footprint's single output dimension: 1 unless every element lies on
    one residue. isl's stride detection (in the isl islpy 2026.2 bundles) crashes in its simple
    hull on some unions of basic maps whose existentials differ (Halide fuzz seed 952801), so
    it only sees a footprint that coalesces into one; a union keeps stride 1, which is always
    a correct (if larger) buffer."""
    if one.n_basic_map() > 1:
        one = one.coalesce()
        if one.n_basic_map() > 1:
            return 1
    return max(one.get_range_stride_info(0).get_stride().to_python(), 1)


def _smaller(union_tile, a, b) -> bool:
    """Whether one box for both groups is smaller than their two boxes."""
    if union_tile is None or a is None or b is None:
        return False
    return math.prod(union_tile.sizes) < math.prod(a.sizes) + math.prod(b.sizes)


def _must_group(refs, fa: isl.Map | None, fb: isl.Map | None) -> bool:
    """References (of two groups, with footprints fa and fb) that touch a common element in
    one scope instance, one of them writing, must share a buffer (or both stay in global
    memory)."""
    if not any(r.write for r in refs):
        return False
    if not all(r.exact for r in refs):
        return True
    return fa is not None and fb is not None and not fa.intersect(fb).is_empty()


def _padded(sizes: tuple[int, ...], fragments: bool = False) -> tuple[int, ...]:
    """Rows of odd length, so that a warp reading a column hits 32 different banks. A tensor
    core operand of 16-bit elements (`fragments`) is read two neighbours at a time (32-bit
    words) by 8 rows x 4 pairs of lanes: its rows get a multiple of 8 elements plus 8, which
    keeps the pairs aligned and puts the 8 rows 4 words apart modulo 32 banks (conflict-free
    when the length is an odd multiple of 8)."""
    if fragments and len(sizes) >= 2:
        length = -(-sizes[-1] // 8) * 8
        return sizes[:-1] + (length + 8 if length // 8 % 2 == 0 else length,)
    if len(sizes) >= 2 and sizes[-1] % 2 == 0 and sizes[-1] > 1:
        return sizes[:-1] + (sizes[-1] + 1,)
    return sizes


def _reused(refs, prefix) -> bool:
    """Whether some element is used twice in one scope instance: by two instances of one
    reference (its map to [prefix -> element] is not injective), or by two references (their
    images meet). (With the thread ids as parameters, as in private promotion, that is per
    thread.) Checked reference by reference, so that the usual answer, yes, comes early."""
    images = []
    for r in refs:
        own = isl.UnionMap.from_map(r.relation)
        image = prefix.intersect_domain(own.domain()).range_product(own)
        if not image.is_injective():
            return True
        reached = image.range()
        if any(not reached.intersect(other).is_empty() for other in images):
            return True
        images.append(reached)
    return False


def _thread_private(refs, prefix, thread_map) -> bool:
    """No element the group touches in a scope instance is touched by two threads: with the
    thread ids made explicit (thread_map), [prefix -> element] -> thread is single-valued."""
    prefix = _forget_threads(prefix)
    out = None
    for r in refs:
        own = _forget_threads(isl.UnionMap.from_map(r.relation))
        part = prefix.intersect_domain(own.domain()).range_product(own).reverse() \
            .apply_range(thread_map)
        out = part if out is None else out.union(part)
    return out is None or out.is_single_valued()


def _other_threads_elsewhere(refs, thread_map, outside_refs: dict, outside_threads,
                             tensor: str) -> bool:
    """Whether an element a thread writes in the scope (refs: the scope's references to the
    tensor) is accessed by another thread in another instance of the scope or outside it
    (outside_refs, with outside_threads). A thread's copy-out writes it at the end of the scope
    instance, after the barriers inside the scope that ordered the original write before those
    accesses, and with no barrier between scope instances (fuzz seed 200: a copy-out in one
    iteration of a loop around the scope, a copy-in of another thread in the next)."""
    written = _element_threads([r for r in refs if r.write], thread_map)  # element -> thread
    touched = _element_threads(refs, thread_map)
    if outside_refs.get(tensor):
        touched = touched.union(_element_threads(outside_refs[tensor], outside_threads))
    pairs = written.reverse().apply_range(touched)  # thread -> thread, same element
    return not pairs.subtract(pairs.domain().identity()).is_empty()


def _element_threads(refs, thread_map) -> isl.UnionMap:
    """{element -> thread} of the references (thread ids explicit through thread_map)."""
    return _union_maps_of(_forget_threads(isl.UnionMap.from_map(r.relation)).reverse()
                          .apply_range(thread_map) for r in refs)


def _live_in(refs, prefix, scop: Scop) -> isl.Map | None:
    """{prefix -> element} read in a scope instance before the instance writes it: what a
    copy-in must bring (the program order decides "before"; the schedule respects it).
    Statements run in order, so a write runs before a read where its statement comes first,
    or where it is the same statement and the write's instance comes first."""
    reads = [r for r in refs if not r.write]
    if not reads:
        return None
    position = {s.name: k for k, s in enumerate(scop.statements)}
    order = scop.schedule.get_map()
    needed = None
    for r in reads:
        read = isl.UnionMap.from_map(r.relation)
        pairs = read.wrap()  # [instance -> element]
        where = read.domain_map().apply_range(prefix)  # [i -> a] -> p
        written = None
        for same_statement in (False, True):
            writes = [w for w in refs if w.write and (
                w.statement == r.statement if same_statement
                else position[w.statement] < position[r.statement])]
            if not writes:
                continue
            relation = _union_maps([w.relation for w in writes])
            # [instance -> element] -> writer instance, same element and prefix
            hit = read.range_map().apply_range(relation.reverse()).intersect(
                where.apply_range(prefix.intersect_domain(relation.domain()).reverse()))
            if same_statement:  # and earlier
                earlier = order.intersect_domain(read.domain()).lex_gt_union_map(
                    order.intersect_domain(relation.domain()))
                hit = hit.intersect(read.domain_map().apply_range(earlier))
            written = hit.domain() if written is None else written.union(hit.domain())
        if written is not None:
            pairs = pairs.subtract(written)
        part = pairs.unwrap().apply_domain(prefix)
        needed = part if needed is None else needed.union(part)
    return isl.Map.from_union_map(needed) if not needed.is_empty() else None


def _union_maps(maps) -> isl.UnionMap:
    return _union_maps_of(map(isl.UnionMap.from_map, maps))


def _union_maps_of(union_maps) -> isl.UnionMap:
    return functools.reduce(isl.UnionMap.union, union_maps)


def _offsets_pma(offsets: tuple, footprint: isl.Map) -> isl.PwMultiAff:
    """The tile offsets as one {prefix -> tensor[...]} (a rank-0 tensor's is {prefix -> T[]})."""
    if not offsets:
        return isl.PwMultiAff.from_map(
            isl.Map.from_domain_and_range(footprint.domain(), footprint.range()))
    out = None
    for pa in offsets:
        single = isl.PwMultiAff.from_pw_aff(pa)
        out = single if out is None else out.flat_range_product(single)
    return out.set_tuple_id(isl.dim_type.out, footprint.get_tuple_id(isl.dim_type.out))


# -- coalescing -----------------------------------------------------------------------------------

def _coalesced(ref: Reference, leaves) -> bool:
    """Whether instances on consecutive x threads, all else equal, access consecutive elements
    of the last dimension (a statement on no thread-mapped band is never coalesced)."""
    if not ref.exact or ref.relation.dim(isl.dim_type.out) == 0:
        return False
    for leaf in leaves:
        # the leaf's instances, for all threads at once
        mine = isl.UnionSet.from_set(ref.relation.domain()).intersect(
            _forget_threads(leaf.domain))
        if mine.is_empty():
            continue
        if leaf.x is None:
            return False
        schedule = _forget_threads(leaf.schedule).intersect_domain(mine)
        n, x = leaf.depth, leaf.x
        v = [f"v{k}" for k in range(n)]
        w = [f"v{k} + 1" if k == x else f"v{k}" for k in range(n)]
        step = isl.UnionMap(f"{{ [{', '.join(v)}] -> [{', '.join(w)}] }}")
        access = schedule.reverse().apply_range(isl.UnionMap.from_map(ref.relation))
        pairs = access.reverse().apply_range(step).apply_range(access)
        rank = ref.relation.dim(isl.dim_type.out)
        unit = isl.UnionSet(f"{{ {ref.relation.get_tuple_name(isl.dim_type.out)}"
                            f"[{', '.join(['0'] * (rank - 1) + ['1'])}] }}")
        if not pairs.deltas().is_subset(unit):
            return False
    return True


# -- the tree -------------------------------------------------------------------------------------

def _find(node: isl.ScheduleNode, mark: str, path=()) -> list[tuple[int, ...]]:
    """The paths of the marks whose names start with `mark`, outermost ones only."""
    if node.get_type() == _T.mark and node.mark_get_id().get_name().startswith(mark):
        return [path]
    out = []
    for i in range(node.n_children()):
        out += _find(node.child(i), mark, path + (i,))
    return out


def _node_at(schedule: isl.Schedule, path) -> isl.ScheduleNode:
    node = schedule.get_root()
    for i in path:
        node = node.child(i)
    return node


def _kernel_below(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The kernel mark at node or down its chain of single children."""
    while not (node.get_type() == _T.mark and node.mark_get_id().get_name().startswith(KERNEL)):
        node = node.child(0)
    return node


def _descend(kernel: isl.ScheduleNode, depth: int | None) -> isl.ScheduleNode:
    """The scope that `depth` asks for at a kernel mark: where `depth` band members lie above,
    between the block-mapped members (blocks cannot share a buffer) and the first thread mark
    or branching below; None: the mark's child, below the whole tile band. Where the
    block-mapped band is also mapped to threads (an untiled band), the thread mark above it."""
    above, outermost = kernel.parent(), None
    while True:
        if above.get_type() == _T.mark and above.mark_get_id().get_name().startswith(THREADS):
            outermost = above
        if not above.has_parent():
            break
        above = above.parent()
    if outermost is not None:
        return outermost
    if depth is not None and depth < kernel.get_schedule_depth():
        return _ascend(kernel, depth)
    node = kernel.child(0)
    while depth is not None and node.get_schedule_depth() < depth:
        kind = node.get_type()
        if kind == _T.mark and node.mark_get_id().get_name().startswith(THREADS) \
                or kind == _T.extension:
            break
        if kind == _T.band:
            room = depth - node.get_schedule_depth()
            if room < node.band_n_member():
                node = node.band_split(room)
            node = node.child(0)
        elif node.n_children() == 1:
            node = node.child(0)
        else:
            break
    return node


def _depth_note(memory: str, asked: int, placed: int) -> OptionNote:
    option = call("sharedDepth" if memory == "shared" else "privateDepth", [asked])
    if asked > placed:
        why = (f"below depth {placed} the loops run on threads or the tree branches, so "
               f"{memory} memory is promoted at depth {placed}")
    else:
        why = (f"blocks cannot share a buffer, so {memory} memory is promoted below the "
               f"block-mapped loops, at depth {placed}")
    return OptionNote(option, why)


def _ascend(kernel: isl.ScheduleNode, depth: int) -> isl.ScheduleNode:
    """A scope above the kernel mark, within the tile band right above it (split there if
    needed), never above the block-mapped members the mark's name counts."""
    chain = []  # the bands right above the mark (the tile band, split or not), innermost first
    node = kernel.parent()
    while node.get_type() == _T.band:
        chain.append(node)
        node = node.parent()
    if not chain:
        return kernel.child(0)
    blocked = int(kernel.mark_get_id().get_name()[len(KERNEL):] or 0)
    target = max(depth, chain[-1].get_schedule_depth() + blocked)
    for band in chain:
        start = band.get_schedule_depth()
        if start == target:
            return band
        if start < target < start + band.band_n_member():
            return band.band_split(target - start).child(0)
    return kernel.child(0)

@attrs.frozen
class _Leaf:
    domain: isl.UnionSet  # the statement instances reaching it (thread ids as parameters)
    schedule: isl.UnionMap  # instance -> its prefix schedule at the leaf
    depth: int  # band members above it
    x: int | None  # position of the member on threadIdx.x in that schedule


def _leaves(scope: isl.ScheduleNode) -> list[_Leaf]:
    """The leaves below scope, with domains and schedules computed by walking the tree: isl
    cannot compute them below the extension nodes of barriers."""
    out = []

    def walk(n, domain, schedule, depth, x):
        kind = n.get_type()
        if kind == _T.mark:
            name = n.mark_get_id().get_name()
            if name.startswith(THREADS):
                x = depth + int(name[len(THREADS):])
        elif kind == _T.filter:
            domain = domain.intersect(n.filter_get_filter())
            schedule = schedule.intersect_domain(domain)
        elif kind == _T.band:
            partial = isl.UnionMap.from_multi_union_pw_aff(n.band_get_partial_schedule())
            schedule = schedule.flat_range_product(partial.intersect_domain(domain))
            depth += n.band_n_member()
        elif kind == _T.leaf:
            out.append(_Leaf(domain, schedule, depth, x))
        for i in range(n.n_children()):
            walk(n.child(i), domain, schedule, depth, x)

    if scope.get_type() == _T.domain:  # (the root: what reaches it is nothing, it holds all)
        domain = scope.domain_get_domain()
        walk(scope, domain, isl.UnionMap.from_domain(domain), 0, None)
        return out
    domain = scope.get_domain()
    walk(scope, domain, scope.get_prefix_schedule_union_map().intersect_domain(domain),
         scope.get_schedule_depth(), None)
    return out


def _forget_threads(domain):
    """A union set or map with its thread-id parameters projected out."""
    for t in THREAD_IDS:
        pos = domain.get_space().find_dim_by_name(isl.dim_type.param, t)
        if pos >= 0:
            domain = domain.project_out(isl.dim_type.param, pos, 1)
    return domain


def _has_thread_ids(domain: isl.UnionSet) -> bool:
    space = domain.get_space()
    return any(space.find_dim_by_name(isl.dim_type.param, t) >= 0 for t in THREAD_IDS)


def _thread_map(domain: isl.UnionSet) -> isl.UnionMap:
    """instance -> [t0, t1, t2] from a domain constrained by thread-id parameters."""
    out = None
    sets = []
    domain.foreach_set(sets.append)
    for s in sets:
        m = isl.Map.from_domain(s)
        for k, t in enumerate(THREAD_IDS):
            pos = m.find_dim_by_name(isl.dim_type.param, t)
            if pos < 0:  # not used by the kernel: always 0
                m = m.insert_dims(isl.dim_type.out, k, 1).fix_val(isl.dim_type.out, k, 0)
            else:
                m = m.move_dims(isl.dim_type.out, k, isl.dim_type.param, pos, 1)
        part = isl.UnionMap.from_map(m)
        out = part if out is None else out.union(part)
    return out


def _runs_in_loop(node, domain, context) -> bool:
    """Whether the prefix above node takes several values within one block."""
    prefix = node.get_prefix_schedule_union_map().intersect_domain(domain)
    values = prefix.range().intersect_params(context)
    if values.is_empty():
        return False
    values = isl.Set.from_union_set(values)
    return not values.lexmin().is_equal(values)


def _last_in_sequence(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """After grafting, node sits in a sequence (filter -> node); its last element's subtree."""
    seq = node.parent().parent()
    return seq.child(seq.n_children() - 1).child(0)


def _strip_marks(node: isl.ScheduleNode) -> isl.ScheduleNode:
    if node.get_type() == _T.mark:
        node = node.delete()
        return _strip_marks(node)
    for i in range(node.n_children()):
        node = _strip_marks(node.child(i)).parent()
    return node
