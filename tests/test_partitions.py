"""Partitions (issue 12): a tensor defined piecewise, by statements whose where clauses write
different parts of it, has the union of the pieces as its shape, on the CPU and under CUDA
emulation (several options, nvcc through conftest). Pieces that overlap, leave elements no
statement writes, or extend a tensor after another statement used it are a TCPartitionError
(a TCRangeError) at the statement, with an example point.
"""

import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage import TCPartitionError

M = tc.MappingOptions
rng = np.random.default_rng(1212)

OPTIONS = [
    M(),
    M().tile(2).mapToThreads(2).mapToBlocks(3).useSharedMemory(True),
    M().tile(4, 2).mapToThreads(4).mapToBlocks(2).useSharedMemory(True).usePrivateMemory(True),
]

CASES = {
    # the example: O(0) = 0, then O(i) = X(i) for the rest
    "head": ("""def f(float(N) X) -> (O) {
        O(i) = 0 where i in 0:1
        O(i) = X(i) where i in 1:N }""",
             lambda X: np.concatenate([[0], X[1:]])),
    # three pieces, the last between the others: a shift with a different value at each end
    "three": ("""def f(float(N) X) -> (O) {
        O(i) = -1 where i in 0:1
        O(i) = 7 where i in N+1:N+2
        O(i) = X(i-1) * 2 where i in 1:N+1 }""",
              lambda X: np.concatenate([[-1], 2 * X, [7]])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_piecewise_tensor_on_the_cpu(case):
    src, ref = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        fn = tc.define(src).f
    X = rng.standard_normal(6).astype(np.float32)
    expected = ref(X).astype(np.float32)
    assert fn.output_shapes(X) == [expected.shape]
    np.testing.assert_allclose(fn(X), expected, rtol=1e-6)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_piecewise_tensor_under_cuda_emulation(case, options):
    src, ref = CASES[case]
    X = rng.standard_normal(7).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (options without effect)
        k = tc.compile(src, "f", X, options=options, target="cuda-emulated")
    np.testing.assert_allclose(k(X), ref(X).astype(np.float32), rtol=1e-6)


def test_piecewise_2d_with_a_border_row_and_a_reader():
    """Row 0 is zero, rows 1..N are 2 X; a later statement reads the whole assembled tensor."""
    src = """def f(float(N, K) X) -> (O, S) {
      O(i, j) = 0 where i in 0:1, j in 0:K
      O(i, j) = X(i-1, j) * 2 where i in 1:N+1, j in 0:K
      S(i) +=! O(i, j) }"""
    X = rng.standard_normal((4, 3)).astype(np.float32)
    O = np.concatenate([np.zeros((1, 3)), 2 * X]).astype(np.float32)
    fn = tc.define(src).f
    out, s = fn(X)
    np.testing.assert_allclose(out, O, rtol=1e-6)
    np.testing.assert_allclose(s, O.sum(1), rtol=1e-5, atol=1e-6)
    k = tc.compile(src, "f", X, options=M().tile(2, 2).mapToThreads(2, 2).useSharedMemory(True),
                   target="cuda-emulated")
    for got, want in zip(k(X), (O, O.sum(1))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_update_within_the_tensor_is_not_a_piece():
    """`O(i) = 0 where i in 1:2` after O = X writes within O (for N >= 2): an ordinary update
    of O's shape, as before."""
    src = """def f(float(N) X) -> (O) {
      O(i) = X(i) where i in 0:N
      O(i) = 0 where i in 1:2 }"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (the write is within O only if N >= 2)
        fn = tc.define(src).f
    X = rng.standard_normal(5).astype(np.float32)
    expected = X.copy()
    expected[1] = 0
    np.testing.assert_array_equal(fn(X), expected)


def _error(src) -> TCPartitionError:
    with pytest.raises(TCPartitionError) as e:
        tc.define(src)
    assert isinstance(e.value, tc.TCRangeError)
    assert e.value.span is not None
    return e.value


def test_overlapping_pieces_are_an_error():
    e = _error("""def f(float(N) X) -> (O) {
      O(i) = 0 where i in 0:2
      O(i) = X(i) where i in 1:N }""")
    assert "overlaps the piece 'O(i) = 0 where i in 0:2' (0 <= i < 2)" in e.message
    assert "(at i = 1 for N = " in e.message
    assert e.span.text().startswith("O(i) = X(i) where i in 1:N")


def test_pieces_with_a_hole_are_an_error():
    e = _error("""def f(float(N) X) -> (O) {
      O(i) = 0 where i in 0:1
      O(i) = X(i) where i in 2:N }""")
    assert "leave elements no statement writes (at i = 1 for N = " in e.message
    assert "'O(i) = X(i) where i in 2:N' (2 <= i < N)" in e.message


def test_a_piece_after_a_read_is_an_error():
    e = _error("""def f(float(N) X) -> (O, P) {
      O(i) = 0 where i in 0:1
      P(i) = O(i) + 1
      O(i) = X(i) where i in 1:N }""")
    assert "after 'P(i) = O(i) + 1' used O" in e.message


def test_an_update_past_the_shape_is_an_error_that_names_the_update():
    """An update without '!' reads the values it updates: past the shape the statements
    before it set there are none. The error says so, where it named the statement itself as
    the reader and asked to move it before itself (found by the gradient fuzzer, seed 975399)."""
    e = _error("""def f(float(M, L) A, float(L) W) -> (O) {
      O(n, i) *=! fmax(A(n, 2 * i + 1), W(L - 1 - n))
      O(k, i) max= fmax(A(q, k), -W(i)) where k in 0:L }""")
    assert "this statement updates O outside its shape (0 <= k < min(L, M), 0 <= i < L/2)" \
        in e.message
    assert "move this statement before" not in e.message
    assert any("'max=!'" in note for note in e.notes)
    assert e.span.text().startswith("O(k, i) max= fmax(A(q, k), -W(i))")
