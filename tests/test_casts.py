"""Casts: every scalar type name converts (`float(x)`, `int32(B(i))`, ...), with one meaning on the
CPU (Halide), in CUDA (emulated) and for constants folded by the compiler, checked against numpy
references written here: float to integer truncates toward zero, saturates and sends NaN to 0;
integer to integer wraps; to float rounds to nearest even. TC's own spellings (its tests'
`A(int32(B(i)))`, wavenet's `float(0)`, min_distance's `int32(Codes(n, r_m))`) parse and run."""

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc
from tcstage.lang.types import SCALAR_TYPES

BF16 = ml_dtypes.bfloat16
TARGETS = ["cpu", "cuda-emulated"]


def run(source, name, *args, target="cpu", options=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (data-dependent subscripts)
        if target == "cpu":
            out = tc.define(source)[name](*args)
        else:
            out = tc.compile(source, name, *args, target=target, options=options)(*args)
    return out if isinstance(out, tuple) else (out,)


def float_to_int(x: np.ndarray, dtype) -> np.ndarray:
    """The reference: truncate toward zero, saturate, NaN to 0 (in Python's exact int/float
    comparisons: numpy's clip to 2**63 - 1 rounds the bound to 2**63)."""
    info = np.iinfo(dtype)
    out = [0 if math.isnan(v) else info.max if v >= info.max + 1 else info.min if v < info.min
           else int(v) for v in x.astype(np.float64).tolist()]
    return np.array(out, dtype)


SPECIALS = np.array([np.nan, np.inf, -np.inf, 1e20, -1e20, 3.7, -3.7, 0.5, -0.5, 0.0, 255.9,
                     256.0, -128.5, 2147483520.0, -2147483648.0, 4e9], np.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spelling", ["int8", "uint8", "int16", "uint16", "int32", "int", "uint32",
                                      "int64", "uint64", "byte"])
def test_float_to_integer_truncates_saturates_and_sends_nan_to_zero(spelling, target):
    src = f"def f(float(N) X, double(N) D) -> (O, P) {{\n O(i) = {spelling}(X(i))\n" \
          f" P(i) = {spelling}(D(i) * 3.0)\n}}"
    d = SPECIALS.astype(np.float64) / 3.0
    o, p = run(src, "f", SPECIALS, d, target=target)
    dtype = SCALAR_TYPES[spelling].numpy
    assert o.dtype == dtype and p.dtype == dtype
    np.testing.assert_array_equal(o, float_to_int(SPECIALS, dtype))
    np.testing.assert_array_equal(p, float_to_int(d * 3.0, dtype))


@pytest.mark.parametrize("target", TARGETS)
def test_narrow_floats_to_integers(target):
    src = "def f(half(N) H, bfloat16(N) B) -> (I, U) {\n I(i) = int16(H(i))\n U(i) = uint8(B(i))\n}"
    h = SPECIALS.astype(np.float16)
    b = SPECIALS.astype(BF16)
    i, u = run(src, "f", h, b, target=target)
    np.testing.assert_array_equal(i, float_to_int(h.astype(np.float32), np.int16))
    np.testing.assert_array_equal(u, float_to_int(b.astype(np.float32), np.uint8))


@pytest.mark.parametrize("target", TARGETS)
def test_integers_wrap_and_floats_round(target):
    src = """def f(int32(N) A, double(N) D) -> (B, U, H, G, F, Z) {
    B(i) = int8(A(i))
    U(i) = uint8(A(i) + 300)
    H(i) = half(D(i))
    G(i) = bfloat16(D(i))
    F(i) = float(A(i))
    Z(i) = bool(A(i))
}"""
    a = np.array([0, 1, -1, 127, 128, 255, 256, -129, 2 ** 31 - 1, -2 ** 31, 16777217, 7],
                 np.int32)
    d = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520.0, 1e-8, -2.5, 3.0 + 2 ** -8, 1e39,
                  np.nan, -0.0, 1 / 3, 2.0 ** -24, 6e-8])
    b, u, h, g, f, z = run(src, "f", a, d, target=target)
    np.testing.assert_array_equal(b, a.astype(np.int8))  # numpy's astype wraps
    np.testing.assert_array_equal(u, (a.astype(np.int64) + 300).astype(np.int32).astype(np.uint8))
    same_bits = ~np.isnan(d)  # (a NaN's payload may differ: CUDA's bfloat16 NaN is 0x7fff)
    np.testing.assert_array_equal(h.view(np.uint16)[same_bits],
                                  d.astype(np.float16).view(np.uint16)[same_bits])
    np.testing.assert_array_equal(g.view(np.uint16)[same_bits],
                                  d.astype(BF16).view(np.uint16)[same_bits])
    assert np.isnan(h[~same_bits].astype(np.float32)).all()
    assert np.isnan(g[~same_bits].astype(np.float32)).all()
    np.testing.assert_array_equal(f, a.astype(np.float32))
    np.testing.assert_array_equal(z, a != 0)


