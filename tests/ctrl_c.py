"""Ctrl-C for the tests that send SIGINT to a tuner (and, where one does not stop, its stacks
and no orphan left running). A process started from a background job
(`bash .ci/run &`, nohup) inherits SIGINT ignored, and then Python raises no
KeyboardInterrupt and tcstage leaves the signal ignored, as a background job expects. These
tests are about an interactive Ctrl-C, so they restore it."""

import contextlib
import signal
import subprocess


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


def communicate_or_dump(child, seconds=60):
    """The child's output once it ends; if it has not within `seconds`, its threads' stacks
    (SIGABRT, where PYTHONFAULTHANDLER is set) and the processes still holding its
    pipes are the failure's message; it never outlives the test."""
    try:
        return child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        table = subprocess.run(["ps", "-eo", "pid,ppid,pgid,etimes,args"], capture_output=True,
                               text=True).stdout
        child.send_signal(signal.SIGABRT)
        try:
            out, err = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
        raise AssertionError(f"still running {seconds} s after the signal\n--- stdout:\n{out}"
                             f"\n--- stderr:\n{err[-8000:]}\n--- processes:\n{table}") from None
