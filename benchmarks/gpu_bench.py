#!/usr/bin/env python3
"""The paper's kernels on a GPU at the paper's sizes, tcstage against PyTorch (cuBLAS, cuDNN).

    python benchmarks/gpu_bench.py [--runs N] [--only tmm-small,2LUT] [--out FILE]
    python benchmarks/gpu_bench.py --compile-only      # no GPU: compile every case, nvcc-check

Every case of `schedules/paper-manual.txt` (a TC, sizes and manual MappingOptions) is compiled
once, checked against PyTorch's implementation of the same computation, then both are timed in
this one process: fp32 with TF32 off, CUDA events around each launch after a warm-up, p0 / p50
/ p90 in microseconds over `--runs` launches, and the ratio of the medians (tcstage / PyTorch:
below 1 means tcstage is faster). tcstage is timed through a prepared call (arrays bound once),
PyTorch through its Python call. For the look-up tables the report adds the achieved memory
bandwidth (bytes of rows gathered, indices read and outputs written, per second) against the
device's peak.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import tcstage as tc

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ROOT / "schedules" / "paper-manual.txt"


def cases(path: Path = SCHEDULES) -> list[dict]:
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            name, where, sizes, options = (part.strip() for part in line.split("|"))
            file, function = where.split(":")
            sizes = {k.strip(): int(v) for k, v in (s.split("=") for s in sizes.split(","))}
        except ValueError:
            raise SystemExit(f"{path}:{number}: expected 'name | file.tc:function | "
                             f"N=1,M=2 | MappingOptions()...', got: {line.strip()}") from None
        out.append({"name": name, "file": file, "function": function, "sizes": sizes,
                    "options": tc.MappingOptions.parse(options)})
    return out


def program(file: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define((ROOT / "examples" / file).read_text())


def shapes(fn, sizes: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(tensor, shape, dtype name) of each input of fn at `sizes`."""
    return [(t.name, tuple(sizes[d] if not d.isdigit() else int(d) for d in t.dims),
             t.type.name) for t in fn.checked.inputs]


# -- PyTorch's versions ---------------------------------------------------------------------------

def reference(name: str, args):
    import torch
    import torch.nn.functional as F
    name = name.split("-")[0]  # variants (tmm-large, gconv-14, MLP1-registers) share one
    if name == "tmm" or name == "C3":
        A, B = args
        return lambda: torch.matmul(A, B.t())
    if name == "tbmm":
        X, Y = args
        return lambda: torch.bmm(X, Y.transpose(1, 2))
    if name == "gconv":
        I, W = args
        N, G, C, H, Wd = I.shape
        _, Fo, _, KH, KW = W.shape
        x, w = I.reshape(N, G * C, H, Wd), W.reshape(G * Fo, C, KH, KW)
        return lambda: F.conv2d(x, w, groups=G).reshape(N, G, Fo, H - KH + 1, Wd - KW + 1)
    if name == "1LUT":
        L, I = args
        return lambda: F.embedding_bag(I.long(), L, mode="sum")
    if name == "2LUT":
        L1, I1, L2, I2 = args
        i1, i2 = I1.long(), I2.long()
        return lambda: (F.embedding_bag(i1, L1, mode="sum"), F.embedding_bag(i2, L2, mode="sum"))
    if name == "MLP1":
        I, W, B = args
        return lambda: F.relu(F.linear(I, W, B))
    if name == "MLP3":
        I, W2, B2, W3, B3, W4, B4 = args

        def three():
            o2 = F.relu(F.linear(I, W2, B2))
            o3 = F.relu(F.linear(o2, W3, B3))
            return o2, o3, F.relu(F.linear(o3, W4, B4))
        return three
    raise KeyError(name)


def lut_bytes(name: str, args) -> int:
    """Bytes a look-up kernel must move: the gathered rows, the indices, the outputs."""
    pairs = [args] if name == "1LUT" else [args[:2], args[2:]]
    total = 0
    for L, I in pairs:
        rows = I.numel() * L.shape[1] * L.element_size()
        total += rows + I.numel() * I.element_size() + I.shape[0] * L.shape[1] * 4
    return total


def peak_bandwidth() -> float | None:
    """The device's peak DRAM bandwidth in bytes per second (pycuda's attributes)."""
    try:
        import pycuda.driver as drv
        dev = drv.Context.get_device()
        clock_khz = dev.get_attribute(drv.device_attribute.MEMORY_CLOCK_RATE)
        bus_bits = dev.get_attribute(drv.device_attribute.GLOBAL_MEMORY_BUS_WIDTH)
        return 2 * clock_khz * 1e3 * bus_bits / 8
    except Exception:  # noqa: BLE001 - a missing figure is reported as such
        return None


