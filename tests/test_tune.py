"""tc.autotune with the cost model (no GPU here): the search converges, every candidate is
isolated (planted crashing, hanging and wrong candidates get their status and never win), the
cache warms later runs and feeds options="auto", and Ctrl-C keeps the best so far.

References are independent: numpy products for results, the naive kernel's predicted time for
convergence, statuses planted by hand. Workers are forked, so a monkeypatch made here before
tuning is what the workers run.
"""

import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import attrs
import numpy as np
import pytest

import tcstage as tc
from tcstage.compiler import compile_cuda
from tcstage.tune import evaluate, model, tuner
from tcstage.tune.cache import Cache, Key

from ctrl_c import communicate_or_dump, default_sigint  # tests/

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMM = open(os.path.join(ROOT, "examples", "tmm.tc")).read()
TBMM = open(os.path.join(ROOT, "examples", "tbmm.tc")).read()
MLP = open(os.path.join(ROOT, "examples", "mlp.tc")).read()
NAIVE = tc.MappingOptions()


def _predicted(src, name, shapes, options):
    return model.predict(compile_cuda(tc.define(src)[name], shapes, None, options)).time


@pytest.mark.parametrize("src, name, shapes", [
    (TMM, "tmm", [(128, 64), (256, 64)]),
    pytest.param(TBMM, "tbmm", [(20, 26, 72), (20, 26, 72)], marks=pytest.mark.slow),
    pytest.param(MLP, "MLP1", [(32, 256), (64, 256), (64,)], marks=pytest.mark.slow),
], ids=["tmm", "tbmm", "MLP1"])
def test_search_with_the_model_converges_far_below_the_naive_kernel(src, name, shapes,
                                                                   monkeypatch):
    # no warm start but the naive options: what is found, the search found
    monkeypatch.setattr(tuner._Session, "seeds", lambda self, start_from: [(NAIVE, "naive")])
    res = tc.autotune(src, name, *shapes, measure="model", budget=16, cache=False,
                      progress=False, jobs=2)
    naive = _predicted(src, name, shapes, NAIVE)
    assert res.measured_on == "model" and res.checked
    assert res.time < naive / 20, (res.time, naive)
    # the reported time is the model's for the reported options, recomputed independently
    assert res.time == pytest.approx(_predicted(src, name, shapes, res.options), rel=1e-9)
    best = min(c.time for c in res.history if c.status == "ok" and c.checked == "emulated")
    assert res.time == best
    assert {c.status for c in res.history} <= set(tuner.STATUSES)
    assert res.history[0].source == "naive" and str(res.options) != str(NAIVE)
    assert sum(c.source == "search" for c in res.history) >= 15


