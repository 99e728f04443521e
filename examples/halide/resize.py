"""Separable image resampling by an arbitrary float factor (Halide's resize app,
apps/resize/resize_generator.cpp): every output pixel is a weighted sum of input pixels along
x, then along y (or y first when downsampling), the weights being a box, linear (tent), cubic
(Keys, a = -0.5) or Lanczos-3 kernel sampled at the pixel's source position and normalised to
sum to one. When downsampling the kernel is widened by 1 / scale_factor (a low-pass filter),
so the number of taps, the length of the reduction domain, depends on the float Param
scale_factor; the first tap is clamped so that every tap lies inside the input.

The generator's GeneratorParams (interpolation_type, upsample) and the input type are
arguments of `build`; VARIANTS names the three variants ported here (cubic downsampling of
uint8, Lanczos upsampling of float32, linear downsampling of float32), and `variant(name)`
gives the module's interface bound to one of them. Arguments: input of numpy shape (3, H, W)
(planar RGB), scale_factor (float32, 0.5 or 4.0 as in the app's test); the output has the
input's type and shape (3, int(H * scale_factor), int(W * scale_factor)), as resize.cpp makes
it. Float outputs are clamped to [0, 1], integer ones saturate. The original has no GPU
schedule, so there is no schedule_gpu here."""

from __future__ import annotations

import functools
import math
import types

import halide as hl
import numpy as np

from examples.halide.common import App, float_tolerance, vector_width

TYPES = {"uint8": hl.UInt(8), "uint16": hl.UInt(16), "float32": hl.Float(32)}
NUMPY_TYPES = {"uint8": np.uint8, "uint16": np.uint16, "float32": np.float32}

# name -> (interpolation, input type, upsample): the variants of the app's build ported here
VARIANTS = {
    "cubic_uint8_down": ("cubic", "uint8", False),
    "lanczos_float32_up": ("lanczos", "float32", True),
    "linear_float32_down": ("linear", "float32", False),
}
DEFAULT_VARIANT = "cubic_uint8_down"

# The app's test: downsample rgb.png (1536 x 2560) by 0.5; upsample rgb_small.png
# (192 x 320) by 4.
BENCH_SIZE = {False: (3, 2560, 1536), True: (3, 320, 192)}
# Small inputs (prime extents): the CPU schedule tiles the output in 32 x 8 tiles when
# downsampling and 16 x 64 when upsampling, and the output must hold a whole tile.
SMALL_SIZE = {False: (3, 37, 83), True: (3, 17, 13)}
SCALE = {False: 0.5, True: 4.0}


# The interpolation kernels, as Halide expressions of a float32 offset t (in input pixels,
# scaled), with the number of taps each spans at scale 1.

def _box(t):
    return hl.select(hl.abs(t) <= hl.f32(0.5), hl.f32(1.0), hl.f32(0.0))


def _linear(t):
    a = hl.abs(t)
    return hl.select(a < hl.f32(1.0), hl.f32(1.0) - a, hl.f32(0.0))


def _cubic(t):
    a = hl.abs(t)
    a2 = a * a
    a3 = a2 * a
    s = -0.5  # the cubic's free parameter; the coefficients are folded in float32 as in C++
    inner = hl.f32(s + 2.0) * a3 - hl.f32(s + 3.0) * a2 + 1
    outer = hl.f32(s) * a3 - hl.f32(5 * s) * a2 + hl.f32(8 * s) * a - hl.f32(4.0 * s)
    return hl.select(a < hl.f32(1.0), inner, hl.select(a < hl.f32(2.0), outer, hl.f32(0.0)))


def _sinc(t):
    t = t * hl.f32(3.14159265359)
    return hl.sin(t) / t


def _lanczos(t):
    value = _sinc(t) * _sinc(t / 3)
    value = hl.select(t == hl.f32(0.0), hl.f32(1.0), value)  # the removable singularity
    return hl.select((t > 3) | (t < -3), hl.f32(0.0), value)


KERNELS = {"box": (1, _box), "linear": (2, _linear), "cubic": (4, _cubic), "lanczos": (6, _lanczos)}


