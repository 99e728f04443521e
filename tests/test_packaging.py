"""What a regular (non-editable) install ships: every file tcstage reads at run time.

An editable install reads the source tree, so a data file missing from the wheel goes unnoticed
there (emu_runtime.h did: `cuda-emulated` failed after `pip install .`). .ci/run installs a real
wheel into a fresh virtual environment; this test catches the omission at its cause, quickly.
"""

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "tcstage"
# Needed to build the wheel, not to run it (setup.py keeps it out of installed trees).
BUILD_ONLY = {"tcstage/halide/_native.cpp"}
BUILD_OUTPUTS = ("*.so", "*.pyc", "*.pyd")


def declared_package_data() -> list[str]:
    """pyproject's [tool.setuptools.package-data] as paths relative to the root, with globs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    return [f"{package.replace('.', '/')}/{pattern}"
            for package, patterns in data.items() for pattern in patterns]


def test_every_data_file_of_the_package_is_declared():
    files = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and "egg-info" not in str(p)}
    data = sorted(f for f in files if not f.endswith(".py") and f not in BUILD_ONLY
                  and not any(fnmatch.fnmatch(f, g) for g in BUILD_OUTPUTS))
    patterns = declared_package_data()
    assert "tcstage/cuda/emu_runtime.h" in data
    undeclared = [f for f in data if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert undeclared == [], "add them to [tool.setuptools.package-data] in pyproject.toml"
    stale = [p for p in patterns if not any(fnmatch.fnmatch(f, p) for f in files)]
    assert stale == []


def test_the_emulator_reads_its_header_from_the_package():
    from tcstage.cuda import emulate

    header = Path(emulate._HEADER).resolve()
    assert header.is_file() and header.parent == (PACKAGE / "cuda").resolve()
