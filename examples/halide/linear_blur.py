"""A 3x3 box blur done in linear light (Halide's linear_blur app, apps/linear_blur/): the sRGB
input is converted to linear values (srgb_to_linear_generator.cpp), blurred by a box of three
pixels along x and then along y with the edges repeated (simple_blur_generator.cpp; the window
is x .. x + 2, y .. y + 2, as there), and converted back to sRGB (linear_to_srgb_generator.cpp);
linear_blur_generator.cpp composes the three. The components are written, as in the original,
over an implicit third dimension (`_`), so any number of channels goes through.

Input and output float32 of numpy shape (C, H, W) (planar, c outermost), values in [0, 1].
No departure from the original's algorithm.

Schedules: the composite generator has no manual schedule (it asserts that an autoscheduler
is used), and none of the four files has a GPU schedule, so there is no schedule_gpu here.
schedule_cpu applies the three components' own manual CPU schedules, with each component's
output computed at the root, as when each runs as a generator of its own."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import SMALL_IMAGE, App, float_tolerance

BENCH_SIZE = (3, 2560, 1536)  # the generators' estimates: 1536 x 2560 (4 channels there)
SMALL_SIZE = (3, *SMALL_IMAGE)

_F = np.float32
# The C++ float constant expressions, in float32 as the compiler folds them.
_ONE_PLUS_055 = float(_F(1.0) + _F(0.055))
_INV_GAMMA = float(_F(1.0) / _F(2.4))


def _srgb_to_linear(srgb: hl.Func) -> hl.Func:
    x, y = hl.Var("x"), hl.Var("y")
    _ = hl._
    linear = hl.Func("linear")
    linear[x, y, _] = hl.select(srgb[x, y, _] <= hl.f32(0.04045),
                                srgb[x, y, _] / hl.f32(12.92),
                                hl.pow((srgb[x, y, _] + hl.f32(0.055)) / hl.f32(_ONE_PLUS_055), hl.f32(2.4)))
    return linear


def _simple_blur(inp: hl.Func, width, height) -> tuple[hl.Func, hl.Func]:
    x, y = hl.Var("x"), hl.Var("y")
    _ = hl._
    edge = hl.BoundaryConditions.repeat_edge(inp, [hl.Range(0, width), hl.Range(0, height)])
    blur_x = hl.Func("blur_x")
    blur_x[x, y, _] = (edge[x, y, _] + edge[x + 1, y, _] + edge[x + 2, y, _]) / 3
    blurred = hl.Func("blurred")
    blurred[x, y, _] = (blur_x[x, y, _] + blur_x[x, y + 1, _] + blur_x[x, y + 2, _]) / 3
    return blurred, blur_x


def _linear_to_srgb(linear: hl.Func) -> hl.Func:
    x, y = hl.Var("x"), hl.Var("y")
    _ = hl._
    srgb = hl.Func("srgb")
    srgb[x, y, _] = hl.select(linear[x, y, _] <= hl.f32(0.0031308),
                              linear[x, y, _] * hl.f32(12.92),
                              hl.f32(_ONE_PLUS_055) * hl.pow(linear[x, y, _], hl.f32(_INV_GAMMA))
                              - hl.f32(0.055))
    return srgb


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    linear = _srgb_to_linear(hl.Func(image))
    blurred, blur_x = _simple_blur(linear, image.width(), image.height())
    srgb = _linear_to_srgb(blurred)
    output = hl.Func("output")
    output[x, y, c] = srgb[x, y, c]
    stages = dict(linear=linear, blur_x=blur_x, blurred=blurred, srgb=srgb)
    return App("linear_blur", [output], [image], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def _to_linear(s):
    return np.where(s <= 0.04045, s / 12.92, ((s + 0.055) / 1.055) ** 2.4)


def _to_srgb(v):
    return np.where(v <= 0.0031308, v * 12.92, 1.055 * v ** (1 / 2.4) - 0.055)


def reference(image: np.ndarray) -> list[np.ndarray]:
    lin = _to_linear(image.astype(np.float64))
    _, h, w = image.shape
    cols = np.clip(np.arange(w)[:, None] + np.arange(3), 0, w - 1)  # (W, 3): x .. x + 2, clamped
    blur_x = lin[:, :, cols].sum(axis=-1) / 3
    rows = np.clip(np.arange(h)[:, None] + np.arange(3), 0, h - 1)
    blurred = blur_x[:, rows, :].sum(axis=2) / 3
    return [_to_srgb(blurred).astype(np.float32)]


def tolerance(args) -> float:
    # The linear values (powf, one division) are within a few ulp of 1; the two box sums add
    # 6 roundings; the conversion back has slope at most 12.92, and pow's own rounding: about
    # 16 ulp of 13 in all. At the threshold 0.0031308 the two branches of the conversion back
    # are apart by 2.7e-5: an input whose blur falls within rounding of it may take the other
    # branch.
    t = 0.0031308
    jump = abs(t * 12.92 - (1.055 * t ** (1 / 2.4) - 0.055))
    return float_tolerance(16, 13.0) + jump


def schedule_cpu(app: App) -> None:
    # The components' manual schedules: each output in parallel strips of 8 rows, vectorized
    # 8 wide along x; the blur's horizontal pass computed a row at a time within a strip.
    (output,), s = app.outputs, app.stages
    yi = hl.Var("yi")
    for name in ("linear", "blurred", "srgb"):
        f = s[name]
        fx, fy = f.args()[:2]
        f.compute_root().split(fy, fy, yi, 8).parallel(fy).vectorize(fx, 8)
    blurred, blur_x = s["blurred"], s["blur_x"]
    blur_x.store_at(blurred, blurred.args()[1]).compute_at(blurred, yi).vectorize(blur_x.args()[0], 8)
