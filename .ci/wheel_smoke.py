"""Smoke test of an installed tcstage, run by .ci/run from outside the source tree.

Checks that the package works as a user gets it from a wheel: the native helper loads, a TC runs
on the CPU, the same TC compiles to CUDA and runs under emulation (which needs the packaged
emu_runtime.h), its generated backward TC runs, all against numpy, and the `tcstage` command is
installed. (The wheel's venv has no torch: tcstage.torch is tested by the README command.)
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

import tcstage as tc

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


def main() -> None:
    package = os.path.dirname(os.path.abspath(tc.__file__))
    assert "site-packages" in package, f"tcstage was imported from {package}, not an install"
    rng = np.random.default_rng(0)
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((6, 5)).astype(np.float32)
    expected = A @ B.T

    prog = tc.define(TMM)
    assert np.allclose(prog.tmm(A, B), expected, rtol=1e-5, atol=1e-5), "CPU result"
    options = tc.MappingOptions().tile(4, 4).mapToThreads(4, 2).mapToBlocks(2, 2)
    kernel = tc.compile(prog, "tmm", A, B, options=options, target="cuda-emulated")
    assert np.allclose(kernel(A, B), expected, rtol=1e-5, atol=1e-5), "cuda-emulated result"

    backward = tc.define(tc.gradient(prog, "tmm"))  # tcstage.grad is in the wheel
    d_c = rng.standard_normal((8, 6)).astype(np.float32)
    d_a, d_b = backward.tmm_grad(A, B, expected, d_c)
    assert np.allclose(d_a, d_c @ B, rtol=1e-4, atol=1e-4), "gradient of A"
    assert np.allclose(d_b, d_c.T @ A, rtol=1e-4, atol=1e-4), "gradient of B"

    with tempfile.TemporaryDirectory() as cache:  # the tuner, with its cache, from a wheel
        os.environ["TCSTAGE_CACHE_DIR"] = cache
        res = tc.autotune(prog, "tmm", A, B, measure="model", budget=4, progress=False)
        tuned = tc.compile(prog, "tmm", A, B, options="auto", target="cuda-emulated")
        assert str(tuned.options) == str(res.options), "options='auto' reads the cache"
        assert np.allclose(tuned(A, B), expected, rtol=1e-5, atol=1e-5), "tuned result"

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tmm.tc")
        with open(path, "w") as f:
            f.write(TMM + "\n")
        tcstage = os.path.join(os.path.dirname(sys.executable), "tcstage")
        version = subprocess.run([tcstage, "--version"], capture_output=True, text=True,
                                 check=True).stdout
        assert version.strip() == f"tcstage {tc.__version__}", version
        run = subprocess.run([tcstage, "run", path, "--sizes", "M=8,K=5,N=6", "--repeat", "1"],
                             capture_output=True, text=True, check=True).stdout
        assert "output:  C(8, 6) float32" in run, run
    print(f"wheel smoke test passed: tcstage {tc.__version__} from {package}")


if __name__ == "__main__":
    main()
