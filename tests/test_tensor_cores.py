"""Tensor cores (useTensorCores, issue 15): half and bfloat16 tmm, tbmm and MLP1 under several
options, run as emulated CUDA (the emulator implements mma.sync's fragment semantics) and
compared with float64 numpy; the PTX has the instruction; kernels that cannot use them say why.

Tolerance: the operands are exact in float32, so each product is exact and each of the K
additions into the float32 accumulator errs by at most 2^-24 of the partial sum, which is at
most sum |a| |b|; the result is then rounded once to the output type (unit roundoff u):
|got - exact| <= u |exact| + K 2^-24 sum_k |a| |b|, doubled for safety.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc
from tcstage.cuda import nvcc

M = tc.MappingOptions
TYPES = {"half": (np.float16, 2.0**-11), "bfloat16": (ml_dtypes.bfloat16, 2.0**-8)}

SOURCE = """
def tmm(T(M, K) A, T(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }
def tbmm(T(B, N, M) X, T(B, K, M) Y) -> (Z) { Z(b, n, k) +=! X(b, n, m) * Y(b, k, m) }
def mlp1(T(B, M) I, T(N, M) W1, T(N) B1) -> (O1) {
    O1(b, n) +=! I(b, m) * W1(n, m)
    O1(b, n) = O1(b, n) + B1(n)
    O1(b, n) = fmax(O1(b, n), 0)
}
"""

_programs: dict = {}


def program(type_name):
    if type_name not in _programs:
        _programs[type_name] = tc.define(SOURCE.replace("T(", f"{type_name}("))
    return _programs[type_name]


def check(got, exact, abs_products, k, u, rounded_before=0.0):
    """rounded_before: values rounded to the output type on the way (the sum before a bias)."""
    bound = 2 * (u * (np.abs(exact) + np.abs(rounded_before)) + k * 2.0**-24 * abs_products) \
        + 1e-30
    err = np.abs(got.astype(np.float64) - exact)
    assert (err <= bound).all(), f"worst error {err.max()} against {bound.ravel()[err.argmax()]}"


def on_tensor_cores(kernel) -> bool:
    return "_mma0(" in kernel.cuda_source and "tc::mma_tile" in kernel.cuda_source


OPTIONS = [
    M().tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(4, 4).useSharedMemory(True),
    M().tile(16, 16, 16).mapToThreads(32),  # operands straight from global memory
    M().tile(64, 32, 16).mapToThreads(64, 2).mapToBlocks(2, 2).useSharedMemory(True)
    .usePrivateMemory(True).unroll(4),
    M().tile(16, 8, 48).mapToThreads(8, 4),  # one warp, a reduction tile of three steps
]


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("options", OPTIONS, ids=range(len(OPTIONS)))
@pytest.mark.parametrize("sizes", [(64, 48, 80), (37, 29, 53)], ids=["whole", "partial"])
def test_tmm(type_name, options, sizes):
    dtype, u = TYPES[type_name]
    m, n, k = sizes
    rng = np.random.default_rng(m + n + k)
    A = rng.standard_normal((m, k)).astype(dtype)
    B = rng.standard_normal((n, k)).astype(dtype)
    kernel = tc.compile(program(type_name), "tmm", A, B, options=options.useTensorCores(True),
                        target="cuda-emulated")
    assert on_tensor_cores(kernel)
    a, b = A.astype(np.float64), B.astype(np.float64)
    check(kernel(A, B), a @ b.T, np.abs(a) @ np.abs(b).T, k, u)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("options", [
    M().tile(1, 16, 16, 16).mapToThreads(32, 4).mapToBlocks(3, 2, 2).useSharedMemory(True),
    M().tile(1, 32, 32, 32).mapToThreads(128).mapToBlocks(4),
], ids=["shared", "global"])
def test_tbmm(type_name, options):
    dtype, u = TYPES[type_name]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 20, 40)).astype(dtype)
    Y = rng.standard_normal((3, 24, 40)).astype(dtype)
    kernel = tc.compile(program(type_name), "tbmm", X, Y, options=options.useTensorCores(True),
                        target="cuda-emulated")
    assert on_tensor_cores(kernel)
    x, y = X.astype(np.float64), Y.astype(np.float64)
    check(kernel(X, Y), np.einsum("bnm,bkm->bnk", x, y),
          np.einsum("bnm,bkm->bnk", np.abs(x), np.abs(y)), 40, u)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("options", [
    M().tile(16, 16, 16).mapToThreads(32, 4).mapToBlocks(2, 2).useSharedMemory(True),
    M().tile(32, 32, 64).mapToThreads(32, 8).mapToBlocks(1, 1),
], ids=["tiled", "one-block"])
def test_mlp1_with_bias_and_relu(type_name, options):
    dtype, u = TYPES[type_name]
    rng = np.random.default_rng(2)
    I = rng.standard_normal((20, 40)).astype(dtype)
    W = rng.standard_normal((24, 40)).astype(dtype)
    b = rng.standard_normal(24).astype(dtype)
    kernel = tc.compile(program(type_name), "mlp1", I, W, b,
                        options=options.useTensorCores(True), target="cuda-emulated")
    assert on_tensor_cores(kernel)
    i, w, bias = (v.astype(np.float64) for v in (I, W, b))
    # (the sum is rounded to the narrow type, then the bias added in it: two roundings)
    check(kernel(I, W, b), np.maximum(i @ w.T + bias, 0), np.abs(i) @ np.abs(w).T, 40, u,
          rounded_before=i @ w.T)


MORE = """
def kron(T(I, J, M) A, T(K, L, M) B) -> (X) { X(i, j, k, l) +=! A(i, j, m) * B(k, l, m) }
def conv(T(N, C, H, W) I, T(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}
def tnn(T(K, M) A, T(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }
"""


@pytest.mark.parametrize("type_name", TYPES)
def test_kronecker_convolution_and_transposed_operands(type_name):
    """Roles follow the subscripts: Kronecker's outer row and column loops tiled by 1, a
    convolution as an implicit GEMM (rows: output columns w, columns: filters, reduction:
    channels, its 3 x 3 window a loop of calls into the same accumulators), A read as A(k, m)."""
    dtype, u = TYPES[type_name]
    p = tc.define(MORE.replace("T(", f"{type_name}("))
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 20, 40)).astype(dtype)
    B = rng.standard_normal((4, 24, 40)).astype(dtype)
    k = tc.compile(p, "kron", A, B, options=M().tile(1, 16, 1, 16, 16).mapToThreads(32, 4)
                   .mapToBlocks(3, 2, 4).useSharedMemory(True).useTensorCores(True),
                   target="cuda-emulated")
    assert on_tensor_cores(k)
    a, b = A.astype(np.float64), B.astype(np.float64)
    check(k(A, B), np.einsum("ijm,klm->ijkl", a, b),
          np.einsum("ijm,klm->ijkl", np.abs(a), np.abs(b)), 40, u)

    I = rng.standard_normal((2, 32, 10, 12)).astype(dtype)
    W = rng.standard_normal((16, 32, 3, 3)).astype(dtype)
    k = tc.compile(p, "conv", I, W, options=M().tile(1, 16, 1, 16, 32).mapToThreads(32, 4)
                   .mapToBlocks(2).useTensorCores(True), target="cuda-emulated")
    assert on_tensor_cores(k)
    i, w = I.astype(np.float64), W.astype(np.float64)
    exact, absolute = np.zeros((2, 16, 8, 10)), np.zeros((2, 16, 8, 10))
    for kh in range(3):
        for kw in range(3):
            window = i[:, :, kh:kh + 8, kw:kw + 10]
            exact += np.einsum("nchw,fc->nfhw", window, w[:, :, kh, kw])
            absolute += np.einsum("nchw,fc->nfhw", np.abs(window), np.abs(w[:, :, kh, kw]))
    check(k(I, W), exact, absolute, 32 * 9, u)

    A, B = rng.standard_normal((40, 20)).astype(dtype), rng.standard_normal((40, 24)).astype(dtype)
    k = tc.compile(p, "tnn", A, B, options=M().tile(16, 16, 16).mapToThreads(32, 4)
                   .useSharedMemory(True).useTensorCores(True), target="cuda-emulated")
    assert on_tensor_cores(k)
    a, b = A.astype(np.float64), B.astype(np.float64)
    check(k(A, B), a.T @ b, np.abs(a).T @ np.abs(b), 40, u)


def test_a_second_row_loop_must_be_tiled_by_one():
    p = tc.define(MORE.replace("T(", "half("))
    A, B = np.ones((3, 20, 16), np.float16), np.ones((4, 24, 16), np.float16)
    with pytest.warns(tc.TCWarning, match=r"loop i of S1 takes 3 values per tile; tensor cores "
                      r"take one row, one column and reduction loops \(tile the others by 1\)"):
        k = tc.compile(p, "kron", A, B, options=M().tile(4, 16, 1, 16, 16).mapToThreads(32, 4)
                       .useTensorCores(True), target="cuda-emulated")
    assert not on_tensor_cores(k)
    np.testing.assert_array_equal(k(A, B), np.full((3, 20, 4, 24), 16, np.float16))


@pytest.mark.parametrize("source", [
    # in/out C updated with += (a copy in, the update, a copy back)
    "def f(half(M,K) A, half(N,K) B) -> (C) { C(m,n) += A(m,k) * B(n,k) }",
    # two contractions into one tensor
    "def f(half(M,K) A, half(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k)\n"
    " C(m,n) += A(m,k) * B(n,k) }",
])
@pytest.mark.parametrize("options", [
    M().tile(16, 8, 16).mapToThreads(32).useTensorCores(True),
    M().tile(256, 256, 16).mapToThreads(33, 31).useTensorCores(True),  # not whole warps
], ids=["tiled", "odd-threads"])
def test_contractions_the_mapping_cannot_hand_over_keep_their_loops(source, options):
    rng = np.random.default_rng(4)
    A = rng.integers(-2, 3, (37, 53)).astype(np.float16)
    B = rng.integers(-2, 3, (29, 53)).astype(np.float16)
    product = A.astype(np.float64) @ B.astype(np.float64).T
    inout = "+= A" in source.split("\n")[0]
    C = np.ones((37, 29), np.float16)
    with pytest.warns(tc.TCWarning) if "33" in str(options) else _no_warning():
        k = tc.compile(source, "f", A, B, out=C if inout else None, options=options,
                       target="cuda-emulated")
    got = k(A, B, out=C.copy()) if inout else k(A, B)
    expected = 1 + product if inout else 2 * product
    np.testing.assert_array_equal(got.astype(np.float64), expected)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_without_the_option_the_same_kernel_stays_on_cuda_cores():
    A = np.ones((32, 32), np.float16)
    kernel = tc.compile(program("half"), "tmm", A, A, options=OPTIONS[0],
                        target="cuda-emulated")
    assert not on_tensor_cores(kernel)
    np.testing.assert_array_equal(kernel(A, A), np.full((32, 32), 32, np.float16))


def test_kernels_that_cannot_use_them_say_why():
    a = np.ones((16, 16), np.float32)
    with pytest.warns(tc.TCWarning, match=r"useTensorCores\(True\): no contraction of half or "
                      r"bfloat16 operands .*not both half or both bfloat16"):
        k = tc.compile("def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
                       "f", a, a, options=OPTIONS[1].useTensorCores(True), target="cuda-emulated")
    assert not on_tensor_cores(k)
    narrow = tc.define(SOURCE.replace("T(", "half("), narrow_accumulation=True)
    h = np.ones((16, 16), np.float16)
    with pytest.warns(tc.TCWarning, match="its accumulator is float16, not float32"):
        k = tc.compile(narrow, "tmm", h, h, options=OPTIONS[1].useTensorCores(True),
                       target="cuda-emulated")
    np.testing.assert_array_equal(k(h, h), np.full((16, 16), 16, np.float16))


def test_explain_names_the_roles():
    A = np.zeros((32, 32), np.float16)
    k = tc.compile(program("half"), "tmm", A, A, options=OPTIONS[0].useTensorCores(True),
                   target="cuda-emulated")
    assert "useTensorCores        C_acc += A(m, k) * B(n, k) (S1) runs on tensor cores: tiles " \
        "of at most 32 x 32 x 32 (rows m, columns n, reduction k)" in k.explain()


def test_accumulators_kept_between_calls_stay_few():
    """A tile whose pieces a warp cannot hold in registers loads and stores C at every call
    instead of keeping thousands of floats per thread (review finding: 32768)."""
    import re
    A = (512, 512)
    small = tc.compile(program("half"), "tmm", A, A, options=OPTIONS[0].useTensorCores(True))
    huge = tc.compile(program("half"), "tmm", A, A, options=M().tile(512, 512, 64)
                      .mapToThreads(32).useTensorCores(True))
    words = [int(w) for w in re.findall(r"float _cacc0\[(\d+)\]", small.cuda_source)]
    assert words and words[0] <= 128
    assert "_cacc0" not in huge.cuda_source and "tc::mma_tile" in huge.cuda_source


def test_option_text_round_trip():
    o = OPTIONS[0].useTensorCores(True)
    assert "useTensorCores(True)" in str(o) and M.parse(str(o)) == o


@pytest.mark.skipif(nvcc.nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("type_name,ptx_type", [("half", "f16"), ("bfloat16", "bf16")])
def test_ptx_has_mma_sync(type_name, ptx_type):
    A = np.zeros((32, 32), TYPES[type_name][0])
    kernel = tc.compile(program(type_name), "tmm", A, A,
                        options=OPTIONS[0].useTensorCores(True), target="cuda-emulated")
    for arch in ("sm_80", "sm_90"):
        ptx = nvcc.ptx(kernel.cuda_source, arch=arch)
        assert ptx is not None
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in ptx
