"""The public API: argument checking, shapes, caching, schedules, scalar types, temporaries."""

import warnings

import numpy as np
import pytest

import tcstage as tc

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def mm():
    return tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }").mm


def test_program_access(mm):
    prog = tc.define("def a(float(N) X) -> (Y) { Y(i) = X(i) }\n"
                     "def b(float(N) X) -> (Y) { Y(i) = -X(i) }")
    assert prog.names == ["a", "b"]
    assert prog.a is prog["a"]
    assert [f.name for f in prog] == ["a", "b"]


def test_shapes_from_shapes_or_arrays(mm):
    assert mm.output_shapes((3, 4), (4, 5)) == [(3, 5)]
    assert mm.output_shapes(f32(3, 4), f32(4, 5)) == [(3, 5)]


@pytest.mark.parametrize("args, fragment", [
    (((3, 4),), "takes 2 inputs (A, B), got 1"),
    (((3, 4), (5, 6)), "size variable K is 4 from A dimension 1 but 5 from B dimension 0"),
    (((3,), (3, 4)), "expects A of rank 2"),
    ((np.zeros((3, 4), np.float64), (4, 5)), "expects A of type float32 (numpy float32), got float64"),
    (("A", (4, 5)), "expects A as an array or a shape tuple, got str"),
    (((3, -4), (4, 5)), "negative size"),
])
def test_argument_errors_name_tensor_and_dimension(mm, args, fragment):
    with pytest.raises(tc.TCArgumentError) as info:
        mm.output_shapes(*args)
    assert fragment in str(info.value)


def test_call_requires_arrays(mm):
    with pytest.raises(tc.TCArgumentError, match=r"expects A as an array \(numpy, or a device array"):
        mm((3, 4), f32(4, 5))


def test_second_call_reuses_the_compiled_kernel(mm):
    A, B = f32(6, 5), f32(5, 4)
    mm(A, B)
    compiled = mm.compile_count
    np.testing.assert_allclose(mm(A, B), A @ B, rtol=1e-5, atol=1e-5)
    assert mm.compile_count == compiled  # no new compilation for the same shapes
    mm(f32(7, 5), B)
    assert mm.compile_count == compiled  # nor for others: the kernel is shape-generic
    mm(f32(7, 5), B, specialize_shapes=True)
    assert mm.compile_count == compiled + 1


@pytest.mark.parametrize("schedule", [None, "Mullapudi2016", "Adams2019", "Li2018"])
def test_every_cpu_schedule_is_correct(mm, schedule):
    A, B = f32(33, 17), f32(17, 29)
    np.testing.assert_allclose(mm(A, B, schedule=schedule), A @ B, rtol=1e-4, atol=1e-4)


def test_unknown_schedule_is_an_error(mm):
    with pytest.raises(tc.TCError, match="unknown CPU schedule 'Fast'"):
        mm(f32(2, 2), f32(2, 2), schedule="Fast")


def test_noncontiguous_inputs_are_handled(mm):
    A, B = f32(8, 6), f32(4, 6)
    np.testing.assert_allclose(mm(A[::2], B.T), A[::2] @ B.T, rtol=1e-5, atol=1e-5)


def test_ranges_symbolic_and_concrete(mm):
    symbolic = mm.ranges()[0]
    assert symbolic.symbolic == {"i": "0 <= i < M", "j": "0 <= j < N", "k": "0 <= k < K"}
    assert symbolic.concrete == {}
    concrete = mm.ranges((3, 4), (4, 5))[0]
    assert concrete.concrete == {"i": (0, 3), "j": (0, 5), "k": (0, 4)}
    assert "C(i,j) +=! A(i,k) * B(k,j)" in str(concrete)


