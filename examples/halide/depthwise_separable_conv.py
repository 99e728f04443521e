"""A depthwise separable convolution layer with bias and relu (Halide's depthwise_separable_conv
app, apps/depthwise_separable_conv/depthwise_separable_conv_generator.cpp), float32.

The input is padded with zeros (a select on the coordinates' range around a clamped read).
The depthwise step convolves each channel with its own filter (an update with no pure
definition, so it starts from zero, reducing over the channel multiplier and the filter's
window, centred); the pointwise step is a matrix product over the intermediate channels,
started from the bias; relu is max(0, .). The output keeps the input's width and height.

Halide's dimensions, innermost first, and the numpy shapes they make:
  input(ci, x, y, b)                   -> (N, H, W, CI)
  depthwise_filter(cm, ci, fx, fy)     -> (FH, FW, CI, CM)
  pointwise_filter(co, ci * cm)        -> (CI * CM, CO)
  bias(co)                             -> (CO,)
  output(co, x, y, b)                  -> (N, H, W, CO)
Arguments come in Halide's order (infer_arguments: buffers by name): bias, depthwise_filter,
input, pointwise_filter. As written by the authors, the depthwise step indexes the filter's
input-channel dimension by the intermediate channel and sums over the channel multiplier, so
it stays in bounds for a channel multiplier of 1 only: the app's own (and only) test case,
and the sizes here. No departure from the original's algorithm.

The manual schedules end, as the original's do, with a constraint on the depthwise filter's
layout (its second dimension's stride is the channel multiplier) and a specialization for
channel multiplier 1, a multiple of 32 intermediate channels and a 3x3 filter."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import App, float_tolerance, vector_width

# the app's own sizes (MobileNet v2's second layer): process.cpp
BENCH_SIZES = dict(N=4, CI=32, CO=16, CM=1, W=112, H=112, F=3)
SMALL_SIZES = dict(N=2, CI=32, CO=16, CM=1, W=7, H=5, F=3)


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 4, "input")
    depthwise_filter = hl.ImageParam(hl.Float(32), 4, "depthwise_filter")
    pointwise_filter = hl.ImageParam(hl.Float(32), 2, "pointwise_filter")
    bias = hl.ImageParam(hl.Float(32), 1, "bias")
    x, y, d, b = hl.Var("x"), hl.Var("y"), hl.Var("d"), hl.Var("b")

    in_bounds = ((x >= 0) & (x < image.dim(1).extent())
                 & (y >= 0) & (y < image.dim(2).extent()))
    clamped_x = hl.clamp(x, 0, image.dim(1).max())
    clamped_y = hl.clamp(y, 0, image.dim(2).max())
    input_bounded = hl.Func("input_bounded")
    input_bounded[d, x, y, b] = hl.select(in_bounds, image[d, clamped_x, clamped_y, b], hl.f32(0))

    channel_multiplier = depthwise_filter.dim(0).extent()
    pad_width = depthwise_filter.dim(2).extent() / 2
    pad_height = depthwise_filter.dim(3).extent() / 2
    window = hl.RDom([(0, depthwise_filter.dim(0).extent()), (0, depthwise_filter.dim(2).extent()),
                      (0, depthwise_filter.dim(3).extent())], "depthwise_filter_dom")
    rd, rx, ry = window.x, window.y, window.z
    depthwise_convolved = hl.Func("depthwise_convolved")
    depthwise_convolved[d, x, y, b] += (
        depthwise_filter[rd, d, rx, ry]
        * input_bounded[d / channel_multiplier, x + rx - pad_width, y + ry - pad_height, b])

    rc = hl.RDom([(0, pointwise_filter.dim(1).extent())], "rc")
    pointwise_convolved = hl.Func("pointwise_convolved")
    pointwise_convolved[d, x, y, b] = bias[d]
    pointwise_convolved[d, x, y, b] += pointwise_filter[d, rc.x] * depthwise_convolved[rc.x, x, y, b]

    output = hl.Func("output")
    output[d, x, y, b] = hl.max(pointwise_convolved[d, x, y, b], hl.f32(0))
    stages = dict(input_bounded=input_bounded, depthwise_convolved=depthwise_convolved,
                  pointwise_convolved=pointwise_convolved)
    return App("depthwise_separable_conv", [output],
               [bias, depthwise_filter, image, pointwise_filter], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    s = SMALL_SIZES if size == "small" else BENCH_SIZES
    n, ci, co, cm, w, h, f = (s[k] for k in ("N", "CI", "CO", "CM", "W", "H", "F"))
    return [rng.standard_normal((co,), dtype=np.float32),
            rng.standard_normal((f, f, ci, cm), dtype=np.float32),
            rng.standard_normal((n, h, w, ci), dtype=np.float32),
            rng.standard_normal((ci * cm, co), dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    bias, _, image, _ = args
    n, h, w, _ = image.shape
    return [(n, h, w, bias.shape[0])]


def reference(bias, depthwise_filter, image, pointwise_filter) -> list[np.ndarray]:
    n, h, w, ci = image.shape
    fh, fw, _, cm = depthwise_filter.shape
    inter = pointwise_filter.shape[0]
    ph, pw = fh // 2, fw // 2
    padded = np.zeros((n, h + fh, w + fw, ci))  # zeros outside the image
    padded[:, ph:ph + h, pw:pw + w, :] = image
    dw = depthwise_filter.astype(np.float64)
    channels = np.arange(inter)
    depthwise = np.zeros((n, h, w, inter))
    for ky in range(fh):
        for kx in range(fw):
            window = padded[:, ky:ky + h, kx:kx + w, :][..., channels // cm]
            # the filter at (rd, d, kx, ky), summed over rd
            depthwise += window * dw[ky, kx, channels, :].sum(axis=-1)
    out = bias.astype(np.float64) + np.einsum("nhwc,co->nhwo", depthwise,
                                              pointwise_filter.astype(np.float64))
    return [np.maximum(out, 0).astype(np.float32)]


def tolerance(args) -> float:
    # The depthwise values are sums of FH FW CM products bounded by |input| |filter|; the
    # pointwise sum adds CI CM products of those by the pointwise filter, and the bias.
    bias, depthwise_filter, image, pointwise_filter = args
    fh, fw, _, cm = depthwise_filter.shape
    depthwise = fh * fw * cm * float(np.abs(image).max() * np.abs(depthwise_filter).max())
    terms = pointwise_filter.shape[0] + fh * fw * cm + 1
    magnitude = depthwise * float(np.abs(pointwise_filter).max()) + float(np.abs(bias).max())
    return float_tolerance(terms, magnitude)


def _specialize(app: App) -> None:
    (output,) = app.outputs
    _, depthwise_filter, _, pointwise_filter = app.params
    channel_multiplier = depthwise_filter.dim(0).extent()
    depthwise_filter.dim(1).set_stride(channel_multiplier)
    intermediate = pointwise_filter.dim(1).extent()
    output.specialize((channel_multiplier == 1) & (intermediate == (intermediate / 32) * 32)
                      & (depthwise_filter.dim(2).extent() == 3) & (depthwise_filter.dim(3).extent() == 3))


def _register_tile() -> tuple[int, int, int]:
    """(tile_d in vectors, tile_w, tile_h): the original's choice of accumulators for the
    host's register file."""
    target = hl.get_host_target()
    vec = vector_width(hl.Float(32))
    num_regs = 32 if (target.has_feature(hl.TargetFeature.AVX512_Skylake)
                      or (target.arch == hl.TargetArch.ARM and target.bits == 64)) else 16
    if num_regs == 32 and vec == 16:
        return 1, 6, 4
    if num_regs == 32 and vec == 4:
        return 4, 3, 2
    if num_regs == 16 and vec == 8:
        return 2, 3, 2
    return 4, 2, 1


