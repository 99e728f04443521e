"""Halide constructs that Halide's own apps use and the CUDA path once refused (issue 27), each
run on the CPU (Halide's JIT) and under emulated CUDA and checked against numpy or, where the
construct is Halide's own definition (random_float), against Halide's realize."""

import warnings

import halide as hl
import numpy as np
import pytest

import tcstage as tc
from tcstage.errors import TCError

x, y = hl.Var("x"), hl.Var("y")
rng = np.random.default_rng(27)


def _cuda(fn, *args, output_shape, options=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.compile(fn, *args, output_shape=output_shape, target="cuda-emulated",
                          options=options or tc.MappingOptions().tile(4, 8).mapToThreads(8, 4)
                          .mapToBlocks(4, 4))


def test_undef_pure_definition_before_a_scan():
    # apps/iir_blur's shape: no pure value, the first row copied, then a scan down the rows
    image = hl.ImageParam(hl.Float(32), 2, "image")
    scan = hl.Func("scan")
    scan[x, y] = hl.undef(hl.Float(32))
    scan[x, 0] = image[x, 0]
    r = hl.RDom([(1, 10)])
    scan[x, r.x] = scan[x, r.x - 1] * 0.5 + image[x, r.x]
    a = rng.standard_normal((11, 7)).astype(np.float32)
    want = a.astype(np.float64).copy()
    for row in range(1, 11):
        want[row] = want[row - 1] * 0.5 + a[row]
    fn = tc.from_halide(scan)
    np.testing.assert_allclose(fn(a, output_shape=a.shape), want, rtol=1e-5, atol=1e-5)
    k = _cuda(fn, a, output_shape=a.shape)
    np.testing.assert_allclose(k(a), want, rtol=1e-5, atol=1e-5)
    assert len(k.compiled.scop.statements) == 3  # (the undef one runs no instance)
    assert k.compiled.scop.statements[0].domain.is_empty()


def test_fast_exp_and_random_float_run_on_cuda():
    image = hl.ImageParam(hl.Float(32), 2, "image")
    fast, noisy = hl.Func("fast"), hl.Func("noisy")
    fast[x, y] = hl.fast_exp(image[x, y])
    noisy[x, y] = image[x, y] + hl.random_float()
    a = rng.uniform(-5, 5, (9, 13)).astype(np.float32)
    f = tc.from_halide(fast)
    k = _cuda(f, a, output_shape=a.shape)
    assert "tc::bits<" in k.cuda_source  # fast_exp builds 2^n from its exponent bits
    np.testing.assert_allclose(k(a), np.exp(a.astype(np.float64)), rtol=1e-4)
    np.testing.assert_allclose(k(a), f(a, output_shape=a.shape), rtol=1e-6)
    g = tc.from_halide(noisy)
    # random_float is Halide's hash of the coordinates: Halide's realize is the reference
    image.set(hl.Buffer(a))
    want = np.asarray(noisy.realize([13, 9]))
    got = _cuda(g, a, output_shape=a.shape)(a)
    # (the hash is integer arithmetic, exact; the float steps after it may round differently
    # where a compiler fuses a multiply and an add)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert 0 <= (got - a).min() and (got - a).max() < 1


def test_an_embedded_buffer_is_an_input_the_caller_does_not_pass():
    # tutorial lesson 9: a histogram of a Buffer the algorithm holds
    pixels = rng.integers(0, 256, (13, 17), dtype=np.uint8)
    buffer = hl.Buffer(pixels)
    r = hl.RDom([(0, 17), (0, 13)])
    hist = hl.Func("hist")
    hist[x] = 0
    hist[hl.cast(hl.Int(32), buffer[r.x, r.y])] += 1
    fn = tc.from_halide(hist)
    want = np.bincount(pixels.ravel(), minlength=256).astype(np.int32)
    np.testing.assert_array_equal(fn(output_shape=(256,)), want)
    k = _cuda(fn, output_shape=(256,))
    np.testing.assert_array_equal(k(), want)
    # the CUDA kernel reads the Buffer's values at each call, as Halide's realize does
    pixels[0, :5] = 7
    np.testing.assert_array_equal(k(), np.bincount(pixels.ravel(), minlength=256))
    assert [a.name for a in fn.constants] == [t.name for t in k.compiled.fn.checked.inputs]


def test_an_embedded_buffer_must_start_at_zero():
    b = hl.Buffer(hl.Int(32), [4])
    b.set_min([2])
    f = hl.Func("f")
    f[x] = b[x + 2]
    with pytest.raises(TCError, match=r"reads the Buffer '.*', whose mins are \(2,\); the "
                                      r"CUDA path takes embedded Buffers"):
        _cuda(tc.from_halide(f), output_shape=(4,))


def _disc(radius2: int) -> np.ndarray:
    d = np.arange(9) - 4
    return (d[:, None] ** 2 + d[None, :] ** 2) <= radius2


def test_non_affine_where_is_a_guard():
    # tutorial lesson 17: a sum over a disc of radius^2 10 inside a 9 x 9 box
    image = hl.ImageParam(hl.Float(32), 2, "image")
    r = hl.RDom([(0, 9), (0, 9)])
    r.where((r.x - 4) * (r.x - 4) + (r.y - 4) * (r.y - 4) <= 10)
    blur = hl.Func("blur")
    blur[x, y] = 0.0
    blur[x, y] += image[x + r.x, y + r.y]
    a = rng.standard_normal((15, 14)).astype(np.float32)
    disc = _disc(10)
    want = np.array([[(a[i:i + 9, j:j + 9] * disc).sum() for j in range(6)] for i in range(7)])
    fn = tc.from_halide(blur)
    np.testing.assert_allclose(fn(a, output_shape=(7, 6)), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_cuda(fn, a, output_shape=(7, 6))(a), want, rtol=1e-5, atol=1e-4)


def test_where_reading_func_values_and_mixed_conditions():
    # the affine half of the condition bounds the domain, the half reading data guards it
    image = hl.ImageParam(hl.Int(32), 1, "image")
    positive = hl.Func("positive")
    positive[x] = image[x] > 0
    r = hl.RDom([(0, 12)])
    r.where((r.x >= 2) & positive[r.x])
    count = hl.Func("count")
    count[x] = 0
    count[x] += hl.select(image[r.x] > x, 1, 0)
    a = rng.integers(-5, 6, 12).astype(np.int32)
    taken = a[2:][a[2:] > 0]
    want = np.array([(taken > i).sum() for i in range(5)], np.int32)
    fn = tc.from_halide(count)
    np.testing.assert_array_equal(fn(a, output_shape=(5,)), want)
    np.testing.assert_array_equal(_cuda(fn, a, output_shape=(5,))(a), want)


def test_rdom_extent_from_a_float_param():
    # apps/gaussian_blur's shape: the kernel's radius is ceil(3 sigma), sigma a float Param
    image = hl.ImageParam(hl.Float(32), 1, "image")
    sigma = hl.Param(hl.Float(32), "sigma")
    radius = hl.cast(hl.Int(32), hl.ceil(3 * sigma))
    r = hl.RDom([(-radius, 2 * radius + 1)])
    edge = hl.BoundaryConditions.repeat_edge(image)
    box = hl.Func("box")
    box[x] = 0.0
    box[x] += edge[x + r.x]
    a = rng.standard_normal(19).astype(np.float32)
    for s in (1.0, 1.4):  # radius 3, then ceil(4.2) = 5
        n = int(np.ceil(3 * np.float32(s)))
        padded = np.pad(a.astype(np.float64), n, mode="edge")
        want = np.array([padded[i:i + 2 * n + 1].sum() for i in range(19)])
        fn = tc.from_halide(box)
        np.testing.assert_allclose(fn(a, s, output_shape=(19,)), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_cuda(fn, a, s, output_shape=(19,))(a, s), want,
                                   rtol=1e-5, atol=1e-5)


def test_tuple_output_gives_an_array_per_element():
    image = hl.ImageParam(hl.Float(32), 1, "image")
    both, other = hl.Func("both"), hl.Func("other")
    both[x] = (image[x] * 2, hl.cast(hl.Int(32), image[x]) + 1)
    other[x] = image[x] - 1
    a = np.float32([0.5, 2.25, -3.5])
    f = tc.from_halide(both)
    for twice, rounded in (f(a, output_shape=(3,)), _cuda(f, a, output_shape=(3,))(a)):
        np.testing.assert_array_equal(twice, a * 2)
        np.testing.assert_array_equal(rounded, np.int32([1, 3, -2]))
    g = tc.from_halide([both, other])
    for outs in (g(a, output_shape=[(3,), (3,)]), _cuda(g, a, output_shape=[(3,), (3,)])(a)):
        assert [o.dtype for o in outs] == [np.float32, np.int32, np.float32]
        np.testing.assert_array_equal(outs[2], a - 1)


def test_argmin_tuple_update_on_cuda():
    # tutorial lesson 13 and apps/lens_blur: a Tuple update whose elements read each other's
    # values from before the update (the index's condition reads the running minimum)
    image = hl.ImageParam(hl.Float(32), 2, "image")
    r = hl.RDom([(0, 9)])
    best = hl.Func("best")
    best[x] = (0, image[x, 0])
    best[x] = hl.select(image[x, r.x] < best[x][1], hl.Tuple([r.x, image[x, r.x]]), best[x])
    where, inline = hl.Func("where"), hl.Func("inline")
    where[x] = best[x][0]
    inline[x] = hl.argmin(image[x, r.x])[0]  # Halide's own inline reduction
    a = rng.standard_normal((9, 11)).astype(np.float32)
    for out in (where, inline):
        fn = tc.from_halide(out)
        for schedule in ("auto", "root", "tcstage"):  # (the root copy names Funcs, not elements)
            np.testing.assert_array_equal(fn(a, output_shape=(11,), schedule=schedule),
                                          a.argmin(axis=0))
        np.testing.assert_array_equal(_cuda(fn, a, output_shape=(11,))(a), a.argmin(axis=0))
    both = tc.from_halide(best)
    # (Min fusion schedules each element apart where it can: the dependences between them
    # within the loop nest they share must hold it together; Halide fuzz seed 950101)
    apart = tc.MappingOptions().tile(0, 2, 2).mapToThreads(8, 16, 1).mapToBlocks(3, 3) \
        .useSharedMemory(True).sharedDepth(0).scheduleFusionStrategy("Min") \
        .outerSchedulePositiveOrthant(False)
    for options in (None, apart):
        index, value = _cuda(both, a, output_shape=(11,), options=options)(a)
        np.testing.assert_array_equal(index, a.argmin(axis=0))
        np.testing.assert_array_equal(value, a.min(axis=0))


def test_tuple_elements_that_read_each_other_in_a_cycle():
    image = hl.ImageParam(hl.Int(32), 1, "image")
    swap = hl.Func("swap")
    swap[x] = (image[x], -image[x])
    r = hl.RDom([(0, 3)])
    swap[x] = (swap[x][1] + r.x, swap[x][0])  # (a, b) -> (b + r, a), three times
    a = np.arange(5, dtype=np.int32)
    fn = tc.from_halide(swap)
    first, second = fn(a, output_shape=(5,))  # (a, -a) -> (-a, a) -> (a + 1, -a) -> (2 - a, a + 1)
    np.testing.assert_array_equal(first, 2 - a)
    np.testing.assert_array_equal(second, a + 1)
    with pytest.raises(TCError, match=r"definition 1 of the Tuple Func 'swap' of 'swap' has "
                                      r"elements that read each other in a cycle"):
        _cuda(fn, a, output_shape=(5,))


def test_an_extent_under_strict_float():
    # apps/resize's kernel_taps: an RDom extent computed under strict_float from a float Param,
    # folded for the call's value (one IEEE operation each, as the plain ones round)
    image = hl.ImageParam(hl.Float(32), 1, "image")
    scale = hl.Param(hl.Float(32), "scale")
    taps = hl.i32(hl.ceil(hl.strict_float(hl.f32(1.0) / scale) * 4.0))
    r = hl.RDom([(0, taps)])
    window = hl.Func("window")
    window[x] = hl.f32(0)
    window[x] += image[x + r.x]
    a = rng.standard_normal(24).astype(np.float32)
    want = np.array([a[i:i + 8].sum(dtype=np.float64) for i in range(16)])  # 1 / 0.5 * 4 = 8
    fn = tc.from_halide(window)
    np.testing.assert_allclose(fn(a, 0.5, output_shape=(16,)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_cuda(fn, a, 0.5, output_shape=(16,))(a, 0.5), want,
                               rtol=1e-5, atol=1e-5)


def test_options_auto_with_an_embedded_buffer():
    table = hl.Buffer(np.array([1, 2, 3, 4], dtype=np.float32))
    image = hl.ImageParam(hl.Float(32), 1, "image")
    scaled = hl.Func("scaled")
    scaled[x] = image[x] * table[x % 4]
    fn = tc.from_halide(scaled)
    a = rng.standard_normal(10).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        k = tc.compile(fn, a, output_shape=(10,), options="auto", target="cuda-emulated")
    np.testing.assert_array_equal(k(a), a * np.tile(np.float32([1, 2, 3, 4]), 3)[:10])
