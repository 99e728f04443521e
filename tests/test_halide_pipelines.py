"""Halide pipelines built in Python through tc.from_halide: the CPU path (Halide's JIT) and the
polyhedral CUDA path (emulated here; every kernel also goes through nvcc, see conftest.py),
each construct of the supported subset checked against numpy written independently of Halide.
"""

import warnings

import halide as hl
import numpy as np
import pytest

import tcstage as tc
from tcstage.errors import TCArgumentError, TCError

x, y = hl.Var("x"), hl.Var("y")
rng = np.random.default_rng(7)

OPTIONS = [
    None,
    tc.MappingOptions().tile(4, 8).mapToThreads(8, 4).mapToBlocks(4, 4),
    tc.MappingOptions().tile(8, 8).mapToThreads(8, 2).mapToBlocks(2, 2).useSharedMemory(True),
    tc.MappingOptions().scheduleFusionStrategy("Max").tile(4, 4).mapToThreads(4, 4)
    .usePrivateMemory(True).unroll(4),
]


def check(f, args, output_shape, expected, options=OPTIONS, rtol=0.0):
    """The CPU call and the emulated CUDA kernel of f, under every option set, equal expected."""
    expected = expected if isinstance(expected, tuple) else (expected,)

    def same(got):
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            if rtol:
                np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol)
            else:
                np.testing.assert_array_equal(g, e)

    same(f(*args, output_shape=output_shape))
    for o in options:
        k = tc.compile(f, *args, output_shape=output_shape, options=o, target="cuda-emulated")
        same(k(*args))


def u8(*shape):
    return rng.integers(0, 256, shape).astype(np.uint8)