def schedule_cpu(app: App) -> None:
    # The original's: the output in register tiles of tile_d channels (vectorized) by
    # tile_w x tile_h pixels, rows and batch fused into one parallel loop; the pointwise step
    # per tile, its reduction over the intermediate channels split in slices of tile_d, and
    # for each slice the depthwise step and the padded input computed on the stack.
    (output,), s = app.outputs, app.stages
    input_bounded, depthwise, pointwise = (s[k] for k in ("input_bounded", "depthwise_convolved",
                                                          "pointwise_convolved"))
    vec = vector_width(hl.Float(32))
    tile_d, tile_w, tile_h = _register_tile()
    tile_d *= vec
    di, xi, yi = hl.Var("di"), hl.Var("xi"), hl.Var("yi")
    ro, ri = hl.RVar("ro"), hl.RVar("ri")

    d, x, y, b = output.args()
    (output.tile([d, x, y], [di, xi, yi], [tile_d, tile_w, tile_h])
     .vectorize(di).unroll(xi).unroll(yi).fuse(y, b, b).parallel(b))

    pd, px, py, pb = pointwise.args()
    (rc,) = pointwise.rvars(0)
    (pointwise.compute_at(output, d).vectorize(pd).unroll(px).unroll(py)
     .update().reorder(pd, px, py, rc, pb).vectorize(pd).unroll(px).unroll(py)
     .split(rc, ro, ri, tile_d))

    dd, dx, dy, db = depthwise.args()
    rd, rx, ry = depthwise.rvars(0)
    (depthwise.store_in(hl.MemoryType.Stack).bound_extent(dd, tile_d).compute_at(pointwise, ro)
     .vectorize(dd).reorder(dx, dy, dd).unroll(dx).unroll(dy)
     .update().vectorize(dd).reorder(dx, dy, dd, rd, rx, ry, db).unroll(dx).unroll(dy))

    bd, bx, _, _ = input_bounded.args()
    (input_bounded.store_in(hl.MemoryType.Stack).compute_at(pointwise, ro)
     .tile(bd, bx, di, xi, vec, 4, hl.TailStrategy.RoundUp).vectorize(di).unroll(xi))
    _specialize(app)


