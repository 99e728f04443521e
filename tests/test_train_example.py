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


@pytest.mark.slow  # (about 30 s: each rank and each backward compiles once)
def test_the_any_rank_example_trains_on_batches_and_runs_one_sequence():
    """examples/any_rank_torch.py: the rank-polymorphic layers of examples/any_rank.tc as
    PyTorch operators, trained on rank-3 batches, evaluated on a rank-2 sequence."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("any_rank_torch",
                                                  "examples/any_rank_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--steps", "60"]) < 0.3  # the test loss falls to under a third
