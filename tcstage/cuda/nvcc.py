"""Checking that CUDA source compiles with the real CUDA compiler, where one is installed.

The emulator compiles kernels with a host C++ compiler and a header that spells CUDA's
extensions, so it accepts some code nvcc rejects (and the reverse); `compile_check` closes that
gap on machines with nvcc, GPU or not, by compiling to PTX for one architecture.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

from tcstage.errors import TCError

__all__ = ["DEFAULT_ARCH", "compile_check", "nvcc_path"]

DEFAULT_ARCH = "sm_90"
_checked: set[str] = set()  # hashes of (source, arch) that compiled: each is checked once
_lock = threading.Lock()


def nvcc_path() -> str | None:
    """The nvcc on PATH, or None."""
    return shutil.which("nvcc")


def compile_check(source: str, *, arch: str = DEFAULT_ARCH, timeout: float = 300) -> bool:
    """Compiles `source` to PTX with nvcc; True if it compiled, False if there is no nvcc.

    Raises TCError with nvcc's diagnostics (naming the source 'kernel.cu') when it does not
    compile.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        return False
    key = hashlib.sha256(f"{nvcc}\0{arch}\0{source}".encode()).hexdigest()
    with _lock:
        if key in _checked:
            return True
    with tempfile.TemporaryDirectory(prefix="tcstage-nvcc-") as tmp:
        path = os.path.join(tmp, "kernel.cu")
        with open(path, "w") as f:
            f.write(source)
        cmd = [nvcc, "--ptx", f"-arch={arch}", "-std=c++17", "-x", "cu", "-o", os.devnull, path]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired as e:
            raise TCError(f"nvcc took longer than {timeout} s on the kernel source") from e
        except OSError as e:
            raise TCError(f"cannot run nvcc ({nvcc}): {e}") from e
    if r.returncode != 0:
        diagnostics = (r.stderr + r.stdout).replace(path, "kernel.cu").strip()
        raise TCError(f"nvcc rejected the CUDA source ({' '.join(cmd[1:6])}):\n{diagnostics}")
    with _lock:
        _checked.add(key)
    return True
