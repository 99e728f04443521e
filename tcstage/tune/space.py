"""The search space: every MappingOptions knob that changes the kernel, as genes with a finite
list of values each, drawn from the actual loop sizes the way the TC paper narrows them
(Section 6.2: powers of two and ceil divisors of the problem sizes, which avoid tail effects).

A candidate is a dict gene -> value; `Space.options` turns it into MappingOptions and
`Space.encode` does the reverse (snapping to the nearest listed value), so that warm starts from
the cache, presets or the user's own options enter the search as ordinary candidates.

Options the compiler does not act on (intra-tile fusion, positive orthant, matchLibraryCalls,
unrollGpuTile) are not genes: varying them would only repeat kernels.

Every gene is always present (a fixed-length genome): `tile_count`, `thread_dims` and
`block_dims` say how many of the per-position genes are used. That keeps crossover meaningful in
the genetic search and lets model-based samplers see one flat space.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from tcstage.options import MAX_BLOCK_DIM, FusionStrategy, MappingOptions

MAX_UNROLL = 256  # the paper tunes up to 4096; beyond 256 nvcc's time grows and nothing gains
SHARED_LIMITS = (None, 16384, 32768)  # maxSharedMemory: how aggressively shared memory is used
MAX_BLOCKS = 65535  # per grid dimension in the space (x may go higher, never needed at our sizes)
_DEPTHS = 6  # sharedDepth / privateDepth values tried: None (the compiler's) and 0..5


@attrs.frozen
class Gene:
    name: str
    values: tuple  # optuna-friendly: None, bool, int, str


@attrs.frozen
class Space:
    """The genes of one TC function at one set of sizes; `loops[k]` are the extents position k
    of the statements' loop nests takes (outermost first)."""

    genes: tuple[Gene, ...]
    loops: tuple[tuple[int, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.genes)

    def gene(self, name: str) -> Gene:
        return next(g for g in self.genes if g.name == name)

    @property
    def size(self) -> int:
        """Number of distinct genomes (many map to the same kernel)."""
        return math.prod(len(g.values) for g in self.genes)

    def options(self, genome: Mapping) -> MappingOptions:
        g = genome
        tile = [g[f"tile{k}"] for k in range(g["tile_count"])]
        opts = MappingOptions(
            outer_schedule_fusion_strategy=FusionStrategy[g["fusion"]],
            outer_schedule_allow_skewing=g["allow_skewing"],
            fix_parameters_before_scheduling=g["fix_parameters"],
            tile_sizes=tuple(tile), tile_imperfectly_nested=g["tile_imperfectly_nested"] and bool(tile),
            threads=_dims(g, "thread", g["thread_dims"]),
            blocks=_dims(g, "block", g["block_dims"]),
            unroll_factor=g["unroll"],
            use_shared_memory=g["shared"], use_private_memory=g["private"],
            use_register_tiling=g["register_tiling"], use_read_only_cache=g["read_only"],
            # knobs of a memory space only where it is used: otherwise the same kernel again
            unroll_copy_shared=g["shared"] and g["unroll_copy_shared"],
            max_shared_memory=g["max_shared"] if g["shared"] else None,
            shared_depth=g["shared_depth"] if g["shared"] else None,
            private_depth=g["private_depth"] if g["private"] else None,
            parallel_reductions=g.get("parallel_reductions"),
            use_tensor_cores=g.get("tensor_cores", False),
            overlapped_tiles=g.get("overlapped_tiles", False))
        return opts

    def encode(self, options: MappingOptions) -> dict:
        """The genome closest to `options` (each value snapped to the nearest listed one)."""
        o = options
        genome = {"fusion": o.outer_schedule_fusion_strategy.name,
                  "allow_skewing": o.outer_schedule_allow_skewing,
                  "fix_parameters": o.fix_parameters_before_scheduling,
                  "tile_count": min(len(o.tile_sizes), len(self.loops)),
                  "tile_imperfectly_nested": o.tile_imperfectly_nested,
                  "thread_dims": len(o.threads), "block_dims": len(o.blocks),
                  "unroll": o.unroll_factor, "shared": o.use_shared_memory,
                  "private": o.use_private_memory, "register_tiling": o.use_register_tiling,
                  "read_only": o.use_read_only_cache, "unroll_copy_shared": o.unroll_copy_shared,
                  "max_shared": o.max_shared_memory, "shared_depth": o.shared_depth,
                  "private_depth": o.private_depth,
                  "parallel_reductions": o.parallel_reductions,
                  "tensor_cores": o.use_tensor_cores, "overlapped_tiles": o.overlapped_tiles}
        for k in range(len(self.loops)):
            genome[f"tile{k}"] = o.tile_sizes[k] if k < len(o.tile_sizes) else None
        for k, axis in enumerate("xyz"):
            genome[f"thread_{axis}"] = o.threads[k] if k < len(o.threads) else 1
            genome[f"block_{axis}"] = o.blocks[k] if k < len(o.blocks) else 1
        return {g.name: _nearest(genome.get(g.name), g.values) for g in self.genes}

    def with_values(self, genome: Mapping) -> Space:
        """This space with `genome`'s values added where missing, so that a warm start
        (a manual schedule with tile(26), say) is represented exactly."""
        genes = tuple(Gene(g.name, g.values) if genome.get(g.name) in g.values or
                      genome.get(g.name) is None else
                      Gene(g.name, tuple(sorted(set(g.values) | {genome[g.name]},
                                                key=_order)))
                      for g in self.genes)
        return attrs.evolve(self, genes=genes)


def _dims(genome: Mapping, kind: str, n: int) -> tuple[int, ...]:
    return tuple(genome[f"{kind}_{axis}"] for axis in "xyz"[:n])


def _order(v):
    return (0, 0) if v is None else (1, v)


def _nearest(value, values: Sequence):
    if value in values:
        return value
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if isinstance(value, int) and not isinstance(value, bool) and numbers:
        return min(numbers, key=lambda v: (abs(math.log2(max(v, 1)) - math.log2(max(value, 1))), v))
    return values[0]


def powers_of_two(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(max(limit, 1))) + 1)]


