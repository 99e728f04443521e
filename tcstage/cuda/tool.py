"""Running the external compilers (nvcc, the emulator's C++ compiler) with a time limit.

`subprocess.run(..., timeout=)` kills only the process it started: a compiler driver's
children (cc1plus, cicc, ptxas) go on running, and holding the CPU, after the limit. Here the
tool runs in a session of its own, and the whole process group goes when the limit is reached.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


def run_tool(cmd: Sequence[str], *, timeout: float, cwd: str) -> subprocess.CompletedProcess:
    """`cmd`'s exit status and text output; subprocess.TimeoutExpired, after killing `cmd`
    and every process it started, if it runs longer than `timeout` seconds; OSError if it
    cannot start."""
    with subprocess.Popen(list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise
        except BaseException:  # KeyboardInterrupt too: never leave a compiler behind
            _kill_group(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # ended already
