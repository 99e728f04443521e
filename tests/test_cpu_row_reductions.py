"""Reductions along rows (the input contiguous in the reduction variable, no second output
dimension to reuse it) vectorise the reduction loop instead of packing the input: their
results against numpy at awkward sizes, for every operator."""

import re
from pathlib import Path

import halide as hl
import numpy as np
import pytest

import tcstage as tc


def accumulators() -> int:
    """Vector registers the scheduler gives a register tile on this machine."""
    return (32 if hl.get_host_target().has_feature(hl.TargetFeature.AVX512) else 16) - 4


def f32(*shape):
    return np.random.default_rng(sum(shape) + 7).standard_normal(shape).astype(np.float32)


CASES = {
    "rowsum": ("def f(float(N,C) A) -> (O) { O(n) +=! A(n,c) }",
               lambda A: A.sum(1), lambda n, c: (f32(n, c),)),
    "rowmax": ("def f(float(N,C) A) -> (O) { O(n) max=! A(n,c) }",
               lambda A: A.max(1), lambda n, c: (f32(n, c),)),
    "rowmin": ("def f(float(N,C) A) -> (O) { O(n) min=! A(n,c) }",
               lambda A: A.min(1), lambda n, c: (f32(n, c),)),
    "rowprod": ("def f(float(N,C) A) -> (O) { O(n) *=! A(n,c) }",
                lambda A: A.prod(1), lambda n, c: (1 + 0.01 * f32(n, c),)),
    "gemv": ("def f(float(N,C) A, float(C) x) -> (O) { O(n) +=! A(n,c) * x(c) }",
             lambda A, x: A @ x, lambda n, c: (f32(n, c), f32(c))),
    "batched": ("def f(float(B,N,C) A) -> (O) { O(b,n) +=! A(b,n,c) * A(b,n,c) }",
                lambda A: (A * A).sum(2), lambda n, c: (f32(3, n, c),)),
    "epilogue": ("def f(float(N,C) A, float(N) s) -> (O) { O(n) +=! A(n,c)\n"
                 " O(n) = O(n) * s(n) }",
                 lambda A, s: A.sum(1) * s, lambda n, c: (f32(n, c), f32(n))),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n, c", [(1, 1), (7, 13), (16, 15), (9, 33), (40, 512), (5, 1001)])
def test_row_reductions_equal_numpy(name, n, c):
    source, reference, inputs = CASES[name]
    f = tc.define(source).f
    args = inputs(n, c)
    got = f(*args)
    want = reference(*(a.astype(np.float64) for a in args))
    scale = np.abs(args[0].astype(np.float64)).sum(-1).max() + 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)


def test_the_schedule_says_it_vectorised_the_reduction():
    text = tc.define(CASES["rowsum"][0]).f.explain(f32(40, 512))
    assert text.startswith("CPU schedule: tcstage") and "packed" not in text
    assert "the reduction over" in text and "in vectors of" in text


def test_long_row_sums_keep_four_vectors_of_partials_and_maxima_one():
    """A sum's adds wait for each other: a row of 16 vectors or more keeps 4 vectors of
    partial sums in turn (a maximum's instruction does not wait: one vector); short rows one.
    The values are test_row_reductions_equal_numpy's (5 x 1001: a partial last turn)."""
    assert "8 lanes, 4 vectors in turn" in tc.define(CASES["rowsum"][0]).f.explain(f32(40, 512))
    assert "vectors in turn" not in tc.define(CASES["rowsum"][0]).f.explain(f32(40, 64))
    assert "vectors in turn" not in tc.define(CASES["rowmax"][0]).f.explain(f32(40, 512))


# Softmax's gradient as tc.gradient wrote it statement by statement, before it learnt the
# closed form (docs/gradient.md): the shape of any gradient that sums and spreads over rows
SOFTMAX_GRAD_BY_STATEMENT = """
def softmax_grad(float(N, C) X, float(N, C) Y, float(N, C) d_Y) -> (d_X) {
  M(n) max=! X(n, c)
  E(n, c) = exp(X(n, c) - M(n))
  S(n) +=! E(n, c)
  d_E(n, c) +=! d_Y(n, c) / S(n)
  d_S(n) +=! -(d_Y(n, c) * Y(n, c) / S(n))
  d_E(n, c) += d_S(n) where c in 0:C
  d_X(n, c) +=! d_E(n, c) * E(n, c)
}
"""


