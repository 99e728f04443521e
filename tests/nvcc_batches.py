"""nvcc checks of many generated kernels at once, for the test suite (see conftest.py).

Nearly all of the 1-2 s nvcc takes on one generated kernel goes into parsing CUDA's own headers,
so kernels are compiled many to a translation unit: each in a namespace of its own, without
`extern "C"` (C linkage would make same-named kernels one function), and with the macros it
defines undefined after it. Only kernels with the same #include lines share a unit, so no kernel
compiles thanks to another's includes. When a unit fails, its kernels are compiled one by one by
tcstage's own `compile_check`, whose verdict stands.

Kernels that compiled are remembered on disk ($XDG_CACHE_HOME/tcstage/nvcc-checked, keyed by the
nvcc version, the architecture and the source), so unchanged kernels are not compiled again.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from functools import cache

from tcstage.cuda.nvcc import DEFAULT_ARCH, compile_check, nvcc_path
from tcstage.errors import TCError

KERNELS_PER_UNIT = 40  # measured: one kernel alone ~1.5 s, forty in one unit ~6 s


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tcstage", "nvcc-checked")


@cache
def _nvcc_identity() -> str:
    r = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True)
    return f"{nvcc_path()}\0{r.stdout}\0{DEFAULT_ARCH}"


def _marker(source: str) -> str:
    key = hashlib.sha256(f"{_nvcc_identity()}\0{source}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), key)


def _remember(sources: Sequence[str]) -> None:
    os.makedirs(cache_dir(), exist_ok=True)
    for s in sources:
        with open(_marker(s), "w"):
            pass


def _includes(source: str) -> tuple[str, ...]:
    return tuple(re.findall(r"^[ \t]*#[ \t]*include\b.*$", source, re.M))


def translation_unit(sources: Sequence[str]) -> str:
    """One CUDA translation unit holding every source (all with the same #include lines)."""
    includes = _includes(sources[0])
    assert all(_includes(s) == includes for s in sources)
    parts = list(includes)
    for k, source in enumerate(sources):
        # Includes become blank lines, so that `#line` keeps nvcc's line numbers right.
        body = re.sub(r"^[ \t]*#[ \t]*include\b.*$", "", source, flags=re.M)
        body = re.sub(r'\bextern\s+"C"\s*', "", body)
        macros = dict.fromkeys(re.findall(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", body, re.M))
        parts += [f"namespace tc_nvcc_unit_{k} {{", f'#line 1 "kernel{k}.cu"', body, "}",
                  *(f"#undef {m}" for m in macros)]
    return "\n".join(parts) + "\n"


def _compiles(unit: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="tcstage-nvcc-unit-") as tmp:
        path = os.path.join(tmp, "unit.cu")
        with open(path, "w") as f:
            f.write(unit)
        cmd = [nvcc_path(), "--ptx", f"-arch={DEFAULT_ARCH}", "-std=c++17", "-x", "cu",
               "-o", os.devnull, path]
        return subprocess.run(cmd, capture_output=True, cwd=tmp, timeout=1800).returncode == 0


def _check_unit(sources: Sequence[str]) -> dict[str, str]:
    """nvcc's messages for those of `sources` it rejects; empty if it accepts all."""
    if _compiles(translation_unit(sources)):
        _remember(sources)
        return {}
    rejected = {}
    for s in sources:
        try:
            compile_check(s)
            _remember([s])
        except TCError as e:
            rejected[s] = str(e)
    return rejected


def check_all(sources: Sequence[str], jobs: int | None = None) -> dict[str, str]:
    """Compiles every source not already known to compile; returns nvcc's messages for those it
    rejects. Nothing is checked where there is no nvcc."""
    if nvcc_path() is None:
        return {}
    todo = [s for s in dict.fromkeys(sources) if not os.path.exists(_marker(s))]
    groups: dict[tuple[str, ...], list[str]] = {}
    for s in todo:
        groups.setdefault(_includes(s), []).append(s)
    jobs = jobs or os.cpu_count() or 1
    units = []
    for group in groups.values():
        count = max(math.ceil(len(group) / KERNELS_PER_UNIT), min(jobs, len(group)))
        units += [group[k::count] for k in range(count)]
    rejected: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for found in pool.map(_check_unit, units):
            rejected.update(found)
    return rejected
