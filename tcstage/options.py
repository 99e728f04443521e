"""`MappingOptions`: the explicit GPU schedule language of Tensor Comprehensions.

A `MappingOptions` value says how the polyhedral back end schedules, tiles, maps to CUDA blocks
and threads, promotes to shared or private memory, and unrolls one TC function. It is written as
a chain, the way TC users write it in C++ and Python::

    import tcstage as tc
    opts = tc.MappingOptions().tile(32, 32).mapToThreads(32, 8).mapToBlocks(64, 64).unroll(4)

Values are immutable and hashable: every chain call returns a new object and leaves the old one
alone. `str(opts)` is the chain itself, listing only what differs from `MappingOptions()` in a
fixed order, and `MappingOptions.parse` reads that text back (and also the C++ listings of the
TC paper), so schedules are stored as text and never evaluated. `to_dict` / `from_dict` give the
same information as plain JSON data.

Every bad value raises `TCOptionsError`, whose message names the option, the value, and what is
allowed.
"""

from __future__ import annotations

import difflib
import enum
import math
import re
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from tcstage.errors import Source, Span, TCError

__all__ = ["MappingOptions", "FusionStrategy", "TCOptionsError"]

# CUDA launch limits (compute capability 3.0 and later).
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)


class TCOptionsError(TCError):
    """An invalid mapping option, or mapping-options text that cannot be read.

    `option` is the TC name of the option concerned (such as 'mapToThreads') when there is one,
    and `value` the rejected value.
    """

    def __init__(self, message: str, span: Span | None = None, notes: tuple[str, ...] = (), *,
                 option: str | None = None, value: Any = None):
        self.option = option
        self.value = value
        super().__init__(message, span, notes)


class FusionStrategy(enum.Enum):
    """How eagerly the isl scheduler fuses loop nests (TC's `FusionStrategy`).

    `Max` fuses whenever dependences allow; `Preserve3Coincident` fuses only while at least
    three parallel (coincident) outer loops survive, so that blocks and threads can still be
    mapped; `Min` fuses nothing.
    """

    Max = "Max"
    Preserve3Coincident = "Preserve3Coincident"
    Min = "Min"

    def __str__(self) -> str:
        return self.value


# ---------------------------------------------------------------------------------------------
# Value checks. Each takes the value and the TC name of the option it is for, and returns the
# normalized value (plain ints, tuples, enum members) or raises TCOptionsError.
# ---------------------------------------------------------------------------------------------

def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


_MAX_DIGITS = 19  # enough for any 64-bit value; every option's own range is narrower


def _to_int(value: Any, option: str, what: str) -> int:
    """`value` as a Python int: ints and numpy integers pass; bools, floats and strings do not."""
    index = getattr(value, "__index__", None)
    if index is None or _is_bool(value):
        raise TCOptionsError(f"{option}: {what} must be an integer, got {_describe(value)}",
                             option=option, value=value)
    return int(index())


def _check_bool(value: Any, option: str) -> bool:
    if not _is_bool(value):
        raise TCOptionsError(f"{option}: expected True or False, got {_describe(value)}",
                             option=option, value=value)
    return bool(value)


def _check_count(value: Any, option: str, minimum: int, what: str) -> int:
    n = _to_int(value, option, what)
    if n < minimum:
        raise TCOptionsError(f"{option}: {what} {n} is too small; allowed: integers >= {minimum}",
                             option=option, value=value)
    return n


def _check_optional_count(value: Any, option: str, what: str) -> int | None:
    return None if value is None else _check_count(value, option, 0, what)


def _is_sequence(value: Any) -> bool:
    return (isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
            and getattr(value, "ndim", 1) != 0)


def _flatten_sizes(values: Any) -> tuple:
    """Sizes given as separate arguments, or as one list/tuple/array, as one tuple."""
    if not _is_sequence(values):
        return (values,)
    values = tuple(values)
    if len(values) == 1 and _is_sequence(values[0]):
        return tuple(values[0])
    return values


def _check_tile_sizes(values: Any) -> tuple[int, ...]:
    sizes = tuple(_to_int(v, "tile", "tile size") for v in _flatten_sizes(values))
    for s in sizes:
        if s < 0:
            raise TCOptionsError(
                f"tile: tile size {s} is negative; allowed: integers >= 0 "
                "(0 leaves that dimension untiled)", option="tile", value=s)
    return sizes


_AXES = "xyz"


def _check_dims(values: Any, option: str, limits: tuple[int, int, int], what: str
                ) -> tuple[int, ...]:
    dims = tuple(_to_int(v, option, f"{what} size") for v in _flatten_sizes(values))
    if not 1 <= len(dims) <= 3:
        raise TCOptionsError(
            f"{option}: expected 1 to 3 {what} sizes (x, y, z), got {len(dims)}: {dims!r}",
            option=option, value=dims)
    for axis, d, limit in zip(_AXES, dims, limits):
        if not 1 <= d <= limit:
            raise TCOptionsError(
                f"{option}: {what} size {axis}={d} is out of range; allowed: 1 to {limit}",
                option=option, value=d)
    return dims


