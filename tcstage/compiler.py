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

import collections
import contextlib
import difflib
import functools
import math
import re
import threading
import time
import warnings
from collections.abc import Sequence

import attrs
import islpy as isl
import numpy as np

from tcstage.cuda.codegen import CudaKernel, generate, kernel_name, module_source
from tcstage.errors import TCArgumentError, TCError, TCWarning, warn
from tcstage.halide.lower import Lowered
from tcstage.options import PRESETS, MappingOptions
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
        lowered = fn.lower(*args, out=out)
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
            with _held_warnings() as said:
                made = _map(lowered, own, *(
                    (scop, to_schedule, dependences) if whole else
                    (restricted(scop, key[0]), restricted(to_schedule, key[0]),
                     _within(dependences, to_schedule, key[0]))), stage,
                    MERGE_FUSION_SECONDS if merging else FUSION_SECONDS)
            mappings[key] = (made, said)
        return mappings[key]

    def launched(names, own: MappingOptions) -> _Mapping:
        made, said = mapped(names, own)
        _say_again(said)
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
                          + (f" (scalars used in subscripts are specialised: the kernel is "
                             f"compiled for their values)" if n in fn.specialized_scalars
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


# -- the public entry -----------------------------------------------------------------------------

COMPILED_KERNELS = 64  # kernels the in-process cache keeps (least recently used go first)
_kernels: collections.OrderedDict = collections.OrderedDict()
_kernels_lock = threading.Lock()


def compile(source, name: str | None = None, *inputs, options=None, target: str = "cuda", out=None,
            output_shape=None, dynamic: Sequence[str] = ()):
    """Compiles TC function `name` of `source` (TC text or a `Program`) to one CUDA kernel for
    the shapes of `inputs` (arrays, or shape tuples; scalars as values).

    `options`: a `MappingOptions`, its chain text, a preset name, or "auto": the best options
    the autotuner cached for this function, sizes and device, or else a default chosen from the
    TC's structure (with a TCWarning suggesting tuning); default: the single-thread options,
    `MappingOptions()`. A list gives one set per launch of a kernel sequence, in launch order
    (the first also decides the launches; docs/cuda.md "Kernel sequences").
    `target`: "cuda" (launch with pycuda) or "cuda-emulated" (the same source run on the CPU).
    `out`: the starting values of in/out outputs, as for calls.
    A Halide pipeline (`tc.from_halide(funcs)`) is compiled as `tc.compile(f, *inputs,
    output_shape=...)`: no name, and the shape of each output given.

    `dynamic`: size variables (e.g. `("B",)`) the kernel leaves symbolic: it takes any value
    of them at call time (the grid follows), while the other sizes stay fixed. Loops over
    them are never unrolled, tiles whose size would depend on them are not promoted, and
    index arithmetic is 64-bit.

    Compiling the same function for the same shapes, options and target again returns the same
    Kernel, from an in-process cache (the values of dynamic sizes are not part of the key).
    """
    from tcstage.cuda.runtime import Kernel, _check_target

    _check_target(target)  # before the work of compiling
    _, fn, inputs = function_of(source, name, inputs, output_shape)
    name = fn.name
    if inputs and isinstance(inputs[0], (MappingOptions, str)):
        raise TCArgumentError(
            f"tc.compile: {str(inputs[0])!r} stands where the first input of '{name}' goes; "
            f"tcstage takes the options by keyword, after the inputs: tc.compile(source, "
            f"'{name}', *inputs, options=...) (TC's order, compile(tc, name, options, "
            "*inputs), is not tcstage's)")
    dynamic = check_dynamic(fn, dynamic)  # before the work of finding options
    auto = isinstance(options, str) and options.strip().lower() == "auto"
    per_launch = listed = compiled = None
    if isinstance(options, (list, tuple)):
        options, per_launch, listed = _options_per_launch(name, options)
    if auto:
        options, per_launch, compiled, said = auto_options(fn, inputs, out, target)
    elif isinstance(options, MappingOptions) and (start := _starting_point(options)):
        warn(f"in '{name}': these options are {start}. tcstage's options are immutable: "
             "o.tile(32) returns new options and leaves o as it was (TC's change o in place), "
             "so a chain whose result was not kept is lost; pass the name as text (options="
             "\"naive\") to mean a starting point as it is")
    options = as_options(options)
    binding = fn.bind(inputs, out, shapes_only=True)
    fixed = tuple(sorted((k, v) for k, v in binding.sizes.items() if k not in dynamic))
    key = (_source_key(fn), name, fixed, dynamic,
           binding.specialization(fn), tuple(str(t.type) for t in fn.checked.inputs),
           str(options), target)
    # auto's structural default gives each launch of a sequence its own options: the same
    # kernel as these options alone where there is one launch
    own_key = key + ("options per launch",) if per_launch is not None else key
    if listed is not None:
        own_key = key = key + tuple(map(str, listed))
    with _kernels_lock:
        kernel = _kernels.get(own_key)
        if kernel is None and per_launch is not None and key in _kernels \
                and len(_kernels[key].launches) == 1:
            kernel = _kernels[key]
        if kernel is not None:
            _kernels.move_to_end(own_key if own_key in _kernels else key)
            return kernel
    if compiled is not None and not dynamic:  # (auto compiled it to weigh it)
        _say_again(said)
    elif auto and per_launch is None:
        # Tuned options from the cache: what in them had no effect is the tuner's affair, not
        # the caller's (a warm start is kept as written); kernel.explain() still lists it.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", f"in '{re.escape(name)}', option", TCWarning)
            warnings.filterwarnings("ignore", f"in '{re.escape(name)}', options that never "
                                    "act", TCWarning)
            compiled = compile_cuda(fn, inputs, out, options, dynamic, per_launch)
    else:
        compiled = compile_cuda(fn, inputs, out, options, dynamic, per_launch)
    if listed is not None and len(listed) != len(compiled.parts):
        runs = "; ".join(f"launch {k}: {', '.join(sorted({s.tensor for s in p.scop.statements}))}"
                         for k, p in enumerate(compiled.parts))
        raise TCError(f"tc.compile('{name}'): {len(listed)} sets of options were given, one per "
                      f"launch, but under the first set '{name}' runs as "
                      f"{len(compiled.parts)} launch(es) ({runs}): give one set per launch, in "
                      "this order (kernel.launches lists them)")
    kernel = Kernel(compiled, target)
    with _kernels_lock:
        _kernels[own_key] = kernel
        if len(kernel.launches) == 1:
            _kernels[key] = kernel
        while len(_kernels) > COMPILED_KERNELS:
            _kernels.popitem(last=False)
    return kernel


@contextlib.contextmanager
def _held_warnings():
    """Records the TCWarnings (and others) issued inside, for `_say_again` (or silence)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", TCWarning)
        yield said


def _say_again(said) -> None:
    """Warnings recorded while compiling, issued now (a TCWarning, as ever, from the caller's
    line outside tcstage)."""
    for one in said:
        if issubclass(one.category, TCWarning):
            warn(str(one.message))
        else:
            warnings.warn(one.message)


def _options_per_launch(name: str, given) -> tuple:
    """A list of options, one per launch of a kernel sequence: (the first, which decides the
    launches and maps the first, the function giving launch k the k-th, the list)."""
    if not given:
        raise TCArgumentError(f"tc.compile('{name}'): options=[] gives no options: give one "
                              "set per launch, or one MappingOptions for them all")
    listed = []
    for k, one in enumerate(given):
        if isinstance(one, str) and one.strip().lower() == "auto":
            raise TCArgumentError(f"tc.compile('{name}'): options[{k}] is 'auto', which chooses "
                                  "every launch's options itself: pass options='auto' alone")
        try:
            listed.append(as_options(one))
        except TCError as e:
            raise TCArgumentError(f"tc.compile('{name}'): options[{k}]: {e.message}") from None
    if len(listed) > 1 and any(o.overlapped_tiles for o in listed):
        raise TCArgumentError(
            f"tc.compile('{name}'): overlappedTiles(True) plans its launches from one set of "
            "options, so it cannot come in a list of options per launch: give one set")
    listed = tuple(listed)
    return listed[0], lambda position, _statements: listed[min(position, len(listed) - 1)], \
        listed


def _starting_point(options: MappingOptions) -> str:
    """What options equal to a starting point are, in words ('' for any others)."""
    if options == MappingOptions():
        return "MappingOptions(), the single-thread options: one thread in one block runs " \
            "the whole kernel"
    for name in PRESETS:
        if options == MappingOptions.named(name):
            return f"exactly the {name!r} starting point, MappingOptions({name!r})"
    return ""


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


def clear_kernel_cache() -> None:
    """Forgets the kernels `compile` keeps (for tests that change the compiler underneath)."""
    with _kernels_lock:
        _kernels.clear()


def _source_key(fn) -> str:
    from tcstage.tune.cache import tc_hash
    return tc_hash(fn)


def _predicted_best(fn, inputs, out, candidates, per_launch=None) -> tuple:
    """The candidate options whose kernel the cost model (H100) predicts fastest, with that
    compilation and the warnings it gave: (options, Compiled, warnings); where one cannot be
    compiled or predicted, the others ((candidates[0], None, []) where none can)."""
    from tcstage.tune import model
    best, best_time = (candidates[0], None, []), math.inf
    for options in candidates:
        try:
            with _held_warnings() as said:
                compiled = compile_cuda(fn, inputs, out, options, launch_options=per_launch)
                time = model.predict(compiled, model.H100).time
        except TCError:
            continue
        if time < best_time:
            best, best_time = (options, compiled, said), time
    return best


def auto_options(fn: TCFunction, inputs, out, target: str, cached: bool = True):
    """options="auto": the cached best for this call on this device (a GPU's measurement
    first, then the cost model's), else the structural default with a TCWarning; with the
    latter, the function giving each launch of a kernel sequence its own (None with the
    former): (options, launch options, their compilation or None, the warnings it gave:
    where the cost model chose between candidates, the winner is compiled already)."""
    from tcstage.tune.cache import CacheError
    from tcstage.tune.heuristic import heuristic_options
    from tcstage.tune.model import H100
    from tcstage.tune.tuner import _detect_gpu, tuned_options
    binding = fn.bind(inputs, out, shapes_only=True)
    devices = ([_detect_gpu()] if target == "cuda" else []) + [f"model:{H100.name}"]
    for device in filter(None, devices) if cached else ():  # (cached=False: the default)
        try:
            found = tuned_options(fn, binding, device)
        except CacheError as e:
            warn(f"options='auto' could not read the tuning cache: {e.message}")
            break
        if found is not None:
            return found, None, None, []
    from tcstage.inputs import call_shapes
    values = {**binding.sizes, **{k: v for k, v in binding.scalars.items()
                                  if not isinstance(v, np.ndarray)}}  # (numpy scalars count)
    shapes, outs = call_shapes(fn.checked, values)
    reports = fn.ranges(*shapes, out=tuple(outs) or None)
    options = heuristic_options(fn, reports)

    @functools.cache  # (launches of overlapped tiles take the function's options)
    def own(statements: frozenset) -> MappingOptions:
        return heuristic_options(fn, reports, statements)

    def per_launch(_position, statements) -> MappingOptions:
        return own(frozenset(statements))
    compiled, said = None, []
    if any(t.kind == "temp" for t in fn.checked.tensors.values()):
        options, compiled, said = _predicted_best(
            fn, inputs, out, [options, options.overlappedTiles(True)], per_launch)
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(binding.sizes.items()))
    warn(f"options='auto': no tuned options for '{fn.name}' at {sizes} in the cache; using a "
         f"default from the TC's structure: {options}. tc.autotune(...) or `tcstage tune` "
         "finds better ones and caches them")
    return options, per_launch, compiled, said
