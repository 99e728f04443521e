"""NaN follows C's fmax on every back end (docs/language.md, NaN and overflow): the builtins
ignore a NaN operand, and the max=!/min=! reductions skip NaN elements, folding from the
identity, wherever the NaN sits. Before, the CPU's answer depended on the NaN's position and on
the operand order, an all-NaN row gave NaN on the CPU and -inf in CUDA, and half differed again
under emulation. References: numpy's fmax/fmin (elementwise and .reduce with the identity)."""

import warnings

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc

M = tc.MappingOptions
TYPES = [("float", np.float32), ("double", np.float64), ("half", np.float16),
         ("bfloat16", ml_dtypes.bfloat16)]
NAN = float("nan")


def rows_with_nans(dtype, width):
    """A NaN at each position of its own row, two NaNs, no NaN, and an all-NaN row."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal(width)
    rows = []
    for k in range(width):
        r = base.copy()
        r[k] = NAN
        rows.append(r)
    two = base.copy()
    two[[0, width - 1]] = NAN
    rows += [two, base, np.full(width, NAN)]
    return np.array(rows).astype(dtype)


def reference(x: np.ndarray, op: str) -> np.ndarray:
    x = x.astype(np.float64)
    f, start = (np.fmax, -np.inf) if op == "max" else (np.fmin, np.inf)
    return f.reduce(x, axis=1, initial=start)


def same(got, want):
    got = np.asarray(got).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("spelling, dtype", TYPES)
@pytest.mark.parametrize("target,options", [
    ("cpu", None),
    ("cuda-emulated", M().mapToThreads(8)),  # one thread per row
    ("cuda-emulated", M().mapToThreads(64).mapToBlocks(8)),  # each row split over threads
], ids=["cpu", "rows-on-threads", "rows-split"])
def test_reductions_skip_nan_wherever_it_sits(spelling, dtype, target, options):
    src = f"def r({spelling}(R, C) X) -> (Mx, Mn) {{\n Mx(r) max=! X(r, c)\n" \
          f" Mn(r) min=! X(r, c)\n}}"
    x = rows_with_nans(dtype, 40)
    if target == "cpu":
        mx, mn = tc.define(src)["r"](x)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            mx, mn = tc.compile(src, "r", x, options=options, target=target)(x)
    same(mx, reference(x, "max"))
    same(mn, reference(x, "min"))


@pytest.mark.parametrize("spelling, dtype", TYPES)
@pytest.mark.parametrize("target", ["cpu", "cuda-emulated"])
def test_builtins_ignore_a_nan_operand(spelling, dtype, target):
    src = f"""def f({spelling}(N) X, {spelling}(N) Y, {spelling} s) -> (A, B, C, D, E) {{
    A(i) = fmax(X(i), Y(i))
    B(i) = fmin(Y(i), X(i))
    C(i) = max(s, X(i))
    D(i) = min(X(i), s)
    E(i) = fmax(X(i), 0)
}}"""
    x = np.array([NAN, 0.5, 2.0, NAN, -1.0, NAN, 3.0, -2.0]).astype(dtype)
    y = np.array([1.0, NAN, 1.0, NAN, -2.0, 5.0, NAN, NAN]).astype(dtype)
    for s in (dtype(1.0), dtype(NAN)):
        if target == "cpu":
            out = tc.define(src)["f"](x, y, s)
        else:
            out = tc.compile(src, "f", x, y, s, target=target)(x, y, s)
        xf, yf, sf = (np.asarray(v).astype(np.float64) for v in (x, y, s))
        want = [np.fmax(xf, yf), np.fmin(yf, xf), np.fmax(sf, xf), np.fmin(xf, sf),
                np.fmax(xf, 0.0)]
        for g, w in zip(out, want):
            same(g, w)


def test_softmax_row_maximum_stays_vectorised_on_the_cpu():
    """The NaN filter sits in the reduced value, not in the combine: the update is still a max
    Halide can prove associative, and the CPU scheduler keeps its vectorised row reduction."""
    p = tc.define("def rmax(float(R, C) X) -> (Mx) { Mx(r) max=! X(r, c) }")
    x = rows_with_nans(np.float32, 256)
    same(p["rmax"](x), reference(x, "max"))
    note = p["rmax"].explain(x) if hasattr(p["rmax"], "explain") else ""
    assert "vectors" in str(note), note


def test_int32_overflow_as_documented():
    src = "def f(int32(N) A) -> (G, P, S) {\n G(i) = A(i) + 1 > A(i)\n P(i) = A(i) * 2\n" \
          " S() +=! A(i)\n}"
    a = np.array([2 ** 31 - 1, 5], np.int32)
    for out in (tc.define(src)["f"](a), tc.compile(src, "f", a, target="cuda-emulated")(a)):
        g, p, s = out
        assert list(g) == [True, True]  # folded by Halide's simplifier: no overflow assumed
        assert list(p) == [-2, 10]  # computed values wrap
        assert int(s) == int(np.int32(np.int64(2 ** 31 - 1 + 5) - 2 ** 32))


SPECIALS = np.array([NAN, np.inf, -np.inf, 0.0, -1.0, 0.5, 2.0, 100.0, -100.0, 3e38],
                    np.float32)
UNARY_SPECIALS = {"exp": np.exp, "log": np.log, "log2": np.log2, "log10": np.log10,
                  "exp2": np.exp2, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


@pytest.mark.parametrize("target", ["cpu", "cuda-emulated"])
@pytest.mark.parametrize("name", sorted(UNARY_SPECIALS))
def test_builtins_at_nan_and_infinity_are_cs(name, target):
    """Halide's float32 polynomials gave exp(inf) = 0, exp(NaN) = 0, log(NaN) = 89 and
    log(inf) = 88.7 on the CPU (CUDA's functions were right): now every back end gives C's
    values there. Reference: numpy in float64, rounded to float32."""
    src = f"def f(float(N) A) -> (O) {{ O(i) = {name}(A(i)) }}"
    with np.errstate(all="ignore"):
        want = UNARY_SPECIALS[name](SPECIALS.astype(np.float64)).astype(np.float32)
    got = tc.define(src)["f"](SPECIALS) if target == "cpu" else \
        tc.compile(src, "f", SPECIALS, target=target)(SPECIALS)
    # (results below float's normal range, exp(-100), may be flushed to 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1.2e-38, equal_nan=True)


@pytest.mark.parametrize("target", ["cpu", "cuda-emulated"])
def test_float_pow_special_cases_are_cs(target):
    """Halide's float32 pow got most of C's special cases wrong on the CPU (pow(0, -1) = 0,
    pow(2, inf) = 0, pow(NaN, 2) = inf); it now goes through double. Reference: numpy."""
    values = [NAN, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 2.5]
    a, b = (np.array(v, np.float32) for v in zip(*[(x, y) for x in values for y in values]))
    src = "def f(float(N) A, float(N) B) -> (O) { O(i) = pow(A(i), B(i)) }"
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    got = tc.define(src)["f"](a, b) if target == "cpu" else \
        tc.compile(src, "f", a, b, target=target)(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
