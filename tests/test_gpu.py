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
