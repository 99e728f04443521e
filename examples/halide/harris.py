"""Harris corner response of a float RGB image (Halide's harris app): grey level, 3x3 Sobel
derivatives, their products summed over 3x3 windows, and det - 0.04 trace^2 of that 2x2
structure matrix.

No boundary condition: the output is the region where every window lies inside the input,
shifted to start at 0, so an input of numpy shape (3, H, W) (planar: c outermost) gives an
(H - 4, W - 4) output whose (0, 0) is the input's (2, 2)."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App, float_tolerance, vector_width

BENCH_SIZE = (3, 2560, 1536)

# tcstage's options for its CUDA kernel (docs/halide.md): overlapped tiles of 32 x 64 outputs,
# the intermediates of a tile in a pool of 36 kB of shared memory
GPU_OPTIONS = (tc.MappingOptions().tile(32, 64).mapToThreads(64, 4).mapToBlocks(1024, 1024)
               .overlappedTiles(True))

MARGIN = 2  # the stencils' total radius: 1 for the derivatives, 1 for the window sums


def _sum3x3(f, x, y):
    return sum((f[x + i, y + j] for j in (-1, 0, 1) for i in (-1, 0, 1)), hl.f32(0))


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    x, y = hl.Var("x"), hl.Var("y")
    gray = hl.Func("gray")
    at = (x + MARGIN, y + MARGIN)
    gray[x, y] = (hl.f32(0.299) * image[at + (0,)] + hl.f32(0.587) * image[at + (1,)]
                  + hl.f32(0.114) * image[at + (2,)])
    Iy = hl.Func("Iy")
    Iy[x, y] = sum((gray[x + i, y + 1] - gray[x + i, y - 1]) * hl.f32(w / 12)
                   for i, w in ((-1, 1.0), (0, 2.0), (1, 1.0)))
    Ix = hl.Func("Ix")
    Ix[x, y] = sum((gray[x + 1, y + j] - gray[x - 1, y + j]) * hl.f32(w / 12)
                   for j, w in ((-1, 1.0), (0, 2.0), (1, 1.0)))
    Ixx, Iyy, Ixy = hl.Func("Ixx"), hl.Func("Iyy"), hl.Func("Ixy")
    Ixx[x, y] = Ix[x, y] * Ix[x, y]
    Iyy[x, y] = Iy[x, y] * Iy[x, y]
    Ixy[x, y] = Ix[x, y] * Iy[x, y]
    Sxx, Syy, Sxy = hl.Func("Sxx"), hl.Func("Syy"), hl.Func("Sxy")
    Sxx[x, y] = _sum3x3(Ixx, x, y)
    Syy[x, y] = _sum3x3(Iyy, x, y)
    Sxy[x, y] = _sum3x3(Ixy, x, y)
    det, trace = hl.Func("det"), hl.Func("trace")
    det[x, y] = Sxx[x, y] * Syy[x, y] - Sxy[x, y] * Sxy[x, y]
    trace[x, y] = Sxx[x, y] + Syy[x, y]
    output = hl.Func("output")
    output[x, y] = det[x, y] - hl.f32(0.04) * trace[x, y] * trace[x, y]
    stages = dict(gray=gray, Ix=Ix, Iy=Iy, Ixx=Ixx, Iyy=Iyy, Ixy=Ixy, Sxx=Sxx, Syy=Syy, Sxy=Sxy,
                  det=det, trace=trace)
    return App("harris", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = (3, *SMALL_IMAGE) if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    _, h, w = args[0].shape
    return [(h - 2 * MARGIN, w - 2 * MARGIN)]


def reference(image: np.ndarray) -> list[np.ndarray]:
    img = image.astype(np.float64)
    gray = 0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]

    def shifted(a, dy, dx, h, w, base):  # a[base + dy + row, base + dx + col]
        return a[base + dy:base + dy + h, base + dx:base + dx + w]

    h, w = gray.shape[0] - 2, gray.shape[1] - 2  # derivatives at gray's interior
    iy = sum(wt / 12 * (shifted(gray, 1, dx, h, w, 1) - shifted(gray, -1, dx, h, w, 1))
             for dx, wt in ((-1, 1), (0, 2), (1, 1)))
    ix = sum(wt / 12 * (shifted(gray, dy, 1, h, w, 1) - shifted(gray, dy, -1, h, w, 1))
             for dy, wt in ((-1, 1), (0, 2), (1, 1)))
    h2, w2 = h - 2, w - 2

    def window(a):
        return sum(shifted(a, dy, dx, h2, w2, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1))

    sxx, syy, sxy = window(ix * ix), window(iy * iy), window(ix * iy)
    trace = sxx + syy
    return [(sxx * syy - sxy * sxy - 0.04 * trace * trace).astype(np.float32)]


def tolerance(args) -> float:
    # Inputs in [0, 1): |Ix|, |Iy| <= 1/3, window sums <= 1, so |response| <= 1.2; ~60 terms.
    return float_tolerance(64, 2.0)


def schedule_cpu(app: App) -> None:
    # The original's: strips of 32 output rows in parallel, vectorized along x; grey level and
    # both derivatives are computed a row at a time within a strip (sliding down it), the two
    # derivatives fused into one loop over x.
    (output,), s = app.outputs, app.stages
    x, y = output.args()
    yi = hl.Var("yi")
    vec = vector_width(hl.Float(32))
    output.split(y, y, yi, 32).parallel(y).vectorize(x, vec)
    for f in (s["gray"], s["Ix"], s["Iy"]):
        f.store_at(output, y).compute_at(output, yi).vectorize(f.args()[0], vec)
    s["Ix"].compute_with(s["Iy"], s["Ix"].args()[0])


def schedule_gpu(app: App) -> None:
    # The original's: 62x14 blocks; the grey level and the two derivatives computed per block
    # by the threads, with 3x2 and 2-wide register tiles staged from them.
    (output,), s = app.outputs, app.stages
    gray, Ix, Iy = s["gray"], s["Ix"], s["Iy"]
    x, y = output.args()
    xi, yi = hl.Var("xi"), hl.Var("yi")
    output.gpu_tile(x, y, xi, yi, 62, 14).unroll(xi, 2)
    gx, gy = gray.args()
    gxi, gyi = hl.Var("gxi"), hl.Var("gyi")
    gray.compute_at(output, x).gpu_threads(gx, gy).tile(gx, gy, gxi, gyi, 3, 2).unroll(gxi).unroll(gyi)
    staged_gray = gray.in_()
    a, b = staged_gray.args()
    staged_gray.compute_at(Iy, Iy.args()[0]).vectorize(a, 2).unroll(a).unroll(b)
    for f in (Ix, Iy):
        fx, fy = f.args()
        f.compute_at(output, x).gpu_threads(fx, fy).unroll(fx, 2)
    Ix.compute_with(Iy, Ix.args()[0])
    for f in (Ix, Iy):
        staged = f.in_()
        a, b = staged.args()
        staged.compute_at(output, xi).vectorize(a, 2).unroll(a).unroll(b)
