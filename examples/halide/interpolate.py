"""Filling in an image's transparent parts from a pyramid (Halide's interpolate app): the
premultiplied RGBA image is downsampled level by level with a [1 2 1]/4 filter and stride 2,
then upsampled back (x / 2, (x + 1) / 2), each level's colour filling what the finer level's
alpha leaves uncovered; the result is divided by its alpha.

Input: float32 of numpy shape (4, H, W) (planar RGBA, channel outermost); output (3, H, W).
At level 4 the coordinates into level 3 are clamped to [0, W/8] x [0, H/8], as in the
original, so that the deep levels' footprint stays near the image."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App, vector_width

LEVELS = 10
CLAMP_LEVEL = 4
# tcstage's options for its CUDA kernels (docs/halide.md): each level's (c, y, x) in tiles of
# one channel by 8 x 32 pixels, blocks over all three (the levels run as launches of their own:
# a level reads the one before at 2x or x / 2, across every tile)
GPU_OPTIONS = tc.MappingOptions().tile(1, 8, 32).mapToThreads(32, 8).mapToBlocks(4, 1024, 1024)
UNSCHEDULED = "infeasible"  # inlined, every level would recompute all those below it
BENCH_SIZE = (2560, 1536)


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    edge = hl.BoundaryConditions.repeat_edge(image)
    down = [hl.Func(f"downsampled_{lv}") for lv in range(LEVELS)]
    downx = [hl.Func(f"downx_{lv}") for lv in range(LEVELS)]
    interp = [hl.Func(f"interpolated_{lv}") for lv in range(LEVELS)]
    upx = [hl.Func(f"upsampledx_{lv}") for lv in range(LEVELS)]
    up = [hl.Func(f"upsampled_{lv}") for lv in range(LEVELS)]

    # Premultiplied alpha.
    down[0][x, y, c] = hl.select(c < 3, edge[x, y, c] * edge[x, y, 3], edge[x, y, 3])
    for lv in range(1, LEVELS):
        finer = down[lv - 1]
        if lv == CLAMP_LEVEL:
            w = image.width() / (1 << (lv - 1))
            h = image.height() / (1 << (lv - 1))
            clamped = hl.Func(f"clamped_{lv}")
            clamped[x, y, c] = finer[hl.clamp(x, 0, w), hl.clamp(y, 0, h), c]
            finer = clamped
        downx[lv][x, y, c] = (finer[2 * x - 1, y, c] + 2 * finer[2 * x, y, c]
                              + finer[2 * x + 1, y, c]) * hl.f32(0.25)
        down[lv][x, y, c] = (downx[lv][x, 2 * y - 1, c] + 2 * downx[lv][x, 2 * y, c]
                             + downx[lv][x, 2 * y + 1, c]) * hl.f32(0.25)

    interp[LEVELS - 1][x, y, c] = down[LEVELS - 1][x, y, c]
    for lv in range(LEVELS - 2, -1, -1):
        coarser = interp[lv + 1]
        upx[lv][x, y, c] = (coarser[x / 2, y, c] + coarser[(x + 1) / 2, y, c]) / 2
        up[lv][x, y, c] = (upx[lv][x, y / 2, c] + upx[lv][x, (y + 1) / 2, c]) / 2
        interp[lv][x, y, c] = down[lv][x, y, c] + (1 - down[lv][x, y, 3]) * up[lv][x, y, c]

    output = hl.Func("output")
    output[x, y, c] = interp[0][x, y, c] / interp[0][x, y, 3]
    stages = {}
    for lv in range(LEVELS):
        stages[f"downsampled_{lv}"] = down[lv]
        stages[f"interpolated_{lv}"] = interp[lv]
        if lv > 0:
            stages[f"downx_{lv}"] = downx[lv]
        if lv < LEVELS - 1:
            stages[f"upsampledx_{lv}"] = upx[lv]
            stages[f"upsampled_{lv}"] = up[lv]
    return App("interpolate", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    h, w = SMALL_IMAGE if size == "small" else BENCH_SIZE
    rgba = rng.random((4, h, w), dtype=np.float32)
    rgba[3] = rng.uniform(0.25, 1.0, size=(h, w)).astype(np.float32)  # no division by ~0
    return [rgba]


def output_shapes(args) -> list[tuple]:
    _, h, w = args[0].shape
    return [(3, h, w)]


# The reference evaluates each level only at the coordinates asked of it, recursively: a
# level at columns xs and rows ys (any integer vectors) reads the finer level at the distinct
# columns 2x-1, 2x, 2x+1 and rows likewise, and combines those values.


def _gather(wanted, axis):
    """The distinct coordinates in `wanted`, sorted, and a function that picks from values
    sampled at those (along `axis`) the values at `wanted` (an extra leading axis of taps)."""
    have, where = np.unique(wanted, return_inverse=True)
    return have, lambda v: np.take(v, where.reshape(wanted.shape), axis=axis)


def _downsampled(premult, lv, xs, ys):
    """Level lv of the premultiplied pyramid at columns xs and rows ys: shape (4, len(ys), len(xs))."""
    h, w = premult.shape[1:]
    if lv == 0:
        return premult[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)]
    taps = ((-1, 1.0), (0, 2.0), (1, 1.0))
    fx = np.stack([2 * xs + d for d, _ in taps])
    fy = np.stack([2 * ys + d for d, _ in taps])
    if lv == CLAMP_LEVEL:
        fx = np.clip(fx, 0, w // (1 << (lv - 1)))
        fy = np.clip(fy, 0, h // (1 << (lv - 1)))
    ux, pick_x = _gather(fx, 2)
    uy, pick_y = _gather(fy, 1)
    finer = _downsampled(premult, lv - 1, ux, uy)
    along_x = sum(wt * picked for (_, wt), picked in zip(taps, np.moveaxis(pick_x(finer), 2, 0)))
    # along_x: (4, len(uy), len(xs)); now the rows
    along_y = sum(wt * picked for (_, wt), picked in zip(taps, np.moveaxis(pick_y(along_x), 1, 0)))
    return 0.25 * 0.25 * along_y


def _interpolated(premult, lv, xs, ys):
    down = _downsampled(premult, lv, xs, ys)
    if lv == LEVELS - 1:
        return down
    cx = np.stack([xs // 2, (xs + 1) // 2])
    cy = np.stack([ys // 2, (ys + 1) // 2])
    ux, pick_x = _gather(cx, 2)
    uy, pick_y = _gather(cy, 1)
    coarser = _interpolated(premult, lv + 1, ux, uy)
    upx = np.moveaxis(pick_x(coarser), 2, 0).sum(axis=0) / 2
    up = np.moveaxis(pick_y(upx), 1, 0).sum(axis=0) / 2
    return down + (1 - down[3:4]) * up


def reference(image: np.ndarray) -> list[np.ndarray]:
    rgba = image.astype(np.float64)
    premult = np.concatenate([rgba[:3] * rgba[3:4], rgba[3:4]])
    _, h, w = image.shape
    result = _interpolated(premult, 0, np.arange(w), np.arange(h))
    return [(result[:3] / result[3:4]).astype(np.float32)]


def tolerance(args) -> float:
    # Values stay in [0, 1] until the division by alpha >= 1/4 (of the interpolated alpha,
    # which is at least the image's own); a few dozen roundings along the way.
    return 4 * 64 * float(np.finfo(np.float32).eps)


def schedule_cpu(app: App) -> None:
    # The original's: every downsampled level but the last computed over its whole region in
    # parallel strips of 8 rows (the upsampling reads them again); level 0 is recomputed
    # inside level 1's strips instead; the output in parallel strips of 32 rows, the
    # interpolated levels computed row by row within them.
    (output,), s = app.outputs, app.stages
    (image,) = app.params
    vec = vector_width(hl.Float(32))
    for lv in range(1, LEVELS - 1):
        f = s[f"downsampled_{lv}"]
        x, y, c = f.args()
        yo, yi = hl.Var(f"yo_{lv}"), hl.Var(f"yi_{lv}")
        f.compute_root().reorder(x, c, y).split(y, yo, yi, 8).parallel(yo).vectorize(x, vec)
    level1 = s["downsampled_1"]
    copy = s["downsampled_0"].clone_in(s["downx_1"])
    x, y, c = copy.args()
    copy.store_at(level1, hl.Var("yo_1")).compute_at(level1, hl.Var("yi_1")).reorder(c, x, y).unroll(c).vectorize(x, vec)
    x, y, c = output.args()
    xo, xi, yo, yi = hl.Var("xo"), hl.Var("xi"), hl.Var("yo"), hl.Var("yi")
    (output.bound(c, 0, 3).split(x, xo, xi, vec).split(y, yo, yi, 32)
     .reorder(xi, c, xo, yi, yo).unroll(c).vectorize(xi).parallel(yo))
    for lv in range(1, LEVELS):
        f = s[f"interpolated_{lv}"]
        f.store_at(output, yo).compute_at(output, yi).vectorize(f.args()[0], vec)


def schedule_gpu(app: App) -> None:
    (output,), s = app.outputs, app.stages
    x, y, c = output.args()
    xi, yi, xii, yii = hl.Var("xi"), hl.Var("yi"), hl.Var("xii"), hl.Var("yii")

    def two_by_two_tiles(f):
        fx, fy, fc = f.args()
        (f.reorder(fc, fx, fy).tile(fx, fy, xi, yi, 32, 32, hl.TailStrategy.RoundUp)
         .tile(xi, yi, xii, yii, 2, 2).gpu_blocks(fx, fy).gpu_threads(xi, yi)
         .unroll(xii).unroll(yii).unroll(fc))

    output.bound(c, 0, 3)
    two_by_two_tiles(output)
    for lv in range(1, LEVELS):
        f = s[f"downsampled_{lv}"]
        fx, fy, fc = f.args()
        f.compute_root().reorder(fc, fx, fy).unroll(fc).gpu_tile(fx, fy, xi, yi, 16, 16)
    for lv in range(3, LEVELS, 2):
        f = s[f"interpolated_{lv}"]
        f.compute_root()
        two_by_two_tiles(f)
    for name, tile in (("upsampledx_1", (2, 1)), ("interpolated_1", (2, 2))):
        f = s[name]
        fx, fy, fc = f.args()
        (f.compute_at(output, x).reorder(fc, fx, fy).tile(fx, fy, xi, yi, *tile)
         .unroll(xi).unroll(yi).unroll(fc).gpu_threads(fx, fy))
    f = s["interpolated_2"]
    fx, fy, fc = f.args()
    f.compute_at(output, x).reorder(fc, fx, fy).unroll(fc).gpu_threads(fx, fy)
