"""`tcstage run` and `tcstage show`, driven through main() as a user would call them."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc
from tcstage import cli
from tcstage.cli import main

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"


def one_line_error(capsys) -> str:
    """The error main() printed: exactly one line, `tcstage: error: ...`, nothing on stdout."""
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tcstage: error: "), captured.err
    return lines[0]


def test_run_prints_shapes_and_times(capsys):
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M=16,K=8,N=12", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "output:  C(16, 12) float32" in out
    assert "run: median" in out


EXAMPLE_SIZES = {"B": 2, "C": 3, "D": 4, "E1": 9, "E2": 7, "F": 4, "G": 2, "H": 9, "IP": 2,
                 "K": 5, "KH": 3, "KW": 3, "L1": 3, "L2": 2, "M": 6, "N": 2, "O": 3, "OP": 3,
                 "P": 4, "Q": 3, "W": 9, "sh": 2, "sw": 2}


def test_run_every_example(capsys):
    """Every function of every example, each given exactly the sizes it has."""
    ran = 0
    for path in sorted(EXAMPLES.glob("*.tc")):
        for name in tc.define(path.read_text()).names:
            f = tc.define(path.read_text())[name]
            run = "...=2x1," if isinstance(f, tc.PolymorphicFunction) else ""  # (any_rank.tc)
            fn = f.instance(2).checked if run else f.checked
            sizes = ",".join(f"{n}={EXAMPLE_SIZES.get(n, 2)}" for n in cli.size_names(fn)
                             if not (run and n in ("D0", "D1")))
            argv = ["run", str(path), "--fn", name, "--sizes", run + sizes, "--repeat", "0"]
            assert main(argv) == 0, (argv, capsys.readouterr().err)
            assert "defaults:" not in capsys.readouterr().out
            ran += 1
    assert ran == 26  # (layers.tc: softmax, layernorm, padconv; nn.tc: 6; any_rank.tc: 7 layers)


def test_run_warns_only_about_the_function_it_runs(capsys):
    """examples/lut.tc defines 2LUT and 1LUT, and each warns when defined that its table reads
    are unchecked: `run --fn 2LUT` printed 1LUT's warning as well, and `run` (the last
    function, 1LUT) 2LUT's two."""
    sizes = "E1=9,E2=7,D=4,B=2,L1=3,L2=2"
    assert main(["run", str(EXAMPLES / "lut.tc"), "--fn", "2LUT", "--sizes", sizes,
                 "--repeat", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: in '2LUT', the subscript") == 2 and "1LUT" not in err, err
    assert main(["run", str(EXAMPLES / "lut.tc"), "--sizes", "E1=9,D=4,B=2,L1=3",
                 "--repeat", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: in '1LUT', the subscript") == 1 and "2LUT" not in err, err


def test_show_ranges_and_halide(capsys):
    assert main(["show", str(EXAMPLES / "conv.tc"), "--fn", "maxpool2x2", "--ranges",
                 "--halide", "--sizes", "B=1,C=2,H=9,W=8"]) == 0
    out = capsys.readouterr().out
    assert "0 <= i < H/2   = [0, 4)" in out
    assert "output out: shape (1, 2, 4, 4)" in out
    assert "Func out (output, float32)" in out


def test_show_gradient_prints_a_backward_tc(capsys):
    assert main(["show", str(EXAMPLES / "tmm.tc"), "--gradient"]) == 0
    out = capsys.readouterr().out
    assert "d_A(m, kk) +=! d_C(m, n) * B(n, kk)" in out
    tc.define(out)  # a TC that tcstage accepts
    assert main(["show", str(EXAMPLES / "halide" / "blur.py"), "--gradient"]) == 2
    assert "not Halide pipelines" in capsys.readouterr().err


def test_errors_are_compiler_messages_not_tracebacks(tmp_path, capsys):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n  B(i) = A(i) + x(i)\n}\n")
    assert main(["run", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:2:17: error: unknown tensor or function 'x'")
    assert "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.tc")]) == 1
    assert "No such file" in one_line_error(capsys)
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M16"]) == 2
    assert "NAME=VALUE" in one_line_error(capsys)
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--fn", "TMM"]) == 2
    assert "no TC function named 'TMM'; did you mean 'tmm'?" in one_line_error(capsys)


def test_in_out_outputs_need_their_shape(tmp_path, capsys):
    src = tmp_path / "acc.tc"
    src.write_text("def acc(float(N) X) -> (Y) { Y(i) += X(i) }\n")
    assert main(["run", str(src)]) == 2
    assert "--sizes Y.0=..." in one_line_error(capsys)
    assert main(["run", str(src), "--sizes", "N=5,Y.0=5", "--repeat", "0"]) == 0


@pytest.mark.parametrize("argv", [["run"], ["frobnicate", "x.tc"], ["run", "x.tc", "--nope"]])
def test_usage_errors(argv, capsys):
    assert main(argv) == 2
    assert "see 'tcstage" in one_line_error(capsys)


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


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"tcstage {tc.__version__}\n"


@pytest.mark.parametrize("sizes, message", [
    ("m=8", "'tmm' has no size or scalar named 'm'; did you mean 'M'? (its sizes are M, K, N)"),
    ("M=8,Q=2", "'tmm' has no size or scalar named 'Q' (its sizes are M, K, N)"),
    ("M=-3", "M must be a positive integer, got '-3'"),
    ("K=0", "K must be a positive integer, got '0'"),
    ("N=2.5", "N must be a positive integer, got '2.5'"),
    ("N=", "NAME=VALUE pairs"),
    ("M=4,M=5", "gives M twice"),
])
def test_bad_sizes_are_named(sizes, message, capsys):
    """Misspelled sizes used to be ignored (the run used 32), bad values ended in tracebacks."""
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", sizes]) == 2
    assert message in one_line_error(capsys)


def test_scalar_inputs_take_values_of_their_type(tmp_path, capsys):
    src = tmp_path / "scale.tc"
    src.write_text("def scale(float(N) X, float a, int8 k) -> (Y) { Y(i) = X(i) * a + k }\n")
    for sizes, message in [("a=x", "scalar input a is float32, got 'x'"),
                           ("k=1.5", "scalar input k is int8, got '1.5'"),
                           ("k=300", "scalar input k is int8; 300 is out of its range")]:
        assert main(["run", str(src), "--sizes", sizes]) == 2
        assert message in one_line_error(capsys)
    assert main(["run", str(src), "--sizes", "N=3,a=-0.5,k=-2", "--repeat", "0"]) == 0
    assert "output:  Y(3,) float32" in capsys.readouterr().out


def test_sizes_beyond_the_machines_memory_are_refused_up_front(capsys):
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M=100000,K=100000,N=100000"]) == 2
    need = 2 * 100000 * 100000 * 4 / 2**30  # A and B, before any output is considered
    assert f"'tmm' would need {need:.3g} GiB of memory" in one_line_error(capsys)


def test_memory_estimate_counts_outputs_and_temporaries(tmp_path, monkeypatch, capsys):
    src = tmp_path / "outer.tc"
    src.write_text("def outer(float(I) A, float(J) B) -> (C) {\n"
                   "  T(i, j) = A(i) * B(j)\n  C(i, j) = T(i, j) + 1\n}\n")
    need = 4 * (64 + 32 + 64 * 32 + 64 * 32)  # A, B, the temporary T and the output C
    argv = ["run", str(src), "--sizes", "I=64,J=32", "--repeat", "0"]
    monkeypatch.setattr(cli, "available_memory", lambda: need - 1)
    assert main(argv) == 2
    assert f"would need {need / 2**30:.3g} GiB" in one_line_error(capsys)
    monkeypatch.setattr(cli, "available_memory", lambda: 3 * need - 1)  # emulation copies them
    assert main([*argv, "--target", "cuda-emulated"]) == 2
    assert "under emulation" in one_line_error(capsys)
    monkeypatch.setattr(cli, "available_memory", lambda: need)
    assert main(argv) == 0


def test_random_inputs_are_drawn_in_their_own_type():
    """No float64 array twice the input's size is made first (it doubled peak memory)."""
    fn = tc.define("def f(float(M,K) A, float16(K) H, int(K) I, bool(K) F) -> (C) "
                   "{ C(m) +=! A(m,k) * H(k) * I(k) * F(k) }").f.checked
    sizes = {"M": 512, "K": 512}
    tracemalloc.start()
    try:
        args, outs = cli.random_inputs(fn, sizes, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [a.dtype for a in args] == [np.float32, np.float16, np.int32, np.bool_] and outs == []
    assert peak < 1.25 * sum(a.nbytes for a in args)


@pytest.mark.parametrize("argv, message", [
    (["run", "tmm.tc", "--options", "mlp"], "--options maps the CUDA kernel and has no effect "
                                            "with --target cpu"),
    (["run", "tmm.tc", "--target", "cuda-emulated", "--schedule", "Adams2019"],
     "--schedule chooses the CPU autoscheduler and has no effect with --target cuda-emulated"),
    (["show", "tmm.tc", "--ranges", "--options", "mlp"], "only --schedule and --cuda show"),
    (["run", "tmm.tc", "--repeat", "-1"], "argument --repeat: expects an integer >= 0, got '-1'"),
    (["run", "tmm.tc", "--seed", "-4"], "argument --seed: expects an integer >= 0, got '-4'"),
    (["run", "tmm.tc", "--schedule", "fastest"], "unknown CPU schedule 'fastest'"),
])
def test_flags_that_cannot_take_effect_are_errors(argv, message, monkeypatch, capsys):
    monkeypatch.chdir(EXAMPLES)
    assert main(argv) == 2
    assert message in one_line_error(capsys)


def test_unreadable_files_are_one_line_errors(tmp_path, capsys):
    binary = tmp_path / "latin1.tc"
    binary.write_bytes(b"# caf\xe9\ndef f(float(N) A) -> (B) { B(i) = A(i) }\n")
    assert main(["run", str(binary)]) == 1
    assert "is not UTF-8 text (byte 0xe9 at offset 5)" in one_line_error(capsys)
    assert main(["run", str(tmp_path)]) == 1
    assert "Is a directory" in one_line_error(capsys)


def test_internal_errors_are_one_line(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("boom\non two lines")
    monkeypatch.setattr(cli, "random_inputs", broken)
    monkeypatch.delenv("TCSTAGE_TRACEBACK", raising=False)
    assert main(["run", str(EXAMPLES / "tmm.tc"), "--sizes", "M=2,K=2,N=2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tcstage: internal error: RuntimeError: boom on two lines (a bug")
    assert err.count("\n") == 1
