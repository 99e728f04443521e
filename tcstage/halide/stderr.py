"""Halide's notes about choices tcstage made, kept out of the user's output.

Halide's Python bindings print its warnings to `sys.stdout`: not Python warnings, so no
warnings filter stops them. Two are about what tcstage does on purpose, and tell a user
nothing:
- compiling float16 or bfloat16 arithmetic for a CPU without native support, Halide prints
  "Warning: In function ..., (b)float16 type operation is emulated, ..." once per loop nest
  and compile: the emulation (computing in float32 and rounding) is what tcstage means;
- a line buffer of the stencil schedule (a Func stored per strip, computed per row) that its
  reader loads as vectors across the buffer's rolling dimension is not folded, and Halide
  says "Warning: Not folding Func ... storage folding was not explicitly requested ...": the
  buffer then holds the strip's rows unfolded, as the schedule allows.
`halide_notes_dropped()` holds sys.stdout and sys.stderr while a pipeline compiles, then
writes back everything but those notes. A lock serialises these compiles, because the streams
are the process's.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading

_DROPPED = re.compile(r"Warning: (In function \S+, \(b\)float16 type operation is emulated\b|"
                      r"Not folding Func \S+ along dimension .* storage folding was not "
                      r"explicitly requested)")
_lock = threading.Lock()


@contextlib.contextmanager
def halide_notes_dropped():
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
                        if not _DROPPED.match(line)]
                if kept:
                    stream.write("".join(kept))
                    stream.flush()
