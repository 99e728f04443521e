"""Build script for tcstage's native extension.

Project metadata lives in pyproject.toml; this file only adds what cannot be
declared statically there: the C++ extension ``tcstage.halide._native``, which
compiles against the Halide.h and links against the libHalide.so shipped inside
the ``halide`` wheel.  The wheel is found through Python's import machinery, so
it works both in pip's isolated build environment (where pip installs
``halide`` from [build-system].requires) and with ``--no-build-isolation``.
"""

import importlib.util
import os
import re
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _halide_package_dir():
    """Directory of the installed ``halide`` Python package."""
    spec = importlib.util.find_spec("halide")
    if spec is not None and spec.submodule_search_locations:
        return os.path.abspath(list(spec.submodule_search_locations)[0])
    # Fall back to a real import (also gives a readable error if missing).
    try:
        import halide
    except ImportError as exc:  # pragma: no cover - build configuration error
        raise RuntimeError(
            "Building tcstage needs the 'halide' wheel (halide==21.0.0) importable "
            "at build time; it is listed in [build-system].requires, so build "
            "with pip (isolated) or install it first."
        ) from exc
    return os.path.dirname(os.path.abspath(halide.__file__))


def _halide_paths():
    root = _halide_package_dir()
    include = os.path.join(root, "include")
    if not os.path.isfile(os.path.join(include, "Halide.h")):
        raise RuntimeError(f"Halide.h not found under {include}; is the halide wheel complete?")
    for libdir_name in ("lib64", "lib"):
        libdir = os.path.join(root, libdir_name)
        if os.path.isfile(os.path.join(libdir, "libHalide.so")):
            return include, libdir, libdir_name
    raise RuntimeError(f"libHalide.so not found under {root}/lib64 or {root}/lib")


def _pybind11_include():
    import pybind11

    return pybind11.get_include()


def _native_extension():
    include, libdir, libdir_name = _halide_paths()

    # Where the dynamic loader should look for libHalide.so at run time:
    #  1. next to the installed extension: site-packages/tcstage/halide/_native*.so
    #     -> site-packages/halide/<lib64>, i.e. the runtime halide wheel;
    #  2. the halide wheel of the interpreter's own site-packages (this helps
    #     editable installs, whose extension sits in the source tree);
    #  3. the halide wheel seen at build time (absolute; may be a temporary
    #     build environment, so only a last resort).
    # In any case tcstage imports `halide` first, which loads libHalide.so.
    rpaths = [f"$ORIGIN/../../halide/{libdir_name}"]
    purelib = sysconfig.get_paths().get("purelib")
    if purelib:
        rpaths.append(os.path.join(purelib, "halide", libdir_name))
    rpaths.append(libdir)
    seen = []
    for p in rpaths:
        if p not in seen:
            seen.append(p)

    return Extension(
        "tcstage.halide._native",
        sources=["tcstage/halide/_native.cpp"],
        include_dirs=[include, _pybind11_include()],
        library_dirs=[libdir],
        # libstdc++ named explicitly: the shared one, the C++ runtime libHalide uses too (see
        # _SharedRuntimeBuild)
        libraries=["Halide", "stdc++"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"],
        extra_link_args=[f"-Wl,-rpath,{p}" for p in seen],
    )


# Flags that would link a second, static copy of the C++ runtime into the extension.
_STATIC_RUNTIME = ("-static-libstdc++", "-static-libgcc", "-static")


def _needed_libraries(path):
    """tcstage/halide/elf.py's reader, loaded by path: tcstage is not importable yet."""
    spec = importlib.util.spec_from_file_location(
        "_tcstage_elf", os.path.join(HERE, "tcstage", "halide", "elf.py"))
    elf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(elf)
    return elf.needed_libraries(path)


class _SharedRuntimeBuild(build_ext):
    """Links the extension against the shared libstdc++, whatever the environment's flags say,
    and checks the result. A build environment may put -static-libstdc++ into LDFLAGS (the H200
    machine's image did); the extension then carries its own libstdc++ beside the shared one
    libHalide uses, and crashes inside std::ostringstream once PyTorch or the CUDA driver puts
    the shared one in the process's global scope (tcstage/halide/elf.py says more)."""

    def build_extension(self, ext):
        dropped = set()
        for attr in ("linker_so", "linker_so_cxx", "compiler_cxx", "compiler_so"):
            command = getattr(self.compiler, attr, None)
            if isinstance(command, list):
                dropped |= {a for a in command if a in _STATIC_RUNTIME}
                setattr(self.compiler, attr, [a for a in command if a not in _STATIC_RUNTIME])
        if dropped:
            print(f"tcstage: ignoring {' '.join(sorted(dropped))} from the build environment: "
                  "the extension must share libHalide's C++ runtime")
        super().build_extension(ext)
        if self._links_shared_runtime(ext):
            return
        # A compiler installed without a shared libstdc++ (the H200 image's /opt/gcc, 2026-11-28)
        # resolves -lstdc++ to its static archive whatever the flags say. Link the shared one that
        # libHalide itself loads, named by its path, so that it comes before the driver's own.
        runtime = _halide_cxx_runtime(ext.library_dirs[0])
        if runtime is not None:
            print(f"tcstage: the compiler linked libstdc++ statically; relinking with {runtime}")
            ext.libraries = [lib for lib in ext.libraries if lib != "stdc++"]
            ext.extra_objects = [*ext.extra_objects, runtime]
            self.force = True
            super().build_extension(ext)
            if self._links_shared_runtime(ext):
                return
        path = self.get_ext_fullpath(ext.name)
        raise RuntimeError(
            f"{path} was linked without the shared libstdc++ (it needs "
            f"{_needed_libraries(path)}; libHalide's is {runtime}): a static copy of the C++ "
            "runtime beside libHalide's crashes at run time. Check LDFLAGS and the compiler's "
            "defaults for -static-libstdc++, or build with another compiler (CXX=/usr/bin/g++).")

    def _links_shared_runtime(self, ext):
        needed = _needed_libraries(self.get_ext_fullpath(ext.name))
        return any(n.startswith("libstdc++.so") for n in needed)


def _halide_cxx_runtime(libdir):
    """The path of the shared libstdc++ that libHalide.so loads (as ldd resolves it), or None."""
    import subprocess

    try:
        listing = subprocess.run(["ldd", os.path.join(libdir, "libHalide.so")],
                                 capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"^\s*libstdc\+\+\.so\S*\s+=>\s+(/\S+)", listing, re.MULTILINE)
    return match.group(1) if match else None

setup(
    packages=find_packages(where=HERE, include=["tcstage", "tcstage.*"]),
    ext_modules=[_native_extension()],
    cmdclass={"build_ext": _SharedRuntimeBuild},
    # The C++ source is only needed to build; keep it out of installed trees.
    exclude_package_data={"tcstage.halide": ["*.cpp"]},
    zip_safe=False,
)
