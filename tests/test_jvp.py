"""tc.jvp: the forward-mode derivative TC, checked against central finite differences of the
forward function in float64 (every floating output, along a random direction of all the
floating inputs at once) on the gradient tests' kernels, and for its text and errors."""

import numpy as np
import pytest

import tcstage as tc
from tcstage.grad import forward
from test_grad import CORPUS, LAYERS, PAPER, as_double, random_args, run  # tests/


def check_tangents(src, name, shapes, scalars=(), tables=(), seed=0, uniform=False):
    src = as_double(src)
    rng = np.random.default_rng(seed)
    prog = tc.define(src)
    fn = prog[name]
    args = random_args(fn, shapes, dict(scalars), dict(tables), rng, uniform)
    jv = forward(prog, name)
    direction = {t.name: rng.standard_normal(np.shape(a)) if t.rank else float(rng.standard_normal())
                 for t, a in zip(fn.checked.inputs, args) if t.type.is_float}
    results = run(tc.define(jv.source), jv.name,
                  [*args, *(direction[t] for t in jv.t_inputs)])
    outs = dict(zip([*fn.checked.outputs, *jv.t_outputs.values()], results))
    for o, want in zip(fn.checked.outputs, run(prog, name, args)):  # the outputs themselves
        np.testing.assert_allclose(outs[o], want, rtol=1e-12, atol=1e-12)

    def moved(step):
        return run(prog, name, [a + step * direction[t.name] if t.name in direction else a
                                for t, a in zip(fn.checked.inputs, args)])
    eps = 1e-6
    plus, minus = moved(eps), moved(-eps)
    for k, o in enumerate(fn.checked.outputs):
        if o not in jv.t_outputs:
            assert not fn.checked.tensors[o].type.is_float
            continue
        numeric = (plus[k] - minus[k]) / (2 * eps)
        np.testing.assert_allclose(outs[jv.t_outputs[o]], numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=o)
    return jv


@pytest.mark.parametrize("case", list(PAPER))
def test_paper_kernels(case):
    check_tangents(*PAPER[case])


@pytest.mark.parametrize("case", list(LAYERS))
def test_layers(case):
    check_tangents(*LAYERS[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORPUS))
def test_tc_corpus_tangents(case):
    check_tangents(*CORPUS[case])


def test_text_is_readable_tc():
    text = tc.jvp("def mm(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }",
                  "mm")
    assert "def mm_jvp(float(M, K) A, float(K, N) B, float(M, K) t_A, float(K, N) t_B) -> " \
           "(C, t_C)" in text
    assert "t_C(i, j) +=! t_A(i, k) * B(k, j) + t_B(k, j) * A(i, k)" in text
    tc.define(text)  # (and it is a TC)


def test_a_quotient_by_a_size_keeps_the_functions_precision():
    """d(X / C) is t_X / C, not (1.0 / C) * t_X: a float literal over an integer is float32,
    which cost a double TC seven digits."""
    X = np.random.default_rng(0).standard_normal((2, 3))
    t_X = np.array([[1.0, 2.0, 4.0], [0.5, 0.25, 3.0]])
    jv = forward("def mean(double(N,C) X) -> (M) { M(n) +=! X(n,c) / C }", "mean")
    _, t_M = tc.define(jv.source)[jv.name](X, t_X)
    np.testing.assert_allclose(t_M, t_X.sum(axis=1) / 3, rtol=1e-15)


def test_max_ties_split_the_tangent():
    jv = forward("def mx(double(N,K) X) -> (O) { O(n) max=! X(n,k) }", "mx")
    X = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    t_X = np.array([[5.0, 2.0, 4.0], [7.0, 1.0, 1.0]])
    O, t_O = tc.define(jv.source)[jv.name](X, t_X)
    np.testing.assert_array_equal(O, [3.0, 2.0])
    np.testing.assert_array_equal(t_O, [3.0, 7.0])  # the mean of the tied elements' tangents


def test_a_softmax_tangent_at_tied_maxima_is_the_closed_form():
    # Y * (t_X - sum(Y * t_X)): the max subtracted is a constant of the jvp (tc.gradient's
    # stabilisers), so its tie split, which summed to rounding error, is not in the text
    from test_grad import STABILISED
    jv = forward(STABILISED, "softmax")
    assert "t_M" not in jv.source and "ties" not in jv.source, jv.source
    x = np.array([[1.0, 3.0, 3.0, 2.0], [0.5, 0.5, 0.5, 0.5]])
    t_x = np.random.default_rng(4).standard_normal(x.shape)
    y, t_y = tc.define(jv.source)[jv.name](x, t_x)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(t_y, y * (t_x - (y * t_x).sum(1, keepdims=True)), rtol=1e-12,
                               atol=1e-15)
    check_tangents(STABILISED, "logsoftmax", dict(X=(3, 5)))


def test_integer_outputs_get_no_tangent_and_constant_outputs_a_zero_one():
    jv = forward("""def f(double(N) X, int32(N) I) -> (O, C, J) {
  O(i) = X(i) * X(i)
  C(i) = 2.0 * I(i)
  J(i) = I(i) + 1
}""", "f")
    assert jv.t_inputs == {"X": "t_X"} and set(jv.t_outputs) == {"O", "C"}
    X, I, t_X = np.arange(3.0), np.arange(3, dtype=np.int32), np.ones(3)
    O, C, J, t_O, t_C = tc.define(jv.source)[jv.name](X, I, t_X)
    np.testing.assert_array_equal(t_O, 2 * X)
    np.testing.assert_array_equal(t_C, np.zeros(3))
    np.testing.assert_array_equal(J, I + 1)


@pytest.mark.parametrize("src, message", [
    ("def p(float(N,K) X) -> (O) { O(n) *=! X(n,k) }", "product reduction"),
    ("def i(int32(N) X) -> (O) { O(i) = X(i) * 2 }", "no floating-point output"),
    ("def r(float(N,K) X) -> (O) { O(n) = X(n,0) + 1\n O(n) max= X(n,k) * 2 }", "max=!"),
    ("def e(float(N, ...) X) -> (O) { O(i, ...) = X(i, ...) * 2 }", "rank-polymorphic"),
])
def test_unsupported_statements_are_clear_errors(src, message):
    with pytest.raises(tc.TCError, match=message):
        tc.jvp(src, src.split("(")[0].split()[1])