def build(interpolation: str = "cubic", input_type: str = "uint8", upsample: bool = False,
          variant: str | None = None) -> App:
    if variant is not None:
        interpolation, input_type, upsample = VARIANTS[variant]
    taps, kernel = KERNELS[interpolation]
    image = hl.ImageParam(TYPES[input_type], 3, "input")
    scale_factor = hl.Param(hl.Float(32), "scale_factor")
    x, y, c, k = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("k")

    as_float = hl.Func("as_float")
    as_float[x, y, c] = hl.f32(image[x, y, c])

    # The reciprocal of the factor, once and strictly, so that one ratio is used everywhere.
    inverse_scale_factor = hl.strict_float(hl.f32(1.0) / scale_factor)
    kernel_scaling = hl.f32(1.0) if upsample else scale_factor
    inverse_kernel_scaling = hl.f32(1.0) if upsample else inverse_scale_factor
    kernel_radius = hl.f32(0.5 * taps) * inverse_kernel_scaling
    kernel_taps = hl.i32(hl.ceil(hl.f32(taps) * inverse_kernel_scaling))

    # Where each output pixel's centre lies in the input (a float coordinate).
    source_x = (x + hl.f32(0.5)) * inverse_scale_factor - hl.f32(0.5)
    source_y = (y + hl.f32(0.5)) * inverse_scale_factor - hl.f32(0.5)
    begin_x = hl.i32(hl.strict_float(hl.ceil(source_x - kernel_radius)))
    begin_y = hl.i32(hl.strict_float(hl.ceil(source_y - kernel_radius)))
    begin_x = hl.clamp(begin_x, image.dim(0).min(), image.dim(0).max() + 1 - kernel_taps)
    begin_y = hl.clamp(begin_y, image.dim(1).min(), image.dim(1).max() + 1 - kernel_taps)

    r = hl.RDom([(0, kernel_taps)])
    unnormalized_kernel_x = hl.Func("unnormalized_kernel_x")
    unnormalized_kernel_y = hl.Func("unnormalized_kernel_y")
    unnormalized_kernel_x[x, k] = kernel((k + begin_x - source_x) * kernel_scaling)
    unnormalized_kernel_y[y, k] = kernel((k + begin_y - source_y) * kernel_scaling)
    kernel_sum_x, kernel_sum_y = hl.Func("kernel_sum_x"), hl.Func("kernel_sum_y")
    kernel_sum_x[x] = hl.sum(unnormalized_kernel_x[x, r.x], "kernel_sum_x")
    kernel_sum_y[y] = hl.sum(unnormalized_kernel_y[y, r.x], "kernel_sum_y")
    kernel_x, kernel_y = hl.Func("kernel_x"), hl.Func("kernel_y")
    kernel_x[x, k] = unnormalized_kernel_x[x, k] / kernel_sum_x[x]
    kernel_y[y, k] = unnormalized_kernel_y[y, k] / kernel_sum_y[y]

    # Separable: along x first when upsampling, along y first when downsampling.
    resized_x, resized_y = hl.Func("resized_x"), hl.Func("resized_y")
    if upsample:
        resized_x[x, y, c] = hl.sum(kernel_x[x, r.x] * as_float[r.x + begin_x, y, c], "resized_x")
        resized_y[x, y, c] = hl.sum(kernel_y[y, r.x] * resized_x[x, r.x + begin_y, c], "resized_y")
        resized = resized_y
    else:
        resized_y[x, y, c] = hl.sum(kernel_y[y, r.x] * as_float[x, r.x + begin_y, c], "resized_y")
        resized_x[x, y, c] = hl.sum(kernel_x[x, r.x] * resized_y[r.x + begin_x, y, c], "resized_x")
        resized = resized_x

    output = hl.Func("output")
    if image.type().is_float():
        output[x, y, c] = hl.clamp(resized[x, y, c], hl.f32(0.0), hl.f32(1.0))
    else:
        output[x, y, c] = hl.saturating_cast(image.type(), resized[x, y, c])

    stages = dict(as_float=as_float, unnormalized_kernel_x=unnormalized_kernel_x,
                  unnormalized_kernel_y=unnormalized_kernel_y, kernel_sum_x=kernel_sum_x,
                  kernel_sum_y=kernel_sum_y, kernel_x=kernel_x, kernel_y=kernel_y,
                  resized_x=resized_x, resized_y=resized_y)
    name = f"resize_{interpolation}_{input_type}_{'up' if upsample else 'down'}"
    app = App(name, [output], [image, scale_factor], stages)
    return app


