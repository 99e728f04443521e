"""The CPU families that Halide's own apps called for (issue 27): scans down columns with the
transposes between them (iir_blur), a window reduction computed per register tile of the
contraction that reads it and an activation computed on that contraction's tiles
(depthwise_separable_conv), lookups that are no views (camera_pipe's tone curve), cheap
Funcs recomputed where they are read and copied into the scatter that reads them (hist).
Each pipeline is checked against numpy at prime sizes, below and above a tile, and the
schedule's report says which family it got."""

import halide as hl
import numpy as np
import pytest

import tcstage as tc

x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
rng = np.random.default_rng(27)


def column_scan_transposed(alpha=0.25):
    """out(x, y, c) = scan(y, x, c): a first-order filter down each column of the input, then
    transposed (half of iir_blur)."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")
    scan = hl.Func("scan")
    scan[x, y, c] = hl.undef(hl.Float(32))
    scan[x, 0, c] = inp[x, 0, c]
    r = hl.RDom([(1, inp.height() - 1)], "r")
    scan[x, r.x, c] = (1 - alpha) * scan[x, r.x - 1, c] + alpha * inp[x, r.x, c]
    out = hl.Func("out")
    out[x, y, c] = scan[y, x, c]
    return out


def column_scan_reference(a, alpha=0.25):
    s = a.astype(np.float64).copy()  # (C, H, W): the scan runs along H
    for i in range(1, s.shape[1]):
        s[:, i] = (1 - alpha) * s[:, i - 1] + alpha * s[:, i]
    return s.transpose(0, 2, 1)


@pytest.mark.parametrize("shape", [(3, 67, 71), (2, 5, 7), (1, 131, 17)])
def test_column_scan_in_vectors_per_strip_of_its_transpose(shape):
    f = tc.from_halide(column_scan_transposed(), name="scan_t")
    a = rng.random(shape, dtype=np.float32)
    out_shape = (shape[0], shape[2], shape[1])
    np.testing.assert_allclose(f(a, output_shape=out_shape), column_scan_reference(a),
                               rtol=0, atol=1e-5)
    text = f.explain(a, output_shape=out_shape)
    assert f.last_cpu_kernel.schedule == "tcstage", text
    if min(shape[1:]) >= 16:
        assert "out: reads a Func transposed, in tiles of" in text
        assert "scan: a scan, computed per strip of out" in text
        assert "its updates in vectors of" in text


def depthwise_separable(cm_one=True):
    """A zero-padded 3x3 depthwise filter, a 1x1 convolution over its channels, relu
    (depthwise_separable_conv's structure, channels innermost)."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")  # (ch, x, y)
    dw = hl.ImageParam(hl.Float(32), 3, "dw")  # (ch, fx, fy)
    pw = hl.ImageParam(hl.Float(32), 2, "pw")  # (co, ch)
    d = hl.Var("d")
    inside = (x >= 0) & (x < inp.dim(1).extent()) & (y >= 0) & (y < inp.dim(2).extent())
    padded = hl.Func("padded")
    padded[d, x, y] = hl.select(inside, inp[d, hl.clamp(x, 0, inp.dim(1).max()),
                                            hl.clamp(y, 0, inp.dim(2).max())], hl.f32(0))
    win = hl.RDom([(0, 3), (0, 3)], "win")
    depthwise = hl.Func("depthwise")
    depthwise[d, x, y] += dw[d, win.x, win.y] * padded[d, x + win.x - 1, y + win.y - 1]
    rc = hl.RDom([(0, pw.dim(1).extent())], "rc")
    pointwise = hl.Func("pointwise")
    pointwise[d, x, y] = hl.f32(0)
    pointwise[d, x, y] += pw[d, rc.x] * depthwise[rc.x, x, y]
    out = hl.Func("out")
    out[d, x, y] = hl.max(pointwise[d, x, y], hl.f32(0))
    return out


@pytest.mark.parametrize("size", [(37, 13, 11), (64, 29, 3)])
def test_depthwise_window_per_register_tile_and_relu_on_the_tiles(size):
    ch, w, h = size
    co = 16
    a = rng.standard_normal((h, w, ch)).astype(np.float32)
    dw = rng.standard_normal((3, 3, ch)).astype(np.float32)
    pw = rng.standard_normal((ch, co)).astype(np.float32)
    f = tc.from_halide(depthwise_separable(), name="dwsep")
    got = f(dw, a, pw, output_shape=(h, w, co))  # (Halide's order: buffers by name)
    p = np.pad(a.astype(np.float64), ((1, 1), (1, 1), (0, 0)))
    conv = sum(dw[j, i] * p[j:j + h, i:i + w] for j in range(3) for i in range(3))
    want = np.maximum(np.einsum("yxc,co->yxo", conv, pw.astype(np.float64)), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    text = f.explain(dw, a, pw, output_shape=(h, w, co))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "padded: a view, inlined into its readers" in text
    assert "out computed on its tiles" in text
    assert "depthwise: a window reduction computed per register tile of pointwise" in text


def batched_depthwise_separable():
    """depthwise_separable over a batch, its filter's taps innermost (fx, ch, fy): the taps
    read the filter across the channels that the window's tiles vectorise."""
    inp = hl.ImageParam(hl.Float(32), 4, "inp")  # (ch, x, y, b)
    dw = hl.ImageParam(hl.Float(32), 3, "dw")  # (fx, ch, fy)
    pw = hl.ImageParam(hl.Float(32), 2, "pw")  # (co, ch)
    d, b = hl.Var("d"), hl.Var("b")
    inside = (x >= 0) & (x < inp.dim(1).extent()) & (y >= 0) & (y < inp.dim(2).extent())
    padded = hl.Func("padded")
    padded[d, x, y, b] = hl.select(inside, inp[d, hl.clamp(x, 0, inp.dim(1).max()),
                                               hl.clamp(y, 0, inp.dim(2).max()), b], hl.f32(0))
    win = hl.RDom([(0, 3), (0, 3)], "win")
    depthwise = hl.Func("depthwise")
    depthwise[d, x, y, b] += dw[win.x, d, win.y] * padded[d, x + win.x - 1, y + win.y - 1, b]
    rc = hl.RDom([(0, pw.dim(1).extent())], "rc")
    pointwise = hl.Func("pointwise")
    pointwise[d, x, y, b] = hl.f32(0)
    pointwise[d, x, y, b] += pw[d, rc.x] * depthwise[rc.x, x, y, b]
    out = hl.Func("out")
    out[d, x, y, b] = hl.max(pointwise[d, x, y, b], hl.f32(0))
    return out


@pytest.mark.parametrize("size", [(37, 13, 11, 2), (32, 29, 5, 3), (7, 3, 2, 1)])
def test_batched_depthwise_pads_rows_once_and_packs_its_filter_once(size):
    # With a batch loop in parallel outside the rows, the padded input is a line buffer along
    # the rows (each padded row computed once, no select per tap), the filter is packed once
    # for all the tiles, and the window's nine taps are unrolled.
    ch, w, h, n = size
    co = 16
    a = rng.standard_normal((n, h, w, ch)).astype(np.float32)
    dw = rng.standard_normal((3, ch, 3)).astype(np.float32)  # (fy, ch, fx)
    pw = rng.standard_normal((ch, co)).astype(np.float32)
    f = tc.from_halide(batched_depthwise_separable(), name="dwsep_batch")
    got = f(dw, a, pw, output_shape=(n, h, w, co))
    p = np.pad(a.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv = sum(dw[j, :, i] * p[:, j:j + h, i:i + w] for j in range(3) for i in range(3))
    want = np.maximum(np.einsum("nyxc,co->nyxo", conv, pw.astype(np.float64)), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    text = f.explain(dw, a, pw, output_shape=(n, h, w, co))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    if ch < 32:  # (a sum of fewer terms is no contraction: the stencil family takes it)
        assert "depthwise: a window reduction, a line buffer of out's strips" in text
        return
    assert "padded: a view, a line buffer along pointwise's y, kept per b" in text
    assert "depthwise: a window reduction computed per register tile of pointwise" in text
    assert "packed dw_im once, whole; its taps unrolled" in text


def test_a_lookup_of_a_computed_value_is_stored_not_recomputed_by_each_reader():
    """curved(x, y) = curve[clamp(v(x, y))] read at three rows (camera_pipe's tone curve under
    its sharpening): a lookup is no view, so it is a line buffer, computed once a point."""
    inp = hl.ImageParam(hl.Int(32), 2, "inp")
    curve = hl.Func("curve")
    curve[x] = x * x
    v = hl.Func("v")
    v[x, y] = inp[x, y] * 3 + 1
    curved = hl.Func("curved")
    curved[x, y] = curve[hl.clamp(v[x, y], 0, 255)]
    out = hl.Func("out")
    out[x, y] = curved[x, y] + 2 * curved[x, y + 1] + curved[x, y + 2]
    f = tc.from_halide(out, name="toned")
    a = rng.integers(-10, 100, (53, 41)).astype(np.int32)
    table = np.arange(256) ** 2
    t = table[np.clip(a * 3 + 1, 0, 255)]
    np.testing.assert_array_equal(f(a, output_shape=(51, 41)), t[:-2] + 2 * t[1:-1] + t[2:])
    text = f.explain(a, output_shape=(51, 41))
    assert "curved: pointwise, a line buffer of out's strips" in text, text


def test_cheap_luma_is_recomputed_and_copied_per_row_into_the_histogram():
    """hist's shape: a luma of three channels read by a per-row histogram (a scatter along
    the row) and by the output at its own point."""
    inp = hl.ImageParam(hl.UInt(8), 3, "inp")
    luma = hl.Func("luma")
    luma[x, y] = (hl.f32(0.25) * inp[x, y, 0] + hl.f32(0.5) * inp[x, y, 1]
                  + hl.f32(0.25) * inp[x, y, 2])
    rows = hl.Func("rows")
    rows[x, y] = 0
    rx = hl.RDom([(0, inp.width())], "rx")
    rows[hl.i32(hl.clamp(luma[rx.x, y], 0, 255)) // 16, y] += 1
    shade = hl.Func("shade")  # (a line buffer of the output's strips: two rows read)
    shade[x, y] = hl.i32(luma[x, y]) * 2 + rows[hl.i32(hl.clamp(luma[x, y], 0, 255)) // 16, y]
    out = hl.Func("out")
    out[x, y] = shade[x, y] + shade[x, y + 1]
    f = tc.from_halide(out, name="rowhist")
    a = rng.integers(0, 256, (3, 23, 67)).astype(np.uint8)
    lum = 0.25 * a[0] + 0.5 * a[1] + 0.25 * a[2]  # exact in float32: multiples of 1/4
    bins = np.clip(lum, 0, 255).astype(np.int64) // 16
    counts = np.stack([np.bincount(b, minlength=16) for b in bins])
    shaded = lum.astype(np.int64) * 2 + np.take_along_axis(counts, bins, axis=1)
    np.testing.assert_array_equal(f(a, output_shape=(22, 67)), shaded[:-1] + shaded[1:])
    text = f.explain(a, output_shape=(22, 67))
    assert "luma: cheap, inlined into its readers" in text, text
    assert "luma: computed for rows per y too, in vectors" in text


def upsample_by_phases(k=4, clamped=True):
    """gaussian_blur's upsampling: in x, k interleaved 2-tap filters (a Func of phases read as
    `phases[x / k, y, x % k]`), then in y the same way (`[x, y / k, y % k]`); the input read
    through a boundary condition, as the app's, or (`clamped` False) not."""
    lo = hl.ImageParam(hl.Float(32), 2, "lo")
    if clamped:
        lo = hl.BoundaryConditions.repeat_edge(lo)
    p = hl.Var("p")
    w = hl.Func("w")
    w[x] = hl.f32(x + 1) / (2 * k)
    x_phases = hl.Func("x_phases")
    x_phases[x, y, p] = lo[x, y] * w[p] + lo[x + 1, y] * w[k + p]
    up_x = hl.Func("up_x")
    up_x[x, y] = x_phases[x // k, y, x % k]
    y_phases = hl.Func("y_phases")
    y_phases[x, y, p] = up_x[x, y] * w[p] + up_x[x, y + 1] * w[k + p]
    out = hl.Func("out")
    out[x, y] = y_phases[x, y // k, y % k]
    return out


def upsample_reference(a, k=4):
    w = (np.arange(2 * k) + 1.0) / (2 * k)
    h, wd = a.shape
    ox, oy = np.arange((wd - 1) * k), np.arange((h - 1) * k)
    a = a.astype(np.float64)
    up_x = a[:, ox // k] * w[ox % k] + a[:, ox // k + 1] * w[k + ox % k]
    return up_x[oy // k] * w[oy % k][:, None] + up_x[oy // k + 1] * w[k + oy % k][:, None]


@pytest.mark.parametrize("clamped", [True, False])
@pytest.mark.parametrize("shape", [(11, 13), (37, 67)])
def test_phases_are_inlined_and_their_reader_vectorised_k_vectors_wide(shape, clamped):
    """Prime sizes; the output is (h - 1) k by (w - 1) k, so strips and vectors end mid-phase.
    Unclamped, the aligned vectors reach past the input: Halide refuses that call before it
    computes anything, and the schedule is planned again without the alignment."""
    f = tc.from_halide(upsample_by_phases(clamped=clamped), name="upsample")
    a = rng.random(shape, dtype=np.float32)
    out_shape = ((shape[0] - 1) * 4, (shape[1] - 1) * 4)
    np.testing.assert_allclose(f(a, output_shape=out_shape), upsample_reference(a),
                               rtol=1e-5, atol=1e-6)
    text = f.explain(a, output_shape=out_shape)
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "x_phases: read by phases, inlined into its readers" in text
    assert "y_phases: read by phases, inlined into its readers" in text
    assert "up_x: pointwise, a line buffer of out's strips" in text
    wide = "x in vectors 4 wide" in text  # (where up_x holds 4 vectors of the target's)
    assert wide or shape[1] < 67
    assert ("4 wide, aligned to them (it reads by phases)" in text) == (wide and clamped)
    if wide and not clamped:
        assert "4 wide (it reads by phases)" in text
        assert "failed at these" in text


def test_a_windows_small_channel_dimension_is_unrolled_for_any_channel_count():
    """A 3-tap window over rows of a 3-channel image (resize's class): the channels are
    unrolled inside the taps, by the planned count, guarded for any other."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")
    r = hl.RDom([(0, 3)], "r")
    rows = hl.Func("rows")
    rows[x, y, c] = hl.f32(0)
    rows[x, y, c] += inp[x, y + r.x, c] * (r.x + 1)
    out = hl.Func("out")
    out[x, y, c] = rows[x, y, c] + rows[x, y + 1, c]
    f = tc.from_halide(out, name="window3")
    for channels in (3, 2, 5):
        a = rng.random((channels, 41, 37), dtype=np.float32)
        p = a.astype(np.float64)
        win = p[:, :-2] + 2 * p[:, 1:-1] + 3 * p[:, 2:]
        got = f(a, output_shape=(channels, 38, 37))
        np.testing.assert_allclose(got, win[:, :-1] + win[:, 1:], rtol=1e-5, atol=1e-5)
        assert f.last_cpu_kernel.schedule == "tcstage"
        assert "structured schedule failed" not in f.last_cpu_kernel.note


def colour_matrix():
    """A 3-point sum along x of mixed(x, y, k) = sum over i of m(i, k) * box(x, y, i), where box
    sums 3 rows of the input's channel i: each channel of mixed reads all three of box's
    (camera_pipe's colour correction)."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")
    m = hl.ImageParam(hl.Float(32), 2, "m")
    clamped = hl.BoundaryConditions.repeat_edge(inp)
    box = hl.Func("box")
    box[x, y, c] = clamped[x, y - 1, c] + clamped[x, y, c] + clamped[x, y + 1, c]
    mixed = hl.Func("mixed")
    mixed[x, y, c] = hl.mux(c, [m[0, k] * box[x, y, 0] + m[1, k] * box[x, y, 1]
                                + m[2, k] * box[x, y, 2] for k in range(3)])
    out = hl.Func("out")
    out[x, y, c] = mixed[x - 1, y, c] + mixed[x, y, c] + mixed[x + 1, y, c]
    return out


def test_channels_are_held_and_unrolled_and_other_channel_counts_compile_anew():
    # The output's three channels are bounded to 3 for the call and unrolled inside each
    # vector, so the mux on c is resolved at compile time; a call with four channels (mux's
    # last value serves c = 3) gets code of its own, and three channels again the first.
    f = tc.from_halide(colour_matrix(), name="colour")
    for channels in (3, 4, 3):
        h, w = 13, 67
        a = rng.standard_normal((3, h, w)).astype(np.float32)
        m = rng.standard_normal((3, 3)).astype(np.float32)  # (k, i): channel k's weights
        got = f(a, m, output_shape=(channels, h, w))
        # repeat_edge clamps every coordinate, the channel too; mux's last value serves c >= 2
        ys, xs = np.arange(h), np.arange(-1, w + 1)
        at = a.astype(np.float64)[:, :, np.clip(xs, 0, w - 1)]  # (3, h, w + 2)
        box = sum(at[:, np.clip(ys + d, 0, h - 1)] for d in (-1, 0, 1))
        mixed = np.einsum("ki,iyx->kyx", m.astype(np.float64), box)
        mixed = mixed[np.minimum(np.arange(channels), 2)]
        want = mixed[:, :, :-2] + mixed[:, :, 1:-1] + mixed[:, :, 2:]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        text = f.explain(a, m, output_shape=(channels, h, w))
        assert f"out: its c held at {channels} points, unrolled in each vector" in text, text
        assert f"sizes compiled in as constants: out.0={channels}" in text


def structure_tensor():
    """harris's shape: two derivatives of an image, three products of them, each summed over
    a 3x3 window, and a response of the three sums."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    ix, iy = hl.Func("ix"), hl.Func("iy")
    ix[x, y] = inp[x + 2, y + 1] - inp[x, y + 1]
    iy[x, y] = inp[x + 1, y + 2] - inp[x + 1, y]
    ixx, iyy, ixy = hl.Func("ixx"), hl.Func("iyy"), hl.Func("ixy")
    ixx[x, y] = ix[x, y] * ix[x, y]
    iyy[x, y] = iy[x, y] * iy[x, y]
    ixy[x, y] = ix[x, y] * iy[x, y]
    sums = []
    for name, f in (("sxx", ixx), ("syy", iyy), ("sxy", ixy)):
        s = hl.Func(name)
        s[x, y] = sum((f[x + i, y + j] for j in range(3) for i in range(3)), hl.f32(0))
        sums.append(s)
    sxx, syy, sxy = sums
    out = hl.Func("out")
    out[x, y] = sxx[x, y] * syy[x, y] - sxy[x, y] * sxy[x, y]
    return out


@pytest.mark.parametrize("shape", [(41, 37), (7, 5)])
def test_derivatives_read_by_two_products_are_stored_and_products_summed_at_each_tap(shape):
    # A derivative read at its own point by two products that a window's taps recompute would
    # be computed 18 times per point: it is stored (a line buffer); the products, one
    # operation on stored values, are inlined into the sums.
    h, w = shape
    a = rng.standard_normal((h + 4, w + 4)).astype(np.float32)
    f = tc.from_halide(structure_tensor(), name="tensor")
    got = f(a, output_shape=shape)
    d = a.astype(np.float64)
    ix = d[1:-1, 2:] - d[1:-1, :-2]  # (h + 2, w + 2)
    iy = d[2:, 1:-1] - d[:-2, 1:-1]

    def box(p):
        return sum(p[j:j + h, i:i + w] for j in range(3) for i in range(3))

    want = box(ix * ix) * box(iy * iy) - box(ix * iy) ** 2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    text = f.explain(a, output_shape=shape)
    assert f.last_cpu_kernel.schedule == "tcstage", text
    for name in ("ix", "iy"):
        assert f"{name}: pointwise, a line buffer of out's strips" in text, text
    for name in ("ixx", "iyy", "ixy"):
        assert f"{name}: cheap, inlined into its readers" in text, text


@pytest.mark.parametrize("shape", [(37, 29), (5, 3)])
def test_downsampling_phases_join_the_strips_of_the_sum_over_them(shape):
    # gaussian_blur's downsampling in y: phases(x, y, p) sums 4 input rows with weights per
    # phase p, down(x, y) sums phases(x, y + p, p) over its 2 phases. The phases Func has a
    # dimension more than its reader, a few that the reader sums: it is a line buffer of the
    # reader's strips, not a pass of its own stored whole.
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    clamped = hl.BoundaryConditions.repeat_edge(inp)
    p = hl.Var("p")
    rf, rp = hl.RDom([(0, 4)], "rf"), hl.RDom([(0, 2)], "rp")
    phases = hl.Func("phases")
    phases[x, y, p] = hl.f32(0)
    phases[x, y, p] += clamped[x, 4 * y + rf.x] * hl.f32(1 + rf.x + 4 * p)
    down = hl.Func("down")
    down[x, y] = hl.f32(0)
    down[x, y] += phases[x, y + rp.x, rp.x]
    out = hl.Func("out")
    out[x, y] = down[x - 1, y] + down[x, y] + down[x + 1, y]
    f = tc.from_halide(out, name="phases_down")
    h, w = shape
    a = rng.standard_normal((4 * h + 8, w)).astype(np.float32)
    got = f(a, output_shape=(h, w))
    d = a.astype(np.float64)
    # (rows 4 y + k stay inside the input: only the columns are clamped)
    ph = [sum(d[4 * np.arange(h + 1) + k] * (1 + k + 4 * q) for k in range(4))
          for q in range(2)]  # ph[q]: (h + 1, w)
    dn = ph[0][:h] + ph[1][1:h + 1]
    cols = np.clip(np.arange(-1, w + 1), 0, w - 1)
    dc = dn[:, cols]
    np.testing.assert_allclose(got, dc[:, :-2] + dc[:, 1:-1] + dc[:, 2:], rtol=1e-5, atol=1e-4)
    text = f.explain(a, output_shape=(h, w))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "phases: a window reduction, a line buffer of out's strips" in text, text


@pytest.mark.parametrize("radius", [12, 2])
def test_a_wide_vertical_window_sweeps_each_row_per_tap(radius):
    # A vertical blur of 2 radius + 1 taps weighted by the tap alone: past 16 taps, each tap
    # sweeps the row (a stream through memory), rather than each vector reading every tap's
    # row; a narrow one keeps its taps inside each vector.
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    clamped = hl.BoundaryConditions.repeat_edge(inp)
    weight = hl.Func("weight")
    weight[x] = hl.f32(1) / (1 + x * x)
    r = hl.RDom([(-radius, 2 * radius + 1)], "r")
    cols = hl.Func("cols")
    cols[x, y] = hl.f32(0)
    cols[x, y] += weight[r.x] * clamped[x, y + r.x]
    out = hl.Func("out")
    out[x, y] = cols[x, y - 1] + cols[x, y + 1]
    f = tc.from_halide(out, name="vblur")
    h, w = 53, 41
    a = rng.standard_normal((h, w)).astype(np.float32)
    got = f(a, output_shape=(h, w))
    d = a.astype(np.float64)
    taps = np.arange(-radius, radius + 1)

    def blurred(rows):
        return sum(d[np.clip(rows + t, 0, h - 1)] / (1 + t * t) for t in taps)

    want = blurred(np.arange(h) - 1) + blurred(np.arange(h) + 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    text = f.explain(a, output_shape=(h, w))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "cols: a window reduction, a line buffer of out's strips" in text, text
    assert ("its taps sweeping each row" in text) == (2 * radius + 1 > 16), text


def test_a_strided_view_read_by_several_line_buffers_is_stored():
    # camera_pipe's Bayer planes: a view of a mosaic at 2x and 2y (shuffles at every read),
    # read by three stencils that are stored: it is stored once, not inlined into each.
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    planes = hl.Func("planes")
    planes[x, y, c] = hl.mux(c, [inp[2 * x, 2 * y], inp[2 * x + 1, 2 * y],
                                 inp[2 * x, 2 * y + 1]])
    sums = []
    for k, name in enumerate(("s0", "s1", "s2")):
        s = hl.Func(name)
        s[x, y] = planes[x, y, k] + planes[x + 1, y, k] + planes[x, y + 1, k]
        sums.append(s)
    out = hl.Func("out")
    out[x, y] = sums[0][x, y] * sums[1][x, y + 1] - sums[2][x + 1, y]
    f = tc.from_halide(out, name="bayer")
    h, w = 23, 37
    a = rng.standard_normal((2 * h + 6, 2 * w + 6)).astype(np.float32)
    got = f(a, output_shape=(h, w))
    d = a.astype(np.float64)
    p = [d[0::2, 0::2], d[0::2, 1::2], d[1::2, 0::2]]
    s = [q[:h + 1, :w + 1] + q[:h + 1, 1:w + 2] + q[1:h + 2, :w + 1] for q in p]
    want = s[0][:h, :w] * s[1][1:h + 1, :w] - s[2][:h, 1:w + 1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    text = f.explain(a, output_shape=(h, w))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "planes: a view, inlined" not in text, text
    assert "planes: strip root" in text, text


def log_step_scan_window():
    """max_filter's structure, smaller: a scan down columns whose slice t holds the maximum of
    rows y .. y + (0, 1, 3), a Func of one more dimension than the output reading it at its
    own column, and a window along columns reading that Func's slice by the tap."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")
    t = hl.Var("t")
    edge = hl.BoundaryConditions.repeat_edge(inp)
    scan = hl.Func("scan")
    scan[x, y, c, t] = edge[x, y, c]
    r = hl.RDom([(0, inp.height()), (1, 2)], "r")
    scan[x, r.x, c, r.y] = hl.max(scan[x, r.x, c, r.y - 1], scan[x, r.x + r.y, c, r.y - 1])
    pairs = hl.Func("pairs")
    pairs[x, y, c, t] = hl.max(scan[x, y, c, t], scan[x, y + 1, c, t])
    dx = hl.RDom([(-2, 5)], "dx")
    out = hl.Func("out")
    out[x, y, c] = hl.sum(pairs[x + dx.x, y, c, hl.clamp(hl.i32(hl.abs(dx.x)), 0, 2)])
    return out


def log_step_scan_window_reference(a):
    ch, h, w = a.shape
    rows = np.concatenate([a, np.repeat(a[:, -1:], 3, axis=1)], axis=1)  # rows past h repeat
    slices = [rows]
    for t in (1, 2):
        s = rows.copy()
        s[:, :h] = np.maximum(slices[-1][:, :h], slices[-1][:, t:h + t])
        slices.append(s)
    cols = np.arange(w)
    out = np.zeros(a.shape, np.float64)
    for d in range(-2, 3):
        s = slices[min(abs(d), 2)]
        pairs = np.maximum(s[:, :h], s[:, 1:h + 1])
        out += pairs[:, :, np.clip(cols + d, 0, w - 1)]
    return out


@pytest.mark.parametrize("shape", [(3, 37, 263), (2, 11, 29), (1, 5, 300)])
def test_a_scan_down_columns_is_computed_per_column_strip_of_its_reader(shape):
    f = tc.from_halide(log_step_scan_window(), name="log_scan")
    a = rng.random(shape, dtype=np.float32)
    np.testing.assert_allclose(f(a, output_shape=shape), log_step_scan_window_reference(a),
                               rtol=1e-6, atol=1e-6)
    text = f.explain(a, output_shape=shape)
    assert f.last_cpu_kernel.schedule == "tcstage", text
    width = min(256, shape[2])
    assert f"out: strip root, x in parallel strips of {width} columns (one per c too)" in text
    assert "scan: a scan, computed per strip of out's columns, its updates in vectors" in text
    assert "pairs: computed per row of out's column strips" in text
    assert "held at" not in text  # (its channels are tasks, not unrolled in each vector)


def clamped_min_filter():
    """erode's structure: a 5-wide minimum along x, then along y, of an input read through
    explicit clamps (no `likely`)."""
    inp = hl.ImageParam(hl.UInt(8), 3, "inp")
    edge = hl.Func("edge")
    edge[x, y, c] = inp[hl.clamp(x, 0, inp.width() - 1), hl.clamp(y, 0, inp.height() - 1), c]
    along_x = hl.Func("along_x")
    along_x[x, y, c] = hl.min(hl.min(hl.min(edge[x - 2, y, c], edge[x - 1, y, c]),
                                     hl.min(edge[x, y, c], edge[x + 1, y, c])), edge[x + 2, y, c])
    out = hl.Func("out")
    out[x, y, c] = hl.min(hl.min(hl.min(along_x[x, y - 2, c], along_x[x, y - 1, c]),
                                 hl.min(along_x[x, y, c], along_x[x, y + 1, c])),
                          along_x[x, y + 2, c])
    return out


@pytest.mark.parametrize("shape", [(3, 41, 131), (1, 7, 5), (2, 67, 257)])
def test_a_clamped_view_read_at_several_columns_is_a_line_buffer(shape):
    # Inlined, each of the five taps' vectors would be a gather through the clamps.
    f = tc.from_halide(clamped_min_filter(), name="clamped_min")
    a = rng.integers(0, 256, size=shape, dtype=np.uint8)
    p = np.pad(a, ((0, 0), (2, 2), (2, 2)), mode="edge")
    h, w = shape[1:]
    along_x = np.min([p[:, :, d:d + w] for d in range(5)], axis=0)
    want = np.min([along_x[:, d:d + h] for d in range(5)], axis=0)
    np.testing.assert_array_equal(f(a, output_shape=shape), want)
    text = f.explain(a, output_shape=shape)
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "edge: pointwise, a line buffer of out's strips, 2 deep" in text


def test_a_view_read_at_its_own_column_stays_inlined():
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    edge = hl.BoundaryConditions.repeat_edge(inp)
    out = hl.Func("out")
    out[x, y] = edge[x, y - 1] + 2 * edge[x, y] + edge[x, y + 1]
    f = tc.from_halide(out, name="vertical")
    a = rng.random((37, 53), dtype=np.float32)
    p = np.pad(a.astype(np.float64), ((1, 1), (0, 0)), mode="edge")
    np.testing.assert_allclose(f(a, output_shape=a.shape, schedule="tcstage"),
                               p[:-2] + 2 * p[1:-1] + p[2:], rtol=1e-6)
    assert "repeat_edge: a view, inlined into its readers" in \
        f.explain(a, output_shape=a.shape, schedule="tcstage")


@pytest.mark.parametrize("batch", [5, 4])
def test_a_batch_that_does_not_share_out_evenly_is_fused_with_the_rows(batch):
    # conv_layer's 5 images on 2 cores kept one idle a sixth of the time: the parallel loop
    # takes the rows in too, where the batch alone does not share out among the threads.
    import os
    inp = hl.ImageParam(hl.Float(32), 4, "inp")  # (ci, x, y, n)
    wts = hl.ImageParam(hl.Float(32), 2, "wts")  # (co, ci)
    n = hl.Var("n")
    r = hl.RDom([(0, inp.dim(0).extent())], "r")
    out = hl.Func("out")
    out[c, x, y, n] = hl.f32(0)
    out[c, x, y, n] += wts[c, r.x] * inp[r.x, x, y, n]
    f = tc.from_halide(out, name="pointwise_conv")
    a = rng.standard_normal((batch, 6, 7, 24)).astype(np.float32)  # (n, y, x, ci)
    w = rng.standard_normal((24, 32)).astype(np.float32)  # (ci, co)
    shape = (batch, 6, 7, 32)
    np.testing.assert_allclose(f(a, w, output_shape=shape),
                               np.einsum("nyxi,io->nyxo", a.astype(np.float64), w), rtol=1e-4,
                               atol=1e-4)
    text = f.explain(a, w, output_shape=shape)
    threads = os.cpu_count() or 1
    even = batch % threads == 0 or batch / (threads * -(-batch // threads)) >= 0.9
    assert ("; n in parallel" in text) == even, text
    assert ("_n in parallel" in text) == (not even), text


def channels_last_conv():
    """conv_layer's structure: out(co, x, y) = sum over ci, kx, ky of
    filter(co, kx, ky, ci) * inp(ci, x + kx, y + ky); the filter's ci, which the reduction
    steps innermost, is its outermost dimension."""
    inp = hl.ImageParam(hl.Float(32), 3, "inp")
    wts = hl.ImageParam(hl.Float(32), 4, "wts")
    r = hl.RDom([(0, inp.dim(0).extent()), (0, 3), (0, 3)], "r")
    out = hl.Func("out")
    out[c, x, y] = hl.f32(0)
    out[c, x, y] += wts[c, r.y, r.z, r.x] * inp[r.x, x + r.y, y + r.z]
    return out


@pytest.mark.parametrize("size", [(13, 9, 7, 37), (32, 11, 5, 64)])
def test_a_filter_stepped_far_apart_is_copied_once_into_the_reductions_order(size):
    ci, w, h, co = size
    f = tc.from_halide(channels_last_conv(), name="nhwc_conv")
    a = rng.standard_normal((h + 2, w + 2, ci)).astype(np.float32)  # (y, x, ci)
    k = rng.standard_normal((ci, 3, 3, co)).astype(np.float32)  # [ci, ky, kx, co]
    want = sum(np.einsum("yxi,io->yxo", a[j:j + h, i:i + w].astype(np.float64), k[:, j, i])
               for j in range(3) for i in range(3))
    np.testing.assert_allclose(f(a, k, output_shape=(h, w, co)), want, rtol=1e-4, atol=1e-4)
    text = f.explain(a, k, output_shape=(h, w, co))
    assert f.last_cpu_kernel.schedule == "tcstage", text
    assert "wts_im copied once into the reduction's order" in text, text


def test_a_panel_already_in_the_reductions_order_is_read_in_place():
    # out(n, m) = sum over k of b(n, k) * a(k, m): b's k is the dimension after n already
    a_in = hl.ImageParam(hl.Float(32), 2, "a_in")
    b_in = hl.ImageParam(hl.Float(32), 3, "b_in")
    r = hl.RDom([(0, a_in.dim(0).extent())], "r")
    out = hl.Func("out")
    out[x, y] = hl.f32(0)
    out[x, y] += b_in[x, r.x, 0] * a_in[r.x, y]
    f = tc.from_halide(out, name="gemm3")
    a = rng.standard_normal((19, 23)).astype(np.float32)  # (m, k)
    b = rng.standard_normal((1, 23, 40)).astype(np.float32)  # (0, k, n)
    np.testing.assert_allclose(f(a, b, output_shape=(19, 40)), a.astype(np.float64) @ b[0],
                               rtol=1e-4, atol=1e-4)
    assert "reduction's order" not in f.explain(a, b, output_shape=(19, 40))
