"""The CPU schedule of Halide pipelines run through tc.from_halide: an unscheduled pipeline is
scheduled on a copy (the caller's Funcs and Params untouched), by tcstage's structured
scheduler where it has reductions or is one line-buffered stencil group per output, and by
Mullapudi2016 otherwise; a scheduled one runs as written; and every choice computes what numpy
computes."""

import halide as hl
import numpy as np
import pytest

import tcstage as tc
from tcstage.halide import _native

x, y = hl.Var("x"), hl.Var("y")
rng = np.random.default_rng(11)


def box_blur():
    """A 3x3 box blur in two passes over a float image with a clamped edge."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    bx, by = hl.Func("bx"), hl.Func("by")
    bx[x, y] = c[x - 1, y] + c[x, y] + c[x + 1, y]
    by[x, y] = bx[x, y - 1] + bx[x, y] + bx[x, y + 1]
    return inp, bx, by


def box_blurred(a):
    p = np.pad(a.astype(np.float64), 1, mode="edge")
    h = p[:, :-2] + p[:, 1:-1] + p[:, 2:]
    return h[:-2] + h[1:-1] + h[2:]


def matmul_with_scale():
    """out(i, j) = s * sum_k A(i, k) B(k, j): a reduction and a scalar Param."""
    a, b = hl.ImageParam(hl.Float(32), 2, "A"), hl.ImageParam(hl.Float(32), 2, "B")
    s = hl.Param(hl.Float(32), "s")
    k = hl.RDom([(0, a.width())])
    prod = hl.Func("prod")
    prod[x, y] = 0.0
    prod[x, y] += a[k, y] * b[x, k]
    out = hl.Func("out")
    out[x, y] = s * prod[x, y]
    return (a, b, s), out


def downsampled_blur():
    """box_blur read at every second pixel: a Func read at 2x is no stencil, so the pipeline
    is no single line-buffered group (the blur is a pass of its own)."""
    inp, bx, by = box_blur()
    down = hl.Func("down")
    down[x, y] = by[2 * x, 2 * y]
    return inp, down


def two_level_pyramid():
    """downsampled_blur twice over (each level the mean of two neighbours, read at 2x): two
    passes besides the output, a pyramid."""
    inp, bx, by = box_blur()
    levels = [by]
    for k in range(2):
        level = hl.Func(f"level{k}")
        level[x, y] = (levels[-1][2 * x, 2 * y] + levels[-1][2 * x + 1, 2 * y]) * 0.5
        levels.append(level)
    return inp, levels[-1]


def shared_passes():
    """Two outputs that both read two Funcs at rows and columns of their own (neither a
    downsampling): g and h are passes of their own, read by two strip groups."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    g, h = hl.Func("g"), hl.Func("h")
    g[x, y] = inp[x, y] * inp[x + 1, y] - inp[x, y + 1]
    h[x, y] = inp[x + 1, y + 1] * inp[x, y] + inp[x + 2, y]
    out1, out2 = hl.Func("out1"), hl.Func("out2")
    out1[x, y] = g[x, y] + g[x, y + 1] + h[x, y]
    out2[x, y] = g[x + 1, y] * h[x, y + 1]
    return [out1, out2]


def shared_passes_reference(a, h, w):
    a = a.astype(np.float64)
    g = a[:-1, :-1] * a[:-1, 1:] - a[1:, :-1]  # rows y, columns x: a[y, x]
    hh = a[1:-1, 1:-2] * a[:-2, :-3] + a[:-2, 2:-1]
    return [g[:h, :w] + g[1:h + 1, :w] + hh[:h, :w], g[:h, 1:w + 1] * hh[1:h + 1, :w]]


def two_level_pyramid_reference(a):
    b = box_blurred(a).astype(np.float64)
    for _ in range(2):
        h, w = b.shape
        b = (b[0:h - h % 2:2, 0:w - 1:2] + b[0:h - h % 2:2, 1:w:2]) * 0.5
    return b


