"""`tcstage tune` and `tcstage compare` end to end through main(), and tc.compare's einsum
baseline against hand numpy computations. Sizes are tiny and budgets small (the cost model
measures; TCSTAGE_CACHE_DIR is a private directory, see conftest.py)."""

from pathlib import Path

import numpy as np
import pytest

import tcstage as tc
from tcstage.cli import main
from tcstage.tune.compare import einsum_plan, run_einsum

from test_cli import one_line_error  # tests/

EXAMPLES = Path(__file__).parent.parent / "examples"
TMM = str(EXAMPLES / "tmm.tc")
SIZES = "M=8,K=4,N=8"


def table_rows(out: str) -> dict[str, str]:
    return {line.split("  ")[0].strip(): line for line in out.splitlines() if "  " in line}


@pytest.mark.slow  # (14 s cold: the README test command stays under 5 minutes)
def test_tune_save_then_compare_picks_it_up_and_plots(tmp_path, capsys):
    saved = tmp_path / "schedules" / "mine.txt"
    assert main(["tune", TMM, "--sizes", SIZES, "--measure", "model", "--budget", "8",
                 "--save", str(saved), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("best for tmm (K=4, M=8, N=8): ")
    assert "predicted by the cost model" in out and f"saved to {saved}" in out
    lines = saved.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[2].startswith("# tuned on model at ")
    name, where, sizes, chain = (x.strip() for x in lines[3].split("|"))
    assert (name, where, sizes) == ("tmm-tuned", "tmm.tc:tmm", SIZES)
    options = tc.MappingOptions.parse(chain)
    assert str(options) in out

    # a second --save appends, with its own comment, and keeps the header once
    assert main(["tune", TMM, "--sizes", "M=8,K=4,N=4", "--measure", "model", "--budget", "1",
                 "--save", str(saved), "--no-progress"]) == 0
    capsys.readouterr()
    lines = saved.read_text().splitlines()
    assert len(lines) == 6 and sum(line.startswith("# tuned on") for line in lines) == 2

    png = tmp_path / "out.png"
    assert main(["compare", TMM, "--sizes", SIZES, "--measure", "model", "--budget", "0",
                 "--schedules", str(saved.parent), "--options",
                 "MappingOptions().tile(4, 4).mapToThreads(4, 4)", "--plot", str(png),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    # (the baseline is PyTorch's einsum where torch is installed, numpy's otherwise)
    baseline = next(r for r in rows if r in ("torch.einsum (baseline)", "numpy.einsum (baseline)"))
    for row in ("single thread", "preset naive", "preset pointwise", "preset mlp", "preset conv", "preset group_conv",
                "preset reduction", "manual 1", "tmm-tuned", "tuned", baseline,
                "Halide CPU Mullapudi2016"):
        assert row in rows, (row, out)
    for row in ("single thread", "preset mlp", "manual 1", "tmm-tuned", "tuned", baseline):
        assert "  yes  " in rows[row], rows[row]
    assert "emulated  cost model (H100)" in rows["tmm-tuned"]
    assert "1x" in rows[baseline]
    assert "from the tuning cache" in out  # the tuned row is the cached best of the first run
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_compare_plot_has_the_tuning_curve(tmp_path):
    result = tc.compare((EXAMPLES / "tmm.tc").read_text(), "tmm",
                        (8, 4), (4, 4), tune_budget=8, measure="model", progress=False,
                        plot=tmp_path / "c.png", schedules_dir=None)
    assert result.tune is not None and result.tune.curve()
    tuned = result.row("tuned")
    assert tuned.correct is True and tuned.time == result.tune.time
    # a prediction's ratio is to the auto row's prediction, never to a measured baseline
    assert not tuned.measured and result.row(result.baseline).measured
    assert tuned.ratio == tuned.time / result.row("auto (structural default)").time
    assert tuned not in result.measured and tuned in result.predicted
    assert result.tune.curve()[-1][0] <= result.tune.counts()["evaluated"] <= 8
    data = (tmp_path / "c.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_tmm_einsum_baseline_matches_hand_numpy():
    fn = tc.define((EXAMPLES / "tmm.tc").read_text()).tmm.checked
    plan, why = einsum_plan(fn)
    assert why == "" and [(t, s) for t, s, _ in plan] == [("C", "ac,bc->ab")]
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((5, 3), np.float32), rng.standard_normal((4, 3), np.float32)
    (C,) = run_einsum(plan, fn, (A, B))
    hand = np.array([[sum(float(A[m, k]) * float(B[n, k]) for k in range(3)) for n in range(4)]
                     for m in range(5)])
    assert C.dtype == np.float32 and np.allclose(C, hand, rtol=1e-5, atol=1e-6)


def test_two_statement_einsum_with_a_temporary():
    fn = tc.define("def f(float(M,K) A, float(K,N) B, float(N) c) -> (D) {\n"
                   "  T(m,n) +=! A(m,k) * B(k,n)\n  D(m,n) = T(m,n) * c(n)\n}").f.checked
    plan, why = einsum_plan(fn)
    assert why == ""
    rng = np.random.default_rng(2)
    A, B, c = (rng.standard_normal(s) for s in ((3, 4), (4, 2), (2,)))
    (D,) = run_einsum(plan, fn, (A, B, c))
    hand = np.zeros((3, 2))
    for m in range(3):
        for n in range(2):
            hand[m, n] = sum(A[m, k] * B[k, n] for k in range(4)) * c[n]
    assert np.allclose(D, hand)


def test_untranslatable_tc_uses_the_halide_cpu_baseline(tmp_path, capsys):
    fn = tc.define((EXAMPLES / "conv.tc").read_text()).maxpool2x2.checked
    assert einsum_plan(fn)[0] is None  # max=! with a where clause
    src = tmp_path / "relu.tc"
    src.write_text("def relu(float(N) A) -> (B) { B(i) = fmax(A(i), 0.0) }\n")
    assert einsum_plan(tc.define(src.read_text()).relu.checked)[1] == \
        "B's right-hand side is not a product of tensor reads"
    assert main(["compare", str(src), "--sizes", "N=16", "--measure", "model", "--budget", "0",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert "baseline: Halide CPU (baseline)" in out
    assert "  yes  " in rows["Halide CPU (baseline)"] and "1x" in rows["Halide CPU (baseline)"]
    assert "the Halide CPU back end is the baseline: no einsum translation" in out
    assert "tuned" not in rows  # --budget 0 and nothing cached: no tuned row


def test_bad_sizes_and_functions_are_one_line_errors(tmp_path, capsys):
    assert main(["compare", TMM, "--sizes", "M=0", "--no-progress"]) == 2
    assert "M must be a positive integer, got '0'" in one_line_error(capsys)
    assert main(["tune", TMM, "--sizes", "Q=3", "--no-progress"]) == 2
    assert "'tmm' has no size or scalar named 'Q'" in one_line_error(capsys)
    assert main(["tune", TMM, "--fn", "tmn", "--no-progress"]) == 2
    assert "no TC function named 'tmn'; did you mean 'tmm'?" in one_line_error(capsys)
    assert main(["compare", str(EXAMPLES / "mlp.tc"), "--no-progress"]) == 2
    assert "defines several TC functions (MLP1, MLP3); choose one with --fn" in \
        one_line_error(capsys)
    assert main(["tune", TMM, "--budget", "0"]) == 2
    assert "expects an integer >= 1" in one_line_error(capsys)
    assert main(["compare", str(tmp_path / "missing.tc")]) == 1
    assert "No such file" in one_line_error(capsys)


@pytest.mark.slow  # (a tuning run)
def test_compare_keeps_measured_and_predicted_apart_and_tunes_unseeded(tmp_path, monkeypatch):
    # a manual line for these sizes in the working directory's schedules/: the tuned row must
    # not start from it (it is compared with it)
    manual = tc.MappingOptions().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2, 1)
    (tmp_path / "schedules").mkdir()
    (tmp_path / "schedules" / "mine.txt").write_text(f"mine | tmm.tc:tmm | M=8,K=4,N=4 | {manual}\n")
    monkeypatch.chdir(tmp_path)
    result = tc.compare((EXAMPLES / "tmm.tc").read_text(), "tmm", (8, 4), (4, 4),
                        tune_budget=6, measure="model", progress=False, filename="tmm.tc")
    assert not any(c.source.startswith("schedules") for c in result.tune.history)
    assert result.row("mine").kind == "manual"  # (the line is still a row of its own)
    measured, predicted = result.measured, result.predicted
    assert {r.kind for r in predicted} >= {"auto", "naive", "preset", "manual", "tuned"}
    assert {r.kind for r in measured} >= {"baseline", "cpu"}
    assert all(r.checked == "emulated" for r in predicted if r.correct)
    assert all(r.checked == "cpu" for r in measured)
    auto = result.row("auto (structural default)")
    assert auto.ratio == 1.0 and not auto.measured
    table = result.table()
    head, _, tail = table.partition("predicted by the cost model (H100), not measured")
    assert "measured:" in head and "time per call (" in head and "predicted" not in head
    assert "predicted time per call (us)" in tail and "vs auto" in tail


def test_tune_evaluates_a_file_of_candidates_exactly(tmp_path, capsys):
    listed = tmp_path / "configs.txt"
    listed.write_text("# two configurations to compare\n"
                      "MappingOptions().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2, 1)\n\n"
                      "MappingOptions().mapToThreads(8)  # one thread per row\n")
    assert main(["tune", TMM, "--sizes", SIZES, "--measure", "model", "--candidates",
                 str(listed), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "2 candidates: 2 evaluated" in out
    listed.write_text("MappingOptions().tile(4, 4).mapToThreads(\n")
    assert main(["tune", TMM, "--sizes", SIZES, "--measure", "model", "--candidates",
                 str(listed), "--no-progress"]) == 2
    assert f"--candidates {listed}:1: " in capsys.readouterr().err
