"""The example layers at sizes 0, 1 and 2 in every size variable, on the CPU, against PyTorch's
own operators in float64 (or numpy loops): an empty tensor is a tensor like any other (an
output with no elements, a reduction over none), and a dimension of one is neither broadcast
nor special. Found by a hunt for this class: arrays numpy gives strides of 0, empty inputs
Halide wanted an element of, an empty output read in an empty loop (docs/language.md)."""

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIZES = (0, 1, 2)


def _program(name: str):
    with warnings.catch_warnings():  # (the gathers' unchecked subscripts, told at definition)
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define((EXAMPLES / f"{name}.tc").read_text())


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a)).double()


def _conv(I, W, pad, stride, out):
    """numpy's direct convolution: zero padding `pad`, `out` x `out` outputs."""
    n, c, h, w = I.shape
    k = W.shape[2]
    P = np.zeros((n, c, h + 2 * pad + stride * out + k, w + 2 * pad + stride * out + k))
    P[:, :, pad:pad + h, pad:pad + w] = I
    O = np.zeros((n, W.shape[0], out, out))
    for y in range(out):
        for x in range(out):
            window = P[:, :, stride * y:stride * y + k, stride * x:stride * x + k]
            O[:, :, y, x] = np.einsum("ncij,fcij->nf", window, W)
    return O


def _cases():
    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    for m, k, n in itertools.product(SIZES, SIZES, SIZES):
        A, B, bias = r(m, k), r(n, k), r(n)
        yield "tmm", "tmm", (A, B), (_t(A) @ _t(B).T).numpy()
        yield "mlp", "MLP1", (A, B, bias), torch.relu(_t(A) @ _t(B).T + _t(bias)).numpy()
        X, G, Bt = r(m, n), r(n), r(n)
        yield "layers", "softmax", (X,), torch.softmax(_t(X), 1).numpy()
        yield "nn", "logsoftmax", (X,), torch.log_softmax(_t(X), 1).numpy()
        yield "layers", "layernorm", (X, G, Bt), \
            F.layer_norm(_t(X), (n,), _t(G), _t(Bt), eps=1e-5).numpy()
        if k:  # (an index into an empty table is out of range)
            table, index = r(k, n), rng.integers(0, k, (m, 2)).astype(np.int32)
            rows = _t(table)[torch.from_numpy(index).long()]
            yield "lut", "1LUT", (table, index), rows.sum(1).numpy()
            yield "nn", "embedding_bag_mean", (table, index), rows.mean(1).numpy()
    for n, c, h, k in itertools.product(SIZES, SIZES, (0, 1, 3), (0, 1, 2)):
        if k > h:
            continue
        I, W = r(n, c, h, h), r(2, c, k, k)
        yield "conv", "conv2d", (I, W), _conv(I, W, 0, 1, h - k + 1)
        W3 = r(2, c, 3, 3)
        yield "layers", "padconv", (I, W3), _conv(I, W3, 1, 1, h)
        yield "nn", "conv_s2", (I, W3), _conv(I, W3, 1, 2, (h + 1) // 2)
        X, G, Bt = r(n, c, 2, h, h), r(c, 2), r(c, 2)
        mean = X.astype(np.float64).mean((2, 3, 4), keepdims=True) if h else 0
        var = ((X - mean) ** 2).mean((2, 3, 4), keepdims=True) if h else 0
        yield "nn", "groupnorm", (X, G, Bt), \
            (X - mean) / np.sqrt(var + 1e-5) * G[:, :, None, None] + Bt[:, :, None, None]


def test_example_layers_at_sizes_0_1_2_on_the_cpu():
    programs, checked = {}, 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "runs unscheduled" fallback, no numpy warning)
        for file, name, args, expected in _cases():
            program = programs.get(file) or programs.setdefault(file, _program(file))
            got = program[name](*args)
            assert got.shape == expected.shape, (name, [a.shape for a in args])
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} {[a.shape for a in args]}")
            checked += 1
    assert checked > 300


@pytest.mark.parametrize("file, name, shapes", [
    ("tmm", "tmm", ((3, 0), (4, 0))), ("tmm", "tmm", ((0, 5), (4, 5))),
    ("layers", "padconv", ((1, 0, 3, 3), (2, 0, 3, 3))),
    ("conv", "conv2d", ((1, 2, 3, 3), (2, 2, 0, 0))),
    ("layers", "layernorm", ((3, 1), (1,), (1,))),
])
def test_empty_and_unit_sizes_under_emulation(file, name, shapes):
    """The same source the GPU runs, emulated, against the CPU kernel."""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = _program(file)[name](*args)
    source = (EXAMPLES / f"{file}.tc").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(source, name, *args, target="cuda-emulated")
    got = kernel(*args)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
