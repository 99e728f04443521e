#!/usr/bin/env python3
"""Benchmark (not a test): TC layers as PyTorch operators against the same PyTorch layers.

    python3 benchmarks/torch_bench.py [--device cpu|cuda] [--layers tmm,MLP1] [--runs 7]
                                      [--first-call conv_s2,groupnorm] [--threads 1]
                                      [--no-write]

For each layer, in one process: forward time and forward+backward time (the best of --runs
after two warm-up calls, the two sides called in turn in every run) of the tcstage operator
(`tcstage.torch.op`, backward = the generated backward TC) and of the same layer written with PyTorch's own operators, on the same inputs;
ratio = tcstage / PyTorch (above 1: tcstage is slower). Outputs and gradients of the two are
compared first; a mismatch is reported instead of a time. The layers after the paper's are
those of issue 29's table, at its sizes (examples/nn.tc, examples/layers.tc).

Then a loop over varying batch sizes (an epoch's last batch, train vs eval) counts the
recompilations after the first call (goal: 0), and the first forward+backward call of the
--first-call layers is timed in new processes: with an empty kernel cache (everything
compiled, the shared runtime library too), with a cache holding only that runtime (a layer new
to the machine), and again with the cache the first left (what a second process or a
restarted training run pays).

Results go to benchmarks/results/torch-<device>-<machine>[-<n>-threads]-<date>.md unless
--no-write.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tcstage.torch as tct  # noqa: E402


def example(name: str) -> str:
    return (ROOT / "examples" / f"{name}.tc").read_text()


def embedding_bag(table, index):
    return F.embedding(index.long(), table).sum(1)


def embedding_bag_mean(table, index):
    return F.embedding_bag(index.long(), table, mode="mean")


def gelu(x):
    return F.gelu(x, approximate="tanh")


def _threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread{'s' * (n != 1)}"


def group_norm(x, gamma, beta):  # x (N, G, D, H, W): PyTorch's layout is (N, G*D, H, W)
    n, g, d, h, w = x.shape
    return F.group_norm(x.reshape(n, g * d, h, w), g, gamma.reshape(-1), beta.reshape(-1),
                        eps=1e-5).reshape(x.shape)


# name -> (TC source, function, input maker(device), PyTorch reference)
LAYERS = {
    "tmm": (example("tmm"), "tmm", lambda: (r(128, 256), r(256, 256)),
            lambda a, b: a @ b.T),
    "tbmm": (example("tbmm"), "tbmm", lambda: (r(128, 26, 72), r(128, 26, 72)),
             lambda x, y: torch.bmm(x, y.transpose(1, 2))),
    "MLP1": (example("mlp"), "MLP1", lambda: (r(128, 256), r(256, 256), r(256)),
             lambda i, w, b: torch.relu(F.linear(i, w, b))),
    "layernorm": (example("layers"), "layernorm", lambda: (r(256, 512), r(512), r(512)),
                  lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, eps=1e-5)),
    "softmax": (example("layers"), "softmax", lambda: (r(256, 512),), lambda x: torch.softmax(x, 1)),
    "conv2d": (example("conv"), "conv2d", lambda: (r(8, 16, 32, 32), r(16, 16, 3, 3)),
               lambda x, w: F.conv2d(x, w)),
    "maxpool": (example("conv"), "maxpool2x2", lambda: (r(8, 16, 32, 32),),
                lambda x: F.max_pool2d(x, 2)),
    "1LUT": (example("lut"), "1LUT", lambda: (r(1000, 64), idx(1000, 128, 20)),
             embedding_bag),
    # issue 29's table, at its sizes
    "conv_s2": (example("nn"), "conv_s2", lambda: (r(32, 32, 32, 32), r(64, 32, 3, 3)),
                lambda x, w: F.conv2d(x, w, stride=2, padding=1)),
    "padconv": (example("layers"), "padconv", lambda: (r(32, 32, 32, 32), r(32, 32, 3, 3)),
                lambda x, w: F.conv2d(x, w, padding=1)),
    "groupnorm": (example("nn"), "groupnorm",
                  lambda: (r(32, 8, 8, 16, 16), r(8, 8), r(8, 8)), group_norm),
    "gelu": (example("nn"), "gelu", lambda: (r(512, 1024),), gelu),
    "softmax-512": (example("layers"), "softmax", lambda: (r(512, 1024),),
                    lambda x: torch.softmax(x, 1)),
    "logsoftmax": (example("nn"), "logsoftmax", lambda: (r(512, 1024),),
                   lambda x: torch.log_softmax(x, 1)),
    "layernorm-512": (example("layers"), "layernorm", lambda: (r(512, 1024), r(1024), r(1024)),
                      lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, eps=1e-5)),
    "cross_entropy": (example("nn"), "cross_entropy", lambda: (r(512, 1000), idx(1000, 512)),
                      lambda x, label: F.cross_entropy(x, label.long())),
    "embedding_bag": (example("nn"), "embedding_bag_mean",
                      lambda: (r(10000, 64), idx(10000, 256, 50)), embedding_bag_mean),
}
DEVICE = "cpu"


def r(*shape):
    return torch.randn(*shape, device=DEVICE, requires_grad=True)


def idx(rows, *shape):
    return torch.randint(0, rows, shape, dtype=torch.int32, device=DEVICE)


def forward_backward(fn, args, grad_out):
    outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    wants = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return outs, torch.autograd.grad(outs, wants, grad_out)


def forward(fn, args, _grad_out):
    with torch.no_grad():
        return fn(*args)


def timed(call, fns, args, grad_out, runs: int) -> list[tuple[float, float]]:
    """(best, median) seconds of each of `fns`, called in turn within every run: on a shared
    machine a burst of other work then slows both sides of a comparison, not one. The best is
    the figure compared (other work only ever adds time); the median shows how noisy it was."""
    for _ in range(2):
        for fn in fns:
            call(fn, args, grad_out)
    times = [[] for _ in fns]
    for _ in range(runs):
        for fn, spent in zip(fns, times):
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(fn, args, grad_out)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            spent.append(time.perf_counter() - t0)
    return [(min(spent), statistics.median(spent)) for spent in times]


def bench_layer(name: str, runs: int) -> dict:
    src, fn_name, make, reference = LAYERS[name]
    torch.manual_seed(0)
    args = make()
    layer = tct.op(src, fn_name)
    grad_out = _random_like_output(reference, args)
    outs, grads = forward_backward(layer, args, grad_out)
    ref_outs, ref_grads = forward_backward(reference, args, grad_out)
    for a, b in zip((*outs, *grads), (*ref_outs, *ref_grads)):
        # (absolute error scaled by the largest value: a weight gradient sums 32768 terms of
        # up to 750, and float32 leaves a few thousandths on its elements near zero)
        scale = float(b.detach().abs().max()) if b.numel() else 0.0
        if not torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3 + 1e-4 * scale):
            return {"layer": name, "error": "differs from PyTorch"}
    row = {"layer": name, "shapes": ", ".join("x".join(map(str, a.shape)) for a in args)}
    for what, call in (("fwd", forward), ("fwdbwd", forward_backward)):
        (t_tc, med_tc), (t_torch, med_torch) = timed(call, (layer, reference), args,
                                                     grad_out, runs)
        row.update({f"{what}_tcstage_ms": 1e3 * t_tc, f"{what}_torch_ms": 1e3 * t_torch,
                    f"{what}_ratio": t_tc / t_torch, f"{what}_median_ratio": med_tc / med_torch})
    return row


FIRST_CALL = """
import sys, time
import torch
t0 = time.perf_counter()
sys.path.insert(0, {bench!r})
import torch_bench as b
args = b.LAYERS[{name!r}][2]()
layer = b.tct.op(*b.LAYERS[{name!r}][:2])
t1 = time.perf_counter()
out = layer(*args)
(out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
print(time.perf_counter() - t1, t1 - t0)
"""


RUNTIME_ONLY = """
import numpy as np, tcstage as tc
x = np.ones(4, np.float32)
tc.define("def add(float(N) a, float(N) b) -> (c) { c(i) = a(i) + b(i) }").add(x, x)
"""


def first_call(name: str) -> dict:
    """Seconds of the first forward+backward call of `name` in a new process: with an empty
    kernel cache (the shared runtime library compiled too, once per machine), with a cache
    holding only that runtime (a layer new to the machine), then in another process with the
    cache the first left."""
    import shutil
    import tempfile
    row = {"layer": name}
    script = FIRST_CALL.format(bench=str(ROOT / "benchmarks"), name=name)
    empty, runtime_only = (tempfile.mkdtemp(prefix="tcstage-first-call-") for _ in range(2))
    try:
        subprocess.run([sys.executable, "-c", RUNTIME_ONLY], check=True, capture_output=True,
                       env=dict(os.environ, TCSTAGE_CACHE_DIR=runtime_only))
        # (the warm call reads the cache the call before it left)
        for what, cache in (("cold", empty), ("new", runtime_only), ("warm", runtime_only)):
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                 env=dict(os.environ, TCSTAGE_CACHE_DIR=cache),
                                 check=True).stdout.split()
            row[f"{what}_s"], row["import_s"] = float(out[-2]), float(out[-1])
    finally:
        for cache in (empty, runtime_only):
            shutil.rmtree(cache, ignore_errors=True)
    return row


def _random_like_output(reference, args):
    with torch.no_grad():
        out = reference(*args)
    return tuple(map(torch.randn_like, out)) if isinstance(out, tuple) else torch.randn_like(out)


def recompilations(batches=(64, 64, 64, 37, 128, 64, 1, 37)) -> dict:
    """Compilations of the forward and backward TCs over a loop of varying batch sizes."""
    layer = tct.op(example("mlp"), "MLP1")
    torch.manual_seed(0)
    w, b = r(64, 32), r(64)
    first = None
    for n, batch in enumerate(batches):
        y = layer(r(batch, 32), w, b)
        y.sum().backward()
        count = layer.compile_count
        if n == 0:
            first = count
    return {"batches": list(batches), "after_first": first, "total": count,
            "recompilations": count - first}


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except Exception:  # noqa: BLE001 - a description only
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


ADD = "def add(float(N) X, float(N) Y) -> (O) { O(i) = X(i) + Y(i) }"


def per_call_us(f, calls: int = 20000, rounds: int = 5) -> float:
    """The best of `rounds` mean times of `calls` calls, in microseconds."""
    for _ in range(200):
        f()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def overhead() -> list[tuple[str, float]]:
    """Per-call cost of a 4-element add, where the kernel is nothing: what a call costs above
    its kernel, through each layer, against PyTorch's and numpy's own add and an empty
    custom operator (the dispatcher's floor)."""
    import tcstage as tc

    @torch.library.custom_op("tcstage_bench::empty", mutates_args=())
    def empty(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)
    empty.register_fake(lambda x, y: torch.empty_like(x))
    empty.register_autograd(lambda ctx, g: (g, g), setup_context=lambda ctx, inputs, output: None)
    x, y = torch.randn(4), torch.randn(4)
    xn, yn = x.numpy(), y.numpy()
    op, fn = tct.op(ADD, "add"), tc.define(ADD).add
    return [("torch.add", per_call_us(lambda: torch.add(x, y))),
            ("an empty torch.library.custom_op", per_call_us(lambda: empty(x, y))),
            ("tcstage.torch.op", per_call_us(lambda: op(x, y))),
            ("numpy.add", per_call_us(lambda: np.add(xn, yn))),
            ("tc.define(...).add on numpy arrays", per_call_us(lambda: fn(xn, yn))),
            ("tc.define(...).add on torch tensors", per_call_us(lambda: fn(x, y)))]


def main() -> None:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--first-call", default="conv_s2,padconv,groupnorm,softmax-512,gelu",
                    help="layers whose first call is timed in new processes ('' for none)")
    ap.add_argument("--threads", type=int, default=None,
                    help="PyTorch's threads, which tcstage's CPU kernels run on too (default: "
                         "PyTorch's default); the results file's name says a number given")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--overhead", action="store_true",
                    help="only the per-call overhead (a 4-element add, CPU)")
    a = ap.parse_args()
    DEVICE = a.device
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else machine()
    calls = overhead() if DEVICE == "cpu" else []
    overhead_lines = ["", "Per-call cost of a 4-element add (the kernel is nothing; best of 5 "
                      "means of 20000 calls):", "", "| call | us |", "|---|---|"]
    overhead_lines += [f"| {what} | {us:.1f} |" for what, us in calls]
    if a.overhead:
        print("\n".join([f"Machine: {where}; torch {torch.__version__}, "
                         f"{_threads()}", *overhead_lines]), flush=True)
        return
    rows = []
    for name in a.layers.split(","):
        row = bench_layer(name, a.runs)
        rows.append(row)
        print(row, flush=True)
    rec = recompilations()
    print(rec, flush=True)
    firsts = [first_call(name) for name in a.first_call.split(",") if name] \
        if DEVICE == "cpu" else []
    for row in firsts:
        print(row, flush=True)
    lines = [f"# tcstage.torch operators vs PyTorch ({DEVICE})", "",
             f"Machine: {where}; torch {torch.__version__}, {_threads()}; "
             f"{datetime.date.today()}. `python3 benchmarks/torch_bench.py --device {DEVICE}"
             f"{'' if a.threads is None else f' --threads {a.threads}'}`.",
             "", "Forward, and forward + backward, of one call: the best of "
             f"{a.runs} runs after 2 warm-ups, the two sides called in turn in every run; "
             "ratio = tcstage / PyTorch of the best times (median: the ratio of the medians, "
             "which shows how much other work on the machine moved them); same inputs, "
             "outputs and gradients checked against PyTorch's first.", "",
             "| layer | inputs | fwd tcstage ms | fwd PyTorch ms | fwd ratio (median) | "
             "fwd+bwd tcstage ms | fwd+bwd PyTorch ms | fwd+bwd ratio (median) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['layer']} | | {row['error']} | | | | | |")
        else:
            lines.append(f"| {row['layer']} | {row['shapes']} | " + " | ".join(
                f"{row[f'{w}_tcstage_ms']:.3f} | {row[f'{w}_torch_ms']:.3f} | "
                f"{row[f'{w}_ratio']:.2f} ({row[f'{w}_median_ratio']:.2f})"
                for w in ("fwd", "fwdbwd")) + " |")
    if firsts:
        lines += ["", "First forward+backward call in a new process (seconds, after importing "
                  "and defining; import and definition in parentheses): with an empty kernel "
                  "cache (which compiles the shared runtime library too, once per machine), "
                  "with a cache holding only that runtime (a layer new to the machine), then "
                  "with the cache the first process left.", "",
                  "| layer | empty cache s | runtime cached s | warm cache s |",
                  "|---|---|---|---|"]
        lines += [f"| {f['layer']} | {f['cold_s']:.2f} | {f['new_s']:.2f} | {f['warm_s']:.2f} "
                  f"({f['import_s']:.1f}) |" for f in firsts]
    lines += ["", f"Recompilations of MLP1 (forward and backward TC) over batch sizes "
              f"{rec['batches']}: {rec['after_first']} compilations at the first call, "
              f"{rec['recompilations']} after it."] + (overhead_lines if calls else []) + [""]
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        tag = "cpu-" + re.sub(r"[^a-z0-9]+", "-", machine().lower()).strip("-")[:40] \
            if DEVICE == "cpu" else re.sub(r"[^a-z0-9]+", "-", where.lower())
        tag += "" if a.threads is None else f"-{a.threads}-thread{'s' * (a.threads > 1)}"
        out = ROOT / "benchmarks" / "results" / f"torch-{tag}-{datetime.date.today()}.md"
        out.write_text(text)
        print("wrote", out)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