def _check_threads(values: Any) -> tuple[int, ...]:
    dims = _check_dims(values, "mapToThreads", MAX_BLOCK_DIM, "thread")
    total = math.prod(dims)
    if total > MAX_THREADS_PER_BLOCK:
        raise TCOptionsError(
            f"mapToThreads: {' * '.join(map(str, dims))} = {total} threads per block exceeds "
            f"the CUDA limit; allowed: a product of at most {MAX_THREADS_PER_BLOCK}",
            option="mapToThreads", value=dims)
    return dims


def _check_blocks(values: Any) -> tuple[int, ...]:
    return _check_dims(values, "mapToBlocks", MAX_GRID_DIM, "block")


def _check_fusion(value: Any, option: str) -> FusionStrategy:
    if isinstance(value, FusionStrategy):
        return value
    if isinstance(value, str):
        name = value.strip()
        for prefix in ("tc::FusionStrategy::", "FusionStrategy::", "FusionStrategy."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        for member in FusionStrategy:
            if member.name.lower() == name.lower():
                return member
    allowed = ", ".join(m.name for m in FusionStrategy)
    raise TCOptionsError(f"{option}: unknown fusion strategy {value!r}; allowed: {allowed} "
                         "(as FusionStrategy members or case-insensitive strings)",
                         option=option, value=value)


# ---------------------------------------------------------------------------------------------
# Fields. Each field's metadata names the TC method that sets it (used in messages and by
# `str`); the order of the fields in MappingOptions is the order in which `str` prints them.
# ---------------------------------------------------------------------------------------------

def _bool_field(method: str, default: bool = False):
    return attrs.field(default=default, converter=lambda v: _check_bool(v, method),
                       metadata={"method": method})


def _count_field(method: str, what: str):
    return attrs.field(default=None, converter=lambda v: _check_optional_count(v, method, what),
                       metadata={"method": method})


def _fusion_field(method: str):
    return attrs.field(default=FusionStrategy.Preserve3Coincident,
                       converter=lambda v: _check_fusion(v, method), metadata={"method": method})


def _format_arg(value: Any) -> str:
    return f'"{value.name}"' if isinstance(value, FusionStrategy) else str(value)


# The objects a starting point's constructor returned (`MappingOptions()`, `("naive")`,
# `.named(...)`), by identity: options equal to a starting point that were not made as one
# (a chain's, the tuner's, parsed text) are not the lost-chain mistake `tc.compile` warns of.
_STARTING_POINTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def made_as_starting_point(options) -> bool:
    """Whether `options` is the very object a starting point's constructor returned."""
    return _STARTING_POINTS.get(id(options)) is options


@attrs.frozen(kw_only=True, repr=False, init=False)
class MappingOptions:
    """How to map one TC function onto a GPU: tiling, block/thread mapping, memory promotion,
    unrolling and scheduling choices.

    `MappingOptions()` are the single-thread options: no tiling, one thread in one block, no
    memory promotion, unroll factor 1, and `Preserve3Coincident` fusion for both the outer and
    the intra-tile schedule. `MappingOptions("naive")`, TC's Python spelling, starts from one of
    TC's starting points (`named`: TC's naive one is `tile(32, 32, 32).mapToThreads(32, 8)
    .mapToBlocks(256, 256)`). Change them with the chain methods (TC's names), each of which returns a new
    object (unlike TC's, which change it in place: `o.tile(32)` alone leaves `o` as it was)::

        MappingOptions().tile(32, 32).mapToThreads(32, 8).mapToBlocks(64, 64).unroll(4)

    Read them through the snake_case attributes (`tile_sizes`, `threads`, `blocks`,
    `unroll_factor`, `use_shared_memory`, ...). Thread and block sizes are kept as given, with
    one to three entries (x, y, z); `block_dim` and `grid_dim` pad them to three.
    """

    tile_sizes: tuple[int, ...] = attrs.field(default=(), converter=_check_tile_sizes,
                                              metadata={"method": "tile"})
    threads: tuple[int, ...] = attrs.field(default=(1,), converter=_check_threads,
                                           metadata={"method": "mapToThreads"})
    blocks: tuple[int, ...] = attrs.field(default=(1,), converter=_check_blocks,
                                          metadata={"method": "mapToBlocks"})
    unroll_factor: int = attrs.field(default=1,
                                     converter=lambda v: _check_count(v, "unroll", 1,
                                                                      "unroll factor"),
                                     metadata={"method": "unroll"})
    unroll_copy_shared: bool = _bool_field("unrollCopyShared")
    unroll_gpu_tile: bool = _bool_field("unrollGpuTile")
    use_shared_memory: bool = _bool_field("useSharedMemory")
    use_private_memory: bool = _bool_field("usePrivateMemory")
    max_shared_memory: int | None = _count_field("maxSharedMemory", "shared memory size in bytes")
    shared_depth: int | None = _count_field("sharedDepth", "promotion depth")
    private_depth: int | None = _count_field("privateDepth", "promotion depth")
    use_read_only_cache: bool = _bool_field("useReadOnlyCache")
    use_register_tiling: bool = _bool_field("useRegisterTiling")
    outer_schedule_fusion_strategy: FusionStrategy = _fusion_field("outerScheduleFusionStrategy")
    intra_tile_schedule_fusion_strategy: FusionStrategy = _fusion_field(
        "intraTileScheduleFusionStrategy")
    outer_schedule_allow_skewing: bool = _bool_field("outerScheduleAllowSkewing")
    outer_schedule_positive_orthant: bool = _bool_field("outerSchedulePositiveOrthant", True)
    intra_tile_schedule_allow_skewing: bool = _bool_field("intraTileScheduleAllowSkewing")
    intra_tile_schedule_positive_orthant: bool = _bool_field("intraTileSchedulePositiveOrthant",
                                                             True)
    schedule_specialize: bool = _bool_field("scheduleSpecialize")
    fix_parameters_before_scheduling: bool = _bool_field("fixParametersBeforeScheduling")
    tile_imperfectly_nested: bool = _bool_field("tileImperfectlyNested")
    match_library_calls: bool = _bool_field("matchLibraryCalls")
    # None (the default): split only where no loop free of dependences can take threads;
    # True: also where those loops give less than a warp; False: never (parallelReductions)
    parallel_reductions: bool | None = attrs.field(
        default=None, converter=lambda v: None if v is None else _check_bool(v,
                                                                             "parallelReductions"),
        metadata={"method": "parallelReductions"})
    use_tensor_cores: bool = _bool_field("useTensorCores")
    overlapped_tiles: bool = _bool_field("overlappedTiles")

    def __init__(self, preset: str | None = None, /, **fields):
        chained = bool(fields)  # (a starting point as it is, or one changed by fields)
        if preset is not None:
            if not isinstance(preset, str):
                raise TCOptionsError(
                    f"MappingOptions takes a preset name ({', '.join(_PRESETS)}) or keyword "
                    f"fields, not a value of type {type(preset).__name__}; chain the options "
                    "instead, as in "
                    "MappingOptions().tile(32, 32)", option="MappingOptions", value=preset)
            named = attrs.asdict(type(self).named(preset), recurse=False)
            fields = {**named, **fields}
        self.__attrs_init__(**fields)
        if not chained:
            _STARTING_POINTS[id(self)] = self

    # -- chain methods (TC names); each returns a new MappingOptions ------------------------

    def _with(self, field: str, value: Any) -> MappingOptions:
        return attrs.evolve(self, **{field: value})

    def tile(self, *sizes) -> MappingOptions:
        """Tile the outermost band with these sizes, outermost first; 0 leaves a loop untiled.

        Sizes may be separate integers or one list: `tile(32, 32)` or `tile([32, 32])`.
        """
        if not _check_tile_sizes(sizes):
            raise TCOptionsError("tile: expected at least one tile size, got none; allowed: "
                                 "integers >= 0 (0 leaves that dimension untiled)",
                                 option="tile", value=())
        return self._with("tile_sizes", sizes)

    def mapToThreads(self, *sizes) -> MappingOptions:
        """Threads per block, x first: 1 to 3 positive sizes, x, y <= 1024, z <= 64, and at
        most 1024 in total. Thread x maps to the innermost mapped loop."""
        return self._with("threads", sizes)

    def mapToBlocks(self, *sizes) -> MappingOptions:
        """Blocks in the grid, x first: 1 to 3 positive sizes, x < 2**31, y, z <= 65535."""
        return self._with("blocks", sizes)

    def unroll(self, factor) -> MappingOptions:
        """Unroll innermost loops until at most `factor` copies of their bodies (1: none)."""
        return self._with("unroll_factor", factor)

    def unrollCopyShared(self, flag: bool) -> MappingOptions:
        """Unroll the loops that copy to and from shared memory."""
        return self._with("unroll_copy_shared", flag)

    def unrollGpuTile(self, flag: bool) -> MappingOptions:
        """Unroll the point loops of the GPU tile (an option of the TC paper's version)."""
        return self._with("unroll_gpu_tile", flag)

    def useSharedMemory(self, flag: bool) -> MappingOptions:
        """Promote frequently reused array tiles to shared memory."""
        return self._with("use_shared_memory", flag)

    def usePrivateMemory(self, flag: bool) -> MappingOptions:
        """Promote per-thread reused elements to private memory (registers)."""
        return self._with("use_private_memory", flag)

    def maxSharedMemory(self, nbytes) -> MappingOptions:
        """Use at most `nbytes` bytes of shared memory per block (default: all the device has)."""
        return self._with("max_shared_memory", _check_count(nbytes, "maxSharedMemory", 0,
                                                            "shared memory size in bytes"))

    def sharedDepth(self, depth) -> MappingOptions:
        """Schedule depth at which shared-memory promotion happens (default: the compiler's)."""
        return self._with("shared_depth", _check_count(depth, "sharedDepth", 0,
                                                       "promotion depth"))

    def privateDepth(self, depth) -> MappingOptions:
        """Schedule depth at which private-memory promotion happens (default: the compiler's)."""
        return self._with("private_depth", _check_count(depth, "privateDepth", 0,
                                                        "promotion depth"))

    def useReadOnlyCache(self, flag: bool) -> MappingOptions:
        """Read never-written tensors through the read-only data cache (`__ldg`)."""
        return self._with("use_read_only_cache", flag)

    def useRegisterTiling(self, flag: bool) -> MappingOptions:
        """Register tiling (beyond the paper): in each thread-mapped tile, the loops threads do
        not split (a reduction) run outside the thread's own points, so a thread computes its
        sub-tile of outputs (tile size / threads per dimension) one reduction step at a time,
        reusing each loaded operand for a row or column of outputs. With usePrivateMemory the
        outputs stay in private memory across the whole reduction (privateDepth defaults to
        the block-mapped loops), with `unroll` covering the sub-tile they become registers, and
        with useSharedMemory and a tiled reduction the operands go through shared memory one
        reduction tile at a time."""
        return self._with("use_register_tiling", flag)

    def scheduleFusionStrategy(self, strategy) -> MappingOptions:
        """Set the fusion strategy of both the outer and the intra-tile schedule."""
        strategy = _check_fusion(strategy, "scheduleFusionStrategy")
        return attrs.evolve(self, outer_schedule_fusion_strategy=strategy,
                            intra_tile_schedule_fusion_strategy=strategy)

    def outerScheduleFusionStrategy(self, strategy) -> MappingOptions:
        """Fusion strategy of the schedule computed before tiling."""
        return self._with("outer_schedule_fusion_strategy", strategy)

    def intraTileScheduleFusionStrategy(self, strategy) -> MappingOptions:
        """Fusion strategy used when rescheduling the point loops inside tiles."""
        return self._with("intra_tile_schedule_fusion_strategy", strategy)

    def outerScheduleAllowSkewing(self, flag: bool) -> MappingOptions:
        """Let the outer schedule skew loops (combine iterators with non-unit coefficients)."""
        return self._with("outer_schedule_allow_skewing", flag)

    def outerSchedulePositiveOrthant(self, flag: bool) -> MappingOptions:
        """Restrict the outer schedule to non-negative coefficients."""
        return self._with("outer_schedule_positive_orthant", flag)

    def intraTileScheduleAllowSkewing(self, flag: bool) -> MappingOptions:
        """Let the intra-tile schedule skew loops."""
        return self._with("intra_tile_schedule_allow_skewing", flag)

    def intraTileSchedulePositiveOrthant(self, flag: bool) -> MappingOptions:
        """Restrict the intra-tile schedule to non-negative coefficients."""
        return self._with("intra_tile_schedule_positive_orthant", flag)

    def scheduleSpecialize(self, flag: bool) -> MappingOptions:
        """Specialize the schedule to the actual parameter values (sizes) of a call."""
        return self._with("schedule_specialize", flag)

    def fixParametersBeforeScheduling(self, flag: bool) -> MappingOptions:
        """Intersect the domain with the known parameter values before scheduling."""
        return self._with("fix_parameters_before_scheduling", flag)

    def tileImperfectlyNested(self, flag: bool) -> MappingOptions:
        """Also tile imperfectly nested loops, with the same tile sizes."""
        return self._with("tile_imperfectly_nested", flag)

    def matchLibraryCalls(self, flag: bool) -> MappingOptions:
        """Replace recognized patterns (such as block reductions) by library calls."""
        return self._with("match_library_calls", flag)

    def parallelReductions(self, flag: bool) -> MappingOptions:
        """Split reductions across threads (beyond the paper): a reduction loop of a `+`, `*`,
        `min` or `max` reduction goes to threadIdx.x; each thread combines its share, then the
        warp (shuffles) and the block (shared memory) combine theirs, and, where `mapToBlocks`
        leaves blocks free and nothing in the kernel reads the result, blocks combine theirs
        atomically. Floating-point sums are reassociated (docs/cuda.md).

        Left unset, a reduction takes threads only where no loop free of dependences can take
        any (a full sum; row statistics with the rows on blocks), so that options whose thread
        sizes the parallel loops can take map as TC maps them. True also splits where those
        loops give fewer than a warp of the threads asked for; False never splits."""
        return self._with("parallel_reductions", flag)

    def useTensorCores(self, flag: bool) -> MappingOptions:
        """Map contraction tiles (a `+=!` reduction of a product of two half or bfloat16 reads,
        as in tmm, tbmm and MLP layers) onto tensor core instructions (`mma.sync`), with float32
        accumulators and the operands staged through shared memory (docs/cuda.md)."""
        return self._with("use_tensor_cores", flag)

    def overlappedTiles(self, flag: bool) -> MappingOptions:
        """Overlapped tiles (beyond the paper; Halide's `compute_at(output, blockIdx)`): one
        kernel in which each block computes, in shared memory, every intermediate (temporary)
        tensor its tile of the outputs needs, halo included, recomputing what its neighbours
        also compute, instead of a kernel sequence that passes the intermediates through
        global memory. The tile sizes cut the outputs' elements; `mapToBlocks` maps the tiles,
        `mapToThreads` each statement's loops. Where it cannot apply (no intermediate, a
        recurrence, too much recomputation: docs/cuda.md), a note says why and the function
        compiles as without it."""
        return self._with("overlapped_tiles", flag)

    # -- derived views ---------------------------------------------------------------------

    @property
    def block_dim(self) -> tuple[int, int, int]:
        """CUDA blockDim: `threads` padded with 1 to (x, y, z)."""
        return (self.threads + (1, 1))[:3]

    @property
    def grid_dim(self) -> tuple[int, int, int]:
        """CUDA gridDim: `blocks` padded with 1 to (x, y, z)."""
        return (self.blocks + (1, 1))[:3]

    @property
    def num_threads(self) -> int:
        """Threads per block."""
        return math.prod(self.threads)

    @property
    def num_blocks(self) -> int:
        """Blocks in the grid."""
        return math.prod(self.blocks)

    def __getattr__(self, name: str):
        """Only reached for a missing attribute: say which public one was probably meant, as
        the text form does (`mapToThread` -> `mapToThreads`)."""
        if name.startswith("_"):  # Python's and libraries' protocol probes stay quiet and fast
            raise AttributeError(name)
        public = [n for n in dir(type(self)) if not n.startswith("_")]
        hint = [n for n in public if n.lower() == name.lower()] or \
            difflib.get_close_matches(name, public, n=1)
        # (no obj=: Python's traceback would then print a second suggestion of its own)
        raise AttributeError(f"'MappingOptions' object has no attribute '{name}'"
                             + (f"; did you mean '{hint[0]}'?" if hint else ""), name=name)

    # -- named starting points -------------------------------------------------------------

    # The starting points are TC's own (tc/core/cuda/cuda_mapping_options.cc, the
    # make*MappingOptions functions), so that TC code and TC's tuned option sets, which start
    # from them, mean here what they meant there. Each chain call replaces a field wholesale.

    @classmethod
    def single_thread(cls) -> MappingOptions:
        """TC's makeSingleThreadMappingOptions: `tile(1)`, a single thread in a single block;
        the same kernel as `MappingOptions()`, which does not tile. Always correct, never
        fast."""
        return cls().tile(1)

    @classmethod
    def naive(cls) -> MappingOptions:
        """TC's naive starting point, from which all of TC's tuned option sets start:
        `tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(256, 256).unroll(1)`."""
        return cls().tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(256, 256)

    @classmethod
    def pointwise(cls) -> MappingOptions:
        """TC's pointwise starting point: `tile(32, 32, 32)`, 32 x 4 x 4 threads,
        100 x 100 x 100 blocks, unroll 128."""
        return cls().tile(32, 32, 32).mapToThreads(32, 4, 4).mapToBlocks(100, 100, 100) \
            .unroll(128)

    @classmethod
    def mlp(cls) -> MappingOptions:
        """TC's starting point for matrix products with bias and activation: `tile(1)`, 128
        threads, 128 blocks, and maximal fusion in the outer schedule."""
        return (cls().tile(1).mapToThreads(128).mapToBlocks(128)
                .outerScheduleFusionStrategy(FusionStrategy.Max))

    @classmethod
    def conv(cls) -> MappingOptions:
        """TC's starting point for convolutions (makeConvolutionMappingOptions):
        `tile(4, 8, 8, 8)`, 4 x 16 x 4 threads, 256 x 256 x 256 blocks."""
        return cls().tile(4, 8, 8, 8).mapToThreads(4, 16, 4).mapToBlocks(256, 256, 256)

    @classmethod
    def group_conv(cls) -> MappingOptions:
        """TC's starting point for grouped convolutions (makeGroupConvolutionMappingOptions):
        `tile(1, 1)`, 4 x 16 x 4 threads, 256 x 256 blocks."""
        return cls().tile(1, 1).mapToThreads(4, 16, 4).mapToBlocks(256, 256)

    @classmethod
    def reduction(cls) -> MappingOptions:
        """tcstage's own (TC has none) for reductions along the innermost dimension: one output
        row per block (`tile(1)`), 256 threads cooperating on it (parallelReductions), up to
        1024 blocks, unroll 4."""
        return cls().tile(1).mapToThreads(256).mapToBlocks(1024).unroll(4)

    @classmethod
    def named(cls, name: str) -> MappingOptions:
        """The named starting point `name`: one of single_thread, naive, pointwise, mlp, conv
        (or convolution), group_conv (or group_convolution), reduction (case-insensitive; '-'
        may stand for '_')."""
        key = name.strip().lower().replace("-", "_") if isinstance(name, str) else None
        key = _PRESET_ALIASES.get(key, key)
        if key not in _PRESETS:
            valid = ", ".join(_PRESETS)
            raise TCOptionsError(
                f"unknown named mapping options {name!r}{_suggest(key, _PRESETS)}; "
                f"allowed: {valid}", option="named", value=name)
        made = getattr(cls, key)()
        _STARTING_POINTS[id(made)] = made
        return made

    # -- text and data ---------------------------------------------------------------------

    def calls(self) -> list[tuple[str, tuple]]:
        """The chain as (method, arguments) pairs: only options that differ from
        `MappingOptions()`, in canonical order. `str` prints exactly these calls."""
        out = []
        outer, intra = (self.outer_schedule_fusion_strategy,
                        self.intra_tile_schedule_fusion_strategy)
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            if field.name == "outer_schedule_fusion_strategy" and outer == intra:
                out.append(("scheduleFusionStrategy", (value,)))
                continue
            if field.name == "intra_tile_schedule_fusion_strategy" and outer == intra:
                continue
            out.append((field.metadata["method"], value if isinstance(value, tuple) else (value,)))
        return out

    def __str__(self) -> str:
        chain = "".join(f".{method}({', '.join(map(_format_arg, args))})"
                        for method, args in self.calls())
        return f"MappingOptions(){chain}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> MappingOptions:
        """Read a chain of option calls back, such as the text `str` prints.

        Accepted: whitespace and newlines anywhere, `//` comments, a leading `tc.`/`tcstage.`
        or `tc::` qualification, a starting point (`MappingOptions()`, `MappingOptions.mlp()`,
        `MappingOptions("mlp")`, the C++ `makeDefaultMappingOptions()` and
        `makeUnmappedMappingOptions()`, which are `MappingOptions()`, and
        `make<Name>MappingOptions()`, which start from tcstage's preset of that name), or no
        starting point at all; a leading C++ declaration (`auto options =`); `True`/`False` or
        `true`/`false`; sizes as separate integers or a list `[32, 32]` / `{32, 32}`; fusion
        strategies as strings or `FusionStrategy::Max`; the paper's `set_fusion_strategy`
        (= `scheduleFusionStrategy`); a trailing `;`. Nothing is evaluated.
        """
        if not isinstance(text, str):
            raise TCOptionsError(f"MappingOptions.parse expects a string, got {_describe(text)}")
        return attrs.evolve(_Parser(text).parse_chain())  # (a copy: not a starting point object)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON data (lists, ints, bools, strings, None)."""
        out = {}
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, FusionStrategy):
                value = value.name
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MappingOptions:
        """The options `to_dict` produced; missing fields keep their defaults. Unknown fields
        and bad values raise TCOptionsError naming the field."""
        if not isinstance(data, Mapping):
            raise TCOptionsError(f"MappingOptions.from_dict expects a mapping, got "
                                 f"{_describe(data)}")
        names = [f.name for f in attrs.fields(cls)]
        for key in data:
            if key not in names:
                raise TCOptionsError(
                    f"from_dict: unknown field {key!r}{_suggest(str(key), names)}; allowed: "
                    f"{', '.join(names)}", option=str(key), value=data[key])
        try:
            return cls(**data)
        except TCOptionsError as e:
            field = next((f.name for f in attrs.fields(cls) if f.metadata["method"] == e.option),
                         e.option)
            raise TCOptionsError(f"from_dict: field {field!r}: {e.message}", option=e.option,
                                 value=e.value) from None


