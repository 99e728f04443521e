"""Checking that CUDA source compiles with the real CUDA compiler, where one is installed.

The emulator compiles kernels with a host C++ compiler and a header that spells CUDA's
extensions, so it accepts some code nvcc rejects (and the reverse); `compile_check` closes that
gap on machines with nvcc, GPU or not, by compiling to PTX for one architecture.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading

from tcstage.cuda.tool import run_tool
from tcstage.errors import TCError

__all__ = ["DEFAULT_ARCH", "compile_check", "nvcc_path", "ptx", "resources"]

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
    key = hashlib.sha256(f"{nvcc_path()}\0{arch}\0{source}".encode()).hexdigest()
    with _lock:
        if key in _checked:
            return True
    if _nvcc(source, ["--ptx", f"-arch={arch}"], timeout) is None:
        return False
    with _lock:
        _checked.add(key)
    return True


def ptx(source: str, *, arch: str = DEFAULT_ARCH, timeout: float = 300) -> str | None:
    """The PTX nvcc makes of `source` (optimised, as a launch would compile it), or None if
    there is no nvcc: to see what became of shared loads and private arrays."""
    out = _nvcc(source, ["--ptx", f"-arch={arch}"], timeout, keep="kernel.ptx")
    return None if out is None else out[1]


def resources(source: str, *, arch: str = DEFAULT_ARCH, timeout: float = 300) -> dict | None:
    """What ptxas reports for the kernel's machine code, without a GPU: registers per thread,
    spill stores and loads and stack frame (bytes; local memory a private array fell back to)
    and static shared memory (bytes). A source of several kernels (a kernel sequence) gets
    each figure's largest over them, and "kernels": each kernel's own figures by name. None if
    there is no nvcc."""
    out = _nvcc(source, ["--cubin", f"-arch={arch}", "-Xptxas", "-v"], timeout)
    if out is None:
        return None
    # ptxas reports entry functions in its own order, each from "Compiling entry function"
    pieces = re.split(r"Compiling entry function '([^']+)'", out[0])
    kernels = {name: _figures(report) for name, report in zip(pieces[1::2], pieces[2::2])}
    found = {key: max((k[key] for k in kernels.values()), default=0) for key in _FIGURES}
    found["kernels"] = kernels
    return found


_FIGURES = {"registers": r"Used (\d+) registers",
            "spill_stores": r"(\d+) bytes spill stores",
            "spill_loads": r"(\d+) bytes spill loads",
            "stack": r"(\d+) bytes stack frame",
            "shared": r"(\d+) bytes smem"}


def _figures(report: str) -> dict:
    found = {}
    for key, pattern in _FIGURES.items():
        m = re.search(pattern, report)
        found[key] = int(m.group(1)) if m else 0
    return found


def _nvcc(source: str, args: list[str], timeout: float, keep: str | None = None
          ) -> tuple[str, str] | None:
    """Runs nvcc on source: (its messages, the output file's text if `keep` names it), or
    None if there is no nvcc; TCError with the diagnostics if it fails."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tcstage-nvcc-") as tmp:
        path = os.path.join(tmp, "kernel.cu")
        out = os.path.join(tmp, keep) if keep else os.devnull
        with open(path, "w") as f:
            f.write(source)
        cmd = [nvcc, *args, "-std=c++17", "-x", "cu", "-o", out, path]
        try:
            r = run_tool(cmd, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired as e:
            raise TCError(f"nvcc took longer than {timeout} s on the kernel source") from e
        except OSError as e:
            raise TCError(f"cannot run nvcc ({nvcc}): {e}") from e
        messages = (r.stderr + r.stdout).replace(path, "kernel.cu").strip()
        if r.returncode != 0:
            raise TCError(f"nvcc rejected the CUDA source ({' '.join(cmd[1:5])}):\n{messages}")
        if keep is None:
            return messages, ""
        with open(out) as f:
            return messages, f.read()
