"""What each mapping option did to one compiled kernel, in a few lines a user comparing
schedules can read: which loops were tiled, which loop went to each block and thread index,
what was promoted (and why not), what was unrolled, why each barrier is there, and which
options had no effect and why (`Kernel.explain()`, `tcstage show --explain`).

Only facts the passes recorded are used (Tiled, Mapped, Promoted, the OptionNotes); loops are
named by the TC index names of the statements' iterators (`kk`, not Halide's `C_r$x`).
"""

from __future__ import annotations

import functools

import islpy as isl

from tcstage.options import MappingOptions
from tcstage.poly.count import elements
from tcstage.poly.notes import NO_EFFECT
from tcstage.poly.schedule import UNBOUNDED, member_map, outermost_bands, value_count

WIDTH = 22  # the option column
_XYZ = "xyz"


def explain(compiled, device=None, resources: dict | None = None) -> str:
    """A per-option account of what the compiler made of `compiled.options`, then how the
    launch would use `device` (a tune.model.Device, default the H100; `resources`: ptxas's
    figures, tcstage.cuda.nvcc.resources, else the cost model's estimates); for a kernel
    sequence, why it is one, then each launch's account."""
    from tcstage.tune import model  # (the cost model imports the compiler's passes)
    device = device or model.H100
    parts = compiled.launches or (compiled,)
    try:
        prediction = model.predict(compiled, device, resources)
        predictions = prediction.launches or (prediction,)
    except Exception as e:  # (a report: the mapping's account stands without the model's)
        predictions = [f"the cost model cannot predict this kernel ({type(e).__name__}: {e})"
                       ] * len(parts)
    accounts = [_Explainer(p).text() + "\n" + gpu_use(p, own, device, resources is not None)
                for p, own in zip(parts, predictions)]
    if not compiled.launches:
        return accounts[0]
    n = len(compiled.launches)
    head = (f"kernel sequence of {n} launches for '{compiled.fn.name}': as one kernel, the "
            "dependences between its statements would keep the loops they cross from blocks "
            "(blocks cannot wait for each other) and leave half or fewer of the blocks the "
            "launches get apart; each launch runs after the last, its results in global memory")
    return "\n\n".join([head] + [f"launch {k}:\n{a}" for k, a in enumerate(accounts)])


def gpu_use(compiled, prediction, device, from_ptxas: bool) -> str:
    """Static facts of one launch on `device`, for reading without a GPU: its blocks against
    the SMs, threads per block, occupancy and what limits it, the bytes it moves from DRAM
    against the least its tensors need, and the cost model's bound."""
    if isinstance(prediction, str):
        return _row(f"GPU use ({device.name})", prediction)
    p = prediction
    busy = min(p.blocks, device.sms)
    per_sm = p.blocks / device.sms
    registers = f"{p.registers} registers per thread ({'ptxas' if from_ptxas else 'estimated'})"
    least = least_bytes(compiled)
    moved = (f"{_bytes(p.dram_bytes)} from DRAM against the {_bytes(least)} its tensors hold "
             f"({p.dram_bytes / least:.2g}x)" if least else f"{_bytes(p.dram_bytes)} from DRAM")
    return "\n".join([
        _row(f"GPU use ({device.name})",
             f"{p.blocks} block{'s' if p.blocks != 1 else ''} on {device.sms} SMs: {busy} SMs busy"
             f" ({100 * busy / device.sms:.0f}%), {per_sm:.2g} blocks per SM, {p.waves} "
             f"wave{'s' if p.waves != 1 else ''}; {p.threads_per_block} threads per block"),
        _row("", f"occupancy {p.occupancy:.2f} where blocks are resident (up to {p.blocks_per_sm} "
                 f"per SM with "
                 f"{registers} and {p.shared_bytes} B of shared memory per block)"),
        _row("", f"{moved}; {p.bound} bound, {p.time * 1e6:.3g} us predicted (cost model)")])


