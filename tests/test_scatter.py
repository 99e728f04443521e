"""Scatter statements: `T(I(i), j) += ...` accumulates at computed subscripts into a tensor an
earlier statement defined. On the CPU and as emulated CUDA kernels, against numpy."""

import re
import warnings

import numpy as np
import pytest

import tcstage as tc

SRC = """
def histogram(int(N) I, float(N) V) -> (H) {
  H(b) = 0 where b in 0:8
  H(I(i)) += V(i)
}
def shifted(float(N) X) -> (O) {
  O(i) = X(i)
  O(i + 1) += 2 * X(i) where i in 0:N-1
}
def diagonal(float(N,N) X) -> (O) {
  O(i, j) = 0 where i in 0:N, j in 0:N
  O(i, i) += X(i, j)
}
def scatter_max(int(N,K) I, float(N,K) V) -> (M) {
  M(b, k) = -1000 where b in 0:5, k in 0:K
  M(I(n, k), k) max= V(n, k)
}
def embedding_grad(int(B,L) I, float(B,D) dO) -> (dT) {
  dT(e, d) = 0 where e in 0:10, d in 0:D
  dT(I(b, l), d) += dO(b, d)
}
"""

RNG = np.random.default_rng(0)
IDX = RNG.integers(0, 8, 20).astype(np.int32)
VAL = RNG.standard_normal(20).astype(np.float32)
X1 = RNG.standard_normal(6).astype(np.float32)
X2 = RNG.standard_normal((4, 4)).astype(np.float32)
I2 = RNG.integers(0, 5, (7, 3)).astype(np.int32)
V2 = RNG.standard_normal((7, 3)).astype(np.float32)
I3 = RNG.integers(0, 10, (3, 5)).astype(np.int32)
D3 = RNG.standard_normal((3, 4)).astype(np.float32)


def references():
    hist = np.zeros(8, np.float32)
    np.add.at(hist, IDX, VAL)
    shifted = X1.copy()
    shifted[1:] += 2 * X1[:-1]
    smax = np.full((5, 3), -1000, np.float32)
    for n in range(7):
        for k in range(3):
            smax[I2[n, k], k] = max(smax[I2[n, k], k], V2[n, k])
    emb = np.zeros((10, 4), np.float32)
    for b in range(3):
        for ll in range(5):
            emb[I3[b, ll]] += D3[b]
    return {"histogram": ((IDX, VAL), hist), "shifted": ((X1,), shifted),
            "diagonal": ((X2,), np.diag(X2.sum(1))), "scatter_max": ((I2, V2), smax),
            "embedding_grad": ((I3, D3), emb)}


CASES = references()


@pytest.fixture(scope="module")
def prog():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # data-dependent subscripts: unchecked
        return tc.define(SRC)


@pytest.mark.parametrize("name", list(CASES))
def test_cpu(prog, name):
    args, expected = CASES[name]
    np.testing.assert_allclose(prog[name](*args), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_cuda(prog, name):
    args, expected = CASES[name]
    options = tc.MappingOptions().tile(4).mapToThreads(4, 2).mapToBlocks(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(prog, name, *args, options=options, target="cuda-emulated")
    np.testing.assert_allclose(kernel(*args), expected, rtol=1e-5, atol=1e-6)


def test_data_dependent_subscript_is_an_unchecked_precondition():
    with pytest.warns(tc.TCWarning, match=r"subscript 'I\(i\)' of H depends on tensor values"):
        tc.define(SRC.split("def shifted")[0])


def test_the_write_bounds_the_range_like_a_read():
    """As for any update of a tensor with a shape (spec 001), the left-hand subscripts keep
    the ranges within it: `O(i + 1) += X(i)` runs for i < N - 1, as with the where clause."""
    src = """def f(float(N) X) -> (O) {
  O(i) = X(i)
  O(i + 1) += 2 * X(i)
}"""
    np.testing.assert_allclose(tc.define(src).f(X1), CASES["shifted"][1], rtol=1e-6)


@pytest.mark.parametrize("src, message", [
    ("def f(int(N) I, float(N) V) -> (H) { H(I(i)) += V(i) }",
     "writes at computed subscripts, which only an update of a tensor defined by an earlier"),
    ("def f(int(N) I, float(N) V) -> (H) {\n H(b) = 0 where b in 0:4\n H(I(i)) = V(i)\n}",
     "with '=', two points writing one element"),
    ("def f(int(N) I, float(N) V) -> (H) {\n H(b) = 0 where b in 0:4\n H(I(i)) +=! V(i)\n}",
     "'+=!' would start from the identity"),
    ("def f(float(N) X, float(N) V) -> (H) {\n H(b) = 0 where b in 0:4\n H(X(i)) += V(i)\n}",
     "a subscript must be an integer"),
    # (this said "read at a different point than it is written (H())")
    ("def f(int(N) I, float(N) V) -> (H) {\n H(b) = 0 where b in 0:4\n H(I(i)) += H(i)\n}",
     "'H' is read by a statement that writes it at computed subscripts"),
    ("def f(int(N) I, float(N) V) -> (H) {\n H(b) = 0 where b in 0:4\n H(I(i)) += H(I(i))\n}",
     "'H' is read by a statement that writes it at computed subscripts"),
    ("def f(float(N) V) -> (H) { H(i, i) = V(i) }", "appears twice on the left-hand side"),
])
def test_errors(src, message):
    with pytest.raises(tc.TCError, match=re.escape(message)):
        tc.define(src)


def test_scalar_input_as_a_subscript():
    src = """def at(float(N) A, int s) -> (O) {
  O(b) = 0 where b in 0:4
  O(s) += A(i)
}"""
    out = tc.define(src).at(X1, 2)
    np.testing.assert_allclose(out, [0, 0, X1.sum(), 0], rtol=1e-5)


def test_scatter_in_a_called_function(prog):
    src = SRC + """
def twice(int(N) I, float(N) V) -> (T) {
  (H) = histogram(I, V)
  T(b) = 2 * H(b)
}"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        out = tc.define(src).twice(IDX, VAL)
    np.testing.assert_allclose(out, 2 * CASES["histogram"][1], rtol=1e-5)
