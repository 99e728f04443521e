"""Gaussian blur of a float grey image with the edge repeated (Halide's gaussian_blur app,
apps/gaussian_blur/gaussian_blur_generator.cpp), in the two ways that file builds:

- "direct" (the gaussian_blur_direct generator): a separable convolution with a normalised
  Gaussian of standard deviation sigma truncated at ceil(trunc * sigma) pixels, so the length
  of the reduction domain comes from the Params sigma (float) and trunc (int).
- "resample" (the gaussian_blur generator, the default here): the image is downsampled by
  `factor` with a kernel of `downsample_order` boxes (each pass after the first also convolved
  with [1 1] / 2), in y as `downsample_order` phases summed, then in x; blurred directly at
  low resolution with the sigma left over once the two resampling kernels' variances are
  taken out; then upsampled by `factor` with a kernel of `upsample_order` boxes, as a filter
  of `factor` phases interleaved, in x, then in y. The resampling kernels are computed when
  the pipeline is built (a realize) and embedded in it as constant Buffers, as the original
  does; a kernel of one box stays a Func.

The GeneratorParams (factor, upsample_order, downsample_order) are arguments of `build`, with
the app's defaults (8, 3, 2); VARIANTS names the two variants and `variant(name)` gives the
module's interface bound to one. The original's inline `sum(e, blur_y_sum)` (a sum into a
Func the schedule names) is written out as that Func's += update, which is what it builds.
Arguments: input (H, W) float32, sigma (float32), trunc (int32); the output has the input's
shape. The CPU schedule constrains the output's row stride to a multiple of 16 floats, so the
test images are 16k pixels wide."""

from __future__ import annotations

import functools
import math
import types

import halide as hl
import numpy as np

from examples.halide.common import SMALL_IMAGE, App, float_tolerance, vector_width

BENCH_SIZE = (2560, 1536)  # gray.png, the app's test image (1536 x 2560)
SIGMA, TRUNC = 10.0, 5  # the app's test: sigma 10, the resampled blurs truncated at 5 sigma
# Inlined, every output pixel recomputes the downsamplings and the blur under it, and every
# tap the normalised Gaussian (its sum of exponentials): seconds for the resampled blur,
# tens of seconds for the direct one (101 taps at sigma 10) on the small image.
UNSCHEDULED_OF = {"resample": "slow", "direct": "infeasible"}
UNSCHEDULED = UNSCHEDULED_OF["resample"]
TASKS = 32  # the original's number of parallel strips

VARIANTS = {
    "resample": dict(method="resample", factor=8, upsample_order=3, downsample_order=2),
    "direct": dict(method="direct"),
}
DEFAULT_VARIANT = "resample"


def _div_up(a, b):
    return (a + b - 1) // b


def _direct_gaussian_blur(source, sigma, trunc, x, y):
    """The separable blur of the Func `source` (already bounded); returns the result and the
    inner Funcs by name."""
    kernel = hl.Func("kernel")
    kernel[x] = hl.exp(-(x * x) / (2 * sigma * sigma))
    radius = hl.i32(hl.ceil(trunc * sigma))
    r = hl.RDom([(-radius, 2 * radius + 1)])
    kernel_sum = hl.Func("kernel_sum")
    kernel_sum[()] = hl.sum(kernel[r.x])
    kernel_normalized = hl.Func("kernel_normalized")
    kernel_normalized[x] = kernel[x] / kernel_sum[()]
    blur_y, blur_y_sum = hl.Func("blur_y"), hl.Func("blur_y_sum")
    blur_x, blur_x_sum = hl.Func("blur_x"), hl.Func("blur_x_sum")
    blur_y_sum[x, y] += kernel_normalized[r.x] * source[x, y + r.x]
    blur_y[x, y] = blur_y_sum[x, y]
    blur_x_sum[x, y] += kernel_normalized[r.x] * blur_y[x + r.x, y]
    blur_x[x, y] = blur_x_sum[x, y]
    stages = dict(kernel=kernel, kernel_sum=kernel_sum, kernel_normalized=kernel_normalized,
                  blur_y=blur_y, blur_y_sum=blur_y_sum, blur_x=blur_x, blur_x_sum=blur_x_sum)
    return blur_x, stages