def least_bytes(compiled) -> int:
    """Bytes of the tensor elements the launch reads or writes, each once: what any schedule
    moves at least (0 where the count needs sizes the kernel leaves dynamic). Overlapped
    tiles' intermediates live in shared memory alone: none of theirs."""
    touched: dict[str, isl.Set] = {}
    scratch = compiled.overlap.scratch if compiled.overlap is not None else frozenset()
    for s in compiled.scop.statements:
        for a in (s.write, *s.reads):
            if a.tensor in scratch:
                continue
            r = a.relation.range()
            touched[a.tensor] = touched[a.tensor].union(r) if a.tensor in touched else r
    total = 0
    for tensor, points in touched.items():
        if points.dim(isl.dim_type.param) and \
                not points.params().is_singleton():
            return 0
        t = compiled.lowered.fn.tensors.get(tensor)
        itemsize = max(t.type.bits // 8, 1) if t is not None else 4
        total += elements(points) * itemsize
    return total


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


class _Explainer:
    def __init__(self, c):
        self.c, self.o, self.m, self.p = c, c.options, c.mapped, c.promoted
        self.rows: list[tuple[str, str]] = []
        self.no_effect: list[tuple[str, str]] = []
        # statement name -> {isl iterator: TC index name}
        self.loop_names = {}
        for s in c.scop.statements:
            tc = c.lowered.var_names[s.tc_statement]
            self.loop_names[s.name] = [tc.get(h, h) for h in s.halide_iterators]
        self.writes = {s.name: s.tensor for s in c.scop.statements}
        self.order = {s.name: k for k, s in enumerate(c.scop.statements)}
        if c.overlap is not None:  # a tile coordinate: the tiles of an output dimension
            kept = next(s for s in c.scop.statements if s.tensor not in c.overlap.scratch)
            pure = [n for n, i in zip(self.loop_names[kept.name][len(c.tiled.tiled_members):],
                                      kept.iterators[len(c.tiled.tiled_members):])
                    if i not in kept.reduction_vars]
            tiles = {f"_tile_{t}": f"{pure[k]} tiles" if k < len(pure) else f"tiles {k}"
                     for t, k in zip(kept.iterators, c.tiled.tiled_members)}
            self.loop_names = {n: [tiles.get(h, loop) for h, loop in zip(s.halide_iterators,
                                                                             names)]
                               for (n, names), s in zip(self.loop_names.items(),
                                                        c.scop.statements)}

    # -- naming ------------------------------------------------------------------------------
    def name(self, loop: isl.UnionMap) -> str:
        """The TC loop(s) a band member runs over: 'n'; 'n (of Mx) and c (of E, Y)' where the
        statements it spans call it differently; 'kh+kw' where it combines loops."""
        found: list[tuple[int, str, str]] = []  # (statement order, loop text, tensor)

        def piece(m: isl.Map) -> None:
            statement = m.get_tuple_name(isl.dim_type.in_)
            names = self.loop_names.get(statement, [])
            order = self.order.get(statement, len(self.order))
            pa = isl.PwMultiAff.from_map(m).get_at(0)

            def aff(_, a: isl.Aff) -> None:
                involved = [n for i, n in enumerate(names)
                            if a.involves_dims(isl.dim_type.in_, i, 1)]
                if involved:
                    found.append((order, "+".join(involved), self.writes.get(statement, "?")))
            pa.foreach_piece(aff)
        loop.foreach_map(piece)
        tensors: dict[str, list[str]] = {}
        for _, text, tensor in sorted(found):
            tensors.setdefault(text, []).append(tensor)
        if len(tensors) <= 1:
            return next(iter(tensors), "(a constant)")
        return " and ".join(f"{text} (of {', '.join(dict.fromkeys(ts))})"
                            for text, ts in tensors.items())

    def statements(self, names) -> str:
        return ", ".join(f"{s} (writes {self.writes.get(s, '?')})" for s in names)

    # -- the text ----------------------------------------------------------------------------
    def text(self) -> str:
        c, m = self.c, self.m
        sizes = ", ".join(f"{k}={v}" if k not in c.dynamic else f"{k} dynamic (now {v})"
                          for k, v in c.binding.sizes.items())
        threads, blocks = _prod(m.block), _prod(m.grid)
        head = (f"kernel {c.cuda.name} for {sizes or 'no sizes'}: grid {m.grid} x block "
                f"{m.block} = {threads} thread{'s' if threads != 1 else ''}, {blocks} "
                f"block{'s' if blocks != 1 else ''}")
        lines = [head]
        if self.o == MappingOptions():
            lines.append("one thread in one block: no mapping options given "
                         "(every loop runs sequentially in thread 0 of block 0)")
        self.outer_loops()
        for method, args in self.o.calls():
            handler = getattr(self, f"on_{method}", None)
            if method in NO_EFFECT:  # (its note, with the call, comes with the others')
                continue
            if handler is not None:
                handler(args)
        self.barriers()
        self.reductions()
        named = {option for option, _ in self.no_effect}
        for note in c.notes:
            if note.option not in named:
                self.no_effect.append((note.option, note.why))
        lines += [_row(label, text) for label, text in self.rows]
        if self.no_effect:
            lines.append(_row("no effect", "; ".join(f"{o}: {why}" for o, why in self.no_effect)))
        return "\n".join(lines)

    def reductions(self) -> None:
        """Reductions split across threads (parallelReductions)."""
        ops = {"add": "+", "mul": "*", "min": "min", "max": "max"}
        for r in self.m.reductions:
            red = r.reduction
            across = "" if r.across is None else (
                f", and across {r.across[1]} blocks on blockIdx.{'xyz'[r.across[0]]}: each "
                "block's thread 0 stores its value in a scratch slot, and the last block to "
                f"finish combines the slots in block order into {red.tensor}")
            self.rows.append(("parallelReductions", (
                f"the {ops[red.operator]} reduction into {red.tensor} ({red.statement}) is split "
                f"over {r.threads} threads on threadIdx.x: each thread accumulates its share "
                f"in a register, then warp shuffles and shared memory combine the block's, and "
                f"thread 0 adds it to {red.tensor}{across} (floating-point sums are "
                "reassociated)")))

    def outer_loops(self) -> None:
        """The loops of the outermost band(s) before tiling, for the tile line."""
        bands = outermost_bands(self.c.schedule)
        self.bands = len(bands)
        # member k over every band that has one (the first band may be a one-loop
        # initialisation: "member 1" was all the tile line could say of the others' loops)
        self.band_loops = [
            self.name(functools.reduce(isl.UnionMap.union, [
                member_map(b, k) for b in bands if b.band_n_member() > k]))
            for k in range(max((b.band_n_member() for b in bands), default=0))]

    # -- one method per option ---------------------------------------------------------------
    def on_tile(self, args) -> None:
        t = self.c.tiled
        if not t.tiled_members:
            if not any(note.option.startswith("tile(") for note in self.c.notes):
                self.no_effect.append((_call("tile", args), "no loop of the outermost band "
                                       "got a size other than 0"))
            return
        names = [self.band_loops[k] if k < len(self.band_loops) else f"member {k}"
                 for k in t.tiled_members]
        untiled = [n for k, n in enumerate(self.band_loops) if k not in t.tiled_members]
        where = "the outer band" if self.bands == 1 else \
            f"each of the {self.bands} groups' outer bands"
        text = f"tiles loops {', '.join(names)} of {where} by {' x '.join(map(str, t.tile_sizes))}"
        if self.c.overlap is not None:
            kept = sorted({s.tensor for s in self.c.scop.statements} - self.c.overlap.scratch)
            text = (f"tiles the elements of {', '.join(kept)} by "
                    f"{' x '.join(map(str, t.tile_sizes))} (overlapped tiles: {', '.join(names)})")
        if self.m.block_loops:
            text += " (tile loops -> blocks, point loops -> threads)"
        if untiled:
            text += f"; {', '.join(untiled)} not tiled"
        self.rows.append((_call("tile", args), text))

    def on_tileImperfectlyNested(self, args) -> None:
        if not self.c.tiled.tiled_members:
            self.no_effect.append(("tileImperfectlyNested", "nothing was tiled"))
            return
        self.rows.append(("tileImperfectlyNested", "point loops that no dependence crosses sink "
                          "below the loops nested inside them (e.g. a reduction runs once per "
                          "tile, outside the points)"))

    def on_mapToBlocks(self, args) -> None:
        m = self.m
        if not m.block_loops:
            if not any(note.option.startswith("mapToBlocks") for note in self.c.notes):
                self.no_effect.append((_call("mapToBlocks", args), "no loop can be mapped to "
                                       "blocks (a dependence crosses it, or some statement "
                                       "lies outside every band)"))
            return
        parts = []
        for d, loop in enumerate(m.block_loops):
            values = value_count(loop)
            tiles = "tiles" if self.c.tiled.tiled_members else "values"
            kind = "tile loop over " if self.c.tiled.tiled_members and d == 0 else ""
            loops = f", each block runs {_per(values, m.grid[d])}" if values > m.grid[d] else ""
            parts.append(f"blockIdx.{_XYZ[d]} <- {kind}{self.name(loop)} "
                         f"({_count(values)} {tiles}{loops})")
        used = m.grid[:len(m.block_loops)]
        text = ", ".join(parts) + f"; asked {' x '.join(map(str, args))}, " \
            f"{' x '.join(map(str, used))} used"
        if any(u < a for u, a in zip(used, args)):
            text += " (the iteration space has no more)"
        self.rows.append((_call("mapToBlocks", args), text))

    def on_mapToThreads(self, args) -> None:
        m = self.m
        if not m.thread_loops:
            if not any(note.option.startswith("mapToThreads") for note in self.c.notes):
                self.no_effect.append((_call("mapToThreads", args), "no loop can be split "
                                       "across threads (each carries a dependence, such as a "
                                       "reduction, or takes a single value)"))
            return
        parts = []
        for d, loop in enumerate(m.thread_loops):
            values = value_count(loop)
            per = " per tile" if self.c.tiled.tiled_members else ""
            loops = f", each thread runs {_per(values, m.block[d])}" \
                if values > m.block[d] else ""
            parts.append(f"threadIdx.{_XYZ[d]} <- {self.name(loop)} "
                         f"({_count(values)} values{per}{loops})")
        used = m.block[:len(m.thread_loops)]
        text = ", ".join(parts) + f"; asked {' x '.join(map(str, args))}, " \
            f"{' x '.join(map(str, used))} used"
        if any(u < a for u, a in zip(used, args)):
            text += " (the loops have fewer values)"
        if m.thread_bands > 1:
            text += f"; {m.thread_bands} bands mapped alike"
        self.rows.append((_call("mapToThreads", args), text))

    def _promotion(self, memory: str, option: str) -> None:
        made = [p for p in self.p.promotions if p.memory == memory]
        declined = [why[len(memory) + 1:] for why in self.p.declined
                    if why.startswith(f"{memory} ")]
        declined += [why for why in self.p.declined if why.startswith("everything")]
        if not made:
            why = "; ".join(declined) or "no tensor has a tile to promote here"
            self.no_effect.append((option, f"nothing promoted ({why})"))
            return
        parts = []
        for p in made:
            copies = " and ".join(c for c, n in (("copied in", p.copy_in),
                                                 ("copied out", p.copy_out)) if n) or "no copies"
            dims = "".join(f"[{d}]" for d in p.padded)
            per = " per thread" if memory == "private" else " per block"
            parts.append(f"{p.tensor}: {' x '.join(map(str, p.sizes)) or '1'} tile in "
                         f"{p.buffer}{dims} {p.dtype} ({p.nbytes} bytes{per}), {copies}")
        parts += [f"not promoted: {why}" for why in declined]
        self.rows.append((option, "; ".join(parts)))

    def on_useSharedMemory(self, args) -> None:
        self._promotion("shared", "useSharedMemory")

    def on_usePrivateMemory(self, args) -> None:
        self._promotion("private", "usePrivateMemory")

    def on_maxSharedMemory(self, args) -> None:
        if not self.o.use_shared_memory:
            self.no_effect.append((_call("maxSharedMemory", args),
                                   "has no effect without useSharedMemory(True)"))
            return
        used = self.c.shared_bytes
        self.rows.append((_call("maxSharedMemory", args),
                          f"shared memory budget {min(args[0], 48 * 1024)} bytes per block; "
                          f"{used} used"))

    def on_sharedDepth(self, args) -> None:
        self._depth("sharedDepth", args, self.o.use_shared_memory)

    def on_privateDepth(self, args) -> None:
        self._depth("privateDepth", args, self.o.use_private_memory)

    def _depth(self, option, args, used) -> None:
        if used and not any(n.option == _call(option, args) for n in self.c.notes):
            self.rows.append((_call(option, args), f"promotion scope below {args[0]} band "
                              "member(s): one copy per value of the loops above"))

    def on_unroll(self, args) -> None:
        m, n = self.m, args[0]
        # (loops of one iteration per thread, a statement's constant member, "unroll" for free:
        # only the others count as unrolled)
        unrolled = [(loop, trips) for loop, trips in m.unrolled_loops if trips > 1]
        if unrolled:
            loops = ", ".join(f"{self.name(loop)} ({trips} per thread)" for loop, trips in unrolled)
            text = f"unrolled {len(unrolled)} loop{'s' if len(unrolled) > 1 else ''}: {loops}"
            stops = [f"{self.name(loop)} ({_count(trips)} iterations x {copies} copies > {n})"
                     for loop, trips, copies in m.unroll_stops if copies > 1]
            if stops:
                text += f"; stopped at {', '.join(stops)}"
            self.rows.append((_call("unroll", args), text))
            return
        stops = [f"{self.name(loop)} runs {_count(trips)} times per thread"
                 for loop, trips, _ in m.unroll_stops if trips > n]
        why = f"nothing unrolled: the innermost loop {' and '.join(stops)}, more than {n}" \
            if stops else "nothing unrolled: no loop runs more than once in a thread (the " \
            "loops left are mapped to threads and blocks, or have one value)"
        self.no_effect.append((_call("unroll", args), why))

    def on_unrollCopyShared(self, args) -> None:
        if not any(p.memory == "shared" for p in self.p.promotions):
            self.no_effect.append(("unrollCopyShared", "no copies to shared memory"))
        else:
            self.rows.append(("unrollCopyShared", "the loops of the copies to and from shared "
                              "memory are unrolled"))

    def on_useRegisterTiling(self, args) -> None:
        if not self.m.thread_loops:
            self.no_effect.append(("useRegisterTiling", "no loop is mapped to threads"))
            return
        private = any(p.memory == "private" for p in self.p.promotions)
        self.rows.append(("useRegisterTiling", "loops threads do not split (a reduction) run "
                          "outside each thread's points" + (
                              "; private scope just below the blocks" if private else "")))

    def on_useTensorCores(self, args) -> None:
        """(a kernel that cannot use them has a note saying why, among the notes)"""
        for tile in getattr(self.c, "tensor_tiles", ()):
            c = tile.contraction
            names = self.loop_names.get(c.statement, [])
            loop = dict(zip(next(s.iterators for s in self.c.scop.statements
                                 if s.name == c.statement), names))
            m, n, k = (loop.get(v, v) for v in tile.dims[:3])
            rows = " x ".join(map(str, tile.sizes))
            windows = [loop.get(v, v) for v in tile.dims[3:3 + tile.looped]]
            self.rows.append(("useTensorCores", (
                f"{c.accumulator} += {c.a.text} * {c.b.text} ({c.statement}) runs on tensor "
                f"cores: tiles of at most {rows} (rows {m}, columns {n}, reduction {k}"
                + (f", calls looping over {', '.join(windows)}" if windows else "")
                + f") as mma.sync.m16n8k16 steps of the block's warps, {c.dtype} operands, "
                "float32 accumulators in registers")))

    def on_overlappedTiles(self, args) -> None:
        overlap = self.c.overlap
        if not args[0] or overlap is None:
            return  # (its note says why, with the others)
        kept = sorted({s.tensor for s in self.c.scop.statements} - overlap.scratch)
        again = "; ".join(f"{self.writes.get(s, '?')} ({s}) {run / max(1, own):.2f}x"
                          for s, run, own in overlap.work if run != own) or "nothing"
        self.rows.append(("overlappedTiles", (
            f"each block computes in shared memory the part of {', '.join(sorted(overlap.scratch))}"
            f" that its tile of {', '.join(kept)} needs, halo included; instances run over "
            f"those the statements have: {again} (the launch: {overlap.recompute:.2f}x)")))

    def on_useReadOnlyCache(self, args) -> None:
        inputs = [n for n, t in self.c.fn.checked.tensors.items() if t.kind == "input"
                  and n not in self.writes.values() and not t.type.name == "bool"]
        if "__ldg(" not in self.c.cuda.source:
            self.no_effect.append(("useReadOnlyCache", "no load of a read-only input is left "
                                   "in global memory"))
        else:
            self.rows.append(("useReadOnlyCache", f"global loads of {', '.join(inputs)} go "
                              "through __ldg (the read-only data cache)"))

    def _fusion(self, method, args) -> None:
        groups = f"one outer band over loops {', '.join(self.band_loops)}" if self.bands == 1 \
            else f"{self.bands} groups of statements with no common loop"
        self.rows.append((_call(method, [f'"{a.name}"' for a in args]),
                          f"the isl scheduler's fusion: {groups}"))

    def on_scheduleFusionStrategy(self, args) -> None:
        self._fusion("scheduleFusionStrategy", args)

    def on_outerScheduleFusionStrategy(self, args) -> None:
        self._fusion("outerScheduleFusionStrategy", args)

    def on_outerScheduleAllowSkewing(self, args) -> None:
        self.rows.append(("outerScheduleAllowSkewing", "schedule coefficients not limited to 1 "
                          "(loops may be skewed)"))

    def _specialize(self, option) -> None:
        sizes = ", ".join(f"{k}={v}" for k, v in self.c.binding.sizes.items())
        self.rows.append((option, f"the scheduler saw the sizes ({sizes}), not symbols"))

    def on_scheduleSpecialize(self, args) -> None:
        self._specialize("scheduleSpecialize")

    def on_fixParametersBeforeScheduling(self, args) -> None:
        self._specialize("fixParametersBeforeScheduling")

    # -- barriers ----------------------------------------------------------------------------
    def barriers(self) -> None:
        count = self.m.syncs + self.p.syncs
        if not count:
            return
        parts = []
        for kind, statements in self.m.barriers:
            if kind == "after":
                parts.append(f"after {self.statements(statements)} (a later statement uses "
                             "what other threads wrote)")
            else:
                parts.append("at the end of each iteration of the loop around "
                             f"{self.statements(statements)} (the next iteration uses what "
                             "other threads wrote)")
        for why, tensors in self.p.barriers:
            names = ", ".join(tensors)
            parts.append({
                "before copy-in": f"before the copy-in of {names} (other threads wrote them "
                                  "earlier in the kernel)",
                "after copy-in": f"after the copy-in of {names} (threads read what others "
                                 "copied)",
                "before copy-out": f"before the copy-out of {names} (threads copy what others "
                                   "computed)",
                "after copy-out": f"after the copy-out of {names} (statements outside the "
                                  "scope read them)",
                "loop": f"after the promoted scope of {names}, which runs in a loop (the next "
                        "copy-in overwrites the buffers)",
            }.get(why, why))
        self.rows.append(("barriers", f"{count} __syncthreads(): " + "; ".join(parts)))


def _row(label: str, text: str) -> str:
    """A row of the table: the label in its column, or, where it is too long for it, alone on
    a line with the text below it in the column (long option calls kept the table aligned)."""
    if len(label) < WIDTH - 1:
        return f"{label:<{WIDTH - 1}} {text}"
    return f"{label}\n{' ' * WIDTH}{text}"


def _call(name: str, args) -> str:
    return f"{name}({', '.join(map(str, args))})"


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _count(values) -> str:
    """A loop's number of values; one that grows with a dynamic size has none fixed."""
    return "a dynamic number of" if values == UNBOUNDED else str(values)


def _per(values, n: int) -> str:
    """ceil(values / n): the iterations per block or thread of a loop split n ways."""
    return "ceil(that / " + str(n) + ")" if values == UNBOUNDED else str(-(-values // n))
