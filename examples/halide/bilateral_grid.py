"""Bilateral filter through a bilateral grid (Halide's bilateral_grid app), float32.

Each 8x8 block of pixels is scattered into a histogram over intensity bins of width r_sigma
(a data-dependent write: the bin is computed from the pixel), the grid is blurred with a
[1 4 6 4 1] filter along z, x and y, and each pixel takes the trilinear sample of the grid at
its position and intensity, normalised by the sampled weight. The image's edges repeat.

Arguments: input (H, W) float32 with values in [0, 1], r_sigma (a float scalar)."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App

S_SIGMA = 8
BENCH_SIZE = (2560, 1536)
R_SIGMA = 0.1
# tcstage's options for its CUDA kernels (docs/halide.md), one set per launch, as Halide's GPU
# schedule tiles each Func on its own: the 4-d histogram and blurs (c, z, y, x) in tiles of one
# channel and bin by 8 x 32 cells, the 3-d sample (c, y, x) and the 2-d output (y, x) by 8 x 32
# pixels; the first set splits the pipeline into these 7 launches (histogram: 2)
_GRID = tc.MappingOptions().tile(1, 1, 8, 32).mapToThreads(32, 8).mapToBlocks(2, 64, 64)
GPU_OPTIONS = [_GRID, tc.MappingOptions().tile(1, 8, 32).mapToThreads(32, 8).mapToBlocks(2, 64, 64),
               _GRID, _GRID, _GRID,
               tc.MappingOptions().tile(1, 8, 32).mapToThreads(32, 8).mapToBlocks(2, 1024, 1024),
               tc.MappingOptions().tile(8, 32).mapToThreads(32, 8).mapToBlocks(1024, 1024)]
UNSCHEDULED = "slow"  # inlined, each blur recomputes the 125-cell footprint of the histogram


def _five_tap(f, at):
    """[1 4 6 4 1] along one argument: at(d) gives f's arguments for the offset d."""
    return f[at(-2)] + 4 * f[at(-1)] + 6 * f[at(0)] + 4 * f[at(1)] + f[at(2)]


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 2, "input")
    r_sigma = hl.Param(hl.Float(32), "r_sigma")
    x, y, z, c = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("c")
    edge = hl.BoundaryConditions.repeat_edge(image)

    r = hl.RDom([(0, S_SIGMA), (0, S_SIGMA)])
    value = hl.clamp(edge[x * S_SIGMA + r.x - S_SIGMA // 2, y * S_SIGMA + r.y - S_SIGMA // 2], 0.0, 1.0)
    histogram = hl.Func("histogram")
    histogram[x, y, z, c] = hl.f32(0)
    # channel 0 sums the intensities, channel 1 counts them
    histogram[x, y, hl.i32(value / r_sigma + 0.5), c] += hl.mux(c, [value, hl.f32(1)])

    blurz, blurx, blury = hl.Func("blurz"), hl.Func("blurx"), hl.Func("blury")
    blurz[x, y, z, c] = _five_tap(histogram, lambda d: (x, y, z + d, c))
    blurx[x, y, z, c] = _five_tap(blurz, lambda d: (x + d, y, z, c))
    blury[x, y, z, c] = _five_tap(blurx, lambda d: (x, y + d, z, c))

    value = hl.clamp(edge[x, y], 0.0, 1.0)
    zv = value / r_sigma
    zi = hl.i32(zv)
    zf = zv - zi
    xf = hl.f32(x % S_SIGMA) / S_SIGMA
    yf = hl.f32(y % S_SIGMA) / S_SIGMA
    xi, yi = x / S_SIGMA, y / S_SIGMA

    def bilinear(zz):
        return hl.lerp(hl.lerp(blury[xi, yi, zz, c], blury[xi + 1, yi, zz, c], xf),
                       hl.lerp(blury[xi, yi + 1, zz, c], blury[xi + 1, yi + 1, zz, c], xf), yf)

    interpolated = hl.Func("interpolated")
    interpolated[x, y, c] = hl.lerp(bilinear(zi), bilinear(zi + 1), zf)
    output = hl.Func("bilateral_grid")
    output[x, y] = interpolated[x, y, 0] / interpolated[x, y, 1]
    stages = dict(histogram=histogram, blurz=blurz, blurx=blurx, blury=blury, interpolated=interpolated)
    return App("bilateral_grid", [output], [image, r_sigma], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_IMAGE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32), R_SIGMA]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray, r_sigma: float) -> list[np.ndarray]:
    h, w = image.shape
    r32 = np.float32(r_sigma)
    clipped = np.clip(image, 0, 1).astype(np.float32)
    # The grid cells the trilinear samples reach, with the blurs' 2-cell margins.
    gx = np.arange(-4, (w - 1) // S_SIGMA + 4)
    gy = np.arange(-4, (h - 1) // S_SIGMA + 4)
    top_bin = int(np.float32(1) / r32 + np.float32(0.5))
    gz = np.arange(-4, top_bin + 6)
    hist = np.zeros((2, len(gz), len(gy), len(gx)))
    for ry in range(S_SIGMA):
        rows = np.clip(gy * S_SIGMA + ry - S_SIGMA // 2, 0, h - 1)
        for rx in range(S_SIGMA):
            cols = np.clip(gx * S_SIGMA + rx - S_SIGMA // 2, 0, w - 1)
            v = clipped[np.ix_(rows, cols)]
            bins = (v / r32 + np.float32(0.5)).astype(np.int64) - gz[0]  # float32, as Halide
            iy, ix = np.indices(v.shape)
            np.add.at(hist[0], (bins, iy, ix), v.astype(np.float64))
            np.add.at(hist[1], (bins, iy, ix), 1.0)
    taps = np.array([1, 4, 6, 4, 1], dtype=np.float64)

    def blur(a, axis):  # valid [1 4 6 4 1] along axis: loses 2 cells at each end
        n = a.shape[axis] - 4
        return sum(t * np.take(a, np.arange(k, k + n), axis=axis) for k, t in enumerate(taps))

    grid = blur(blur(blur(hist, 1), 3), 2)  # z, x, y; now z from gz[2], y from gy[2], x from gx[2]
    z0, y0, x0 = gz[2], gy[2], gx[2]
    zv = clipped / r32
    zi = zv.astype(np.int64)
    zf = (zv - zi).astype(np.float64)
    ys, xs = np.indices((h, w))
    xf, yf = (xs % S_SIGMA) / S_SIGMA, (ys % S_SIGMA) / S_SIGMA
    cx, cy = xs // S_SIGMA - x0, ys // S_SIGMA - y0

    def sample(dz, dy, dx):
        return grid[:, zi + dz - z0, cy + dy, cx + dx]

    def lerp(a, b, t):
        return a + (b - a) * t

    def bilinear(dz):
        return lerp(lerp(sample(dz, 0, 0), sample(dz, 0, 1), xf),
                    lerp(sample(dz, 1, 0), sample(dz, 1, 1), xf), yf)

    result = lerp(bilinear(0), bilinear(1), zf)
    return [(result[0] / result[1]).astype(np.float32)]


def tolerance(args) -> float:
    # A ratio of two sums of ~4096 * 64 positive terms each: relative rounding of both.
    return 1e-5


def schedule_cpu(app: App) -> None:
    # The original's: blurz over the whole grid, rows of the grid in parallel, with the
    # histogram of a grid row computed just before it; blurx and blury over the whole grid,
    # z slices in parallel; the output in parallel rows, vectors of 8 everywhere.
    (output,), s = app.outputs, app.stages
    histogram, blurz, blurx, blury = s["histogram"], s["blurz"], s["blurx"], s["blury"]
    x, y, z, c = blurz.args()
    blurz.compute_root().reorder(c, z, x, y).parallel(y).vectorize(x, 8).unroll(c)
    histogram.compute_at(blurz, y)
    hx, hy, _, hc = histogram.args()
    rx, ry = histogram.rvars(0)
    histogram.update().reorder(hc, rx, ry, hx, hy).unroll(hc)
    for f in (blurx, blury):
        x, y, z, c = f.args()
        f.compute_root().reorder(c, x, y, z).parallel(z).vectorize(x, 8).unroll(c)
    x, y = output.args()
    output.compute_root().parallel(y).vectorize(x, 8)


def schedule_gpu(app: App) -> None:
    # The original's: blurz in 8x8 tiles of grid cells, each block zeroing, filling and
    # z-blurring its histograms in shared memory; the other blurs and the sampling in tiles.
    (output,), s = app.outputs, app.stages
    histogram, blurz, blurx, blury = s["histogram"], s["blurz"], s["blurx"], s["blury"]
    xi, yi, zi = hl.Var("xi"), hl.Var("yi"), hl.Var("zi")
    x, y, z, c = blurz.args()
    blurz.compute_root().reorder(c, z, x, y).gpu_tile(x, y, xi, yi, 8, 8)
    hx, hy, hz, hc = histogram.args()
    histogram.reorder(hc, hz, hx, hy).compute_at(blurz, x).gpu_threads(hx, hy)
    rx, ry = histogram.rvars(0)
    histogram.update().reorder(hc, rx, ry, hx, hy).gpu_threads(hx, hy).unroll(hc)
    for f in (blurx, blury):
        x, y, z, c = f.args()
        (f.compute_root().reorder(c, x, y, z).reorder_storage(c, x, y, z).vectorize(c)
         .unroll(y, 2, hl.TailStrategy.RoundUp)
         .gpu_tile(x, y, z, xi, yi, zi, 32, 8, 1, hl.TailStrategy.RoundUp))
    x, y = output.args()
    output.compute_root().gpu_tile(x, y, xi, yi, 32, 8)
    interpolated = s["interpolated"]
    interpolated.compute_at(output, xi).vectorize(interpolated.args()[2])