def blur():
    """A 3x3 separable blur of a uint8 image with its edge repeated: a fresh pipeline."""
    inp = hl.ImageParam(hl.UInt(8), 2, "inp")
    c = hl.BoundaryConditions.repeat_edge(inp)
    bx, by = hl.Func("bx"), hl.Func("by")
    bx[x, y] = (hl.u16(c[x - 1, y]) + c[x, y] + c[x + 1, y]) // 3
    by[x, y] = hl.u8((bx[x, y - 1] + bx[x, y] + bx[x, y + 1]) // 3)
    return tc.from_halide(by, name="blur")


def blurred(a):
    p = np.pad(a.astype(np.uint16), 1, mode="edge")
    h = (p[:, :-2] + p[:, 1:-1] + p[:, 2:]) // 3
    return ((h[:-2] + h[1:-1] + h[2:]) // 3).astype(np.uint8)


def test_blur_with_repeat_edge_keeps_the_size():
    a = u8(11, 13)
    check(blur(), [a], (11, 13), blurred(a))


@pytest.mark.parametrize("kind", ["constant_exterior", "mirror_image", "mirror_interior"])
def test_boundary_conditions(kind):
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    c = hl.BoundaryConditions.constant_exterior(inp, 0.5) if kind == "constant_exterior" \
        else getattr(hl.BoundaryConditions, kind)(inp)
    out = hl.Func("out")
    out[x, y] = c[x - 2, y] * 2 + c[x + 1, y - 3]
    a = rng.standard_normal((7, 9)).astype(np.float32)
    mode = {"constant_exterior": "constant", "mirror_image": "symmetric",
            "mirror_interior": "reflect"}[kind]
    extra = {"constant_values": 0.5} if kind == "constant_exterior" else {}
    p = np.pad(a, 4, mode=mode, **extra)  # p[i + 4, j + 4] is a(i, j) extended
    H, W = 7, 9
    ref = np.empty((H, W), np.float32)
    for i in range(H):
        for j in range(W):
            ref[i, j] = p[i + 4, j - 2 + 4] * 2 + p[i - 3 + 4, j + 1 + 4]
    check(tc.from_halide(out), [a], (H, W), ref, rtol=1e-6)


def test_update_with_rdom_shrinks_the_output():
    inp = hl.ImageParam(hl.Int(32), 2, "inp")
    box = hl.Func("box")
    r = hl.RDom([(0, 3), (0, 3)])
    box[x, y] = 0
    box[x, y] += inp[x + r.x, y + r.y]
    a = rng.integers(-50, 50, (9, 10)).astype(np.int32)
    ref = sum(a[i:i + 7, j:j + 8] for i in range(3) for j in range(3)).astype(np.int32)
    check(tc.from_halide(box), [a], (7, 8), ref)


def test_predicated_rdom():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    r = hl.RDom([(0, 10)])
    r.where(r.x <= x)  # a prefix sum
    r.where(r.x % 2 == 0)  # of the even elements
    s = hl.Func("s")
    s[x] = 0.0
    s[x] += inp[r.x]
    a = rng.standard_normal(10).astype(np.float32)
    ref = np.array([sum(a[k] for k in range(0, i + 1, 2)) for i in range(10)], np.float32)
    check(tc.from_halide(s), [a], (10,), ref, rtol=1e-5)


def test_quasi_affine_subscripts():
    inp = hl.ImageParam(hl.Int(16), 1, "inp")
    down, up = hl.Func("down"), hl.Func("up")
    down[x] = inp[2 * x] + inp[2 * x + 1]
    up[x] = hl.select(x % 2 == 0, down[x // 2], down[x // 2] * 3)
    a = rng.integers(-100, 100, 16).astype(np.int16)
    d = (a[0::2] + a[1::2]).astype(np.int16)
    ref = np.array([d[i // 2] if i % 2 == 0 else d[i // 2] * 3 for i in range(16)], np.int16)
    check(tc.from_halide(up), [a], (16,), ref)


def test_clamp_select_min_max_and_casts():
    inp = hl.ImageParam(hl.UInt(8), 2, "inp")
    out = hl.Func("out")
    v = hl.f32(inp[hl.clamp(x - 1, 0, 5), hl.min(y, 3)])
    out[x, y] = hl.i16(hl.select(v > 100, hl.max(v - 100, 7.5), v * 0.5))
    a = u8(4, 6)
    ref = np.empty((5, 8), np.int16)
    for i in range(5):
        for j in range(8):
            v = np.float32(a[min(i, 3), min(max(j - 1, 0), 5)])
            ref[i, j] = np.int16(max(v - 100, 7.5) if v > 100 else v * np.float32(0.5))
    check(tc.from_halide(out), [a], (5, 8), ref)


def test_data_dependent_read_is_a_gather():
    inp = hl.ImageParam(hl.UInt(8), 2, "inp")
    lut = hl.ImageParam(hl.Float(32), 1, "lut")
    out = hl.Func("out")
    out[x, y] = lut[hl.i32(inp[x, y]) // 4] + lut[hl.clamp(hl.i32(inp[x, y]), 0, 63)]
    a, t = u8(6, 10), rng.standard_normal(64).astype(np.float32)
    ref = t[a.astype(int) // 4] + t[np.minimum(a, 63)]
    check(tc.from_halide(out), [a, t], (6, 10), ref, rtol=1e-6)


def test_scalar_params_by_position_and_name():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    shift, scale = hl.Param(hl.Int(32), "shift"), hl.Param(hl.Float(32), "scale")
    out = hl.Func("out")
    out[x] = inp[x + shift] * scale
    f = tc.from_halide(out)
    assert [a.name for a in f.arguments] == ["inp", "scale", "shift"]  # infer_arguments order
    a = rng.standard_normal(12).astype(np.float32)
    check(f, [a, 1.5, 3], (9,), a[3:12] * np.float32(1.5))
    np.testing.assert_array_equal(f(scale=2.0, shift=1, inp=a, output_shape=(4,)), a[1:5] * 2)
    k = tc.compile(f, a, 0.5, 1, output_shape=(4,), target="cuda-emulated")
    np.testing.assert_array_equal(k(a, 0.5, 1), a[1:5] * np.float32(0.5))
    # every Param is fixed in a kernel (regions may depend on any: bilateral_grid's 1/r_sigma)
    with pytest.raises(TCArgumentError, match=r"compiled for inp.0=12, scale=0.5, shift=1; "
                                              r"the arguments give inp.0=12, scale=2.0"):
        k(a, 2.0, 1)


def test_several_outputs():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    s, d = hl.Func("s"), hl.Func("d")
    s[x] = inp[x] + inp[x + 1]
    d[x] = inp[x] - inp[x + 1]
    a = rng.standard_normal(8).astype(np.float32)
    check(tc.from_halide([s, d]), [a], [(7,), (7,)], (a[:-1] + a[1:], a[:-1] - a[1:]))


def test_histogram_data_dependent_write():
    # the updates may collide, so the dependences keep them in order: correct on every option
    inp = hl.ImageParam(hl.UInt(8), 2, "inp")
    hist, out = hl.Func("hist"), hl.Func("out")
    r = hl.RDom([(0, inp.width()), (0, inp.height())])
    hist[x] = 0
    hist[hl.i32(inp[r.x, r.y]) // 32] += 1
    out[x] = hist[x] * 2 + hist[7 - x]
    a = u8(9, 7)
    h = np.bincount(a.ravel() // 32, minlength=8).astype(np.int32)
    check(tc.from_halide(out), [a], (8,), h * 2 + h[::-1])


def test_per_row_histograms_run_in_parallel_over_rows():
    inp = hl.ImageParam(hl.UInt(8), 2, "inp")
    rows = hl.Func("rows")
    r = hl.RDom([(0, inp.width())])
    rows[x, y] = 0.0
    rows[hl.clamp(hl.i32(inp[r.x, y]) // 32, 0, 7), y] += hl.f32(inp[r.x, y]) * 0.5
    a = u8(9, 7)
    expected = np.zeros((9, 8), np.float32)
    for i in range(9):
        for j in range(7):
            expected[i, a[i, j] // 32] += a[i, j] * np.float32(0.5)
    f = tc.from_halide(rows)
    check(f, [a], (9, 8), expected)
    k = tc.compile(f, a, output_shape=(9, 8), target="cuda-emulated",
                   options=tc.MappingOptions().tile(4, 8).mapToThreads(4, 4))
    assert k.block[0] == 4  # rows split across threads; each row's updates stay in order


def test_multi_stage_pipeline_with_reduction_and_pointwise():
    # conv + relu, as conv_layer: an RDom over channels and a 3x3 window
    inp = hl.ImageParam(hl.Float(32), 3, "inp")  # (c, y, x)
    w = hl.ImageParam(hl.Float(32), 4, "w")  # (k, c, ry, rx)
    k = hl.Var("k")
    r = hl.RDom([(0, 3), (0, 3), (0, 2)])
    conv, relu = hl.Func("conv"), hl.Func("relu")
    conv[x, y, k] = 0.0
    conv[x, y, k] += w[r.x, r.y, r.z, k] * inp[x + r.x, y + r.y, r.z]
    relu[x, y, k] = hl.max(conv[x, y, k], 0.0)
    a = rng.standard_normal((2, 6, 7)).astype(np.float32)
    wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    ref = np.zeros((3, 4, 5), np.float32)
    for kk in range(3):
        for i in range(4):
            for j in range(5):
                ref[kk, i, j] = np.sum(wt[kk] * a[:, i:i + 3, j:j + 3])
    check(tc.from_halide(relu), [a, wt], (3, 4, 5), np.maximum(ref, 0), rtol=1e-5)


# -- bad input ----------------------------------------------------------------------------------


def _shift():
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    out = hl.Func("out")
    out[x, y] = inp[x + 1, y]
    return tc.from_halide(out)


@pytest.mark.parametrize("args, named, output_shape, message", [
    ([np.zeros((3, 4), np.float64)], {}, (3, 3),
     r"argument 'inp' .* holds float32; got an array of float64"),
    ([np.zeros(4, np.float32)], {}, (3, 3),
     r"argument 'inp' .* has 2 dimension\(s\); got shape \(4,\)"),
    ([], {}, (3, 3), r"missing argument\(s\) inp"),
    ([], {"img": np.zeros((3, 4), np.float32)}, (3, 3), r"no argument 'img'"),
    ([np.zeros((3, 4), np.float32)] * 2, {}, (3, 3), r"takes 1 argument"),
    ([np.zeros((3, 4), np.float32)], {}, None, r"give the size of its output with output_shape"),
    ([np.zeros((3, 4), np.float32)], {}, (3,), r"output 'out' .* has 2 dimension\(s\)"),
    ([np.zeros((3, 4), np.float32)], {}, (3, 4), r"reads input 'inp' at indices 1..4 along "
                                                  r"dimension 1 .* shape \(3, 4\)"),
    ([3.0], {}, (3, 3), r"argument 'inp' is an input buffer of float32; expected an array"),
])
def test_bad_bindings_name_the_parameter(args, named, output_shape, message):
    f = _shift()
    with pytest.raises(TCArgumentError, match=message):
        f(*args, output_shape=output_shape, **named)
    if named or output_shape is None or not args:
        return
    with pytest.raises(TCArgumentError, match=message):
        tc.compile(f, *args, output_shape=output_shape, target="cuda-emulated")


def test_bad_scalar_binding():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    n = hl.Param(hl.Int(32), "n")
    out = hl.Func("out")
    out[x] = inp[x] * hl.f32(n)
    f = tc.from_halide(out)
    with pytest.raises(TCArgumentError, match=r"argument 'n' .* is int32; got float 1.5"):
        f(np.ones(3, np.float32), 1.5, output_shape=(3,))


def test_bounds_are_inferred_once_per_call_layout(monkeypatch):
    """Halide's bounds inference (milliseconds) runs on the first call with given sizes, Param
    values and output shape; a later call with the same ones skips it, and one that changes any
    of them is checked again (here a Param moves the read past the input)."""
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    shift = hl.Param(hl.Int(32), "shift")
    out = hl.Func("out")
    out[x] = inp[x + shift] * 2
    f = tc.from_halide(out)
    inferred = []
    real = type(f).required_regions
    monkeypatch.setattr(type(f), "required_regions",
                        lambda self, *a: inferred.append(a) or real(self, *a))
    a = np.arange(8, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(f(a, 2, output_shape=(5,)), 2 * a[2:7])
    assert len(inferred) == 1
    np.testing.assert_array_equal(f(a[::-1].copy(), 2, output_shape=(5,)), 2 * a[::-1][2:7])
    assert len(inferred) == 1  # (new values, the same layout)
    with pytest.raises(TCArgumentError, match=r"reads input 'inp' at indices 4..8"):
        f(a, 4, output_shape=(5,))
    with pytest.raises(TCArgumentError, match=r"reads input 'inp' at indices 2..8"):
        f(a, 2, output_shape=(7,))
    with pytest.raises(TCArgumentError, match=r"reads input 'inp' at indices 2..6"):
        f(a[:6], 2, output_shape=(5,))
    assert len(inferred) == 4


def test_not_a_func():
    with pytest.raises(TCError, match="takes one halide.Func or a list of them; got str"):
        tc.from_halide("blur")
    with pytest.raises(TCError, match="Func 'g' has no definition"):
        tc.from_halide(hl.Func("g"))


def test_tuple_funcs_inside_a_pipeline_run_on_cuda():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    t, out = hl.Func("t"), hl.Func("out")
    t[x] = (inp[x], inp[x] * 2)
    out[x] = t[x][0] + t[x][1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)  # (nothing the CUDA path refuses)
        f = tc.from_halide(out)
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(f(a, output_shape=(4,)), a * 3)
    k = tc.compile(f, a, output_shape=(4,), target="cuda-emulated")
    np.testing.assert_array_equal(k(a), a * 3)


# -- printing ------------------------------------------------------------------------------------


def test_describe_and_kernel_describe():
    f = _shift()
    text = f.describe()
    assert "Func out (float32)" in text and "out(x, y) = inp_im(x + 1, y)" in text, text
    assert repr(f) == "<Halide pipeline out(float32(inp.0, inp.1) inp) -> (out)>"
    k = tc.compile(f, (3, 4), output_shape=(3, 3), target="cuda-emulated",
                   options=tc.MappingOptions().mapToThreads(3))
    lowered = f.specialized((3, 3)).lower((3, 4))
    assert "Func out (output, float32) over [0..2, 0..2]" in lowered.describe()
    assert k.describe().startswith("kernel: ") and "threads: block (3, 1, 1)" in k.describe()
    assert "S0: out" in k.cuda_source and "inp[" in k.cuda_source
    assert "threadIdx.x" in k.explain()


# -- tuning --------------------------------------------------------------------------------------


def test_autotune_a_pipeline_and_compile_auto():
    f = blur()
    a = u8(16, 24)
    res = tc.autotune(f, a, output_shape=(16, 24), measure="model", budget=6, progress=False)
    assert res.checked and res.measured_on == "model" and res.time > 0
    assert {c.status for c in res.history} <= {"ok", "pruned", "compile_error"}
    expected = blurred(a)
    k = tc.compile(f, a, output_shape=(16, 24), options="auto", target="cuda-emulated")
    assert str(k.options) == str(res.options)  # the tuned options, from the cache
    np.testing.assert_array_equal(k(a), expected)
    # a pipeline built again (new Halide names) is the same pipeline for the cache
    k2 = tc.compile(blur(), a, output_shape=(16, 24), options="auto", target="cuda-emulated")
    assert str(k2.options) == str(res.options)


def test_data_dependent_read_gets_two_stage_promotion():
    idx = hl.ImageParam(hl.Int(32), 1, "idx")
    tab = hl.ImageParam(hl.Float(32), 2, "tab")
    out = hl.Func("out")
    r = hl.RDom([(0, 16)])
    out[x, y] = 0.0
    out[x, y] += tab[x, 1 + hl.clamp(idx[y], 0, 30)] * r.x  # the paper's O(1 + Idx(i), k)
    a = rng.integers(0, 31, 16).astype(np.int32)
    t = rng.standard_normal((32, 64)).astype(np.float32)
    f = tc.from_halide(out)
    k = tc.compile(f, a, t, output_shape=(16, 64), target="cuda-emulated",
                   options=tc.MappingOptions().tile(4, 32).mapToThreads(32, 4)
                   .useSharedMemory(True).usePrivateMemory(True))
    assert "shared tab: shared_tab[4][33] float32, tile 4 x 32 gathered through idx" \
        in k.describe()
    expected = t[1 + a] * np.float32(sum(range(16)))
    np.testing.assert_allclose(k(a, t), expected, rtol=1e-6)
    np.testing.assert_allclose(f(a, t, output_shape=(16, 64)), expected, rtol=1e-6)


def test_unbounded_data_dependent_read_is_an_error():
    idx = hl.ImageParam(hl.Int(32), 1, "idx")
    tab = hl.ImageParam(hl.Float(32), 1, "tab")
    out = hl.Func("out")
    out[x] = tab[idx[x]]  # Halide needs the subscript bounded (clamped) to size 'tab'
    f = tc.from_halide(out)
    with pytest.raises(TCError, match=r"gives 'tab' a region that is not a constant "
                                      r"\(unbounded\).*clamp them"):
        f(np.zeros(4, np.int32), np.zeros(8, np.float32), output_shape=(4,))


def test_inline_reductions_scalar_outputs_wrappers_bools_and_half():
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    a = rng.standard_normal((5, 6)).astype(np.float32)
    r = hl.RDom([(0, inp.height())])
    m = hl.Func("m")  # hl.sum / hl.maximum make anonymous Funcs with updates
    m[x] = hl.sum(inp[x, r.x] * 2) + hl.maximum(inp[x, r.x])
    check(tc.from_halide(m), [a], (6,), (a * 2).sum(0) + a.max(0), rtol=1e-5)
    everything = hl.RDom([(0, inp.width()), (0, inp.height())])
    total = hl.Func("total")  # a rank-0 output
    total[()] = 0.0
    total[()] += inp[everything.x, everything.y]
    check(tc.from_halide(total), [a], (), np.array(a.sum(), np.float32), options=[None],
          rtol=1e-5)
    plus = hl.Func("plus")  # through a Func.in_() wrapper, inlined like a boundary view
    plus[x, y] = inp.in_()[x, y] + 1
    check(tc.from_halide(plus), [a], (5, 6), a + 1, options=OPTIONS[:2])
    positive, sign = hl.Func("positive"), hl.Func("sign")  # a bool tensor
    positive[x] = inp[x, 0] > 0
    sign[x] = hl.select(positive[x], 1.0, -1.0)
    check(tc.from_halide(sign), [a], (6,), np.where(a[0] > 0, 1, -1).astype(np.float32),
          options=OPTIONS[:2])
    h = hl.ImageParam(hl.Float(16), 1, "h")
    twice = hl.Func("twice")
    twice[x] = h[x] * 2
    halves = rng.standard_normal(8).astype(np.float16)
    check(tc.from_halide(twice), [halves], (8,), halves * np.float16(2), options=OPTIONS[:2])


def test_halide_intrinsics():
    fi = hl.ImageParam(hl.Float(32), 1, "fi")
    ii = hl.ImageParam(hl.Int(32), 1, "ii")
    ui = hl.ImageParam(hl.UInt(8), 1, "ui")
    a = (rng.random(8) + 0.1).astype(np.float32)
    i = np.array([-40, -3, 0, 2, 5, 7, 19, 33], np.int32)
    u = rng.integers(0, 256, 8).astype(np.uint8)
    i64 = i.astype(np.int64)
    cases = [  # (expression, numpy of what Halide defines it to be)
        (hl.lerp(fi[x], fi[x] * 3, 0.25), a * np.float32(0.75) + a * 3 * np.float32(0.25)),
        (hl.absd(ii[x], 3), np.abs(i64 - 3).astype(np.uint32)),
        (hl.absd(ui[x], hl.u8(100)), np.abs(u.astype(int) - 100).astype(np.uint8)),
        ((ii[x] << 2) + (ii[x] >> 1) + (ii[x] << (ii[x] % 3 - 1)),  # negative amount: >>
         (i64 * 4 + (i64 >> 1) + np.where(i64 % 3 == 0, i64 >> 1, i64 << (i64 % 3 - 1)))
         .astype(np.int32)),
        ((ii[x] & 7) | (ii[x] ^ 3) | hl.i32(~ui[x]), (i & 7) | (i ^ 3) | (~u).astype(np.int32)),
        (hl.saturating_cast(hl.UInt(8), ii[x] * 10), np.clip(i64 * 10, 0, 255).astype(np.uint8)),
        (hl.mux(ii[x] % 3, [fi[x], fi[x] * 2, fi[x] * 3]), a * (i64 % 3 + 1).astype(np.float32)),
        (hl.select((ii[x] > 0) & (ii[x] < 20) | ~(ii[x] != 5), 1, 0),
         (((i > 0) & (i < 20)) | (i == 5)).astype(np.int32)),
    ]
    for k, (e, expected) in enumerate(cases):
        f = hl.Func(f"case{k}")
        f[x] = e
        g = tc.from_halide(f)
        args = [{"fi": a, "ii": i, "ui": u}[p.name] for p in g.arguments]
        check(g, args, (8,), expected, options=OPTIONS[:2], rtol=1e-6 if k == 0 else 0)


def test_reinterpretations_and_integer_lerp_run_on_cuda():
    """Once CPU-only (issue 27): a reinterpretation (fast_exp's and random_float's bit tricks)
    prints as a copy of the bits, an integer lerp as Halide's own fixed-point formula; both
    equal the CPU's values, which equal numpy's bit view and Halide's rounding."""
    fi = hl.ImageParam(hl.Float(32), 1, "fi")
    ui = hl.ImageParam(hl.UInt(8), 1, "ui")
    bits, blend = hl.Func("bits"), hl.Func("blend")
    bits[x] = hl.reinterpret(hl.UInt(32), fi[x])
    blend[x] = hl.lerp(ui[x], ui[x] // 2, hl.u8(100))  # an integer lerp
    a, u = np.float32([1.0, -2.5, np.inf]), np.arange(0, 256, 7, dtype=np.uint8)
    f = tc.from_halide(bits)
    np.testing.assert_array_equal(f(a, output_shape=(3,)), a.view(np.uint32))
    k = tc.compile(f, a, output_shape=(3,), target="cuda-emulated")
    np.testing.assert_array_equal(k(a), a.view(np.uint32))
    assert "tc::bits<uint32_t>" in k.cuda_source
    g = tc.from_halide(blend)
    # Halide's integer lerp of weight w (8 bits): (a * (255 - w) + b * w) / 255, rounded
    want = ((u.astype(np.int64) * 155 + (u // 2).astype(np.int64) * 100 + 127) // 255)
    cpu = g(u, output_shape=u.shape)
    np.testing.assert_array_equal(cpu, want.astype(np.uint8))
    k = tc.compile(g, u, output_shape=u.shape, target="cuda-emulated")
    np.testing.assert_array_equal(k(u), cpu)


def test_compile_takes_a_bare_func():
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    out = hl.Func("out")
    out[x] = inp[x] * 2
    a = rng.standard_normal(5).astype(np.float32)
    k = tc.compile(out, a, output_shape=(5,), target="cuda-emulated")
    np.testing.assert_array_equal(k(a), a * 2)
    with pytest.raises(TCError, match="output_shape= is for Halide pipelines"):
        tc.compile("def f(float(N) A) -> (B) { B(i) = A(i) }", "f", a, output_shape=(5,))


def test_compute_with_leaves_the_callers_funcs_as_they_were():
    """Halide's realization order records compute_with's fused pairs in the schedules it is
    given: tcstage asks it about copies, so a pipeline scheduled with compute_with runs (CPU and
    CUDA) and the caller's own realize still works afterwards (helper port of camera_pipe)."""
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    f, g, out = hl.Func("f"), hl.Func("g"), hl.Func("out")
    f[x, y] = inp[x, y] * 2
    g[x, y] = inp[x, y] + 1
    out[x, y] = f[x, y] + g[x, y]
    f.compute_root()
    g.compute_root().compute_with(f, x)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    want = a * 2 + (a + 1)  # (in float32, as the pipeline rounds: 3a + 1 near 0 differs)
    fn = tc.from_halide(out)
    np.testing.assert_allclose(fn(a, output_shape=(4, 5)), want, rtol=0, atol=1e-6)
    k = tc.compile(fn, a, output_shape=(4, 5), target="cuda-emulated")
    np.testing.assert_allclose(k(a), want, rtol=0, atol=1e-6)
    inp.set(hl.Buffer(a))
    np.testing.assert_allclose(np.asarray(out.realize([5, 4])), want, rtol=0, atol=1e-6)


def test_halides_note_on_an_unfolded_line_buffer_stays_out_of_the_output(capsys):
    """A line buffer that its reader loads as vectors along the rolling dimension is left
    unfolded, and Halide says so on stdout at every compile (seen once in a Halide fuzz
    campaign through the stencil family). Halide's own example of it, compiled inside the
    filter the Halide-pipeline path compiles in: the note is dropped, other output stays."""
    from tcstage.halide.stderr import halide_notes_dropped

    def build():
        f, g, x = hl.Func("f"), hl.Func("g"), hl.Var("x")
        f[x] = x * 2
        g[x] = f[x - 1] + f[x + 1]
        xo, xi, xii = hl.Var("xo"), hl.Var("xi"), hl.Var("xii")
        g.split(x, xo, xi, 1024).split(xi, xi, xii, 8).vectorize(xii)
        f.store_at(g, xo).compute_at(g, xi).vectorize(x, 8)
        return g

    build().compile_jit()
    assert "Not folding Func f" in capsys.readouterr().out  # (the case still makes the note)
    with halide_notes_dropped():
        print("kept")
        g = build()
        g.compile_jit()
    out, err = capsys.readouterr()
    assert out == "kept\n" and err == ""
    np.testing.assert_array_equal(np.asarray(g.realize([16])), 4 * np.arange(16))


def test_an_int32_argmin_is_compared_as_written_on_the_cuda_path():
    """hl.argmin starts from INT_MAX, and Halide's simplifier may rewrite `v < best` as
    `0 < best - v`, which overflows from there (Halide takes int32 overflow to be impossible;
    docs/halide.md): plain Halide with the reduction at the root gets this one wrong. The
    CUDA path prints the comparison as written: the minimum over the window, against numpy."""
    x, y = hl.Var("x"), hl.Var("y")
    image = hl.ImageParam(hl.Int(32), 2, "image")
    edge = hl.BoundaryConditions.repeat_edge(image)
    r = hl.RDom([(0, 3)], "r")
    lowest = hl.Func("lowest")
    lowest[x, y] = hl.argmin(r, -edge[x, y + r.x])[1]
    f = tc.from_halide([lowest], name="lowest")
    a = np.random.default_rng(1).integers(-8, 9, size=(4, 6)).astype(np.int32)
    want = np.array([[min(-a[min(yy + k, 3), xx] for k in range(3)) for xx in range(6)]
                     for yy in range(4)])
    kernel = tc.compile(f, a, output_shape=[(4, 6)], target="cuda-emulated")
    np.testing.assert_array_equal(kernel(a), want)