def test_a_sum_of_negations_is_vectorised_in_the_fused_row_pipeline():
    # In softmax's gradient, d_S(n) +=! -(d_Y(n,c) * (E(n,c) / S(n)) / S(n)) reached Halide as
    # `d_S(n) + (0 - ...)`, whose associativity Halide cannot prove: its row reduction stayed
    # serial. It is now lowered as the negation of a sum (the same values: negation is
    # exact), vectorised like the others, all in the fused row pipeline, nothing falling back
    # to Mullapudi2016.
    f = tc.define(SOFTMAX_GRAD_BY_STATEMENT).softmax_grad
    X, dY = f32(9, 37), f32(37, 9).T.copy()
    E = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    Y = E / E.sum(1, keepdims=True)
    text = f.explain(X, Y.astype(np.float32), dY)
    assert text.startswith("CPU schedule: tcstage") and "note:" not in text, text
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    assert "a fused row pipeline" in text.splitlines()[1] and "d_X" in text.splitlines()[1], text
    assert "in vectors of" in lines["S"] and "in vectors of" in lines["d_S"], text
    want = Y * (dY - (dY * Y).sum(1, keepdims=True))
    np.testing.assert_allclose(f(X, Y.astype(np.float32), dY), want, rtol=1e-4, atol=1e-5)
    assert f.compile_count == 1


def test_a_softmax_gradient_is_one_pass_per_row_with_no_updates():
    # The gradient's `d_E(n,c) +=! d_Y(n,c) / S(n)` then `d_E(n,c) += d_S(n)` lower to one
    # definition (each update was a pass of its own), and d_E, read once by d_X at its own
    # point, is inlined there; the max it subtracts is no longer differentiated (no ties).
    f = tc.define(SOFTMAX_GRAD_BY_STATEMENT).softmax_grad
    for n, c in [(1, 1), (7, 13), (67, 512)]:
        X, dY = f32(n, c), f32(c, n).T.copy()
        X[:, -1] = X.max(1)  # (a tie in every row)
        E = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
        Y = E / E.sum(1, keepdims=True)
        got = f(X, Y.astype(np.float32), dY)
        np.testing.assert_allclose(got, Y * (dY - (dY * Y).sum(1, keepdims=True)),
                                   rtol=1e-4, atol=1e-6)
    text = f.explain(X, Y.astype(np.float32), dY)
    assert "update" not in text, text
    assert re.search(r"\n  d_E(\$\d+)?: pointwise, inlined into d_X(\$\d+)? \(its one read\)",
                     text), text


@pytest.mark.parametrize("n, c", [(1, 1), (5, 37)])
def test_pointwise_accumulations_fold_into_one_definition(n, c):
    # `+=`, `*=`, `max=` and `min=` over the whole tensor, after its first statement, are one
    # Halide definition on the CPU, with the same operations in the same order: NaN in a
    # max= is still skipped (fmax), a where clause narrower than the tensor stays an update
    f = tc.define("""def f(float(N,C) A, float(N,C) B) -> (O, P) {
  O(n,c) +=! A(n,c)
  O(n,c) += B(n,c) * 2
  O(n,c) *= A(n,c)
  O(n,c) max= B(n,c)
  P(n,c) = A(n,c)
  P(n,c) min= B(n,c)
  P(n,c) += 1 where c in 0:1
}""").f
    A, B = f32(n, c), f32(c, n).T.copy()
    B[0, 0] = np.nan
    O, P = f(A, B)
    a, b = A.astype(np.float64), B.astype(np.float64)
    np.testing.assert_allclose(O, np.fmax((a + b * 2) * a, b), rtol=1e-6)
    want_p = np.fmin(a, b)
    want_p[:, 0] += 1
    np.testing.assert_allclose(P, want_p, rtol=1e-6)
    text = f.explain(A, B)
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    assert re.fullmatch(r"  O(\$\d+)?: pointwise, computed once, .*n in parallel", lines["O"]), \
        text
    assert "definition by definition" in lines["P"], text  # (the partial update stays one)


