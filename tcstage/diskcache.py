"""Compiled libraries kept on disk between processes, shared by the CUDA emulator's kernels
(`tcstage.cuda.emulate`) and the CPU's Halide pipelines (`tcstage.halide.aot`).

Each cache is a directory under `root()`: $TCSTAGE_CACHE_DIR, else $XDG_CACHE_HOME/tcstage, else
~/.cache/tcstage (the tuning cache lives there too). A library is built under temporary names
in that directory and renamed into place, its digest (sha256 of its bytes) first, so that
concurrent processes never load half a file; it is loaded only where its bytes match the digest
(`verified`), since loading anything else could crash the process or run foreign code. A cache
directory that cannot be written is left alone, with a warning, and the process compiles into
a directory of its own (`LibraryCache.directory`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import tempfile

from tcstage.errors import warn


def root() -> str:
    own = os.environ.get("TCSTAGE_CACHE_DIR")
    if own:
        return own
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tcstage")


@functools.cache
def code_digest() -> str:
    """sha256 of tcstage's own sources and native extension, and of the Halide version: what
    everything kept here was made by (a change to any of it makes everything afresh)."""
    h = hashlib.sha256(importlib.metadata.version("halide").encode())
    package = pathlib.Path(__file__).resolve().parent
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".so", ".h", ".c", ".cpp") and path.is_file():
            h.update(str(path.relative_to(package)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def verified(path: str, digest_path: str, what: str) -> bool:
    """Whether the cached library at `path` is whole and the one built here: its bytes match
    the digest recorded beside it when it was built. Anything else there (a zero-byte or half
    copied file, a library planted under the name, a file without its digest) is removed, with
    a warning naming `what` it is, to be built again."""
    if not os.path.exists(path):
        return False
    try:
        with open(digest_path) as f:
            recorded = f.read().strip()
        if recorded and digest(path) == recorded:
            return True
        why = "its bytes do not match the digest recorded when it was built"
    except OSError:
        why = "it has no digest recorded beside it"
    warn(f"{what} {path} is not the one tcstage built ({why}); building it again")
    for stale in (path, digest_path):
        with contextlib.suppress(OSError):
            os.remove(stale)
    return False


def publish(built: str, path: str, digest_path: str) -> None:
    """Moves a library built in a temporary directory of the cache into place, its digest
    first (so that every library in the cache has one)."""
    scratch = built + ".sha256"
    with open(scratch, "w") as f:
        f.write(digest(built))
    os.replace(scratch, digest_path)
    os.replace(built, path)


class LibraryCache:
    """One cache directory, `root()/<name>`; `what` names its libraries in warnings."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        self.writable: dict[str, bool] = {}  # directory -> whether it can be written (once)
        self.private: list[str] = []  # this process's own directory, where it cannot

    def path(self) -> str:
        return os.path.join(root(), self.name)

    def directory(self, path: str | None = None) -> str:
        """`path` (the cache's, by default), created, where libraries can be written there;
        else, with a warning (once per directory), a directory of this process's own."""
        directory = path or self.path()
        if directory not in self.writable:
            try:
                os.makedirs(directory, exist_ok=True)
                with tempfile.TemporaryFile(dir=directory):
                    pass
                self.writable[directory] = True
            except OSError as e:
                self.writable[directory] = False
                warn(f"{self.what} cannot write its kernel cache {directory} "
                     f"({e.strerror or e}); it compiles kernels into a directory of this "
                     "process's own instead (set TCSTAGE_CACHE_DIR to a writable directory to "
                     "keep them)")
        if self.writable[directory]:
            return directory
        if not self.private:
            self.private.append(tempfile.mkdtemp(prefix=f"tcstage-{self.name}-"))
        return self.private[0]


class TextCache:
    """Small JSON values that tcstage derives from TC source (generated derivatives), one file
    per key under `root()/<name>`, made by this tcstage (`code_digest` is part of every key).
    Written as libraries are (`publish`) and read only where the bytes match their digest;
    anything else is a miss. A memo: where the directory cannot be written, values are made
    again in each process, without a word."""

    def __init__(self, name: str):
        self.name = name

    def key(self, *parts: str) -> str:
        return hashlib.sha256("\0".join((code_digest(), *parts)).encode()).hexdigest()[:32]

    def get(self, key: str):
        path = os.path.join(root(), self.name, f"{key}.json")
        try:
            if not verified(path, path + ".sha256", "a file of tcstage's derivative cache"):
                return None
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def put(self, key: str, value) -> None:
        directory = os.path.join(root(), self.name)
        try:
            os.makedirs(directory, exist_ok=True)
            handle, scratch = tempfile.mkstemp(dir=directory, suffix=".part")
        except OSError:
            return
        try:
            with os.fdopen(handle, "w") as f:
                json.dump(value, f)
            path = os.path.join(directory, f"{key}.json")
            publish(scratch, path, path + ".sha256")
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(scratch)
