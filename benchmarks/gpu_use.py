"""How each kernel would use a GPU, without one: blocks against the SMs, threads per block,
occupancy, bytes moved against the least the tensors need, and the cost model's bound, per
launch (the facts `Kernel.explain()` reports, as one table).

Cases: every line of schedules/paper-manual.txt (the paper's kernels at the paper's sizes with
their documented options) and every Halide app of examples/halide at its benchmark size, each
under its documented options (the module's GPU_OPTIONS: for bilateral_grid, one set per launch;
local_laplacian has none),
`options="auto"` and, with --presets, TC's starting points. Only compiles: nothing runs, so
the paper's sizes are fine on any machine.

    python3 benchmarks/gpu_use.py [--device H100] [--presets] [--only NAME ...] [--ptxas]

A launch is flagged `few` when its blocks give fewer than two per SM although the elements it
writes (each counted once) would fill that many blocks of its block size, one element per
thread."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import tcstage as tc  # noqa: E402
from benchmarks.gpu_bench import cases, program, shapes  # noqa: E402
from tcstage.tune import model  # noqa: E402

HALIDE_APPS = ["blur", "stencil_chain", "harris", "erode", "interpolate", "bilateral_grid",
               "local_laplacian", "conv_layer", "matmul"]
PRESETS = ["naive", "pointwise", "mlp", "conv", "group_conv", "reduction"]


def tc_cases():
    """(case name, what to compile: (program, function, shapes), documented options)."""
    for case in cases():
        prog = program(case["file"])
        fn = prog[case["function"]]
        inputs = [shape for _, shape, _ in shapes(fn, case["sizes"])]  # (shapes: no arrays)
        yield case["name"], (prog, case["function"], inputs, {}), case["options"]


def halide_cases():
    for name in HALIDE_APPS:
        module = importlib.import_module(f"examples.halide.{name}")
        app = module.build()
        args = module.inputs(np.random.default_rng(0), "bench")
        fn = tc.from_halide(app.outputs if len(app.outputs) > 1 else app.outputs[0], name=name)
        yield (f"halide/{name}", (fn, None, args,
                                  {"output_shape": module.output_shapes(args)}),
               getattr(module, "GPU_OPTIONS", None))


def compile_case(what, options):
    prog, function, args, extra = what
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        if function is None:
            shape = extra["output_shape"]
            return tc.compile(prog, *args, output_shape=shape[0] if len(shape) == 1 else shape,
                              options=options, target="cuda-emulated")
        return tc.compile(prog, function, *args, options=options, target="cuda-emulated")


def rows(kernel, device, ptxas: bool):
    """One row per launch: (launch, blocks, busy SMs %, blocks per SM, threads per block,
    occupancy, DRAM bytes / least bytes, bound, predicted us, flag)."""
    from tcstage.cuda.nvcc import resources
    from tcstage.poly.explain import least_bytes
    found = resources(kernel.cuda_source) if ptxas else None
    prediction = model.predict(kernel.compiled, device, found)
    parts = kernel.compiled.launches or (kernel.compiled,)
    out = []
    for part, p in zip(parts, prediction.launches or (prediction,)):
        least = least_bytes(part)
        work = launch_work(part)  # elements written: the parallel work, reductions aside
        few = p.blocks < 2 * device.sms and work >= 2 * device.sms * p.threads_per_block
        out.append((part.cuda.name, p.blocks, 100 * min(p.blocks, device.sms) / device.sms,
                    p.blocks / device.sms, p.threads_per_block, p.occupancy,
                    p.dram_bytes / least if least else float("nan"), p.bound, p.time * 1e6,
                    "few" if few else ""))
    return out


def launch_work(part) -> int:
    """Elements the launch writes, each counted once however many of its statements write it
    (an initialisation, a reduction and an activation of one output are one thread's work),
    leaving out the intermediates overlapped tiles keep in shared memory (tests/test_gpu_fill.py
    counts with it)."""
    scratch = part.overlap.scratch if part.overlap is not None else frozenset()
    written: dict[str, object] = {}
    for s in part.scop.statements:
        if s.tensor not in scratch:
            region = s.write.relation.range()
            written[s.tensor] = region if s.tensor not in written else \
                written[s.tensor].union(region)
    return sum(model.elements(region) for region in written.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="H100", help="H100 or H200 (the cost model's figures)")
    ap.add_argument("--presets", action="store_true", help="also TC's starting points")
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--ptxas", action="store_true",
                    help="registers and shared memory from nvcc's ptxas (slower)")
    args = ap.parse_args(argv)
    device = model.device_by_name(args.device)
    print(f"# GPU use on an {device.name} ({device.sms} SMs), from the cost model"
          f"{' and ptxas' if args.ptxas else ''}; nothing was run")
    print(f"{'case':24} {'options':10} {'launch':22} {'blocks':>7} {'SMs %':>6} "
          f"{'blk/SM':>7} {'thr/blk':>7} {'occ':>5} {'DRAM/min':>8} {'bound':>8} "
          f"{'us':>9}  note")
    failures = 0
    for source in (tc_cases, halide_cases):
        for name, what, documented in source():
            if args.only and name not in args.only:
                continue
            choices = [("documented", documented)] * (documented is not None) + \
                [("auto", "auto")] + \
                ([(p, p) for p in PRESETS] if args.presets else [])
            for label, options in choices:
                start = time.perf_counter()
                try:
                    kernel = compile_case(what, options)
                    table = rows(kernel, device, args.ptxas)
                except Exception as e:  # (a table of every case: one failure is one row)
                    failures += 1
                    print(f"{name:24} {label:10} failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}")
                    continue
                for r in table:
                    print(f"{name:24} {label:10} {r[0][:22]:22} {r[1]:7d} {r[2]:6.0f} "
                          f"{r[3]:7.2f} {r[4]:7d} {r[5]:5.2f} {r[6]:8.2f} {r[7]:>8} "
                          f"{r[8]:9.4g}  {r[9]} ({time.perf_counter() - start:.1f} s)")
                sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
