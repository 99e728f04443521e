"""examples/train_mlp.py: a model whose layers are TC operators learns, and varying batch sizes
stop compiling after the first epoch."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_training_loss_falls_and_compiling_stops():
    path = Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"
    spec = importlib.util.spec_from_file_location("train_mlp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--epochs", "3", "--samples", "600"])
    losses = result["losses"]
    assert losses[-1] < 0.3 * losses[0]
    assert result["accuracy"] > 0.9
    counts = result["compiled_after_epoch"]
    assert counts[0] == counts[-1]  # batches of 64 and of 24, and the evaluation of 600
