"""The native extension shares libHalide's C++ runtime.

On the first GPU machine tcstage ran on (an H200 image whose build flags link libstdc++
statically), `pip install -e .` produced a `_native` carrying its own libstdc++; with PyTorch or
the CUDA driver loaded, the two runtimes' locale tables mixed and every GPU test process crashed
inside `std::ostringstream` (`type_to_str`). setup.py now drops such flags, links the shared
libstdc++ by name (by its path where the compiler finds only a static one) and refuses a build
without it; these tests hold it to that.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tcstage.halide import _native, elf

ROOT = Path(__file__).parent.parent


def test_the_installed_extension_needs_the_shared_libstdcxx():
    needed = elf.needed_libraries(_native.__file__)
    assert "libHalide.so" in needed
    assert any(n.startswith("libstdc++.so") for n in needed), needed


def test_the_elf_reader_against_readelf(tmp_path):
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    for path in (_native.__file__, shutil.which("ls")):
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                             check=True).stdout
        expected = [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines()
                    if "(NEEDED)" in line]
        assert elf.needed_libraries(path) == expected
    text = tmp_path / "not-elf"
    text.write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        elf.needed_libraries(str(text))


def _source_copy(tmp_path) -> Path:
    """setup.py, pyproject.toml and the package, as tracked, copied under tmp_path."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    tree = tmp_path / "src"
    for name in tracked.stdout.split():
        if name.startswith(("setup.py", "pyproject.toml", "tcstage/")):
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    return tree


def _build(tree: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=tree, env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    built = next((tree / "tcstage" / "halide").glob("_native*.so"))
    return r, elf.needed_libraries(str(built))


@pytest.mark.slow
def test_a_build_environment_asking_for_a_static_libstdcxx_still_gets_the_shared_one(tmp_path):
    """LDFLAGS=-static-libstdc++ (what the H200 image's builds amounted to on 2026-11-26):
    setup.py says it ignores the flag, and the extension it builds needs libstdc++.so."""
    r, needed = _build(_source_copy(tmp_path), {"LDFLAGS": "-static-libstdc++"})
    assert "ignoring -static-libstdc++" in r.stdout
    assert any(n.startswith("libstdc++.so") for n in needed), needed


@pytest.mark.slow
def test_a_compiler_with_only_a_static_libstdcxx_still_links_the_shared_one(tmp_path):
    """The H200 image of 2026-11-28 set CXX to a g++ whose -lstdc++ finds only libstdc++.a: here
    a g++ given a library folder holding nothing but that archive. setup.py relinks with the
    shared libstdc++ libHalide loads, named by its path."""
    gxx, archive = shutil.which("g++"), None
    if gxx is not None:
        archive = subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True,
                                 text=True).stdout.strip()
    if not archive or not os.path.isabs(archive):
        pytest.skip("no g++ with a static libstdc++ to imitate the image's compiler with")
    static_only = tmp_path / "static-only"
    static_only.mkdir()
    (static_only / "libstdc++.a").symlink_to(archive)
    wrapper = tmp_path / "g++"
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} -L{static_only} "$@"\n')
    wrapper.chmod(0o755)
    r, needed = _build(_source_copy(tmp_path), {"CXX": str(wrapper)})
    assert "relinking with" in r.stdout
    assert any(n.startswith("libstdc++.so") for n in needed), needed
