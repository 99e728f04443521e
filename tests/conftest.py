"""Every CUDA kernel the test suite generates is also compiled by nvcc where nvcc is on the PATH
(it is on the development machine and in CI), so that a syntax or type error in generated CUDA
fails a test even when the test itself only runs the kernel under emulation. nvcc checks are
cached per source, so kernels a test checks explicitly are not compiled twice."""

import pytest

from tcstage.cuda import runtime
from tcstage.cuda.nvcc import compile_check


@pytest.fixture(autouse=True)
def _nvcc_checks_every_kernel(monkeypatch):
    original = runtime.Kernel.__init__

    def checked(self, compiled, target):
        original(self, compiled, target)
        compile_check(compiled.cuda.source)

    monkeypatch.setattr(runtime.Kernel, "__init__", checked)
