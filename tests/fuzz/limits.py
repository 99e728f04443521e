"""A time limit on Python code under test: a hang becomes a test failure, not a stuck suite."""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int, what: str = "the test"):
    """Raises Hang in the main thread once `seconds` have passed. The alarm interrupts Python
    code between bytecodes: a single long call into native code (Halide, isl) ends first, so
    the paths under test, mostly Python around short native calls, stop close to the limit."""
    def expire(signum, frame):
        raise Hang(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