def test_the_tuned_kernel_computes_the_right_result():
    A = np.random.default_rng(1).standard_normal((64, 32), dtype=np.float32)
    B = np.random.default_rng(2).standard_normal((96, 32), dtype=np.float32)
    res = tc.autotune(TMM, "tmm", A, B, measure="model", budget=8, cache=False, progress=False)
    kernel = tc.compile(TMM, "tmm", A, B, options=res.options, target="cuda-emulated")
    np.testing.assert_allclose(kernel(A, B), A @ B.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k", [(4, 0), (0, 8)], ids=["no terms", "no rows"])
def test_empty_statements_are_checked_like_any_other(m, k):
    """A statement without instances at the call's sizes (a sum of no terms, an empty output)
    counted as infinitely many: every candidate was 'not checked', and autotune warned that
    its best was not, where checking costs nothing."""
    A, B = np.ones((m, k), np.float32), np.ones((4, k), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.TCWarning)
        res = tc.autotune(TMM, "tmm", A, B, measure="model", budget=3, cache=False,
                          progress=False, jobs=1)
    assert res.checked
    kernel = tc.compile(TMM, "tmm", A, B, options=res.options, target="cuda-emulated")
    np.testing.assert_array_equal(kernel(A, B), np.zeros((m, 4), np.float32))


# -- planted failures -------------------------------------------------------------------------

GOOD = tc.MappingOptions().tile(8, 32).mapToThreads(32, 8).mapToBlocks(8, 4)
CRASH, HANG, WRONG = GOOD.unroll(8), GOOD.unroll(16), GOOD.unroll(2)


def _planted(monkeypatch):
    """Seeds are exactly the planted candidates and GOOD; the workers crash, hang or miscompile
    on the planted ones."""
    compile_one = evaluate._compile

    def planted_compile(job, codegen=True):
        if job.options == str(CRASH):
            faulthandler.disable()  # (pytest's would print the abort's stack on the terminal)
            os.abort()
        if job.options == str(HANG):
            time.sleep(3600)
        compiled = compile_one(job, codegen)
        if job.options == str(WRONG) and codegen:  # a miscompiled reduction identity: 1, not 0
            cuda = attrs.evolve(compiled.cuda, source=compiled.cuda.source.replace(
                "= 0.0f;", "= 1.0f;"))
            compiled = attrs.evolve(compiled, cuda=cuda)
        return compiled

    monkeypatch.setattr(evaluate, "_compile", planted_compile)
    monkeypatch.setattr(tuner._Session, "seeds", lambda self, start_from: [
        (WRONG, "planted wrong"), (CRASH, "planted crash"), (HANG, "planted hang"),
        (GOOD, "good")])


def test_crashing_hanging_and_wrong_candidates_get_their_status_and_never_win(monkeypatch):
    _planted(monkeypatch)
    start = time.monotonic()
    res = tc.autotune(TMM, "tmm", (64, 32), (128, 32), measure="model", budget=4,
                      population=4, cache=False, progress=False, jobs=2, timeout=5)
    assert time.monotonic() - start < 60  # the hang cost its time limit, not the run
    by_options = {c.options: c for c in res.history}
    assert by_options[str(CRASH)].status == "crash"
    assert "SIGABRT" in by_options[str(CRASH)].detail
    assert by_options[str(HANG)].status == "timeout"
    wrong = by_options[str(WRONG)]
    assert wrong.status == "wrong" and wrong.time is None
    assert "C[" in wrong.detail and "expected" in wrong.detail
    # the wrong kernel could have won: the model ranks it no worse than the right one
    assert wrong.predicted <= by_options[str(GOOD)].predicted
    assert str(res.options) == str(GOOD)
    assert by_options[str(GOOD)].status == "ok"


# -- the cache ----------------------------------------------------------------------------------

def test_new_best_is_cached_and_options_auto_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(tmp_path))
    shapes = [(64, 32), (128, 32)]
    with pytest.warns(tc.TCWarning, match="no tuned options"):
        before = tc.compile(TMM, "tmm", *shapes, options="auto", target="cuda-emulated")
    res = tc.autotune(TMM, "tmm", *shapes, measure="model", budget=8, progress=False)
    with Cache() as cache:
        entry = cache.get(Key.for_call(tc.define(TMM).tmm,
                                       tc.define(TMM).tmm.bind(shapes, None, shapes_only=True),
                                       "cuda", res.device))
    assert entry is not None and entry.options == str(res.options)
    assert entry.measured == "model" and entry.time == res.time
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no tuned options" warning any more
        after = tc.compile(TMM, "tmm", *shapes, options="auto", target="cuda-emulated")
    assert str(after.options) == str(res.options)
    assert str(before.options) != str(res.options) or before is after


def test_structural_default_is_correct_and_beats_naive():
    A = np.random.default_rng(3).standard_normal((20, 26, 72), dtype=np.float32)
    B = np.random.default_rng(4).standard_normal((20, 26, 72), dtype=np.float32)
    with pytest.warns(tc.TCWarning, match="default from the TC's structure"):
        kernel = tc.compile(TBMM, "tbmm", A, B, options="auto", target="cuda-emulated")
    np.testing.assert_allclose(kernel(A, B), np.einsum("bnm,bkm->bnk", A, B), rtol=1e-4,
                               atol=1e-4)
    assert model.predict(kernel.compiled).time < \
        _predicted(TBMM, "tbmm", [A.shape, B.shape], NAIVE) / 20


