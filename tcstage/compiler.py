"""A TC function and a call's shapes -> one CUDA kernel: the passes in order (the paper's
Figure 2), each a function of its own module.

    bind        check the call against the signature: sizes, scalar values
    lower       range inference and Halide Funcs                 (halide/ranges.py, lower.py)
    extract     the polyhedral model from the Funcs              (poly/scop.py)
    dependences exact dataflow                                   (poly/scop.py)
    schedule    the isl scheduler with a fusion strategy         (poly/schedule.py)
    tile        the outermost band                               (poly/tiling.py)
    map         blocks, threads, barriers, unrolling             (poly/mapping.py)
    promote     shared and private memory, copies and barriers   (poly/promotion.py)
    codegen     CUDA source from the isl AST                     (cuda/codegen.py)

Sizes: the scop is extracted once with symbolic sizes. The scheduler sees them symbolic, as in
TC, unless `fixParametersBeforeScheduling` or `scheduleSpecialize` asks for the call's values;
tiling, mapping and code generation always know them (the paper inserts them "just in time"),
so a kernel serves one set of shapes.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence

import attrs
import islpy as isl

from tcstage.cuda.codegen import CudaKernel, generate
from tcstage.errors import TCError, warn
from tcstage.halide.lower import Lowered
from tcstage.options import MappingOptions
from tcstage.poly.mapping import Mapped, map_to_gpu
from tcstage.poly.notes import OptionNote
from tcstage.poly.promotion import Promoted, promote
from tcstage.poly.schedule import compute_schedule, scheduled_scop
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
    cuda: CudaKernel
    timings: dict  # stage -> seconds
    notes: tuple[OptionNote, ...] = ()  # options that could not take effect, and why


def as_options(options) -> MappingOptions:
    """MappingOptions from an object, a chain text or a preset name (None: the naive ones)."""
    if options is None:
        return MappingOptions()
    if isinstance(options, MappingOptions):
        return options
    if isinstance(options, str):
        text = options.strip()
        return MappingOptions.parse(text) if "(" in text else MappingOptions.named(text)
    raise TCError(f"options must be a tcstage.MappingOptions, a chain such as "
                  f"'MappingOptions().tile(32, 32)' or a preset name; got {type(options).__name__}")


def compile_cuda(fn: TCFunction, args: Sequence, out=None, options=None) -> Compiled:
    """Compiles fn for the shapes of `args` (arrays or shape tuples, scalars as values)."""
    options = as_options(options)
    timings: dict[str, float] = {}
    stage = functools.partial(_stage, fn.name, timings)
    with stage("lower"):
        binding = fn.bind(args, out, shapes_only=True)
        lowered = fn.lower(*args, out=out)
    with stage("extract"):
        symbolic = extract_scop(lowered)
        scop = specialize(symbolic, binding.sizes)
        check_bounds(scop, lowered)
    fix_first = options.fix_parameters_before_scheduling or options.schedule_specialize
    with stage("dependences"):
        to_schedule, dependences = scheduled_scop(symbolic, scop, fix_first)
    with stage("schedule"):
        schedule = compute_schedule(to_schedule, options.outer_schedule_fusion_strategy,
                                    options.outer_schedule_allow_skewing, dependences)
    with stage("tile"):
        tiled = tile_outer_band(schedule, options.tile_sizes, options.tile_imperfectly_nested,
                                dependences)
    with stage("map"):
        mapped = map_to_gpu(tiled.schedule, dependences.intersect_params(scop.context),
                            scop.context, options)
    with stage("promote"):
        dtypes = {name: t.type.name for name, t in lowered.fn.tensors.items()}
        promoted = promote(scop, mapped, options, dtypes)
    with stage("codegen"):
        cuda = generate(lowered, scop, mapped, promoted, str(options),
                        options.use_read_only_cache)
    notes = tiled.notes + mapped.notes + promoted.notes
    for note in notes:
        warn(f"in '{fn.name}', option {note}")
    return Compiled(fn, options, binding, lowered, scop, schedule, tiled, mapped, promoted, cuda,
                    timings, notes)


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
    timings[name] = time.perf_counter() - start
