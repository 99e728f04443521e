"""tcstage's thread pool for cached CPU kernels (tcstage/halide/pool.c): the parallel loops of
every kernel run on its workers, which spin a while between loops. Checked here: results
against numpy with the workers helping, in a forked child, from several Python threads at once;
$HL_NUM_THREADS sets the threads, and a bad value of it or of $TCSTAGE_SPIN_US warns."""

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tcstage as tc
from tcstage.halide import aot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALE = "def scale(float(N,C) X, float(C) w) -> (Y) { Y(n,c) = X(n,c) * w(c) + 1.0 }"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads thread names from /proc")


def _pool_threads() -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # (a thread that ended meanwhile)
            pass
    return names.count("tcstage-pool")


def _check(f, rng, rows=256):
    X = rng.standard_normal((rows, 1024)).astype(np.float32)
    w = rng.standard_normal(1024).astype(np.float32)
    np.testing.assert_allclose(f(X, w), X * w + 1, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def scale():
    if not aot.enabled():
        pytest.skip("the pool belongs to the CPU kernel cache, which is off here")
    f = tc.define(SCALE).scale
    _check(f, np.random.default_rng(0))  # (planned for 256 rows: a parallel loop of tasks)
    assert "in parallel" in f.explain(np.zeros((256, 1024), np.float32),
                                      np.zeros(1024, np.float32))
    return f


@linux_only
def test_parallel_loops_run_on_the_pools_workers(scale):
    # (at least: a test that loads a second cache's runtime library starts a second pool;
    # where this process loaded PyTorch first, the loops run on its OpenMP team instead)
    shared = "torch" in sys.modules and aot._torch_openmp() is not None and \
        bool(aot._openmp_shared)
    assert _pool_threads() >= aot.pool_threads() - 1 > 0 or aot.pool_threads() == 1 or shared


def _in_child(queue):
    try:
        f = tc.define(SCALE).scale
        for seed in range(5):
            _check(f, np.random.default_rng(seed))
        queue.put(_pool_threads() if sys.platform.startswith("linux") else None)
    except BaseException as e:  # (reported to the parent, which asserts)
        queue.put(repr(e))


def test_a_forked_child_starts_workers_of_its_own(scale):
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_in_child, args=(queue,))
    child.start()
    child.join(120)
    assert child.exitcode == 0, "the child hung or failed"
    found = queue.get(timeout=5)
    assert found in (aot.pool_threads() - 1, None), found