def test_unscheduled_stencil_pipeline_gets_line_buffers_on_a_copy():
    inp, bx, by = box_blur()
    f = tc.from_halide(by, name="blur")
    a = rng.standard_normal((61, 83)).astype(np.float32)
    got = f(a, output_shape=a.shape)
    np.testing.assert_allclose(got, box_blurred(a), rtol=1e-5, atol=1e-5)
    lines = f.explain(a, output_shape=a.shape).splitlines()
    assert lines[0] == "CPU schedule: tcstage (planned for inp.0=61, inp.1=83, by.0=61, by.1=83)"
    assert "  by: strip root, y in parallel strips (32 rows), x in vectors" in lines
    assert "  bx: pointwise, a line buffer of by's strips, 1 deep, x in vectors" in lines
    # The caller's Funcs are still unscheduled: bx inlined, no split or loop type anywhere.
    assert _native.scheduled_functions([by]) == []
    assert bx.name() in _native.inlined_functions([by])


def test_unscheduled_pipeline_of_several_strip_groups_gets_mullapudi_on_a_copy():
    outs = shared_passes()
    f = tc.from_halide(outs, name="shared")
    a = rng.standard_normal((61, 83)).astype(np.float32)
    got = f(a, output_shape=[(58, 80), (58, 80)])
    for g, want in zip(got, shared_passes_reference(a, 58, 80)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    text = f.explain(a, output_shape=[(58, 80), (58, 80)])
    assert text.startswith("CPU schedule: Mullapudi2016 (planned for inp.0=61, inp.1=83")
    assert _native.scheduled_functions(outs) == []


def test_a_downsampling_pyramid_keeps_the_stencil_family():
    """Each level a pass of its own, read at 2x by the next (interpolate's pyramid): the
    levels are computed in strips, each level's horizontal pass a line buffer of it."""
    inp, down = two_level_pyramid()
    f = tc.from_halide(down, name="down")
    a = rng.standard_normal((61, 83)).astype(np.float32)
    np.testing.assert_allclose(f(a, output_shape=(15, 20)),
                               two_level_pyramid_reference(a)[:15, :20], rtol=1e-5, atol=1e-5)
    text = f.explain(a, output_shape=(15, 20))
    assert text.startswith("CPU schedule: tcstage (planned for inp.0=61, inp.1=83"), text


def test_a_downsampled_blur_is_a_line_buffer_of_its_reader():
    """A blur read at every other row and column (camera_pipe's denoised mosaic): its rows
    follow the reader's two at a time, so it is a line buffer of the output's strips; prime
    sizes."""
    inp, down = downsampled_blur()
    f = tc.from_halide(down, name="down")
    a = rng.standard_normal((61, 83)).astype(np.float32)
    np.testing.assert_allclose(f(a, output_shape=(30, 41)), box_blurred(a)[0:60:2, 0:82:2],
                               rtol=1e-5, atol=1e-5)
    text = f.explain(a, output_shape=(30, 41))
    assert text.startswith("CPU schedule: tcstage (planned for inp.0=61, inp.1=83")
    assert "down: strip root" in text and "by: pointwise, a line buffer of down's strips" in text


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (37, 2), (131, 257)])
def test_stencil_family_at_awkward_sizes(shape):
    """Strips of 32 rows or more (a strip as tall as the image where it is shorter), the last
    strip shifted up to end at the image's edge, vectors of fewer columns than lanes."""
    _, _, by = box_blur()
    f = tc.from_halide(by, name="blur")
    a = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(f(a, output_shape=shape), box_blurred(a), rtol=1e-5, atol=1e-5)
    assert f.last_cpu_kernel.schedule == "tcstage"


