#!/usr/bin/env python3
"""A small sequence model whose layers are the rank-polymorphic TCs of examples/any_rank.tc,
trained with PyTorch on a toy task, then run on one sequence alone.

    python3 examples/any_rank_torch.py [--device cpu|cuda] [--steps 60]

Each token of a sequence of 6 is a vector of 8 numbers; the target of a token is the mean of
the sequence's first feature, a quantity only attention over the whole sequence can see. The
model: layer norm, scores = softmax(Q K^T) over the sequence, values mixed by the scores, a
linear map, all written once in TC for any number of leading dimensions. Training runs on
batches of sequences (rank-3 tensors), evaluation on a single sequence (rank 2): the same
operators serve both, each rank compiled once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (run as a script, this directory would come first on sys.path, and its halide/ would shadow
# the halide package)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402

import tcstage.torch as tct  # noqa: E402

LAYERS = (HERE / "any_rank.tc").read_text()
# the transpose of K for the scores: a rank-polymorphic TC of its own
TRANSPOSE = "def transpose(float(..., I, J) X) -> (Y) { Y(..., j, i) = X(..., i, j) }"


class Attention(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.layernorm = tct.op(LAYERS, "layernorm")
        self.softmax = tct.op(LAYERS, "softmax")
        self.matmul = tct.op(LAYERS, "batched_matmul")
        self.bias_add = tct.op(LAYERS, "bias_add")
        self.transpose = tct.op(TRANSPOSE, "transpose")
        self.g = torch.nn.Parameter(torch.ones(features))
        self.b = torch.nn.Parameter(torch.zeros(features))
        scale = features ** -0.5
        self.wq, self.wk, self.wv = (torch.nn.Parameter(torch.randn(features, features) * scale)
                                     for _ in range(3))
        self.out = torch.nn.Parameter(torch.randn(features, 1) * scale)
        self.out_bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):  # x: (..., tokens, features)
        h = self.layernorm(x, self.g, self.b)[-1]
        lead = h.shape[:-2]
        q, k, v = (self.matmul(h, w.expand(*lead, *w.shape)) for w in (self.wq, self.wk, self.wv))
        scores = self.softmax(self.matmul(q, self.transpose(k)))[-1]
        mixed = self.matmul(scores, v)
        out = self.matmul(mixed, self.out.expand(*lead, *self.out.shape).contiguous())
        return self.bias_add(out, self.out_bias)[..., 0]


def data(batch: int, tokens: int, features: int, generator: torch.Generator):
    x = torch.randn(batch, tokens, features, generator=generator)
    y = x[..., 0].mean(-1, keepdim=True).expand(batch, tokens)
    return x, y


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = Attention(8).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    x_test, y_test = (t.to(args.device) for t in data(256, 6, 8, generator))
    with torch.no_grad():
        first = torch.nn.functional.mse_loss(model(x_test), y_test).item()
    for step in range(args.steps):
        x, y = (t.to(args.device) for t in data(32, 6, 8, generator))
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x_test), y_test).item()
        one = model(x_test[0])  # a single sequence: rank 2, the same operators
    print(f"test loss {first:.4f} -> {final:.4f}; one sequence alone: output shape "
          f"{tuple(one.shape)}, matches its batched output: "
          f"{torch.allclose(one, model(x_test)[0], atol=1e-5)}")
    return final / first


if __name__ == "__main__":
    main()