def _resampling_kernel(factor: int, order: int, x: hl.Var, name: str):
    """`order` boxes of width `factor` convolved (each after the first also with [1 1] / 2), and
    the variance of that kernel. Computed now and embedded as a Buffer when order > 1."""
    r_box = hl.RDom([(0, factor)])
    box = hl.Func(f"{name}_box")
    box[x] = hl.select((x >= 0) & (x < factor), hl.f32(1.0 / factor), hl.f32(0.0))
    kernel = box
    for i in range(1, order):
        convolved = hl.Func(f"{name}_{i}")
        convolved[x] = hl.sum(kernel[x - r_box.x] * box[r_box.x])
        kernel = convolved
        kernel.compute_root()
        widened = hl.Func(f"{name}_{i}_widened")
        widened[x] = (kernel[x] + kernel[x - 1]) * hl.f32(0.5)
        kernel = widened
        kernel.compute_root()
    if order > 1:
        values = kernel.realize([factor * order])
        kernel = hl.Func(name)
        kernel[x] = values[x]
    variance = np.float32(order * (np.float32(factor * factor) - 1) / 12)
    variance = np.float32(variance + np.float32((order - 1) / 4.0))
    return kernel, float(variance)


def build(method: str = "resample", factor: int = 8, upsample_order: int = 3,
          downsample_order: int = 2, variant: str | None = None) -> App:
    if variant is not None:
        return build(**VARIANTS[variant])
    image = hl.ImageParam(hl.Float(32), 2, "input")
    sigma = hl.Param(hl.Float(32), "sigma")
    trunc = hl.Param(hl.Int(32), "trunc")
    x, y, p = hl.Var("x"), hl.Var("y"), hl.Var("p")

    if method == "direct":
        clamped = hl.BoundaryConditions.repeat_edge(image)
        blurred, stages = _direct_gaussian_blur(clamped, sigma, trunc, x, y)
        del stages["blur_x"]  # the output itself
        return App("gaussian_blur_direct", [blurred], [image, sigma, trunc], stages)

    up_kernel, up_variance = _resampling_kernel(factor, upsample_order, x, "up_kernel")
    down_kernel, down_variance = _resampling_kernel(factor, downsample_order, x, "down_kernel")

    clamped_y = hl.Func("clamped_y")
    clamped_y[x, y] = image[x, hl.clamp(y, image.dim(1).min(), image.dim(1).max())]
    rf = hl.RDom([(0, factor)], "rf")
    rp = hl.RDom([(0, downsample_order)], "rp")
    rx = hl.RDom([(0, factor * downsample_order)], "rx")
    shift = int((upsample_order - downsample_order) * factor / 2)  # C++ int division

    # Downsampling in y as `downsample_order` phases: each input row is read once for all
    # the taps it contributes to.
    down_y_phases = hl.Func("down_y_phases")
    down_y_phases[x, y, p] += (clamped_y[x, factor * y + rf.x + shift]
                               * down_kernel[rf.x + p * factor])
    down_y = hl.Func("down_y")
    down_y[x, y] += down_y_phases[x, y + rp.x, rp.x]
    clamped_x = hl.Func("clamped_x")
    clamped_x[x, y] = down_y[hl.clamp(hl.likely(x), image.dim(0).min(), image.dim(0).max()), y]
    down_x = hl.Func("down_x")
    down_x[x, y] += clamped_x[factor * x + rx.x + shift, y] * down_kernel[rx.x]

    # The blur left to do at low resolution, the resampling having blurred already.
    sigma_lo = hl.sqrt(hl.max(sigma * sigma - up_variance - down_variance, hl.f32(1e-4))) / factor
    clamped_y_2 = hl.Func("clamped_y_2")
    clamped_y_2[x, y] = down_x[x, hl.clamp(y, -upsample_order, _div_up(image.height(), factor))]
    blurred, stages = _direct_gaussian_blur(clamped_y_2, sigma_lo, trunc, x, y)

    # Upsampling: a filter of `factor` phases, interleaved, in x then in y.
    e = hl.f32(0.0)
    for i in range(upsample_order):
        e = e + blurred[x - i, y] * (up_kernel[i * factor + p] * factor)
    up_x_phases = hl.Func("up_x_phases")
    up_x_phases[x, y, p] = e
    up_x = hl.Func("up_x")
    up_x[x, y] = up_x_phases[x // factor, y, x % factor]
    e = hl.f32(0.0)
    for i in range(upsample_order):
        e = e + up_x[x, y - i] * (up_kernel[i * factor + p] * factor)
    up_y_phases = hl.Func("up_y_phases")
    up_y_phases[x, y, p] = e
    output = hl.Func("output")
    output[x, y] = up_y_phases[x, y // factor, y % factor]

    stages.update(clamped_y=clamped_y, down_y_phases=down_y_phases, down_y=down_y,
                  clamped_x=clamped_x, down_x=down_x, clamped_y_2=clamped_y_2,
                  up_x_phases=up_x_phases, up_x=up_x, up_y_phases=up_y_phases)
    if upsample_order == 1:
        stages["up_kernel"] = up_kernel
    if downsample_order == 1:
        stages["down_kernel"] = down_kernel
    name = f"gaussian_blur_{upsample_order}_{downsample_order}_{factor}"
    app = App(name, [output], [image, sigma, trunc], stages)
    return app


def _config(app: App) -> dict:
    if app.name == "gaussian_blur_direct":
        return dict(method="direct")
    u, d, f = map(int, app.name.split("_")[2:])
    return dict(method="resample", upsample_order=u, downsample_order=d, factor=f)


def inputs(rng: np.random.Generator, size: str = "small", variant: str = DEFAULT_VARIANT) -> list:
    shape = SMALL_IMAGE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32), SIGMA, TRUNC]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


