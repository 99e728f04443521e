"""A TC function and a call's shapes -> one CUDA kernel: the passes in order (the paper's
Figure 2), each a function of its own module.

    bind        check the call against the signature: sizes, scalar values
    lower       range inference and Halide Funcs                 (halide/ranges.py, lower.py)
    extract     the polyhedral model from the Funcs              (poly/scop.py)
    dependences exact dataflow                                   (poly/scop.py)
    schedule    the isl scheduler with a fusion strategy         (poly/schedule.py)
    tile        the outermost band                               (poly/tiling.py)
    map         blocks, threads, barriers, unrolling, reductions (poly/mapping.py, reduction.py)
                (where one kernel of all the statements would get too little of the GPU,
                they are split into launches, each scheduled, tiled and mapped on its own:
                                                                  poly/launches.py)
    promote     shared and private memory, copies and barriers   (poly/promotion.py)
                (then contraction tiles as warp mma.sync steps:   poly/tensorcore.py)
    codegen     CUDA source from the isl AST                     (cuda/codegen.py)

Sizes: the scop is extracted once with symbolic sizes. The scheduler sees them symbolic, as in
TC, unless `fixParametersBeforeScheduling` or `scheduleSpecialize` asks for the call's values;
tiling, mapping and code generation always know them (the paper inserts them "just in time"),
so a kernel serves one set of shapes. Sizes named `dynamic` stay isl parameters through every
pass and become kernel arguments, so that one kernel serves every value of them (see
`check_dynamic` and `Kernel.launch_grid`).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import time
import warnings
from collections.abc import Sequence

import attrs
import islpy as isl
import numpy as np

from tcstage.cuda.codegen import CudaKernel, generate, kernel_name, module_source
from tcstage.errors import TCError, TCWarning, warn
from tcstage.halide.lower import Lowered
from tcstage.options import MappingOptions
from tcstage.poly.budget import WorkLimitExceeded
from tcstage.poly.launches import MERGE_FUSION_SECONDS, groups, partition, restricted
from tcstage.poly.mapping import Mapped, map_to_gpu
from tcstage.poly.notes import OptionNote, no_effect_notes
from tcstage.poly.overlap import Overlap, build, overlap_groups
from tcstage.poly.promotion import SHARED_BYTES, Promoted, promote
from tcstage.poly.reduction import splittable_reductions
from tcstage.poly.tensorcore import find_contractions, map_tensor_cores
from tcstage.poly.schedule import FUSION_SECONDS, compute_schedule, scheduled_scop
from tcstage.poly.scop import Scop, check_bounds, extract_scop, specialize
from tcstage.poly.tiling import Tiled, tile_outer_band
from tcstage.program import Binding, TCFunction

STAGES = ("lower", "extract", "dependences", "schedule", "tile", "map", "promote", "codegen")


@attrs.frozen
class Compiled:
    """Every intermediate of one compilation, for running, printing and testing."""

    fn: TCFunction
    options: MappingOptions
    binding: Binding  # the shapes (and specialised scalar values) it was compiled for
    lowered: Lowered
    scop: Scop  # with the sizes fixed
    schedule: isl.Schedule  # from the isl scheduler, before tiling
    tiled: Tiled
    mapped: Mapped
    promoted: Promoted
    cuda: CudaKernel | None  # None where compiled with codegen=False
    timings: dict  # stage -> seconds
    notes: tuple[OptionNote, ...] = ()  # options that could not take effect, and why
    dynamic: tuple[str, ...] = ()  # size variables left symbolic: any value at launch
    tensor_tiles: tuple = ()  # contraction tiles on tensor cores (poly/tensorcore.py)
    # A kernel sequence (poly/launches.py): each launch compiled on its own, in launch order;
    # this Compiled's scop is the whole function's, its schedule, tiled, mapped, promoted and
    # tensor_tiles those of the first launch, its cuda all the launches' kernels in one
    # source (grid and block: the first's). Empty for a kernel of one launch.
    launches: tuple["Compiled", ...] = ()
    overlap: Overlap | None = None  # overlapped tiles: what each block recomputes

    @property
    def shared_bytes(self) -> int:
        """Static shared memory per block: the promoted tiles, overlapped tiles' intermediates
        counted as their pool."""
        shared = self.promoted.shared_bytes
        if self.overlap is not None:
            shared += self.overlap.pool_bytes - sum(
                p.nbytes for p in self.promoted.promotions
                if p.memory == "shared" and p.tensor in self.overlap.pool)
        return shared

    @property
    def parts(self) -> tuple["Compiled", ...]:
        """The launches, in order: this Compiled alone for a kernel of one launch."""
        return self.launches or (self,)


def as_options(options) -> MappingOptions:
    """MappingOptions from an object, a chain text or a preset name (None: the single-thread
    options, MappingOptions())."""
    if options is None:
        return MappingOptions()
    if isinstance(options, MappingOptions):
        return options
    if isinstance(options, str):
        text = options.strip()
        return MappingOptions.parse(text) if "(" in text else MappingOptions.named(text)
    raise TCError(f"options must be a tcstage.MappingOptions, a chain such as "
                  f"'MappingOptions().tile(32, 32)' or a preset name; got {type(options).__name__}")


def compile_cuda(fn: TCFunction, args: Sequence, out=None, options=None,
                 dynamic: Sequence[str] = (), launch_options=None,
                 codegen: bool = True) -> Compiled:
    """Compiles fn for the shapes of `args` (arrays or shape tuples, scalars as values); the
    size variables in `dynamic` stay symbolic (their values in `args` only pick a sample).
    `launch_options`: where the statements run as several launches, a function from a
    launch's position and the TC statement indices it runs to that launch's options
    (options="auto"'s heuristic, or a list of options given one per launch); `options`
    still decide the launches. `codegen=False` stops before the CUDA source (`cuda` is None):
    what the cost model and the tuner's first phase need, at under half the cost."""
    options = as_options(options)
    dynamic = check_dynamic(fn, dynamic)
    timings: dict[str, float] = {}
    stage = functools.partial(_stage, fn.name, timings)
    with stage("lower"):
        binding = fn.bind(args, out, shapes_only=True)
        lowered = fn.lowered_for(args, {}, out, dynamic)
    with stage("extract"):
        symbolic = extract_scop(lowered)
        # Dynamic sizes stay parameters (>= 0) from here to the CUDA source. Tiling and mapping
        # take loop counts over all their values (value_count: UNBOUNDED where a loop grows with
        # them), so block, thread and tile sizes and promoted buffers never depend on them.
        scop = specialize(symbolic, {k: v for k, v in binding.sizes.items()
                                     if k not in dynamic})
        check_bounds(scop, lowered)
    fix_first = options.fix_parameters_before_scheduling or options.schedule_specialize
    with stage("dependences"):
        to_schedule, dependences = scheduled_scop(symbolic, scop, fix_first)
    # (statements, options) -> (mapping, the warnings mapping them gave); a set of statements
    # may be mapped only to weigh it as a launch (poly/launches.py), so its warnings wait
    # until it is one
    mappings: dict[tuple, tuple[_Mapping, list]] = {}

    def mapped(names, own: MappingOptions = options, merging: bool = False) -> tuple:
        key = (tuple(names), str(own))
        if key not in mappings:
            whole = len(key[0]) == len(scop.statements)
            with held_warnings() as said:
                made = _map(lowered, own, *(
                    (scop, to_schedule, dependences) if whole else
                    (restricted(scop, key[0]), restricted(to_schedule, key[0]),
                     _within(dependences, to_schedule, key[0]))), stage,
                    MERGE_FUSION_SECONDS if merging else FUSION_SECONDS)
            mappings[key] = (made, said)
        return mappings[key]

    def launched(names, own: MappingOptions) -> _Mapping:
        made, said = mapped(names, own)
        say_again(said)
        return made

    def launch_own(names) -> MappingOptions:
        if launch_options is None:
            return options
        indices = {s.tc_statement for s in scop.statements if s.name in set(names)}
        return launch_options(len(specs), indices)
    # (the stages' times add up over the statement sets tried and the launches made)
    # per launch: (its options, mapping, its overlap or None, promoted or None)
    specs, overlap_notes = [], []
    for names, found in _overlap_groups(lowered, scop, dependences, options, dynamic,
                                        overlap_notes):
        if found is not None:
            made = _overlapped(lowered, options, restricted(scop, names), found,
                               _within(dependences, to_schedule, names), stage)
            if not isinstance(made, str):
                specs.append((options, *made))
                continue
            overlap_notes.append(made)
        whole = len(names) == len(scop.statements)
        launches = partition(*((scop, dependences) if whole else (
            restricted(scop, names), _within(dependences, to_schedule, names))), options,
            lambda names, merging=False: mapped(names, merging=merging)[0].parallelism)
        for launch in launches:
            own = launch_own(launch) if len(launches) > 1 or len(specs) else options
            specs.append((own, launched(launch, own), None, None))
    if len(specs) == 1:
        part = _launch(fn, options, binding, lowered, specs[0][1], kernel_name(fn.name), stage,
                       overlap=specs[0][2], promoted=specs[0][3], codegen=codegen)
        compiled = attrs.evolve(part, timings=timings, dynamic=dynamic)
    else:
        parts = tuple(_launch(fn, own, binding, lowered, m, f"{kernel_name(fn.name)}_{k}",
                              stage, launch=k, overlap=o, promoted=pr, codegen=codegen)
                      for k, (own, m, o, pr) in enumerate(specs))
        first = parts[0]
        cuda = CudaKernel(kernel_name(fn.name), module_source([p.cuda for p in parts]),
                          first.cuda.parameters, first.cuda.grid, first.cuda.block) \
            if codegen else None
        compiled = Compiled(fn, options, binding, lowered, scop, first.schedule, first.tiled,
                            first.mapped, first.promoted, cuda, timings,
                            tuple(dict.fromkeys(n for p in parts for n in p.notes)), dynamic,
                            first.tensor_tiles,
                            tuple(attrs.evolve(p, dynamic=dynamic) for p in parts),
                            first.overlap)
    ignored = no_effect_notes(options.calls())
    notes = compiled.notes + tuple(OptionNote("overlappedTiles(True)", why)
                                   for why in dict.fromkeys(overlap_notes))
    for note in notes:
        warn(f"in '{fn.name}', option {note}")
    if ignored:  # (one warning for them all: TC's option sets often carry several)
        warn(f"in '{fn.name}', options that never act in tcstage: "
             + "; ".join(str(n) for n in ignored))
    return attrs.evolve(compiled, notes=notes + ignored)


@attrs.frozen
class _Mapping:
    """Statements scheduled, tiled and mapped: one launch's first passes."""

    scop: Scop
    dependences: isl.UnionMap
    schedule: isl.Schedule
    tiled: Tiled
    mapped: Mapped
    contractions: dict
    not_contractions: list

    @property
    def parallelism(self) -> tuple[int, int]:
        """What poly/launches.py weighs: (blocks, threads per block)."""
        return math.prod(self.mapped.grid), math.prod(self.mapped.block)


def _map(lowered, options, scop: Scop, to_schedule: Scop, dependences: isl.UnionMap,
         stage, fusion_seconds: float = FUSION_SECONDS) -> _Mapping:
    """The statements of `scop` scheduled (the fusing ILPs within `fusion_seconds`), tiled
    and mapped to blocks and threads."""
    with stage("schedule"):
        schedule = compute_schedule(to_schedule, options.outer_schedule_fusion_strategy,
                                    options.outer_schedule_allow_skewing, dependences,
                                    fusion_seconds)
    with stage("tile"):
        tiled = tile_outer_band(schedule, options.tile_sizes, options.tile_imperfectly_nested,
                                dependences)
    with stage("map"):
        dtypes = {n: t.type.name for n, t in lowered.fn.tensors.items()}
        reductions = splittable_reductions(scop, lowered.halide_names(), dtypes)
        contractions, not_contractions = find_contractions(
            scop, lowered.halide_names(), dtypes) if options.use_tensor_cores else ({}, [])
        reductions = {k: r for k, r in reductions.items() if k not in contractions}
        mapped = map_to_gpu(tiled.schedule, dependences.intersect_params(scop.context),
                            scop.context, options, scop, reductions,
                            whole_warps=bool(contractions))
    return _Mapping(scop, dependences, schedule, tiled, mapped, contractions, not_contractions)


def _overlap_groups(lowered, scop: Scop, dependences, options, dynamic, notes: list):
    """The statements in groups, each with its overlapped tiles' plan or None (then it runs as
    kernels of its own, poly/launches.py); one group of all with None without the option.
    Why a group could not overlap goes to `notes`."""
    everything = [s.name for s in scop.statements]
    if not options.overlapped_tiles:
        return [(everything, None)]
    if dynamic:
        notes.append(f"the dynamic size(s) {', '.join(dynamic)} leave the tiles' halos without "
                     "a fixed size")
        return [(everything, None)]
    temps = {n for n, t in lowered.fn.tensors.items() if t.kind == "temp"}
    itemsize = {n: np.dtype(t.type.name).itemsize for n, t in lowered.fn.tensors.items()}
    limit = min(SHARED_BYTES, options.max_shared_memory if options.max_shared_memory
                is not None else SHARED_BYTES)
    return overlap_groups(scop, groups(scop, dependences), set(lowered.fn.outputs), temps,
                          options.tile_sizes, itemsize, limit, notes)


def _overlapped(lowered, options, scop: Scop, found, dependences, stage):
    """A launch of overlapped tiles of scop's statements ((mapping, overlap, promoted)), or
    why it cannot be."""
    dtypes = {n: t.type.name for n, t in lowered.fn.tensors.items()}
    try:
        with stage("schedule"):
            overlap = build(scop, found, dependences)
        with stage("map"):
            mapped = map_to_gpu(overlap.tiled.schedule, overlap.dependences.intersect_params(
                scop.context), scop.context, options, overlap.scop, {})
        if math.prod(mapped.grid) <= 1 < min(overlap.tiles, math.prod(options.blocks)):
            return "no tile loop could be mapped to blocks"
        with stage("promote"):  # (shared memory per tile: below the whole tile band)
            promoted = promote(overlap.scop, mapped,
                               attrs.evolve(options, shared_depth=len(found.tiles)), dtypes,
                               scratch=overlap.scratch, scratch_bytes=overlap.pool_bytes)
    except WorkLimitExceeded as exceeded:
        return exceeded.message
    shared = {p.tensor for p in promoted.promotions if p.memory == "shared"}
    missing = sorted(overlap.scratch - shared)
    if missing:
        why = [d for d in promoted.declined if any(d.startswith(f"shared {t} ") for t in missing)]
        return (f"the tile of {', '.join(missing[:4])} a block needs does not fit in shared "
                f"memory ({'; '.join(why) or 'not promoted'}): use smaller tiles")
    if any(p.prefix_dims < len(found.tiles) for p in promoted.promotions
           if p.tensor in overlap.scratch):  # (threads took tile loops: tiles run at once)
        return ("the tile loops went to threads, not blocks, so one block runs several tiles "
                "at once: ask for blocks (mapToBlocks) along the tiled dimensions")
    larger = [p.tensor for p in promoted.promotions if p.tensor in overlap.scratch
              and p.nbytes > overlap.reserved[p.tensor]]
    if larger:  # (the plan's boxes bound promotion's tiles: a bug if not)
        raise TCError(f"internal error: the shared buffers of {', '.join(larger)} outgrew the "
                      "bytes overlapped tiles kept for them")
    # (the depth given above is tcstage's, not the user's: no note of its own)
    promoted = attrs.evolve(promoted, notes=tuple(
        n for n in promoted.notes if not n.option.startswith("sharedDepth(")))
    if options.shared_depth is not None and options.shared_depth != len(found.tiles):
        promoted = attrs.evolve(promoted, notes=promoted.notes + (OptionNote(
            f"sharedDepth({options.shared_depth})", "overlapped tiles promote below their "
            f"tile band (depth {len(found.tiles)}): each tile's intermediates in buffers of "
            "their own"),))
    mapping = _Mapping(overlap.scop, overlap.dependences, overlap.tiled.schedule, overlap.tiled,
                       mapped, {}, [])
    return mapping, overlap, promoted


def _launch(fn, options, binding, lowered, mapping: _Mapping, name: str, stage,
            launch: int | None = None, overlap: Overlap | None = None,
            promoted: Promoted | None = None, codegen: bool = True) -> Compiled:
    """One kernel: mapped statements promoted and printed as the CUDA kernel `name`
    (`launch`: its place in a kernel sequence, None for the only one; `overlap`: what its
    overlapped tiles recompute, whose promotion `_overlapped` made)."""
    scop, mapped, contractions = mapping.scop, mapping.mapped, mapping.contractions
    dtypes = {n: t.type.name for n, t in lowered.fn.tensors.items()}
    with stage("promote"):
        promoted = promoted or promote(
            scop, mapped, options, dtypes,
            keep_global=frozenset(c.accumulator for c in contractions.values()),
            shared_only=frozenset(t for c in contractions.values()
                                  for t in (c.a.tensor, c.b.tensor)))
        schedule_tc, tensor_tiles, tc_notes = map_tensor_cores(
            promoted.schedule, scop, contractions,
            mapping.dependences.intersect_params(scop.context), math.prod(mapped.block))
        promoted = attrs.evolve(promoted, schedule=schedule_tc)
        if options.use_tensor_cores and not contractions:
            tc_notes += (OptionNote("useTensorCores(True)", "no contraction of half or "
                                    "bfloat16 operands into a float32 accumulator"
                                    + (f" ({'; '.join(mapping.not_contractions)})"
                                       if mapping.not_contractions else "")),)
    pool = ({p.buffer: overlap.pool[p.tensor] for p in promoted.promotions
             if p.memory == "shared" and p.tensor in overlap.pool}, overlap.pool_bytes) \
        if overlap is not None else ({}, 0)
    cuda = None
    if codegen:
        with stage("codegen"):
            cuda = generate(lowered, scop, mapped, promoted, str(options),
                            options.use_read_only_cache, tensor_tiles, name=name,
                            scratch_prefix="" if launch is None else f"_l{launch}", pool=pool)
    notes = mapping.tiled.notes + mapped.notes + promoted.notes + tc_notes
    return Compiled(fn, options, binding, lowered, scop, mapping.schedule, mapping.tiled,
                    mapped, promoted, cuda, {}, notes, (), tensor_tiles, (), overlap)


def _within(dependences: isl.UnionMap, scop: Scop, names) -> isl.UnionMap:
    """The dependences between these statements."""
    domain = restricted(scop, names).domain
    return dependences.intersect_domain(domain).intersect_range(domain)


def check_dynamic(fn: TCFunction, dynamic) -> tuple[str, ...]:
    """`dynamic` as a sorted tuple of size variables of fn, or a TCError naming the problem: a
    name that is not a size variable (with the closest one), a scalar input (those used in
    subscripts are specialised, so their values must be known when compiling), or a Halide
    pipeline (its sizes are fixed when its regions are inferred)."""
    if dynamic is None:
        return ()
    if isinstance(dynamic, str):
        names = (dynamic,)
    elif isinstance(dynamic, (tuple, list, set, frozenset)):
        names = tuple(dynamic)
    else:  # (an int would fail in tuple(); a dict would pass its keys unseen)
        raise TCError(f"dynamic= takes names of size variables (a str or a tuple of them); "
                      f"got {dynamic!r}")
    if not names:
        return ()
    if not all(isinstance(n, str) for n in names):
        raise TCError(f"dynamic= takes names of size variables (strings); got {dynamic!r}")
    from tcstage.halide.pipeline import HalideFunction
    if isinstance(fn, HalideFunction):
        raise TCError("dynamic= is for TC functions: a Halide pipeline's regions are inferred "
                      "for fixed output shapes, so its kernel serves those sizes only")
    checked = fn.checked
    sizes = sorted({d for t in checked.inputs for d in t.dims if d and not d.isdigit()})
    scalars = {t.name for t in checked.inputs if t.rank == 0}
    for n in names:
        if n in sizes:
            continue
        if n in scalars:
            raise TCError(f"dynamic={n!r}: {n} is a scalar input of '{fn.name}', not a size "
                          "variable; only the sizes of input tensors can be dynamic"
                          + (" (scalars used in subscripts are specialised: the kernel is "
                             "compiled for their values)" if n in fn.specialized_scalars
                             else ""))
        if n in checked.tensors:
            raise TCError(f"dynamic={n!r}: {n} is a tensor of '{fn.name}', not a size variable; "
                          f"its size variables: {', '.join(sizes) or 'none'}")
        by_lower = {d.lower(): d for d in sizes}  # (m for M: sizes are usually capitals)
        close = difflib.get_close_matches(n.lower(), list(by_lower), n=1)
        raise TCError(f"dynamic={n!r}: '{fn.name}' has no size variable {n}"
                      + (f"; did you mean '{by_lower[close[0]]}'?" if close else "")
                      + f" (its size variables: {', '.join(sizes) or 'none'})")
    return tuple(sorted(set(names)))


@contextlib.contextmanager
def _stage(function: str, timings: dict, name: str):
    """Times one stage. An exception other than a TCError is a compiler bug: it becomes a
    TCError that names the stage and the function (the original stays its __cause__)."""
    start = time.perf_counter()
    try:
        yield
    except (TCError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise TCError(f"internal error in stage '{name}' of '{function}': "
                      f"{type(e).__name__}: {e}",
                      notes=("this is a bug in tcstage; please report it with the TC, the "
                             "sizes and the options",)) from e
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def held_warnings():
    """Records the TCWarnings (and others) issued inside, for `say_again` (or silence)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", TCWarning)
        yield said


def say_again(said) -> None:
    """Warnings recorded while compiling, issued now (a TCWarning, as ever, from the caller's
    line outside tcstage)."""
    for one in said:
        if issubclass(one.category, TCWarning):
            warn(str(one.message))
        else:
            warnings.warn(one.message)


def function_of(source, name, inputs: tuple, output_shape) -> tuple:
    """(program or None, function, inputs) of a call `(source, name, *inputs)`: a TC function
    of a source or Program, or a Halide pipeline (tc.from_halide, or bare Funcs) with its
    output shapes fixed, which has no name argument (what came as `name` is its first input)."""
    from tcstage.halide.pipeline import HalideFunction, as_pipeline
    from tcstage.program import Program, define, resolve
    source = as_pipeline(source)
    if isinstance(source, HalideFunction):
        inputs = inputs if name is None else (name, *inputs)
        return None, source.specialized(output_shape if output_shape is not None
                                        else source._output_boxes(None)), inputs
    if output_shape is not None:
        raise TCError("output_shape= is for Halide pipelines (tc.from_halide); a TC function "
                      "infers its output shapes")
    program = source if isinstance(source, Program) else define(source)
    return program, resolve(program[name], inputs), inputs


