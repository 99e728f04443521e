"""tc.autotune(target="cpu"): a measured search over CpuSchedule."""

import numpy as np
import pytest

import tcstage as tc
from tcstage.cpu import tune as cpu_tune

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(cpu_tune, "SECONDS_PER_CANDIDATE", 0.01)


def test_the_best_schedule_is_measured_checked_and_usable():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((19, 33), dtype=np.float32), \
        rng.standard_normal((21, 33), dtype=np.float32)
    res = tc.autotune(TMM, "tmm", A, B, target="cpu", budget=5, progress=False)
    assert isinstance(res.options, tc.CpuSchedule)
    assert res.measured_on.startswith("cpu: ")
    assert res.sizes == {"M": 19, "K": 33, "N": 21}
    assert len(res.history) <= 5 and res.history[0].options == "CpuSchedule()"
    ok = [c for c in res.history if c.status == "ok"]
    assert res.time == min(c.time for c in ok) > 0
    assert str(res.options) in {c.options for c in ok}
    prog = tc.define(TMM)
    np.testing.assert_allclose(prog.tmm(A, B, schedule=res.options), A @ B.T, rtol=1e-4,
                               atol=1e-4)
    # the result's text reads back as the same schedule
    assert tc.CpuSchedule.parse(str(res.options)) == res.options


def test_start_from_is_evaluated_and_shape_tuples_get_random_inputs():
    start = tc.CpuSchedule().registerTile(1, 2).pack(False)
    res = tc.autotune(TMM, "tmm", (9, 17), (12, 17), target="cpu", budget=3,
                      start_from=str(start), progress=False)
    assert [c.options for c in res.history[:2]] == ["CpuSchedule()", str(start)]
    assert [c.source for c in res.history[:2]] == ["default", "start_from"]


def test_a_time_budget_limits_a_cpu_search_as_it_does_a_cuda_one():
    res = tc.autotune(TMM, "tmm", (9, 17), (12, 17), target="cpu", time_budget=3,
                      progress=False)
    assert res.stopped in ("time", "space") and res.seconds < 3 + 5
    c = res.counts()
    assert c["evaluated"] == c["ok"] + c["wrong"] + c["failed"] + c["pruned after compiling"]


def test_a_candidate_that_gives_a_wrong_result_cannot_win(monkeypatch):
    calls = []
    original = cpu_tune._evaluate

    def sabotaged(f, args, out, schedule, reference, index):
        calls.append(schedule)
        if schedule == tc.CpuSchedule():  # pretend the default schedule computed garbage
            reference = tuple(r + 1 for r in reference)
        return original(f, args, out, schedule, reference, index)

    monkeypatch.setattr(cpu_tune, "_evaluate", sabotaged)
    res = tc.autotune(TMM, "tmm", (8, 8), (8, 8), target="cpu", budget=4, progress=False)
    assert res.history[0].status == "wrong"
    assert res.options != tc.CpuSchedule()


@pytest.mark.parametrize("kwargs, message", [
    ({"measure": "gpu"}, "measures on this CPU"),
    ({"budget": 0}, "budget must be a positive integer, got 0"),
    ({"effort": "fast"}, "unknown effort 'fast'"),
    ({"start_from": 3}, "start_from for target='cpu' takes a CpuSchedule"),
    ({"start_from": "CpuSchedule().tile(3)"}, "no option 'tile'"),
])
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(tc.TCError, match=message):
        tc.autotune(TMM, "tmm", (8, 8), (8, 8), target="cpu", progress=False, **kwargs)


def test_cli_tunes_the_cpu_schedule_and_its_text_runs(capsys):
    from pathlib import Path

    from tcstage.cli import main
    tmm = str(Path(__file__).parent.parent / "examples" / "tmm.tc")
    assert main(["tune", tmm, "--sizes", "M=16,K=8,N=24", "--target", "cpu", "--budget", "3",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "measured on cpu: " in out
    chain = next(line.strip() for line in out.splitlines() if "CpuSchedule()" in line)
    assert main(["run", tmm, "--sizes", "M=16,K=8,N=24", "--schedule", chain,
                 "--repeat", "1"]) == 0
    assert f"schedule: {chain}" in capsys.readouterr().out


def test_cli_refuses_to_save_a_cpu_schedule_into_schedules(tmp_path, capsys):
    from pathlib import Path

    from tcstage.cli import main
    tmm = str(Path(__file__).parent.parent / "examples" / "tmm.tc")
    assert main(["tune", tmm, "--sizes", "M=4,K=4,N=4", "--target", "cpu", "--save",
                 str(tmp_path / "x.txt")]) != 0
    assert "--save stores MappingOptions" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()