def ceil_divisors(extent: int, limit: int, parts: int = 8) -> list[int]:
    """ceil(extent / j) for j = 1..parts, within limit: sizes that split extent into j nearly
    equal pieces with no nearly empty last one (the paper's footnote 9: 65 for 130)."""
    return [v for v in {-(-extent // j) for j in range(1, parts + 1)} if 1 <= v <= limit]


def size_values(extents: Sequence[int], limit: int) -> tuple[int, ...]:
    """Candidate sizes for a loop position with these extents: powers of two and ceil
    divisors, up to the largest extent and `limit`."""
    top = min(max(extents, default=1), limit)
    values = set(powers_of_two(top))
    for e in extents:
        values |= set(ceil_divisors(e, limit))
    return tuple(sorted(v for v in values if v <= max(top, 1)))


def loop_extents(reports) -> tuple[tuple[int, ...], ...]:
    """Extents per loop position (outermost first) over all statements, from `fn.ranges(...)`."""
    positions: list[set[int]] = []
    for report in reports:
        for k, (lo, hi) in enumerate(report.concrete.values()):
            while len(positions) <= k:
                positions.append(set())
            positions[k].add(max(int(hi) - int(lo), 1))
    return tuple(tuple(sorted(p)) for p in positions)


def build_space(loops: Sequence[Sequence[int]], narrow_operands: bool = False,
                intermediates: bool = False) -> Space:
    """The space for a kernel whose loop positions have these extents; `narrow_operands` (half
    or bfloat16 inputs, which contractions can take to tensor cores) adds useTensorCores,
    `intermediates` (temporary tensors, which overlapped tiles recompute) overlappedTiles."""
    loops = tuple(tuple(p) for p in loops) or ((1,),)
    all_extents = [e for p in loops for e in p]
    threads = size_values(all_extents, max(MAX_BLOCK_DIM))
    blocks = size_values([e for e in all_extents] + [MAX_BLOCKS], MAX_BLOCKS)
    genes = [Gene("fusion", tuple(m.name for m in FusionStrategy)),
             Gene("allow_skewing", (False, True)),
             Gene("fix_parameters", (False, True)),
             Gene("tile_count", tuple(range(len(loops) + 1))),
             *(Gene(f"tile{k}", size_values(p, max(p))) for k, p in enumerate(loops)),
             Gene("tile_imperfectly_nested", (False, True)),
             Gene("thread_dims", (1, 2, 3)),
             *(Gene(f"thread_{a}", tuple(v for v in threads if v <= lim))
               for a, lim in zip("xyz", MAX_BLOCK_DIM)),
             Gene("block_dims", (1, 2, 3)),
             *(Gene(f"block_{a}", blocks) for a in "xyz"),
             Gene("unroll", tuple(powers_of_two(MAX_UNROLL))),
             Gene("shared", (False, True)), Gene("private", (False, True)),
             Gene("register_tiling", (False, True)), Gene("read_only", (False, True)),
             Gene("unroll_copy_shared", (False, True)),
             Gene("max_shared", SHARED_LIMITS),
             Gene("shared_depth", (None, *range(_DEPTHS))),
             Gene("private_depth", (None, *range(_DEPTHS))),
             Gene("parallel_reductions", (None, True, False))]
    if narrow_operands:  # (elsewhere the option only adds a note: the same kernel again)
        genes.append(Gene("tensor_cores", (False, True)))
    if intermediates:
        genes.append(Gene("overlapped_tiles", (False, True)))
    return Space(tuple(genes), loops)
