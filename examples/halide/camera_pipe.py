"""A raw camera pipeline (Halide's camera_pipe app, apps/camera_pipe/camera_pipe_generator.cpp):
from a 10-bit Bayer mosaic to an 8-bit sharpened RGB image.

Stages, as the generator writes them:
  - the raw image is read shifted by (16, 12), so that no boundary condition is needed (the
    input must be larger than the output, see inputs);
  - hot pixel suppression: each pixel clamped to the maximum of its four same-colour
    neighbours two pixels away;
  - deinterleave: the 2x2 Bayer cell (G R / B G) becomes four half-resolution channels (a mux);
  - demosaic (the Demosaic sub-generator): green at red and blue sites interpolated along the
    direction of the smaller difference, red and blue at green sites corrected by green's
    second derivative, red at blue and blue at red along the diagonal of the smaller
    difference; the half-resolution planes are interleaved back (selects on x % 2, y % 2)
    and the uint16 arithmetic, which may wrap, is reinterpreted as int16;
  - colour correction by a 3x4 matrix interpolated between two calibrated ones by inverse
    colour temperature, in Q8.8 fixed point (a Func `matrix` of int16);
  - a tone curve (black and white levels, gamma, a quadratic contrast curve) as a 1024-entry
    uint8 lookup table indexed by the clamped corrected value;
  - sharpening: an unsharp mask of [1 2 1] blurs along y then x (rounding averages of uint8),
    weighted by the strength in 2.5 fixed point (a zero-dimensional Func).

Arguments, in Halide's order (buffers, then scalars by name): input (uint16 numpy (H_in,
W_in)), matrix_3200, matrix_7000 (float32 numpy (3, 4): row = output channel, the fourth
column the offset), blackLevel, color_temp, contrast, gamma, sharpen_strength, whiteLevel.
Output uint8 numpy (3, H, W). result_type (a GeneratorParam) is uint8, its default.

Departures from the original, none of them in what is computed: the tone curve is the
generator's for every target but Hexagon (whose variant samples a 128-entry table, lutResample
8); the compute_root() / gpu_single_thread() / gpu_tile() the generator puts on `matrix`,
`curve` and `sharpen_strength_x32` inside the algorithm are schedule, so they are applied by
schedule_cpu / schedule_gpu here; the HalideTraceViz tags are dropped."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import App, vector_width

# The matrices of the Nokia N900's sensor, from FCam, as process.cpp passes them.
MATRIX_3200 = np.array([[1.6697, -0.2693, -0.4004, -42.4346],
                        [-0.3576, 1.0615, 1.5949, -37.1158],
                        [-0.2175, -1.8751, 6.9640, -26.6970]], dtype=np.float32)
MATRIX_7000 = np.array([[2.2997, -0.4478, 0.1706, -39.0923],
                        [-0.3826, 1.5906, -0.2080, -25.4311],
                        [-0.0888, -0.7344, 2.2832, -20.0826]], dtype=np.float32)
# The app's test run: process raw.png 3700 2.0 50 1.0; black 25, white 1023. (At these
# values every float quantity that is truncated, the Q8.8 matrix and the curve's rounding,
# lies at least 3e-3 from an integer, so no evaluation order changes a result.)
DEFAULT_PARAMS = dict(blackLevel=25, color_temp=3700.0, contrast=50.0, gamma=2.0,
                      sharpen_strength=1.0, whiteLevel=1023)

# The output is the input less 32 columns and 24 rows, rounded down to whole strips of 32, as
# process.cpp sizes it (the CPU schedule also needs the width a multiple of 2 vectors of uint16).
BENCH_INPUT = (1968, 2592)  # (H, W): the generator's estimates; a 2560 x 1920 output
SMALL_INPUT = (56, 160)  # a 128 x 32 output
UNSCHEDULED = "slow"  # everything inlined, the demosaic recomputes its neighbours many times

_F = np.float32


def _out_shape(h_in: int, w_in: int) -> tuple[int, int]:
    return ((h_in - 24) // 32) * 32, ((w_in - 32) // 32) * 32


def _avg(a, b):
    """The mean of two unsigned values rounded up, computed in the type twice as wide."""
    a = a if isinstance(a, hl.Expr) else hl.Expr(a)  # a FuncRef has no type
    wider = a.type().with_bits(a.type().bits() * 2)
    return hl.cast(a.type(), (hl.cast(wider, a) + b + 1) / 2)


def _blur121(a, b, c):
    return _avg(_avg(a, c), b)


def _interleave_x(a, b, x, y, name):
    out = hl.Func(name)
    out[x, y] = hl.select((x % 2) == 0, a[x / 2, y], b[x / 2, y])
    return out


def _interleave_y(a, b, x, y, name):
    out = hl.Func(name)
    out[x, y] = hl.select((y % 2) == 0, a[x, y / 2], b[x, y / 2])
    return out


def _demosaic(deinterleaved, x, y, c):
    """The Demosaic generator: returns its output (int16, 3 channels) and its two intermediate
    stencils (green at red and at blue sites), which its schedule handles."""
    g_gr, r_r, b_b, g_gb = (hl.Func(n) for n in ("g_gr", "r_r", "b_b", "g_gb"))
    g_gr[x, y] = deinterleaved[x, y, 0]
    r_r[x, y] = deinterleaved[x, y, 1]
    b_b[x, y] = deinterleaved[x, y, 2]
    g_gb[x, y] = deinterleaved[x, y, 3]

    # green at red sites and at blue sites: the direction with the smaller difference
    g_r = hl.Func("g_r")
    gv_r = _avg(g_gb[x, y - 1], g_gb[x, y])
    gvd_r = hl.absd(g_gb[x, y - 1], g_gb[x, y])
    gh_r = _avg(g_gr[x + 1, y], g_gr[x, y])
    ghd_r = hl.absd(g_gr[x + 1, y], g_gr[x, y])
    g_r[x, y] = hl.select(ghd_r < gvd_r, gh_r, gv_r)

    g_b = hl.Func("g_b")
    gv_b = _avg(g_gr[x, y + 1], g_gr[x, y])
    gvd_b = hl.absd(g_gr[x, y + 1], g_gr[x, y])
    gh_b = _avg(g_gb[x - 1, y], g_gb[x, y])
    ghd_b = hl.absd(g_gb[x - 1, y], g_gb[x, y])
    g_b[x, y] = hl.select(ghd_b < gvd_b, gh_b, gv_b)

    # red and blue at green sites, corrected by green's error at the same place
    r_gr, b_gr, r_gb, b_gb = (hl.Func(n) for n in ("r_gr", "b_gr", "r_gb", "b_gb"))
    correction = g_gr[x, y] - _avg(g_r[x, y], g_r[x - 1, y])
    r_gr[x, y] = correction + _avg(r_r[x - 1, y], r_r[x, y])
    correction = g_gr[x, y] - _avg(g_b[x, y], g_b[x, y - 1])
    b_gr[x, y] = correction + _avg(b_b[x, y], b_b[x, y - 1])
    correction = g_gb[x, y] - _avg(g_r[x, y], g_r[x, y + 1])
    r_gb[x, y] = correction + _avg(r_r[x, y], r_r[x, y + 1])
    correction = g_gb[x, y] - _avg(g_b[x, y], g_b[x + 1, y])
    b_gb[x, y] = correction + _avg(b_b[x, y], b_b[x + 1, y])

    # red at blue sites and blue at red sites: the diagonal with the smaller difference
    r_b = hl.Func("r_b")
    correction = g_b[x, y] - _avg(g_r[x, y], g_r[x - 1, y + 1])
    rp_b = correction + _avg(r_r[x, y], r_r[x - 1, y + 1])
    rpd_b = hl.absd(r_r[x, y], r_r[x - 1, y + 1])
    correction = g_b[x, y] - _avg(g_r[x - 1, y], g_r[x, y + 1])
    rn_b = correction + _avg(r_r[x - 1, y], r_r[x, y + 1])
    rnd_b = hl.absd(r_r[x - 1, y], r_r[x, y + 1])
    r_b[x, y] = hl.select(rpd_b < rnd_b, rp_b, rn_b)

    b_r = hl.Func("b_r")
    correction = g_r[x, y] - _avg(g_b[x, y], g_b[x + 1, y - 1])
    bp_r = correction + _avg(b_b[x, y], b_b[x + 1, y - 1])
    bpd_r = hl.absd(b_b[x, y], b_b[x + 1, y - 1])
    correction = g_r[x, y] - _avg(g_b[x + 1, y], g_b[x, y - 1])
    bn_r = correction + _avg(b_b[x + 1, y], b_b[x, y - 1])
    bnd_r = hl.absd(b_b[x + 1, y], b_b[x, y - 1])
    b_r[x, y] = hl.select(bpd_r < bnd_r, bp_r, bn_r)

    def channel(name, top_left, top_right, bottom_left, bottom_right):
        return _interleave_y(_interleave_x(top_left, top_right, x, y, f"{name}_top"),
                             _interleave_x(bottom_left, bottom_right, x, y, f"{name}_bottom"),
                             x, y, name)

    r = channel("r", r_gr, r_r, r_b, r_gb)
    g = channel("g", g_gr, g_r, g_b, g_gb)
    b = channel("b", b_gr, b_r, b_b, b_gb)
    demosaiced = hl.Func("demosaiced")
    demosaiced[x, y, c] = hl.i16(hl.mux(c, [r[x, y], g[x, y], b[x, y]]))
    return demosaiced, g_r, g_b


def build() -> App:
    image = hl.ImageParam(hl.UInt(16), 2, "input")
    matrix_3200 = hl.ImageParam(hl.Float(32), 2, "matrix_3200")
    matrix_7000 = hl.ImageParam(hl.Float(32), 2, "matrix_7000")
    color_temp = hl.Param(hl.Float(32), "color_temp")
    gamma = hl.Param(hl.Float(32), "gamma")
    contrast = hl.Param(hl.Float(32), "contrast")
    sharpen_strength = hl.Param(hl.Float(32), "sharpen_strength")
    black_level = hl.Param(hl.Int(32), "blackLevel")
    white_level = hl.Param(hl.Int(32), "whiteLevel")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")

    shifted = hl.Func("shifted")
    shifted[x, y] = image[x + 16, y + 12]

    # hot pixel suppression
    brightest = hl.max(shifted[x - 2, y], shifted[x + 2, y], shifted[x, y - 2], shifted[x, y + 2])
    denoised = hl.Func("denoised")
    denoised[x, y] = hl.clamp(shifted[x, y], 0, brightest)

    deinterleaved = hl.Func("deinterleaved")
    deinterleaved[x, y, c] = hl.mux(c, [denoised[2 * x, 2 * y], denoised[2 * x + 1, 2 * y],
                                        denoised[2 * x, 2 * y + 1], denoised[2 * x + 1, 2 * y + 1]])

    demosaiced, g_r, g_b = _demosaic(deinterleaved, x, y, c)

    # colour correction
    kelvin = color_temp
    alpha = (1.0 / kelvin - hl.f32(float(_F(1) / _F(3200)))) / hl.f32(
        float(_F(1) / _F(7000) - _F(1) / _F(3200)))
    val = matrix_3200[x, y] * alpha + matrix_7000[x, y] * (1 - alpha)
    matrix = hl.Func("matrix")
    matrix[x, y] = hl.i16(val * hl.f32(256.0))  # Q8.8 fixed point
    ir, ig, ib = (hl.i32(demosaiced[x, y, k]) for k in range(3))
    rgb = [matrix[3, k] + matrix[0, k] * ir + matrix[1, k] * ig + matrix[2, k] * ib for k in range(3)]
    corrected = hl.Func("corrected")
    corrected[x, y, c] = hl.mux(c, [hl.i16(v / 256) for v in rgb])

    # tone curve (lutResample = 1)
    min_raw = 0 + black_level
    max_raw = white_level
    inv_range = 1.0 / (max_raw - min_raw)
    b = 2.0 - hl.pow(hl.f32(2.0), contrast / 100.0)
    a = 2.0 - 2.0 * b
    xf = hl.clamp(hl.f32(x - min_raw) * inv_range, 0.0, 1.0)
    g = hl.pow(xf, 1.0 / gamma)
    z = hl.select(g > 0.5, 1.0 - (a * (1.0 - g) * (1.0 - g) + b * (1.0 - g)), a * g * g + b * g)
    val = hl.u8(hl.clamp(z * 255.0 + 0.5, 0.0, 255.0))
    curve = hl.Func("curve")
    curve[x] = hl.select(x <= min_raw, 0, hl.select(x > max_raw, 255, val))
    curved = hl.Func("curved")
    curved[x, y, c] = curve[hl.clamp(corrected[x, y, c], 0, 1023)]

    # sharpening
    strength_x32 = hl.Func("sharpen_strength_x32")
    strength_x32[()] = hl.u8_sat(sharpen_strength * 32)
    unsharp_y = hl.Func("unsharp_y")
    unsharp_y[x, y, c] = _blur121(curved[x, y - 1, c], curved[x, y, c], curved[x, y + 1, c])
    unsharp = hl.Func("unsharp")
    unsharp[x, y, c] = _blur121(unsharp_y[x - 1, y, c], unsharp_y[x, y, c], unsharp_y[x + 1, y, c])
    mask = hl.Func("mask")
    mask[x, y, c] = hl.i16(curved[x, y, c]) - hl.i16(unsharp[x, y, c])
    sharpened = hl.Func("sharpened")
    sharpened[x, y, c] = hl.u8_sat(curved[x, y, c] + (mask[x, y, c] * strength_x32[()]) / 32)

    processed = hl.Func("processed")
    processed[x, y, c] = sharpened[x, y, c]

    stages = dict(shifted=shifted, denoised=denoised, deinterleaved=deinterleaved,
                  demosaiced=demosaiced, g_r=g_r, g_b=g_b, matrix=matrix, corrected=corrected,
                  curve=curve, curved=curved, sharpen_strength_x32=strength_x32,
                  unsharp_y=unsharp_y, unsharp=unsharp, mask=mask, sharpened=sharpened)
    params = [image, matrix_3200, matrix_7000, black_level, color_temp, contrast, gamma,
              sharpen_strength, white_level]
    return App("camera_pipe", [processed], params, stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    h, w = SMALL_INPUT if size == "small" else BENCH_INPUT
    p = DEFAULT_PARAMS
    raw = rng.integers(0, 1024, size=(h, w), dtype=np.uint16)  # 10 bits
    return [raw, MATRIX_3200.copy(), MATRIX_7000.copy(), p["blackLevel"], p["color_temp"],
            p["contrast"], p["gamma"], p["sharpen_strength"], p["whiteLevel"]]


def output_shapes(args) -> list[tuple]:
    return [(3, *_out_shape(*args[0].shape))]


# The reference: each stage an array over the region its consumers read, with the (x, y) of
# its first element; integers in int64, wrapped where the original's narrow types wrap.


class _Plane:
    def __init__(self, values: np.ndarray, x0: int, y0: int):
        self.v, self.x0, self.y0 = values, x0, y0

    def at(self, region, dx=0, dy=0) -> np.ndarray:
        """Values at (x + dx, y + dy) for (x, y) over region = (x_lo, x_hi, y_lo, y_hi)."""
        xl, xh, yl, yh = region
        i, j = yl + dy - self.y0, xl + dx - self.x0
        assert i >= 0 and j >= 0 and i + yh - yl <= self.v.shape[-2] and j + xh - xl <= self.v.shape[-1]
        return self.v[..., i:i + yh - yl, j:j + xh - xl]


def _wrap(v, bits=16, signed=False):
    v = np.mod(v, 1 << bits)
    return v - (1 << bits) * (v >= (1 << (bits - 1))) if signed else v


def _mean_up(a, b):
    return (a + b + 1) // 2


def reference(raw, matrix_3200, matrix_7000, black_level, color_temp, contrast, gamma,
              sharpen_strength, white_level) -> list[np.ndarray]:
    h, w = _out_shape(*raw.shape)
    hh, hw = h // 2, w // 2
    shifted = _Plane(raw.astype(np.int64), -16, -12)

    full = (-6, w + 6, -6, h + 6)
    brightest = np.maximum.reduce([shifted.at(full, -2, 0), shifted.at(full, 2, 0),
                                   shifted.at(full, 0, -2), shifted.at(full, 0, 2)])
    denoised = np.minimum(np.maximum(shifted.at(full), 0), brightest)

    # the four Bayer channels at half resolution: G R / B G
    half = (-3, hw + 3, -3, hh + 3)
    gr, r, b, gb = (_Plane(denoised[j::2, i::2], -3, -3) for i, j in ((0, 0), (1, 0), (0, 1), (1, 1)))

    def choose(d_first, d_second, first, second):  # the value whose difference is smaller
        return np.where(d_first < d_second, first, second)

    near = (-2, hw + 2, -2, hh + 2)
    g_r = _Plane(choose(np.abs(gr.at(near, 1, 0) - gr.at(near)), np.abs(gb.at(near, 0, -1) - gb.at(near)),
                        _mean_up(gr.at(near, 1, 0), gr.at(near)), _mean_up(gb.at(near, 0, -1), gb.at(near))),
                 -2, -2)
    g_b = _Plane(choose(np.abs(gb.at(near, -1, 0) - gb.at(near)), np.abs(gr.at(near, 0, 1) - gr.at(near)),
                        _mean_up(gb.at(near, -1, 0), gb.at(near)), _mean_up(gr.at(near, 0, 1), gr.at(near))),
                 -2, -2)

    reg = (-1, hw + 1, -1, hh + 1)

    def corrected_by_green(green, green_est, known, at_a, at_b):
        """green + mean(known at the two sites) - mean(green's estimate at them), mod 2^16."""
        return _wrap(green.at(reg) - _mean_up(green_est.at(reg, *at_a), green_est.at(reg, *at_b))
                     + _mean_up(known.at(reg, *at_a), known.at(reg, *at_b)))

    r_gr = corrected_by_green(gr, g_r, r, (0, 0), (-1, 0))
    b_gr = corrected_by_green(gr, g_b, b, (0, 0), (0, -1))
    r_gb = corrected_by_green(gb, g_r, r, (0, 0), (0, 1))
    b_gb = corrected_by_green(gb, g_b, b, (0, 0), (1, 0))
    r_b = choose(np.abs(r.at(reg) - r.at(reg, -1, 1)), np.abs(r.at(reg, -1, 0) - r.at(reg, 0, 1)),
                 corrected_by_green(g_b, g_r, r, (0, 0), (-1, 1)),
                 corrected_by_green(g_b, g_r, r, (-1, 0), (0, 1)))
    b_r = choose(np.abs(b.at(reg) - b.at(reg, 1, -1)), np.abs(b.at(reg, 1, 0) - b.at(reg, 0, -1)),
                 corrected_by_green(g_r, g_b, b, (0, 0), (1, -1)),
                 corrected_by_green(g_r, g_b, b, (1, 0), (0, -1)))

    # back to full resolution over x in [-1, w], y in [-1, h]
    xs, ys = np.arange(-1, w + 1), np.arange(-1, h + 1)
    rows, cols = ys // 2 - reg[2], xs // 2 - reg[0]
    even_y, even_x = (ys % 2 == 0)[:, None], (xs % 2 == 0)[None, :]

    def interleave(top_left, top_right, bottom_left, bottom_right):
        pick = [p[np.ix_(rows, cols)] for p in (top_left, top_right, bottom_left, bottom_right)]
        return np.where(even_y, np.where(even_x, pick[0], pick[1]), np.where(even_x, pick[2], pick[3]))

    demosaiced = _wrap(np.stack([
        interleave(r_gr, r.at(reg), r_b, r_gb),
        interleave(gr.at(reg), g_r.at(reg), g_b.at(reg), gb.at(reg)),
        interleave(b_gr, b_r, b.at(reg), b_gb)]), signed=True)

    # colour correction in Q8.8
    kelvin = float(color_temp)
    alpha = (1 / kelvin - 1 / 3200) / (1 / 7000 - 1 / 3200)
    matrix = np.trunc((matrix_3200.astype(np.float64) * alpha
                       + matrix_7000.astype(np.float64) * (1 - alpha)) * 256).astype(np.int64)
    corrected = np.stack([
        _wrap((matrix[k, 3] + sum(matrix[k, j] * demosaiced[j] for j in range(3))) // 256, signed=True)
        for k in range(3)])

    # tone curve
    lut_x = np.arange(1024)
    inv_range = 1.0 / (white_level - black_level)
    cb = 2.0 - 2.0 ** (contrast / 100.0)
    ca = 2.0 - 2.0 * cb
    g = np.clip((lut_x - black_level) * inv_range, 0.0, 1.0) ** (1.0 / gamma)
    z = np.where(g > 0.5, 1.0 - (ca * (1.0 - g) * (1.0 - g) + cb * (1.0 - g)), ca * g * g + cb * g)
    curve = np.where(lut_x <= black_level, 0,
                     np.where(lut_x > white_level, 255, np.clip(z * 255.0 + 0.5, 0, 255).astype(np.int64)))
    curved = _Plane(curve[np.clip(corrected, 0, 1023)], -1, -1)

    # sharpening
    strength_x32 = int(np.clip(sharpen_strength * 32, 0, 255))
    band = (-1, w + 1, 0, h)
    unsharp_y = _Plane(_mean_up(_mean_up(curved.at(band, 0, -1), curved.at(band, 0, 1)), curved.at(band)),
                       -1, 0)
    out = (0, w, 0, h)
    unsharp = _mean_up(_mean_up(unsharp_y.at(out, -1, 0), unsharp_y.at(out, 1, 0)), unsharp_y.at(out))
    mask = curved.at(out) - unsharp
    sharpened = curved.at(out) + _wrap(mask * strength_x32, signed=True) // 32
    return [np.clip(sharpened, 0, 255).astype(np.uint8)]


def schedule_cpu(app: App) -> None:
    # The original's: the lookup tables (matrix, curve, strength) at the root; the output in
    # parallel strips of 32 rows (16 pairs), two rows at a time, vectorized two vectors wide;
    # within a strip, the denoised image, the Bayer channels, green at red and blue (computed
    # together), and the curved image are computed per pair of rows into 4-row folded buffers,
    # the demosaic's output and the colour correction per tile of the curved image.
    (processed,), s = app.outputs, app.stages
    image = app.params[0]
    vec = vector_width(hl.UInt(16))
    s["matrix"].compute_root()
    s["curve"].compute_root()
    s["sharpen_strength_x32"].compute_root()
    x, y, c = processed.args()
    yi, yo, yii, xi = hl.Var("yi"), hl.Var("yo"), hl.Var("yii"), hl.Var("xi")
    round_up = hl.TailStrategy.RoundUp
    out_width = processed.output_buffer().width()
    out_height = processed.output_buffer().height()
    strip_size = (32 // 2) * 2
    (processed.compute_root().reorder(c, x, y).split(y, yi, yii, 2, round_up)
     .split(yi, yo, yi, strip_size // 2).vectorize(x, 2 * vec, round_up).unroll(c).parallel(yo))

    dx, dy = s["denoised"].args()
    dxi, dyi = hl.Var("dxi"), hl.Var("dyi")
    (s["denoised"].compute_at(processed, yi).store_at(processed, yo).prefetch(image, dy, dy, 2)
     .fold_storage(dy, 4).tile(dx, dy, dx, dy, dxi, dyi, 2 * vec, 2).vectorize(dxi).unroll(dyi))

    ix, iy, ic = s["deinterleaved"].args()
    (s["deinterleaved"].compute_at(processed, yi).store_at(processed, yo).fold_storage(iy, 4)
     .reorder(ic, ix, iy).vectorize(ix, 2 * vec, round_up).unroll(ic))

    curved = s["curved"]
    cx, cy, cc = curved.args()
    cxi, cyi = hl.Var("cxi"), hl.Var("cyi")
    (curved.compute_at(processed, yi).store_at(processed, yo).reorder(cc, cx, cy)
     .tile(cx, cy, cx, cy, cxi, cyi, 2 * vec, 2, round_up).vectorize(cxi).unroll(cyi).unroll(cc))

    kx, ky, kc = s["corrected"].args()
    s["corrected"].compute_at(curved, cx).reorder(kc, kx, ky).vectorize(kx).unroll(kc)

    # the Demosaic generator's schedule, at the loop levels the pipe gives it
    for f in (s["g_r"], s["g_b"]):
        fx, fy = f.args()
        (f.compute_at(processed, yi).store_at(processed, yo).vectorize(fx, 2 * vec, round_up)
         .fold_storage(fy, 4))
    gx, gy = s["g_r"].args()
    align = hl.LoopAlignStrategy.AlignStart
    s["g_b"].compute_with(s["g_r"], gx, [(gx, align), (gy, align)])
    mx, my, mc = s["demosaiced"].args()
    s["demosaiced"].compute_at(curved, cx).vectorize(mx).unroll(my).reorder(mc, mx, my).unroll(mc)

    (processed.bound(c, 0, 3).bound(x, 0, (out_width / (2 * vec)) * (2 * vec))
     .bound(y, 0, (out_height / strip_size) * strip_size))


def schedule_gpu(app: App) -> None:
    # The original's CUDA schedule: the output in 28 x 12 tiles of pairs of columns, a block
    # per tile; every stage before it computed per block, a thread per (pair of) pixels, the
    # denoised image 2x2 per thread; the matrix and strength on one thread, the curve in
    # blocks of 32 entries.
    (processed,), s = app.outputs, app.stages
    xi, yi = hl.Var("xi"), hl.Var("yi")
    s["matrix"].compute_root().gpu_single_thread()
    (lx,) = s["curve"].args()
    s["curve"].compute_root().gpu_tile(lx, xi, 32)
    s["sharpen_strength_x32"].compute_root().gpu_single_thread()

    x, y, c = processed.args()
    out_width = processed.output_buffer().width()
    out_height = processed.output_buffer().height()
    processed.bound(c, 0, 3).bound(x, 0, (out_width / 2) * 2).bound(y, 0, (out_height / 2) * 2)
    processed.compute_root().reorder(c, x, y).unroll(x, 2).gpu_tile(x, y, xi, yi, 28, 12)

    for name in ("curved", "corrected"):
        fx, fy, _ = s[name].args()
        s[name].compute_at(processed, x).unroll(fx, 2).gpu_threads(fx, fy)
    for f in (s["g_r"], s["g_b"]):
        fx, fy = f.args()
        f.compute_at(processed, x).gpu_threads(fx, fy)
    mx, my, mc = s["demosaiced"].args()
    s["demosaiced"].compute_at(processed, x).unroll(mx, 2).gpu_threads(mx, my).reorder(mc, mx, my).unroll(mc)

    dx, dy = s["denoised"].args()
    dxi, dyi = hl.Var("dxi"), hl.Var("dyi")
    (s["denoised"].compute_at(processed, x).tile(dx, dy, dxi, dyi, 2, 2).unroll(dxi).unroll(dyi)
     .gpu_threads(dx, dy))
    ix, iy, ic = s["deinterleaved"].args()
    (s["deinterleaved"].compute_at(processed, x).unroll(ix, 2).gpu_threads(ix, iy)
     .reorder(ic, ix, iy).unroll(ic))
