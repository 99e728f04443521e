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
import hashlib
import os
import tempfile

from tcstage.errors import warn


def root() -> str:
    own = os.environ.get("TCSTAGE_CACHE_DIR")
    if own:
        return own
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tcstage")


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
