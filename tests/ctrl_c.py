"""Ctrl-C for the tests that send SIGINT to a tuner: a process started from a background job
(`bash .ci/run &`, nohup) inherits SIGINT ignored, and then Python raises no
KeyboardInterrupt and tcstage leaves the signal ignored, as a background job expects. These
tests are about an interactive Ctrl-C, so they restore it."""

import contextlib
import signal


def default_sigint() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: the child starts with SIGINT's default action,
    which Python turns into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def interruptible():
    """This process raises KeyboardInterrupt on SIGINT inside the block."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
