"""The kernels scripts/gpu_examples.py launches on a lent GPU (under compute-sanitizer) run
correctly under emulation, so the script is known to work before GPU time is spent on it."""

import runpy
import warnings
from pathlib import Path

import tcstage as tc

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_examples.py"


def test_gpu_examples_pass_under_emulation(capsys):
    module = runpy.run_path(str(SCRIPT), run_name="gpu_examples")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        assert module["main"](["--target", "cuda-emulated"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 8 and "WRONG" not in out, out
