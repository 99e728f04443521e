"""Synthetic depth-of-field from a stereo pair (Halide's lens_blur app,
apps/lens_blur/lens_blur_generator.cpp).

A cost volume compares the left image with the right one shifted by 2z and 2z + 1 pixels for
each of `slices` disparities z; its confidence is the variance of the costs across z. The
volume, weighted by the confidence, is smoothed with an 8-level push-pull pyramid (each level
a [1 3 3 1] / 8 downsampling repeated at its edge, pulled back up bilinearly and averaged with
the level), and the disparity of least smoothed cost (argmin, a Tuple reduction) is the depth.
The bokeh radius grows with the distance of the depth from focus_depth; its worst case over a
window (a max filter, whose extent comes from the Params) bounds a set of random sample
offsets per pixel (random_float, a Tuple-valued Func of both offsets); a sample contributes
the left image's colour where its bokeh covers this pixel and it is not hidden, and the sum,
with an alpha channel of 255s counting the samples (mux), is normalised.

Arguments: left_im, right_im (3, H, W) uint8 (planar), then the scalars in Halide's order:
aperture_samples, blur_radius_scale, focus_depth, slices (with the generator's ranges). The
output is (3, H, W) float32.

The reference reproduces random_float bit for bit: Halide's generator is a fixed hash of the
pixel's coordinates and two integers, the random call's number and its definition's number,
both taken from process-wide counters when the pipeline is built. `random_seeds(app)` reads
them from the built Func; `reference` uses those of the latest `build()`, so build before
calling it (the tests do)."""

from __future__ import annotations

import re

import halide as hl
import numpy as np

from examples.halide.common import App

BENCH_SIZE = (3, 320, 192)  # rgb_small.png, the app's test input
SMALL_SIZE = (3, 37, 53)
PYRAMID_LEVELS = 8
UNSCHEDULED = "infeasible"  # inlined, every pyramid level would recompute those below it
# The app's test: 32 slices, focus on 13, radius scale 0.5, 32 aperture samples.
DEFAULT_PARAMS = dict(aperture_samples=32, blur_radius_scale=0.5, focus_depth=13, slices=32)


def _downsample(f, x, y):
    downx, downy = hl.Func("downx"), hl.Func("downy")
    _ = hl._
    downx[x, y, _] = (f[2 * x - 1, y, _] + 3.0 * (f[2 * x, y, _] + f[2 * x + 1, y, _])
                      + f[2 * x + 2, y, _]) / 8.0
    downy[x, y, _] = (downx[x, 2 * y - 1, _] + 3.0 * (downx[x, 2 * y, _] + downx[x, 2 * y + 1, _])
                      + downx[x, 2 * y + 2, _]) / 8.0
    return downy


