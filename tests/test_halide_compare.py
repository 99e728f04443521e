"""tc.compare and `tcstage compare` on a Halide pipeline: its CUDA kernels, its CPU schedules and
your own Halide schedule as the baseline, every row checked against the pipeline computed with
every intermediate at the root, which is checked here against numpy."""

import halide as hl
import numpy as np
import pytest

import tcstage as tc
from tcstage.cli import main

from test_halide_cli import MODULE  # tests/: a small pipeline module

x, y = hl.Var("x"), hl.Var("y")


def scaled_matmul(schedule=False):
    """out = s * A @ B, with a register-blocked schedule of the caller's when asked."""
    a, b = hl.ImageParam(hl.Float(32), 2, "A"), hl.ImageParam(hl.Float(32), 2, "B")
    s = hl.Param(hl.Float(32), "s")
    k = hl.RDom([(0, a.width())])
    prod, out = hl.Func("prod"), hl.Func("out")
    prod[x, y] = 0.0
    prod[x, y] += a[k, y] * b[x, k]
    out[x, y] = s * prod[x, y]
    if schedule:
        out.vectorize(x, 8).parallel(y)
        prod.compute_at(out, y).vectorize(x, 8)
    return tc.from_halide(out, name="mm")


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((12, 20)).astype(np.float32),
            rng.standard_normal((20, 24)).astype(np.float32), np.float32(0.5))


def test_compare_pipeline_with_your_schedule_as_baseline(operands):
    a, b, s = operands
    f = scaled_matmul()
    # The reference every row is checked against, itself checked against numpy.
    np.testing.assert_allclose(f(a, b, s, output_shape=(12, 24), schedule="root"),
                               s * (a.astype(np.float64) @ b), rtol=1e-5, atol=1e-5)
    result = tc.compare(f, a, b, s, output_shape=(12, 24), manual=scaled_matmul(schedule=True),
                        options=["MappingOptions().tile(4, 8).mapToThreads(8, 4)"],
                        tune_budget=0, progress=False, cache=False)
    assert result.baseline == "Halide CPU, your schedule (baseline)"
    names = [r.name for r in result.rows]
    for name in ["single thread", "manual 1", "Halide CPU, your schedule (baseline)",
                 "CPU tcstage schedule", "Halide CPU Mullapudi2016",
                 "CPU every intermediate at the root"]:
        assert name in names
    assert all(r.correct for r in result.rows), result.table()
    assert result.row("Halide CPU, your schedule (baseline)").ratio == 1.0
    assert "mm (A.0=12, A.1=20, B.0=20, B.1=24" in result.table()


@pytest.mark.slow  # (5 s cold; the CLI test below covers the same baseline)
def test_compare_pipeline_without_a_schedule_uses_the_default(operands):
    a, b, s = operands
    result = tc.compare(scaled_matmul(), a, b, s, output_shape=(12, 24), tune_budget=0,
                        progress=False, cache=False)
    base = result.row("CPU tcstage default (baseline)")
    assert base.correct and base.detail == "ran tcstage"


def test_compare_manual_mistakes(operands):
    a, b, s = operands
    other = hl.Func("other")
    img = hl.ImageParam(hl.Float(32), 2, "A")
    other[x, y] = img[x, y]
    with pytest.raises(tc.TCError, match="manual= is not the same pipeline as 'mm': it takes "
                                         r"\(float32\(A.0, A.1\) A\) with 1 output"):
        tc.compare(scaled_matmul(), a, b, s, output_shape=(12, 24), tune_budget=0,
                   progress=False, manual=tc.from_halide(other))
    with pytest.raises(tc.TCError, match="manual= is a Halide pipeline with your own schedule"):
        tc.compare("def f(float(N) A) -> (B) { B(i) = A(i) }", "f", np.ones(4, np.float32),
                   manual=scaled_matmul(), tune_budget=0, progress=False)


@pytest.mark.parametrize("with_schedule", [False, True])
def test_cli_compare_module(tmp_path, capsys, with_schedule):
    text = MODULE + ("\ndef schedule_cpu(app):\n    app[0].vectorize(app[0].args()[0], 4)\n"
                     if with_schedule else "")
    path = tmp_path / "shift.py"
    path.write_text(text)
    assert main(["compare", str(path), "--budget", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    base = "Halide CPU, your schedule (baseline)" if with_schedule else \
        "CPU tcstage default (baseline)"
    assert f"baseline: {base}" in out
    assert "CPU every intermediate at the root" in out and "WRONG" not in out
