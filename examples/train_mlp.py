#!/usr/bin/env python3
"""Trains a small classifier whose layers are TC operators, on synthetic data.

    python3 examples/train_mlp.py [--device cpu|cuda] [--epochs 15] [--batch 64]

Three layers written in TC (two fully connected layers with relu, the paper's MLP1, and a
linear output layer) become PyTorch operators with `tcstage.torch.op`; their gradients come
from the backward TCs tcstage generates (`tc.gradient`). The data are three Gaussian clusters
in 8 dimensions; 1000 samples in batches of 64 make the last batch of each epoch smaller, and
the evaluation runs on all samples at once, so the operators see several batch sizes: the CPU
path compiles each TC once for all of them, plus once for a batch smaller than the first (the
count is printed after each epoch: it stops growing after the first). On a machine
with a GPU, `--device cuda` runs the same script with CUDA kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, this directory comes first on sys.path, and its halide/ (the ported Halide
# apps) would shadow the halide package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402

import tcstage.torch as tct  # noqa: E402

LINEAR = """
def linear(float(B,M) I, float(N,M) W, float(N) Bias) -> (O) {
  O(b,n) = Bias(n)
  O(b,n) += I(b,m) * W(n,m)
}
"""


class TCMLP(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        fc_relu = tct.op((HERE / "mlp.tc").read_text(), "MLP1")
        self.layers = [fc_relu, fc_relu, tct.op(LINEAR, "linear")]
        sizes = [features, hidden, hidden, classes]
        self.weights = torch.nn.ParameterList()
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            bound = fan_in ** -0.5
            self.weights.append(torch.nn.Parameter(torch.empty(fan_out, fan_in).uniform_(-bound, bound)))
            self.weights.append(torch.nn.Parameter(torch.zeros(fan_out)))

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            x = layer(x, self.weights[2 * k], self.weights[2 * k + 1])
        return x

    @property
    def compile_count(self) -> int:
        return sum(layer.compile_count for layer in set(self.layers))


def clusters(samples: int, features: int, classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centres = 1.2 * torch.randn(classes, features, generator=g)
    labels = torch.randint(0, classes, (samples,), generator=g)
    points = centres[labels] + torch.randn(samples, features, generator=g)
    return points, labels


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1000)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    x, y = clusters(a.samples, 8, 3)
    x, y = x.to(a.device), y.to(a.device)
    model = TCMLP(8, 32, 3).to(a.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y).item()
            return loss, (logits.argmax(1) == y).float().mean().item()

    loss, accuracy = evaluate()
    print(f"before training  loss {loss:.4f}  accuracy {accuracy:.3f}")
    history, compiled = [loss], []
    for epoch in range(a.epochs):
        order = torch.randperm(a.samples, device=a.device)
        for start in range(0, a.samples, a.batch):
            batch = order[start:start + a.batch]
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        loss, accuracy = evaluate()
        history.append(loss)
        compiled.append(model.compile_count)
        print(f"epoch {epoch + 1:3d}  loss {loss:.4f}  accuracy {accuracy:.3f}  "
              f"compiled so far {compiled[-1]}")
    print(f"compilations of the TC operators (forward and backward, all batch sizes): "
          f"{model.compile_count}")
    return {"losses": history, "accuracy": accuracy, "compiled_after_epoch": compiled}


if __name__ == "__main__":
    main()
