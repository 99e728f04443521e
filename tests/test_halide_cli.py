"""`tcstage run | show | tune` on a Python module that builds a Halide pipeline (the format of
examples/halide/): checked against numpy and against what the Python API gives."""

import textwrap

import numpy as np
import pytest

from tcstage.cli import main

MODULE = textwrap.dedent('''
    import halide as hl
    import numpy as np

    def build():
        inp = hl.ImageParam(hl.Int(32), 2, "inp")
        x, y = hl.Var("x"), hl.Var("y")
        edge = hl.BoundaryConditions.repeat_edge(inp)
        out = hl.Func("out")
        out[x, y] = edge[x - 1, y] + 2 * edge[x, y + 1]
        return [out]

    def inputs(rng, size="small"):
        return [np.arange(20, dtype=np.int32).reshape(4, 5) * (3 if size == "bench" else 1)]

    def output_shapes(args):
        return [args[0].shape]
''')


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "shift.py"
    path.write_text(MODULE)
    return str(path)


def expected(scale=1):
    a = np.arange(20).reshape(4, 5) * scale
    p = np.pad(a, 1, mode="edge")
    return p[1:-1, :-2] + 2 * p[2:, 1:-1]


@pytest.mark.parametrize("target", ["cpu", "cuda-emulated"])
def test_run(module, capsys, target):
    extra = ["--options", "MappingOptions().mapToThreads(5, 4)"] if target != "cpu" else []
    assert main(["run", module, "--target", target, *extra]) == 0
    out = capsys.readouterr().out
    assert "<Halide pipeline shift(int32(inp.0, inp.1) inp) -> (out)>" in out
    assert f"output:  (4, 5) int32  sum={expected().sum()}" in out
    if target != "cpu":
        assert "max |cuda-emulated - cpu| = 0" in out


def test_input_size(module, capsys):
    assert main(["run", module, "--input-size", "bench"]) == 0
    assert f"sum={expected(3).sum()}" in capsys.readouterr().out


def test_show(module, capsys):
    assert main(["show", module, "--halide", "--ranges", "--cuda"]) == 0
    out = capsys.readouterr().out
    assert "# ranges of shift\nout(y, x)\n    0 <= y < 4   = [0, 4)\n    0 <= x < 5   = [0, 5)" \
        in out
    assert "Func out (output, int32) over [0..4, 0..3]" in out
    assert "__global__" in out and "# CUDA of shift" in out


def test_mistakes(module, tmp_path, capsys):
    assert main(["run", module, "--sizes", "N=3"]) == 2
    assert "choose their size with --input-size" in capsys.readouterr().err
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    assert main(["show", str(other)]) == 2
    assert "defines no build, inputs, output_shapes" in capsys.readouterr().err


@pytest.mark.parametrize("schedule, says", [(None, "CPU schedule: Mullapudi2016 (planned for "
                                                   "inp.0=4, inp.1=5, out.0=4, out.1=5)"),
                                            ("root", "CPU schedule: root"),
                                            ("as_written", "CPU schedule: as_written")])
def test_run_schedule(module, capsys, schedule, says):
    extra = ["--schedule", schedule] if schedule else []
    assert main(["run", module, *extra]) == 0
    out = capsys.readouterr().out
    assert f"output:  (4, 5) int32  sum={expected().sum()}" in out
    assert says in out


def test_run_unknown_schedule(module, capsys):
    assert main(["run", module, "--schedule", "fast"]) == 2
    assert "for a Halide pipeline (.py): auto, as_written, root, tcstage or an " \
        "autoscheduler" in capsys.readouterr().err
