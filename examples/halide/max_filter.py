"""Circular max filter of radius 26 over a float image (Halide's max_filter app,
apps/max_filter/max_filter_generator.cpp).

The image's x and y edges repeat outward. vert_log(x, y, c, t) holds, for t = 0..5, the
maximum of the 2^t rows from y downward; it is built by an update over an RDom whose outer
variable is t and whose inner one runs over the rows -radius .. H - 1, each slice combining
two samples of the previous one (rows outside that range keep the pure definition, the input
row itself). vert(x, y, c, t) is the vertical maximum over y - t .. y + t, as the maximum of
two overlapping samples of the slice floor(log2(2t + 1)) (slice_for_radius, a Func). A Func
filter_height(dx) counts the rows of the disc of radius 26.25 in column dx; the output at
(x, y) is the maximum over dx in [-26, 26] of vert at (x + dx, y) of that height.

The radius is a GeneratorParam, a constant here (26, the default). Input and output float32
of numpy shape (C, H, W) (planar, c outermost). No departure from the original's algorithm.
(The reference keeps the update's row range exactly: at the top row and t = 27 one sample
reads slice 5 at row -27, outside it, which holds the first input row only; the other sample
covers those rows, so the result is still the windowed maximum.)"""

from __future__ import annotations

import math

import halide as hl
import numpy as np

from examples.halide.common import App

RADIUS = 26
# ceilf(logf(radius) / logf(2)) + 1, in float32 as the generator computes it
SLICES = int(math.ceil(np.log(np.float32(RADIUS)) / np.log(np.float32(2)))) + 1
LOG2 = float(np.log(np.float32(2)))  # logf(2)

BENCH_SIZE = (3, 2560, 1536)  # the generator's estimates: 1536 x 2560, 3 channels
# 263 columns, prime, and at least the CPU schedule's 256-column strips
SMALL_SIZE = (3, 23, 263)
# Inlined, vert_log (an update, so computed where it is used) would be rebuilt for every output
# pixel and every column of its window.
UNSCHEDULED = "infeasible"


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    x, y, c, t = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("t")
    radius = RADIUS
    edge = hl.BoundaryConditions.repeat_edge(
        image, [hl.Range(image.dim(0).min(), image.dim(0).extent()),
                hl.Range(image.dim(1).min(), image.dim(1).extent())])

    vert_log = hl.Func("vert_log")
    vert_log[x, y, c, t] = edge[x, y, c]
    r = hl.RDom([(-radius, image.height() + radius), (1, SLICES - 1)], "r")
    vert_log[x, r.x, c, r.y] = hl.max(
        vert_log[x, r.x, c, r.y - 1],
        vert_log[x, r.x + hl.clamp(1 << (r.y - 1), 0, radius * 2), c, r.y - 1])

    slice_for_radius = hl.Func("slice_for_radius")
    slice_for_radius[t] = hl.i32(hl.floor(hl.log(2 * t + 1) / hl.f32(LOG2)))

    vert = hl.Func("vert")
    slice_ = hl.clamp(slice_for_radius[t], 0, SLICES)
    first_sample = vert_log[x, y - t, c, slice_]
    second_sample = vert_log[x, y + t + 1 - hl.clamp(1 << slice_, 0, 2 * radius), c, slice_]
    vert[x, y, c, t] = hl.max(first_sample, second_sample)

    filter_height = hl.Func("filter_height")
    dy = hl.RDom([(0, radius + 1)], "dy")
    filter_height[x] = hl.sum(hl.select(x * x + dy.x * dy.x < (radius + 0.25) * (radius + 0.25), 1, 0))

    output = hl.Func("output")
    dx = hl.RDom([(-radius, 2 * radius + 1)], "dx")
    output[x, y, c] = hl.maximum(vert[x + dx.x, y, c, hl.clamp(filter_height[dx.x], 0, radius + 1)])
    stages = dict(vert_log=vert_log, slice_for_radius=slice_for_radius, vert=vert,
                  filter_height=filter_height)
    return App("max_filter", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray) -> list[np.ndarray]:
    radius = RADIUS
    _, h, w = image.shape
    pad = 2 * radius + 2  # rows -pad .. h - 1 + pad, enough for every read below
    rows = np.arange(-pad, h + pad)
    base = image[:, np.clip(rows, 0, h - 1), :]  # (C, rows, W); x is clamped at the end

    def row(v):  # index of row v in the padded arrays
        return v + pad

    # slice s at row v: the maximum of rows v .. v + 2^s - 1, but only for the rows the
    # update writes (-radius .. h - 1); elsewhere the input row itself
    slices = [base]
    updated = slice(row(-radius), row(h - 1) + 1)
    for s in range(1, SLICES):
        prev = slices[-1]
        cur = base.copy()
        step = 1 << (s - 1)
        cur[:, updated] = np.maximum(prev[:, updated],
                                     prev[:, row(-radius) + step:row(h - 1) + 1 + step])
        slices.append(cur)

    ys = np.arange(h)

    def vertical(t):  # (C, H, W): the maximum over rows y - t .. y + t, as the original takes it
        s = min(int(math.floor(math.log2(2 * t + 1))), SLICES)
        a = slices[s][:, row(ys - t), :]
        b = slices[s][:, row(ys + t + 1 - min(1 << s, 2 * radius)), :]
        return np.maximum(a, b)

    heights = {}
    cols = np.arange(w)
    out = np.full(image.shape, -np.inf, dtype=np.float32)
    for d in range(-radius, radius + 1):
        height = sum(1 for e in range(radius + 1) if d * d + e * e < (radius + 0.25) ** 2)
        t = min(max(height, 0), radius + 1)
        if t not in heights:
            heights[t] = vertical(t)
        out = np.maximum(out, heights[t][:, :, np.clip(cols + d, 0, w - 1)])
    return [out]


