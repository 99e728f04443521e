"""What a lent GPU runs, checked without one: the kernels scripts/gpu_examples.py launches (under
compute-sanitizer) run correctly under emulation; benchmarks/gpu_check.sh's CPU-side mode works
and says the GPU part is unmeasured; gpu_bench.py judges the goals; `pytest --real-gpu` compares
and hands over the GPU's values (with a stand-in for the GPU), and skips, saying why, where
there is no GPU."""

import os
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc
from tcstage.cuda import emulate as emu

import real_gpu  # tests/

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_examples.py"


@pytest.mark.slow  # (12 s cold)
def test_gpu_examples_pass_under_emulation(capsys):
    module = runpy.run_path(str(SCRIPT), run_name="gpu_examples")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        assert module["main"](["--target", "cuda-emulated"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 16 and "WRONG" not in out and "FAILED" not in out, out


@pytest.mark.slow  # (8 s cold)
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="gpu_check.sh needs bash and coreutils' timeout")
def test_gpu_check_cpu_side_mode_runs_and_says_the_gpu_part_is_unmeasured(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_CPU": "1", "GPU_CHECK_QUICK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    results = list(tmp_path.glob("gpu-check-no-GPU-*.md"))
    assert r.returncode == 0 and len(results) == 1, r.stdout + r.stderr
    text = results[0].read_text()
    assert "GPU part is unmeasured" in text
    steps = dict(re.findall(r"^\| ([\w-]+) \| (pass|fail|timeout|skipped) \|", text, re.M))
    assert steps == {"build": "pass", "emulated-tests": "pass", "examples-emulated": "pass",
                     "examples-nvcc": "pass", "bench-compile": "pass"}, text
    assert re.search(r"^\| row_sum \| issue 15 \| [\d.]+ \| \(32, ", text, re.M), text
    assert "passed" in (tmp_path / "emulated-tests.log").read_text()


def test_gpu_bench_picks_the_hbm_peak_by_name_and_judges_the_goals():
    bench = runpy.run_path(str(ROOT / "benchmarks" / "gpu_bench.py"), run_name="gpu_bench")
    hbm = bench["hbm_peak"]
    sxm = hbm("NVIDIA H100 80GB HBM3")
    assert sxm[0] == 3.35e12 and "H100 SXM" in sxm[1]
    assert hbm("NVIDIA H100 PCIe")[0] == 2.0e12 and hbm("NVIDIA H200")[0] == 4.8e12
    row_sum = next(b for b in bench["issue15_benches"]() if b.name == "row_sum")
    moved = {"bytes": 32 * 2**20 * 4 + 32 * 4}

    def line(mine_us, theirs_us, **kw):
        row = bench["Row"](row_sum, (mine_us,) * 5, (theirs_us,) * 5, peak=3.35e12, **kw)
        return bench["issue15_line"](row, moved)
    # 134 MB in 50 us: 2.68 TB/s, 80% of 3.35; faster than torch.sum
    assert "| 2684 GB/s (80% of HBM) |" in line(50.0, 55.0) and "| met |" in line(50.0, 55.0)
    assert "| not met |" in line(50.0, 45.0)  # bandwidth enough, slower than torch.sum
    assert "| not met |" in line(60.0, 70.0)  # faster than torch.sum, 67% of HBM
    assert "| not met (wrong result) |" in line(50.0, 55.0, wrong="max error 3")
    failed = bench["issue15_line"](bench["Row"](row_sum, failed="TCError: no"), {})
    assert "| not met (failed) | FAILED: TCError: no |" in failed
    bf16 = bench["BF16_GOAL"]
    assert bf16.met(1.9, None) and not bf16.met(2.1, None)


# -- --real-gpu, with a stand-in for the GPU ----------------------------------------------------

ADD = "def add(float(N) A, float(N) B) -> (C) {\n  C(i) = A(i) + B(i)\n}"


def _add_kernel():
    return tc.compile(ADD, "add", (300,), (300,), options=tc.MappingOptions().tile(64)
                      .mapToThreads(64).mapToBlocks(5), target="cuda-emulated")


@pytest.fixture
def twin_with(request):
    """A Twin installed around the emulator with a given stand-in launcher, removed after."""
    twins = []

    def install(launch):
        twin = real_gpu.Twin(launch)
        twin.install()
        twins.append(twin)
        return twin
    yield install
    for twin in twins:
        twin.uninstall()


def _stand_in(shift: float = 0.0, at: int | None = None, seen: list | None = None):
    """A 'GPU' computing C = A + B from the arguments it is given (numpy), off by `shift` at
    `at` (everywhere if None)."""
    def launch(source, name, grid, block, params, args):
        by_name = {p.name: a for p, a in zip(params, args)}
        if seen is not None:
            seen.append((name, grid, block, source))
        c = by_name["A"] + by_name["B"]
        if at is None:
            c = c + np.float32(shift)
        else:
            c[at] += np.float32(shift)
        return {next(i for i, p in enumerate(params) if p.name == "C"): c}
    return launch


def test_real_gpu_twin_compares_and_hands_over_the_gpus_values(twin_with):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    seen = []
    twin = twin_with(_stand_in(shift=1e-6, seen=seen))  # within float32's tolerance
    k = _add_kernel()
    c = k(a, b)
    np.testing.assert_array_equal(c, (a + b) + np.float32(1e-6))  # the 'GPU's values, not ours
    (name, grid, block, source), = seen
    assert (name, grid, block, source) == (k.name, k.grid, k.block, k.cuda_source)
    compared, kernels, not_compared = twin.take()
    assert (compared, len(kernels), not_compared) == (1, 1, ())
    assert twin.take()[0] == 0  # taken: the next test starts from zero


def test_real_gpu_twin_fails_on_a_difference_naming_kernel_argument_and_element(twin_with):
    a, b = np.ones(300, np.float32), np.full(300, 2, np.float32)
    twin_with(_stand_in(shift=0.5, at=123))
    with pytest.raises(AssertionError, match=r"kernel 'tc_add.*argument 'C'.*flat index 123.*"
                                             r"3\.5.*3\.0.*1 of 300 elements differ"):
        _add_kernel()(a, b)


def test_real_gpu_twin_counts_launches_it_cannot_compare(twin_with):
    twin = twin_with(_stand_in(shift=100.0))  # would fail if it were compared
    k = _add_kernel()
    a, b = np.ones(300, np.float32), np.ones(300, np.float32)
    c = np.zeros(300, np.float32)
    arrays = {"C": c, "A": a, "B": b}  # (other parameters are sizes: N)
    args = [arrays.get(p.name, 300) for p in emu.parse_kernels(k.cuda_source)[k.name].params]
    emu.emulate(k.cuda_source, k.name, k.grid, k.block, args, check_races=False)
    np.testing.assert_array_equal(c, 2)  # the emulator's values stay
    compared, _, not_compared = twin.take()
    assert compared == 0 and [n for _, n in not_compared] == [1]
    assert "check_races=False" in not_compared[0][0]


def test_real_gpu_tolerances_follow_the_dtype():
    e = np.array([1.0, 2.0, np.nan, -4.0], np.float32)
    assert real_gpu.first_mismatch(e + np.float32(1e-5), e) is None
    assert "index 1" in real_gpu.first_mismatch(e + np.array([0, 1e-2, 0, 0], np.float32), e)
    assert real_gpu.first_mismatch(np.array([1, 2], np.int32), np.array([1, 2], np.int32)) is None
    assert "must be equal" in real_gpu.first_mismatch(np.array([1, 3]), np.array([1, 2]))
    h = np.array([100.0, -3.0], np.float16)
    assert real_gpu.first_mismatch((h.astype(np.float32) + 0.5).astype(np.float16), h) is None
    assert real_gpu.first_mismatch((h.astype(np.float32) + 5).astype(np.float16), h)
    bf = np.array([1.0, 256.0], ml_dtypes.bfloat16)
    assert real_gpu.first_mismatch(bf.copy(), bf) is None
    assert "index 1" in real_gpu.first_mismatch(np.array([1.0, 300.0], ml_dtypes.bfloat16), bf)


def test_real_gpu_without_a_gpu_skips_every_test_saying_why():
    if real_gpu.gpu_problem() is None:
        pytest.skip("a GPU is present: --real-gpu runs for real here")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "--real-gpu", "tests/test_emulation.py", "-k", "matmul and not race"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"SKIPPED \[\d+\] .*--real-gpu needs a GPU: ", r.stdout), r.stdout
    assert "passed" not in r.stdout and "--real-gpu: every test skipped, no GPU" in r.stdout


def test_real_gpu_twin_launches_each_kernel_of_a_sequence(twin_with):
    """A kernel sequence (docs/cuda.md) reaches the GPU launch by launch, each by its own name,
    grid and block, in order, the second reading what the first left (issue 26, part 5)."""
    src = ("def f(float(N) A) -> (B, C) {\n  B(i) = A(i) + A(i + 1)\n"
           "  C(i) = B(i) + B(i + 1)\n}")
    stages = {"B": lambda x: x[:-1] + x[1:], "C": lambda x: x[:-1] + x[1:]}
    seen = []

    def launch(source, name, grid, block, params, args):  # a 'GPU' computing each stage
        seen.append((name, grid, block))
        by_name = {p.name: a for p, a in zip(params, args)}
        written = "B" if name.endswith("_0") else "C"  # (tc_f_0 writes B, tc_f_1 C)
        value = stages[written](by_name["A" if written == "B" else "B"])
        return {next(i for i, p in enumerate(params) if p.name == written): value}
    twin = twin_with(launch)
    a = np.random.default_rng(1).standard_normal(258).astype(np.float32)
    k = tc.compile(src, "f", a, options=tc.MappingOptions().tile(32).mapToThreads(32)
                   .mapToBlocks(8), target="cuda-emulated")
    assert len(k.launches) == 2
    b, c = k(a)
    np.testing.assert_allclose(c, (a[:-2] + a[1:-1]) + (a[1:-1] + a[2:]), rtol=1e-6)
    assert seen == [(launch.name, launch.grid, launch.block) for launch in k.launches]
    assert twin.take()[0] == 2


def test_gpu_bench_keeps_the_long_halide_apps_for_their_own_stage(capsys):
    """bilateral_grid, local_laplacian and interpolate take minutes to compile: the default run
    leaves them out, `--only` may name them, `--halide-long` takes them alone; an app without
    GPU_OPTIONS (local_laplacian) is timed under auto only."""
    bench = runpy.run_path(str(ROOT / "benchmarks" / "gpu_bench.py"), run_name="gpu_bench")
    assert not set(bench["HALIDE_LONG"]) & set(bench["HALIDE_APPS"])
    chosen = []
    bench["main"].__globals__["compile_only"] = lambda benches, out, apps: \
        chosen.append(([b.name for b in benches], apps)) or 0
    main = bench["main"]
    assert main(["--compile-only", "--halide-long"]) == 0
    assert main(["--compile-only", "--only", "tmm-small,halide/interpolate,halide/blur"]) == 0
    assert main(["--compile-only"]) == 0
    assert chosen[0] == ([], ["halide/bilateral_grid", "halide/local_laplacian",
                              "halide/interpolate"])
    assert chosen[1] == (["tmm-small"], ["halide/blur", "halide/interpolate"])
    assert not any(a in chosen[2][1] for a in chosen[0][1]) and "halide/blur" in chosen[2][1]
    with pytest.raises(SystemExit):
        main(["--compile-only", "--halide-long", "--only", "halide/blur"])
    assert "unknown case(s) halide/blur" in capsys.readouterr().err
    sys.path.insert(0, str(ROOT))
    from examples.halide import bilateral_grid, local_laplacian
    assert [label for label, _ in bench["_option_sets"](local_laplacian)] == ["auto"]
    assert [label for label, _ in bench["_option_sets"](bilateral_grid)] == \
        ["auto", "documented"]
