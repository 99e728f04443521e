"""The structure-aware CPU scheduler: a Halide schedule for each Func from what it computes.

`schedule_pipeline` takes a pipeline's Funcs (fresh, unscheduled ones: a lowered TC function's,
or a copy of a Halide pipeline's), a `CpuSchedule` and the sizes to plan for, schedules every
Func with Halide's scheduling API, and returns the Funcs the pipeline should realize (an output
that is a reduction is realized through its tile wrapper). A TC's Func outside the families
(a scatter, several reductions into one tensor) is computed once, definition by definition
(`_each_update`); a Halide pipeline with one beside a reduction is refused (`NotScheduled`),
and the caller then uses an autoscheduler.

The schedule of a reduction `R(p0, p1, ...) op= f(reads)` (p0 innermost, all sizes from the
plan):

- an *anchor*, the wrapper `R.in_()` that every reader of R reads, computes R's values tile by
  tile. Its tiles are `V*vectors` wide in p0, split with ShiftInwards (the last tile overlaps
  the one before it, so no tile reaches beyond the tensor), and `rows` high in p1, split with
  GuardWithIf (the last row of tiles computes the rows there are, for any batch size);
- R is computed per tile, with the tile's accumulators held in vector registers: p0 vectorised,
  the rest of the tile unrolled, the reduction loops outside them. Its epilogue (bias, relu)
  runs on the tile while it is still in registers. A small window (pooling) gets a small tile;
- a read whose p0 subscript is not its innermost one (`B(n, k)` when n is vectorised) would
  need a gather per vector; it is packed instead: copied, transposed, into a contiguous panel
  per column of tiles (`Func.in_()` with its storage reordered), which every row of tiles then
  reuses;
- the outermost loop runs in parallel.

A reduction along rows (a row sum: its input contiguous in the reduction, no second output
dimension to reuse a packed panel) vectorises its reduction loop instead (`_row_reduction`).
Pointwise Funcs that are outputs, or that reductions read, are computed once (vectorised,
parallel); the others are inlined into their readers.

A Halide pipeline of pointwise Funcs and window reductions (no contraction) gets the stencil
family instead (`_stencil_schedule`): line buffers in parallel strips of rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import halide as hl

from tcstage.cpu.options import CpuSchedule
from tcstage.cpu.structure import FuncInfo, analyse, variables
from tcstage.errors import TCError
from tcstage.halide.solver import evaluate


class NotScheduled(TCError):
    """The pipeline has a Func the structure-aware scheduler has no family for."""


class RoundedRows(Exception):
    """The schedule wants reduction `func`'s loop over `rvar` (a Halide RVar name) run to a
    multiple of `lanes`: the caller lowers the pipeline again so (`lower`'s `rounded`) and
    schedules the new Funcs. Raised only where `schedule_pipeline` was told it may be."""

    def __init__(self, func: str, rvar: str, lanes: int):
        super().__init__(f"{func}: round {rvar} up to a multiple of {lanes}")
        self.func, self.rvar, self.lanes = func, rvar, lanes


def schedule_pipeline(outputs: list[hl.Func], funcs: Mapping[str, hl.Func],
                      images: Mapping[str, hl.ImageParam | hl.Func], schedule: CpuSchedule,
                      target: hl.Target, extents: Mapping[str, tuple[int, ...]], threads: int,
                      no_row_vectors=frozenset(), stencils: bool = False,
                      align: bool = True, round_rows: bool = False, columns: bool = True
                      ) -> tuple[list[hl.Func], list[str], tuple]:
    """Schedules the pipeline computing `outputs`. `funcs`: every Func it defines, by name (the
    others it reads are inputs' wrapper Funcs); `images`: by input name, the ImageParams behind
    those wrappers, or the wrapper Funcs themselves (packing reads them through `in_()`).
    Returns the Funcs to realize, in output order, one line per Func saying what it got, and
    the output dimensions the schedule holds at their planned extents ((output's position,
    Halide's dimension, extent), ...: an image's channels, see `_stencil_schedule`), which
    only calls of those extents may run.
    `extents`: Func name -> its extents (innermost first) at the planned sizes.
    `no_row_vectors`: the tensors whose reduction along rows (see `_along_rows`) gets register
    tiles instead of a vectorised reduction loop (None: every one), for updates Halide cannot
    prove associative. `stencils`: a pipeline of pointwise Funcs only gets the stencil family
    (`_stencil_schedule`) instead of every Func computed once. `align`: a Func that reads by
    phases of its columns is computed over whole groups of vectors (see `_phases`), which may
    reach past an input that no boundary condition clamps (Halide then refuses the call
    before it computes anything; plan again without). `round_rows`: the caller can lower a
    reduction again with its loop rounded up (`RoundedRows`, raised where that pays).
    `columns`: a row pipeline's column sums are computed with its rows (`_column_partials`)."""
    structure = analyse(outputs, set(funcs))
    output_names = [f.name() for f in outputs]
    realized = list(outputs)
    plan = _Plan(schedule, target, extents, threads, no_row_vectors, align, round_rows, columns)
    if stencils and all(f.family in ("pointwise", "other") or f.window for f in structure.funcs):
        report, by_columns = _stencil_schedule(structure, funcs, set(output_names), plan)
        held = _hold_channels(outputs, plan, by_columns)
        report += [f"{output_names[k]}: its {outputs[k].args()[j].name()} held at {e} points, "
                   "unrolled in each vector (as are its producers')" for k, j, e in held]
        return realized, report, held
    others = [f.name for f in structure.funcs if f.family == "other"]
    if others and stencils:  # (a Halide pipeline's scatter or scan beside a contraction)
        raise NotScheduled(f"no CPU schedule family for {', '.join(others)} (partial writes, "
                           "scatters and several reductions into one tensor have none in a "
                           "Halide pipeline with reductions)")
    group = _row_group(structure, output_names, plan.extents if plan.columns else None)
    report, fused = [], frozenset()
    if group is not None:
        row_output, fused, columns = group
        k = output_names.index(row_output)
        realized[k], report = _fused_rows(_restricted(structure, fused), funcs, outputs[k], plan)
        for name, rvar in columns:
            report.append(f"{name}: " + (_row_copy(funcs[name], structure.info(name), plan)
                                         if rvar is None else _column_partials(
                funcs[name], structure.info(name), rvar, plan, set(funcs))))
        fused |= {name for name, _ in columns}
        if len(fused) == len(structure.funcs):
            return realized, report, ()
    inputs = {f: images[n] for f, n in structure.inputs.items() if n in images}
    anchors = {r: a for r, a in _pointwise_anchors(structure, set(output_names)).items()
               if r not in fused and a not in fused}
    # a window reduction (a depthwise filter) read by one contraction alone: its register
    # tiles computed per register tile of the contraction, where they are read, not stored
    # whole (`_reduction`'s `at`)
    windows = {f.name: r for f in structure.funcs if f.window and f.name not in output_names
               and len(rs := structure.readers.get(f.name, ())) == 1
               and structure.info(r := next(iter(rs))).contraction}
    padded = {v: w for w in windows for v in _padded(structure, structure.info(w),
                                                      structure.info(windows[w]), funcs)}
    plan.loops_kept |= {windows[w] for w in padded.values()}
    sliced = {}  # pointwise Func -> the reduction it may be computed per parallel step of
    for info in structure.funcs:
        if info.name in fused:
            continue  # (in the row pipeline)
        f = funcs[info.name]
        readers = structure.readers.get(info.name, frozenset())
        is_output = info.name in output_names
        if info.name in anchors.values() or info.name in windows or info.name in padded:
            continue  # (scheduled with the reduction that reads it, or that it reads)
        if info.family == "other":
            # (a scatter, several reductions into one tensor: computed once, its updates in
            # parallel where each writes at its own point; no split that a smaller call
            # could not run, where Mullapudi2016's failed below the planned sizes)
            report.append(f"{info.name}: {_each_update(f, info, plan)}")
            continue
        if info.family == "pointwise":
            read_by_reduction = any(structure.info(r).family == "reduction" for r in readers)
            if info.view and not is_output and stencils:
                # (a boundary condition: a select and clamps, recomputed at every read for
                # less than storing it; inlined into a window reduction, a padded input)
                report.append(f"{info.name}: a view, inlined into its readers")
            elif read_by_reduction and not is_output and schedule.inline_pointwise and \
                    _recomputed_by_readers(structure, info):
                report.append(f"{info.name}: pointwise, cheap: recomputed by its readers")
            elif read_by_reduction and not is_output and not info.epilogue and \
                    (by := _sliced_by(structure, info)) is not None:
                sliced[info.name] = (len(report), by)  # (scheduled once its reader is, below)
                report.append("")
            elif is_output or read_by_reduction or info.epilogue or \
                    not schedule.inline_pointwise:
                report.append(f"{info.name}: pointwise, {_pointwise(f, info, plan)}")
            else:
                report.append(f"{info.name}: pointwise, inlined into its readers")
            continue
        # A wrapper computes the reduction's values tile by tile, and every reader reads the
        # wrapper instead (an output is realized through it); or its only reader does, where
        # it reads each value at its own point (a relu after a convolution).
        reader = anchors.get(info.name)
        anchor = funcs[reader] if reader else f.in_()
        if is_output:
            realized[output_names.index(info.name)] = anchor
        report.append(f"{info.name}: reduction ({info.operator}) over "
                      f"{', '.join(info.rvars)}"
                      + (f" where its condition holds (on {', '.join(info.predicated)})"
                         if info.predicated else "")
                      + f", {_reduction(f, anchor, info, plan, funcs, inputs)}"
                      + (f"; {reader} computed on its tiles" if reader else ""))
    for name, (at, by) in sliced.items():
        report[at] = f"{name}: pointwise, " + _per_parallel_step(
            funcs[name], structure.info(name), plan, *by)
    for name, reader in windows.items():
        info = structure.info(name)
        tile = plan.tiles.get(reader)  # (None: the reader got no register tiles; its own)
        # What one tile of the reader reads of the window: its values over the window's first
        # dimension (the reader's reduction), for each row of the tile.
        stack = tile is not None and plan.extents.get(name, (1 << 20,))[0] * tile.rows * \
            funcs[name].types()[0].bytes() <= STACK_BYTES
        text = _reduction(funcs[name], funcs[name].in_(), info, plan, funcs, inputs,
                          at=tile and (tile.anchor, tile.loop), stack=stack)
        report.append(f"{name}: " + (f"a window reduction computed per register tile of "
                                     f"{reader}, " if tile else
                                     f"reduction ({info.operator}) over "
                                     f"{', '.join(info.rvars)}, ") + text)
        for view in (v for v, w in padded.items() if w == name):
            report.append(f"{view}: " + _padded_rows(funcs[view], structure.info(view),
                                                     structure.info(reader), plan, tile))
    return realized, report, ()


def _hold_channels(outputs: list[hl.Func], plan: _Plan, skip=frozenset()) -> tuple:
    """Bounds each output's dimensions past its columns and rows of at most SMALL_DIMENSION
    points (an image's channels) to their planned extents: the channels that `_stages`
    unrolls are then constants, and a select on the channel (Halide's `mux`: a colour
    matrix's rows) is resolved at compile time instead of computing every row for each
    channel (camera_pipe, 1.55x -> 1.3x its manual schedule). Not those of the outputs in
    `skip`, whose channels are tasks of their own. Returns what it bounded."""
    held = []
    for k, f in enumerate(outputs):
        if f.name() in skip:
            continue
        extents = plan.extents.get(f.name(), ())
        for j, v in enumerate(f.args()[2:len(extents)], start=2):
            if extents[j] <= SMALL_DIMENSION:
                f.bound(v, 0, extents[j])
                held.append((k, j, extents[j]))
    return tuple(held)


def _padded(structure, window: FuncInfo, reader: FuncInfo, funcs) -> list[str]:
    """The boundary conditions (views) that a window reduction computed per register tile of
    contraction `reader` reads, and nothing else does, where the contraction has a row loop
    past its tiles and a parallel loop outside that (see `_padded_rows`)."""
    if len(reader.args) < 4:  # (with the row loop parallel, each row would compute its halo)
        return []
    return [name for name in dict.fromkeys(r.func for r in window.reads)
            if name in funcs and structure.readers.get(name) == {window.name}
            and structure.info(name).view and structure.info(name).args]


def _padded_rows(f: hl.Func, view: FuncInfo, reader: FuncInfo, plan: _Plan,
                 tile: _Tiles | None) -> str:
    """A padded input (`_padded`) as a line buffer along the contraction's rows (its first
    dimension past the tile), kept per iteration of its parallel outer loop: each padded row
    is computed once, and the window's taps read it without a select and clamps per tap
    (depthwise_separable_conv: 1.7x -> 1.4x its manual schedule). Inlined where the reader
    got no register tiles."""
    if tile is None:
        return "a view, inlined into its readers"
    anchor = tile.anchor
    rows, kept = reader.args[2], reader.args[-1]
    f.compute_at(anchor, hl.Var(rows)).store_at(anchor, hl.Var(kept))
    lanes = plan.lanes(f.types()[0])
    vectorize = plan.extents.get(view.name, (0,))[0] >= lanes
    if vectorize:
        f.vectorize(hl.Var(view.args[0]), lanes, hl.TailStrategy.GuardWithIf)
    return (f"a view, a line buffer along {reader.name}'s {rows}, kept per {kept}"
            + (f", {view.args[0]} in vectors of {lanes}" if vectorize else ""))


STACK_BYTES = 64 << 10  # a window's values per tile of its reader, put on the stack up to
#                        this size (Halide's worker threads have megabytes of it)


# Rows a task of a fused row pipeline computes at least, and the bytes of one Func's values in a
# block of rows beyond which the block shrinks (a block's values should stay in L2).
FUSED_MIN_TASKS_PER_THREAD, FUSED_BLOCK_BYTES = 4, 256 << 10


def _row_local(structure, output: str) -> bool:
    """Whether the pipeline is a chain of row-wise Funcs: softmax, log-softmax, layer norm,
    cross-entropy and their gradients. At least two Funcs, one of them a reduction, each
    pointwise or a reduction along its rows (no contraction: those take register tiles), with at least two dimensions or
    exactly one, the row, and every Func reading the others only in its own row: its outermost
    variable as their outermost subscript. Then one task can compute every Func for a block of
    rows while they are in cache, instead of one pass over memory per Func."""
    funcs = structure.funcs
    if len(funcs) < 2 or output not in {f.name for f in funcs} or \
            not any(f.family == "reduction" for f in funcs):
        return False
    computed = {f.name: f for f in funcs}
    for f in funcs:
        if not f.args or f.family not in ("pointwise", "reduction") or \
                f.contraction or (f.family == "reduction" and (
                    f.operator not in ("add", "max", "min")
                    or not _along_rows(f, f.args[0], f.args[1] if len(f.args) > 1 else None,
                                       _rvars_by_memory(f)[0]))):
            return False
        row = ("var", f.args[-1])
        for r in f.reads + f.epilogue_reads:
            other = computed.get(r.func)
            if other is not None and (not r.args or r.args[-1] != row
                                      or len(r.args) != len(other.args)):
                return False
    return True


def _row_group(structure, outputs: list[str], extents=None
               ) -> tuple[str, frozenset, tuple[tuple[str, str], ...]] | None:
    """(An output, the Funcs computed per block of its rows, the column sums computed with
    them) where a row pipeline (`_row_local`) serves part or all of the pipeline: the output
    with the largest group of row-local producers that nothing outside the group reads but
    its column sums (`_column_sums`). The others are scheduled as usual, computed once,
    before: without its column sums, a layer norm's gradient fused d_X's statements per block
    of rows while the variance that d_Gamma reads too was computed once, a pass of its own.
    `extents`: the planned extents (Func name -> extents), which column sums need (None:
    none). None where no output has a group of two Funcs or more."""
    if len(outputs) == 1:
        return (outputs[0], frozenset(f.name for f in structure.funcs), ()) \
            if _row_local(structure, outputs[0]) else None
    computed = {f.name for f in structure.funcs}
    best = None
    for output in outputs:
        group, todo = set(), [output]
        while todo:  # (the output and every computed Func it reads, transitively)
            name = todo.pop()
            if name in group:
                continue
            group.add(name)
            info = structure.info(name)
            todo += [r.func for r in info.reads + info.epilogue_reads if r.func in computed]
        columns = _column_sums(structure, output, group, extents) + \
            _row_copies(structure, output, group, extents, outputs)
        changed = True
        while changed:  # (what a Func outside the group reads is computed before the group)
            changed = False
            for name in sorted(group - {output}):
                if name in outputs or structure.readers.get(name, frozenset()) - group - \
                        {c for c, _ in columns}:
                    group.discard(name)
                    changed = True
            kept = _column_sums(structure, output, group, extents,
                                [c for c in columns if c[1] is not None]) + \
                _row_copies(structure, output, group, extents, outputs)
            changed |= kept != columns
            columns = kept
        if len(group) >= 2 and _row_local(_restricted(structure, group), output) and \
                (best is None or len(group) + len(columns) > len(best[1]) + len(best[2])):
            best = (output, frozenset(group), columns)
    return best


def _row_copies(structure, output: str, group: set[str], extents, outputs: list[str]
                ) -> tuple[tuple[str, None], ...]:
    """(Func, None) for each other output that copies values of the group per row: pointwise,
    reading only Funcs of the group but the output, each at its own point (`mean_kept(n) =
    mean(n)`), with as many rows as the output at the planned sizes (`extents`; None: none).
    A forward that returns the reductions its backward reads (tcstage.grad.keeping) writes
    them so: an output the group read would be computed once, a pass of its own, and take
    its producers with it. Computed with the group's blocks (`_row_copy`)."""
    if extents is None or not structure.info(output).args:
        return ()
    computed = {f.name for f in structure.funcs}
    rows = (extents.get(output) or (None,))[-1]
    found = []
    for name in outputs:
        f = structure.info(name)
        own = tuple(("var", a) for a in f.args)
        if name == output or name in group or f.family != "pointwise" or f.epilogue or \
                not f.args or rows is None or (extents.get(name) or (None,))[-1] != rows or \
                not f.reads or any(r.func not in group or r.func == output or r.args != own
                                   for r in f.reads if r.func in computed) or \
                any(r.func not in computed for r in f.reads):
            continue
        found.append((name, None))
    return tuple(found)


def _row_copy(f: hl.Func, info: FuncInfo, plan: _Plan) -> str:
    """An output that copies the group's values per row (`_row_copies`), computed in the
    pipeline's loop over blocks of rows (Halide's compute_with), after the block's rows."""
    anchor, blocks, block = plan.row_blocks
    f.compute_root()
    # (its row and the loop over blocks named as the pipeline's: compute_with pairs loops by
    # their names, `n.n_o`)
    row = anchor.args()[-1]
    if info.args[-1] != row.name():
        f.rename(hl.Var(info.args[-1]), row)
    f.split(row, hl.Var(blocks), hl.Var(f"{row.name()}_i"), block, hl.TailStrategy.GuardWithIf)
    if plan.schedule.parallel_outer:
        f.parallel(hl.Var(blocks))
    f.compute_with(anchor, hl.Var(blocks))
    return f"a copy of the rows' values, computed with {anchor.name()}'s blocks of rows"


def _column_sums(structure, output: str, group: set[str], extents, candidates=None
                 ) -> tuple[tuple[str, str], ...]:
    """(Func, RVar) for each reduction outside `group` that sums (or takes the maximum or
    minimum of) values of the group's rows along one of its RVars, the row. It reads each
    Func of the group at that RVar alone as its outermost subscript (whole rows, as the group
    computes them) but not the output (Halide's compute_with fuses only independent loops),
    or reads no computed Func but an input the group reads too; its RVar spans the output's
    rows at the planned sizes (`extents`; None: no column sums). A layer norm's `d_Gamma(c)
    +=! d_Y(n, c) * xc(n, c) * rsqrt(var(n) + eps)` summed over n, and `d_Beta(c) +=! d_Y(n, c)`.
    `_column_partials` sums each block of rows with the group (Halide's rfactor) while its
    rows are in cache, where a pass of its own read d_Y and X again and made the variance a
    pass too. Not a contraction (a linear layer's weight gradient), which takes register
    tiles. `candidates`: (Func, RVar) pairs to check, instead of every reduction."""
    if extents is None:
        return ()
    if candidates is None:
        candidates = [(f.name, r) for f in structure.funcs for r in f.rvars]
    computed = {f.name for f in structure.funcs}
    out = structure.info(output)
    rows = (extents.get(output) or (None,))[-1] if out.args else None
    group_inputs = {r.func for g in group for r in structure.info(g).reads
                    if r.func not in computed}
    found = []
    for name, rvar in candidates:
        f = structure.info(name)
        if name in group or f.family != "reduction" or f.contraction or f.epilogue or \
                f.predicated or f.operator not in ("add", "max", "min") or rows is None or \
                rvar not in f.rvars or _planned_extent(f, extents, rvar) != rows:
            continue
        inner = [r for r in f.reads if r.func in computed]
        if any(r.func not in group or r.func == output or r.args[-1] != ("var", rvar) or
               r.dims_using(rvar) != (len(r.args) - 1,) or
               len(r.args) != len(structure.info(r.func).args) for r in inner):
            continue
        if not inner and not any(r.func in group_inputs and r.args and
                                 r.args[-1] == ("var", rvar) for r in f.reads):
            continue
        found.append((name, rvar))
    return tuple(found)


def _fused_rows(structure, funcs, output: hl.Func, plan: _Plan) -> tuple[hl.Func, list[str]]:
    """The row pipeline of `_row_local`: the output's rows in blocks, the blocks in parallel,
    every other Func computed per block (its row reductions vectorised along the row as in
    `_row_reduction`, its pointwise values along their innermost dimension). An output with
    updates of its own (a gradient's `d_X += ...`) is realized through a wrapper, whose blocks
    hold all its stages. Returns the Func to realize and what it did."""
    info = structure.info(output.name())
    extents = plan.extents.get(info.name) or (1,) * len(info.args)
    rows = extents[-1] or 1
    row_bytes = max(math.prod(plan.extents.get(f.name, (1,))[:-1] or (1,)) * 4
                    for f in structure.funcs)
    block = max(1, min(rows // max(1, plan.threads * FUSED_MIN_TASKS_PER_THREAD),
                       FUSED_BLOCK_BYTES // max(1, row_bytes)))
    anchor = output.in_() if info.epilogue else output
    n, no, ni = hl.Var(info.args[-1]), hl.Var(f"{info.args[-1]}_o"), hl.Var(f"{info.args[-1]}_i")
    anchor.compute_root()
    anchor.split(n, no, ni, block, hl.TailStrategy.GuardWithIf)
    # (the guard of a last, shorter block tests each row, not each element: Halide would copy
    # the whole pipeline for that block, which doubled the code LLVM compiled, 2.4 s of a
    # group norm gradient's first call, for a branch per row)
    anchor.never_partition([no])
    plan.row_blocks = (anchor, no.name(), block)
    if plan.schedule.parallel_outer:
        anchor.parallel(no)
    lanes = plan.lanes(output.types()[0])
    if len(info.args) > 1 and extents[0] >= lanes:
        anchor.vectorize(hl.Var(info.args[0]), lanes, hl.TailStrategy.GuardWithIf)
    report = [f"{info.name}: a fused row pipeline, rows in blocks of {block}"
              + (f", {no.name()} in parallel" if plan.schedule.parallel_outer else "")
              + (f", {info.args[0]} in vectors of {lanes}"
                 if len(info.args) > 1 and extents[0] >= lanes else "")
              + (" (through a wrapper holding its updates)" if info.epilogue else "")]
    for f in structure.funcs:
        if f.name == info.name and not info.epilogue:
            continue
        if f.name != info.name and (why := _inlined_in_rows(structure, f)):
            report.append(f"{f.name}: pointwise, {why}")
            continue
        func = funcs[f.name]
        func.compute_at(anchor, no)
        lanes = plan.lanes(func.types()[0])
        own = plan.extents.get(f.name) or (1,) * len(f.args)
        where = f"per block of rows of {anchor.name()}"
        if f.family == "reduction":
            order = _in_memory_order(func, f) if plan.row_vectors(f.name) else f.rvars
            inner = order[0]
            vectorized = plan.row_vectors(f.name) and not func.type().is_bfloat() and \
                (f.rvar_extents[f.rvars.index(inner)] or 1 << 20) >= lanes
            how = _lane_partials(func, f, inner, lanes, plan) \
                if vectorized else ""
            report.append(f"{f.name}: reduction ({f.operator}) over {', '.join(order)}"
                          + (" (reordered: innermost in memory first)" if order != f.rvars
                             else "") + f", {where}"
                          + (f", the reduction over {inner} {how}" if vectorized else ""))
        else:
            vectorized = len(f.args) > 1 and own[0] >= lanes
            if vectorized:
                x = hl.Var(f.args[0])
                func.vectorize(x, lanes, hl.TailStrategy.GuardWithIf)
                for k in range(f.epilogue):
                    func.update(k).vectorize(x, lanes, hl.TailStrategy.GuardWithIf)
            report.append(f"{f.name}: pointwise" + (f" with {f.epilogue} update"
                                                    f"{'s' * (f.epilogue > 1)}"
                                                    if f.epilogue else "")
                          + f", {where}"
                          + (f", {f.args[0]} in vectors of {lanes}" if vectorized else ""))
    return anchor, report


def _column_partials(f: hl.Func, info: FuncInfo, rvar: str, plan: _Plan, defined) -> str:
    """A column sum of a row pipeline (`_column_sums`) split by Halide's rfactor: its partial
    results per block of the pipeline's rows, P(..., b), computed in the pipeline's loop over
    the blocks (Halide's compute_with), after the block's rows; then f folds P over the
    blocks (a few values per point). The partial sum's loop over the block's rows and the
    others is vectorised as a row reduction's (`_lane_partials`) where an RVar indexes the
    innermost subscript (group norm's w), else along f's innermost variable, the rows outside
    it (layer norm's c: each row of the block added as vectors). Returns what it did."""
    anchor, blocks, block = plan.row_blocks
    outer, inner = hl.RVar(f"{rvar}_o"), hl.RVar(f"{rvar}_i")
    f.update(0).split(hl.RVar(rvar), outer, inner, block, hl.TailStrategy.GuardWithIf)
    # (named as the pipeline's loop over blocks: compute_with pairs loops by their names)
    partial = f.update(0).rfactor(outer, hl.Var(blocks))
    own = analyse([partial], set(defined) | {partial.name()}).info(partial.name())
    lanes = plan.lanes(f.types()[0])
    extents = plan.extents.get(info.name) or (1,) * len(info.args)
    across = bool(info.args) and extents[0] >= lanes  # (vectors along f's innermost variable)
    x = _vars(info.args[:1])
    partial.compute_root()
    order = _rvars_by_memory(own)
    extent = _planned_extent(info, plan.extents, order[0]) if order[0] in info.rvars else None
    # (Halide's rfactor wraps the partial's subscripts in promise_clamped: dims_using)
    in_rows = any(r.dims_using(order[0]) == (0,) for r in own.reads)
    by_rows = bool(info.args) and any(r.dims_using(info.args[0]) == (0,) for r in own.reads)
    if plan.row_vectors(info.name) and in_rows and (extent or 0) >= lanes:
        _in_memory_order(partial, own)
        how = f"the sum over {order[0]} {_lane_partials(partial, own, order[0], lanes, plan)}"
    elif by_rows:  # (a row of f's values: each of the block's rows folded into it, as vectors)
        partial.update(0).reorder(*_vars(own.args[:-1]), *[hl.RVar(r) for r in own.rvars],
                                  hl.Var(blocks))
        how = "row by row, in place" + (f", {info.args[0]} in vectors of {lanes}"
                                        if across else "")
    else:
        how = f"innermost in memory first: {', '.join(_in_memory_order(partial, own))}"
    for k, stage in enumerate((partial, partial.update(0))):
        if across and (k == 0 or by_rows):
            stage.vectorize(x[0], lanes, hl.TailStrategy.GuardWithIf)
        if plan.schedule.parallel_outer:
            stage.parallel(hl.Var(blocks))
        stage.compute_with(anchor, hl.Var(blocks))
    f.compute_root()
    if across:
        f.vectorize(x[0], lanes, hl.TailStrategy.GuardWithIf)
        f.update(0).vectorize(x[0], lanes, hl.TailStrategy.GuardWithIf)
    return (f"reduction ({info.operator}) over {', '.join(info.rvars)}, by blocks of {rvar}: "
            f"each block's {partial.name()} computed with {anchor.name()}'s rows ({how}), "
            f"then {info.name} over the blocks")


# A pointwise Func of a row pipeline with at most this many operations and no call is
# recomputed by its readers rather than stored per block (a layer norm's centred row)
ROW_CHEAP_OPERATIONS = 2


def _inlined_in_rows(structure, f: FuncInfo) -> str:
    """Why pointwise `f` of a row pipeline is inlined into its readers instead of stored per
    block of rows ("" where it is stored):
    - another pointwise Func reads it once, at its own point, and nothing else reads it (a
      gradient's `d_E` in `d_X(n, c) = d_E(n, c) * E(n, c)`): it costs no pass, no store;
    - it is cheap (a layer norm's `xc(n,c) = X(n,c) - mean(n)`): reading its operands again
      costs less than storing it and reading it back (512x1024 layer norm: 0.24 -> 0.17 ms,
      ad hoc)."""
    if f.family != "pointwise" or f.epilogue:
        return ""
    sites = _read_sites(structure, f.name)
    if len(sites) == 1:
        reader, read = sites[0]
        if reader.family == "pointwise" and reader.args == f.args and \
                read.args == tuple(("var", v) for v in reader.args):
            return f"inlined into {reader.name} (its one read)"
    return "cheap: recomputed by its readers" if _cheap_value(f) else ""


def _cheap_value(f: FuncInfo) -> bool:
    """At most ROW_CHEAP_OPERATIONS operations and no call, on values read at its own point
    (`X(n,c) - mean(n)`): each reader recomputes it for less than a store and a load."""
    own = {("var", v) for v in f.args}
    return f.family == "pointwise" and not f.epilogue and \
        f.operations <= ROW_CHEAP_OPERATIONS and not f.calls and \
        all(a in own for r in f.reads for a in r.args)


# A cheap pointwise Func read by reductions is recomputed by at most this many readers
CHEAP_READERS = 4


def _recomputed_by_readers(structure, f: FuncInfo) -> bool:
    """Whether a cheap pointwise Func (`_cheap_value`) that reductions read is inlined
    into its readers rather than stored: each reads it once per point it visits, with plain
    variables as subscripts (no window of taps that would recompute it per tap), and there are
    few of them. A layer norm's gradient reads its centred input in the variance, in the
    gradients of the scale and of the variance and in d_xc: recomputed, its pass and store
    went (512x1024: 0.45 -> 0.35 ms, ad hoc)."""
    readers = structure.readers.get(f.name, frozenset())
    if not _cheap_value(f) or not 0 < len(readers) <= CHEAP_READERS or \
            _bounded_view(structure, f):
        return False
    return all(all(a[0] == "var" for a in r.args) for _, r in _read_sites(structure, f.name))


def _bounded_view(structure, f: FuncInfo) -> bool:
    """Whether Func f reads through a boundary condition (Halide's Func of one, outside the
    pipeline's: an input padded with `??`, or for a rounded loop): inlined, its reader's
    vectors would load clamped lanes one by one wherever Halide cannot prove them inside."""
    def boundary(name):  # (an input's own Func holds its name; a wrapper's, another Func or
        value = structure.inputs.get(name, "")  # the condition of its select)
        return name in structure.inputs and (not isinstance(value, str) or
                                             value in structure.inputs)

    return f.view and any(boundary(r.func) for r in f.reads)


def _read_sites(structure, name: str) -> list:
    """(The reading Func's info, the read) for each read of Func `name` in the structure."""
    return [(g, r) for g in structure.funcs for r in g.reads + g.epilogue_reads
            if r.func == name]


def _pointwise_anchors(structure, outputs: set[str]) -> dict[str, str]:
    """Reduction -> the pointwise Func that computes it tile by tile in its stead: its only
    reader, which reads it at its own point alone (an activation after a layer) and has its
    dimensions, so that a tile of the one is a tile of the other. Without it, the reader is
    a pass of its own over the whole tensor."""
    anchors = {}
    for f in structure.funcs:
        readers = structure.readers.get(f.name, frozenset())
        if f.family != "reduction" or f.name in outputs or len(readers) != 1 or not f.args:
            continue
        reader = structure.info(next(iter(readers)))
        own = tuple(("var", v) for v in f.args)
        if reader.family == "pointwise" and not reader.epilogue and reader.args == f.args and \
                all(r.args == own for r in reader.reads if r.func == f.name):
            anchors[f.name] = reader.name
    return anchors


@attrs.frozen
class _Tiles:
    """Where a reduction's register tiles are computed: its anchor, the anchor's loop over
    the tiles, and the rows of a tile."""
    anchor: hl.Func
    loop: hl.Var
    rows: int


class _Plan:
    def __init__(self, schedule: CpuSchedule, target: hl.Target, extents, threads: int,
                 no_row_vectors=frozenset(), align: bool = True, round_rows: bool = False,
                 columns: bool = True):
        self.schedule, self.target, self.extents, self.threads = \
            schedule, target, dict(extents), threads
        self.columns = columns  # (see schedule_pipeline)
        self.row_blocks: tuple | None = None  # a row pipeline's (anchor, its loop over
        #                                       blocks of rows, rows per block): _fused_rows
        self.round_rows = round_rows  # (see schedule_pipeline)
        self.no_row_vectors = no_row_vectors
        self.tiles: dict[str, _Tiles] = {}  # reduction -> its register tiles
        self.loops_kept: set[str] = set()  # reductions whose outer loops others are computed
        #   at (a padded input's line buffer, `_padded_rows`): not fused by `_balanced`
        self.parallel_loops: dict[str, tuple[hl.Func, str]] = {}  # reduction computed once ->
        #   (the Func whose loops it runs, the name of its parallel loop)
        self.align = align  # (see schedule_pipeline)

    def row_vectors(self, func: str) -> bool:
        return self.no_row_vectors is not None and \
            func.split("$")[0] not in self.no_row_vectors

    def lanes(self, t: hl.Type) -> int:
        return self.schedule.vector_lanes or self.target.natural_vector_size(t)

    def accumulators(self) -> int:
        """Vector registers a register tile may hold (a few stay free for operands)."""
        return (32 if self.target.has_feature(hl.TargetFeature.AVX512) else 16) - 4


def _vars(names) -> list[hl.Var]:
    return [hl.Var(n) for n in names]


def _pointwise(f: hl.Func, info: FuncInfo, plan: _Plan) -> str:
    """Computed once, the innermost dimension vectorised, the outermost in parallel (a window
    reduction's taps inside its outer dimensions: see `_stages`)."""
    extents = plan.extents.get(info.name, ())
    f.compute_root()
    if not info.args:
        _stages(f, info)  # (an explicit loop order: Halide warns about unscheduled updates)
        return "computed once"
    lanes = plan.lanes(f.types()[0])
    vectorize = bool(extents) and extents[0] >= lanes
    parallel = plan.schedule.parallel_outer and len(info.args) > 1
    task = _task_size(extents, plan.threads) if parallel else 1
    for stage in _stages(f, info, 0, None, lanes if vectorize else 0,
                         hl.TailStrategy.ShiftInwards):
        if parallel and task > 1:
            stage.parallel(hl.Var(info.args[-1]), task, hl.TailStrategy.GuardWithIf)
        elif parallel:
            stage.parallel(hl.Var(info.args[-1]))
    return ("computed once" + (f", {info.args[0]} in vectors of {lanes}" if vectorize else "")
            + (f", {info.args[-1]} in parallel" + (f", {task} at a time" if task > 1 else "")
               if parallel else ""))


def _sliced_by(structure, info: FuncInfo) -> tuple[str, str] | None:
    """(reduction, variable) where pointwise `info` is read by that reduction alone, and only
    at its own outermost index `variable` in its own outermost dimension (a padded input's
    image, `I_padded(n, ...)` of a convolution over n): computed per parallel step of the
    reduction over that variable, each step's slice is computed once, into a buffer that stays
    in cache for the reduction to read, instead of once for all of them, stored to memory and
    read back (a padded 32x32x34x34 input: a fifth of conv_s2's forward)."""
    readers = structure.readers.get(info.name, frozenset())
    if len(readers) != 1 or len(info.args) < 2:
        return None
    reader = structure.info(next(iter(readers)))
    reads = [r for r in reader.reads if r.func == info.name]
    if reader.family != "reduction" or not reader.args or not reads:
        return None
    outer = reader.args[-1]
    if all(r.args[-1] == ("var", outer) and r.dims_using(outer) == (len(r.args) - 1,)
           for r in reads):
        return reader.name, outer
    return None


def _per_parallel_step(f: hl.Func, info: FuncInfo, plan: _Plan, reader: str, var: str) -> str:
    """`_sliced_by`'s schedule, where the reduction runs its loop over `var` in parallel (else
    computed once, `_pointwise`)."""
    anchor, loop = plan.parallel_loops.get(reader, (None, None))
    if loop != var:
        return _pointwise(f, info, plan)
    f.compute_at(anchor, hl.Var(var))
    lanes = plan.lanes(f.types()[0])
    # (vectorised, the tail guarded: a padded row is a few vectors and an edge, 34 floats for
    # a 32-wide image; scalar, the copy was a fifth of conv_s2's forward, ad hoc)
    _stages(f, info, 0, None, lanes, hl.TailStrategy.GuardWithIf)
    return (f"computed per {var} of {reader}, its parallel loop, {info.args[0]} in vectors of "
            f"{lanes}")


# Elements a parallel task of a pointwise pass computes at least: one row of 1024 floats per
# task made a 512x1024 copy 6x slower than PyTorch's, in the thread pool's per-task cost.
TASK_ELEMENTS = 16384


def _task_size(extents, threads: int) -> int:
    """Outer indices per parallel task: at least TASK_ELEMENTS elements, while leaving four
    tasks per thread."""
    if len(extents) < 2 or not all(extents):
        return 1
    inner, outer = math.prod(extents[:-1]), extents[-1]
    return max(1, min(TASK_ELEMENTS // max(1, inner), outer // max(1, 4 * threads)))


def _computed_once(f: hl.Func, info: FuncInfo, plan: _Plan, at=None,
                   column_strips=frozenset()) -> str:
    """What the stencil family computes once: tables, 1-D Funcs, scatters and scans. A scatter
    or scan's updates run in parallel along the pure variable each writes at its own point,
    where there is one (a histogram per row), else serially. A scan computed `at` a strip
    (Func, loop) of its reader instead is computed serially there; `column_strips`: the
    names of readers whose strips are strips of columns."""
    if info.family != "other":
        kind = "a window reduction" if info.window else "pointwise"
        return f"{kind}, {_pointwise(f, info, plan)}"
    lanes = plan.lanes(f.types()[0])
    extents = plan.extents.get(info.name, ())
    vectorize = bool(extents) and extents[0] >= lanes
    if at is None:
        f.compute_root()
    else:
        f.compute_at(*at)
    if vectorize:
        f.vectorize(hl.Var(info.args[0]), lanes, hl.TailStrategy.ShiftInwards)
    parallel = plan.schedule.parallel_outer and at is None
    if len(info.args) > 1 and parallel:
        f.parallel(hl.Var(info.args[-1]))
    if vectorize and info.args[0] in info.parallel:
        where = "computed once" if at is None else f"computed per strip of {at[0].name()}'s " + (
            "columns" if at[0].name() in column_strips else "rows (its columns)")
        return f"a scan, {where}, {_column_scan(f, info, plan, lanes, extents[0], parallel)}"
    along = info.parallel[-1] if info.parallel and parallel else None
    for j in range(info.epilogue):
        if along:
            f.update(j).parallel(hl.Var(along))
        else:
            f.update(j).unscheduled()
    return "a scatter or scan, computed once" + (
        f", its update{'s' * (info.epilogue > 1)} in parallel along {along}" if along else "")


def _restricted(structure, names):
    """The structure with only the Funcs named (their readers and the inputs as they are)."""
    return attrs.evolve(structure, funcs=tuple(f for f in structure.funcs if f.name in names))


def _each_update(f: hl.Func, info: FuncInfo, plan: _Plan) -> str:
    """A Func outside the families in a TC's pipeline (a gradient's scatter, several
    reductions into one tensor: `d_X(n, Label(n)) += ...` among updates `d_X(n, c) += ...`),
    computed once, each definition scheduled alone, with every split guarding its tail, so
    that a call smaller than the plan runs the same code (Mullapudi2016's splits, which it had
    before, failed there):
    - the pure definition, and each update that rewrites every point in place, vectorised
      along the innermost variable and parallel along the outermost, like a pointwise pass;
    - an update whose innermost subscript is an RVar alone (a scatter of rows,
      `d_Table(Index(b, l), r_d) += ...`) with that RVar innermost and vectorised: each lane
      writes its own element;
    - another update that writes at its own point along some pure variables (a reduction
      into the tensor, `d_M(n) += sum over c`) vectorised along the innermost of them (its
      reduction inside, on vectors) and parallel along the outermost;
    - any other update serially.
    A scalar (a gradient's total of several sums) is computed once, serially."""
    f.compute_root()
    if not info.args:
        for j in range(info.epilogue):
            f.update(j).unscheduled()
        return "a scalar, computed once, serially"
    extents = plan.extents.get(info.name, ())
    lanes = plan.lanes(f.types()[0])
    wide = bool(extents) and extents[0] >= lanes
    parallel = plan.schedule.parallel_outer
    stages = [(f, True, info.args, "", ())] + [
        (f.update(j), info.update_in_place[j], info.update_own[j], info.update_inner_rvar[j],
         info.update_rvars[j]) for j in range(info.epilogue)]
    x, outer = hl.Var(info.args[0]), hl.Var(info.args[-1])
    said = []
    for k, (stage, in_place, own, inner, rvars) in enumerate(stages):
        if in_place or (own and own[0] == info.args[0]):
            what = "pointwise" if in_place else "a reduction into it"
            if wide:
                xo, xi = hl.Var(f"{info.args[0]}_o"), hl.Var(f"{info.args[0]}_i")
                stage.split(x, xo, xi, lanes, hl.TailStrategy.GuardWithIf).vectorize(xi)
                what += f", {info.args[0]} in vectors of {lanes}"
                if len(info.args) == 1 and parallel:  # (1-D: its vectors are the tasks)
                    stage.parallel(xo)
                    what += ", in parallel over vectors"
            if len(info.args) > 1 and parallel and (in_place or info.args[-1] in own):
                stage.parallel(outer)
                what += f", in parallel along {info.args[-1]}"
            said.append(what)
        elif inner:
            r = hl.RVar(inner)
            stage.reorder(r, *(hl.RVar(v) for v in rvars if v != inner))
            if wide:
                ro, ri = hl.RVar(f"{inner}_o"), hl.RVar(f"{inner}_i")
                stage.split(r, ro, ri, lanes, hl.TailStrategy.GuardWithIf).vectorize(ri)
            said.append(f"a scatter of rows, {inner} innermost"
                        + (f" in vectors of {lanes}" if wide else ""))
        elif own and parallel:
            stage.parallel(hl.Var(own[-1]))
            said.append(f"in parallel along {own[-1]}")
        else:
            if k:
                stage.unscheduled()
            said.append("serial")
    return "computed once, definition by definition: " + "; ".join(said)


def _column_scan(f: hl.Func, info: FuncInfo, plan: _Plan, lanes: int, width: int,
                 parallel: bool) -> str:
    """The updates of a scan whose every update writes (and reads itself) at its own column
    (iir_blur's filter down the columns): a vector of columns advances together through the
    scan's rows, row by row over the whole width (a stream through memory); in parallel over
    blocks of columns (and the other pure variables the updates keep)."""
    x = hl.Var(info.args[0])
    rest = [hl.Var(a) for a in info.args[1:] if a in info.parallel]
    guard = hl.TailStrategy.GuardWithIf
    block = width
    if parallel:
        block = lanes * max(1, math.ceil(width / (2 * plan.threads * lanes)))
    xo, xi, lane = (hl.Var(f"{x.name()}_{k}") for k in ("block", "i", "lane"))
    for j in range(info.epilogue):
        stage, rvars = f.update(j), f.rvars(j)
        if parallel:
            stage.split(x, xo, xi, block, guard).split(xi, xi, lane, lanes, guard)
            stage.reorder(lane, xi, *rvars, xo, *rest)
        else:  # (computed per strip of a reader, whose strip is narrower than the planned
            # width: blocks of that width ran their vectors past it, predicated off, 4x the
            # work in max_filter)
            stage.split(x, xi, lane, lanes, guard).reorder(lane, xi, *rvars, *rest)
        stage.vectorize(lane)
        if parallel:
            stage.parallel(xo)
            if rest:
                stage.parallel(rest[-1])
    return (f"its updates in vectors of {lanes} columns"
            + (f", in parallel over blocks of {block} columns" if parallel else ""))


def _transposed_tiles(f: hl.Func, info: FuncInfo, plan: _Plan) -> tuple[hl.Var, str]:
    """A Func that reads another transposed (`_transposes`), computed once in tiles of
    lanes x lanes points, both dimensions vectorised (a block of vectors LLVM transposes with
    shuffles), TRANSPOSE_STRIP rows of tiles per strip, the strips (with the outer dimensions
    fused in) in parallel. Returns the loop over strips and what it did."""
    extents = plan.extents.get(info.name, ())
    lanes = plan.lanes(f.types()[0])
    x, y = hl.Var(info.args[0]), hl.Var(info.args[1])
    rest = _vars(info.args[2:])
    if len(extents) < 2 or min(extents[:2]) < lanes:
        strip, rows = _strips(f, info, plan)
        return strip, f"too small for tiles: in strips of {rows} rows"
    f.compute_root()
    rows = lanes * max(1, min(TRANSPOSE_STRIP, extents[1] // lanes))
    xo, xl = hl.Var(f"{x.name()}_tile"), hl.Var(f"{x.name()}_lane")
    yo, ym, yl = (hl.Var(f"{y.name()}_{k}") for k in ("strip", "tile", "lane"))
    shift = hl.TailStrategy.ShiftInwards
    f.split(x, xo, xl, lanes, shift).split(y, yo, ym, rows, shift).split(ym, ym, yl, lanes, shift)
    f.reorder(xl, yl, ym, xo, yo, *rest).vectorize(yl).vectorize(xl)
    strip = yo
    for k, v in enumerate(rest):
        fused = hl.Var(f"{y.name()}_strip{k}")
        f.fuse(strip, v, fused)
        strip = fused
    if plan.schedule.parallel_outer:
        f.parallel(strip)
    return strip, (f"in tiles of {lanes} x {lanes} (both vectorised), strips of {rows} rows"
                   + (" in parallel" if plan.schedule.parallel_outer else ""))


TRANSPOSE_STRIP = 4  # tiles per strip of a transposer: as iir_blur's own schedule


STENCIL_DEPTH = 8  # producers chained under one strip root (each adds its halo to a strip)
STRIDED_VIEW_READERS = 3  # stored readers from which a view read strided is stored instead


@attrs.frozen
class StencilPlan:
    """Which Funcs of a pipeline of pointwise Funcs and window reductions the stencil family
    inlines, computes in strips (the roots), keeps as line buffers of a root's strips (member
    -> (root, depth)), or computes once (1-D Funcs a strip root cannot hold)."""

    inlined: tuple[str, ...]
    roots: tuple[str, ...]
    members: Mapping[str, tuple[str, int]]
    once: tuple[str, ...]
    deep: tuple[str, ...] = ()  # the roots that would have joined a group but for its depth
    axes: Mapping[str, tuple[int, int]] = {}  # member -> (its row, its column): the dimensions
    #   its readers read along their rows and columns (a sum's Func may list them in any order)
    tables: tuple[str, ...] = ()  # read by tables only, or at subscripts that depend on the
    #   row or the column of each reader, not both (a filter's weights, a resampling kernel's
    #   per column), or at values read (a lookup table): small beside its readers
    transposers: tuple[str, ...] = ()  # roots that read a Func transposed (see `_transposes`):
    #   computed in square tiles of vectors, not in strips of rows
    scans_at: Mapping[str, str] = {}  # a scan -> the transposer, its only reader, per strip of
    #   whose rows (the scan's columns) it is computed: the strip stays in cache between them
    wide: Mapping[str, int] = {}  # a member -> k: it reads a Func by phases of its columns
    #   (see `_phases`), and is vectorised k vectors wide, aligned to them
    phased: tuple[str, ...] = ()  # read by phases (see `_phases`), inlined
    cheap: tuple[str, ...] = ()  # cheaper recomputed by each reader (see `_cheap`), inlined
    clamped: tuple[str, ...] = ()  # boundary conditions stored as line buffers, not inlined,
    #   because they clamp the column that their readers' taps read (`_clamps_column`)
    column_strips: Mapping[str, tuple[str, tuple[str, ...]]] = {}  # an output root -> (a scan
    #   down columns, the roots between them): the root is computed in parallel strips of
    #   columns, the scan per strip, the roots between per row of it (`_column_strips`)


def plan_stencils(structure, outputs: set[str]) -> StencilPlan:
    """The stencil family's plan (see `_stencil_schedule`), from the pipeline's structure."""
    info = {f.name: f for f in structure.funcs}
    # member or inlined Func -> (strip root, depth, its row dimension, its column dimension)
    group: dict[str, tuple[str, int, int, int]] = {}
    inlined, roots, once, deep = [], [], [], []
    # (of what is stored as written: an input, a scan; a line buffer is stored column first)
    transposers = [f.name for f in structure.funcs if any(
        _transposes(f, r) and (r.func not in info or info[r.func].family == "other")
        for r in f.reads)]
    phased, wide = _phases(structure, outputs)
    tables: list[str] = []
    for f in reversed(structure.funcs):
        readers = structure.readers.get(f.name, frozenset())
        if f.name not in outputs and readers and all(
                r in tables or all(len(read.direct_variables() & set(info[r].args[:2])) < 2
                                   for read in info[r].reads if read.func == f.name)
                for r in readers):
            tables.append(f.name)
    cheap_ones: list[str] = []
    clamped: list[str] = []
    computed_in: dict[str, set[str]] = {}  # inlined Func -> the stored Funcs that compute it
    spread: set[str] = set()  # inlined Funcs that their stored readers read at several points
    for f in reversed(structure.funcs):  # consumers first
        readers = structure.readers.get(f.name, frozenset())
        owner = _stencil_owner(f, readers, info, group, roots, lenient=f.name in phased)
        cheap = f.family == "pointwise" and _cheap(f, info, readers, f.name in tables)
        where = set().union(*(computed_in.get(r, {r}) for r in readers))
        at_own_point = not (readers & spread) and all(
            read.args == tuple(("var", v) for v in info[r].args)
            for r in readers for read in info[r].reads if read.func == f.name)
        # (a view that reads at a multiple of a row or column, camera_pipe's Bayer planes of
        # its mosaic, costs shuffles at every read: stored, where several stored Funcs read
        # it, it pays them once; camera_pipe 1.37x -> 1.24x its manual schedule)
        strided = len(where) >= STRIDED_VIEW_READERS and any(
            _has(a, "mul") for read in f.reads for a in read.args)
        # (a boundary condition whose clamps on the column its readers' taps read at several
        # columns: inlined, each tap's vector is a gather through the clamped subscripts,
        # which Halide does not partition away under the strips' shifted vectors; stored as
        # a line buffer, each row is clamped once. erode 2.1 -> 0.9 ms, blur 0.72 -> 0.57,
        # stencil_chain 38 -> 32, ad hoc)
        gathers = f.view and owner is not None and _clamps_column(f, readers, info)
        if gathers:
            clamped.append(f.name)
        if f.family == "other":  # (a scatter, a scan: computed once, see `_computed_once`)
            once.append(f.name)
        elif f.name in transposers:
            roots.append(f.name)
        elif f.name not in outputs and f.family == "pointwise" and f.name not in wide and (
                f.view and not strided and not gathers or cheap or f.name in phased or readers and
                not f.epilogue and
                len(where) == 1 and at_own_point):
            # a view, or read only where it is computed, by one stored Func (perhaps through
            # others inlined into it: harris's structure matrix in its response, which Halide's
            # CSE computes once): cheaper recomputed than stored (its producers then belong
            # where its readers do). Read by several stored Funcs (harris's derivatives, each
            # read by two products), or at several points through a Func inlined into a
            # window's taps, it is stored: recomputing it made harris 1.4x slower.
            inlined.append(f.name)
            computed_in[f.name] = where
            if not at_own_point:
                spread.add(f.name)
            if cheap:
                cheap_ones.append(f.name)
            if owner is not None:
                group[f.name] = owner
        elif f.name not in outputs and owner is not None and owner[1] < STENCIL_DEPTH:
            group[f.name] = (owner[0], owner[1] + 1, *owner[2:])
        elif len(f.args) >= 2:
            roots.append(f.name)
            if f.name not in outputs and owner is not None:
                deep.append(f.name)
        else:
            once.append(f.name)
    members = {n: g[:2] for n, g in group.items() if n not in inlined}
    axes = {n: g[2:] for n, g in group.items() if n not in inlined}
    scans_at = {}
    for name in once:
        f, readers = info[name], structure.readers.get(name, frozenset())
        if f.args and f.args[0] in f.parallel and len(readers) == 1 and \
                next(iter(readers)) in transposers:
            (t,) = readers
            if all(_transposes(info[t], read) for read in info[t].reads if read.func == name):
                scans_at[name] = t
    column_strips = {}
    for name in once:
        f, readers = info[name], structure.readers.get(name, frozenset())
        if name in scans_at or f.family != "other" or not f.args or \
                f.args[0] not in f.parallel or not readers:
            continue
        # (its readers read it at their own column, and only one output's strips read them:
        # max_filter's vertical maxima vert(x, y, c, t) of its log-step scan vert_log)
        owners = {r2 if r2 in outputs else members.get(r2, (None,))[0]
                  for r in readers for r2 in structure.readers.get(r, ())}
        if len(owners) == 1 and (root := owners.pop()) in outputs and \
                root not in column_strips and all(
                    r in roots and r not in outputs and len(info[r].args) >= 2 and
                    all(read.args[:1] == (("var", info[r].args[0]),)
                        for read in info[r].reads if read.func == name) for r in readers):
            column_strips[root] = (name, tuple(sorted(readers)))
    return StencilPlan(tuple(inlined), tuple(roots), members, tuple(once), tuple(deep),
                       axes, tuple(tables), tuple(transposers), scans_at,
                       {n: k for n, k in wide.items() if n in members},
                       tuple(n for n in inlined if n in phased), tuple(cheap_ones),
                       tuple(clamped), column_strips)


def _clamps_column(f: FuncInfo, readers, info) -> bool:
    """Whether view `f` clamps its column (`max(min(x, ...), ...)` in a subscript, likely or
    not) and its readers read it at more than one column subscript (the taps of a window)."""
    def clamped(tree):
        return isinstance(tree, tuple) and bool(tree) and (
            tree[0] in ("max", "min") and f.args[0] in variables(tree) or
            any(clamped(t) for t in tree[1:]))

    columns = {read.args[0] for r in readers if r in info for read in info[r].reads
               if read.func == f.name and read.args}
    return bool(f.args) and len(columns) > 1 and any(
        clamped(a) for read in f.reads for a in read.args)


def downsamples(structure, name: str) -> bool:
    """Whether some reader reads Func `name` at a multiple of its own row or column
    (`f[2 x - 1, y]`): a level of a downsampling pyramid, or a mosaic read by plane."""
    for r in structure.readers.get(name, frozenset()):
        reader = structure.info(r)
        if reader.view and downsamples(structure, r):  # (through a boundary condition)
            return True
        for read in reader.reads:
            if read.func == name and any(_follows(a, v, reader.args) and _has(a, "mul")
                                         for a in read.args for v in reader.args[:2]):
                return True
    return False


def _has(tree, op: str) -> bool:
    """Whether a subscript's tree applies `op` ("mul": a multiple of a row, "div") anywhere."""
    return isinstance(tree, tuple) and bool(tree) and (
        tree[0] == op or any(_has(t, op) for t in tree[1:] if isinstance(t, tuple)))


def _phases(structure, outputs: set[str]) -> tuple[set[str], dict[str, int]]:
    """The Funcs read by phases (`f[x / k, y, x % k]`, `f[x, y / k, y % k]`: an upsampling's
    k interleaved filters), and the readers that read such a Func by phases of their columns,
    with k. A Func read by phases is inlined into its readers: by phases of a reader's row, k
    and the phase are values per row; of its columns, the reader is stored and vectorised k
    vectors wide, aligned to k vectors, so that Halide sees whole groups of k (as
    gaussian_blur's own schedule computes its upsampling in x)."""
    phased, wide = set(), {}
    for f in structure.funcs:
        readers = structure.readers.get(f.name, frozenset())
        if f.name in outputs or f.family != "pointwise" or f.epilogue or not readers:
            continue
        found = {}
        for r in readers:
            reader = structure.info(r)
            for read in reader.reads:
                if read.func == f.name:
                    found.setdefault(r, []).append(_phase_of(read, reader.args))
        if found and all(p is not None for ps in found.values() for p in ps):
            phased.add(f.name)
            for r, ps in found.items():
                for axis, k in ps:
                    if axis == 0:
                        wide[r] = k
    return phased, wide


def _phase_of(read, args: tuple[str, ...]) -> tuple[int, int] | None:
    """(0 for the reader's column or 1 for its row, k) where a read picks a phase of that
    variable, `v % k`, beside `v / k` in another subscript; else None."""
    for axis, var in enumerate(args[:2]):
        v, found = ("var", var), None
        for a in read.args:
            if isinstance(a, tuple) and len(a) == 3 and a[0] == "mod" and a[1] == v and \
                    a[2][0] == "int" and a[2][1] > 1:
                found = a[2][1]
        if found and any(a == ("div", v, ("int", found)) for a in read.args):
            return axis, found
    return None


CHEAP_OPERATIONS = 8  # hist's luma: 3 conversions, 3 products, 2 sums
CHEAP_READS = 3  # interpolate's downsampling reads its finer level at 2x - 1, 2x and 2x + 1


def _cheap(f: FuncInfo, info: Mapping[str, FuncInfo], readers, table: bool = False) -> bool:
    """Whether a pointwise Func is cheaper recomputed by each reader than stored and read
    back: at most CHEAP_OPERATIONS operations on inputs (or their boundary conditions) read
    at its own point (a channel given as a constant), read at no more than CHEAP_READS points
    by each reader and by no window reduction (whose taps would each recompute it: unsharp's
    grey level, inlined, ran 1.3x slower). A pass of its own over memory costs more (hist's
    luma, stored whole, took 0.85 ms of 6; interpolate's premultiplied level 0, 63 MB, made
    the whole pyramid slower than Mullapudi2016's). So is a Func of at most one operation on
    values of stencils (stored: see `_stencil`) read at its own point, whoever reads it,
    unless it is a `table` (a filter's weights normalised: its readers would divide at every
    tap of every row)."""
    own = {("var", v) for v in f.args}
    if not table and not f.epilogue and f.operations <= 1 and f.reads and all(
            a in own for r in f.reads for a in r.args) and all(
            _stencil(info.get(r.func)) for r in f.reads):
        return True  # (harris's products of derivatives: one operation per tap that reads it
        #              against a pass storing it, 1.3x -> 1.15x its manual schedule)
    if any(info[r].window or sum(read.func == f.name for read in info[r].reads) > CHEAP_READS
           for r in readers):
        return False

    def an_input(name):  # (an input, or views of one: a boundary condition)
        return name not in info or info[name].view and all(
            an_input(r.func) for r in info[name].reads)

    return not f.epilogue and f.operations <= CHEAP_OPERATIONS and f.reads and all(
        an_input(r.func) and all(a in own or a[0] == "int" for a in r.args) for r in f.reads)


def _stencil(f: FuncInfo | None) -> bool:
    """Whether a pointwise Func reads a Func at points other than its own (a derivative), so
    that the stencil family stores it rather than inline it."""
    return f is not None and f.family == "pointwise" and not f.view and any(
        a != ("var", v) and a[0] != "int" for r in f.reads for a, v in zip(r.args, f.args))


def _transposes(f: FuncInfo, read) -> bool:
    """Whether a read by a pointwise Func (of 2 or more dimensions, no updates) is transposed:
    its row variable picks the read's innermost subscript and its column variable its second
    (iir_blur's `blur[y, x, c]`). Along a row it would gather one element per row of what it
    reads; in square tiles, each a block of vectors, LLVM transposes with shuffles."""
    if f.family != "pointwise" or f.epilogue or len(f.args) < 2:
        return False
    column, row = f.args[0], f.args[1]
    return len(read.args) >= 2 and read.args[0] == ("var", row) and \
        read.args[1] == ("var", column)


def _stencil_schedule(structure, funcs: Mapping[str, hl.Func], outputs: set[str],
                      plan: _Plan) -> tuple[list[str], set[str]]:
    """The stencil family, for pipelines of pointwise Funcs and window reductions (blurs,
    derivatives, morphology, filter taps, resampling): line buffers, as Halide's own CPU
    schedules for such apps are written.

    A *strip root* (an output, or a Func that cannot join one) is computed once, in strips of
    rows run in parallel, x vectorised, its channels inside each row. A producer whose every
    reader is in the same strip root's group, and reads it at rows that follow its own (see
    `_follows`), joins that group, up to STENCIL_DEPTH producers deep: it is stored per strip
    and computed per row of the root, so Halide slides a window of its rows down the strip
    and computes each row once, but for the halo at the top of each strip. A window
    reduction's taps run between a vector and the next (`_stages`). Views (boundary
    conditions, wrappers: values that only read) and Funcs read only at their own point are
    inlined; 1-D Funcs are computed once. Returns what it did and the roots it computed in
    strips of columns (`_column_strips`)."""
    info = {f.name: f for f in structure.funcs}
    stencils = plan_stencils(structure, outputs)
    def why(n):
        return "a view" if info[n].view else "read by phases" if n in stencils.phased else \
            "cheap" if n in stencils.cheap else "read at its own point only"

    report = [f"{n}: {why(n)}, inlined into its readers" for n in stencils.inlined]
    strips: dict[str, hl.Var] = {}
    row_loops: dict[str, hl.Var] = {}  # a root -> the loop its line buffers are computed at
    scans_at = dict(stencils.scans_at)
    between = {r for _, rs in stencils.column_strips.values() for r in rs}
    for name in stencils.roots:
        if name in between:
            continue  # (computed per row of the root whose column strips read them, below)
        if name in stencils.column_strips:
            scan, readers = stencils.column_strips[name]
            strips[name], row_loops[name], text = _column_strips(funcs[name], info[name], plan)
            scans_at[scan] = name
            report.append(f"{name}: strip root, {text}")
            for r in readers:
                funcs[r].compute_at(funcs[name], row_loops[name])
                lanes = plan.lanes(funcs[r].types()[0])
                _stages(funcs[r], info[r], 0, 1, lanes if plan.extents.get(r, (0,))[0] >= lanes
                        else 0, hl.TailStrategy.ShiftInwards)
                report.append(f"{r}: computed per row of {name}'s column strips, "
                              f"{info[r].args[0]} in vectors")
            continue
        if name in stencils.transposers:
            strips[name], text = _transposed_tiles(funcs[name], info[name], plan)
            report.append(f"{name}: reads a Func transposed, {text}")
            continue
        sweep = _sweeps(info[name], 1, plan)
        group = {m for m, (r, _) in stencils.members.items() if r == name}
        depth = max((stencils.members[m][1] for m in group), default=0)
        # (not a pyramid's upsampling group, whose members' halos are coarse rows:
        # interpolate ran 4% slower in taller strips)
        deep = depth >= DEEP_GROUP and not any(
            read.func in group and any(_has(a, "div") for a in read.args)
            for m in group | {name} for read in info[m].reads)
        strips[name], rows = _strips(funcs[name], info[name], plan, sweep,
                                     STRIP_ROWS * (2 if deep else 1))
        report.append(f"{name}: strip root, {info[name].args[1]} in parallel strips "
                      f"({rows} rows), {info[name].args[0]} in vectors"
                      + (", its taps sweeping each row" if sweep else ""))
    for n in stencils.once:
        at = scans_at.get(n)
        report.append(f"{n}: " + _computed_once(funcs[n], info[n], plan,
                                                at and (funcs[at], strips[at]),
                                                set(stencils.column_strips)))
        along = info[n].parallel[-1] if info[n].family == "other" and info[n].parallel else None
        for r in {r.func for r in info[n].reads if along and r.func in stencils.cheap
                  and len(info[r.func].args) >= 2}:
            # (a scatter reads it along a reduction: inlined, it would be computed one point
            # at a time, unvectorised; a copy per row of the scatter is, as hist's own schedule
            # does with its luma)
            copy = funcs[r].clone_in(funcs[n])
            copy.compute_at(funcs[n], hl.Var(along))
            lanes = plan.lanes(copy.types()[0])
            copy.vectorize(hl.Var(info[r].args[0]), lanes, hl.TailStrategy.GuardWithIf)
            report.append(f"{r}: computed for {n} per {along} too, in vectors")
    for name, (root, depth) in stencils.members.items():
        f, args = funcs[name], info[name].args
        row, column = stencils.axes[name]
        f.store_at(funcs[root], strips[root]).compute_at(
            funcs[root], row_loops.get(root, hl.Var(info[root].args[1] + "_row")))
        if column:  # (rows stored contiguously, as they are computed)
            f.reorder_storage(*_vars(_column_first(args, column)))
        lanes = plan.lanes(f.types()[0])
        vectorize = plan.extents.get(name, (0,) * len(args))[column] >= lanes
        k = stencils.wide.get(name, 1)
        if plan.extents.get(name, (0,) * len(args))[column] < lanes * k:
            k = 1  # (narrower than k vectors: the shifted last vector would leave the Func)
        if vectorize and k > 1:
            lanes *= k
            if plan.align:
                f.align_bounds(hl.Var(args[column]), lanes)
        sweep = _sweeps(info[name], row, plan)
        _stages(f, info[name], column, row, lanes if vectorize else 0,
                extents=plan.extents.get(name, ()), sweep=sweep)
        report.append(f"{name}: {'a window reduction' if info[name].window else 'pointwise'}, "
                      f"a line buffer of {root}'s strips, {depth} deep"
                      + (f", {args[column]} in vectors" if vectorize else "")
                      + (f" {k} wide" + ", aligned to them" * plan.align
                         + " (it reads by phases)" if vectorize and k > 1 else "")
                      + (", its taps sweeping each row" if sweep else ""))
    return report, set(stencils.column_strips)


COLUMN_STRIP = 256  # columns per strip of `_column_strips`: as max_filter's own schedule


def _column_strips(f: hl.Func, info: FuncInfo, plan: _Plan) -> tuple[hl.Var, hl.Var, str]:
    """A strip root that reads a scan down columns through Funcs of more dimensions than its
    own (max_filter's vertical maxima, one per window height): in parallel strips of
    COLUMN_STRIP columns, each with its channels (and other outer dimensions) a task of its
    own, its rows inside. The scan is computed per strip (a strip of columns of it, all its
    rows: it stays in cache, where the whole scan was 290 MB), the Funcs between per row.
    Returns the loop over the strips, the loop over rows, and what it did."""
    extents = plan.extents.get(info.name, ())
    lanes = plan.lanes(f.types()[0])
    x, y, rest = hl.Var(info.args[0]), hl.Var(info.args[1]), _vars(info.args[2:])
    xo, xi = hl.Var(f"{x.name()}_strip"), hl.Var(f"{x.name()}_i")
    width = min(COLUMN_STRIP, extents[0] if extents else COLUMN_STRIP)
    f.compute_root()
    stages = [f] + [f.update(j) for j in range(info.epilogue + (info.family == "reduction"))]
    for k, stage in enumerate(stages):
        # (the definition may recompute columns at the edges; updates may not)
        tail = hl.TailStrategy.GuardWithIf if k else hl.TailStrategy.ShiftInwards
        stage.split(x, xo, xi, width, tail).reorder(xi, y, *rest, xo)
        if width >= lanes:
            stage.vectorize(xi, lanes, tail)
        strip = xo
        for n, v in enumerate(rest):  # (the channels: a strip of each is a task of its own)
            fused = hl.Var(f"{x.name()}_strip{n}")
            stage.fuse(v, strip, fused)
            strip = fused
        if plan.schedule.parallel_outer:
            stage.parallel(strip)
    return strip, y, (f"{x.name()} in parallel strips of {width} columns"
                      + (f" (one per {', '.join(info.args[2:])} too)" if rest else "")
                      + f", {y.name()} inside them, {x.name()} in vectors")


def _column_first(args: tuple[str, ...], column: int) -> tuple[str, ...]:
    return (args[column], *args[:column], *args[column + 1:])


def _stages(f: hl.Func, info: FuncInfo, column: int = 0, row: int | None = None,
            lanes: int = 0, tail=hl.TailStrategy.Auto, extents=(), sweep: bool = False
            ) -> list:
    """Gives the Func's definition and its updates their loops, and returns them: the column
    innermost, in vectors of `lanes` (0: not vectorised; `tail` for the definition, updates
    may not recompute points and guard theirs), then the other pure variables innermost
    first, but the row (if given) outermost: a row's channels are computed together, so a
    Func without channels can be computed a row at a time for all of them. A reduction's taps
    run between a vector and the next: each vector of sums is accumulated in a register.
    Other dimensions of at most SMALL_DIMENSION points (`extents`, the Func's: an image's
    channels) are unrolled inside each vector, and inside a window reduction's taps: the
    channels then share what they read (a colour matrix's, camera_pipe's, each channel read
    all three of the demosaic's values and recomputed them; gaussian_blur's two phases of
    one downsampling read each value once per phase). With `sweep` (see `_sweeps`), the taps
    run outside the vectors instead: each tap sweeps the row."""
    small = []
    if not info.args:  # (a scalar: its updates' loops are its taps)
        inner, outer, lanes = None, [], 0
    else:
        inner, *outer = _vars(_column_first(info.args, column))
        if row is not None and row != column:
            outer = [v for v in outer if v.name() != info.args[row]] + [hl.Var(info.args[row])]
        if len(extents) == len(info.args):
            small = [v for v in outer if v.name() != info.args[row if row is not None else -1]
                     and 1 < extents[info.args.index(v.name())] <= SMALL_DIMENSION]
            outer = [v for v in outer if v.name() not in {u.name() for u in small}]
    if lanes and small:
        lane = hl.Var(f"{info.args[column]}_lane")
        f.split(inner, inner, lane, lanes, tail).reorder(lane, *small, inner, *outer)
        f.vectorize(lane)
        for v in small:  # (by the planned extent: any other is guarded)
            f.unroll(v, extents[info.args.index(v.name())], hl.TailStrategy.GuardWithIf)
    else:
        if column or row is not None or small:
            f.reorder(inner, *small, *outer)
        if lanes:
            f.vectorize(inner, lanes, tail)
    stages = [f]
    for j in range(info.epilogue + (info.family == "reduction")):
        stage = f.update(j)
        taps = [hl.RVar(r) for r in info.rvars] if j == 0 and info.family == "reduction" else []
        if inner is None:
            if taps:
                stage.reorder(*taps)
        elif lanes and taps:
            lane = hl.Var(f"{info.args[column]}_lane")
            stage.split(inner, inner, lane, lanes, hl.TailStrategy.GuardWithIf) \
                .reorder(lane, *small, *((inner, *taps) if sweep else (*taps, inner)),
                         *outer).vectorize(lane)
        else:
            stage.reorder(inner, *(small if taps else ()), *taps, *(() if taps else small),
                          *outer)
            if lanes:
                stage.vectorize(inner, lanes, hl.TailStrategy.GuardWithIf)
        for v in small if taps else ():  # (by the planned extent: any other is guarded)
            stage.unroll(v, extents[info.args.index(v.name())], hl.TailStrategy.GuardWithIf)
        stages.append(stage)
    return stages


SMALL_DIMENSION = 8  # (gaussian_blur's phases: 2 in its downsampling)


def _sweeps(info: FuncInfo, row: int, plan: _Plan) -> bool:
    """Whether a window reduction's taps are more than SWEEP_TAPS rows read at unit steps
    (their count from the planned extents: the rows read less the rows computed), weighted by
    the tap alone: a wide vertical blur. Its taps then sweep the row one at a time, a stream
    through memory, rather than each vector reading every tap's row (gaussian_blur's direct
    blur of 101 taps: 1.27x -> 1.0x its manual schedule; a 13-tap one ran slower swept)."""
    if not info.window or len(info.rvars) != 1 or len(info.args) < 2:
        return False
    tap, y = info.rvars[0], info.args[row]
    taps = None
    for read in info.reads:
        using = [k for k, a in enumerate(read.args) if tap in variables(a)]
        if not using:
            continue
        a = read.args[using[0]]
        pure = variables(a) & set(info.args)
        if not pure:
            continue  # (a weight by the tap)
        if len(using) > 1 or pure != {y} or not _follows(a, y, info.args) or \
                _has(a, "mul") or _has(a, "div"):
            return False
        read_rows = plan.extents.get(read.func, ())
        own_rows = plan.extents.get(info.name, ())
        if len(read_rows) > using[0] and len(own_rows) > row:
            taps = max(taps or 0, read_rows[using[0]] - own_rows[row] + 1)
    return taps is not None and taps > SWEEP_TAPS


SWEEP_TAPS = 16


def _stencil_owner(f: FuncInfo, readers, info, group, roots, lenient: bool = False
                   ) -> tuple[str, int, int, int] | None:
    """(strip root, depth, row, column) of the group `f` may join: that of its readers, if
    they all belong to one (or are that root) and each reads `f` at rows that follow its own
    (`_follows`: a stencil, a filter window, an upsampling; any column, channel or batch: a row
    of `f` is computed whole). `f`'s row is the dimension read along the readers' rows, its column the
    one read along their columns. `lenient`: `f` is inlined, never stored a row at a time, so
    its dimensions and a phase of the row in another subscript do not matter."""
    owners, axes = set(), set()
    depth = 0
    for r in readers:
        reader = info.get(r)
        # (a Func with more dimensions than its reader, nl_means' weights per patch offset,
        # would hold all of them in each row of the line buffer; but a reader of rows and
        # columns alone that sums a few of them, gaussian_blur's downsampling phases, holds
        # those few)
        few = reader is not None and reader.window and len(reader.args) == 2 and \
            None not in reader.rvar_extents and math.prod(reader.rvar_extents) <= SMALL_DIMENSION
        if reader is None or (r not in group and r not in roots) or f.family == "other" or \
                not 2 <= len(f.args) <= (len(f.args) if lenient or few else len(reader.args)):
            return None
        root, d, row, column = group.get(r, (r, 0, 1, 0))
        for read in reader.reads:
            if read.func != f.name:
                continue
            rows = [k for k, a in enumerate(read.args)
                    if _follows(a, reader.args[row], reader.args)]
            if len(rows) != 1 or not lenient and any(
                    reader.args[row] in variables(a) for k, a in enumerate(read.args)
                    if k != rows[0]):
                # (`f[x, y / 8, y % 8]`: Halide bounds y % 8 by all its values, so each row
                # would compute all of them)
                return None
            columns = [k for k, a in enumerate(read.args)
                       if k != rows[0] and reader.args[column] in variables(a)]
            axes.add((rows[0], columns[0] if columns else int(rows[0] == 0)))
        owners.add(root)
        depth = max(depth, d)
    return (owners.pop(), depth, *axes.pop()) if len(owners) == 1 and len(axes) == 1 else None


def _follows(tree, var: str, pure: tuple[str, ...]) -> bool:
    """Whether a subscript follows the reader's row `var` without going back: the row plus or
    minus an offset no other pure variable of the reader's changes (a constant, a tap, a
    parameter), or divided by a constant (a coarser Func, upsampled). As the reader's rows
    advance, the rows it reads slide along with them, and each is computed once in a strip.
    (Not a multiple of the row: a finer Func, downsampled, reads rows no reader's row needs
    twice, and is better computed once. Not clamped: Halide 21's sliding window then skipped
    rows of the producer, Halide fuzz seed 952095's `f2[x, clamp(y + 2, 0, 6)]`.)"""
    def free(t):
        return not variables(t) & set(pure)

    if tree == ("var", var):
        return True
    if not isinstance(tree, tuple) or not tree:
        return False
    op, *args = tree
    if op == "call" and args[0] == "likely" and len(args[1]) == 1:
        return _follows(args[1][0], var, pure)
    if len(args) != 2:
        return False
    a, b = args
    if op == "add":
        return (_follows(a, var, pure) and free(b)) or (_follows(b, var, pure) and free(a))
    if op == "sub":
        return _follows(a, var, pure) and free(b)
    if op == "div":
        return _follows(a, var, pure) and b[0] == "int" and b[1] > 0
    if op == "mul":
        return (_follows(a, var, pure) and b[0] == "int" and b[1] > 0) or \
            (_follows(b, var, pure) and a[0] == "int" and a[1] > 0)
    return False


STRIP_ROWS = 32  # as Halide's own blur and harris schedules: measured best here against 64
#                 rows and "four strips per thread" (blur 0.86 ms against 1.2 and 2.2)
DEEP_GROUP = 4  # a strip root with members this deep gets strips twice as tall: each member
#                 recomputes its readers' halo at the top of every strip, and in a deep group
#                 those add up (stencil_chain's 8-deep groups: 44 -> 38 ms, ad hoc)


def _strips(f: hl.Func, info: FuncInfo, plan: _Plan, sweep: bool = False,
            strip_rows: int = STRIP_ROWS) -> tuple[hl.Var, int]:
    """Schedules a strip root (`sweep`: see `_sweeps`); returns the loop over its strips and
    the rows per strip (`strip_rows`, or all of them in a shorter Func)."""
    extents = plan.extents.get(info.name, ())
    y = hl.Var(info.args[1])
    strip, row = hl.Var(info.args[1] + "_strip"), hl.Var(info.args[1] + "_row")
    f.compute_root()
    rows = max(1, min(extents[1] if len(extents) > 1 else 1, strip_rows))
    lanes = plan.lanes(f.types()[0])
    vectorize = bool(extents) and extents[0] >= lanes
    # the pure definition may recompute rows and columns at the edges (ShiftInwards); its
    # updates may not, so theirs are guarded
    for k, stage in enumerate(_stages(f, info, 0, 1, lanes if vectorize else 0,
                                      hl.TailStrategy.ShiftInwards, extents, sweep)):
        stage.split(y, strip, row, rows, hl.TailStrategy.GuardWithIf if k
                    else hl.TailStrategy.ShiftInwards)
        if plan.schedule.parallel_outer:
            stage.parallel(strip)
    return strip, rows


def _tile(extent: int, lanes: int, vectors: int, half_is_cheaper: bool) -> tuple[int, int]:
    """(lanes, vectors) for the register tile of a dimension of this extent: no wider than the
    extent, with the least work beyond it (the last tile overlaps the one before it, whose
    points are computed twice), the widest of near ties. A half-width vector counts as half
    the work of a full one where `half_is_cheaper` (AVX-512: 256-bit multiply-adds issue
    twice as often as 512-bit ones there), else as a full one (AVX2: 128 and 256 bits issue
    alike; tbmm's 26-wide rows took 4-lane vectors and ran 3.8x PyTorch's time on an AMD
    EPYC)."""
    best = None
    for v in (lanes, lanes // 2):
        for n in range(1, vectors + 1):
            width = v * n
            if width > extent or v < 1:
                continue
            cost = max(v, lanes // 2) if half_is_cheaper else lanes
            work = math.ceil(extent / width) * n * cost / extent
            key = (round(work / 0.05), -width)
            if best is None or key < best[0]:
                best = (key, (v, n))
    return best[1] if best else (1, 1)


def _reduction(f: hl.Func, anchor: hl.Func, info: FuncInfo, plan: _Plan, funcs, inputs,
               at=None, stack: bool = False) -> str:
    """The register-tiled schedule of the module's docstring, computed once or (`at`: a Func
    and a loop of it) there, its values then on the stack where `stack` says (not a heap
    allocation per tile of the loop). Returns what it did."""
    s = plan.schedule
    if at is not None:
        s = attrs.evolve(s, parallel_outer=False)
        anchor.compute_at(*at)
        if stack:
            anchor.store_in(hl.MemoryType.Stack)
    else:
        anchor.compute_root()
    if not info.args:  # a single value: nothing to tile
        f.compute_root()
        return "computed once"
    p0, p1 = info.args[0], (info.args[1] if len(info.args) > 1 else None)
    extents = plan.extents.get(info.name) or (1,) * len(info.args)
    extent = dict(zip(info.args, extents))
    # (An update Halide cannot prove associative keeps the register tiles below: serial rows
    # ran a softmax gradient's scalar exps 15% slower than the packed, vectorised tiles. So
    # does bfloat16, whose vector reductions Halide 21 gives LLVM with an integer intrinsic.)
    r0 = _rvars_by_memory(info)[0]
    if plan.row_vectors(info.name) and info.operator in ("add", "mul", "max", "min") \
            and not f.type().is_bfloat() and (
                _along_rows(info, p0, p1, r0) or
                (extents[0] or 1 << 20) * 2 < plan.lanes(f.type()) and _contiguous(info, r0)):
        # (the second: an output too narrow to vectorise, summed along memory, a weight
        # gradient's d_W(f,c,kh,kw) +=! d_O(n,f,h,w) * I(n,c,h+kh,w+kw) over n, h, w, whose
        # register tiles ran one lane wide, along kw)
        taps = extents[0] or 1

        def rows_of(q):
            return max(1, min(TAP_ROWS, plan.accumulators() // taps, extent[q] or 1 << 20))

        # (a sum along a few constant points, a pooling window's, has no vector to fill)
        r0_extent = info.rvar_extents[info.rvars.index(r0)]  # (None: not a constant)
        short = r0_extent is not None and r0_extent < plan.lanes(f.type())
        q = None if _along_rows(info, p0, p1, r0) or p1 is None or short or taps < 1 else \
            _tap_rows(info, r0, taps, rows_of)
        if q is not None:
            # (a row of whole vectors: a masked last one kept the tile's partial sums in
            # memory, with masked loads and stores, for the whole loop: a 8x16x32x32 3x3
            # weight gradient's 30-wide rows on AVX2, 2.7 ms; 0.9 rounded up to 32)
            lanes = plan.lanes(f.type())
            planned = _planned_rvar_extent(info, plan, r0)
            if plan.round_rows and planned and planned % lanes:
                raise RoundedRows(info.name, r0, lanes)
            return _tap_tiles(f, anchor, info, plan, q, taps, rows_of(q))
        return _row_reduction(f, anchor, info, plan)
    want_vectors, want_rows = s.register_tile
    # A small window (pooling's 2x2) reuses a tile's accumulators only a few times: the time
    # goes into reading the input, and a small tile of 2 x 4 vectors runs twice as fast as a
    # full register file of them (max pooling, 32x64x56x56).
    window = math.prod(e or 1 << 20 for e in info.rvar_extents)
    small_window = window <= 16
    if not want_vectors:
        want_vectors = 2 if small_window else max(1, min(4, plan.accumulators() // 6))
    if not want_rows and small_window:
        want_rows = 4
    # (a few taps known at compile time, computed per tile of another reduction: unrolled,
    # LLVM reuses the loads the tile's rows share)
    unroll_taps = at is not None and small_window and None not in info.rvar_extents
    lanes, avx512 = plan.lanes(f.type()), plan.target.has_feature(hl.TargetFeature.AVX512)
    if at is None and not s.register_tile[0] and s.pack_operands:
        p0 = _vector_dim(info, extent, lanes, lanes if avx512 else 2 * lanes)
    lanes, vectors = _tile(extent[p0], lanes, want_vectors, avx512)
    width = lanes * vectors
    rows = 1
    others = [a for a in info.args if a != p0]
    p1 = others[0] if others else None
    if p1 is not None:
        p1 = _tile_rows(info, p0, vectors, lambda q: max(1, min(
            want_rows or plan.accumulators() // vectors, extent[q] or 1 << 20)))
        rows = max(1, min(want_rows or plan.accumulators() // vectors, extent[p1]))
    outer = tuple(a for a in info.args if a not in (p0, p1))
    vectorized = lanes > 1
    if p0 != info.args[0]:  # (each tile's values with p0 innermost: vectors in registers)
        f.reorder_storage(*_vars([p0, *others]))

    # Reads strided in p0 that do not depend on p1: packed per column of tiles.
    packs = []
    if s.pack_operands and vectorized:
        for r in info.reads:
            dims = r.dims_using(p0)
            if len(dims) == 1 and dims[0] > 0 and r.args[dims[0]] == ("var", p0) \
                    and (p1 is None or not r.dims_using(p1)) \
                    and (r.func in funcs or r.func in inputs):
                packs.append((r, dims[0]))

    x, xo, xi = hl.Var(p0), hl.Var(f"{p0}_o"), hl.Var(f"{p0}_i")
    shift = hl.TailStrategy.ShiftInwards  # the last tile overlaps: no tile leaves the tensor
    anchor.split(x, xo, xi, width, shift)
    if p1 is not None:
        y, yo, yi = hl.Var(p1), hl.Var(f"{p1}_o"), hl.Var(f"{p1}_i")
        anchor.split(y, yo, yi, rows, hl.TailStrategy.GuardWithIf)
        # With packed panels, all the rows of tiles of one column reuse its panel. Where
        # there are too few columns (and no batch dimension) to keep every core busy, the
        # operands are packed once, whole, and the rows of tiles run in parallel instead.
        # Computed per tile of another reduction (`at`), it would pack its operands (a
        # filter's weights: they do not depend on p1) again for every one of those tiles.
        columns = math.ceil((extent[p0] or 1 << 20) / width) * math.prod(extent[a] for a in outer)
        small = bool(packs) and p0 != info.args[0] and _small_panels(packs, plan, inputs)
        packed_whole = bool(packs) and (columns < 2 * plan.threads or at is not None or small)
        # Without packing, the same holds where the operands that every row of tiles reads
        # alike (a matrix product's B(k, n)) outgrow the cache: column by column, each
        # column's slice of them stays in cache for all its rows, where row by row every row
        # of tiles streamed all of them again (a 1024^3 matrix product: 21 -> 7 ms).
        by_columns = packs and not packed_whole or not packs and at is None and \
            _shared_operand_bytes(info, plan, p1, f.type().bytes()) > COLUMN_ORDER_BYTES
        tile_loops = [yo, xo] if by_columns else [xo, yo]
        anchor.reorder(xi, yi, *tile_loops, *_vars(outer))
    else:
        tile_loops, packed_whole, by_columns, small = [xo], False, False, False
        anchor.reorder(xi, xo, *_vars(outer))
    if vectorized:
        anchor.vectorize(xi, lanes)
    loops = [*tile_loops, *_vars(outer)]
    if s.parallel_outer:
        trip = {xo.name(): math.ceil((extent[p0] or 1 << 20) / width),
                **{a: extent[a] or 1 << 20 for a in outer}}
        if p1 is not None:
            trip[yo.name()] = math.ceil((extent[p1] or 1 << 20) / rows)
        trips = [trip[v.name()] for v in loops]
        # (the loops others are computed at, the tile's and a packed panel's, stay whole)
        kept = len(loops) if info.name in plan.loops_kept else \
            1 + (bool(packs) and not packed_whole)
        loops[-1] = _balanced(anchor, loops, trips, kept, plan.threads)
        anchor.parallel(loops[-1])
        if at is None:
            plan.parallel_loops[info.name] = (anchor, loops[-1].name())

    f.compute_at(anchor, tile_loops[0])
    plan.tiles[info.name] = _Tiles(anchor, tile_loops[0], rows)
    # A fixed-size tile (the last row of tiles may compute fewer rows): Halide then puts it on
    # the stack, where LLVM keeps it in registers, not in a heap allocation per tile. (Forcing
    # MemoryType.Stack as well made the MLP layers 1.5x slower.)
    f.bound_storage(x, width)
    if p1 is not None:
        f.bound_storage(hl.Var(p1), rows)
    inner = [x] + ([y] if p1 is not None else [])
    stages = [f, f.update(0)] + [f.update(1 + k) for k in range(info.epilogue)]
    for k, stage in enumerate(stages):
        if k == 1:  # the reduction: the tile's points innermost, the reduction loops outside
            # (those a predicate bounds outermost: Halide makes their extents the predicate's,
            # 1 or 2 of a strided gradient's phase taps, too short to run innermost: the
            # phases of conv_s2's input gradient, 8-9.6 -> 4.8-5.7 ms, PyTorch 5.4-5.8)
            order = [r for r in info.rvars if r not in info.predicated] + list(info.predicated)
            stage.reorder(*inner, *[hl.RVar(r) for r in order], *_vars(outer))
        elif k > 1:  # an epilogue: in the order of the tile (which also tells Halide that it
            stage.reorder(*inner, *_vars(outer))  # is scheduled, where nothing else is)
        if vectorized:
            stage.vectorize(inner[0], lanes)
            if vectors > 1:
                stage.unroll(inner[0])
        if rows > 1:
            stage.unroll(inner[1])
        if k == 1 and unroll_taps:
            for r in info.rvars:
                stage.unroll(hl.RVar(r))
        if k == 1 and s.unroll_reduction > 1:
            stage.unroll(hl.RVar(info.rvars[0]), s.unroll_reduction, hl.TailStrategy.GuardWithIf)
    for r, dim in packs:
        _pack((funcs.get(r.func) or inputs[r.func]).in_(f), dim, anchor,
              None if packed_whole else xo, s.parallel_outer)
    copied = []
    if by_columns and not packs and vectorized:
        # (and each column's slice of them copied together: B(k, n)'s rows lie N floats apart,
        # a power of two that maps a 64-column slice onto a few cache sets, so it did not stay
        # in cache after all: 18.9 ms without the copy, against 7 with it)
        for r in info.reads:
            if not r.dims_using(p1) and r.args and r.args[0] == ("var", p0) and \
                    (r.func in funcs or r.func in inputs) and r.func not in copied:
                panel = (funcs.get(r.func) or inputs[r.func]).in_(f)
                panel.compute_at(anchor, xo)
                panel.vectorize(panel.args()[0], lanes, hl.TailStrategy.GuardWithIf)
                copied.append(r.func)
    # Reads along p0 that no tile row or outer dimension changes (a filter) but whose
    # reduction steps are far apart in memory (conv_layer's filter(c, kx, ky, ci), stepped
    # along ci at 1152 floats, a new page every step): copied once, whole, into the order the
    # reduction walks them, so each tile streams its operand (conv_layer 50-58 -> 42-44 ms).
    reordered = []
    if vectorized:
        for r in info.reads:
            order = _reduction_order(r, info, p0, p1, outer)
            if order is not None and r.func in inputs and r.func not in reordered and \
                    r.func not in {q.func for q, _ in packs}:  # (one wrapper per input)
                panel = inputs[r.func].in_(f)
                dims = panel.args()
                panel.compute_root().reorder_storage(*[dims[k] for k in order])
                panel.vectorize(dims[0], plan.lanes(panel.types()[0]),
                                hl.TailStrategy.GuardWithIf)
                reordered.append(r.func)

    # Reads along the tile's rows that no vector uses (a convolution's weights Wt(f, c, kh, kw)
    # in a tile of 28 rows of f): each row multiplies in its own element, broadcast from an
    # address of its own, and past a dozen rows those addresses outnumber the general registers:
    # LLVM reloaded them from the stack for every other multiply-add (perf annotate). Copied
    # once, whole, with the rows' dimension innermost, a tile's elements lie side by side: one
    # address and constant offsets. Only an operand every tile of every outer index shares
    # (weights, not tbmm's X(b, n, m): copied whole, it made tbmm 1.6x slower).
    by_rows = []
    if vectorized and p1 is not None and rows >= ROW_ADDRESSES:
        for r in info.reads:
            dims = r.dims_using(p1)
            if r.func in inputs and not r.dims_using(p0) and len(dims) == 1 and dims[0] > 0 \
                    and r.args[dims[0]] == ("var", p1) and \
                    not any(r.dims_using(v) for v in outer) and \
                    r.func not in {*reordered, *by_rows, *(q.func for q, _ in packs)}:
                # (a plain copy: weights are small; it gains as much as `_pack`'s unrolled 8x8
                # transposes, in paired runs, with less code to compile)
                panel = inputs[r.func].in_(f)
                args = [hl.Var(a.name()) for a in panel.args()]
                panel.compute_root().reorder_storage(
                    args[dims[0]], *[a for k, a in enumerate(args) if k != dims[0]])
                by_rows.append(r.func)

    along = f" of {p1}" if p1 is not None and p1 != info.args[1] else ""
    across = f" of {p0}" if p0 != info.args[0] else ""
    text = (f"tiles of {width} x {rows} ({vectors} vector{'s' * (vectors > 1)} of {lanes} lanes"
            f"{across} x {rows} row{'s' * (rows > 1)}{along}) held in registers" if vectorized
            else f"tiles of 1 x {rows}{along} (not vectorised: {p0} has extent {extent[p0]})")
    if packs:
        text += "; packed " + ", ".join(f"{inputs[r.func].name() if r.func in inputs else r.func}"
                                        for r, _ in packs) \
            + (" per column of tiles" if not packed_whole else " once, whole" + (
                "" if at is not None else " (small)" if small else
                " (too few columns of tiles to share among the cores)"))
    if reordered:
        text += "; " + ", ".join(inputs[n].name() for n in reordered) + \
            " copied once into the reduction's order"
    if by_rows:
        text += "; " + ", ".join(inputs[n].name() for n in by_rows) + \
            f" copied once with {p1} innermost"
    if by_columns and not packs:
        text += "; column by column of tiles" + (
            ", " + ", ".join(inputs[n].name() if n in inputs else n for n in copied) +
            " copied per column" if copied else "")
    if unroll_taps:
        text += "; its taps unrolled"
    if s.unroll_reduction > 1:
        text += f"; {info.rvars[0]} unrolled by {s.unroll_reduction}"
    if s.parallel_outer:
        text += f"; {loops[-1].name()} in parallel"
    return text


COLUMN_ORDER_BYTES = 1 << 20  # operands every row of tiles reads beyond which tiles go
#                               column by column (about half an L2 cache)


def _shared_operand_bytes(info: FuncInfo, plan: _Plan, p1: str, value_bytes: int) -> int:
    """The bytes of a reduction's reads that do not depend on its tile rows' variable `p1`,
    over the output's columns and the reduction, at the planned sizes (0 where a size is not
    known), counting `value_bytes` a value (the reduction's type): what every row of tiles
    reads again."""
    terms = 1
    for rvar in info.rvars:
        extent = _planned_rvar_extent(info, plan, rvar)
        if extent is None:
            return 0
        terms *= extent
    columns = (plan.extents.get(info.name) or (0,))[0] or 0
    shared = sum(1 for r in info.reads if not r.dims_using(p1))
    return shared * columns * terms * value_bytes


BALANCE = 0.9  # the least share of the cores' time a parallel loop's tasks may keep busy


def _balanced(f: hl.Func, loops: list[hl.Var], trips: list[int], kept: int, threads: int
              ) -> hl.Var:
    """The loop to run in parallel: the outermost of `loops` (innermost first, `trips` their
    trip counts), fused with the loops inside it, but the first `kept`, until its tasks share
    out evenly among the threads. conv_layer's 5 images on 2 cores kept one core idle a sixth
    of the time (1.18x Adams2019's schedule, which is parallel over 4 strips of columns)."""
    def share(tasks):
        # (a plan for sizes that shrank may see no iterations at all)
        return tasks / (threads * math.ceil(tasks / threads)) if tasks > 0 else 1.0

    outer, tasks = loops[-1], trips[-1]
    k = len(loops) - 1
    while share(tasks) < BALANCE and k > kept:
        k -= 1
        fused = hl.Var(f"{loops[k].name()}_{outer.name()}")
        f.fuse(loops[k], outer, fused)
        outer, tasks = fused, tasks * trips[k]
    return outer


def _reduction_order(read, info: FuncInfo, p0: str, p1: str | None, outer) -> list[int] | None:
    """The storage order (subscript positions, innermost first) in which a tile's steps
    through `read` are contiguous: p0's subscript, then those of the reduction variables,
    innermost first; None where that is the order it has, or the read is not a panel every
    tile shares (it uses the tile's rows or an outer dimension, or p0 is not its innermost
    subscript)."""
    if len(read.args) < 3 or read.args[0] != ("var", p0) or any(
            read.dims_using(v) for v in (p1, *outer) if v is not None):
        return None
    order = [0]
    for rv in info.rvars:  # (innermost first, as the reduction's loops run)
        order += [k for k in read.dims_using(rv) if k not in order]
    order += [k for k in range(len(read.args)) if k not in order]
    return order if order != sorted(order) else None


ROW_ADDRESSES = 12  # tile rows from which each reading its own address spills them (above)

PANEL_WHOLE_BYTES = 1 << 20  # packed operands up to this size packed once, whole, where the
#                              tiles vectorise another dimension than the innermost


def _small_panels(packs, plan: _Plan, inputs) -> bool:
    """Whether every operand to pack is at most PANEL_WHOLE_BYTES at the planned sizes (its
    extents known): a grouped convolution's weights, per column of tiles, were packed again
    for every image, group and output row."""
    for r, _ in packs:
        name = inputs[r.func].name() if r.func in inputs else r.func
        sizes = [plan.extents.get(f"{name}.extent.{k}", (None,))[0]
                 for k in range(len(r.args))]
        if None in sizes or math.prod(sizes) * 4 > PANEL_WHOLE_BYTES:
            return False
    return True


def _vector_dim(info: FuncInfo, extent: dict, lanes: int, narrow: int) -> str:
    """The output dimension a contraction's register tiles vectorise: its innermost, unless
    that is narrower than `narrow` and another fills whole vectors, which a read without it
    broadcasts and which reads with it that are strided get packed for. A grouped convolution's
    14-wide output rows took vectors of 8 lanes, half the machine's (AVX-512), where its 16
    output channels fill one; the tile's values are then stored across the output's rows, a
    scatter per row of the tile, once per 144 steps of the reduction there. With AVX2's 8
    lanes, rows narrower than two vectors give tiles one vector wide, whose every step loads
    an input vector and a weight per row (a load per multiply-add): `narrow` is two vectors
    there, and that convolution went from 45 to 15 ms on an AMD EPYC (ad hoc; PyTorch 16-20)."""
    p0 = info.args[0]
    if info.family != "reduction" or (extent[p0] or 0) >= narrow or len(info.args) < 2:
        return p0

    def filled(q):  # (the share of the lanes of whole vectors that hold values)
        e = extent[q] or 0
        return e / (math.ceil(e / lanes) * lanes) if e >= lanes else 0.0
    best = max(info.args[1:], key=filled)
    terms = math.prod(e or 1 << 20 for e in info.rvar_extents)
    if filled(best) < 0.75 or terms < lanes or \
            all(r.dims_using(best) for r in info.reads):
        return p0
    return best


def _tile_rows(info: FuncInfo, p0: str, vectors: int, rows_of) -> str:
    """The output dimension along which a register tile has its rows (`rows_of(q)` of them):
    the one that needs the fewest loads per accumulator at each step of the reduction. A read
    that uses the vectorised dimension p0 loads `vectors` vectors per row if it also uses the
    rows' dimension, else once for the whole tile, and a strided one (a stride-2
    convolution's `2*w + kw`) costs twice; a read without p0 is one broadcast per row, or one.
    A vector shifted by a reduction variable (a convolution's `w + kw`) mostly straddles two
    cache lines and costs twice too, and each of a tile's rows then loads its own: 28 rows of
    output rows left LLVM more row addresses than registers (8x16x32x32 conv2d, 3x3: 0.61 ms
    against 0.17 with rows of output channels).
    A convolution's rows are then its output channels, which no input read uses (a 3x3
    convolution at 32x32x32x32 ran 2.3x faster than with rows of output rows), and a matrix
    product's its second dimension. The second dimension keeps them unless another needs a
    quarter fewer loads."""
    def loads(q: str) -> float:
        rows = rows_of(q)
        total = 0.0
        for r in info.reads:
            per_row = rows if r.dims_using(q) else 1
            if r.dims_using(p0):
                unit = all(_unit_stride(r.args[k], p0) and variables(r.args[k]) == {p0}
                           for k in r.dims_using(p0))
                total += vectors * per_row * (1 if unit else 2)
            else:
                total += per_row
        return total / (vectors * rows)

    candidates = [a for a in info.args if a != p0]
    second = candidates[0]
    best = min(candidates, key=loads)
    return best if loads(best) < 0.75 * loads(second) else second


def _contiguous(info: FuncInfo, r0: str) -> bool:
    """Whether the reduction variable `r0` (its innermost in memory: `_rvars_by_memory`) moves
    every read that uses it along its innermost dimension only, one of them by one element: a
    loop that vector loads serve (a stride-2 read costs Halide two loads and a shuffle)."""
    using = [r for r in info.reads if r.dims_using(r0)]
    return bool(using) and all(r.dims_using(r0) == (0,) for r in using) and \
        any(_unit_stride(r.args[0], r0) for r in using)


def _unit_stride(tree, var: str) -> bool:
    """Whether a subscript moves by 1 when `var` does: `var`, or a sum with it as a term."""
    if tree == ("var", var):
        return True
    if isinstance(tree, tuple) and tree and tree[0] in ("add", "sub"):
        a, b = tree[1], tree[2]
        if var not in variables(b):
            return _unit_stride(a, var)
        if tree[0] == "add" and var not in variables(a):
            return _unit_stride(b, var)
    return False


def _along_rows(info: FuncInfo, p0: str, p1: str | None, r0: str | None = None) -> bool:
    """Whether the reduction runs along rows of its input: a read contiguous in reduction
    variable `r0` (default: the innermost) and strided in p0, with no second output dimension
    that would reuse it (a row sum, softmax's statistics, a matrix-vector product). Vectorising
    p0 would pack (transpose) the whole input for a single use; the reduction loop is
    vectorised instead."""
    r0 = r0 or info.rvars[0]
    return any(r.args and r.args[0] == ("var", r0) and r.dims_using(p0)
               and min(r.dims_using(p0)) > 0 and (p1 is None or r.dims_using(p1))
               for r in info.reads)


def _lane_partials(f: hl.Func, info: FuncInfo, inner: str, lanes: int, plan: _Plan) -> str:
    """Vectorises a reduction along its variable `inner`: vectors of `lanes` partial results
    per output point (Halide's rfactor), folded into the point's value once, after the loop.
    Halide's atomic vectorisation instead folds every vector into the value as it goes: a
    horizontal reduction per vector, which made a row maximum of a 512x1024 matrix 15x
    slower (0.75 ms against 0.05). Needs an update Halide can prove associative, as both do.
    Where `inner` runs for at least ROW_CHAIN_TERMS vectors at the planned sizes, ROW_CHAINS
    vectors of partial sums take turns, folded into one vector after the loop: one vector's
    adds wait for each other (3-4 cycles each), independent ones overlap (a 512x1024 layer
    norm's mean and variance were a third of its time, bound by that wait). Not for a
    maximum or minimum, whose instruction waits one cycle: there the wider vector only added
    work (the NaN test on 32 lanes). (Chains along the next RVar, where `inner` is short,
    made group norm's gradient, rows of 16, 15% slower.) Returns what it did, for the
    explanation."""
    outer, lane_in, lane = hl.RVar(f"{inner}_o"), hl.RVar(f"{inner}_l"), hl.Var(f"{info.name}_lane")
    extent = _planned_extent(info, plan.extents, inner)
    chains = ROW_CHAINS if info.operator == "add" and extent is not None and \
        extent >= lanes * ROW_CHAIN_TERMS else 1
    f.update(0).split(hl.RVar(inner), outer, lane_in, lanes * chains, hl.TailStrategy.GuardWithIf)
    if chains == 1:
        partials = f.update(0).rfactor(lane_in, lane)
        partials.compute_at(f, hl.Var(info.args[0])).vectorize(lane)
        partials.update(0).vectorize(lane)
    else:
        chain, in_vector = hl.RVar(f"{inner}_c"), hl.RVar(f"{inner}_v")
        chain_var = hl.Var(f"{info.name}_chain")
        f.update(0).split(lane_in, chain, in_vector, lanes, hl.TailStrategy.GuardWithIf)
        partials = f.update(0).rfactor([(chain, chain_var), (in_vector, lane)])
        folded = f.update(0).rfactor(in_vector, lane)
        folded.compute_at(f, hl.Var(info.args[0])).vectorize(lane)
        folded.update(0).vectorize(lane)
        partials.compute_at(folded, hl.Var(info.args[0])).vectorize(lane).unroll(chain_var)
        partials.update(0).reorder(lane, chain_var, outer).vectorize(lane).unroll(chain_var)
    return f"in vectors of {lanes} lanes" + (f", {chains} vectors in turn" if chains > 1 else "")


# Independent vectors of partial sums a long row reduction keeps (`_lane_partials`), where the
# row has at least ROW_CHAIN_TERMS vectors per chain. Four hide an add's latency (4 cycles) on
# the two load ports; eight were slower on a 512x1024 layer norm (0.18 against 0.16 ms).
ROW_CHAINS, ROW_CHAIN_TERMS = 4, 16


def _planned_rvar_extent(info: FuncInfo, plan: _Plan, rvar: str) -> int | None:
    """The extent of a reduction's variable: its constant, or its tree at the planned sizes;
    None where neither is known."""
    return _planned_extent(info, plan.extents, rvar)


def _planned_extent(info: FuncInfo, extents, rvar: str) -> int | None:
    """`_planned_rvar_extent` at the planned `extents` (Func name -> extents)."""
    k = info.rvars.index(rvar)  # (a reduction's FuncInfo has an extent and a tree per RVar)
    if info.rvar_extents[k]:
        return info.rvar_extents[k]
    known = {name: v[0] for name, v in extents.items() if ".extent." in name}
    try:
        return int(evaluate(info.rvar_extent_trees[k], known))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _rvars_by_memory(info: FuncInfo) -> tuple[str, ...]:
    """The reduction's variables, innermost first, in the order of the subscripts they index
    in the read that uses most of them. TC's reduction variables come in the order they appear
    (group norm's `X(n,g,d,h,w)` sums with d innermost, across rows of memory); this is the
    order that walks the input contiguously."""
    reads = [r for r in info.reads if any(r.dims_using(v) for v in info.rvars)]
    if not reads:
        return info.rvars
    read = max(reads, key=lambda r: sum(bool(r.dims_using(v)) for v in info.rvars))
    return tuple(sorted(info.rvars, key=lambda v: (min(read.dims_using(v), default=len(read.args)),
                                                   info.rvars.index(v))))


def _in_memory_order(f: hl.Func, info: FuncInfo) -> tuple[str, ...]:
    """Reorders the reduction's loops by `_rvars_by_memory` (a float sum then adds in another
    order, as any vectorised reduction does); returns that order."""
    order = _rvars_by_memory(info)
    if order != info.rvars:
        f.update(0).reorder(*[hl.RVar(r) for r in order], *_vars(info.args))
    return order


TAP_ROWS = 8  # rows of a tap tile (`_tap_tiles`), at most: taps x rows vectors in registers


def _tap_rows(info: FuncInfo, r0: str, taps: int, rows_of) -> str | None:
    """The output dimension past p0 along which `_tap_tiles` stacks its rows (`rows_of(q)` of
    them): the one that needs the fewest vector loads per partial at each step along r0 (a
    read loads a vector per tap if it uses p0, per row if it uses the dimension); None where
    none needs a quarter fewer than a vector per point loading every read."""
    p0 = info.args[0]
    using = [r for r in info.reads if r.dims_using(r0)]

    def loads(q: str) -> float:
        rows = rows_of(q)
        return sum((taps if r.dims_using(p0) else 1) * (rows if r.dims_using(q) else 1)
                   for r in using) / (taps * rows)

    best = min(info.args[1:], key=loads, default=None)
    return best if best is not None and loads(best) < 0.75 * len(using) else None


def _tap_tiles(f: hl.Func, anchor: hl.Func, info: FuncInfo, plan: _Plan, q: str, taps: int,
               rows: int) -> str:
    """A reduction too narrow to vectorise, summed along memory (a weight gradient's
    d_W(f,c,kh,kw) +=! d_O(n,f,h,w) * I(n,c,h+kh,w+kw), summed with w innermost), in tiles of
    all its p0 points (`taps`: kw) by `rows` points of `q` (output channels f): each point
    a vector of partial sums along the memory-innermost reduction variable (Halide's rfactor),
    the tile's vectors held in registers over the whole reduction, so that one load of d_O
    serves every tap and one of I every channel of the tile, where a vector per output point
    loaded both for each (a 32x32x32x32 3x3 weight gradient: 30 -> 6 ms, ad hoc). The
    partials are folded once, per tile."""
    lanes = plan.lanes(f.type())
    order = _in_memory_order(f, info)
    p0, r0 = info.args[0], order[0]
    rest = [a for a in info.args[1:] if a != q]
    x, qv = hl.Var(p0), hl.Var(q)
    xo, xi, qo, qi = hl.Var(f"{p0}_o"), hl.Var(f"{p0}_i"), hl.Var(f"{q}_o"), hl.Var(f"{q}_i")
    # (p0 split too, though the plan's tile spans it: a call with more taps than planned
    # gets more tiles, where one fixed-size tile would not hold them)
    guard = hl.TailStrategy.GuardWithIf
    anchor.split(x, xo, xi, taps, guard).split(qv, qo, qi, rows, guard)
    anchor.reorder(xi, qi, xo, *_vars(rest), qo)
    loops = [xo, *_vars(rest), qo]
    level = xo
    if plan.schedule.parallel_outer:
        ext = dict(zip(info.args, plan.extents.get(info.name) or (1 << 20,) * len(info.args)))
        trips = [math.ceil((ext[p0] or 1 << 20) / taps)] + [ext[a] or 1 << 20 for a in rest] \
            + [math.ceil((ext[q] or 1 << 20) / rows)]
        outer = _balanced(anchor, loops, trips, 1, plan.threads)
        anchor.parallel(outer)
    f.compute_at(anchor, level)
    r_out, r_lane = hl.RVar(f"{r0}_o"), hl.RVar(f"{r0}_l")
    lane = hl.Var(f"{info.name}_lane")
    f.update(0).split(hl.RVar(r0), r_out, r_lane, lanes, hl.TailStrategy.GuardWithIf)
    partials = f.update(0).rfactor(r_lane, lane)
    partials.compute_at(anchor, level)
    # (fixed-size, on the stack, every index constant once unrolled: LLVM keeps the tile's
    # vectors in registers)
    partials.bound_storage(x, taps).bound_storage(qv, rows)
    partials.reorder_storage(lane, x, qv, *_vars(rest))  # (rfactor puts the lane outermost)
    partials.reorder(lane, x, qv, *_vars(rest))
    # (the next reduction variable inside r0's vectors: r0 is often one vector long (a 16-wide
    # output row), and LLVM keeps the tile's partials in registers only across the innermost
    # loop, storing and reloading all of them around it: with h innermost, once per row of
    # vectors instead of once per vector, 4.3 -> 3.2 ms for conv_s2's weight gradient)
    inner = [hl.RVar(order[1]), r_out] if len(order) > 1 else [r_out]
    partials.update(0).reorder(lane, x, qv, *inner, *[hl.RVar(r) for r in order[2:]],
                               *_vars(rest))
    for stage in (partials, partials.update(0)):  # (unrolled where the reorder put them)
        stage.vectorize(lane)
        stage.unroll(x, taps, guard).unroll(qv, rows, guard)
    for k in range(info.epilogue):
        f.update(1 + k).reorder(x, qv, *_vars(rest))
    return (f"tiles of {taps} x {rows} of {q}, each point a vector of partial sums along "
            f"{r0} ({lanes} lanes) held in registers, folded once per tile"
            + (f"; its reduction variables innermost in memory first: {', '.join(order)}"
               if order != info.rvars else "")
            + (f"; {outer.name()} in parallel" if plan.schedule.parallel_outer else ""))


def _row_reduction(f: hl.Func, anchor: hl.Func, info: FuncInfo, plan: _Plan) -> str:
    """Blocks of rows in parallel; each row's reduction loop vectorised in memory order, with
    a vector of partial results per row (`_lane_partials`, for an update Halide proves
    associative; the order of a float sum changes, as with any vectorisation)."""
    lanes = plan.lanes(f.type())
    block = 8
    x, xo, xi = hl.Var(info.args[0]), hl.Var(f"{info.args[0]}_o"), hl.Var(f"{info.args[0]}_i")
    outer = _vars(info.args[1:])
    anchor.split(x, xo, xi, block, hl.TailStrategy.GuardWithIf).reorder(xi, xo, *outer)
    parallel = plan.schedule.parallel_outer
    if parallel:
        anchor.parallel(outer[-1] if outer else xo)
    f.compute_at(anchor, xo)
    f.bound_storage(x, block)
    order = _in_memory_order(f, info)
    how = _lane_partials(f, info, order[0], lanes, plan)
    for k in range(info.epilogue):
        f.update(1 + k).reorder(x, *outer)
    return (f"rows in blocks of {block}, the reduction over {order[0]} {how}"
            + (f" (its variables reordered, innermost in memory first: "
                                f"{', '.join(order)})" if order != info.rvars else "")
            + (f"; {(outer[-1] if outer else xo).name()} in parallel" if parallel else ""))


def _pack(panel: hl.Func, dim: int, anchor: hl.Func, level: hl.Var | None,
          parallel: bool) -> None:
    """A read across the vectorised dimension (subscript `dim`), copied into a panel whose
    storage has that dimension innermost: per column of tiles (at `level` of the anchor), or
    once, whole (`level` None). The copy is a transpose: 8x8 blocks, one dimension vectorised
    and the other unrolled, which LLVM turns into shuffles (five times faster than gathers
    here)."""
    args = [a.name() for a in panel.args()]
    inner, source_inner = hl.Var(args[dim]), hl.Var(args[0])
    rest = [hl.Var(a) for k, a in enumerate(args) if k not in (0, dim)]
    if level is None:
        panel.compute_root()
    else:
        panel.compute_at(anchor, level)
    panel.reorder_storage(inner, source_inner, *rest)
    io, ii, so, si = (hl.Var(f"{a}_{k}") for k, a in enumerate(("pi", "pi", "ps", "ps")))
    guard = hl.TailStrategy.GuardWithIf
    panel.split(inner, io, ii, 8, guard).split(source_inner, so, si, 8, guard)
    panel.reorder(ii, si, io, so, *rest).vectorize(ii).unroll(si)
    if level is None and parallel:
        panel.parallel(rest[-1] if rest else so)
