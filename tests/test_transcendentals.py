"""Transcendental builtins on the CPU against float64 (numpy), in ulps of the result's type:
tanh is tcstage's own vectorisable float32 form (halide/exprs.py `_tanh`), not libm's."""

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc


def _inputs(dtype) -> np.ndarray:
    rng = np.random.default_rng(3)
    x = np.concatenate([np.linspace(-12, 12, 40001), rng.standard_normal(20000) * 3,
                        np.logspace(-40, 1.5, 3000), -np.logspace(-40, 1.5, 3000),
                        [0.0, 0.625, -0.625, 0.6249999, 9.0, 9.01, 1e-45, 3.4e38, -3.4e38]])
    big = float(ml_dtypes.finfo(dtype).max)  # (finite in every type tested)
    return np.clip(x, -big, big).astype(dtype)


def _ulps(got: np.ndarray, want: np.ndarray, dtype) -> np.ndarray:
    spacing = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.mark.parametrize("type_name, dtype, bound", [
    ("float", np.float32, 2.0), ("half", np.float16, 1.0),
    ("bfloat16", ml_dtypes.bfloat16, 1.0), ("double", np.float64, 2.0)])  # (libm vs numpy)
def test_tanh_within_ulps_of_float64(type_name, dtype, bound):
    f = tc.define(f"def t({type_name}(N) X) -> (O) {{ O(i) = tanh(X(i)) }}").t
    x = _inputs(dtype)
    got = f(x)
    want = np.tanh(x.astype(np.float64))
    assert got.dtype == np.dtype(dtype)
    assert _ulps(got, want, dtype).max() <= bound


def test_tanh_special_values():
    f = tc.define("def t(float(N) X) -> (O) { O(i) = tanh(X(i)) }").t
    got = f(np.array([np.inf, -np.inf, np.nan, 0.0, 100.0, -100.0], np.float32))
    np.testing.assert_array_equal(got[[0, 1, 3, 4, 5]], [1, -1, 0, 1, -1])
    assert np.isnan(got[2])