def schedule_gpu(app: App) -> None:
    # The original's CUDA schedule: each block computes 16 channels by 4 x 4 pixels of the
    # output, each thread 1 x 2 x 2 of them in registers; the depthwise step is computed per
    # block into shared memory (32 channels by 4 x 4 pixels, 2 x 2 x 2 per thread, accumulated
    # in registers by a wrapper), and staged back into registers four channels at a time for
    # the pointwise reduction, which is unrolled by four.
    (output,), s = app.outputs, app.stages
    depthwise, pointwise = s["depthwise_convolved"], s["pointwise_convolved"]
    di, xi, yi, dii, xii, yii = (hl.Var(n) for n in ("di", "xi", "yi", "dii", "xii", "yii"))
    ro, ri = hl.RVar("ro"), hl.RVar("ri")

    d, x, y, b = output.args()
    (output.tile([d, x, y], [di, xi, yi], [16, 4, 4]).tile([di, xi, yi], [dii, xii, yii], [1, 2, 2])
     .gpu_threads(di, xi, yi).fuse(y, b, b).gpu_blocks(d, x, b).unroll(xii).unroll(yii).unroll(dii))

    pd, px, py, _ = pointwise.args()
    (rc,) = pointwise.rvars(0)
    (pointwise.compute_at(output, di).reorder(px, py, pd).unroll(px).unroll(py).unroll(pd)
     .update().unroll(px).unroll(py).unroll(pd).split(rc, ro, ri, 4).reorder(ri, px, py, pd, ro)
     .unroll(ri))

    accumulated = depthwise.in_()
    staged = accumulated.in_()
    sd, sx, sy, _ = staged.args()
    staged.compute_at(pointwise, px).bound_extent(sd, 4).vectorize(sd).unroll(sx).unroll(sy)

    ad, ax, ay, _ = accumulated.args()
    (accumulated.compute_at(output, d)
     .tile([ad, ax, ay], [di, xi, yi], [32, 4, 4], hl.TailStrategy.RoundUp)
     .tile([di, xi, yi], [dii, xii, yii], [2, 2, 2])
     .gpu_threads(di, xi, yi).unroll(xii).unroll(yii).unroll(dii))

    dd, dx, dy, _ = depthwise.args()
    rd, rx, ry = depthwise.rvars(0)
    (depthwise.compute_at(accumulated, di).unroll(dx).unroll(dy).unroll(dd)
     .update().reorder(dd, dx, dy, rx, ry, rd).unroll(dx).unroll(dy).unroll(dd))
    _specialize(app)
