#!/usr/bin/env python3
"""Launch overhead of tcstage's CUDA kernels from Python (needs a GPU, pycuda and PyTorch).

    python benchmarks/launch_bench.py [--calls N] [--out FILE]

A small tmm (8 x 8 x 8, so that the kernel itself takes a few microseconds) is compiled once;
then, in this one process, the host time per call is measured for: `kernel(A, B)` on PyTorch
CUDA tensors (argument checks, output allocation, launch), a prepared call's `launch()` (the
launch alone, arrays bound once), and `torch.matmul(A, B.t())` as the baseline. Each figure is the
median over `--calls` back-to-back calls, with a synchronisation before and after each batch of
100. The target for prepared launches is under 20 us.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import tcstage as tc

ROOT = Path(__file__).resolve().parent.parent


def per_call_us(fn, calls: int, sync) -> float:
    samples = []
    for _ in range(max(calls // 100, 1)):
        sync()
        start = time.perf_counter()
        for _ in range(100):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / 100 * 1e6)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("launch_bench needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    A = torch.randn(8, 8, device="cuda")
    B = torch.randn(8, 8, device="cuda")
    kernel = tc.compile((ROOT / "examples" / "tmm.tc").read_text(), "tmm", A, B,
                        options=tc.MappingOptions().mapToThreads(8, 8), target="cuda")
    torch.testing.assert_close(kernel(A, B), A @ B.t(), rtol=1e-4, atol=1e-4)
    prepared = kernel.prepare(A, B)
    sync = torch.cuda.synchronize
    rows = [("tcstage kernel(A, B)", per_call_us(lambda: kernel(A, B), args.calls, sync)),
            ("tcstage prepared launch()", per_call_us(prepared.launch, args.calls, sync)),
            ("torch.matmul(A, B.t())", per_call_us(lambda: torch.matmul(A, B.t()), args.calls,
                                                   sync))]
    lines = [f"# launch overhead on {torch.cuda.get_device_name()} (us per call, median)", "",
             "| call | us |", "|---|---:|"] + [f"| {name} | {us:.1f} |" for name, us in rows]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
