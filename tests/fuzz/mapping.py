"""Random valid MappingOptions: every option within its documented range (docs/cuda.md), with
the presets now and then. Thread counts stay small so that emulation stays fast, except that
about half the sets ask for a warp or more (up to 256 threads): parallel reductions take the
threads only where at least 32 are asked and the free loops give less than a warp. Parallel
reductions (on by default) are switched off now and then, and tensor cores switched on (they
apply to half and bfloat16 contractions only; elsewhere the mapper must say why and go on), and
overlapped tiles (they apply where intermediates feed the outputs; elsewhere a note says why).
A kernel of several launches is also compiled with one set per launch (`per_launch`)."""

from __future__ import annotations

import random

import tcstage as tc

PRESETS = ("naive", "pointwise", "mlp", "conv", "group_conv", "reduction")
_FUSION = ("Max", "Preserve3Coincident", "Min")


def random_options(rng: random.Random) -> tc.MappingOptions:
    if rng.random() < 0.15:
        return tc.MappingOptions.named(rng.choice(PRESETS))
    o = tc.MappingOptions()
    if rng.random() < 0.85:
        o = o.tile(*[rng.choice((0, 1, 2, 3, 4, 8)) for _ in range(rng.randint(1, 4))])
    threads = [rng.choice((1, 2, 3, 4, 8, 32)) for _ in range(rng.randint(1, 3))]
    limit = 128
    if rng.random() < 0.45:  # a warp or more, on any of the thread dimensions
        threads[rng.randrange(len(threads))] = rng.choice((32, 33, 64, 96, 128, 256))
        limit = 256
    while _product(threads) > limit:
        threads[threads.index(max(threads))] //= 2
    threads[2:] = [min(t, 64) for t in threads[2:]]  # CUDA's z limit
    o = o.mapToThreads(*threads)
    o = o.mapToBlocks(*[rng.choice((1, 2, 3, 4, 8)) for _ in range(rng.randint(1, 3))])
    o = o.unroll(rng.choice((1, 1, 2, 4, 8, 32)))
    flags = {
        "useSharedMemory": 0.4, "usePrivateMemory": 0.4, "unrollCopyShared": 0.2,
        "useReadOnlyCache": 0.3, "useRegisterTiling": 0.15, "unrollGpuTile": 0.1,
        "scheduleSpecialize": 0.15, "fixParametersBeforeScheduling": 0.2,
        "tileImperfectlyNested": 0.2, "outerScheduleAllowSkewing": 0.1,
        "intraTileScheduleAllowSkewing": 0.1, "matchLibraryCalls": 0.1,
        "overlappedTiles": 0.25,
    }
    for method, p in flags.items():
        if rng.random() < p:
            o = getattr(o, method)(True)
    if rng.random() < 0.25:
        o = o.parallelReductions(False)
    if rng.random() < 0.2:
        o = o.useTensorCores(True)
    for method in ("outerSchedulePositiveOrthant", "intraTileSchedulePositiveOrthant"):
        if rng.random() < 0.1:
            o = getattr(o, method)(False)
    if rng.random() < 0.5:
        o = o.outerScheduleFusionStrategy(rng.choice(_FUSION))
    if rng.random() < 0.3:
        o = o.intraTileScheduleFusionStrategy(rng.choice(_FUSION))
    if o.use_shared_memory and rng.random() < 0.2:
        o = o.sharedDepth(rng.randint(0, 3))
    if o.use_private_memory and rng.random() < 0.2:
        o = o.privateDepth(rng.randint(0, 3))
    if o.use_shared_memory and rng.random() < 0.15:
        o = o.maxSharedMemory(rng.choice((0, 16, 256, 48 * 1024)))
    return o


def per_launch(options, kernel) -> list[list[tc.MappingOptions]]:
    """tc.compile's list form for a kernel of several launches compiled under `options`: that
    set first (it decides the launches), then one drawn set per later launch, seeded by the first
    set's text, none with overlapped tiles (a list of several sets refuses them). Empty where
    the form does not apply: one launch, overlapped tiles, or `options` already a list."""
    if isinstance(options, str):
        options = tc.MappingOptions.parse(options)
    if not isinstance(options, tc.MappingOptions) or options.overlapped_tiles or \
            len(kernel.launches) < 2:
        return []
    rng = random.Random(f"per-launch/{options}")
    return [[options] + [random_options(rng).overlappedTiles(False)
                         for _ in kernel.launches[1:]]]


def _product(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
