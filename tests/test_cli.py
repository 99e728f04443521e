"""`tcstage run` and `tcstage show`, driven through main() as a user would call them."""

from pathlib import Path

import pytest

from tcstage.cli import main

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_run_prints_shapes_and_times(capsys):
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M=16,K=8,N=12", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "output:  C(16, 12) float32" in out
    assert "run: median" in out


def test_run_every_example(capsys):
    for path in sorted(EXAMPLES.glob("*.tc")):
        sizes = "sh=2,sw=2,H=9,W=9,KH=3,KW=3,N=2,C=3,F=4" if "sconv" in path.name else \
            "N=2,G=2,F=3,C=2,H=6,W=6,KH=3,KW=3,B=2,IP=2,OP=3" if "conv" in path.name else "B=4"
        assert main(["run", str(path), "--sizes", sizes, "--repeat", "1"]) == 0, path
    assert "output:" in capsys.readouterr().out


def test_show_ranges_and_halide(capsys):
    assert main(["show", str(EXAMPLES / "conv.tc"), "--fn", "maxpool2x2", "--ranges",
                 "--halide", "--sizes", "B=1,C=2,H=9,W=8"]) == 0
    out = capsys.readouterr().out
    assert "0 <= i < H/2   = [0, 4)" in out
    assert "output out: shape (1, 2, 4, 4)" in out
    assert "Func out (output, float32)" in out


def test_errors_are_compiler_messages_not_tracebacks(tmp_path, capsys):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n  B(i) = A(i) + x(i)\n}\n")
    assert main(["run", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:2:17: error: unknown tensor or function 'x'")
    assert "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.tc")]) == 1
    assert "No such file" in capsys.readouterr().err
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M16"]) == 1
    assert "NAME=VALUE" in capsys.readouterr().err
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--fn", "nope"]) == 1
    assert "no TC function named 'nope'" in capsys.readouterr().err


def test_in_out_outputs_need_their_shape(tmp_path, capsys):
    src = tmp_path / "acc.tc"
    src.write_text("def acc(float(N) X) -> (Y) { Y(i) += X(i) }\n")
    assert main(["run", str(src)]) == 1
    assert "--sizes Y.0=..." in capsys.readouterr().err
    assert main(["run", str(src), "--sizes", "N=5,Y.0=5", "--repeat", "0"]) == 0


@pytest.mark.parametrize("argv", [["run"], ["frobnicate", "x.tc"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_show_schedule_and_cuda_for_options(capsys):
    options = "MappingOptions().tile(4, 4).mapToThreads(4, 2).mapToBlocks(2, 2)"
    assert main(["show", str(EXAMPLES / "tmm.tc"), "--schedule", "--cuda", "--options", options,
                 "--sizes", "M=8,K=4,N=8"]) == 0
    out = capsys.readouterr().out
    assert "schedule (isl scheduler, before tiling and mapping):" in out
    assert "mapped schedule:" in out and "grid (2, 2, 1)" in out
    assert "__global__" in out and options in out


def test_show_schedule_lists_promotion_decisions(capsys):
    options = ("MappingOptions().tile(4, 32).mapToThreads(32, 1).mapToBlocks(64, 128)"
               ".useSharedMemory(True).usePrivateMemory(True)")
    assert main(["show", str(EXAMPLES / "tmm.tc"), "--schedule", "--options", options,
                 "--sizes", "M=128,K=32,N=256"]) == 0
    out = capsys.readouterr().out
    assert "promotion: 4752 bytes of shared memory per block" in out
    assert "shared A: shared_A[4][33] float32, tile 4 x 32, 528 bytes; copy-in" in out
    # references as the TC writes them, not in Halide's names (A(m, C_r$x))
    assert "references S1: A(m, kk)" in out and "B(n, kk)" in out and "$" not in out
    assert "private C: private_C[4][1] float32, tile 4 x 1, 16 bytes per thread" in out
    assert "not promoted: shared C" in out and "coalesced" in out


def test_show_schedule_names_gathered_and_strided_tiles(capsys):
    """Two-stage promotion and a thread's strided register tile, as `show` prints them."""
    options = ("MappingOptions().tile(4, 32).mapToThreads(32, 4).mapToBlocks(32, 2)"
               ".usePrivateMemory(True).useSharedMemory(True)")
    assert main(["show", str(EXAMPLES / "lut.tc"), "--fn", "1LUT", "--schedule", "--options",
                 options, "--sizes", "E1=1000,D=64,B=128,L1=50"]) == 0
    out = capsys.readouterr().out
    assert "not promoted: shared LUT1 (LUT1(max(min(I1(i, k), 0 + E1 - 1), 0), j)): no element " \
        "is used twice in a block" in out
    options = ("MappingOptions().tile(32, 32, 8).mapToThreads(8, 8).mapToBlocks(2, 2)"
               ".useSharedMemory(True)"
               ".usePrivateMemory(True).useRegisterTiling(True).unroll(16)")
    assert main(["show", str(EXAMPLES / "tmm.tc"), "--schedule", "--options", options,
                 "--sizes", "M=64,K=64,N=64"]) == 0
    out = capsys.readouterr().out
    assert "private C: private_C[4][4] float32, tile 4 x 4 (strides 8 x 8), 64 bytes per " \
        "thread; copy-out" in out


def test_run_on_the_emulated_gpu_compares_with_the_cpu(capsys):
    assert main(["run", str(EXAMPLES / "mlp.tc"), "--fn", "MLP1", "--target", "cuda-emulated",
                 "--options", "mlp", "--sizes", "B=4,M=8,N=8", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "compiled to CUDA" in out and "max |cuda-emulated - cpu| = " in out
    diff = float(out.split("max |cuda-emulated - cpu| = ")[1].split()[0])
    assert diff < 1e-4


def test_bad_options_are_reported_with_a_caret(capsys):
    assert main(["show", str(EXAMPLES / "tmm.tc"), "--cuda", "--options",
                 "MappingOptions().mapToThreads(2048)"]) == 1
    err = capsys.readouterr().err
    assert "mapToThreads" in err and "^" in err