# numpy reference


def _np_resampling_kernel(factor: int, order: int) -> tuple[np.ndarray, float]:
    box = np.full(factor, 1.0 / factor)
    k = box
    for _ in range(1, order):
        k = np.convolve(k, box)
        k = (np.append(k, 0.0) + np.insert(k, 0, 0.0)) * 0.5
    variance = order * (factor * factor - 1) / 12 + (order - 1) / 4
    return k, variance


def _np_gaussian(sigma: np.float32, trunc: int) -> np.ndarray:
    """The normalised taps at -R..R, R = ceil(trunc * sigma) computed in float32 as Halide does."""
    radius = int(math.ceil(np.float32(trunc) * np.float32(sigma)))
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-(t * t) / (2.0 * float(sigma) * float(sigma)))
    return g / g.sum()


def _np_direct(image: np.ndarray, sigma: float, trunc: int) -> np.ndarray:
    g = _np_gaussian(np.float32(sigma), trunc)
    radius = len(g) // 2
    padded = np.pad(image.astype(np.float64), radius, mode="edge")
    h, w = image.shape
    along_y = sum(wt * padded[i:i + h, :] for i, wt in enumerate(g))
    return sum(wt * along_y[:, i:i + w] for i, wt in enumerate(g))


def _np_resample(image, sigma, trunc, factor, upsample_order, downsample_order) -> np.ndarray:
    f, u, d = factor, upsample_order, downsample_order
    h, w = image.shape
    img = image.astype(np.float64)
    up_k, up_var = _np_resampling_kernel(f, u)
    down_k, down_var = _np_resampling_kernel(f, d)
    shift = int((u - d) * f / 2)
    f32 = np.float32
    sigma_lo = f32(np.sqrt(max(f32(sigma) * f32(sigma) - f32(up_var) - f32(down_var), f32(1e-4)))) / f32(f)
    g = _np_gaussian(sigma_lo, trunc)
    radius = len(g) // 2
    lo_h, lo_w = -(-h // f), -(-w // f)

    taps = np.arange(d * f)
    # Low-resolution rows and columns the blur reads (the upsampling reads u - 1 before).
    ys = np.arange(-(u - 1) - radius, lo_h + radius)
    xs = np.arange(-(u - 1) - radius, lo_w + radius)
    rows = np.clip(ys, -u, -(-h // f))  # clamped_y_2
    in_rows = np.clip(f * rows[:, None] + taps[None, :] + shift, 0, h - 1)
    down_y = np.einsum("rtx,t->rx", img[in_rows], down_k)  # (len(ys), w)
    in_cols = np.clip(f * xs[:, None] + taps[None, :] + shift, 0, w - 1)
    low = np.einsum("rct,t->rc", down_y[:, in_cols], down_k)  # (len(ys), len(xs))

    n_y, n_x = lo_h + u - 1, lo_w + u - 1  # blurred at rows and columns -(u-1) ...
    blur_y = sum(wt * low[i:i + n_y, :] for i, wt in enumerate(g))
    blurred = sum(wt * blur_y[:, i:i + n_x] for i, wt in enumerate(g))

    # blurred[j, i] is low-res pixel (i - (u - 1), j - (u - 1))
    xo = np.arange(w)
    up_x = sum(blurred[:, xo // f - i + (u - 1)] * (up_k[i * f + xo % f] * f) for i in range(u))
    yo = np.arange(h)
    return sum(up_x[yo // f - i + (u - 1), :] * (up_k[i * f + yo % f] * f)[:, None] for i in range(u))


def reference(image: np.ndarray, sigma: float, trunc: int,
              variant: str = DEFAULT_VARIANT) -> list[np.ndarray]:
    config = dict(VARIANTS[variant])
    if config.pop("method") == "direct":
        return [_np_direct(image, sigma, trunc).astype(np.float32)]
    return [_np_resample(image, sigma, trunc, **config).astype(np.float32)]


def tolerance(args, variant: str = DEFAULT_VARIANT) -> float:
    # Values in [0, 1] and every kernel non-negative and normalised, so each partial sum stays
    # in [0, 1]; the direct blur sums 2 (2R + 1) terms, the resampled one 2 d f + 2 (2R + 1)
    # + 2 u terms; the exponentials are off by a few ulps (normalised away, mostly).
    _, sigma, trunc = args
    if VARIANTS[variant]["method"] == "direct":
        terms = 2 * (2 * math.ceil(trunc * sigma) + 1)
    else:
        c = VARIANTS[variant]
        terms = 2 * c["downsample_order"] * c["factor"] + 2 * c["upsample_order"] + 2 * (2 * 3 * trunc + 1)
    return float_tolerance(terms + 16, 1.0)


def _schedule_direct_cpu(s: dict, tiles, rows) -> None:
    # direct_gaussian_blur's: the three kernel Funcs at the root; the sum along y stored per
    # `tiles` and computed per `rows` (loop levels the caller picks), vectorized, its update
    # two taps at a time.
    for name in ("kernel", "kernel_sum", "kernel_normalized"):
        s[name].compute_root()
    vec = vector_width(hl.Float(32))
    f = s["blur_y_sum"]
    x = f.args()[0]
    (r,) = f.rvars(0)
    (f.align_bounds(x, vec).store_at(*tiles).compute_at(*rows)
     .vectorize(x, vec, hl.TailStrategy.RoundUp))
    f.update(0).unroll(r, 2).reorder(x, r).vectorize(x, vec, hl.TailStrategy.RoundUp)


def _schedule_direct_gpu(s: dict) -> None:
    for name in ("kernel", "kernel_sum", "kernel_normalized"):
        s[name].compute_root()
    x, y = s["blur_y"].args()
    xi, yi = hl.Var("xi"), hl.Var("yi")
    s["blur_y"].in_().compute_root().never_partition([x, y]).gpu_tile(x, y, xi, yi, 32, 8)


def schedule_cpu(app: App) -> None:
    (output,), s = app.outputs, app.stages
    config = _config(app)
    vec = vector_width(hl.Float(32))
    x, y = output.args()
    yo, yi = hl.Var("yo"), hl.Var("yi")
    height = output.output_buffer().height()
    if config["method"] == "direct":
        # The original's: the output in 32 parallel strips of rows, vectorized; the blur along
        # y stored per strip and computed per row.
        (output.compute_root().reorder(x, y)
         .split(y, yo, yi, _div_up(height, TASKS), hl.TailStrategy.GuardWithIf)
         .vectorize(x, vec).parallel(yo))
        _schedule_direct_cpu(s, (output, yo), (output, yi))
        return
    factor, u, d = config["factor"], config["upsample_order"], config["downsample_order"]
    # The original's (its two-pass variant): the downsampled image computed whole, in parallel
    # strips of rows, with the y phases in a rolling buffer of d rows and the x pass an
    # atomic vector reduction; then the output in 32 parallel strips, the low-resolution blur
    # and the x upsampling computed a row at a time within them.
    down_x_in = s["down_x"].in_()
    dx, dy = down_x_in.args()
    strip = _div_up(_div_up(height, factor) + u, TASKS)
    (down_x_in.compute_root().split(dy, yo, yi, strip, hl.TailStrategy.GuardWithIf)
     .vectorize(dx, vec * 2, hl.TailStrategy.RoundUp).parallel(yo))
    s["clamped_x"].compute_at(down_x_in, dx).vectorize(s["clamped_x"].args()[0], vec)
    down_x = s["down_x"]
    (rx,) = down_x.rvars(0)
    rxo, rxi = hl.RVar("rxo"), hl.RVar("rxi")
    down_x.compute_at(down_x_in, dx).vectorize(down_x.args()[0])
    (down_x.update(0).split(rx, rxo, rxi, factor).unroll(rxo).vectorize(down_x.args()[0])
     .atomic().vectorize(rxi))
    s["down_y"].update(0).unroll(s["down_y"].rvars(0)[0])
    phases = s["down_y_phases"]
    px, py, pp = phases.args()
    phases_in = phases.in_()
    (phases_in.store_at(down_x_in, yo).compute_at(down_x_in, yi).reorder(pp, px, py).unroll(pp)
     .vectorize(px, vec, hl.TailStrategy.RoundUp).fold_storage(py, d))
    (rf,) = phases.rvars(0)
    phases.compute_at(phases_in, px).unroll(pp).vectorize(px)
    phases.update(0).reorder(pp, px, rf, py).vectorize(px).unroll(rf).unroll(pp)

    blurred = s["blur_x"]
    up_x = s["up_x"]
    ux, uy = up_x.args()
    blurred.store_in(hl.MemoryType.Stack).compute_at(up_x, uy).vectorize(
        blurred.args()[0], vec * 2, hl.TailStrategy.RoundUp)
    _schedule_direct_cpu(s, (up_x, uy), (up_x, uy))
    (up_x.store_at(output, yo).compute_at(output, yi).align_bounds(ux, vec * factor)
     .vectorize(ux, vec * factor, hl.TailStrategy.RoundUp))
    rows_at_a_time = min(factor, 8)
    slice_ = _div_up(_div_up(height, TASKS), rows_at_a_time) * rows_at_a_time
    (output.never_partition([y]).align_bounds(y, rows_at_a_time)
     .split(y, yo, yi, slice_, hl.TailStrategy.ShiftInwards).reorder(yi, x)
     .unroll(yi, rows_at_a_time).reorder(x, yi).vectorize(x, vec * 2).parallel(yo))
    _output_constraints(output)


def _output_constraints(output: hl.Func) -> None:
    # The original promises rows starting at 0, x starting at 0 and a row stride that is a
    # multiple of 16 floats; it also promises 64-byte aligned buffers, which numpy arrays
    # do not keep (left out).
    buf = output.output_buffer()
    buf.dim(1).set_min(0)
    buf.dim(1).set_stride((buf.dim(1).stride() // 16) * 16)
    buf.dim(0).set_min(0)


def schedule_gpu(app: App) -> None:
    (output,), s = app.outputs, app.stages
    config = _config(app)
    x, y = output.args()
    xi, yi, xii, yii = hl.Var("xi"), hl.Var("yi"), hl.Var("xii"), hl.Var("yii")
    _schedule_direct_gpu(s)
    if config["method"] == "direct":
        # The original's: the output and the blur along y each in 32 x 8 blocks.
        output.compute_root().never_partition([x, y]).gpu_tile(x, y, xi, yi, 32, 8)
        return
    factor = config["factor"]
    # The original's: blocks of 32 x 2 factor x factor output pixels, each thread a factor x
    # factor patch, vectorized along x; the low-resolution blur and the downsampled image
    # computed whole in rows of 32 threads, the y downsampling per block of the latter.
    (output.compute_root().never_partition([x, y]).align_bounds(x, factor).align_bounds(y, factor)
     .gpu_tile(x, y, xi, yi, 32 * factor, 2 * factor, hl.TailStrategy.GuardWithIf)
     .tile(xi, yi, xi, yi, xii, yii, factor, factor).unroll(yii).vectorize(xii))
    for name in ("blur_x", "down_x"):
        w = s[name].in_()
        wx, wy = w.args()
        w.compute_root().never_partition([wx, wy]).gpu_tile(wx, wy, xi, yi, 32, 1)
    down_x_in = s["down_x"].in_()
    down_y_in = s["down_y"].in_()
    dx, dy = down_y_in.args()
    (down_y_in.compute_at(down_x_in, down_x_in.args()[0])
     .split(dx, dx, xi, 32, hl.TailStrategy.GuardWithIf).gpu_threads(xi, dy))
    s["down_y_phases"].update(0).unroll(s["down_y_phases"].rvars(0)[0])
    s["down_y"].update(0).unroll(s["down_y"].rvars(0)[0])
    s["down_x"].update(0).unroll(s["down_x"].rvars(0)[0])
    _output_constraints(output)


def variant(name: str) -> types.SimpleNamespace:
    """The module's interface for one of VARIANTS, with the same names as a module's."""
    return types.SimpleNamespace(
        name=name, VARIANTS=VARIANTS, BENCH_SIZE=BENCH_SIZE, UNSCHEDULED=UNSCHEDULED_OF[name],
        build=functools.partial(build, variant=name),
        inputs=functools.partial(inputs, variant=name),
        output_shapes=output_shapes,
        reference=functools.partial(reference, variant=name),
        tolerance=functools.partial(tolerance, variant=name),
        schedule_cpu=schedule_cpu, schedule_gpu=schedule_gpu)
