"""The mapped kernels of test_cuda_mapping, run for real on a GPU through pycuda (target="cuda"),
with numpy inputs and, where PyTorch or CuPy is present, with device arrays whose outputs must
come back in the same framework. Skipped, with the reason shown by `pytest -rs`, on machines
without pycuda or a GPU; tests/test_cuda_mapping.py checks the same kernels under emulation."""

import importlib.util

import numpy as np
import pytest

import tcstage as tc
from real_gpu import gpu_problem  # tests/

pytestmark = pytest.mark.gpu

_PROBLEM = gpu_problem()
if _PROBLEM:
    pytest.skip(f"GPU tests need a GPU and pycuda: {_PROBLEM}", allow_module_level=True)

from test_cuda_mapping import CASES, KERNELS, _fn  # noqa: E402


@pytest.mark.parametrize("kernel,options", CASES, ids=[f"{k}-{i}" for i, (k, _) in
                                                      enumerate(CASES)])
def test_mapped_kernel_on_the_gpu(kernel, options):
    program, name = _fn(kernel)
    _, _, make, reference = KERNELS[kernel]
    args = make(np.random.default_rng(0))
    k = tc.compile(program, name, *args, options=options, target="cuda")
    got = k(*args)
    got = got if isinstance(got, tuple) else (got,)
    expected = reference(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(e).max())),
                                   err_msg=str(options))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_torch_tensors_in_and_out():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    A = torch.randn(64, 32, device="cuda")
    B = torch.randn(48, 32, device="cuda")
    program, name = _fn("tmm")
    k = tc.compile(program, name, A, B, options=tc.MappingOptions().tile(16, 16).mapToThreads(16, 16)
                   .mapToBlocks(4, 3), target="cuda")
    C = k(A, B)
    torch.cuda.synchronize()
    assert isinstance(C, torch.Tensor) and C.device.type == "cuda"
    torch.testing.assert_close(C, A @ B.T, rtol=1e-4, atol=1e-4)


# 16-bit floats through pycuda, which knows neither half nor bfloat16: its argument packing has
# no half format and its fill kernels map no float16 dtype (both failed on an H200, 2026-11-28)
SCALED_SUM = """def scaled_sum(T(N,K) A, T s) -> (O) { O(n) +=! A(n,k) * s }"""


@pytest.mark.parametrize("type_name", ["half", "bfloat16"])
def test_sixteen_bit_arrays_and_scalar_from_numpy(type_name):
    import ml_dtypes
    dtype = np.dtype(np.float16 if type_name == "half" else ml_dtypes.bfloat16)
    A = np.random.default_rng(1).integers(-4, 5, (64, 16)).astype(dtype)  # exact sums
    k = tc.compile(SCALED_SUM.replace("T", type_name), "scaled_sum", A, dtype.type(0.5),
                   options=tc.MappingOptions().mapToThreads(32).mapToBlocks(2), target="cuda")
    got = k(A, dtype.type(0.5))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.astype(np.float64),
                                  A.astype(np.float64).sum(axis=1) * 0.5)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("type_name", ["half", "bfloat16"])
def test_sixteen_bit_torch_tensors(type_name):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    dtype = torch.float16 if type_name == "half" else torch.bfloat16
    A = torch.randint(-4, 5, (64, 16), device="cuda").to(dtype)  # (its interface: "|V2" for bf16)
    program = SCALED_SUM.replace("T", type_name)
    k = tc.compile(program, "scaled_sum", A, 0.5,
                   options=tc.MappingOptions().mapToThreads(32).mapToBlocks(2), target="cuda")
    O = k(A, 0.5)
    torch.cuda.synchronize()
    assert isinstance(O, torch.Tensor) and O.dtype == dtype and O.device.type == "cuda"
    torch.testing.assert_close(O.double(), A.double().sum(dim=1) * 0.5, rtol=0, atol=0)


def test_arrays_without_elements():
    """pycuda gives an array of no elements no memory (gpudata None) and its fill a kernel
    with nothing to fill: inputs and outputs of size 0 are passed as null pointers, which the
    kernel never follows (an empty input is never read: `lower`'s `absent`)."""
    padto = "def padto(float(M) A, float(N) Z) -> (O) { O(i) = (A(i) ?? 0) + Z(i) }"
    Z = np.arange(3, dtype=np.float32)
    empty = np.ones(0, np.float32)
    np.testing.assert_array_equal(tc.compile(padto, "padto", empty, Z, target="cuda")(empty, Z), Z)
    program, name = _fn("tmm")
    for A, B in ((np.ones((3, 0), np.float32), np.ones((4, 0), np.float32)),
                 (np.ones((0, 5), np.float32), np.ones((4, 5), np.float32))):
        k = tc.compile(program, name, A, B, target="cuda")
        np.testing.assert_array_equal(k(A, B), A @ B.T)