def test_several_python_threads_call_kernels_at_once(scale):
    """One loop at a time uses the workers; the others run on their own thread. Each result is
    still right."""
    failures = []

    def calls(seed):
        try:
            rng = np.random.default_rng(seed)
            for k in range(20):
                _check(scale, rng, rows=64 + 37 * k)
        except Exception as e:
            failures.append(e)
    threads = [threading.Thread(target=calls, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures and not any(t.is_alive() for t in threads)


POOL_SCRIPT = textwrap.dedent(f"""
    import os, numpy as np, tcstage as tc
    from tcstage.halide import aot
    f = tc.define({SCALE!r}).scale
    X = np.ones((256, 1024), np.float32); w = np.full(1024, 2, np.float32)
    assert (f(X, w) == 3).all()
    names = [open(f"/proc/self/task/{{t}}/comm").read().strip()
             for t in os.listdir("/proc/self/task")]
    print(aot.pool_threads(), names.count("tcstage-pool"))
""")


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@linux_only
@pytest.mark.parametrize("env, threads, warning", [
    ({"HL_NUM_THREADS": "1"}, 1, None),
    ({"HL_NUM_THREADS": "3"}, 3, None),
    ({"HL_NUM_THREADS": "many"}, CORES, "HL_NUM_THREADS='many' is not a whole number"),
    ({"TCSTAGE_SPIN_US": "soon"}, CORES,
     "TCSTAGE_SPIN_US='soon' is not a whole number of microseconds")])
def test_the_environment_sets_the_pool(env, threads, warning):
    if not aot.enabled():
        pytest.skip("the pool belongs to the CPU kernel cache, which is off here")
    env = {**{k: v for k, v in os.environ.items() if k not in ("HL_NUM_THREADS",
                                                                 "TCSTAGE_SPIN_US")}, **env}
    r = subprocess.run([sys.executable, "-c", POOL_SCRIPT], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(threads), str(threads - 1)]
    assert (warning is not None and warning in r.stderr) or (warning is None and not r.stderr)


TORCH_SCRIPT = textwrap.dedent(f"""
    import os, sys, threading, numpy as np
    import torch  # (first: the runtime library loads after it, and shares its OpenMP team)
    import tcstage as tc
    from tcstage.halide import aot
    f = tc.define({SCALE!r}).scale
    rng = np.random.default_rng(0)
    def check(rows, pytorch=True):
        X = rng.standard_normal((rows, 1024)).astype(np.float32)
        w = rng.standard_normal(1024).astype(np.float32)
        assert np.allclose(f(X, w), X * w + 1, rtol=1e-6, atol=1e-6)
        if pytorch:
            assert torch.allclose(torch.from_numpy(X).mul(torch.from_numpy(w)).add(1),
                                  torch.from_numpy(f(X, w)), rtol=1e-6, atol=1e-6)
            # (PyTorch's team runs its own loops between ours)
    for rows in (256, 300, 64):
        check(rows)
    failures = []
    def calls():
        try:
            for rows in (256, 190, 512):
                check(rows)
        except BaseException as e:
            failures.append(e)
    threads = [threading.Thread(target=calls) for _ in range(3)]
    [t.start() for t in threads]; [t.join() for t in threads]
    assert not failures, failures
    pid = os.fork()
    if pid == 0:  # (a forked child cannot use the parent's team: it starts workers of its own;
        #           PyTorch's own parallel operators hang there, a limitation of libgomp)
        try:
            check(256, pytorch=False)
            os._exit(0)
        except BaseException:
            os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0, "the forked child failed"
    names = [open(f"/proc/self/task/{{t}}/comm").read().strip()
             for t in os.listdir("/proc/self/task")]
    print(aot._torch_openmp() is not None, names.count("tcstage-pool"))
""")


@linux_only
@pytest.mark.parametrize("share", ["1", "0"])
def test_with_pytorch_loaded_loops_run_on_its_openmp_team(share):
    """With PyTorch loaded, parallel loops run on PyTorch's OpenMP threads (no tcstage-pool
    threads start), unless TCSTAGE_TORCH_OPENMP=0; results stay numpy's, from several Python
    threads at once and in a forked child."""
    if not aot.enabled():
        pytest.skip("the pool belongs to the CPU kernel cache, which is off here")
    pytest.importorskip("torch")
    env = {**{k: v for k, v in os.environ.items() if k != "HL_NUM_THREADS"},
           "TCSTAGE_TORCH_OPENMP": share}
    r = subprocess.run([sys.executable, "-c", TORCH_SCRIPT], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    found_openmp, workers = r.stdout.split()
    if found_openmp == "False" or CORES < 2:
        assert int(workers) == max(CORES - 1, 0)
    else:
        assert int(workers) == (0 if share == "1" else CORES - 1)


THREADS_SCRIPT = textwrap.dedent(f"""
    import os, sys, threading, time, numpy as np
    import torch
    import tcstage as tc
    torch.set_num_threads(int(sys.argv[1]))
    f = tc.define({SCALE!r}).scale
    X = torch.randn(2048, 1024)
    w = torch.randn(1024)
    f(X, w)  # (compiled, and the kernel memo made)
    def cpu_seconds():
        main, others = threading.get_native_id(), 0.0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{{task}}/stat") as s:
                fields = s.read().rsplit(")", 1)[1].split()
            ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            if int(task) != main:
                others += ticks
        return others
    before, start = cpu_seconds(), time.process_time()
    while time.process_time() - start < 1.5:
        assert torch.allclose(f(X, w), X * w + 1, rtol=1e-5, atol=1e-5)
    print(cpu_seconds() - before, time.process_time() - start)
""")


@linux_only
def test_kernels_on_pytorchs_team_use_as_many_threads_as_pytorch_would():
    """torch.set_num_threads(1) makes tcstage's CPU kernels serial too: no other thread does
    work for them (they took the pool's thread count, every core, from PyTorch's team)."""
    if not aot.enabled():
        pytest.skip("the pool belongs to the CPU kernel cache, which is off here")
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("HL_NUM_THREADS",
                                                            "TCSTAGE_TORCH_OPENMP")}
    for threads in ([1, 2] if CORES >= 2 else [1]):
        r = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, str(threads)],
                           capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        others, total = map(float, r.stdout.split())
        if threads == 1:
            assert others <= 0.05 * total, (others, total)
        else:  # (the control: with two, the second thread takes a good share)
            assert others >= 0.2 * total, (others, total)
