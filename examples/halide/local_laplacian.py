"""Local Laplacian filter (Halide's local_laplacian app): tone mapping / detail enhancement of
a 16-bit colour image through Laplacian pyramids.

The grey level is remapped at `levels` intensity levels k (a lookup table of a detail curve),
each remapped image gets a Gaussian and a Laplacian pyramid; the output's Laplacian pyramid
takes, at each pixel, the two remapped pyramids' values nearest the input's own (coarsened)
grey level, interpolated: a data-dependent read of k. The output pyramid is collapsed and the
colour reintroduced. Downsampling is [1 3 3 1]/8 with stride 2, upsampling bilinear.

Arguments (in Halide's order: buffers, then scalars by name): input (3, H, W) uint16 planar,
alpha, beta (floats: detail and tone weights), levels (int, at least 2)."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import App

PYRAMID_LEVELS = 8
UNSCHEDULED = "infeasible"  # inlined, each pyramid level would recompute all those below it
BENCH_SIZE = (3, 2560, 1536)
SMALL_SIZE = (3, 64, 64)  # 64 rows: the CPU schedule splits the output in strips of 64
DEFAULT_PARAMS = dict(alpha=1.0, beta=1.0, levels=8)  # the app's


def _downsample(f, x, y, rest):
    downx, downy = hl.Func("downx"), hl.Func("downy")
    downx[(x, y, *rest)] = (f[(2 * x - 1, y, *rest)] + 3.0 * (f[(2 * x, y, *rest)] + f[(2 * x + 1, y, *rest)])
                            + f[(2 * x + 2, y, *rest)]) / 8.0
    downy[(x, y, *rest)] = (downx[(x, 2 * y - 1, *rest)]
                            + 3.0 * (downx[(x, 2 * y, *rest)] + downx[(x, 2 * y + 1, *rest)])
                            + downx[(x, 2 * y + 2, *rest)]) / 8.0
    return downy


def _upsample(f, x, y, rest):
    upx, upy = hl.Func("upx"), hl.Func("upy")
    upx[(x, y, *rest)] = hl.lerp(f[((x + 1) / 2, y, *rest)], f[((x - 1) / 2, y, *rest)],
                                 ((x % 2) * 2 + 1) / 4.0)
    upy[(x, y, *rest)] = hl.lerp(upx[(x, (y + 1) / 2, *rest)], upx[(x, (y - 1) / 2, *rest)],
                                 ((y % 2) * 2 + 1) / 4.0)
    return upy


def build() -> App:
    J = PYRAMID_LEVELS
    image = hl.ImageParam(hl.UInt(16), 3, "input")
    levels = hl.Param(hl.Int(32), "levels")
    alpha = hl.Param(hl.Float(32), "alpha")
    beta = hl.Param(hl.Float(32), "beta")
    x, y, c, k = hl.Var("x"), hl.Var("y"), hl.Var("c"), hl.Var("k")

    fx = hl.f32(x) / 256.0
    remap = hl.Func("remap")
    remap[x] = alpha * fx * hl.exp(-fx * fx / 2.0)
    edge = hl.BoundaryConditions.repeat_edge(image)
    floating = hl.Func("floating")
    floating[x, y, c] = edge[x, y, c] / 65535.0
    gray = hl.Func("gray")
    gray[x, y] = (hl.f32(0.299) * floating[x, y, 0] + hl.f32(0.587) * floating[x, y, 1]
                  + hl.f32(0.114) * floating[x, y, 2])

    # Processed Gaussian pyramids, one per intensity level k (the lookup is 256 entries per level).
    g_pyr = [hl.Func(f"gPyramid_{j}") for j in range(J)]
    level = k * (1.0 / (levels - 1))
    idx = hl.clamp(hl.i32(gray[x, y] * hl.f32(levels - 1) * 256.0), 0, (levels - 1) * 256)
    g_pyr[0][x, y, k] = beta * (gray[x, y] - level) + level + remap[idx - 256 * k]
    for j in range(1, J):
        g_pyr[j][x, y, k] = _downsample(g_pyr[j - 1], x, y, [k])[x, y, k]
    l_pyr = [hl.Func(f"lPyramid_{j}") for j in range(J)]
    l_pyr[J - 1][x, y, k] = g_pyr[J - 1][x, y, k]
    for j in range(J - 2, -1, -1):
        l_pyr[j][x, y, k] = g_pyr[j][x, y, k] - _upsample(g_pyr[j + 1], x, y, [k])[x, y, k]

    in_g_pyr = [hl.Func(f"inGPyramid_{j}") for j in range(J)]
    in_g_pyr[0][x, y] = gray[x, y]
    for j in range(1, J):
        in_g_pyr[j][x, y] = _downsample(in_g_pyr[j - 1], x, y, [])[x, y]

    out_l_pyr = [hl.Func(f"outLPyramid_{j}") for j in range(J)]
    for j in range(J):
        lv = in_g_pyr[j][x, y] * hl.f32(levels - 1)
        li = hl.clamp(hl.i32(lv), 0, levels - 2)
        lf = lv - hl.f32(li)
        out_l_pyr[j][x, y] = (1.0 - lf) * l_pyr[j][x, y, li] + lf * l_pyr[j][x, y, li + 1]
    out_g_pyr = [hl.Func(f"outGPyramid_{j}") for j in range(J)]
    out_g_pyr[J - 1][x, y] = out_l_pyr[J - 1][x, y]
    for j in range(J - 2, -1, -1):
        out_g_pyr[j][x, y] = _upsample(out_g_pyr[j + 1], x, y, [])[x, y] + out_l_pyr[j][x, y]

    eps = hl.f32(0.01)
    color = hl.Func("color")
    color[x, y, c] = out_g_pyr[0][x, y] * (floating[x, y, c] + eps) / (gray[x, y] + eps)
    output = hl.Func("local_laplacian")
    output[x, y, c] = hl.u16(hl.clamp(color[x, y, c], 0.0, 1.0) * 65535.0)

    stages = {"remap": remap, "floating": floating, "gray": gray, "color": color}
    for name, pyr in (("gPyramid", g_pyr), ("lPyramid", l_pyr), ("inGPyramid", in_g_pyr),
                      ("outLPyramid", out_l_pyr), ("outGPyramid", out_g_pyr)):
        stages.update({f"{name}_{j}": f for j, f in enumerate(pyr)})
    return App("local_laplacian", [output], [image, alpha, beta, levels], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    p = DEFAULT_PARAMS
    return [rng.integers(0, 1 << 16, size=shape, dtype=np.uint16), p["alpha"], p["beta"], p["levels"]]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


# The reference evaluates each function only at the columns xs and rows ys asked of it (any
# integer vectors), reading what it needs of the functions it uses at their distinct
# coordinates; values are float64 arrays (..., len(ys), len(xs)), memoized per call.


def _along(f, xs, ys, taps, axis):
    """sum of weight(v) * f(coord(v)) over taps (coord, weight), along x (axis -1) or y (-2)."""
    own = xs if axis == -1 else ys
    coords = np.stack([coord(own) for coord, _ in taps])
    distinct, where = np.unique(coords, return_inverse=True)
    where = where.reshape(coords.shape)
    values = f(distinct, ys) if axis == -1 else f(xs, distinct)
    total = 0
    for i, (_, weight) in enumerate(taps):
        w = weight(own)
        if axis == -1:
            total = total + w * values[..., where[i]]
        else:
            total = total + (w[:, None] if np.ndim(w) else w) * values[..., where[i], :]
    return total


_DOWN_TAPS = [(lambda v: 2 * v - 1, lambda v: 1 / 8), (lambda v: 2 * v, lambda v: 3 / 8),
              (lambda v: 2 * v + 1, lambda v: 3 / 8), (lambda v: 2 * v + 2, lambda v: 1 / 8)]
_UP_TAPS = [(lambda v: (v + 1) // 2, lambda v: 1 - ((v % 2) * 2 + 1) / 4),
            (lambda v: (v - 1) // 2, lambda v: ((v % 2) * 2 + 1) / 4)]


def _memo(f):
    cache = {}

    def g(xs, ys):
        key = (xs.tobytes(), ys.tobytes())
        if key not in cache:
            cache[key] = f(xs, ys)
        return cache[key]
    return g


def _down(f):
    return _memo(lambda xs, ys: _along(lambda a, b: _along(f, a, b, _DOWN_TAPS, -1), xs, ys, _DOWN_TAPS, -2))


def _up(f):
    return _memo(lambda xs, ys: _along(lambda a, b: _along(f, a, b, _UP_TAPS, -1), xs, ys, _UP_TAPS, -2))


def reference(image: np.ndarray, alpha: float, beta: float, levels: int) -> list[np.ndarray]:
    J = PYRAMID_LEVELS
    _, h, w = image.shape
    ks = np.arange(levels)

    def floating(xs, ys):
        return image[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)] / 65535.0

    @_memo
    def gray(xs, ys):
        f = floating(xs, ys)
        return 0.299 * f[0] + 0.587 * f[1] + 0.114 * f[2]

    def remap(i):
        fx = i / 256.0
        return alpha * fx * np.exp(-fx * fx / 2)

    @_memo
    def g0(xs, ys):
        g = gray(xs, ys)
        # The lookup index, in float32 as Halide computes it, so the same table entry is taken.
        idx = np.clip((g.astype(np.float32) * np.float32(levels - 1) * np.float32(256.0)).astype(np.int64),
                      0, (levels - 1) * 256)
        level = ks[:, None, None] * (1.0 / (levels - 1))
        return beta * (g - level) + level + remap(idx - 256 * ks[:, None, None])

    g_pyr = [g0]
    in_g_pyr = [gray]
    for _ in range(1, J):
        g_pyr.append(_down(g_pyr[-1]))
        in_g_pyr.append(_down(in_g_pyr[-1]))
    l_pyr = [None] * J
    l_pyr[J - 1] = g_pyr[J - 1]
    for j in range(J - 2, -1, -1):
        l_pyr[j] = _memo(lambda xs, ys, j=j: g_pyr[j](xs, ys) - _up(g_pyr[j + 1])(xs, ys))

    def out_l(j):
        def f(xs, ys):
            lv = in_g_pyr[j](xs, ys) * (levels - 1)
            li = np.clip(lv.astype(np.int64), 0, levels - 2)
            lf = lv - li
            lap = l_pyr[j](xs, ys)
            pick = lambda kk: np.take_along_axis(lap, kk[None], axis=0)[0]
            return (1 - lf) * pick(li) + lf * pick(li + 1)
        return f

    out_g = out_l(J - 1)
    for j in range(J - 2, -1, -1):
        out_g = _memo(lambda xs, ys, j=j, coarser=out_g: _up(coarser)(xs, ys) + out_l(j)(xs, ys))
    xs, ys = np.arange(w), np.arange(h)
    eps = 0.01
    color = out_g(xs, ys) * (floating(xs, ys) + eps) / (gray(xs, ys) + eps)
    return [(np.clip(color, 0, 1) * 65535.0).astype(np.uint16)]


def tolerance(args) -> float:
    # uint16 out of float32 arithmetic: a truncation may land one step away.
    return 1


# The lookup index into remap truncates a float, a step of 1/256 in the remapped value, and
# the colour is divided by gray + 0.01: a grey level one ulp apart (scalar or vector code,
# fused multiply-adds or not) can move a pixel by hundreds of steps. Two correct
# implementations (two Halide schedules among them) agree on all but a few pixels: on the
# bench-size noise image, 0.03% of them.
MISMATCH_FRACTION = 1e-3


def schedule_cpu(app: App) -> None:
    # The original's: the lookup table and the grey level over their whole domains; the four
    # finest levels of the pyramids computed over their whole regions in parallel rows, the
    # output pyramid's levels a few rows at a time within parallel 64-row strips of the
    # output (kept in 4-row folded buffers); the coarse levels computed whole.
    (output,), s = app.outputs, app.stages
    J = PYRAMID_LEVELS
    s["remap"].compute_root()
    x, y, c = output.args()
    yo = hl.Var("yo")
    output.reorder(c, x, y).split(y, yo, y, 64).parallel(yo).vectorize(x, 8)
    gx, gy = s["gray"].args()
    s["gray"].compute_root().parallel(gy, 32).vectorize(gx, 8)
    for j in range(1, 5):
        f = s[f"inGPyramid_{j}"]
        fx, fy = f.args()
        f.compute_root().parallel(fy, 32).vectorize(fx, 8)
        f = s[f"gPyramid_{j}"]
        fx, fy, fk = f.args()
        f.compute_root().reorder_storage(fx, fk, fy).reorder(fk, fy).parallel(fy, 8).vectorize(fx, 8)
        f = s[f"outGPyramid_{j}"]
        fx, fy = f.args()
        f.store_at(output, yo).compute_at(output, y).fold_storage(fy, 4).vectorize(fx, 8)
    f = s["outGPyramid_0"]
    f.compute_at(output, y).vectorize(f.args()[0], 8)
    for j in range(5, J):
        s[f"inGPyramid_{j}"].compute_root()
        f = s[f"gPyramid_{j}"]
        f.compute_root().parallel(f.args()[2])
        s[f"outGPyramid_{j}"].compute_root()


def schedule_gpu(app: App) -> None:
    # The original's: every level of the three pyramids over its whole region in 2-D tiles,
    # 16x8 threads for the fine levels and 2x2 for the coarse ones.
    (output,), s = app.outputs, app.stages
    s["remap"].compute_root()
    xi, yi = hl.Var("xi"), hl.Var("yi")
    x, y, c = output.args()
    output.compute_root().gpu_tile(x, y, xi, yi, 16, 8)
    for j in range(PYRAMID_LEVELS):
        bw, bh = (16, 8) if j <= 3 else (2, 2)
        if j > 0:
            f = s[f"inGPyramid_{j}"]
            fx, fy = f.args()
            f.compute_root().gpu_tile(fx, fy, xi, yi, bw, bh)
            f = s[f"gPyramid_{j}"]
            fx, fy, fk = f.args()
            f.compute_root().reorder(fk, fx, fy).gpu_tile(fx, fy, xi, yi, bw, bh)
        f = s[f"outGPyramid_{j}"]
        fx, fy = f.args()
        f.compute_root().gpu_tile(fx, fy, xi, yi, bw, bh)
