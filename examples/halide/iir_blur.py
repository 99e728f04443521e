"""First-order recursive (IIR) low-pass filter of a float colour image (Halide's iir_blur app,
apps/iir_blur/iir_blur_generator.cpp).

Each pass runs the filter out[i] = (1 - alpha) out[i-1] + alpha in[i] down every column,
starting from the top row as it is, then back up the columns over its own result
(out[i] = (1 - alpha) out[i+1] + alpha out[i]), and transposes; two passes blur the columns,
then the rows. The filter is a Func whose pure definition is undef, with an update for the
first row and one each over an RDom for the two scans.

The original also hardcodes the buffers' bounds and strides to its test image (1536 x 2560 x
3, dense), a promise about the caller's buffers that lets Halide fold the loop bounds; that is
left out of the algorithm (any size works here) and kept as `constrain_to_bench_size(app)`.
Arguments: input of numpy shape (3, H, W) float32 (planar), alpha (float32); the output has
the input's shape."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import App, float_tolerance, vector_width

BENCH_SIZE = (3, 2560, 1536)  # rgb.png, the app's test image
# Prime extents of at least 64: the CPU schedule tiles each transpose in vec x 4 vec tiles
# (16 x 64 with AVX-512) and the images must hold a whole tile both ways.
SMALL_SIZE = (3, 67, 71)
ALPHA = 0.5  # the app's test (filter.cpp)


def _blur_cols_transpose(source, height, alpha, x, y, c, index):
    """The IIR filter down and up the columns of `source` (rows 0 .. height - 1), transposed."""
    blur = hl.Func(f"blur_{index}")
    blur[x, y, c] = hl.undef(hl.Float(32))
    blur[x, 0, c] = source[x, 0, c]
    ry = hl.RDom([(1, height - 1)], f"ry_{index}")
    blur[x, ry.x, c] = (1 - alpha) * blur[x, ry.x - 1, c] + alpha * source[x, ry.x, c]
    flip_ry = height - ry.x - 1
    blur[x, flip_ry, c] = (1 - alpha) * blur[x, flip_ry + 1, c] + alpha * blur[x, flip_ry, c]
    transpose = hl.Func(f"transpose_{index}")
    transpose[x, y, c] = blur[y, x, c]
    return transpose, blur


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    alpha = hl.Param(hl.Float(32), "alpha")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    width, height = image.width(), image.height()
    blury_t, blur_0 = _blur_cols_transpose(image, height, alpha, x, y, c, 0)
    output, blur_1 = _blur_cols_transpose(blury_t, width, alpha, x, y, c, 1)
    stages = dict(blur_0=blur_0, transpose_0=blury_t, blur_1=blur_1)
    return App("iir_blur", [output], [image, alpha], stages)


def constrain_to_bench_size(app: App) -> None:
    """The original's constraints: input and output exactly 1536 x 2560 x 3, dense, planar."""
    w, h = BENCH_SIZE[2], BENCH_SIZE[1]
    for buf in (app.params[0], app.outputs[0].output_buffer()):
        buf.dim(0).set_bounds(0, w).set_stride(1)
        buf.dim(1).set_bounds(0, h).set_stride(w)
        buf.dim(2).set_bounds(0, 3).set_stride(w * h)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32), ALPHA]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def _np_blur_columns(a: np.ndarray, alpha: float) -> np.ndarray:
    """The filter down then up axis 1 of a (c, rows, cols) array."""
    out = a.astype(np.float64).copy()
    for i in range(1, out.shape[1]):
        out[:, i] = (1 - alpha) * out[:, i - 1] + alpha * out[:, i]
    for i in range(out.shape[1] - 2, -1, -1):
        out[:, i] = (1 - alpha) * out[:, i + 1] + alpha * out[:, i]
    return out


def reference(image: np.ndarray, alpha: float) -> list[np.ndarray]:
    a = float(np.float32(alpha))
    blurred_t = _np_blur_columns(image, a).transpose(0, 2, 1)
    return [_np_blur_columns(blurred_t, a).transpose(0, 2, 1).astype(np.float32)]


def tolerance(args) -> float:
    # Each step is a convex combination of values in [0, 1], rounded; an error made at one
    # step decays by (1 - alpha) per step after, so each of the four scans ends within about
    # 2 / alpha roundings.
    alpha = args[1]
    return float_tolerance(int(np.ceil(4 * 2 / alpha)) + 4, 1.0)


def schedule_cpu(app: App) -> None:
    # The original's, for both passes: each transpose computed whole in vec x 4 vec tiles, a
    # strip of tiles (and a channel) per parallel task, vectorized both ways; the filter
    # computed per task, its scans vectorized across the columns.
    vec = vector_width(hl.Float(32))
    for transpose, blur in ((app.stages["transpose_0"], app.stages["blur_0"]),
                            (app.outputs[0], app.stages["blur_1"])):
        x, y, c = transpose.args()
        xo, yo, yi, t = hl.Var("xo"), hl.Var("yo"), hl.Var("yi"), hl.Var("t")
        (transpose.compute_root().tile(x, y, xo, yo, x, y, vec, vec * 4).split(y, y, yi, vec)
         .vectorize(yi).vectorize(x).fuse(yo, c, t).parallel(t))
        blur.compute_at(transpose, t)
        bx = blur.args()[0]
        blur.update(0).unscheduled()
        for i in (1, 2):
            (ry,) = blur.rvars(i)
            blur.update(i).reorder(bx, ry).vectorize(bx)


def schedule_gpu(app: App) -> None:
    # The original's CUDA schedule, for both passes: each transpose in 32 x 32 tiles, a block
    # per row of tiles and channel, a warp's lanes across the tile; the filter computed per
    # block in global memory, the scans unrolled by 8, staged through shared memory padded to
    # a stride of 33 for the transpose.
    warp_size = 32
    for transpose, blur in ((app.stages["transpose_0"], app.stages["blur_0"]),
                            (app.outputs[0], app.stages["blur_1"])):
        x, y, c = transpose.args()
        xi, yi = hl.Var("xi"), hl.Var("yi")
        (transpose.compute_root().tile(x, y, xi, yi, warp_size, warp_size).gpu_blocks(y, c)
         .gpu_lanes(xi))
        bx = blur.args()[0]
        blur.compute_at(transpose, y).store_in(hl.MemoryType.Heap).gpu_lanes(bx)
        blur.update(0).gpu_lanes(bx)
        for i in (1, 2):
            (ry,) = blur.rvars(i)
            blur.update(i).unroll(ry, 8).gpu_lanes(bx)
        staged = blur.in_()
        staged.align_storage(staged.args()[0], warp_size + 1).compute_at(transpose, x).gpu_lanes(
            staged.args()[0])