def test_a_cast_is_strongly_typed_and_folds_constants():
    """`float(0)` is float32, not a literal adapting to a double beside it; constant casts
    give what the same cast gives at run time."""
    src = """def f(double(N) D, float(N) X) -> (O, K, L, M, P) {
    O(i) = D(i) + float(0.1)
    K(i) = int32(3.7) + int32(-3.7) * 10 + int32(1e20) * 0 + X(i) * 0
    L(i) = uint8(300) + uint8(-1.5) + X(i) * 0
    M(i) = int32(X(i))
    P(i) = int64(1e30) + int64(X(i))
}"""
    d, x = np.zeros(2), np.array([1e20, np.nan], np.float32)
    o, k, l_, m, p = run(src, "f", d, x)
    assert o.dtype == np.float64 and o[0] == np.float64(np.float32(0.1))  # 0.1 rounded to float
    assert list(k) == [3 - 30] * 2  # (X * 0 is float: K is float)
    assert list(l_) == [44.0] * 2
    assert list(m) == list(float_to_int(x, np.int32))
    big = float_to_int(np.array([1e30, 1e20]), np.int64)
    assert list(big) == [2 ** 63 - 1] * 2
    assert p[0] == -2  # the saturated values' sum wraps in int64


@pytest.mark.parametrize("target", TARGETS)
def test_tcs_own_cast_subscripts(target):
    """TC's test spellings: a cast of a table's value as a subscript, in a sum and a max, and
    min_distance's index of the nearest code."""
    src = """
def gather_sum(float(N) A, float(M) B) -> (O) { O +=! A(int32(B(i))) }
def gather_max(float(N) A, float(M) B) -> (O) { O max=! A(int32(B(i))) }
def decode(uint8(N, R) Codes, float(R, C, D) Book) -> (O) {
    O(n, r, d) = Book(r, int32(Codes(n, r)), d)
}
def wavenet_like(float(N, C) X) -> (Y) { Y(n, c) = X(n, c) > float(0) ? X(n, c) : float(0) }
"""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(10).astype(np.float32)
    b = rng.uniform(0, 9.99, 25).astype(np.float32)
    (s,) = run(src, "gather_sum", a, b, target=target)
    (mx,) = run(src, "gather_max", a, b, target=target)
    idx = np.trunc(b).astype(np.int64)
    np.testing.assert_allclose(s, a[idx].astype(np.float64).sum(), rtol=1e-5)
    assert mx == a[idx].max()
    codes = rng.integers(0, 16, (6, 3)).astype(np.uint8)
    book = rng.standard_normal((3, 16, 4)).astype(np.float32)
    (o,) = run(src, "decode", codes, book, target=target)
    want = np.stack([book[np.arange(3), codes[n].astype(np.int64)] for n in range(6)])
    np.testing.assert_array_equal(o, want)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    (y,) = run(src, "wavenet_like", x, target=target)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_cast_subscripts_under_mapping_options():
    src = "def f(float(N) A, int64(M, K) I) -> (O) { O(m) +=! A(int32(I(m, k) % 7)) }"
    rng = np.random.default_rng(0)
    a = rng.standard_normal(7).astype(np.float32)
    i = rng.integers(-50, 50, (40, 6)).astype(np.int64)
    opts = tc.MappingOptions().tile(8).mapToThreads(8, 2).mapToBlocks(5).useSharedMemory(True)
    (o,) = run(src, "f", a, i, target="cuda-emulated", options=opts)
    np.testing.assert_allclose(o, a[np.mod(i, 7)].astype(np.float64).sum(1), rtol=1e-5)


def test_gradient_through_casts():
    """A float cast passes the gradient through; an integer one passes none, and the backward
    TC writes it out where its value is used (here as a subscript and a factor)."""
    src = """def f(double(N) X, double(N) W, uint8(N) B, double(M) A) -> (O) {
    O(i) = A(int32(B(i))) * W(i) + double(int32(X(i) * 3.0)) * X(i) + float(X(i))
}"""
    back = tc.gradient(src, "f")
    assert "int32(B(i))" in back and "int32(X(i) * 3.0)" in back
    rng = np.random.default_rng(1)
    x, w = rng.uniform(-2, 2, 8), rng.standard_normal(8)
    b, a = rng.integers(0, 5, 8).astype(np.uint8), rng.standard_normal(5)
    d_o = rng.standard_normal(8)
    fwd = tc.define(src)["f"](x, w, b, a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        d_x, d_w, d_a = tc.define(back)["f_grad"](x, w, b, a, fwd, d_o)
    np.testing.assert_allclose(d_x, d_o * (np.trunc(x * 3.0) + 1.0), rtol=1e-12)
    np.testing.assert_allclose(d_w, d_o * a[b], rtol=1e-12)
    np.testing.assert_allclose(d_a, np.bincount(b, d_o * w, minlength=5), rtol=1e-12)


@pytest.mark.parametrize("text,message", [
    ("O(i) = float(X(i), X(i))", r"the cast 'float\(\.\.\.\)' takes one argument, not 2"),
    ("O(i) = int32()", r"the cast 'int32\(\.\.\.\)' takes one argument, not 0"),
    ("O(i) = X(float(i))", r"a subscript must be an integer, not float32"),
])
def test_cast_errors_are_located(text, message):
    with pytest.raises(tc.TCError, match=message) as info:
        tc.define(f"def f(float(N) X) -> (O) {{\n  {text}\n}}")
    assert "^" in str(info.value)


def test_a_tensor_named_like_a_type_is_read_not_cast():
    (o,) = run("def f(float(N) half) -> (O) { O(i) = half(i) * 2 }", "f",
               np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(o, [0, 2, 4])