_PRESETS = ("single_thread", "naive", "pointwise", "mlp", "conv", "group_conv", "reduction")
PRESETS = _PRESETS  # (the names `MappingOptions.named` takes)
_PRESET_ALIASES = {"convolution": "conv", "group_convolution": "group_conv",
                   "singlethread": "single_thread", "groupconvolution": "group_conv"}
_METHODS = sorted({f.metadata["method"] for f in attrs.fields(MappingOptions)}
                  | {"scheduleFusionStrategy"})


def _suggest(name: str | None, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the candidates close to `name`, or ''."""
    close = difflib.get_close_matches(name or "", list(candidates), n=3)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


# ---------------------------------------------------------------------------------------------
# Reading option chains. A hand-written tokenizer and recursive-descent parser; nothing is
# evaluated.
#
#   text   := [decl '='] [start] ('.' NAME '(' args ')')* ';'* EOF
#   start  := qualname '(' args ')'
#   args   := [arg (',' arg)*]
#   arg    := INT | FLOAT | STRING | true | false | qualname | ('[' | '{') args (']' | '}')
# ---------------------------------------------------------------------------------------------

@attrs.frozen
class _Token:
    kind: str  # 'int', 'float', 'string', 'name', 'op' or 'eof'
    text: str
    span: Span


_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<float>-?\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+))
  | (?P<int>-?\d+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<string>"[^"\n]*"|'[^'\n]*')
  | (?P<op>::|[().,;=\[\]{}])
""", re.VERBOSE)
_WORD = re.compile(r"\w*")

