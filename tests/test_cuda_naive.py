"""The naive CUDA kernel (one thread runs the whole schedule) of the paper's programs: generated
from the scheduled scop, compiled with nvcc where it exists, run under CPU emulation and compared
with numpy."""

import warnings
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc

EXAMPLES = Path(__file__).parent.parent / "examples"
rng = np.random.default_rng(3)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def define(source):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define(source)


def check(fn, args, expected, out=None, rtol=1e-4):
    program = tc.Program({fn.name: fn})
    kernel = tc.compile(program, fn.name, *args, out=out, target="cuda-emulated")
    assert kernel.grid == kernel.block == (1, 1, 1)
    got = kernel(*args, out=out)
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * max(1.0, float(np.abs(e).max())))


def test_tmm_tbmm_and_outer_product():
    prog = define((EXAMPLES / "tmm.tc").read_text() + (EXAMPLES / "tbmm.tc").read_text())
    A, B = f32(6, 5), f32(7, 5)
    check(prog.tmm, (A, B), A @ B.T)
    X, Y = f32(2, 3, 4), f32(2, 5, 4)
    check(prog.tbmm, (X, Y), np.einsum("bnm,bkm->bnk", X, Y))


def test_mlp1_and_mlp3_fused():
    prog = define((EXAMPLES / "mlp.tc").read_text())
    I, W1, B1 = f32(3, 6), f32(4, 6), f32(4)
    check(prog.MLP1, (I, W1, B1), np.maximum(I @ W1.T + B1, 0))
    W2, B2, W3, B3, W4, B4 = f32(5, 6), f32(5), f32(4, 5), f32(4), f32(2, 4), f32(2)
    r2 = np.maximum(I @ W2.T + B2, 0)
    r3 = np.maximum(r2 @ W3.T + B3, 0)
    check(prog.MLP3, (I, W2, B2, W3, B3, W4, B4), (r2, r3, np.maximum(r3 @ W4.T + B4, 0)))


def test_conv_maxpool_and_strided_conv():
    prog = define((EXAMPLES / "conv.tc").read_text() + (EXAMPLES / "sconv2d.tc").read_text())
    x, w = f32(2, 2, 6, 5), f32(3, 2, 3, 2)
    ref = sum(np.einsum("bihw,oi->bohw", x[:, :, kh:kh + 4, kw:kw + 4], w[:, :, kh, kw])
              for kh in range(3) for kw in range(2))
    check(prog.conv2d, (x, w), ref)
    check(prog.maxpool2x2, (x,), x[:, :, :6, :4].reshape(2, 2, 3, 2, 2, 2).max(axis=(3, 5)))
    I, W, B = f32(1, 2, 9, 8), f32(3, 2, 3, 2), f32(3)
    Ho, Wo = (9 - 3) // 2 + 1, (8 - 2) // 3 + 1
    ref = np.zeros((1, 3, Ho, Wo), np.float32) + B[None, :, None, None]
    for kh in range(3):
        for kw in range(2):
            ref += np.einsum("nchw,fc->nfhw", I[:, :, kh:kh + 2 * (Ho - 1) + 1:2,
                                             kw:kw + 3 * (Wo - 1) + 1:3], W[:, :, kh, kw])
    check(prog.sconv2d, (2, 3, I, W, B), ref)


def test_indirect_lookup_tables():
    lut = define((EXAMPLES / "lut.tc").read_text())["2LUT"]
    L1, L2 = f32(10, 4), f32(7, 4)
    I1 = rng.integers(0, 10, (3, 5)).astype(np.int32)
    I2 = rng.integers(0, 7, (3, 2)).astype(np.int32)
    check(lut, (L1, I1, L2, I2), (L1[I1].sum(axis=1), L2[I2].sum(axis=1)))


def test_in_out_scalars_and_ranges_not_starting_at_zero():
    prog = define("def sgemm(float a, float b, float(N,M) A, float(M,K) B) -> (C) {\n"
                  "  C(i,j) = b * C(i,j)\n  C(i,j) += a * A(i,k) * B(k,j)\n}\n"
                  "def rev(float(I) B) -> (A) { A(i) = B(10 - i) }\n"
                  "def tmp(float(N) X) -> (Y) { T(i) = X(i) * 2\n Y(i) = T(i + 1) - T(i) "
                  "where i in 0:T.0 - 1 }")
    A, B, C = f32(3, 4), f32(4, 5), f32(3, 5)
    expected = 0.5 * C + 2.0 * A @ B
    check(prog.sgemm, (2.0, 0.5, A, B), expected, out=C.copy())
    b = f32(6)
    check(prog.rev, (b,), b[10 - np.arange(5, 11)])
    x = f32(7)
    check(prog.tmp, (x,), 2 * (x[1:] - x[:-1]))


def test_integer_semantics_types_and_builtins():
    prog = define("def f(int(N) X, double(N) D, float(N) F) -> (Q, R, E, S) {\n"
                  "  Q(i) = X(i) / 3\n  R(i) = X(i) % 3\n  E(i) = D(i) * 0.1 + 1e-300\n"
                  "  S(i) = F(i) > 0 ? expf(F(i)) : fmaxf(tanh(F(i)), -0.5)\n}")
    X = np.array([-7, -3, -1, 0, 1, 5], np.int32)
    D = rng.standard_normal(6)
    F = f32(6)
    check(prog.f, (X, D, F), (X // 3, X % 3, D * 0.1 + 1e-300,
                              np.where(F > 0, np.exp(F), np.maximum(np.tanh(F), -0.5))))


@pytest.mark.parametrize("type_name", ["int8", "int16", "int32", "int64", "uint8", "uint16",
                                       "uint32", "uint64", "float16", "float32", "float64"])
def test_every_scalar_type_compiles_and_computes(type_name):
    prog = define(f"def f({type_name}(N) X, {type_name}(N) Y) -> (Z, M) {{\n"
                  "  Z(i) = X(i) * Y(i) + X(i)\n  M(i) max=! X(i + k) where k in 0:2\n}")
    X = (np.arange(7) % 5).astype(prog.f.checked.tensors["X"].type.numpy)
    Y = (np.arange(7) % 3 + 1).astype(X.dtype)
    Z = X * Y + X
    M = np.maximum(X[:-1], X[1:])
    check(prog.f, (X, Y), (Z, M))
