#!/usr/bin/env python3
"""Compile time of the CUDA path, per stage, for the paper's kernels at the paper's sizes.

    python benchmarks/compile_bench.py [--repeat N] [--no-nvcc] [--out FILE]

For every kernel, from a fresh `tc.define` each time (nothing cached between runs): the front end
(parse, checks), then the stages `tc.compile` records (lower: range inference and Halide Funcs;
extract; dependences; schedule; tile; map; codegen), their total ("TC -> CUDA"), and nvcc's
compilation of the source to PTX, reported separately. Medians over `--repeat` runs, in ms.
The target for tmm is under 300 ms from TC source to CUDA source.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

import tcstage as tc
from tcstage.compiler import STAGES
from tcstage.cuda.nvcc import compile_check

ROOT = Path(__file__).resolve().parent.parent
M = tc.MappingOptions

# (label, file, function, input shapes (scalars as values), options: the paper's appendix ones)
KERNELS = [
    ("tmm 128x32x256", "tmm.tc", "tmm", [(128, 32), (256, 32)],
     M().tile(4, 32).mapToThreads(32, 1).mapToBlocks(64, 128).unroll(4)),
    ("tmm 128x1024x1024", "tmm.tc", "tmm", [(128, 1024), (1024, 1024)],
     M().tile(32, 32, 32).mapToThreads(32, 32).mapToBlocks(4, 32).unroll(256)),
    ("tbmm 500x26x72x26", "tbmm.tc", "tbmm", [(500, 26, 72), (500, 26, 72)],
     M().tile(1).mapToThreads(26, 7).mapToBlocks(72, 16, 1).unroll(128)),
    ("gconv 32x32x16x16x14x14", "gconv.tc", "gconv", [(32, 32, 16, 14, 14), (32, 16, 16, 3, 3)],
     M().tile(1, 1, 1).mapToThreads(4, 8, 4).mapToBlocks(32, 32)),
    ("2LUT", "lut.tc", "2LUT", [(100000, 64), (128, 50), (100000, 64), (128, 50)],
     M().tile(4, 32).mapToThreads(32, 1).mapToBlocks(100, 100).unroll(1024)),
    ("MLP1 128", "mlp.tc", "MLP1", [(128, 1024), (1024, 1024), (1024,)],
     M().tile(16, 16, 128).mapToThreads(16, 16).mapToBlocks(32, 32)),
    ("MLP3 128", "mlp.tc", "MLP3", [(128, 128), (64, 128), (64,), (32, 64), (32,), (16, 32),
                                    (16,)],
     M().scheduleFusionStrategy("Max").tile(1).mapToThreads(128).mapToBlocks(128)),
    ("conv2d", "conv.tc", "conv2d", [(32, 16, 14, 14), (16, 16, 3, 3)],
     M().tile(1, 1, 7, 7).mapToThreads(7, 7).mapToBlocks(64, 64).unroll(4)),
    ("sconv2d", "sconv2d.tc", "sconv2d", [2, 2, (32, 16, 14, 14), (16, 16, 3, 3), (16,)],
     M().tile(1, 1, 7, 7).mapToThreads(7, 7).mapToBlocks(64, 64)),
]


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def measure(file: str, name: str, shapes, options, repeat: int, nvcc: bool) -> dict:
    source = (ROOT / "examples" / file).read_text()
    runs: dict[str, list[float]] = {}
    kernel = None
    for _ in range(repeat):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            start = time.perf_counter()
            program = tc.define(source, file)
            front = time.perf_counter() - start
            kernel = tc.compile(program, name, *shapes, options=options)
        total = front + sum(kernel.timings.values())
        for stage, seconds in [("front end", front), *kernel.timings.items(),
                               ("TC -> CUDA", total)]:
            runs.setdefault(stage, []).append(seconds * 1e3)
    if nvcc:
        start = time.perf_counter()
        compile_check(kernel.cuda_source)
        runs["nvcc"] = [(time.perf_counter() - start) * 1e3]
    result = {stage: statistics.median(v) for stage, v in runs.items()}
    result["grid"], result["block"] = kernel.grid, kernel.block
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-nvcc", action="store_true", help="skip the nvcc column")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    nvcc = not args.no_nvcc and shutil.which("nvcc") is not None
    columns = ["front end", *STAGES, "TC -> CUDA"] + (["nvcc"] if nvcc else [])
    lines = [f"# tcstage compile time per stage (ms, median of {args.repeat})", "",
             f"- machine: {_machine()}", f"- date: {datetime.date.today()}",
             f"- command: python benchmarks/compile_bench.py --repeat {args.repeat}", "",
             "| kernel | grid | block | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---:|" * len(columns)]
    print("\n".join(lines), flush=True)
    for label, file, name, shapes, options in KERNELS:
        r = measure(file, name, shapes, options, args.repeat, nvcc)
        row = (f"| {label} | {r['grid']} | {r['block']} | "
               + " | ".join(f"{r[c]:.1f}" for c in columns) + " |")
        print(row, flush=True)
        lines.append(row)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