def test_estimates_of_the_callers_params_are_restored():
    (a_p, b_p, s), out = matmul_with_scale()
    a_p.set_estimates([(0, 5), (0, 7)])  # the caller's own estimates (x: 5 columns, y: 7 rows)
    f = tc.from_halide(out, name="mm")
    a = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal((24, 36)).astype(np.float32)
    got = f(a, b, 0.5, output_shape=(40, 36), schedule="Mullapudi2016")
    np.testing.assert_allclose(got, 0.5 * (a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)
    args = {arg.name: arg for arg in hl.Pipeline([out]).infer_arguments()}
    kept = args["A"].argument_estimates.buffer_estimates
    assert [(_native.to_tree(r.min), _native.to_tree(r.extent)) for r in kept] == \
        [(("int", 0), ("int", 5)), (("int", 0), ("int", 7))]
    assert not args["B"].argument_estimates.buffer_estimates[0].min.defined()


def test_scheduled_pipeline_runs_as_written():
    inp, bx, by = box_blur()
    by.vectorize(x, 8)
    bx.compute_at(by, y)
    f = tc.from_halide(by, name="blur")
    a = rng.standard_normal((20, 33)).astype(np.float32)
    np.testing.assert_allclose(f(a, output_shape=a.shape), box_blurred(a), rtol=1e-5,
                               atol=1e-5)
    assert f.explain(a, output_shape=a.shape) == "CPU schedule: as_written"


@pytest.mark.parametrize("schedule", ["root", "as_written", "mullapudi2016", "Adams2019",
                                      "tcstage"])
def test_every_schedule_computes_the_same(schedule):
    (_, _, _), out = matmul_with_scale()
    f = tc.from_halide(out, name="mm")
    a = rng.standard_normal((9, 13)).astype(np.float32)
    b = rng.standard_normal((13, 10)).astype(np.float32)
    got = f(a, b, 2.0, output_shape=(9, 10), schedule=schedule)
    np.testing.assert_allclose(got, 2.0 * (a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)
    name = {"mullapudi2016": "Mullapudi2016"}.get(schedule, schedule)
    assert f.explain(a, b, 2.0, output_shape=(9, 10), schedule=schedule).startswith(
        f"CPU schedule: {name}")


def test_reduction_pipeline_gets_the_structured_scheduler():
    (_, _, _), out = matmul_with_scale()
    f = tc.from_halide(out, name="mm")
    a = rng.standard_normal((50, 70)).astype(np.float32)
    b = rng.standard_normal((70, 90)).astype(np.float32)
    got = f(a, b, -1.5, output_shape=(50, 90))
    np.testing.assert_allclose(got, -1.5 * (a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)
    lines = f.explain(a, b, -1.5, output_shape=(50, 90)).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage (planned for A.0=50, A.1=70, B.0=70")
    assert any(line.startswith("  prod: reduction (add) over") and "held in registers" in line
               for line in lines), lines
    # The input wrappers (A_im, B_im) are inputs to the scheduler, not Funcs to compute.
    assert not any("_im:" in line for line in lines)
    # Sizes below its tiles (64 wide, ShiftInwards) get a kernel planned for them.
    for m, k, n in [(3, 2, 5), (1, 1, 1), (9, 70, 33)]:
        a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
        np.testing.assert_allclose(f(a, b, 2.0, output_shape=(m, n)),
                                   2.0 * (a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)


def test_stencil_family_plans_line_buffers_within_a_depth():
    """A chain of 3-tap stencils: each Func joins its reader's strips as a line buffer, up to
    STENCIL_DEPTH Funcs deep; the next one down starts strips of its own. Such a chain is
    still the stencil family's under auto (a chain read at 2x is not: see above)."""
    from tcstage.cpu.scheduler import STENCIL_DEPTH

    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    stages = [hl.BoundaryConditions.repeat_edge(inp)]
    for k in range(STENCIL_DEPTH + 2):
        s = hl.Func(f"s{k}")
        s[x, y] = stages[-1][x, y - 1] + stages[-1][x, y + 1] * 0.5
        stages.append(s)
    f = tc.from_halide(stages[-1], name="chain")
    a = rng.standard_normal((150, 45)).astype(np.float32)
    # (only the input has a boundary condition: each stage is computed 1 row further out
    # than its reader needs, from the edge-repeated input)
    want = np.pad(a.astype(np.float64), ((STENCIL_DEPTH + 2, STENCIL_DEPTH + 2), (0, 0)),
                  mode="edge")
    for _ in range(STENCIL_DEPTH + 2):
        want = want[:-2] + want[2:] * 0.5
    np.testing.assert_allclose(f(a, output_shape=a.shape, schedule="tcstage"), want, rtol=1e-4,
                               atol=1e-4)
    lines = f.explain(a, output_shape=a.shape, schedule="tcstage").splitlines()
    last, first_root = f"s{STENCIL_DEPTH + 1}", f"s{0}"
    # (a root with members DEEP_GROUP deep or more gets strips twice as tall)
    assert f"  {last}: strip root, y in parallel strips (64 rows), x in vectors" in lines
    assert f"  s1: pointwise, a line buffer of {last}'s strips, {STENCIL_DEPTH} deep, x in vectors" in lines
    assert f"  {first_root}: strip root, y in parallel strips (32 rows), x in vectors" in lines
    assert f.explain(a, output_shape=a.shape).startswith("CPU schedule: tcstage")


def test_structured_refusal_falls_back_to_mullapudi(monkeypatch):
    from tcstage.cpu.scheduler import NotScheduled
    from tcstage.halide import pipeline

    def refuse(*args, **kwargs):
        raise NotScheduled("no CPU schedule family for prod (a test)")

    monkeypatch.setattr(pipeline, "schedule_pipeline", refuse)
    (_, _, _), out = matmul_with_scale()
    f = tc.from_halide(out, name="mm")
    a = rng.standard_normal((6, 7)).astype(np.float32)
    b = rng.standard_normal((7, 8)).astype(np.float32)
    np.testing.assert_allclose(f(a, b, 1.0, output_shape=(6, 8)), a.astype(np.float64) @ b,
                               rtol=1e-4, atol=1e-4)
    assert f.explain(a, b, 1.0, output_shape=(6, 8)).split("\n")[1] == (
        "  note: no CPU schedule family for prod (a test); Mullapudi2016 scheduled it")


def test_smaller_sizes_after_a_schedule_planned_for_large_ones():
    """Mullapudi2016's splits, planned for 300x400, reach past a 2x3 image: those sizes get a
    schedule of their own, and the results stay right at both."""
    _, _, by = box_blur()
    f = tc.from_halide(by, name="blur")
    mullapudi = "Mullapudi2016"
    big = rng.standard_normal((300, 400)).astype(np.float32)
    np.testing.assert_allclose(f(big, output_shape=big.shape, schedule=mullapudi),
                               box_blurred(big), rtol=1e-5, atol=1e-5)
    for shape in [(2, 3), (1, 1), (17, 5)]:
        small = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(small, output_shape=shape, schedule=mullapudi),
                                   box_blurred(small), rtol=1e-5, atol=1e-5)
        # (the kernel planned for the first small sizes serves the later ones)
        assert f.explain(small, output_shape=shape, schedule=mullapudi).startswith(
            "CPU schedule: Mullapudi2016 (planned for inp.0=2, inp.1=3, by.0=2, by.1=3)\n"
            "  note: the schedule planned for other sizes failed")
    np.testing.assert_allclose(f(big, output_shape=big.shape, schedule=mullapudi),
                               box_blurred(big), rtol=1e-5, atol=1e-5)


def test_root_schedule_where_a_replanned_one_fails_too(monkeypatch):
    from tcstage.halide import pipeline

    _, _, by = box_blur()
    f = tc.from_halide(by, name="blur")
    big = rng.standard_normal((300, 400)).astype(np.float32)
    f(big, output_shape=big.shape, schedule="Mullapudi2016")  # (its splits do not fit 2x3)
    planned_for_small = f._cpu_kernel

    def failing(applied, b, shapes, failed=""):
        def call(*values):
            raise hl.HalideError("the replanned schedule fails too (a test)")
        return pipeline.CpuPipeline(call, applied, (), planned_for_small(
            applied, b, shapes, failed).note)

    monkeypatch.setattr(f, "_cpu_kernel", failing)
    small = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.warns(tc.TCWarning, match="computed at the root.*at these sizes.*fails too"):
        got = f(small, output_shape=small.shape, schedule="Mullapudi2016")
    np.testing.assert_allclose(got, box_blurred(small), rtol=1e-5, atol=1e-5)
    assert f.last_cpu_kernel.schedule == "root"


def test_failing_autoscheduler_falls_back_to_root_with_a_warning(monkeypatch):
    from tcstage.halide import pipeline

    def refuse(name):
        raise hl.HalideError(f"{name} refuses this pipeline")

    monkeypatch.setattr(pipeline, "_load_autoscheduler", refuse)
    f = tc.from_halide(shared_passes(), name="shared")
    a = rng.standard_normal((12, 9)).astype(np.float32)
    with pytest.warns(tc.TCWarning, match="Mullapudi2016 autoscheduler failed on it"):
        got = f(a, output_shape=[(9, 6), (9, 6)])
    for g, want in zip(got, shared_passes_reference(a, 9, 6)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    assert f.explain(a, output_shape=[(9, 6), (9, 6)]).startswith(
        "CPU schedule: root\n  note: the Mullapudi2016 autoscheduler failed")


def test_unknown_schedule_is_a_clear_error():
    _, _, by = box_blur()
    f = tc.from_halide(by, name="blur")
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(tc.TCError, match="schedule must be one of 'auto', 'as_written', 'root', "
                                         "'tcstage', 'Mullapudi2016'.*got 'fast'"):
        f(a, output_shape=a.shape, schedule="fast")


def test_stencil_family_with_a_tuple_producer():
    """A Tuple-valued producer read at offsets is a line buffer like any other."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    pair, out = hl.Func("pair"), hl.Func("out")
    pair[x, y] = (c[x, y] * 2, c[x + 1, y] + 1)
    out[x, y] = pair[x, y - 1][0] + pair[x, y + 1][1]
    f = tc.from_halide(out, name="pairs")
    a = rng.standard_normal((40, 33)).astype(np.float32)
    p = np.pad(a, 1, mode="edge")
    want = 2 * p[:-2, 1:-1] + (p[2:, 2:] + 1)
    got = f(a, output_shape=a.shape, schedule="tcstage")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    lines = f.explain(a, output_shape=a.shape, schedule="tcstage").splitlines()
    assert "  pair: pointwise, a line buffer of out's strips, 1 deep, x in vectors" in lines


@pytest.mark.parametrize("shape", [(40, 50), (7, 3), (33, 17)])
def test_stencil_family_schedules_in_place_updates_too(shape):
    """A strip root and a line buffer with in-place updates: the updates get the same loops,
    guarded at the edges, where an update may not recompute (left unscheduled, Halide warned
    on stderr about each), and the values stay right at sizes that end strips and vectors
    early."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    a, b = hl.Func("a"), hl.Func("b")
    a[x, y] = c[x, y - 1] + c[x, y + 1]
    a[x, y] = a[x, y] * 2
    b[x, y] = a[x, y - 1] + a[x, y + 1]
    b[x, y] = hl.max(b[x, y], 0)
    f = tc.from_halide(b, name="updates")
    arr = rng.standard_normal(shape).astype(np.float32)
    got = f(arr, output_shape=shape)
    p = np.pad(arr.astype(np.float64), 2, mode="edge")[:, 2:-2]
    doubled = (p[:-2] + p[2:]) * 2
    np.testing.assert_allclose(got, np.maximum(doubled[:-2] + doubled[2:], 0), rtol=1e-5,
                               atol=1e-5)
    assert f.last_cpu_kernel.schedule == "tcstage"


def separable_window_sum(taps: hl.Param):
    """A separable box of `taps` taps (an RDom extent known only at run time) written with
    hl.sum, whose anonymous Funcs list their variables in the order the expression mentions
    them: the vertical pass's Func is (y, x), not (x, y)."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    r = hl.RDom([(0, taps)])
    weights = hl.Func("weights")
    weights[x] = hl.f32(1.0) / hl.f32(x + 1)
    down = hl.Func("down")
    down[x, y] = hl.sum(weights[r.x] * c[x, y + r.x], "down_sum")  # the sum lists (x, y)...
    across = hl.Func("across")
    across[x, y] = hl.sum(down[x + r.x, y] * weights[r.x], "across_sum")
    col = hl.Func("col")
    col[x, y] = hl.sum(weights[r.x] * across[x, y - r.x], "col_sum")
    return inp, col


def separable_window_summed(a, taps):
    h, w = a.shape
    weights = 1.0 / (np.arange(taps) + 1)
    p = a.astype(np.float64)

    def at(rows, cols):
        return p[np.clip(rows, 0, h - 1)][:, np.clip(cols, 0, w - 1)]

    ext_rows = np.arange(-taps + 1, h + taps)  # every row any pass reads, unclamped
    ext_cols = np.arange(0, w + taps)
    down = sum(weights[k] * at(ext_rows + k, ext_cols) for k in range(taps))
    across = sum(weights[k] * down[:, k:k + w] for k in range(taps))
    first = taps - 1  # across's row i is ext_rows[i] = i - (taps - 1)
    return sum(weights[k] * across[first - k:first - k + h] for k in range(taps))


@pytest.mark.parametrize("shape", [(61, 83), (5, 3), (37, 131)])
def test_window_reductions_get_the_stencil_family(shape):
    """Sums over a tap window (an RDom of a run-time extent) join line buffers as pointwise
    stencils do: each is computed a row at a time, its vector of sums accumulated over the
    taps; the weights, a table read at the tap alone, are computed once."""
    taps = hl.Param(hl.Int(32), "taps")
    _, col = separable_window_sum(taps)
    f = tc.from_halide(col, name="windows")
    a = rng.standard_normal(shape).astype(np.float32)
    got = f(a, 3, output_shape=shape)
    np.testing.assert_allclose(got, separable_window_summed(a, 3), rtol=1e-5, atol=1e-5)
    lines = f.explain(a, 3, output_shape=shape).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage (planned for")
    assert "  weights: pointwise, computed once" in lines[1:] or \
        any(line.startswith("  weights: pointwise, computed once") for line in lines)
    windows = [line for line in lines if "a window reduction, a line buffer of" in line]
    assert len(windows) == 3, lines
    if shape[1] >= 16:
        assert all(line.endswith("x in vectors") for line in windows), windows
    # another tap count, the same kernel
    np.testing.assert_allclose(f(a, 5, output_shape=shape), separable_window_summed(a, 5),
                               rtol=1e-5, atol=1e-5)


def test_window_reduction_of_a_permuted_sum_is_vectorised_along_the_readers_columns():
    """hl.sum over `weights[r] * c[x, y + r]` makes a Func of (x, y); over `w[r] * c[y + r, x]`
    (a transposed read) one whose first variable is the reader's row: the family vectorises
    the dimension its reader reads along its columns, and stores it innermost."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    r = hl.RDom([(0, 3)])
    w = hl.Func("w")
    w[x] = hl.f32(x + 1)
    rows = hl.Func("rows")
    rows[x, y] = hl.sum(w[r.x] * c[x, y + r.x], "rows_sum")
    out = hl.Func("out")
    # (y, x) order: the anonymous Func of this sum is (y, x)
    out[x, y] = hl.sum(w[r.x] * rows[x, y - r.x] + hl.f32(0) * hl.f32(y), "out_sum") + \
        hl.sum(hl.f32(y) * 0 + rows[x + r.x, y] * w[r.x], "out_sum2")
    f = tc.from_halide(out, name="permuted")
    a = rng.standard_normal((40, 70)).astype(np.float32)
    h, wd = a.shape
    p = a.astype(np.float64)
    wts = np.arange(3) + 1.0

    def rows_at(i, j):
        return sum(wts[k] * p[np.clip(i + k, 0, h - 1)][:, np.clip(j, 0, wd - 1)] for k in range(3))

    ii, jj = np.arange(h), np.arange(wd)
    want = sum(wts[k] * rows_at(ii - k, jj) for k in range(3)) + \
        sum(wts[k] * rows_at(ii, jj + k) for k in range(3))
    np.testing.assert_allclose(f(a, output_shape=a.shape), want, rtol=1e-5, atol=1e-4)
    assert f.last_cpu_kernel.schedule == "tcstage"


def test_a_row_of_channels_shares_a_line_buffer_without_channels():
    """unsharp's shape: a 2-D ratio read by a 3-D output at (x, y) is a line buffer of the
    output's strips, computed once per row for all channels (the channels run inside the
    row)."""
    inp = hl.ImageParam(hl.Float(32), 3, "rgb")
    c = hl.BoundaryConditions.repeat_edge(inp)
    gray, blurred, out = hl.Func("gray"), hl.Func("blurred"), hl.Func("out")
    ch = hl.Var("ch")
    gray[x, y] = c[x, y, 0] + c[x, y, 1] + c[x, y, 2]
    blurred[x, y] = gray[x, y - 1] + gray[x, y] + gray[x, y + 1]
    out[x, y, ch] = blurred[x, y] * inp[x, y, ch]
    f = tc.from_halide(out, name="shade")
    a = rng.standard_normal((3, 45, 70)).astype(np.float32)
    g = a.astype(np.float64).sum(axis=0)
    gp = np.pad(g, ((1, 1), (0, 0)), mode="edge")
    want = (gp[:-2] + gp[1:-1] + gp[2:])[None] * a
    np.testing.assert_allclose(f(a, output_shape=a.shape), want, rtol=1e-5, atol=1e-4)
    lines = f.explain(a, output_shape=a.shape).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage")
    assert "  blurred: pointwise, a line buffer of out's strips, 1 deep, x in vectors" in lines
    # (gray: two sums of an input's channels, read at three rows: cheaper recomputed)
    assert "  gray: cheap, inlined into its readers" in lines


@pytest.mark.parametrize("subscript, joins", [
    (lambda v: v, True), (lambda v: v + 2, True), (lambda v: v - 1, True),
    (lambda v: v / 2, True), (lambda v: hl.clamp(v, 0, 9), False),
    (lambda v: 2 * v, True), (lambda v: v * v, False), (lambda v: 9 - v, False)])
def test_line_buffers_take_producers_whose_rows_follow_their_readers(subscript, joins):
    """A producer joins its reader's strips where the rows it is read at advance with the
    reader's (a shift, an upsampling y / 2, a downsampling 2 y); rows that go back, or clamped
    rows (Halide 21's sliding window skipped rows there: fuzz seed 952095) start strips of
    their own."""
    from tcstage.cpu.scheduler import plan_stencils
    from tcstage.cpu.structure import analyse
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    prod, out = hl.Func("prod"), hl.Func("out")
    prod[x, y] = c[x, y] * 2 + c[x + 1, y]
    out[x, y] = prod[x, subscript(y)] + prod[x + 1, subscript(y)]
    plan = plan_stencils(analyse([out], {prod.name(), out.name()}), {out.name()})
    assert (prod.name() in plan.members) is joins, plan


def test_halide_pipeline_writes_into_out_arrays():
    """out= as numpy's: the call writes the arrays given (their shapes give the output's, so
    output_shape= is not needed) and returns them; wrong ones are clear errors; an array not
    aligned for Halide's vector loads is written through a copy."""
    from tcstage.errors import TCArgumentError
    _, _, by = box_blur()
    f = tc.from_halide(by, name="blur")
    a = rng.standard_normal((40, 50)).astype(np.float32)
    out = np.full((40, 50), np.nan, np.float32)
    got = f(a, out=out)
    assert got is out
    np.testing.assert_allclose(out, box_blurred(a), rtol=1e-5, atol=1e-5)
    raw = np.zeros(40 * 50 + 1, np.float32)
    unaligned = raw[1:].reshape(40, 50)
    assert f(a, out=unaligned) is unaligned
    np.testing.assert_allclose(unaligned, box_blurred(a), rtol=1e-5, atol=1e-5)
    for bad, message in [(np.zeros((40, 50), np.float64), r"out\[0\] .* must be a float32 array "
                                                           r"of shape \(40, 50\); got float64"),
                         (np.zeros((50, 40), np.float32).T, "writeable C-order"),
                         ([out, out], r"needs 1 array\(s\)")]:
        with pytest.raises(TCArgumentError, match=message):
            f(a, out=bad, output_shape=(40, 50))


def test_scatters_and_scans_are_computed_once_beside_line_buffers():
    """hist's shape: a histogram per row (a scatter, its update in parallel along the rows it
    writes at their own point), summed over rows, a cumulative sum (a scan, serial), read
    through a lookup by an output in strips."""
    inp = hl.ImageParam(hl.UInt(8), 2, "img")
    edge = hl.BoundaryConditions.repeat_edge(inp)
    level = hl.Func("level")
    level[x, y] = hl.i32(edge[x, y]) // 4  # 64 bins
    rows = hl.Func("rows")
    rows[x, y] = 0
    rx = hl.RDom([(0, inp.width())], "rx")
    rows[hl.clamp(level[rx.x, y], 0, 63), y] += 1
    counts = hl.Func("counts")
    counts[x] = 0
    ry = hl.RDom([(0, inp.height())], "ry")
    counts[x] += rows[x, ry.x]
    cdf = hl.Func("cdf")
    cdf[x] = counts[0]
    b = hl.RDom([(1, 63)], "b")
    cdf[b.x] = cdf[b.x - 1] + counts[b.x]
    smooth = hl.Func("smooth")
    smooth[x, y] = level[x, y] * level[x, y]
    out = hl.Func("out")
    out[x, y] = cdf[hl.clamp(level[x, y], 0, 63)] + smooth[x, y - 1] + 2 * smooth[x, y + 1]
    f = tc.from_halide(out, name="equalise")
    for shape in [(37, 83), (64, 130)]:
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        levels = a.astype(np.int64) // 4
        cumulative = np.cumsum(np.bincount(levels.ravel(), minlength=64))
        padded = np.pad(levels, ((1, 1), (0, 0)), mode="edge")
        want = cumulative[levels] + padded[:-2] ** 2 + 2 * padded[2:] ** 2
        got = f(a, output_shape=shape)
        np.testing.assert_array_equal(got, want)
    lines = f.explain(a, output_shape=a.shape).splitlines()
    assert lines[0].startswith("CPU schedule: tcstage")
    assert "  rows: a scatter or scan, computed once, its update in parallel along y" in lines
    assert "  cdf: a scatter or scan, computed once" in lines
    assert "  smooth: pointwise, a line buffer of out's strips, 1 deep, x in vectors" in lines
    # the RDoms over the image's width and height are not compiled in: each new size would
    # compile anew, for nothing
    assert not any("compiled in" in line for line in lines), lines


def test_sizes_that_shape_the_computation_are_compiled_in_and_replanned_when_they_change():
    """A filter's extent (an RDom over it) and a channel multiplier (a subscript divided by an
    input's extent) are compiled into the structured schedule as constants, so Halide sees
    dense vectors and fixed trip counts; a call with other values gets code of its own (and
    the first code is used again for the first values)."""
    image = hl.ImageParam(hl.Float(32), 2, "image")
    weights = hl.ImageParam(hl.Float(32), 2, "weights")  # (taps, multiplier) in numpy order
    c = hl.Var("c")
    edge = hl.BoundaryConditions.repeat_edge(image)
    r = hl.RDom([(0, weights.dim(1).extent())], "tap")
    out = hl.Func("out")
    out[c, x] = 0.0
    out[c, x] += weights[c % weights.dim(0).extent(), r.x] * edge[c / weights.dim(0).extent(), x + r.x]
    f = tc.from_halide(out, name="depthwise")

    def reference(img, w):
        m, taps = w.shape[1], w.shape[0]
        n, ch = img.shape
        want = np.zeros((n, ch * m))
        for xx in range(n):
            for cc in range(ch * m):
                for t in range(taps):
                    want[xx, cc] += w[t, cc % m] * img[min(xx + t, n - 1), cc // m]
        return want

    img = rng.standard_normal((40, 16)).astype(np.float32)
    for w in [rng.standard_normal((3, 1)).astype(np.float32),
              rng.standard_normal((5, 2)).astype(np.float32),
              rng.standard_normal((3, 1)).astype(np.float32)]:
        shape = (40, 16 * w.shape[1])
        np.testing.assert_allclose(f(img, w, output_shape=shape, schedule="tcstage"),
                                   reference(img, w), rtol=1e-5, atol=1e-5)
        text = f.explain(img, w, output_shape=shape, schedule="tcstage")
        assert text.startswith("CPU schedule: tcstage"), text
        assert f"sizes compiled in as constants: weights.0={w.shape[0]}, " \
               f"weights.1={w.shape[1]}" in text, text
    assert "holds weights.0=3, weights.1=1 as constants" in f.explain(
        img, rng.standard_normal((5, 2)).astype(np.float32), output_shape=(40, 32),
        schedule="tcstage")