def schedule_cpu(app: App) -> None:
    # The original's: the two lookup tables at the root; the output in strips of 256 columns,
    # channels and strips fused into one parallel loop, each building its own vert_log
    # (vectorized along x, the rows then the slices inside); vert computed per output row.
    (output,), s = app.outputs, app.stages
    vert_log, vert = s["vert_log"], s["vert"]
    s["slice_for_radius"].compute_root()
    s["filter_height"].compute_root()
    x, y, c = output.args()
    tx, t = hl.Var("tx"), hl.Var("t")
    output.compute_root().split(x, tx, x, 256).reorder(x, y, c, tx).fuse(c, tx, t).parallel(t).vectorize(x, 8)
    vx, _, vc, _ = vert_log.args()
    rx, ry = vert_log.rvars(0)
    vert_log.compute_at(output, t)
    vert_log.vectorize(vx, 8)
    vert_log.update().reorder(vx, rx, ry, vc).vectorize(vx, 8)
    vert.compute_at(output, y).vectorize(vert.args()[0], 8)


def schedule_gpu(app: App) -> None:
    # The original's: the lookup tables at the root; the output in 32 x 8 tiles, a block per
    # tile and channel; vert_log computed at the root, its pure step in 16 x 16 tiles, its
    # update a thread per column (32 per block, a block per channel), each walking the rows
    # and slices.
    (output,), s = app.outputs, app.stages
    vert_log = s["vert_log"]
    s["slice_for_radius"].compute_root()
    s["filter_height"].compute_root()
    x, y, c = output.args()
    xi, xo, yi = hl.Var("xi"), hl.Var("xo"), hl.Var("yi")
    output.gpu_tile(x, y, xi, yi, 32, 8).gpu_blocks(x, y, c)
    vx, vy, vc, vt = vert_log.args()
    rx, ry = vert_log.rvars(0)
    (vert_log.compute_root().reorder(vc, vt, vx, vy)
     .gpu_tile(vx, vy, xi, yi, 16, 16, hl.TailStrategy.RoundUp)
     .update().split(vx, xo, xi, 32, hl.TailStrategy.RoundUp).reorder(rx, ry, xi, xo, vc)
     .gpu_blocks(xo, vc).gpu_threads(xi))
