"""Non-local means denoising of a float colour image (Halide's nl_means app,
apps/nl_means/nl_means_generator.cpp).

For every offset (dx, dy) of a search window, the squared difference between the image and
the image shifted by that offset, summed over the three channels and box-filtered over a
patch (patch_size wide, in y then x), measures how alike the two patches are; its weight is
fast_exp(-distance / (sigma^2 patch_size^2)). Each output pixel is the weighted mean of the
pixels at the offsets of its search window: the weights are summed along with the colour as a
fourth (alpha) channel of ones, picked with mux, and divide the colour at the end, clamped to
[0, 1]. The edges are repeated. The reduction domains' extents come from the int Params
patch_size and search_area. Arguments: input (3, H, W) float32 (planar), patch_size,
search_area (int32), sigma (float32); the output has the input's shape (three channels)."""

from __future__ import annotations

import halide as hl
import numpy as np

from examples.halide.common import App, vector_width

BENCH_SIZE = (3, 2560, 1536)  # rgb.png
# The CPU schedule tiles the output in 16 x 8 tiles (vectorized by up to 16): the image must
# hold one.
SMALL_SIZE = (3, 23, 37)
PATCH_SIZE, SEARCH_AREA, SIGMA = 7, 7, 0.12  # the app's test


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 3, "input")
    patch_size = hl.Param(hl.Int(32), "patch_size")
    search_area = hl.Param(hl.Int(32), "search_area")
    sigma = hl.Param(hl.Float(32), "sigma")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    dx, dy = hl.Var("dx"), hl.Var("dy")

    inv_sigma_sq = hl.f32(-1.0) / (sigma * sigma * patch_size * patch_size)
    clamped = hl.BoundaryConditions.repeat_edge(image)

    # Squared differences between the image and its shift by (dx, dy), summed over channels.
    dc = hl.Func("dc")
    dc[x, y, dx, dy, c] = hl.pow(clamped[x, y, c] - clamped[x + dx, y + dy, c], 2)
    channels = hl.RDom([(0, 3)], "channels")
    d = hl.Func("d")
    d[x, y, dx, dy] = hl.sum(dc[x, y, dx, dy, channels.x])

    # Box-filtered over the patch: the distance between the patches around the two pixels.
    patch_dom = hl.RDom([(-(patch_size // 2), patch_size)], "patch_dom")
    blur_d_y = hl.Func("blur_d_y")
    blur_d_y[x, y, dx, dy] = hl.sum(d[x, y + patch_dom.x, dx, dy])
    blur_d = hl.Func("blur_d")
    blur_d[x, y, dx, dy] = hl.sum(blur_d_y[x + patch_dom.x, y, dx, dy])

    w = hl.Func("w")
    w[x, y, dx, dy] = hl.fast_exp(blur_d[x, y, dx, dy] * inv_sigma_sq)

    clamped_with_alpha = hl.Func("clamped_with_alpha")
    clamped_with_alpha[x, y, c] = hl.mux(c, [clamped[x, y, 0], clamped[x, y, 1], clamped[x, y, 2],
                                             hl.f32(1.0)])

    s_dom = hl.RDom([(-(search_area // 2), search_area), (-(search_area // 2), search_area)],
                    "s_dom")
    non_local_means_sum = hl.Func("non_local_means_sum")
    non_local_means_sum[x, y, c] += (w[x, y, s_dom.x, s_dom.y]
                                     * clamped_with_alpha[x + s_dom.x, y + s_dom.y, c])
    non_local_means = hl.Func("non_local_means")
    non_local_means[x, y, c] = hl.clamp(non_local_means_sum[x, y, c] / non_local_means_sum[x, y, 3],
                                        hl.f32(0.0), hl.f32(1.0))
    stages = dict(dc=dc, d=d, blur_d_y=blur_d_y, blur_d=blur_d, w=w,
                  clamped_with_alpha=clamped_with_alpha, non_local_means_sum=non_local_means_sum)
    return App("nl_means", [non_local_means], [image, patch_size, search_area, sigma], stages)


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_SIZE if size == "small" else BENCH_SIZE
    return [rng.random(shape, dtype=np.float32), PATCH_SIZE, SEARCH_AREA, SIGMA]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray, patch_size: int, search_area: int, sigma: float) -> list[np.ndarray]:
    _, h, w = image.shape
    p0, s0 = -(patch_size // 2), -(search_area // 2)
    sigma = float(np.float32(sigma))
    inv_sigma_sq = -1.0 / (sigma * sigma * patch_size * patch_size)
    # Margin of repeated edge covering every patch and search offset.
    m = patch_size + search_area
    padded = np.pad(image.astype(np.float64), ((0, 0), (m, m), (m, m)), mode="edge")
    hp, wp = h + 2 * patch_size, w + 2 * patch_size  # d over rows/columns -patch_size ...

    def window(a, y0, x0, hh, ww):  # a at image rows y0 ..., columns x0 ... (padded by m)
        return a[..., m + y0:m + y0 + hh, m + x0:m + x0 + ww]

    num = np.zeros((3, h, w))
    den = np.zeros((h, w))
    for oy in range(s0, s0 + search_area):
        for ox in range(s0, s0 + search_area):
            diff = (window(padded, -patch_size, -patch_size, hp, wp)
                    - window(padded, -patch_size + oy, -patch_size + ox, hp, wp))
            d = (diff ** 2).sum(axis=0)  # rows, columns -patch_size .. h / w + patch_size
            blur_y = sum(d[patch_size + p0 + k:patch_size + p0 + k + h, :] for k in range(patch_size))
            blur = sum(blur_y[:, patch_size + p0 + k:patch_size + p0 + k + w] for k in range(patch_size))
            weight = np.exp(blur * inv_sigma_sq)
            num += weight * window(padded, oy, ox, h, w)
            den += weight
    return [np.clip(num / den, 0.0, 1.0).astype(np.float32)]


def tolerance(args) -> float:
    # Squared differences of values in [0, 1] are at most 1: a channel sum d <= 3 is off by
    # about 3 eps, a patch sum along y by P e_d + (P - 1) 3 P eps / 2, along x likewise with
    # partial sums up to 3 P^2. That error times |1 / (sigma^2 P^2)|, plus fast_exp's (the
    # last 5 bits of the mantissa), is the relative error of a weight; the weighted mean is
    # off by at most twice that, plus the roundings of its S^2-term sums.
    _, patch, search, sigma = args
    eps = float(np.finfo(np.float32).eps)
    e_d = 3 * eps
    e_y = patch * e_d + (patch - 1) * 3 * patch * eps / 2
    e_x = patch * e_y + (patch - 1) * 3 * patch * patch * eps / 2
    weight = e_x / (sigma * sigma * patch * patch) + 2.0 ** -18
    return 2 * weight + 2 * search * search * eps


def schedule_cpu(app: App) -> None:
    # The original's: the output in 16 x 8 tiles, parallel over rows of tiles, vectorized;
    # the channel sums and the y blur of the distances computed per tile (stored per row of
    # tiles); the weighted sums per output vector, channels unrolled, the x blur (and the
    # weights) within them.
    (out,), s = app.outputs, app.stages
    vec = vector_width(hl.Float(32))
    x, y, c = out.args()
    tx, ty = hl.Var("tx"), hl.Var("ty")
    out.output_buffer().dim(2).set_bounds(0, 3)  # three channels out
    out.compute_root().reorder(c, x, y).tile(x, y, tx, ty, x, y, 16, 8).parallel(ty).vectorize(x, vec)
    f = s["blur_d_y"]
    fx, fy = f.args()[:2]
    f.compute_at(out, tx).hoist_storage(out, ty).reorder(fy, fx).vectorize(fx, vec)
    f = s["d"]
    f.compute_at(out, tx).hoist_storage(out, ty).vectorize(f.args()[0], vec)
    f = s["non_local_means_sum"]
    sx, sy, sc = f.args()
    f.compute_at(out, x).reorder(sc, sx, sy).bound(sc, 0, 4).unroll(sc).vectorize(sx, vec)
    rx, ry = f.rvars(0)
    f.update(0).reorder(sc, sx, sy, rx, ry).unroll(sc).vectorize(sx, vec)
    f = s["blur_d"]
    f.compute_at(s["non_local_means_sum"], sx).vectorize(f.args()[0], vec)


def schedule_gpu(app: App) -> None:
    # The original's: 32 x 16 thread blocks throughout; the weighted sums computed whole, one
    # kernel per row of the search window, within which the distances are blurred in tiles
    # of 122 x 26 (one block per tile and offset dx), 32 x 16 threads at a time.
    (out,), s = app.outputs, app.stages
    x, y, c = out.args()
    xi, yi, xii, yii = hl.Var("xi"), hl.Var("yi"), hl.Var("xii"), hl.Var("yii")
    out.output_buffer().dim(2).set_bounds(0, 3)
    out.compute_root().reorder(c, x, y).unroll(c).gpu_tile(x, y, xi, yi, 32, 16)
    nls = s["non_local_means_sum"]
    sx, sy, sc = nls.args()
    rx, ry = nls.rvars(0)
    nls.compute_root().gpu_tile(sx, sy, xi, yi, 32, 16)
    (nls.update(0).reorder(sc, rx, sx, sy, ry).tile(sx, sy, xi, yi, 32, 16).gpu_blocks(sx, sy)
     .gpu_threads(xi, yi).unroll(sc))
    bd = s["blur_d"]
    bx, by, bdx, _ = bd.args()
    (bd.compute_at(nls, ry).tile(bx, by, xi, yi, 128 - 6, 32 - 6).tile(xi, yi, xii, yii, 32, 16)
     .gpu_threads(xii, yii).gpu_blocks(bx, by, bdx))
    for name in ("blur_d_y", "d"):
        f = s[name]
        fx, fy = f.args()[:2]
        f.compute_at(bd, bx).tile(fx, fy, xi, yi, 32, 16).gpu_threads(xi, yi)