_OPTION_FILE = "<mapping options>"

# Method names accepted in text besides the chain methods themselves.
_ALIASES = {"set_fusion_strategy": "scheduleFusionStrategy"}

# Names allowed in front of a starting point or a fusion strategy (`tc::`, `tcstage.`, ...).
_QUALIFIERS = {"tc", "tcstage", "MappingOptions", "CudaMappingOptions", "IslKernelOptions",
               "CpuMappingOptions", "FusionStrategy"}

_CLASS_NAMES = {"MappingOptions", "CudaMappingOptions", "IslKernelOptions", "CpuMappingOptions"}

# C++ static constructors: make<X>MappingOptions() -> preset (None: MappingOptions()).
_CPP_STARTS = {"makeDefaultMappingOptions": None, "makeUnmappedMappingOptions": None,
               "makeSingleThreadMappingOptions": "single_thread",
               "makeNaiveMappingOptions": "naive", "makePointwiseMappingOptions": "pointwise",
               "makeMlpMappingOptions": "mlp", "makeConvolutionMappingOptions": "conv",
               "makeGroupConvolutionMappingOptions": "group_conv",
               "makeReductionMappingOptions": "reduction"}

_SIZE_METHODS = {"tile", "mapToThreads", "mapToBlocks"}


def _tokenize(source: Source) -> list[_Token]:
    text, pos, tokens = source.text, 0, []
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] in "\"'":
                raise TCOptionsError("unterminated string", Span(source, pos, len(text)))
            raise TCOptionsError(
                f"unexpected character '{text[pos]}'", Span(source, pos, pos + 1),
                ("option arguments are integers, booleans, fusion strategies and lists of "
                 "integers; expressions such as 'M / 32' are not evaluated",))
        if m.lastgroup in ("int", "float"):
            end = _WORD.match(text, m.end()).end()
            if end > m.end():  # a number glued to letters, like '32x'
                raise TCOptionsError(f"malformed number '{text[pos:end]}'", Span(source, pos, end))
        if m.lastgroup != "space":
            tokens.append(_Token(m.lastgroup, m.group(), Span(source, pos, m.end())))
        pos = m.end()
    tokens.append(_Token("eof", "", Span(source, len(text), len(text))))
    return tokens