def _upsample_of(app: App) -> bool:
    return app.name.endswith("_up")


def inputs(rng: np.random.Generator, size: str = "small", variant: str = DEFAULT_VARIANT) -> list:
    _, input_type, upsample = VARIANTS[variant]
    shape = SMALL_SIZE[upsample] if size == "small" else BENCH_SIZE[upsample]
    if input_type == "float32":
        image = rng.random(shape, dtype=np.float32)
    else:
        image = rng.integers(0, np.iinfo(NUMPY_TYPES[input_type]).max + 1, size=shape,
                             dtype=NUMPY_TYPES[input_type])
    return [image, SCALE[upsample]]


def output_shapes(args) -> list[tuple]:
    image, scale = args
    c, h, w = image.shape
    # resize.cpp: int(width * scale_factor), the product in float32
    return [(c, int(np.float32(h) * np.float32(scale)), int(np.float32(w) * np.float32(scale)))]


# numpy reference: the weights of each output row or column as a dense (out, in) matrix.

def _np_kernel(interpolation: str, t: np.ndarray) -> np.ndarray:
    a = np.abs(t)
    if interpolation == "box":
        return np.where(a <= 0.5, 1.0, 0.0)
    if interpolation == "linear":
        return np.where(a < 1.0, 1.0 - a, 0.0)
    if interpolation == "cubic":
        s = -0.5
        inner = (s + 2) * a ** 3 - (s + 3) * a ** 2 + 1
        outer = s * a ** 3 - 5 * s * a ** 2 + 8 * s * a - 4 * s
        return np.where(a < 1.0, inner, np.where(a < 2.0, outer, 0.0))
    # Lanczos-3: sinc(t) sinc(t / 3) on |t| <= 3, 1 at 0
    with np.errstate(invalid="ignore", divide="ignore"):
        pt = np.pi * t
        value = np.sin(pt) / pt * (np.sin(pt / 3) / (pt / 3))
    value = np.where(t == 0, 1.0, value)
    return np.where(np.abs(t) > 3, 0.0, value)


def _weights(interpolation: str, n_out: int, n_in: int, scale: float, upsample: bool) -> np.ndarray:
    taps = KERNELS[interpolation][0]
    f32 = np.float32
    inverse = f32(1.0) / f32(scale)
    kernel_scaling = 1.0 if upsample else float(scale)
    inverse_kernel_scaling = f32(1.0) if upsample else inverse
    radius = f32(0.5 * taps) * inverse_kernel_scaling
    n_taps = int(math.ceil(f32(taps) * inverse_kernel_scaling))
    # The source positions and first taps in float32, as Halide computes them (strictly).
    source = (np.arange(n_out, dtype=np.float32) + f32(0.5)) * inverse - f32(0.5)
    begin = np.ceil(source - radius).astype(np.int64)
    begin = np.clip(begin, 0, n_in - n_taps)
    k = np.arange(n_taps)
    offsets = (k[None, :] + begin[:, None]) - source[:, None].astype(np.float64)
    w = _np_kernel(interpolation, offsets * kernel_scaling)
    w /= w.sum(axis=1, keepdims=True)
    dense = np.zeros((n_out, n_in))
    np.add.at(dense, (np.repeat(np.arange(n_out), n_taps), (begin[:, None] + k).ravel()), w.ravel())
    return dense


def reference(image: np.ndarray, scale_factor: float, variant: str = DEFAULT_VARIANT) -> list[np.ndarray]:
    interpolation, input_type, upsample = VARIANTS[variant]
    assert image.dtype == NUMPY_TYPES[input_type]
    (_, h_out, w_out), = output_shapes([image, scale_factor])
    _, h, w = image.shape
    wx = _weights(interpolation, w_out, w, scale_factor, upsample)
    wy = _weights(interpolation, h_out, h, scale_factor, upsample)
    resized = np.einsum("yi,cij,xj->cyx", wy, image.astype(np.float64), wx)
    if input_type == "float32":
        return [np.clip(resized, 0.0, 1.0).astype(np.float32)]
    top = np.iinfo(NUMPY_TYPES[input_type]).max
    return [np.clip(resized, 0, top).astype(NUMPY_TYPES[input_type])]  # saturate, truncate


