"""The runnable TCs of the spec documents (000, 001, 004 and the paper's smaller examples) as
mapped CUDA kernels: each under five MappingOptions, run under emulation and compared with an
independent numpy reference and with the Halide CPU back end. In/out outputs start from the
caller's values (out=), as on the CPU."""

import warnings

import numpy as np
import pytest

import tcstage as tc

M = tc.MappingOptions
rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _stencil_ref(B, K):
    return np.array([sum(B[i + k] * K[k] for k in range(len(K))) for i in range(len(B) - 2)])


def _conv_ref(x, w, out0):
    H, W = x.shape[2] - w.shape[2] + 1, x.shape[3] - w.shape[3] + 1
    return out0 + sum(np.einsum("bihw,oi->bohw", x[:, :, kh:kh + H, kw:kw + W], w[:, :, kh, kw])
                      for kh in range(w.shape[2]) for kw in range(w.shape[3]))


# (source, inputs, out= values or None, reference(*inputs, out))
_I = rng.integers(0, 9, (3, 4)).astype(np.int32)
SPEC = {
    "001 matmul": ("def mat_mul(float(I, K) B, float(K, J) C) -> A { A(i, j) +=! B(i, k) * C(k, j) }",
                   (f32(5, 7), f32(7, 3)), None, lambda B, C, o: B @ C),
    "001 stencil": ("def st(float(N) B, float(M) K) -> (A) { A(i) +=! B(i + k) * K(k) }",
                    (f32(10), f32(3)), None, lambda B, K, o: _stencil_ref(B, K)),
    "001 reverted": ("def reverted(float(I) B) -> A { A(i) = B(10 - i) }", (f32(6),), None,
                     lambda B, o: B[10 - np.arange(5, 11)]),
    "001 subsample": ("def subsample_2(float(I) B) -> A { A(i) = B(2*i) }", (f32(9),), None,
                      lambda B, o: B[::2]),
    "001 average pool": ("def average_pool_2(float(I) B) -> A { A(i) = B(2*i) + B(2*i + 1) }",
                         (f32(9),), None, lambda B, o: B[0:8:2] + B[1:9:2]),
    "001 dynamic stride": ("def sub(float(I) B, int(1) S) -> (A) { A(i) = B(S(0)*i) "
                           "where i in 0:I/2 }", (f32(10), np.array([2], np.int32)), None,
                           lambda B, S, o: B[0:10:2]),
    "004 mv": ("def mv(float(R,C) A, float(C) B) -> (o) {\no(i) += A(i,j) * B(j)\n}",
               (f32(4, 5), f32(5)), f32(4), lambda A, B, o: o + A @ B),
    "004 mm": ("def mm(float(X,Y) A, float(Y,Z) B) -> (R) {\nR(i,j) += A(i,j) * B(j,k)\n}",
               (f32(3, 4), f32(4, 5)), f32(3, 4), lambda A, B, o: o + A * B.sum(axis=1)[None, :]),
    "004 conv": ("def conv(float(B,IP,H,W) input, float(OP,IP,KH,KW) weight) -> (output) {\n"
                 "output(b, op, h, w) += input(b, ip, h + kh, w + kw) * weight(op, ip, kh, kw)\n}",
                 (f32(2, 3, 6, 7), f32(4, 3, 2, 3)), f32(2, 4, 5, 5), _conv_ref),
    "004 maxpool": ("def maxpool2x2(float(B,C,H,W) input) -> (output) {\n"
                    "output(b,c,i,j) max= input(b,c,2*i + kw, 2*j + kh)\n"
                    "where kw = [0, 2[, kh = [0, 2[\n}", (f32(2, 3, 7, 8),),
                    np.full((2, 3, 3, 4), -np.inf, np.float32),
                    lambda x, o: x[:, :, :6, :8].reshape(2, 3, 3, 2, 4, 2).max(axis=(3, 5))),
    "003 mv": ("def mv(float(M,K) A, float(K) x) -> (C) {\n  C(i) = 0\n  C(i) += A(i,k) * x(k)\n}",
               (f32(6, 4), f32(4)), None, lambda A, x, o: A @ x),
    "003 sgemm": ("def sgemm(float a, float b, float(N,M) A, float(M,K) B) -> (C) {\n"
                  "  C(i,j) = b * C(i,j)\n  C(i,j) += a * A(i,k) * B(k,j)\n}",
                  (2.0, 0.5, f32(3, 5), f32(5, 4)), f32(3, 4),
                  lambda a, b, A, B, o: b * o + a * (A @ B)),
    "003 gather": ("def gather(float(N) X, int(A,B) I) -> (Z) { Z(i,j) = X(I(i,j)) }",
                   (f32(9), _I), None, lambda X, I, o: X[I]),
    "003 outer product": ("def outerProductMM(float(P,Q,R) A, float(S,R,T) B) -> (O) {"
                          " O(p,s,q,t) +=! A(p,q,r) * B(s,r,t) }", (f32(2, 3, 4), f32(5, 4, 2)),
                          None, lambda A, B, o: np.einsum("pqr,srt->psqt", A, B)),
    "003 conv1d": ("def conv1d(float(M) I, float(N) K) -> (O) { O(i) +=! K(x) * I(i + x) }",
                   (f32(9), f32(3)), None, lambda I, K, o: np.convolve(I, K[::-1], "valid")),
}

OPTIONS = [
    M(),
    M().tile(2).mapToThreads(4).mapToBlocks(3),
    M().tile(2, 2, 2).mapToThreads(2, 2).mapToBlocks(2, 2).unroll(4),
    M().mapToThreads(8, 2).scheduleFusionStrategy("Min"),
    M().tile(1, 3).mapToThreads(3, 2).mapToBlocks(5, 1).tileImperfectlyNested(True).unroll(16),
]


@pytest.mark.parametrize("options", OPTIONS, ids=[f"options{i}" for i in range(len(OPTIONS))])
@pytest.mark.parametrize("case", sorted(SPEC))
def test_spec_tc_as_mapped_cuda(case, options):
    source, inputs, start, reference = SPEC[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        program = tc.define(source)
        name = program.names[0]
        out = None if start is None else start.copy()
        k = tc.compile(program, name, *inputs, out=out, options=options, target="cuda-emulated")
    got = k(*inputs, out=None if start is None else start.copy())
    on_cpu = program[name](*inputs, out=None if start is None else start.copy())
    expected = reference(*inputs, start)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=str(options))
    np.testing.assert_allclose(got, on_cpu, rtol=1e-4, atol=1e-4, err_msg=str(options))