@pytest.mark.slow  # (11 s cold)
def test_warm_start_from_other_sizes(tmp_path):
    path = tmp_path / "tune.sqlite"
    first = tc.autotune(TMM, "tmm", (64, 32), (128, 32), measure="model", budget=8,
                        cache=path, progress=False)
    second = tc.autotune(TMM, "tmm", (64, 64), (128, 64), measure="model", budget=4,
                         cache=path, progress=False)
    seeded = [c for c in second.history if c.source.startswith("cache (")]
    assert seeded and seeded[0].options == str(first.options)
    assert "K=32" in seeded[0].source


def test_manual_schedules_for_these_sizes_are_warm_starts(tmp_path, monkeypatch):
    manual = tc.MappingOptions().tile(4, 16).mapToThreads(16, 4).mapToBlocks(16, 8)
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "mine.txt").write_text(
        f"mine | tmm.tc:tmm | M=64,K=32,N=128 | {manual}\n"
        f"other | tmm.tc:tmm | M=64,K=16,N=128 | {manual.unroll(2)}\n")
    monkeypatch.chdir(tmp_path)
    res = tc.autotune(TMM, "tmm", (64, 32), (128, 32), measure="model", budget=2,
                      population=2, cache=False, progress=False)
    seeded = [c for c in res.history if c.source.startswith("schedules (mine")]
    assert [c.options for c in seeded] == [str(manual)]
    assert not any(c.options == str(manual.unroll(2)) for c in res.history)


def test_compile_returns_the_same_kernel_for_the_same_call():
    a = tc.compile(TMM, "tmm", (64, 32), (128, 32), options=GOOD, target="cuda-emulated")
    b = tc.compile(TMM, "tmm", (64, 32), (128, 32), options=str(GOOD), target="cuda-emulated")
    c = tc.compile(TMM, "tmm", (64, 32), (128, 32), options=GOOD.unroll(2),
                   target="cuda-emulated")
    d = tc.compile(TMM, "tmm", (64, 16), (128, 16), options=GOOD, target="cuda-emulated")
    assert a is b and c is not a and d is not a


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_keeps_the_best_in_the_cache(tmp_path):
    path = tmp_path / "tune.sqlite"
    script = textwrap.dedent(f"""
        import sys, tcstage as tc
        res = tc.autotune(open({os.path.join(ROOT, 'examples', 'tmm.tc')!r}).read(), "tmm",
                          (64, 32), (128, 32), measure="model", budget=100000,
                          cache={str(path)!r}, progress=False, jobs=1)
        print("INTERRUPTED" if res.interrupted else "FINISHED", res.options, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
                             env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until a best is in the cache
        time.sleep(1)
        if path.exists():
            with Cache(path) as cache:
                if cache.entries():
                    break
    child.send_signal(signal.SIGINT)
    out, err = communicate_or_dump(child)
    assert child.returncode == 0, err
    assert out.startswith("INTERRUPTED"), (out, err)
    with Cache(path) as cache:
        stored = [e.options for e in cache.entries()]
    assert out.split(" ", 1)[1].strip() in stored


# -- arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"measure": "fast"}, "measure must be"),
    ({"strategy": "annealing"}, "unknown strategy"),
    ({"budget": 0}, "budget must be a positive integer"),
    ({"target": "cpu"}, "measures on this CPU"),  # (measure="model" is for CUDA)
    ({"target": "tpu"}, "unknown target 'tpu'"),
    ({"device": "V100"}, "V100"),
])
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(tc.TCError, match=message):
        tc.autotune(TMM, "tmm", (8, 8), (8, 8), cache=False, progress=False,
                    **{"measure": "model", **kwargs})


def test_measure_gpu_without_a_gpu_says_so():
    if tuner.detect_gpu() is not None:
        pytest.skip("a GPU works here")
    with pytest.raises(tc.TCError, match="needs a GPU"):
        tc.autotune(TMM, "tmm", (8, 8), (8, 8), measure="gpu", cache=False, progress=False)