def _upsample(f, x, y):
    upx, upy = hl.Func("upx"), hl.Func("upy")
    _ = hl._
    upx[x, y, _] = 0.25 * f[(x // 2) - 1 + 2 * (x % 2), y, _] + 0.75 * f[x // 2, y, _]
    upy[x, y, _] = 0.25 * upx[x, (y // 2) - 1 + 2 * (y % 2), _] + 0.75 * upx[x, y // 2, _]
    return upy


_LAST_SEEDS: dict = {}


def build() -> App:
    left_im = hl.ImageParam(hl.UInt(8), 3, "left_im")
    right_im = hl.ImageParam(hl.UInt(8), 3, "right_im")
    slices = hl.Param(hl.Int(32), "slices", 32)
    slices.set_range(1, 64)
    focus_depth = hl.Param(hl.Int(32), "focus_depth", 13)
    focus_depth.set_range(1, 32)
    blur_radius_scale = hl.Param(hl.Float(32), "blur_radius_scale", 0.5)
    blur_radius_scale.set_range(0.0, 1.0)
    aperture_samples = hl.Param(hl.Int(32), "aperture_samples", 32)
    aperture_samples.set_range(1, 64)
    x, y, z, c = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("c")

    maximum_blur_radius = hl.i32(hl.max(slices - focus_depth, focus_depth) * blur_radius_scale)
    left = hl.BoundaryConditions.repeat_edge(left_im)
    right = hl.BoundaryConditions.repeat_edge(right_im)

    diff = hl.Func("diff")
    diff[x, y, z, c] = hl.min(hl.absd(left[x, y, c], right[x + 2 * z, y, c]),
                              hl.absd(left[x, y, c], right[x + 2 * z + 1, y, c]))
    cost = hl.Func("cost")
    cost[x, y, z] = (hl.pow(hl.f32(diff[x, y, z, 0]), 2) + hl.pow(hl.f32(diff[x, y, z, 1]), 2)
                     + hl.pow(hl.f32(diff[x, y, z, 2]), 2))

    # Confidence: the variance of the cost across the slices.
    cost_confidence = hl.Func("cost_confidence")
    r = hl.RDom([(0, slices)])
    a = hl.sum(hl.pow(cost[x, y, r.x], 2)) / slices
    b = hl.pow(hl.sum(cost[x, y, r.x] / slices), 2)
    cost_confidence[x, y] = a - b

    # Push-pull smoothing of the confidence-weighted cost volume.
    push = [hl.Func(f"cost_pyramid_push_{i}") for i in range(PYRAMID_LEVELS)]
    push[0][x, y, z, c] = hl.mux(c, [cost[x, y, z] * cost_confidence[x, y], cost_confidence[x, y]])
    w, h = left_im.dim(0).extent(), left_im.dim(1).extent()
    for i in range(1, PYRAMID_LEVELS):
        push[i][x, y, z, c] = _downsample(push[i - 1], x, y)[x, y, z, c]
        w = w // 2
        h = h // 2
        push[i] = hl.BoundaryConditions.repeat_edge(push[i], [(0, w), (0, h)])
    pull = [hl.Func(f"cost_pyramid_pull_{i}") for i in range(PYRAMID_LEVELS)]
    pull[-1][x, y, z, c] = push[-1][x, y, z, c]
    for i in range(PYRAMID_LEVELS - 2, -1, -1):
        pull[i][x, y, z, c] = hl.lerp(_upsample(pull[i + 1], x, y)[x, y, z, c], push[i][x, y, z, c],
                                      hl.f32(0.5))

    filtered_cost = hl.Func("filtered_cost")
    filtered_cost[x, y, z] = pull[0][x, y, z, 0] / pull[0][x, y, z, 1]

    # The depth: the slice of least smoothed cost.
    depth = hl.Func("depth")
    r = hl.RDom([(0, slices)])
    depth[x, y] = hl.argmin(filtered_cost[x, y, r.x])[0]

    bokeh_radius = hl.Func("bokeh_radius")
    bokeh_radius[x, y] = hl.abs(depth[x, y] - focus_depth) * blur_radius_scale
    bokeh_radius_squared = hl.Func("bokeh_radius_squared")
    bokeh_radius_squared[x, y] = hl.pow(bokeh_radius[x, y], 2)

    # The largest bokeh radius around each pixel, which bounds the sample offsets.
    worst_case_bokeh_radius_y = hl.Func("worst_case_bokeh_radius_y")
    worst_case_bokeh_radius = hl.Func("worst_case_bokeh_radius")
    r = hl.RDom([(-maximum_blur_radius, 2 * maximum_blur_radius + 1)])
    worst_case_bokeh_radius_y[x, y] = hl.maximum(bokeh_radius[x, y + r.x])
    worst_case_bokeh_radius[x, y] = hl.maximum(worst_case_bokeh_radius_y[x + r.x, y])

    input_with_alpha = hl.Func("input_with_alpha")
    input_with_alpha[x, y, c] = hl.mux(c, [hl.f32(left[x, y, 0]), hl.f32(left[x, y, 1]),
                                           hl.f32(left[x, y, 2]), hl.f32(255.0)])

    output = hl.Func("output")
    output[x, y, c] = input_with_alpha[x, y, c]

    # Random sample offsets, a function of x, y and the sample number z.
    worst_radius = worst_case_bokeh_radius[x, y]
    sample_u = (hl.random_float() - hl.f32(0.5)) * 2 * worst_radius
    sample_v = (hl.random_float() - hl.f32(0.5)) * 2 * worst_radius
    sample_u = hl.clamp(hl.i32(sample_u), -maximum_blur_radius, maximum_blur_radius)
    sample_v = hl.clamp(hl.i32(sample_v), -maximum_blur_radius, maximum_blur_radius)
    sample_locations = hl.Func("sample_locations")
    sample_locations[x, y, z] = (sample_u, sample_v)

    s = hl.RDom([(0, aperture_samples)], "s")
    sample_u = sample_locations[x, y, z][0]
    sample_v = sample_locations[x, y, z][1]
    sample_x, sample_y = x + sample_u, y + sample_v
    r_squared = sample_u * sample_u + sample_v * sample_v

    # A sample counts if its bokeh reaches this pixel and it is either within this pixel's
    # bokeh or in front of it.
    sample_is_within_bokeh_of_this_pixel = r_squared < bokeh_radius_squared[x, y]
    this_pixel_is_within_bokeh_of_sample = r_squared < bokeh_radius_squared[sample_x, sample_y]
    sample_is_in_front_of_this_pixel = depth[sample_x, sample_y] < depth[x, y]
    sample_weight = hl.Func("sample_weight")
    sample_weight[x, y, z] = hl.select(
        (sample_is_within_bokeh_of_this_pixel | sample_is_in_front_of_this_pixel)
        & this_pixel_is_within_bokeh_of_sample, hl.f32(1.0), hl.f32(0.0))

    sample_x = x + sample_locations[x, y, s.x][0]
    sample_y = y + sample_locations[x, y, s.x][1]
    output[x, y, c] += sample_weight[x, y, s.x] * input_with_alpha[sample_x, sample_y, c]

    final = hl.Func("final")
    final[x, y, c] = output[x, y, c] / output[x, y, 3]

    stages = dict(diff=diff, cost=cost, cost_confidence=cost_confidence, filtered_cost=filtered_cost,
                  depth=depth, bokeh_radius=bokeh_radius, bokeh_radius_squared=bokeh_radius_squared,
                  worst_case_bokeh_radius_y=worst_case_bokeh_radius_y,
                  worst_case_bokeh_radius=worst_case_bokeh_radius, input_with_alpha=input_with_alpha,
                  output=output, sample_locations=sample_locations, sample_weight=sample_weight)
    stages.update({f"cost_pyramid_push_{i}": f for i, f in enumerate(push)})
    stages.update({f"cost_pyramid_pull_{i}": f for i, f in enumerate(pull)})
    app = App("lens_blur", [final],
              [left_im, right_im, aperture_samples, blur_radius_scale, focus_depth, slices], stages)
    _LAST_SEEDS.clear()
    _LAST_SEEDS.update(random_seeds(app))
    return app


_SEED = re.compile(r"let R\d+ = \(\(uint32\)(\d+) \+ \(uint32\)(\d+)\)")


# Two builds of the pipeline draw different random_float seeds, so their outputs differ:
# halide_bench.py times the schedules of such an app without comparing them (the tests check
# each build against the reference, which reads the build's seeds).
OUTPUTS_DIFFER_PER_BUILD = "random_float draws new seeds in every build"


def random_seeds(app: App) -> dict:
    """{"u": (first hash, tag), "v": ...}: the constants Halide folded into the two random
    numbers of sample_locations (the hash of the call's number, and the definition's tag)."""
    values = app.stages["sample_locations"].values()
    seeds = {}
    for key, value in zip("uv", values):
        m = _SEED.search(str(value))
        assert m, f"no random_float seed found in {value}"
        seeds[key] = (int(m.group(1)), int(m.group(2)))
    return seeds


# numpy reference

_C0, _C1, _C2 = 576942909, 1121052041, 1040796640


def _rng32(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint32)
    with np.errstate(over="ignore"):
        return ((np.uint32(_C2) * v + np.uint32(_C1)) * v + np.uint32(_C0)).astype(np.uint32)


def _np_random_float(seed: tuple[int, int], xs, ys, zs) -> np.ndarray:
    """Halide's random_float() in a Func over (x, y, z): a uint32 hash of (call, tag, z, y, x)
    mixed by a fixed quadratic permutation, its top 23 bits as the mantissa of a float in
    [1, 2), minus 1. Broadcasts xs, ys, zs."""
    first, tag = seed
    with np.errstate(over="ignore"):
        result = _rng32(np.uint32(first) + np.uint32(tag))
        for v in (zs, ys, xs):
            result = _rng32(result + np.asarray(v).astype(np.int64).astype(np.uint32))
    result = result ^ (result >> np.uint32(16))
    bits = np.uint32(127 << 23) | (result >> np.uint32(9))
    return np.clip(bits.view(np.float32) - np.float32(1.0), np.float32(0.0), np.float32(1.0))


class _Box:
    """Values on the integer box [x0, x0 + nx) x [y0, y0 + ny), array (..., ny, nx)."""

    def __init__(self, a, x0, y0):
        self.a, self.x0, self.y0 = a, x0, y0

    def at(self, xs, ys):
        return self.a[..., ys[:, None] - self.y0, xs[None, :] - self.x0]


def _clampi(v, lo, hi):
    return np.minimum(np.maximum(v, lo), hi)  # Halide's clamp, also when hi < lo


def _np_downsample(f, xs, ys):
    """[1 3 3 1] / 8 at stride 2 along x, then y, of the box-valued function f(xs, ys)."""
    xt = [2 * xs - 1, 2 * xs, 2 * xs + 1, 2 * xs + 2]
    yt = [2 * ys - 1, 2 * ys, 2 * ys + 1, 2 * ys + 2]
    ux = np.arange(xt[0].min(), xt[3].max() + 1)
    uy = np.arange(yt[0].min(), yt[3].max() + 1)
    v = _Box(f(ux, uy), ux[0], uy[0])
    dx = (v.a[..., xt[0] - ux[0]] + 3.0 * (v.a[..., xt[1] - ux[0]] + v.a[..., xt[2] - ux[0]])
          + v.a[..., xt[3] - ux[0]]) / 8.0
    return (dx[..., yt[0] - uy[0], :] + 3.0 * (dx[..., yt[1] - uy[0], :] + dx[..., yt[2] - uy[0], :])
            + dx[..., yt[3] - uy[0], :]) / 8.0


def _np_upsample(f, xs, ys):
    xt = [xs // 2 - 1 + 2 * (xs % 2), xs // 2]
    yt = [ys // 2 - 1 + 2 * (ys % 2), ys // 2]
    ux = np.arange(min(t.min() for t in xt), max(t.max() for t in xt) + 1)
    uy = np.arange(min(t.min() for t in yt), max(t.max() for t in yt) + 1)
    v = f(ux, uy)
    ux0, uy0 = ux[0], uy[0]
    upx = 0.25 * v[..., xt[0] - ux0] + 0.75 * v[..., xt[1] - ux0]
    return 0.25 * upx[..., yt[0] - uy0, :] + 0.75 * upx[..., yt[1] - uy0, :]


def reference(left_im, right_im, aperture_samples, blur_radius_scale, focus_depth,
              slices) -> list[np.ndarray]:
    assert _LAST_SEEDS, "build() the pipeline first: the random seeds come from it"
    seeds = dict(_LAST_SEEDS)
    _, h, w = left_im.shape
    scale = np.float32(blur_radius_scale)
    m = int(np.float32(max(slices - focus_depth, focus_depth)) * scale)
    left = left_im.astype(np.int64)
    right = right_im.astype(np.int64)
    zs = np.arange(slices)

    def push0(xs, ys):  # (2, slices, len(ys), len(xs)): cost * confidence, confidence
        cy = np.clip(ys, 0, h - 1)
        lv = left[:, cy][:, :, np.clip(xs, 0, w - 1)]  # (3, ny, nx)
        r1 = right[:, cy][:, :, np.clip(xs[None, :] + 2 * zs[:, None], 0, w - 1)]  # (3, ny, Z, nx)
        r2 = right[:, cy][:, :, np.clip(xs[None, :] + 2 * zs[:, None] + 1, 0, w - 1)]
        d = np.minimum(np.abs(lv[:, :, None, :] - r1), np.abs(lv[:, :, None, :] - r2))
        cost = (d.astype(np.float64) ** 2).sum(axis=0).transpose(1, 0, 2)  # (Z, ny, nx)
        a = (cost ** 2).sum(axis=0) / slices
        b = (cost / slices).sum(axis=0) ** 2
        conf = a - b
        return np.stack([cost * conf, np.broadcast_to(conf, cost.shape)])

    # Each level of the push pyramid past the first is held on its own extent and repeated
    # beyond it.
    levels = [push0]
    lw, lh = w, h
    for _ in range(1, PYRAMID_LEVELS):
        lw, lh = lw // 2, lh // 2
        # held at the coordinates the clamp can give: 0 .. extent - 1, or just -1 where the
        # extent has halved to 0 (Halide's clamp(v, 0, -1) is -1)
        xs_ = np.arange(min(0, lw - 1), max(lw, 1))
        ys_ = np.arange(min(0, lh - 1), max(lh, 1))
        grid = _np_downsample(levels[-1], xs_, ys_)
        levels.append(lambda xs, ys, g=grid, lw=lw, lh=lh: _level_at(g, xs, ys, lw, lh))

    def pull(i):
        if i == PYRAMID_LEVELS - 1:
            return levels[i]
        coarser = pull(i + 1)
        return lambda xs, ys: 0.5 * _np_upsample(coarser, xs, ys) + 0.5 * levels[i](xs, ys)

    bx, by = np.arange(-m, w + m), np.arange(-m, h + m)
    pulled = pull(0)(bx, by)
    filtered = pulled[0] / pulled[1]  # (Z, ny, nx)
    assert not np.isnan(filtered).any(), "NaN in the filtered cost (a flat confidence)"
    depth = _Box(np.argmin(filtered, axis=0), -m, -m)
    radius = np.abs(depth.a - focus_depth) * float(scale)
    radius_sq = _Box(radius * radius, -m, -m)
    worst_y = np.max(np.stack([radius[k:k + h, :] for k in range(2 * m + 1)]), axis=0)  # rows 0..h
    worst = np.max(np.stack([worst_y[:, k:k + w] for k in range(2 * m + 1)]), axis=0)

    xs, ys = np.arange(w), np.arange(h)
    X, Y = xs[None, None, :], ys[None, :, None]
    S = np.arange(aperture_samples)[:, None, None]
    worst32 = worst.astype(np.float32)[None]

    def offset(key):
        rnd = _np_random_float(seeds[key], X, Y, S)  # (samples, h, w)
        v = (rnd - np.float32(0.5)) * np.float32(2) * worst32
        return np.clip(v.astype(np.int32), -m, m).astype(np.int64)

    u, v = offset("u"), offset("v")
    sx, sy = X + u, Y + v
    r2 = u * u + v * v
    here_sq = radius_sq.a[m:m + h, m:m + w][None]
    there_sq = radius_sq.a[sy + m, sx + m]
    in_front = depth.a[sy + m, sx + m] < depth.a[m:m + h, m:m + w][None]
    weight = ((r2 < here_sq) | in_front) & (r2 < there_sq)

    colour = np.concatenate([left_im.astype(np.float64), np.full((1, h, w), 255.0)])
    total = colour.copy()
    for k in range(aperture_samples):
        cy, cx = np.clip(sy[k], 0, h - 1), np.clip(sx[k], 0, w - 1)
        total += weight[k] * colour[:, cy, cx]
    # The sums are of whole numbers below 2^24, exact in float32; so is the division.
    return [(total[:3].astype(np.float32) / total[3:].astype(np.float32))]


def _level_at(grid, xs, ys, lw, lh):
    """A level held from (min(0, lw - 1), min(0, lh - 1)), repeated beyond its extent."""
    x0, y0 = min(0, lw - 1), min(0, lh - 1)
    return grid[..., _clampi(ys, 0, lh - 1)[:, None] - y0, _clampi(xs, 0, lw - 1)[None, :] - x0]


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    p = DEFAULT_PARAMS
    if size == "small":
        # A stereo pair: the right image is the left one shifted by 2z pixels, z = 3 in the top
        # half and 7 in the bottom half (fresh noise where nothing shifts in).
        left = rng.integers(0, 256, size=SMALL_SIZE, dtype=np.uint8)
        right = rng.integers(0, 256, size=SMALL_SIZE, dtype=np.uint8)
        half = SMALL_SIZE[1] // 2
        for rows, z in ((slice(0, half), 3), (slice(half, None), 7)):
            right[:, rows, 2 * z:] = left[:, rows, :-2 * z]
    else:
        # The app's test passes the same image as both views.
        left = rng.integers(0, 256, size=BENCH_SIZE, dtype=np.uint8)
        right = left.copy()
    return [left, right, p["aperture_samples"], p["blur_radius_scale"], p["focus_depth"], p["slices"]]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def tolerance(args) -> float:
    # Given the same depths, the output is exact: sums of whole numbers below 2^24 and one
    # division, in float32 on both sides. Allow that division's rounding.
    return 255 * float(np.finfo(np.float32).eps)


def schedule_cpu(app: App) -> None:
    # The original's: the finest level of the cost volume computed whole, in parallel rows,
    # the costs and their confidence per vector; the coarser levels per (slice, channel) task
    # of the second-finest pulled level, in 8 x 2 tiles; depth and colour whole, in parallel
    # rows; the output in parallel rows, its worst-case radius per row, the samples per
    # output vector.
    (final,), s = app.outputs, app.stages
    x, y, z, c = (hl.Var(n) for n in "xyzc")
    xi, yi, t = hl.Var("xi"), hl.Var("yi"), hl.Var("t")
    push = [s[f"cost_pyramid_push_{i}"] for i in range(PYRAMID_LEVELS)]
    pull = [s[f"cost_pyramid_pull_{i}"] for i in range(PYRAMID_LEVELS)]
    (push[0].compute_root().reorder(c, z, x, y).bound(c, 0, 2).unroll(c).vectorize(x, 16)
     .parallel(y, 4))
    s["cost"].compute_at(push[0], x).hoist_storage(push[0], y).vectorize(x)
    s["cost_confidence"].compute_at(push[0], x).vectorize(x)
    for i in range(1, PYRAMID_LEVELS):
        push[i].compute_at(pull[1], t).vectorize(x, 8)
        if i > 1:
            pull[i].compute_at(pull[1], t).tile(x, y, xi, yi, 8, 2).vectorize(xi).unroll(yi)
    pull[1].compute_root().fuse(z, c, t).parallel(t).tile(x, y, xi, yi, 8, 2).vectorize(xi).unroll(yi)
    s["depth"].compute_root().tile(x, y, xi, yi, 8, 2).vectorize(xi).unroll(yi).parallel(y, 8)
    s["input_with_alpha"].compute_root().reorder(c, x, y).unroll(c).vectorize(x, 8).parallel(y, 8)
    s["worst_case_bokeh_radius_y"].compute_at(final, y).vectorize(x, 8)
    final.compute_root().reorder(c, x, y).bound(c, 0, 3).unroll(c).vectorize(x, 8).parallel(y)
    s["worst_case_bokeh_radius"].compute_at(final, y).vectorize(x, 8)
    output = s["output"]
    output.compute_at(final, x).vectorize(x)
    (samples,) = output.rvars(0)
    output.update(0).reorder(c, x, samples).vectorize(x).unroll(c)
    s["sample_weight"].compute_at(output, x).unroll(x)
    s["sample_locations"].compute_at(output, x).vectorize(x)


def schedule_gpu(app: App) -> None:
    # The original's: the finest level in 16 x 16 blocks with the costs per thread, every
    # coarser level whole in 8 x 8 x 8 blocks, depth, colour and the worst-case radii whole in
    # 16 x 16 blocks, and the output in 16 x 16 blocks with the samples per thread.
    (final,), s = app.outputs, app.stages
    x, y, z, c = (hl.Var(n) for n in "xyzc")
    xi, yi, zi = hl.Var("xi"), hl.Var("yi"), hl.Var("zi")
    push = [s[f"cost_pyramid_push_{i}"] for i in range(PYRAMID_LEVELS)]
    pull = [s[f"cost_pyramid_pull_{i}"] for i in range(PYRAMID_LEVELS)]
    (push[0].compute_root().reorder(c, z, x, y).bound(c, 0, 2).unroll(c)
     .gpu_tile(x, y, xi, yi, 16, 16))
    s["cost"].compute_at(push[0], xi)
    s["cost_confidence"].compute_at(push[0], xi)
    for i in range(1, PYRAMID_LEVELS):
        push[i].compute_root().gpu_tile(x, y, z, xi, yi, zi, 8, 8, 8)
        pull[i].compute_root().gpu_tile(x, y, z, xi, yi, zi, 8, 8, 8)
    s["depth"].compute_root().gpu_tile(x, y, xi, yi, 16, 16)
    s["input_with_alpha"].compute_root().reorder(c, x, y).unroll(c).gpu_tile(x, y, xi, yi, 16, 16)
    s["worst_case_bokeh_radius_y"].compute_root().gpu_tile(x, y, xi, yi, 16, 16)
    s["worst_case_bokeh_radius"].compute_root().gpu_tile(x, y, xi, yi, 16, 16)
    final.compute_root().reorder(c, x, y).bound(c, 0, 3).unroll(c).gpu_tile(x, y, xi, yi, 16, 16)
    output = s["output"]
    output.compute_at(final, xi)
    (samples,) = output.rvars(0)
    output.update(0).reorder(c, x, samples).unroll(c)
    s["sample_weight"].compute_at(output, x)
    s["sample_locations"].compute_at(output, x)
