"""A chain of 5x5 stencils over a uint16 image whose edges repeat outward (Halide's
stencil_chain app): stage s+1 is the weighted sum, weights (i+3)(j+3) for offsets i, j in
-2..2, of stage s; uint16 throughout, so the sums wrap modulo 2**16 as in the original."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App, vector_width

STENCILS = 32  # the app's default
# Unscheduled (all inlined), stage k would recompute 25**k points of stage 0: not realizable.
UNSCHEDULED = "infeasible"
BENCH_SIZE = (2560, 1536)

# tcstage's options for its CUDA kernel (docs/halide.md): overlapped tiles of 32 x 64 outputs,
# the 32 stages in groups that fit in shared memory
GPU_OPTIONS = (tc.MappingOptions().tile(32, 64).mapToThreads(64, 4).mapToBlocks(1024, 1024)
               .overlappedTiles(True))

GROUP = 11  # stages computed together between two compute_root stages in the CPU schedule


def build() -> App:
    image = hl.ImageParam(hl.UInt(16), 2, "input")
    x, y = hl.Var("x"), hl.Var("y")
    previous = hl.BoundaryConditions.repeat_edge(image)
    stages = {}
    for s in range(STENCILS):
        stage = hl.Func(f"stage_{s}")
        e = hl.u16(0)
        for i in range(-2, 3):
            for j in range(-2, 3):
                e = e + (i + 3) * (j + 3) * previous[x + i, y + j]
        stage[x, y] = e
        stages[f"stage_{s}"] = previous = stage
    output = hl.Func("output")
    output[x, y] = previous[x, y]
    return App("stencil_chain", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_IMAGE if size == "small" else BENCH_SIZE
    return [rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray) -> list[np.ndarray]:
    h, w = image.shape
    pad = 2 * STENCILS  # each stage reads 2 beyond its own region on every side
    values = np.pad(image, pad, mode="edge").astype(np.int64)
    for _ in range(STENCILS):
        rows, cols = values.shape[0] - 4, values.shape[1] - 4
        acc = np.zeros((rows, cols), dtype=np.int64)
        for i in range(-2, 3):      # x offset: columns
            for j in range(-2, 3):  # y offset: rows
                acc += (i + 3) * (j + 3) * values[2 + j:2 + j + rows, 2 + i:2 + i + cols]
        values = acc & 0xFFFF
    assert values.shape == (h, w)
    return [values.astype(np.uint16)]


def _stage_list(app: App) -> list:
    return [app.stages[f"stage_{s}"] for s in range(STENCILS)]


def schedule_cpu(app: App) -> None:
    # The original's: every GROUP-th stage (and the output) is computed over its whole region,
    # in 2 x 8 tiles run in parallel; the stages between are computed a row at a time inside
    # each tile, in buffers kept per tile (sliding windows down the rows).
    (output,) = app.outputs
    (image,) = app.params
    stages = _stage_list(app)
    chain = [None] + stages[:-1] + [output]  # chain[k]: the k-th Func after the input;
    vec = vector_width(hl.UInt(16))           # the last stage itself is inlined in the output
    last = len(chain) - 1
    for j in range(last, 0, -GROUP):
        root = chain[j]
        x, y = root.args()
        # The region of chain[j]: the output's, grown by 2 on each side per later stage.
        growth = 4 * (last - j)
        tile_w = (image.width() + growth + 1) / 2
        tile_h = (image.height() + growth + 7) / 8
        xo, yo, xi, yi, t = (hl.Var(f"{n}_{j}") for n in ("xo", "yo", "xi", "yi", "t"))
        (root.compute_root().tile(x, y, xo, yo, xi, yi, tile_w, tile_h)
         .fuse(xo, yo, t).parallel(t).vectorize(xi, vec))
        for inner in chain[max(1, j - GROUP + 1):j]:
            inner.store_at(root, t).compute_at(root, yi).vectorize(inner.args()[0], vec)


def schedule_gpu(app: App) -> None:
    # The original's: every stage computed over its whole region, 60x12 blocks of 2x2-pixel
    # threads, with the previous stage's block footprint staged in shared memory and each
    # thread's 6x6 window of it in registers.
    (output,) = app.outputs
    stages = _stage_list(app)
    chain = stages[:-1] + [output]
    for s in range(1, len(chain)):
        f, prev = chain[s], chain[s - 1]
        x, y = f.args()
        xi, yi, xii, yii = (hl.Var(f"{n}_{s}") for n in ("xi", "yi", "xii", "yii"))
        f.compute_root().gpu_tile(x, y, xi, yi, 60, 12).tile(xi, yi, xii, yii, 2, 2).unroll(xii).unroll(yii)
        shared = prev.in_()
        px, py = shared.args()
        (shared.compute_at(f, x).tile(px, py, xi, yi, 2, 2).vectorize(xi).unroll(yi)
         .gpu_threads(px, py))
        registers = shared.in_()
        rx, ry = registers.args()
        registers.compute_at(f, xi).vectorize(rx, 2).unroll(rx).unroll(ry)
