"""Running candidate evaluations in isolation: a candidate that crashes the compiler, hangs,
exhausts memory or ruins a CUDA context costs only its own process.

One small interface, `Pool.run(function, items)`, yields `(index, Outcome)` as evaluations
finish. `LocalPool` forks one process per item (cheap on Linux: the parent's imported modules
and defined program are shared copy-on-write), `jobs` at a time, each with a time limit and an
address-space limit, and each killed by the kernel if the tuner dies (Linux); `RayPool` sends the same calls to a Ray cluster (`pip install
'tcstage[ray]'`). Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one hung task,
and one crashed worker breaks the whole pool.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator, Sequence

import attrs

from tcstage.errors import TCError

STATUSES = ("ok", "crash", "timeout")


@attrs.frozen
class Outcome:
    status: str  # "ok": `value` is the function's result; "crash" / "timeout": `detail` says why
    value: object = None
    detail: str = ""


class LocalPool:
    """`jobs` forked processes at a time (default: the CPU count), each limited to `timeout`
    seconds and `memory` bytes of address space."""

    def __init__(self, jobs: int | None = None, timeout: float = 120.0,
                 memory: int | None = None):
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.timeout, self.memory = timeout, memory

    def run(self, function: Callable, items: Sequence) -> Iterator[tuple[int, Outcome]]:
        import multiprocessing
        import multiprocessing.connection

        ctx = multiprocessing.get_context("fork")
        pending = list(enumerate(items))[::-1]
        running: dict = {}  # read end -> (index, process, start time)
        try:
            while pending or running:
                while pending and len(running) < self.jobs:
                    index, item = pending.pop()
                    read, write = ctx.Pipe(duplex=False)
                    process = ctx.Process(target=_child, args=(function, item, write,
                                                                self.memory, os.getpid()),
                                          daemon=True)
                    with _stopping_signals_held():
                        process.start()
                    write.close()  # the child's copy is the only one: EOF when it dies
                    running[read] = (index, process, time.monotonic())
                now = time.monotonic()
                wait = min(start + self.timeout for _, _, start in running.values()) - now
                for read in multiprocessing.connection.wait(list(running), max(wait, 0)):
                    index, process, _ = running.pop(read)
                    yield index, _finish(read, process)
                now = time.monotonic()
                for read, (index, process, start) in list(running.items()):
                    if now - start >= self.timeout:
                        del running[read]
                        _kill(process)
                        read.close()
                        yield index, Outcome("timeout", detail=f"took longer than "
                                                               f"{self.timeout:g} s")
        finally:  # Ctrl-C or an abandoned generator: no evaluation outlives the tuner
            for read, (_, process, _) in running.items():
                _kill(process)
                read.close()


def default_memory(jobs: int | None = None) -> int:
    """Bytes of address space per worker: an equal share of three quarters of the machine's
    memory among `jobs` workers (default: the CPU count), at least 4 GiB, so that a candidate
    that exhausts memory fails alone instead of the machine swapping."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 << 30
    return max(4 << 30, int(total * 0.75) // max(1, jobs or os.cpu_count() or 1))


def _die_with_parent() -> None:
    """Asks Linux to kill this process when the tuner dies, however it dies (SIGKILL too):
    no worker outlives it. Elsewhere, the tuner's own clean-up is all there is."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


# (Ctrl-C first: `_child` ignores it and restores the others' defaults)
STOPPING_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None))
                         if s is not None)


@contextlib.contextmanager
def _stopping_signals_held():
    """Holds Ctrl-C and the other stopping signals while a worker is forked: the tuner's
    handler raises KeyboardInterrupt, which inside fork's hooks (logging's, say) Python prints
    as a traceback and drops, and which in the new child, before `_child` set its own
    handlers, killed the child with a traceback. A held signal comes once the fork is done
    (the child starts with it held, and drops it or dies of it in `_child`)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _child(function, item, write, memory, parent: int) -> None:
    os.setsid()  # its own process group: a time-out kills the compilers it started too
    _die_with_parent()
    if os.getppid() != parent:  # (the tuner died before the request took effect)
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the tuner's to handle
    for sig in STOPPING_SIGNALS[1:]:  # (not the tuner's handlers, inherited through fork)
        signal.signal(sig, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # (held by the parent during the fork)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        message = ("ok", function(item))
    except MemoryError:
        message = ("crash", "out of memory")
    except BaseException as e:  # noqa: BLE001 - anything else is a crash of this candidate
        message = ("crash", f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
    try:
        write.send(message)
        write.close()
    finally:
        os._exit(0)  # no atexit handlers or finalizers of the parent's objects


def _finish(read, process) -> Outcome:
    try:
        status, value = read.recv()
    except (EOFError, OSError):
        status, value = None, None
    finally:
        read.close()
    process.join(5)
    if status == "ok":
        return Outcome("ok", value)
    if status == "crash":
        return Outcome("crash", detail=value)
    code = process.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Outcome("crash", detail=f"killed by {name}")
    return Outcome("crash", detail=f"the worker exited with status {code} without a result")


def _kill(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.join(5)


class RayPool:
    """Evaluations as Ray tasks: on the cluster at `address` (None: a local Ray instance, or
    the one `ray.init` already started). A crashed task's worker is replaced by Ray; a task
    over `timeout` seconds is cancelled (its worker killed). At most `jobs` tasks (default: the
    cluster's CPUs) are submitted at a time, so that a task's time limit counts from when it
    can run, not from when it joined Ray's queue."""

    def __init__(self, address: str | None = None, timeout: float = 120.0,
                 num_cpus: int | None = None, jobs: int | None = None):
        try:
            import ray
        except ImportError:
            raise TCError("evaluator='ray' needs Ray, which cannot be imported",
                          notes=("install it with: pip install 'tcstage[ray]'",)) from None
        self.ray, self.timeout, self.jobs = ray, timeout, jobs
        if not ray.is_initialized():
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False,
                     log_to_driver=False, ignore_reinit_error=True)

    def run(self, function: Callable, items: Sequence) -> Iterator[tuple[int, Outcome]]:
        ray = self.ray
        remote = ray.remote(max_retries=0)(function)
        jobs = max(1, self.jobs or int(ray.cluster_resources().get("CPU", 1)))
        pending = list(enumerate(items))[::-1]
        refs: dict = {}  # ref -> (index, submission time)
        try:
            while pending or refs:
                while pending and len(refs) < jobs:
                    index, item = pending.pop()
                    refs[remote.remote(item)] = (index, time.monotonic())
                done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
                for ref in done:
                    index, _ = refs.pop(ref)
                    try:
                        yield index, Outcome("ok", ray.get(ref))
                    except ray.exceptions.RayTaskError as e:
                        cause = e.cause if getattr(e, "cause", None) else e
                        yield index, Outcome("crash", detail=f"{type(cause).__name__}: "
                                                             f"{' '.join(str(cause).split())[:500]}")
                    except ray.exceptions.RayError as e:  # the worker died
                        yield index, Outcome("crash", detail=f"{type(e).__name__}: "
                                                             f"{' '.join(str(e).split())[:300]}")
                now = time.monotonic()
                for ref in [r for r, (_, start) in refs.items() if now - start >= self.timeout]:
                    index, _ = refs.pop(ref)
                    ray.cancel(ref, force=True)
                    yield index, Outcome("timeout", detail=f"took longer than {self.timeout:g} s")
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)


def make_pool(evaluator, jobs: int | None, timeout: float, memory: int | None):
    """A pool from the `evaluator` argument: None or "local", "ray", or an object with `run`."""
    if evaluator in (None, "local"):
        return LocalPool(jobs, timeout, memory)
    if evaluator == "ray":
        return RayPool(timeout=timeout)
    if hasattr(evaluator, "run"):
        return evaluator
    raise TCError(f"evaluator must be 'local', 'ray' or an object with a run(function, items) "
                  f"method; got {evaluator!r}")