def tolerance(args, variant: str = DEFAULT_VARIANT) -> float:
    interpolation, input_type, upsample = VARIANTS[variant]
    if input_type != "float32":
        # The float sum is truncated to an integer: a sum an ulp away from an integer (Halide
        # reassociates and fuses float operations) may land on the other side of it.
        return 1
    # Values in [0, 1]; each pass sums at most 12 weighted terms whose weights' magnitudes
    # sum to at most 1.3 (Lanczos' negative lobes), the weights themselves off by a few ulps
    # (sin, the normalisation).
    return float_tolerance(64, 2.0)


def schedule_cpu(app: App) -> None:
    # The original's: the x kernel's weights over their whole domain, the y kernel's per row
    # of output tiles; tiles of 32 x 8 outputs (16 x 64 when upsampling) in parallel rows,
    # vectorized, the first pass computed per tile row (per tile when upsampling), the second
    # per output vector. The original also allows any layout of the buffers with
    # specialisations for planar, packed RGB and packed RGBA; kept here.
    (output,), s = app.outputs, app.stages
    vec = vector_width(hl.Float(32))
    x, y, c = output.args()
    xi, yi = hl.Var("xi"), hl.Var("yi")
    ukx, kx = s["unnormalized_kernel_x"], s["kernel_x"]
    ukx.compute_at(kx, kx.args()[0]).store_in(hl.MemoryType.Stack).vectorize(ukx.args()[0])
    s["kernel_sum_x"].compute_at(kx, kx.args()[0]).vectorize(s["kernel_sum_x"].args()[0])
    kx.compute_root().reorder(kx.args()[1], kx.args()[0]).vectorize(kx.args()[0], vec)
    uky, ky = s["unnormalized_kernel_y"], s["kernel_y"]
    uky.compute_at(ky, ky.args()[0]).vectorize(uky.args()[0], vec)
    s["kernel_sum_y"].compute_at(ky, ky.args()[0]).vectorize(s["kernel_sum_y"].args()[0])
    ky.compute_at(output, y).reorder(ky.args()[1], ky.args()[0]).vectorize(ky.args()[0], vec)
    if _upsample_of(app):
        output.tile(x, y, xi, yi, 16, 64).parallel(y).vectorize(xi)
        rx = s["resized_x"]
        rx.compute_at(output, x).hoist_storage(output, y).vectorize(rx.args()[0])
        ry = s["resized_y"]
        ry.compute_at(output, xi).unroll(ry.args()[2])
    else:
        output.tile(x, y, xi, yi, 32, 8).parallel(y).vectorize(xi)
        ry = s["resized_y"]
        ry.compute_at(output, y).vectorize(ry.args()[0], vec)
        rx = s["resized_x"]
        rx.compute_at(output, xi).unroll(rx.args()[2])

    out_buf, in_buf = output.output_buffer(), app.params[0]
    out_buf.dim(0).set_stride(hl.Expr())
    in_buf.dim(0).set_stride(hl.Expr())
    planar = (out_buf.dim(0).stride() == 1) & (in_buf.dim(0).stride() == 1)

    def packed(channels):
        return ((out_buf.dim(0).stride() == channels) & (out_buf.dim(2).stride() == 1)
                & (out_buf.dim(2).min() == 0) & (out_buf.dim(2).extent() == channels)
                & (in_buf.dim(0).stride() == channels) & (in_buf.dim(2).stride() == 1)
                & (in_buf.dim(2).min() == 0) & (in_buf.dim(2).extent() == channels))

    output.specialize(planar)
    for channels in (3, 4):
        output.specialize(packed(channels)).reorder(c, xi, yi, x, y).unroll(c)


def variant(name: str) -> types.SimpleNamespace:
    """The module's interface for one of VARIANTS, with the same names as a module's."""
    return types.SimpleNamespace(
        name=name, VARIANTS=VARIANTS, BENCH_SIZE=BENCH_SIZE,
        build=functools.partial(build, variant=name),
        inputs=functools.partial(inputs, variant=name),
        output_shapes=output_shapes,
        reference=functools.partial(reference, variant=name),
        tolerance=functools.partial(tolerance, variant=name),
        schedule_cpu=schedule_cpu)