def timings_us(fn, runs: int, warmup: int = 20) -> list[float]:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def percentile(sorted_values, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def make_inputs(fn, sizes, device: str):
    import torch
    from tcstage.inputs import index_bounds
    bounds = index_bounds(fn.checked, lambda d: sizes[d])
    gen = torch.Generator(device=device).manual_seed(0)
    args = []
    for name, shape, dtype in shapes(fn, sizes):
        if dtype.startswith("float"):
            args.append(torch.randn(shape, generator=gen, device=device))
        else:
            args.append(torch.randint(0, bounds.get(name, 2), shape, generator=gen,
                                      device=device, dtype=getattr(torch, dtype)))
    return args


def compile_only(selected) -> int:
    """Compiles every case (TC -> CUDA, then nvcc for sm_90) and prints what ptxas reports:
    registers per thread and spilled bytes (private arrays that stayed in local memory)."""
    from tcstage.cuda.nvcc import resources
    print("| case | compile s | grid | block | shared bytes | private | registers | spill "
          "bytes (st/ld) | nvcc |")
    print("|---|---:|---|---|---:|---|---:|---|---|")
    for case in selected:
        prog = program(case["file"])
        fn = prog[case["function"]]
        start = time.perf_counter()
        k = tc.compile(prog, case["function"], *[s for _, s, _ in shapes(fn, case["sizes"])],
                       options=case["options"], target="cuda-emulated")
        seconds = time.perf_counter() - start
        promos = k.compiled.promoted.promotions
        shared = sum(p.nbytes for p in promos if p.memory == "shared")
        private = ", ".join(p.buffer + "".join(f"[{d}]" for d in p.padded)
                            for p in promos if p.memory == "private") or "-"
        usage = resources(k.cuda_source)  # raises with nvcc's message if it does not compile
        regs, spills = ("-", "-") if usage is None else (
            usage["registers"], f"{usage['spill_stores']}/{usage['spill_loads']}")
        print(f"| {case['name']} | {seconds:.2f} | {k.grid} | {k.block} | {shared} | {private} "
              f"| {regs} | {spills} | {'no nvcc' if usage is None else 'ok'} |")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args(argv)
    selected = [c for c in cases() if not args.only or c["name"] in args.only.split(",")]
    if args.compile_only:
        return compile_only(selected)
    import torch
    if not torch.cuda.is_available():
        print("gpu_bench needs a GPU (torch.cuda.is_available() is False); "
              "--compile-only checks the cases without one", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    peak = None
    lines = [f"# The paper's kernels on {torch.cuda.get_device_name()}: tcstage vs PyTorch "
             f"{torch.__version__} (us, {args.runs} runs after warm-up, CUDA events, fp32, "
             "TF32 off)", "",
             "| case | sizes | tcstage p0 | p50 | p90 | PyTorch p0 | p50 | p90 | "
             "tcstage / PyTorch (p50) | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    status = 0
    for case in selected:
        name = case["name"]
        try:
            prog = program(case["file"])
            fn = prog[case["function"]]
            inputs = make_inputs(fn, case["sizes"], "cuda")
            kernel = tc.compile(prog, case["function"], *inputs, options=case["options"],
                                target="cuda")
            ref = reference(name, inputs)
            got, want = kernel(*inputs), ref()
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
            prepared = kernel.prepare(*inputs)
            mine, theirs = timings_us(prepared.launch, args.runs), timings_us(ref, args.runs)
            note = ""
            if "LUT" in name:
                peak = peak or peak_bandwidth()
                gbs = lut_bytes(name, inputs) / (percentile(mine, 0.5) * 1e-6) / 1e9
                note = f"{gbs:.0f} GB/s" + (f" of {peak / 1e9:.0f} peak" if peak else "")
            sizes = ",".join(f"{k}={v}" for k, v in case["sizes"].items())
            row = [percentile(mine, q) for q in (0, 0.5, 0.9)] + \
                [percentile(theirs, q) for q in (0, 0.5, 0.9)]
            lines.append(f"| {name} | {sizes} | " + " | ".join(f"{v:.1f}" for v in row) +
                         f" | {row[1] / row[4]:.2f} | {note} |")
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            status = 1
            lines.append(f"| {name} | | | | | | | | | FAILED: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]} |")
        print(lines[-1], flush=True)
    lines.append("")
    lines.append("Options per case: schedules/paper-manual.txt.")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[:4]))
    return status


if __name__ == "__main__":
    sys.exit(main())
