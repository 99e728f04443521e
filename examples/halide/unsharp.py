"""Unsharp masking of a float RGB image (Halide's unsharp app, apps/unsharp/unsharp_generator.cpp).

The grey level (0.299 R + 0.587 G + 0.114 B, the image's edges repeated outward) is blurred
by a 7-tap Gaussian (sigma 1.5, a GeneratorParam: a constant here), first along y and then
along x; the sharpened grey level 2 gray - blur, divided by gray, is the factor by which every
channel of the (unclamped) input is scaled. Input and output are float32 of numpy shape
(3, H, W) (planar, c outermost). The taps come from a Func `kernel` evaluated by the pipeline,
as in the original. No departure from the original's algorithm."""

from __future__ import annotations

import math

import halide as hl
import numpy as np

from examples.halide.common import SMALL_IMAGE, App, vector_width

SIGMA = 1.5  # the generator's default
BENCH_SIZE = (3, 2560, 1536)  # the generator's estimates: 1536 x 2560, 3 channels
SMALL_SIZE = (3, *SMALL_IMAGE)

_PI = 3.14159265358979310000


def _kernel_scale() -> float:
    # sqrtf(2 pi) * sigma, computed in float32 as the C++ generator computes it
    return float(np.float32(math.sqrt(np.float32(2 * _PI))) * np.float32(SIGMA))


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")

    kernel = hl.Func("kernel")
    kernel[x] = hl.exp(-x * x / hl.f32(2 * SIGMA * SIGMA)) / hl.f32(_kernel_scale())

    edge = hl.BoundaryConditions.repeat_edge(image)
    gray = hl.Func("gray")
    gray[x, y] = (hl.f32(0.299) * edge[x, y, 0] + hl.f32(0.587) * edge[x, y, 1]
                  + hl.f32(0.114) * edge[x, y, 2])

    blur_y = hl.Func("blur_y")
    blur_y[x, y] = (kernel[0] * gray[x, y]
                    + kernel[1] * (gray[x, y - 1] + gray[x, y + 1])
                    + kernel[2] * (gray[x, y - 2] + gray[x, y + 2])
                    + kernel[3] * (gray[x, y - 3] + gray[x, y + 3]))
    blur_x = hl.Func("blur_x")
    blur_x[x, y] = (kernel[0] * blur_y[x, y]
                    + kernel[1] * (blur_y[x - 1, y] + blur_y[x + 1, y])
                    + kernel[2] * (blur_y[x - 2, y] + blur_y[x + 2, y])
                    + kernel[3] * (blur_y[x - 3, y] + blur_y[x + 3, y]))

    sharpen = hl.Func("sharpen")
    sharpen[x, y] = 2 * gray[x, y] - blur_x[x, y]
    ratio = hl.Func("ratio")
    ratio[x, y] = sharpen[x, y] / gray[x, y]
    output = hl.Func("output")
    output[x, y, c] = ratio[x, y] * image[x, y, c]
    stages = dict(kernel=kernel, gray=gray, blur_y=blur_y, blur_x=blur_x, sharpen=sharpen,
                  ratio=ratio)
    return App("unsharp", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    # Bounded away from 0: the output divides by the grey level (see tolerance).
    return [rng.uniform(0.05, 1.0, size=shape).astype(np.float32)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def _gray(image: np.ndarray) -> np.ndarray:
    img = image.astype(np.float64)
    return 0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]


def reference(image: np.ndarray) -> list[np.ndarray]:
    taps = np.exp(-np.arange(4.0) ** 2 / (2 * SIGMA * SIGMA)) / (math.sqrt(2 * math.pi) * SIGMA)
    gray = _gray(image)
    h, w = gray.shape
    rows, cols = np.arange(h), np.arange(w)

    def at_rows(a, d):  # a[clamp(y + d), :]
        return a[np.clip(rows + d, 0, h - 1)]

    def at_cols(a, d):
        return a[:, np.clip(cols + d, 0, w - 1)]

    # blur_y is only ever read at columns of the image clamped (gray repeats its edge), so
    # clamping the columns of blur_y is the same as reading the repeated edge of gray.
    blur_y = taps[0] * gray + sum(taps[k] * (at_rows(gray, -k) + at_rows(gray, k)) for k in (1, 2, 3))
    blur_x = taps[0] * blur_y + sum(taps[k] * (at_cols(blur_y, -k) + at_cols(blur_y, k))
                                    for k in (1, 2, 3))
    ratio = (2 * gray - blur_x) / gray
    return [(ratio[None] * image[:3].astype(np.float64)).astype(np.float32)]


def tolerance(args) -> float:
    # gray, blur in (0, 1], sharpen = 2 gray - blur in [-1, 2]. Absolute float32 errors: gray
    # 3 terms, the blurs 14 products (taps through Halide's exp, relative error a few ulp),
    # sharpen the sum of those: about 40 ulp of 1. ratio = sharpen / gray multiplies an error
    # of sharpen by 1 / gmin and one of gray by |sharpen| / gmin^2 <= 2 / gmin^2; the input
    # (<= 1) scales it once more.
    gmin = float(_gray(args[0]).min())
    eps = float(np.finfo(np.float32).eps)
    return 4 * eps * (40 / gmin + 2 * 3 / gmin ** 2 + 2 * 2 / gmin)


def schedule_cpu(app: App) -> None:
    # The original's: strips of 32 output rows in parallel, vectorized along x, all three
    # channels of a row together; the grey level, the vertical blur and the ratio are
    # computed a row at a time within a strip (stored per strip), the horizontal blur and
    # sharpen inlined.
    (output,), s = app.outputs, app.stages
    x, y, c = output.args()
    yo, yi = hl.Var("yo"), hl.Var("yi")
    vec = vector_width(hl.Float(32))
    output.split(y, yo, yi, 32).vectorize(x, vec).parallel(yo).reorder(x, c, yi, yo)
    for name in ("gray", "blur_y", "ratio"):
        f = s[name]
        f.compute_at(output, yi).store_at(output, yo).vectorize(f.args()[0], vec)


def schedule_gpu(app: App) -> None:
    # The original's (CUDA, 32 x 32 tiles): the three channels unrolled in each thread, the
    # ratio per pixel, the grey level per block in 2x2 per thread, the vertical blur per
    # block two columns per thread.
    (output,), s = app.outputs, app.stages
    x, y, c = output.args()
    xi, yi = hl.Var("xi"), hl.Var("yi")
    tile = 32
    output.compute_root().reorder(c, x, y).gpu_tile(x, y, xi, yi, tile, tile).bound(c, 0, 3).unroll(c)
    s["ratio"].compute_at(output, xi)
    gray = s["gray"]
    gx, gy = gray.args()
    gxi, gyi = hl.Var("gxi"), hl.Var("gyi")
    gray.compute_at(output, x).tile(gx, gy, gxi, gyi, 2, 2).unroll(gxi).unroll(gyi).gpu_threads(gx, gy)
    blur_y = s["blur_y"]
    bx, by = blur_y.args()
    blur_y.compute_at(output, x).unroll(bx, 2).gpu_threads(bx, by)
