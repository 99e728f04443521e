"""Halide's note that narrow floats are emulated, kept out of the user's output.

Compiling a pipeline with float16 or bfloat16 arithmetic for a CPU without native support,
Halide prints "Warning: In function ..., (b)float16 type operation is emulated, ..." once per
loop nest and compile. Its Python bindings print it to `sys.stdout`: not a Python warning, so
no warnings filter stops it. The emulation (computing in float32 and rounding) is what tcstage
means to do there, so the note tells a user nothing. `narrow_float_notes_dropped()` holds
sys.stdout and sys.stderr while such a pipeline compiles, then writes back everything but
those lines. A lock serialises these compiles, because the streams are the process's.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading

_EMULATED = re.compile(r"Warning: In function \S+, \(b\)float16 type operation is emulated\b")
_lock = threading.Lock()


@contextlib.contextmanager
def narrow_float_notes_dropped():
    with _lock:
        saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        try:
            yield
        finally:
            printed = (sys.stdout.getvalue(), sys.stderr.getvalue())
            sys.stdout, sys.stderr = saved
            for stream, text in zip(saved, printed):
                kept = [line for line in text.splitlines(keepends=True)
                        if not _EMULATED.match(line)]
                if kept:
                    stream.write("".join(kept))
                    stream.flush()