def test_the_layer_norm_gradient_recomputes_its_centred_input():
    # xc = X - mean is read by var, d_G, d_var and d_xc (the last two in the row pipeline):
    # recomputed by each instead of stored, the results still those of the closed form
    source = (Path(__file__).parent.parent / "examples" / "layers.tc").read_text()
    f = tc.define(tc.gradient(source, "layernorm")).layernorm_grad
    X, G, B, dY = f32(67, 130), f32(130), f32(130) * 0 + 0.5, f32(130, 67).T.copy()
    x = X.astype(np.float64)
    xc = x - x.mean(1, keepdims=True)
    r = 1 / np.sqrt((xc * xc).mean(1, keepdims=True) + 1e-5)
    Y = (G * xc * r + B).astype(np.float32)
    d_X, d_G, d_B = f(X, G, B, Y, dY)
    g = dY * G
    want = r * (g - g.mean(1, keepdims=True) - xc * r * r * (g * xc).mean(1, keepdims=True))
    np.testing.assert_allclose(d_X, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(d_G, (dY * xc * r).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d_B, dY.astype(np.float64).sum(0), rtol=1e-4, atol=1e-4)
    text = f.explain(X, G, B, Y, dY)
    assert re.search(r"\n  xc(\$\d+)?: pointwise, cheap: recomputed by its readers", text), text


def test_a_division_by_a_row_invariant_is_within_two_ulp_and_others_are_exact():
    # `/ S(n)` and `/ C` do not change along c: a product by a reciprocal computed once per
    # row (docs/cpu.md), not correctly rounded; `/ B(n,c)` stays a division per element
    f = tc.define("""def f(float(N,C) A, float(N,C) B, float(N) S) -> (O, P, Q) {
  O(n,c) = A(n,c) / S(n) + A(n,c) / C
  P(n,c) = A(n,c) / B(n,c)
  Q(n,c) = A(n,c) / 4
}""").f
    rng = np.random.default_rng(5)
    A, B, S = (rng.uniform(0.5, 2, shape).astype(np.float32) for shape in
               [(33, 37), (33, 37), (33,)])
    O, P, Q = f(A, B, S)
    with np.errstate(all="ignore"):
        want = A / S[:, None] + A / np.float32(37)
    assert np.max(np.abs(O - want) / np.spacing(want)) <= 2
    np.testing.assert_array_equal(P, A / B)
    np.testing.assert_array_equal(Q, A / np.float32(4))


def test_an_update_halide_cannot_prove_associative_keeps_the_structured_schedule():
    # `0 - A(n,c)` is no negation to lower as one: Halide sees `O(n) + (0 - A(n,c))`, cannot
    # prove it associative and refuses the vectorised reduction. That Func goes without (its
    # register tiles), and nothing falls back to Mullapudi2016.
    f = tc.define("def f(float(N,C) A, float(N,C) B) -> (O, P) {\n"
                  "  O(n) +=! 0 - A(n,c)\n  P(n) +=! B(n,c)\n}").f
    A, B = f32(40, 512), f32(40, 513)[:, :512].copy()
    text = f.explain(A, B)
    assert text.startswith("CPU schedule: tcstage") and "note:" not in text, text
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    assert "in vectors of" not in lines["O"] and "tiles of" in lines["O"], text
    assert "in vectors of" in lines["P"], text  # (the other reduction keeps them)
    O, P = f(A, B)
    np.testing.assert_allclose(O, -A.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(P, B.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


LAYERS = (Path(__file__).parent.parent / "examples" / "layers.tc").read_text()
LOG_SOFTMAX = """def log_softmax(float(N,C) X) -> (O) {
  M(n) max=! X(n,c)
  S(n) +=! exp(X(n,c) - M(n))
  O(n,c) = X(n,c) - M(n) - log(S(n))
}"""


def _softmax(X):
    E = np.exp(X - X.max(1, keepdims=True))
    return E / E.sum(1, keepdims=True)


def _layernorm(X, G, B):
    xc = X - X.mean(1, keepdims=True)
    return G * xc / np.sqrt((xc * xc).mean(1, keepdims=True) + 1e-5) + B


FUSED = {
    "softmax": (LAYERS, "softmax", lambda n, c: (f32(n, c),), _softmax),
    "log_softmax": (LOG_SOFTMAX, "log_softmax", lambda n, c: (f32(n, c),),
                    lambda X: np.log(_softmax(X))),
    "layernorm": (LAYERS, "layernorm", lambda n, c: (f32(n, c), f32(c), f32(c)), _layernorm),
}


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("n, c", [(1, 1), (7, 13), (9, 33), (67, 512), (3, 1001)])
def test_row_pipelines_are_fused_per_block_of_rows(name, n, c):
    """Softmax, log-softmax and layer norm: every Func computed per block of the output's rows
    (one pass over memory, not one per Func), against numpy in float64."""
    source, function, inputs, reference = FUSED[name]
    f = tc.define(source)[function]
    args = inputs(n, c)
    np.testing.assert_allclose(f(*args), reference(*(a.astype(np.float64) for a in args)),
                               rtol=1e-4, atol=1e-5)
    text = f.explain(*args)
    assert "a fused row pipeline" in text and "note:" not in text, text
    assert all("per block of rows" in line or "a fused row pipeline" in line
               or "cheap: recomputed by its readers" in line
               for line in text.splitlines()[1:]), text
    if name == "layernorm":  # (X - mean, read by var and by Y: recomputed, not stored)
        assert re.search(r"\n  xc(\$\d+)?: pointwise, cheap: recomputed by its readers", text), \
            text


NN = (Path(__file__).parent.parent / "examples" / "nn.tc").read_text()


def _groupnorm(X, gamma, beta):
    axes = (2, 3, 4)
    xc = X - X.mean(axes, keepdims=True)
    inv = 1 / np.sqrt((xc * xc).mean(axes, keepdims=True) + 1e-5)
    return gamma[None, :, :, None, None] * xc * inv + beta[None, :, :, None, None], xc, inv


@pytest.mark.filterwarnings("ignore:in '(cross_entropy|embedding_bag_mean)'")
@pytest.mark.parametrize("shape", [(2, 3, 2, 5, 7), (5, 4, 8, 16, 16)])
def test_group_norm_sums_its_groups_in_memory_order(shape):
    """TC's reduction variables come in the order they appear: group norm's mean over (d,h,w)
    ran with d innermost, across rows of memory (17x PyTorch's time). Its reductions now walk
    w innermost, vectorised, in the fused row pipeline; forward and gradient against numpy."""
    n, g, d, h, w = shape
    X, gamma, beta = f32(*shape), f32(g, d), f32(g, d + 1)[:, :d].copy()
    f = tc.define(NN).groupnorm
    want, xc, inv = _groupnorm(X.astype(np.float64), gamma.astype(np.float64),
                               beta.astype(np.float64))
    np.testing.assert_allclose(f(X, gamma, beta), want, rtol=1e-4, atol=1e-5)
    text = f.explain(X, gamma, beta)
    assert "a fused row pipeline" in text and "note:" not in text, text
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    assert "mean_r$z, mean_r$y, mean_r$x (reordered" in lines["mean"], text
    assert "the reduction over mean_r$z in vectors of" in lines["mean"], text

    grad = tc.define(tc.gradient(NN, "groupnorm")).groupnorm_grad
    dY = f32(*shape[::-1]).transpose(4, 3, 2, 1, 0).copy()
    dX, dgamma, dbeta = grad(X, gamma, beta, want.astype(np.float32), dY)
    dY64, axes = dY.astype(np.float64), (2, 3, 4)
    xhat = xc * inv
    np.testing.assert_allclose(dbeta, dY64.sum((0, 3, 4)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dgamma, (dY64 * xhat).sum((0, 3, 4)), rtol=1e-4, atol=1e-4)
    dxhat = dY64 * gamma[None, :, :, None, None]
    want_dX = inv * (dxhat - dxhat.mean(axes, keepdims=True)
                     - xhat * (dxhat * xhat).mean(axes, keepdims=True))
    np.testing.assert_allclose(dX, want_dX, rtol=1e-3, atol=1e-4)
    text = grad.explain(X, gamma, beta, want.astype(np.float32), dY)
    assert "note:" not in text, text
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    for name in ("d_Gamma", "d_Beta"):  # (summed by blocks of rows, with d_X: _column_partials)
        assert re.search(rf"each block's {name}\S*_intm\S* computed with d_X\S*'s rows "
                         rf"\((the sum over |innermost in memory first: ){name}_r\$z",
                         lines[name]), text


@pytest.mark.parametrize("n, c", [(1, 1), (7, 13), (67, 33), (130, 1001)])
def test_a_layer_norm_gradient_sums_its_columns_with_its_rows(n, c):
    """d_G(c) +=! d_Y(n,c) * rsqrt(var(n) + 1e-05) * xc(n,c) and d_Bt(c) +=! d_Y(n,c) sum over
    the rows that d_X's row pipeline computes: each block of rows is summed in that pipeline's
    loop (Halide's rfactor and compute_with), the last block short where the rows are not a
    multiple of it, then the blocks; where they were a pass of their own, the variance was
    one too. The three gradients against numpy in float64."""
    X, G, B, dY = f32(n, c), f32(c), f32(c) + 1, f32(c, n).T.copy()
    grad = tc.define(tc.gradient(LAYERS, "layernorm")).layernorm_grad
    Y = _layernorm(X.astype(np.float64), G, B).astype(np.float32)
    dX, dG, dB = grad(X, G, B, Y, dY)
    X64, dY64 = X.astype(np.float64), dY.astype(np.float64)
    xc = X64 - X64.mean(1, keepdims=True)
    inv = 1 / np.sqrt((xc * xc).mean(1, keepdims=True) + 1e-5)
    xhat, dxhat = xc * inv, dY64 * G
    np.testing.assert_allclose(dB, dY64.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dG, (dY64 * xhat).sum(0), rtol=1e-4, atol=1e-4)
    want = inv * (dxhat - dxhat.mean(1, keepdims=True)
                  - xhat * (dxhat * xhat).mean(1, keepdims=True))
    np.testing.assert_allclose(dX, want, rtol=1e-3, atol=2e-4)
    text = grad.explain(X, G, B, Y, dY)
    assert "note:" not in text and "a fused row pipeline" in text, text
    for name in ("d_G", "d_Bt"):
        assert re.search(rf"\n  {name}(\$\d+)?: reduction \(add\) over {name}_r\$x, by blocks "
                         rf"of {name}_r\$x: each block's {name}\S*_intm\S* computed with d_X",
                         text), text


COLUMNS = """def columns(float(N,C) X, float(N,C) D) -> (Y, CM, CS, W) {
  m(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - m(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
  CM(c) max=! e(n,c) * D(n,c)
  CS(c) +=! D(n,c) / s(n)
  W(c,k) +=! X(n,c) * D(n,k)
}"""


@pytest.mark.parametrize("n, c", [(1, 3), (37, 20), (200, 64)])
def test_column_maxima_and_sums_of_a_row_pipeline_are_computed_with_it(n, c):
    """Beside a softmax's rows, a column maximum of its exponentials and a column sum of D
    divided by its row sums are computed per block of its rows; a contraction over the rows
    (W, a linear layer's weight gradient) is not, and neither is a column sum of the output
    itself (Halide fuses only loops that do not depend on each other). Against numpy."""
    X, D = f32(n, c), f32(c, n).T.copy()
    f = tc.define(COLUMNS).columns
    Y, CM, CS, W = f(X, D)
    X64, D64 = X.astype(np.float64), D.astype(np.float64)
    e = np.exp(X64 - X64.max(1, keepdims=True))
    s = e.sum(1, keepdims=True)
    np.testing.assert_allclose(Y, e / s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(CM, (e * D64).max(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(CS, (D64 / s).sum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(W, X64.T @ D64, rtol=1e-4, atol=1e-4)
    text = f.explain(X, D)
    assert "note:" not in text and "a fused row pipeline" in text, text
    lines = {line.split(":")[0].strip().split("$")[0]: line for line in text.splitlines()[1:]}
    assert "by blocks of CM_r$x" in lines["CM"] and "by blocks of CS_r$x" in lines["CS"], text
    assert "by blocks" not in lines["W"], text


def test_a_failure_to_sum_columns_with_the_rows_falls_back_to_a_pass_of_their_own(monkeypatch):
    """Where Halide refused the column sums inside the row pipeline (a bug in tcstage), the
    pipeline is scheduled again without them, not left to an autoscheduler: the results stay
    right and the row pipeline stays."""
    from tcstage.cpu import scheduler

    def refused(*args, **kwargs):
        raise hl.HalideError("Invalid compute_with (simulated)")
    monkeypatch.setattr(scheduler, "_column_partials", refused)
    X, G, B, dY = f32(29, 24), f32(24), f32(24), f32(29, 24)
    grad = tc.define(tc.gradient(LAYERS, "layernorm")).layernorm_grad
    _, dG, dB = grad(X, G, B, dY, dY)
    X64, dY64 = X.astype(np.float64), dY.astype(np.float64)
    xc = X64 - X64.mean(1, keepdims=True)
    np.testing.assert_allclose(dB, dY64.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dG, (dY64 * xc / np.sqrt((xc * xc).mean(1, keepdims=True) + 1e-5)
                                    ).sum(0), rtol=1e-4, atol=1e-4)
    text = grad.explain(X, G, B, dY, dY)
    assert "note:" not in text and "a fused row pipeline" in text and "by blocks" not in text, \
        text


def test_a_weight_gradient_sums_along_memory_in_vectors():
    """d_Wt(f,c,kh,kw) +=! d_O(n,f,h,w) * (I(n,c,h+kh-1,w+kw-1) ?? 0): an output too narrow
    to vectorise (kw has 3 points) summed over n, h, w. Its register tiles ran one lane wide;
    it now sums along w, contiguous in both reads, in vectors of partial sums, one per tap and
    output channel of a tile (4 channels here, all there are). Against numpy on np.pad."""
    grad = tc.define(tc.gradient(LAYERS, "padconv")).padconv_grad
    I, Wt, dO = f32(2, 5, 9, 37), f32(4, 5, 3, 3), f32(2, 4, 9, 37)
    dI, dWt = grad(I, Wt, dO, dO)  # (O, the forward's output, is not read)
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros(Wt.shape)
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh, kw] = np.einsum("nfhw,nchw->fc", dO, P[:, :, kh:kh + 9, kw:kw + 37])
    np.testing.assert_allclose(dWt, want, rtol=1e-4, atol=1e-3)
    Q = np.pad(dO.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want_dI = sum(np.einsum("nfhw,fc->nchw", Q[:, :, 2 - kh:11 - kh, 2 - kw:39 - kw],
                            Wt[:, :, kh, kw]) for kh in range(3) for kw in range(3))
    np.testing.assert_allclose(dI, want_dI, rtol=1e-4, atol=1e-3)
    lines = {line.split(":")[0].strip().split("$")[0]: line
             for line in grad.explain(I, Wt, dO, dO).splitlines()[1:]}
    assert "tiles of 3 x 4 of f, each point a vector of partial sums along" in lines["d_Wt"], \
        lines


WGRAD = """
def wgrad(float(N,F,H,W) dO, float(N,C,H,W) I) -> (dW) {
  dW(f,c,kh,kw) +=! dO(n,f,h,w) * (I(n,c,h+kh-1,w+kw-1) ?? 0) where kh in 0:3, kw in 0:3
}"""


@pytest.mark.parametrize("N, C, F, H, W", [(3, 5, 11, 7, 37), (1, 2, 1, 3, 3), (2, 3, 17, 5, 2)])
def test_a_weight_gradient_shares_its_loads_across_a_tile_of_taps_and_channels(N, C, F, H, W):
    """Each point of a tile (3 taps x up to 8 output channels) keeps a vector of partial sums
    along w in registers: one load of dO serves the three taps, one of I every channel. At
    prime sizes (the last tile of channels partial), and narrower than a vector."""
    fn = tc.define(WGRAD).wgrad
    dO, I = f32(N, F, H, W), f32(N, C, H, W)
    P = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((F, C, 3, 3))
    for kh in range(3):
        for kw in range(3):
            want[:, :, kh, kw] = np.einsum("nfhw,nchw->fc", dO, P[:, :, kh:kh + H, kw:kw + W])
    np.testing.assert_allclose(fn(dO, I), want, rtol=1e-4, atol=1e-4)
    text = fn.explain(dO, I)
    # (3 taps x rows vectors of partials in the registers: 28 with AVX-512, 12 without; one
    # output channel: the rows go along kh instead)
    rows = min(8, F, accumulators() // 3) if F > 1 else 3
    assert f"tiles of 3 x {rows} of {'f' if F > 1 else 'kh'}, each point a vector of partial " \
        "sums along" in text, text


VALID_WGRAD = """
def wgrad(float(N,F,OH,OW) dO, float(N,C,H,W) I) -> (dW) {
  dW(f,c,kh,kw) +=! dO(n,f,h,w) * I(n,c,h+kh,w+kw) where kh in 0:3, kw in 0:3
}"""
LANES = hl.get_host_target().natural_vector_size(hl.Float(32))


def wgrad_reference(dO, I):
    H, W = dO.shape[2], dO.shape[3]
    want = np.zeros((dO.shape[1], I.shape[1], 3, 3))
    with np.errstate(invalid="ignore"):  # (inf - inf: NaN, as in the float32 sum)
        for kh in range(3):
            for kw in range(3):
                want[:, :, kh, kw] = np.einsum("nfhw,nchw->fc", dO.astype(np.float64),
                                               I[:, :, kh:kh + H, kw:kw + W].astype(np.float64))
    return want


def test_a_weight_gradient_sums_rows_of_whole_vectors():
    """A convolution without padding: its weight gradient sums rows of OW = W - 2 points, 30
    here, not a multiple of a vector. The last vector of each row was masked, and Halide then
    kept the tile's partial sums in memory, with masked loads and stores, for the whole loop
    (8x16x32x32 on AVX2: 2.7 ms, PyTorch 0.9). The sum now runs over 32 points, reading
    zero-padded copies of the inputs, and adds nothing past w = 29, even where I holds inf
    there: I's column 30 is read by taps kw = 1, 2 (inf or NaN, as numpy has it) and not by
    kw = 0, which must stay finite (0 * inf would be NaN)."""
    fn = tc.define(VALID_WGRAD).wgrad
    dO, I = f32(2, 4, 6, 30), f32(2, 3, 8, 32)
    np.testing.assert_allclose(fn(dO, I), wgrad_reference(dO, I), rtol=1e-4, atol=1e-4)
    line = next(line for line in fn.explain(dO, I).splitlines() if line.startswith("  dW"))
    assert "a vector of partial sums along" in line, line
    assert f"its sum over w runs to a multiple of {LANES} (whole vectors" in line, line
    I[:, :, :, 30] = np.inf
    got, want = fn(dO, I), wgrad_reference(dO, I)
    assert np.isfinite(got[..., 0]).all() and not np.isfinite(got[..., 1:]).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_a_rounded_weight_gradient_serves_every_width():
    """One kernel (planned at OW = 30) called at widths below a vector, at one past a vector
    and at whole vectors: each against numpy, none falling back."""
    import warnings
    fn = tc.define(VALID_WGRAD).wgrad
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        for ow in (30, 1, 3, LANES + 1, 2 * LANES, 45):
            dO, I = f32(2, 5, 4, ow), f32(2, 3, 6, ow + 2)
            np.testing.assert_allclose(fn(dO, I), wgrad_reference(dO, I), rtol=1e-4,
                                       atol=1e-4)
    assert fn.compile_count <= 2, fn.compile_count


def test_a_rounded_sum_clamps_what_it_reads_of_a_computed_tensor():
    """The rounded sum reads a tensor the function computes (no padded copy of an input):
    its subscripts are clamped past the row instead, and those points still add nothing."""
    fn = tc.define("""
def wgrad2(float(N,F,OH,OW) dO, float(N,C,H,W) I) -> (dW, T) {
  T(n,f,h,w) = exp(dO(n,f,h,w))
  dW(f,c,kh,kw) +=! T(n,f,h,w) * I(n,c,h+kh,w+kw) where kh in 0:3, kw in 0:3
}""").wgrad2
    dO, I = f32(2, 4, 5, 30), f32(2, 3, 7, 32)
    dW, T = fn(dO, I)
    np.testing.assert_allclose(T, np.exp(dO.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(dW, wgrad_reference(np.exp(dO.astype(np.float64)), I),
                               rtol=1e-4, atol=1e-4)
    assert "; its sum over w runs to a multiple of" in fn.explain(dO, I)


def test_tap_tiles_serve_calls_with_more_taps_than_planned():
    """A kernel serves other sizes: planned where p0 (the taps) is narrow, called where it is
    wider, its tiles repeat along p0 instead of overflowing one fixed-size tile (a batched
    matrix product's gradient in examples/any_rank_torch.py ran unscheduled, with a warning,
    when they did not). Every call checked against numpy, and none may fall back."""
    import warnings
    mm = "def mm(float(D,I,K) A, float(D,K,J) B) -> (C) { C(d,i,j) +=! A(d,i,k) * B(d,k,j) }"
    fn = tc.define(tc.gradient(mm, "mm")).mm_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        for d, i, j, k in [(32, 6, 8, 8), (32, 6, 8, 6), (3, 5, 17, 7), (32, 6, 6, 3), (2, 7, 19, 13)]:
            a, b, dc = f32(d, i, k), f32(d, k, j), f32(d, i, j)
            da, db = fn(a, b, a @ b, dc)
            np.testing.assert_allclose(da, dc @ b.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(db, a.transpose(0, 2, 1) @ dc, rtol=1e-4, atol=1e-4)


QUIET_SCRIPT = f"""
import numpy as np, tcstage as tc
f = tc.define({SOFTMAX_GRAD_BY_STATEMENT!r}).softmax_grad
rng = np.random.default_rng(0)
X, dY = rng.standard_normal((2, 512, 1024)).astype(np.float32)
E = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
Y = E / E.sum(1, keepdims=True)
want = Y * (dY - (dY * Y).sum(1, keepdims=True))
np.testing.assert_allclose(f(X, Y.astype(np.float32), dY), want, rtol=1e-4, atol=1e-5)
"""


def test_compiling_a_row_pipeline_prints_nothing(tmp_path):
    """Halide warned, at every compile, of an update the structured schedule left to its
    default (the negation closing d_M's row sum in softmax's gradient, at 512x1024): such
    updates are marked as meant. In a new process with an empty kernel cache, so that it
    compiles."""
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", QUIET_SCRIPT], capture_output=True, text=True,
                       cwd=Path(__file__).parent.parent, timeout=600,
                       env={**os.environ, "TCSTAGE_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == r.stderr == ""  # (Halide's Python module prints its warnings to stdout)


ROW_COPIES = """
def stats(float(N,C) X) -> (Y, m_out, s_out) {
  m(n) max=! X(n,c)
  s(n) +=! exp(X(n,c) - m(n))
  Y(n,c) = exp(X(n,c) - m(n)) / s(n)
  m_out(i) = m(i)
  s_out(i) = s(i)
}
"""


@pytest.mark.parametrize("n, c", [(1, 5), (37, 19), (256, 512)])
def test_outputs_copying_a_row_pipelines_reductions_are_computed_with_its_rows(n, c):
    """Outputs that copy a row pipeline's per-row reductions (as a forward keeping what its
    backward reads writes them, tcstage.grad.keeping) are computed with the pipeline's blocks
    (Halide's compute_with, the row variable renamed to the pipeline's): the reductions stay
    in the pipeline, not passes of their own. Against numpy, at sizes with short blocks."""
    fn = tc.define(ROW_COPIES).stats
    x = f32(n, c)
    report = fn.explain(x)
    name = r"(\$\d+)?"  # (each compile of a function names its Funcs afresh)
    assert re.search(rf"\n  Y{name}: a fused row pipeline", report)
    assert re.search(rf"\n  m_out{name}: a copy of the rows' values, computed with "
                     rf"Y{name}'s blocks of rows", report)
    assert re.search(rf"\n  s_out{name}: a copy of the rows' values", report)
    y, m, s = fn(x)
    xd = x.astype(np.float64)
    md = xd.max(1)
    sd = np.exp(xd - md[:, None]).sum(1)
    np.testing.assert_allclose(m, md, rtol=1e-6)
    np.testing.assert_allclose(s, sd, rtol=1e-5)
    np.testing.assert_allclose(y, np.exp(xd - md[:, None]) / sd[:, None], rtol=1e-5, atol=1e-7)


def test_the_last_block_of_rows_shares_the_pipelines_code(tmp_path, monkeypatch):
    """The row pipeline's loop over blocks of rows is not partitioned: the last, shorter block
    tests each row, where Halide would otherwise copy the whole pipeline for it (a group norm
    gradient's code twice over: 2.4 s of compiling at its first call, 1.1-1.4 without). Seen in
    the lowered statement: each stage of the layer norm gradient is produced once. Rows that
    are no multiple of the block (67) against numpy."""
    from tcstage.halide import aot
    if not aot.enabled():
        pytest.skip("the kernel cache is off here")
    statements = []
    real = aot._native.compile_object

    def compile_object(pipeline, path, arguments, name, target):
        stmt = str(tmp_path / f"{len(statements)}.stmt")
        pipeline.compile_to_lowered_stmt(stmt, arguments, hl.StmtOutputFormat.Text, target)
        statements.append(Path(stmt).read_text())
        real(pipeline, path, arguments, name, target)
    monkeypatch.setattr(aot._native, "compile_object", compile_object)
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(aot, "_loaded", {})
    grad = tc.define(tc.gradient(LAYERS, "layernorm")).layernorm_grad
    n, c = 67, 33
    X, G, B, dY = f32(n, c), f32(c), f32(c) + 1, f32(n, c)
    Y = _layernorm(X.astype(np.float64), G, B).astype(np.float32)
    dX, _, _ = grad(X, G, B, Y, dY)
    [text] = statements
    assert "a fused row pipeline" in grad.explain(X, G, B, Y, dY)
    produced = re.findall(r"produce (d_[^\s{]+)", text)
    assert produced and len(produced) == len(set(produced)), produced
    X64, dY64 = X.astype(np.float64), dY.astype(np.float64) * G
    xc = X64 - X64.mean(1, keepdims=True)
    inv = 1 / np.sqrt((xc * xc).mean(1, keepdims=True) + 1e-5)
    xhat = xc * inv
    want = inv * (dY64 - dY64.mean(1, keepdims=True) - xhat * (dY64 * xhat).mean(1, keepdims=True))
    np.testing.assert_allclose(dX, want, rtol=1e-3, atol=2e-4)