@pytest.mark.parametrize("tc_type, np_type", [
    ("double", np.float64), ("half", np.float16), ("int8", np.int8), ("int16", np.int16),
    ("int64", np.int64), ("uint8", np.uint8), ("uint16", np.uint16), ("uint32", np.uint32),
    ("uint64", np.uint64), ("byte", np.uint8), ("int", np.int32),
])
def test_scalar_types_round_trip(tc_type, np_type):
    f = tc.define(f"def f({tc_type}(N) X, {tc_type}(N) Y) -> (Z) {{ Z(i) = X(i) + Y(i) * 2 }}").f
    if np.issubdtype(np_type, np.integer):
        info = np.iinfo(np_type)
        X = rng.integers(0, min(info.max // 4, 1000), 9).astype(np_type)
        Y = rng.integers(0, min(info.max // 4, 1000), 9).astype(np_type)
    else:
        X, Y = f32(9).astype(np_type), f32(9).astype(np_type)
    Z = f(X, Y)
    assert Z.dtype == np_type  # the literal 2 takes the tensors' type
    np.testing.assert_allclose(Z.astype(np.float64), X.astype(np.float64) + Y.astype(np.float64) * 2,
                               rtol=1e-2 if np_type == np.float16 else 1e-12)


def test_uint64_keeps_large_values():
    f = tc.define("def f(uint64(N) X) -> (Z) { Z(i) = X(i) + 1 }").f
    X = np.array([2**63 + 5, 7], np.uint64)
    np.testing.assert_array_equal(f(X), X + np.uint64(1))


def test_bool_and_comparisons():
    f = tc.define("def f(float(N) X, bool(N) M) -> (Z, C) {\n"
                  "  Z(i) = M(i) && X(i) > 0 ? X(i) : -X(i)\n"
                  "  C(i) +=! X(i) > X(j)\n}").f
    X, M = f32(7), rng.random(7) < 0.5
    Z, C = f(X, M)
    np.testing.assert_array_equal(Z, np.where(M & (X > 0), X, -X))
    assert C.dtype == np.int32
    np.testing.assert_array_equal(C, (X[:, None] > X[None, :]).sum(axis=1))


def test_integer_division_rounds_down():
    f = tc.define("def f(int(N) X) -> (D, R) { D(i) = X(i) / 3\n R(i) = X(i) % 3 }").f
    X = np.array([-7, -3, -1, 0, 1, 5], np.int32)
    D, R = f(X)
    np.testing.assert_array_equal(D, X // 3)
    np.testing.assert_array_equal(R, X % 3)


def test_builtins_match_numpy():
    f = tc.define("def f(float(N) X) -> (Y) {\n"
                  "  Y(i) = exp(X(i)) + tanh(X(i)) + sqrt(fabs(X(i))) + rsqrt(1 + X(i) * X(i))"
                  " + fmaxf(X(i), 0.5) + pow(fabs(X(i)), 1.5) + floor(X(i)) + sigmoid(X(i))\n}").f
    X = f32(11)
    ref = (np.exp(X) + np.tanh(X) + np.sqrt(np.abs(X)) + 1 / np.sqrt(1 + X * X)
           + np.maximum(X, 0.5) + np.abs(X) ** 1.5 + np.floor(X) + 1 / (1 + np.exp(-X)))
    np.testing.assert_allclose(f(X), ref, rtol=1e-5, atol=1e-5)


def test_temporaries_and_dimension_references():
    f = tc.define("def f(float(N) A) -> (O) {\n"
                  "  T(i) = A(i) * 2\n"
                  "  O(i) = T(i + 1) - T(i) where i in 0:T.0 - 1\n}").f
    A = f32(10)
    np.testing.assert_allclose(f(A), 2 * (A[1:] - A[:-1]), rtol=1e-5, atol=1e-5)
    assert "T" not in f.checked.outputs and f.checked.tensors["T"].kind == "temp"


def test_update_of_part_of_a_tensor_writes_only_that_part():
    f = tc.define("def f(float(N) A) -> (O) {\n"
                  "  O(i) = A(i)\n"
                  "  O(i) = O(i) * 10 where i in 0:N/2\n}").f
    A = f32(9)
    np.testing.assert_allclose(f(A), np.concatenate([A[:4] * 10, A[4:]]), rtol=1e-6)


def test_min_and_max_reductions_start_from_infinity():
    f = tc.define("def f(float(N,M) A) -> (Lo, Hi) { Lo(i) min=! A(i,j)\n Hi(i) max=! A(i,j) }").f
    A = f32(4, 6) * 1e30
    Lo, Hi = f(A)
    np.testing.assert_array_equal(Lo, A.min(axis=1))
    np.testing.assert_array_equal(Hi, A.max(axis=1))


def test_scalar_inputs_and_their_types():
    f = tc.define("def f(float a, int n, float(N) X) -> (Y) { Y(i) = a * X(i) + n }").f
    X = f32(5)
    np.testing.assert_allclose(f(2.5, 3, X), 2.5 * X + 3, rtol=1e-6)
    np.testing.assert_allclose(f(np.float32(2.5), np.int64(3), X), 2.5 * X + 3, rtol=1e-6)
    with pytest.raises(tc.TCArgumentError, match="scalar input n of 'f' is int32, got float"):
        f(2.5, 3.5, X)
    with pytest.raises(tc.TCArgumentError, match="out of its range"):
        f(2.5, 2**40, X)


def test_scalar_specialisation_caches_per_value():
    f = tc.define("def s(int st, float(N) X) -> (Y) { Y(i) = X(st * i) }").s
    X = f32(10)
    np.testing.assert_array_equal(f(2, X), X[::2])
    np.testing.assert_array_equal(f(3, X), X[::3])
    np.testing.assert_array_equal(f(2, X), X[::2])
    assert sorted(spec for spec, *_ in f._kernels) == [(("st", 2),), (("st", 3),)]
    with pytest.raises(tc.TCArgumentError, match="specialises on scalar input"):
        f.ranges()
    assert f.ranges(3, (10,))[0].concrete == {"i": (0, 4)}


def test_in_out_output_errors():
    f = tc.define("def acc(float(N) X) -> (Y) { Y(i) += X(i) }").acc
    X = f32(4)
    with pytest.raises(tc.TCArgumentError, match="out= takes 1 array"):
        f(X, out=(f32(4), f32(4)))
    frozen = f32(4)
    frozen.flags.writeable = False
    with pytest.raises(tc.TCArgumentError, match="read-only"):
        f(X, out=frozen)
    with pytest.raises(tc.TCArgumentError, match="expects Y of type float32"):
        f(X, out=np.zeros(4, np.float64))


def test_negative_output_extent_is_an_argument_error():
    f = tc.define("def st(float(N) B, float(M) K) -> (A) { A(i) +=! B(i + k) * K(k) }").st
    with pytest.raises(tc.TCArgumentError, match="negative extent -2 in dimension 0"):
        f(f32(3), f32(6))


def test_precondition_violated_at_run_time_is_reported_not_a_crash():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        f = tc.define("def pre(float(I) B, float(K) C, float(J) D) -> (A) {"
                      " A(i, j) = B(i) * C(i + j) * D(j) }").pre
    with pytest.raises(tc.TCArgumentError, match="running 'pre' failed.*C"):
        f(f32(5), f32(3), f32(4))  # needs C of at least I + J - 1 = 8 elements


def test_warnings_point_at_the_caller():
    with pytest.warns(tc.TCWarning) as record:
        tc.define("def lut(float(J) B, int(I) C) -> (A) { A(i) = B(C(i)) }")
    assert record[0].filename == __file__


def test_constant_sizes_are_checked():
    f = tc.define("def f(float(3) X) -> (Y) { Y(i) = X(i) }").f
    with pytest.raises(tc.TCArgumentError, match="X dimension 0 must have size 3, got 4"):
        f(f32(4))


def test_zero_rank_output():
    f = tc.define("def total(float(N) X) -> (S) { S() +=! X(i) }").total
    X = f32(10)
    S = f(X)
    assert S.shape == ()
    np.testing.assert_allclose(S, X.sum(), rtol=1e-5)


def test_lowered_funcs_are_inspectable(mm):
    text = mm.lower().describe()
    assert "Func C (output, float32)" in text
    assert "A_im" in text and "B_im" in text
