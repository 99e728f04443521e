"""The Ray evaluator for real: a local Ray instance tunes tmm, and RayPool reports hung and
crashed evaluations as "timeout" and "crash" (the statuses LocalPool gives them)."""

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'tcstage[ray]'")

import tcstage as tc  # noqa: E402
from tcstage.tune.workers import RayPool  # noqa: E402

pytestmark = pytest.mark.slow

TMM = (Path(__file__).resolve().parent.parent / "examples" / "tmm.tc").read_text()


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # pytest imports this file from a path Ray's workers lack: send its functions by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    if started:
        ray.shutdown()


# Module-level (not closures) so that Ray's workers find them by reference.
def _square(x):
    return x * x


def _sleep(seconds):
    time.sleep(seconds)
    return seconds


def _raise(_):
    raise ValueError("this candidate is broken")


def _abort(_):
    os.abort()  # the worker process dies, as a compiler crash would kill it


def test_autotune_with_ray_finds_correct_options(local_ray):
    res = tc.autotune(TMM, "tmm", (32, 16), (64, 16), measure="model", budget=8,
                      evaluator="ray", cache=False, progress=False)
    ok = [c for c in res.history if c.status == "ok"]
    assert ok, [(c.status, c.detail) for c in res.history]
    assert res.checked and res.measured_on == "model" and res.time > 0
    assert sum(c.status != "pruned" for c in res.history) <= 8
    # the winner is one of the candidates the workers compiled and emulated
    assert any(c.options == str(res.options) and c.checked == "emulated" for c in ok)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((32, 16)).astype(np.float32)
    B = rng.standard_normal((64, 16)).astype(np.float32)
    kernel = tc.compile(TMM, "tmm", A, B, options=res.options, target="cuda-emulated")
    np.testing.assert_allclose(np.asarray(kernel(A, B)), A.astype(np.float64) @ B.T.astype(
        np.float64), rtol=1e-4, atol=1e-4)


def test_ray_pool_results_timeouts_and_crashes(local_ray):
    pool = RayPool(timeout=2)
    got = dict(pool.run(_square, [3, 4]))
    assert {i: (o.status, o.value) for i, o in got.items()} == {0: ("ok", 9), 1: ("ok", 16)}

    # six 2 s tasks on 2 CPUs take 6 s in all, but none runs for 3.5 s: none times out
    # (the time limit counted from submission timed out the last ones)
    got = dict(RayPool(timeout=3.5).run(_sleep, [2] * 6))
    assert [(got[i].status, got[i].value) for i in range(6)] == [("ok", 2)] * 6, got

    started = time.monotonic()
    got = dict(pool.run(_sleep, [60, 0]))
    assert time.monotonic() - started < 30  # the hung task was cancelled, not waited for
    assert got[0].status == "timeout" and "2 s" in got[0].detail
    assert (got[1].status, got[1].value) == ("ok", 0)

    got = dict(pool.run(_raise, [None]))
    assert got[0].status == "crash" and "ValueError" in got[0].detail \
        and "this candidate is broken" in got[0].detail

    got = dict(pool.run(_abort, [None]))
    assert got[0].status == "crash" and got[0].detail

    # Ray replaces the dead workers (starting one can take seconds here: a longer limit)
    assert dict(RayPool(timeout=60).run(_square, [5]))[0].value == 25
