"""Repeated CPU calls take a short path once a call with the same argument layout was checked
(program._fast_key): it must give the same answers and the same errors as the full path."""

import numpy as np
import pytest

import tcstage as tc

SCALE = "def scale(float(N,M) A, float s) -> (O) { O(i,j) = A(i,j) * s }"
SHIFT = "def shift(float(N) A, int32 k) -> (O) { O(i) = A(i + k) where i in 0:N-k }"


def f32(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def test_new_values_same_layout_give_new_results():
    f = tc.define(SCALE).scale
    for s in (2.0, 3.0, 2.0):
        A = f32(5, 7) + s
        np.testing.assert_allclose(f(A, s), A * np.float32(s), rtol=1e-6)
    assert f.compile_count == 1


def test_layouts_that_differ_in_strides_flags_or_dtype_are_each_checked():
    f = tc.define(SCALE).scale
    A = f32(6, 8)
    np.testing.assert_allclose(f(A, 2.0), A * 2, rtol=1e-6)
    T = np.asfortranarray(A)  # same shape, other strides: copied for Halide, same values
    np.testing.assert_allclose(f(T, 2.0), A * 2, rtol=1e-6)
    R = A.copy()
    R.flags.writeable = False
    np.testing.assert_allclose(f(R, 2.0), A * 2, rtol=1e-6)
    with pytest.raises(tc.TCArgumentError, match="expects A of type float"):
        f(A.astype(np.float64), 2.0)
    with pytest.raises(tc.TCArgumentError, match="expects A of rank 2"):
        f(A[0], 2.0)


def test_scalars_in_subscripts_are_part_of_the_layout():
    f = tc.define(SHIFT).shift
    A = np.arange(10, dtype=np.float32)
    for k in (1, 3, 1, 3):
        np.testing.assert_array_equal(f(A, k), A[k:])


def test_several_outputs_come_back_as_a_tuple_every_time():
    f = tc.define("def two(float(N) A) -> (B, C) { B(i) = A(i) + 1\n C(i) = A(i) * 2 }").two
    A = f32(9)
    for _ in range(2):
        B, C = f(A)
        np.testing.assert_allclose(B, A + 1, rtol=1e-6)
        np.testing.assert_allclose(C, A * 2, rtol=1e-6)