def _show(tok: _Token) -> str:
    return "end of input" if tok.kind == "eof" else f"'{tok.text}'"


class _Parser:
    def __init__(self, text: str):
        self.source = Source(text, _OPTION_FILE)
        self.tokens = _tokenize(self.source)
        self.pos = 0

    # -- token helpers --
    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def next(self) -> _Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        return self.tok.kind == "op" and self.tok.text == text

    def expect(self, text: str, context: str) -> _Token:
        if not self.at(text):
            raise TCOptionsError(f"expected '{text}' {context}, found {_show(self.tok)}",
                                 self.tok.span)
        return self.next()

    # -- grammar --
    def parse_chain(self) -> MappingOptions:
        self.skip_declaration()
        options = self.parse_start()
        while self.at("."):
            self.next()
            options = self.parse_call(options)
        while self.at(";"):
            self.next()
        if self.tok.kind != "eof":
            raise TCOptionsError(
                f"expected '.option(...)' or end of input, found {_show(self.tok)}", self.tok.span)
        return options

    def skip_declaration(self) -> None:
        """Skips a C++ or Python declaration such as `auto options =` or `opts =`."""
        i = self.pos
        while self.tokens[i].kind == "name" or (self.tokens[i].kind == "op"
                                                and self.tokens[i].text == "::"):
            i += 1
        if i > self.pos and self.tokens[i].kind == "op" and self.tokens[i].text == "=":
            self.pos = i + 1

    def parse_qualname(self) -> list[_Token]:
        """NAME (('::' | '.') NAME)*, as in `tc::FusionStrategy::Max` or `tc.MappingOptions`."""
        names = [self.next()]
        while (self.at("::") or self.at(".")) and self.tokens[self.pos + 1].kind == "name":
            self.next()
            names.append(self.next())
        return names

    def parse_start(self) -> MappingOptions:
        if self.at("."):
            return MappingOptions()  # a chain without a starting point: '.tile(32)...'
        if self.tok.kind != "name":
            raise TCOptionsError(f"expected mapping options such as 'MappingOptions()', found "
                                 f"{_show(self.tok)}", self.tok.span)
        if self.tok.text in _METHODS or self.tok.text in _ALIASES:
            return self.parse_call(MappingOptions())  # 'tile(32)...'
        names = self.parse_qualname()
        for q in names[:-1]:
            if q.text not in _QUALIFIERS:
                raise TCOptionsError(
                    f"unexpected qualifier '{q.text}'; allowed before a starting point: "
                    f"{', '.join(sorted(_QUALIFIERS - {'FusionStrategy'}))}", q.span)
        last, prefix = names[-1], [n.text for n in names[:-1]]
        self.expect("(", f"after '{last.text}'")
        args = self.parse_args(")")
        close = self.expect(")", f"to close the call to '{last.text}'")
        on_class = bool(prefix) and prefix[-1] in _CLASS_NAMES
        if last.text in _CLASS_NAMES or (on_class and last.text == "named"):
            # MappingOptions(), MappingOptions("mlp"), MappingOptions.named("mlp")
            if len(args) > 1 or (last.text == "named" and not args):
                raise TCOptionsError(f"'{last.text}(...)' takes one preset name, got "
                                     f"{len(args)} arguments", last.span.to(close.span))
            if not args:
                return MappingOptions()
            (name, span), = args
            if not isinstance(name, str):
                raise TCOptionsError(f"expected a preset name such as \"mlp\", found {name!r}",
                                     span)
        elif last.text in _CPP_STARTS or (on_class and last.text in _PRESETS):
            if args:
                raise TCOptionsError(f"'{last.text}()' takes no arguments, got {len(args)}",
                                     args[0][1])
            name, span = _CPP_STARTS.get(last.text, last.text), last.span
            if name is None:
                return MappingOptions()
        else:
            known = [*_CLASS_NAMES, *_CPP_STARTS, *_PRESETS]
            raise TCOptionsError(
                f"unknown starting point '{last.text}'{_suggest(last.text, known)}; expected "
                "'MappingOptions()', a preset such as 'MappingOptions.mlp()', or "
                "'makeDefaultMappingOptions()'", last.span)
        try:
            return MappingOptions.named(name)
        except TCOptionsError as e:
            raise TCOptionsError(e.message, span, option=e.option, value=e.value) from None

    def parse_call(self, options: MappingOptions) -> MappingOptions:
        name = self.tok
        if name.kind != "name":
            raise TCOptionsError(f"expected an option name after '.', found {_show(name)}",
                                 name.span)
        self.next()
        method = _ALIASES.get(name.text, name.text)
        if method not in _METHODS:
            raise TCOptionsError(f"unknown option '{name.text}'{_suggest(name.text, _METHODS)}",
                                 name.span, (f"known options: {', '.join(_METHODS)}",))
        self.expect("(", f"after '{name.text}'")
        args = self.parse_args(")")
        close = self.expect(")", f"to close the call to '{name.text}'")
        span = name.span.to(close.span)
        if method not in _SIZE_METHODS and len(args) != 1:
            raise TCOptionsError(f"'{name.text}' takes exactly one argument, got {len(args)}",
                                 span)
        try:
            return getattr(options, method)(*(value for value, _ in args))
        except TCOptionsError as e:  # point at the offending argument where it is clear
            bad = [s for v, s in args if type(v) is type(e.value) and v == e.value]
            where = bad[0] if len(bad) == 1 else args[0][1].to(args[-1][1]) if args else span
            raise TCOptionsError(e.message, where, e.notes, option=e.option,
                                 value=e.value) from None

    def parse_args(self, closer: str, in_list: bool = False) -> list[tuple[Any, Span]]:
        args = []
        if self.at(closer):
            return args
        args.append(self.parse_arg(in_list))
        while self.at(","):
            self.next()
            args.append(self.parse_arg(in_list))
        if not self.at(closer):
            raise TCOptionsError(f"expected ',' or '{closer}', found {_show(self.tok)}",
                                 self.tok.span)
        return args

    def parse_arg(self, in_list: bool = False) -> tuple[Any, Span]:
        tok = self.tok
        if tok.kind == "int":
            digits = len(tok.text.lstrip("+-"))
            if digits > _MAX_DIGITS:  # (Python refuses to read more than 4300 digits at all)
                raise TCOptionsError(f"an integer of {digits} digits is out of range: option "
                                     f"values have at most {_MAX_DIGITS}", tok.span)
            self.next()
            return int(tok.text), tok.span
        if tok.kind == "float":
            self.next()
            return float(tok.text), tok.span
        if tok.kind == "string":
            self.next()
            return tok.text[1:-1], tok.span
        if self.at("[") or self.at("{"):
            opener = self.next()
            if in_list:  # refused at once: reading nested lists would recurse without bound
                raise TCOptionsError("nested lists are not option values", opener.span)
            closer = "]" if opener.text == "[" else "}"
            items = self.parse_args(closer, in_list=True)
            end = self.expect(closer, f"to close '{opener.text}'")
            return [v for v, _ in items], opener.span.to(end.span)
        if tok.kind == "name":
            if tok.text in ("true", "True", "false", "False"):
                self.next()
                return tok.text.lower() == "true", tok.span
            names = self.parse_qualname()
            span = names[0].span.to(names[-1].span)
            last = names[-1].text
            if any(m.name.lower() == last.lower() for m in FusionStrategy) and all(
                    n.text in ("tc", "tcstage", "FusionStrategy") for n in names[:-1]):
                return last, span
            raise TCOptionsError(
                f"unexpected name '{span.text()}' as an option argument", span,
                ("option arguments are integers, booleans, lists of integers and fusion "
                 "strategies (Max, Preserve3Coincident, Min); symbolic sizes such as 'M / 32' "
                 "must be replaced by numbers",))
        raise TCOptionsError(f"expected an option argument, found {_show(tok)}", tok.span)
