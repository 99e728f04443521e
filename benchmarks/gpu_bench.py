#!/usr/bin/env python3
"""tcstage's CUDA kernels on a GPU against PyTorch, in one process and one report.

    python benchmarks/gpu_bench.py [--runs N] [--only tmm-small,row_sum] [--out FILE]
    python benchmarks/gpu_bench.py --compile-only      # no GPU: compile every case, nvcc-check

Three groups of cases:

* the paper's kernels (`schedules/paper-manual.txt`: a TC, sizes and manual MappingOptions per
  line), fp32 with TF32 off, against PyTorch's implementation of the same computation;
* issue 15's kernels (`MODERN`, TC source in this script): a row sum of 32 x 2^20 floats against
  torch.sum(dim=1) and a full sum of 2^25 floats against torch.sum, with the achieved bandwidth
  as a share of the GPU's HBM peak (a figure per GPU model, `hbm_peak`); softmax and layernorm
  over (4096, 4096) against torch.softmax and layer_norm; tmm 4096^3 in half and bfloat16 with
  and without `useTensorCores`, against torch.matmul in the same type, in TFLOP/s. Each has the
  issue's goal, judged met or not met when measured;
* Halide's apps (examples/halide, issue 26; `--no-halide` leaves them out): tcstage's kernel of
  the pipeline (`tc.from_halide`) under `options="auto"` and under the app's documented options
  (its module's GPU_OPTIONS, overlapped tiles for the stencil chains), against the app's own
  GPU schedule (`schedule_gpu`, Halide's JIT for CUDA) in the same run, both timed by the wall
  clock around a call that ends with a device synchronisation, their arrays on the GPU. The
  times Halide's README gives for its apps (a TITAN Xp) are printed beside them as anchors.
  bilateral_grid, local_laplacian and interpolate take minutes to compile: they are left out
  unless named in `--only`, and `--halide-long` times them alone (gpu_check.sh's `halide`
  stage, a device run of its own).

Every case is compiled once, checked against PyTorch's result, then both are timed in this one
process: CUDA events around each launch after a warm-up, p0 / p50 / p90 in microseconds over
`--runs` launches (fewer for slow kernels: about `--seconds` per case and side), and the ratio
of the medians (tcstage / PyTorch: below 1 means tcstage is faster). tcstage is timed through a
prepared call (arrays bound once), PyTorch through its Python call. A case that fails to compile,
crashes or computes a wrong result is a row saying so; the others still run. The report is
rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import math
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import attrs

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


# -- issue 15's kernels: reductions, normalisations, half and bfloat16 ---------------------------

ROW_SUM = """
def row_sum(float(R, C) A) -> (O) {
  O(r) +=! A(r, c)
}
"""
FULL_SUM = """
def full_sum(float(N) A) -> (O) {
  O() +=! A(i)
}
"""
# (the layers of examples/layers.tc)
SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
  M(n) max=! X(n,c)
  E(n,c) = exp(X(n,c) - M(n))
  S(n) +=! E(n,c)
  Y(n,c) = E(n,c) / S(n)
}
"""
LAYERNORM = """
def layernorm(float(N,C) X, float(C) G, float(C) Bt) -> (Y) {
  mean(n) +=! X(n,c) / C
  xc(n,c) = X(n,c) - mean(n)
  var(n) +=! xc(n,c) * xc(n,c) / C
  Y(n,c) = G(c) * xc(n,c) * rsqrt(var(n) + 1e-5) + Bt(c)
}
"""


def tmm_source(scalar: str) -> str:
    return f"""
def tmm_{scalar}({scalar}(M,K) A, {scalar}(N,K) B) -> (C) {{
  C(m,n) +=! A(m,k) * B(n,k)
}}
"""


M = tc.MappingOptions
# Sums: 256 threads cooperate on each reduction (parallelReductions, on by default); the row sum
# has one block per row, or 32 per row combining atomically (its 32 rows alone fill a quarter of
# an H100's 132 SMs); the full sum spreads over 1024 blocks.
ROW_SUM_OPTIONS = M().mapToThreads(256).mapToBlocks(32)
ROW_SUM_BLOCKS_OPTIONS = M().mapToThreads(256).mapToBlocks(32, 32)
FULL_SUM_OPTIONS = M().mapToThreads(256).mapToBlocks(1024)
# Softmax and layernorm: one row per block (tile(1), 4096 blocks), every statement fused into
# it, its 256 threads across the row, a row of a temporary (16 KiB) in shared memory.
ROW_OPTIONS = (M().outerScheduleFusionStrategy("Max").tile(1).mapToThreads(256)
               .mapToBlocks(4096).useSharedMemory(True))
# tmm: a 128 x 128 output tile per block of 8 warps, k in steps of 32 through shared memory, each
# thread's outputs in registers; the tensor-core variants add useTensorCores alone.
TMM_NARROW_OPTIONS = (M().tile(128, 128, 32).mapToThreads(32, 8).mapToBlocks(32, 32)
                      .useSharedMemory(True).usePrivateMemory(True).useRegisterTiling(True)
                      .unroll(4))


@attrs.frozen
class Goal:
    """One of issue 15's targets, judged on a measured row."""

    text: str
    min_peak_share: float | None = None  # achieved bandwidth / the HBM peak
    max_ratio: float | None = None  # tcstage time / PyTorch time (p50)

    def met(self, ratio: float, peak_share: float | None) -> bool:
        if self.min_peak_share is not None and (peak_share is None
                                                or peak_share < self.min_peak_share):
            return False
        return self.max_ratio is None or ratio <= self.max_ratio


ROW_SUM_GOAL = Goal(">= 80% of HBM peak and >= torch.sum", min_peak_share=0.8, max_ratio=1.0)
TORCH_GOAL = Goal(">= PyTorch (ratio <= 1)", max_ratio=1.0)
BF16_GOAL = Goal(">= 50% of torch.matmul's bf16 TFLOP/s (ratio <= 2)", max_ratio=2.0)


@attrs.frozen(eq=False)
class Bench:
    """One benchmark case: a TC function at fixed sizes with its options, and PyTorch's version."""

    name: str
    group: str  # "paper" or "issue 15"
    source: str
    function: str
    sizes: dict
    options: tc.MappingOptions
    baseline: Callable  # torch inputs -> a call computing the same with PyTorch
    baseline_text: str = ""
    bytes_moved: Callable | None = None  # torch inputs -> the bytes the computation must move
    flops: Callable | None = None  # torch inputs -> floating-point operations
    goal: Goal | None = None


def _sum_rows(A):
    import torch
    return lambda: torch.sum(A, dim=1)


def _sum_all(A):
    import torch
    return lambda: torch.sum(A).reshape(())


def _softmax(X):
    import torch
    return lambda: torch.softmax(X, dim=1)


def _layernorm(X, G, Bt):
    import torch.nn.functional as F
    return lambda: F.layer_norm(X, (X.shape[1],), G, Bt, eps=1e-5)


def _matmul_t(A, B):
    import torch
    return lambda: torch.matmul(A, B.t())


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def issue15_benches() -> list[Bench]:
    def read_all(*args):  # inputs read once, outputs (as many bytes as the first input) written
        return _nbytes(*args) + _nbytes(args[0])

    def tmm_flops(A, B):
        return 2 * A.shape[0] * A.shape[1] * B.shape[0]

    out = [
        Bench("row_sum", "issue 15", ROW_SUM, "row_sum", {"R": 32, "C": 1 << 20},
              ROW_SUM_OPTIONS, _sum_rows, "torch.sum(A, dim=1)",
              bytes_moved=lambda A: _nbytes(A) + 4 * A.shape[0], goal=ROW_SUM_GOAL),
        Bench("row_sum-blocks", "issue 15", ROW_SUM, "row_sum", {"R": 32, "C": 1 << 20},
              ROW_SUM_BLOCKS_OPTIONS, _sum_rows, "torch.sum(A, dim=1)",
              bytes_moved=lambda A: _nbytes(A) + 4 * A.shape[0], goal=ROW_SUM_GOAL),
        Bench("full_sum", "issue 15", FULL_SUM, "full_sum", {"N": 1 << 25}, FULL_SUM_OPTIONS,
              _sum_all, "torch.sum(A)", bytes_moved=lambda A: _nbytes(A) + 4),
        Bench("softmax", "issue 15", SOFTMAX, "softmax", {"N": 4096, "C": 4096}, ROW_OPTIONS,
              _softmax, "torch.softmax(X, dim=1)", bytes_moved=read_all, goal=TORCH_GOAL),
        Bench("layernorm", "issue 15", LAYERNORM, "layernorm", {"N": 4096, "C": 4096},
              ROW_OPTIONS, _layernorm, "F.layer_norm(X, (C,), G, Bt, eps=1e-5)",
              bytes_moved=read_all, goal=TORCH_GOAL),
    ]
    for scalar, short in (("half", "half"), ("bfloat16", "bf16")):
        for cores in (False, True):
            out.append(Bench(
                f"tmm-{short}" + ("-tc" if cores else ""), "issue 15", tmm_source(scalar),
                f"tmm_{scalar}", {"M": 4096, "N": 4096, "K": 4096},
                TMM_NARROW_OPTIONS.useTensorCores(True) if cores else TMM_NARROW_OPTIONS,
                _matmul_t, f"torch.matmul(A, B.t()) in {short}", flops=tmm_flops,
                goal=BF16_GOAL if cores and short == "bf16" else None))
    return out


def paper_benches() -> list[Bench]:
    out = []
    for case in cases():
        name = case["name"]
        out.append(Bench(
            name, "paper", (ROOT / "examples" / case["file"]).read_text(), case["function"],
            case["sizes"], case["options"], lambda *args, n=name: reference(n, args),
            bytes_moved=(lambda *args, n=name: lut_bytes(n, args)) if "LUT" in name else None))
    return out


def all_benches() -> list[Bench]:
    return paper_benches() + issue15_benches()


# -- Halide's apps ---------------------------------------------------------------------------

# the apps timed, each under "auto" and its documented options (the module's GPU_OPTIONS:
# overlapped tiles for the stencil chains)
# (quickest to compile first: a run cut short by its time limit keeps the rows it measured)
HALIDE_APPS = ["blur", "erode", "harris", "matmul", "conv_layer", "stencil_chain"]
# the pyramids and the grid: one to two minutes each to compile on 2 cores, so they are timed in
# a device run of their own (`--halide-long`, gpu_check.sh's `halide` stage)
HALIDE_LONG = ["bilateral_grid", "local_laplacian", "interpolate"]
# Halide's README of its Li2018 autoscheduler (src/autoschedulers/li2018/README.md), on a
# TITAN Xp at the apps' own sizes: the only published GPU times of these apps
HALIDE_ANCHORS = {"stencil_chain": "6.35 ms (Li2018 autoscheduler, TITAN Xp)",
                  "bilateral_grid": "0.29 ms (manual, TITAN Xp)",
                  "local_laplacian": "0.81 ms (manual, TITAN Xp)",
                  "conv_layer": "1.90 ms (Li2018 autoscheduler, TITAN Xp)"}
HALIDE_HEADER = ["| app | size | tcstage options | launches | blocks | tcstage p50 ms | "
                 "Halide GPU schedule p50 ms | tcstage / Halide | anchor | note |",
                 "|---|---|---|---:|---|---:|---:|---:|---|---|"]


def wall_ms(run, runs: int, seconds: float) -> list[float]:
    """Wall-clock times of calls that end synchronised (Halide's own CUDA context is not the
    one CUDA events would time in), after a warm-up; fewer where one call takes long."""
    run()
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    runs = max(3, min(runs, int(seconds / max(once, 1e-7))))
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        out.append((time.perf_counter() - t) * 1e3)
    return sorted(out)


def _option_sets(module) -> list[tuple[str, object]]:
    """An app's tcstage options: "auto", then its GPU_OPTIONS where it documents some
    (local_laplacian does not: no one set of tiles suits its mixed 2-d and 3-d launches)."""
    documented = getattr(module, "GPU_OPTIONS", None)
    return [("auto", "auto")] + ([("documented", documented)] if documented is not None else [])


def halide_lines(runs: int, seconds: float, only=None, each=lambda lines: None) -> list[str]:
    """One row per app and tcstage option set; a failed case is a row saying why. `each` gets
    the rows so far after every row."""
    import importlib

    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.halide_bench import agree, halide_runner
    import halide as hl
    lines = []
    for app_name in (HALIDE_APPS + HALIDE_LONG if only is None else
                     [a.split("/", 1)[1] for a in only]):
        module = importlib.import_module(f"examples.halide.{app_name}")
        args = module.inputs(np.random.default_rng(0), "bench")
        shapes_ = module.output_shapes(args)
        size = "x".join(map(str, args[0].shape))
        try:
            app = module.build()
            module.schedule_gpu(app)
            target = hl.get_jit_target_from_environment().with_feature(hl.TargetFeature.CUDA)
            want = halide_runner(app, args, shapes_, target)()
            theirs = wall_ms(halide_runner(app, args, shapes_, target, to_host=False), runs,
                             seconds)
        except Exception as e:  # noqa: BLE001 - the tcstage rows still run
            want, theirs = None, None
            halide_failed = f"Halide's GPU schedule failed: {type(e).__name__}: {e}"[:200]
        for label, options in _option_sets(module):
            try:
                fn = tc.from_halide(module.build().outputs[0], name=app_name)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", tc.TCWarning)
                    kernel = tc.compile(fn, *args, output_shape=shapes_[0], options=options,
                                        target="cuda")
                got = np.asarray(kernel(*args))  # (numpy in, numpy out: uint16 images too)
                note = "" if want is None or agree(module, args, [got], want) else \
                    "WRONG: differs from Halide's result"
                if want is None:
                    note = halide_failed
                prepared = kernel.prepare(*args)  # (copied to the GPU once)

                def launch():
                    prepared.launch()
                    torch.cuda.synchronize()
                mine = wall_ms(launch, runs, seconds)
                ratio = f"{percentile(mine, 0.5) / percentile(theirs, 0.5):.2f}" \
                    if theirs else ""
                theirs_text = f"{percentile(theirs, 0.5):.3f}" if theirs else ""
                lines.append(
                    f"| {app_name} | {size} | {label} | {len(kernel.launches)} | "
                    f"{', '.join(str(math.prod(p.grid)) for p in kernel.launches)} | "
                    f"{percentile(mine, 0.5):.3f} | {theirs_text} | {ratio} | "
                    f"{HALIDE_ANCHORS.get(app_name, '')} | {note} |")
            except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
                lines.append(f"| {app_name} | {size} | {label} | | | | | | | FAILED: "
                             f"{type(e).__name__}: {str(e).strip()[:160]} |")
            print(lines[-1], flush=True)
            each(lines)
    return lines


# -- the GPU's peak bandwidth ----------------------------------------------------------------

# HBM peaks by GPU model (NVIDIA's data sheets), matched against the name nvidia-smi gives, in
# this order (the PCIe and NVL H100s before the SXM one, whose name says neither).
HBM_PEAKS = (("H200", 4.8e12, "H200"), ("H100 PCIe", 2.0e12, "H100 PCIe"),
             ("H100 NVL", 3.9e12, "H100 NVL"), ("H100", 3.35e12, "H100 SXM"))


def gpu_name() -> str:
    """The GPU's name as nvidia-smi gives it (PyTorch's where nvidia-smi is missing)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import torch
    return torch.cuda.get_device_name()


def hbm_peak(name: str) -> tuple[float | None, str]:
    """(peak bytes per second, where the figure comes from) for the GPU named `name`."""
    for key, peak, model in HBM_PEAKS:
        if key.lower() in name.lower():
            return peak, f"{peak / 1e12:.2f} TB/s, the {model} data-sheet figure (by the name " \
                         f"'{name}')"
    computed = peak_bandwidth()
    if computed:
        return computed, f"{computed / 1e12:.2f} TB/s from the memory clock and bus width the " \
                         f"driver reports (no data-sheet figure known for '{name}')"
    return None, f"unknown (no figure for '{name}')"


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


# -- measuring -------------------------------------------------------------------------------

def timings_us(fn, runs: int, seconds: float | None = None, warmup: int = 20) -> list[float]:
    """CUDA-event times of `runs` calls after a warm-up; with `seconds`, fewer calls where one
    takes long (at least 3), so that a slow kernel does not eat the whole run."""
    import torch
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - start
    if seconds is not None:
        runs = max(3, min(runs, int(seconds / max(once, 1e-7))))
    for _ in range(min(warmup, runs)):
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
        if dtype.startswith(("float", "bfloat")):
            args.append(torch.randn(shape, generator=gen, device=device,
                                    dtype=getattr(torch, dtype)))
        else:
            args.append(torch.randint(0, bounds.get(name, 2), shape, generator=gen,
                                      device=device, dtype=getattr(torch, dtype)))
    return args


def mismatch(got, want) -> str | None:
    """None if `got` equals PyTorch's `want` within a tolerance for its dtype (relative, and
    absolute times the largest magnitude of `want`), else the largest error."""
    import torch
    narrow = want.dtype in (torch.float16, torch.bfloat16)
    rtol = 2e-2 if narrow else 1e-3
    g, w = got.double(), want.double()
    scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
    err = (g - w).abs()
    if bool((err <= rtol * scale + rtol * w.abs()).all()):
        return None
    return f"max error {float(err.max()):.3g} (scale {scale:.3g}, rtol {rtol:g})"


@attrs.frozen
class Row:
    """One measured (or failed) case."""

    bench: Bench
    mine: tuple[float, ...] = ()
    theirs: tuple[float, ...] = ()
    wrong: str | None = None  # how tcstage's result differs from PyTorch's
    failed: str | None = None  # the error that stopped the case
    peak: float | None = None  # HBM bytes per second

    @property
    def ratio(self) -> float:
        return percentile(self.mine, 0.5) / percentile(self.theirs, 0.5)

    def _rate(self, times, inputs_bytes, flops) -> str:
        t = percentile(times, 0.5) * 1e-6
        if flops is not None:
            return f"{flops / t / 1e12:.1f} TFLOP/s"
        if inputs_bytes is not None:
            text = f"{inputs_bytes / t / 1e9:.0f} GB/s"
            return text + (f" ({inputs_bytes / t / self.peak:.0%} of HBM)" if self.peak else "")
        return ""

    def peak_share(self, moved: int | None) -> float | None:
        if moved is None or not self.peak:
            return None
        return moved / (percentile(self.mine, 0.5) * 1e-6) / self.peak


def measure(bench: Bench, runs: int, seconds: float, peak: float | None) -> tuple[Row, dict]:
    """Compiles, checks and times one case on the GPU; (row, its figures) or a failed row."""
    try:
        prog = _define(bench.source)
        fn = prog[bench.function]
        inputs = make_inputs(fn, bench.sizes, "cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            kernel = tc.compile(prog, bench.function, *inputs, options=bench.options,
                                target="cuda")
        ref = bench.baseline(*inputs)
        got, want = kernel(*inputs), ref()
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        wrong = next((m for m in (mismatch(g, w) for g, w in zip(got, want)) if m), None)
        prepared = kernel.prepare(*inputs)
        mine = timings_us(prepared.launch, runs, seconds)
        if not wrong:  # still right after many launches on the same arrays (scratch reset)?
            again = prepared.results()
            again = again if isinstance(again, tuple) else (again,)
            wrong = next((f"after {len(mine)}+ launches: {m}" for m in
                          (mismatch(g, w) for g, w in zip(again, want)) if m), None)
        theirs = timings_us(ref, runs, seconds)
        figures = {"bytes": bench.bytes_moved(*inputs) if bench.bytes_moved else None,
                   "flops": bench.flops(*inputs) if bench.flops else None}
        return Row(bench, tuple(mine), tuple(theirs), wrong=wrong, peak=peak), figures
    except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
        return Row(bench, failed=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
                   if str(e).strip() else type(e).__name__), {}


def _sizes(bench: Bench) -> str:
    return ",".join(f"{k}={v}" for k, v in bench.sizes.items())


def paper_line(row: Row, figures: dict) -> str:
    b = row.bench
    if row.failed:
        return f"| {b.name} | {_sizes(b)} | | | | | | | | FAILED: {row.failed} |"
    values = [percentile(row.mine, q) for q in (0, 0.5, 0.9)] + \
        [percentile(row.theirs, q) for q in (0, 0.5, 0.9)]
    note = row._rate(row.mine, figures.get("bytes"), None)
    if row.wrong:
        note = f"WRONG: {row.wrong}" + (f"; {note}" if note else "")
    return f"| {b.name} | {_sizes(b)} | " + " | ".join(f"{v:.1f}" for v in values) + \
        f" | {row.ratio:.2f} | {note} |"


def issue15_line(row: Row, figures: dict) -> str:
    b = row.bench
    goal = b.goal.text if b.goal else "-"
    if row.failed:
        verdict = "not met (failed)" if b.goal else "-"
        return f"| {b.name} | {_sizes(b)} | | | | | | {goal} | {verdict} | FAILED: {row.failed} |"
    mine = row._rate(row.mine, figures.get("bytes"), figures.get("flops"))
    theirs = row._rate(row.theirs, figures.get("bytes"), figures.get("flops"))
    verdict = "-"
    if b.goal:
        verdict = "not met (wrong result)" if row.wrong else \
            ("met" if b.goal.met(row.ratio, row.peak_share(figures.get("bytes"))) else "not met")
    note = f"WRONG: {row.wrong}" if row.wrong else ""
    return (f"| {b.name} | {_sizes(b)} | {percentile(row.mine, 0.5):.1f} | "
            f"{percentile(row.theirs, 0.5):.1f} | {row.ratio:.2f} | {mine} | {theirs} | {goal} | "
            f"{verdict} | {note} |")


PAPER_HEADER = ["| case | sizes | tcstage p0 | p50 | p90 | PyTorch p0 | p50 | p90 | "
                "tcstage / PyTorch (p50) | note |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
ISSUE15_HEADER = ["| case | sizes | tcstage p50 us | PyTorch p50 us | tcstage / PyTorch | "
                  "tcstage achieved | PyTorch achieved | goal | goal met | note |",
                  "|---|---|---:|---:|---:|---|---|---|---|---|"]


def report(title: list[str], paper: list[str], issue15: list[str], selected: list[Bench],
           footer: list[str], halide: list[str] = ()) -> str:
    lines = list(title)
    if paper:
        lines += ["", "## The paper's kernels (fp32, TF32 off; options: "
                  "schedules/paper-manual.txt)", "", *PAPER_HEADER, *paper]
    if issue15:
        lines += ["", "## Reductions, normalisations, half and bfloat16 (issue 15)", "",
                  *ISSUE15_HEADER, *issue15, "", "Baselines and options:", ""]
        lines += [f"- {b.name}: PyTorch `{b.baseline_text}`; tcstage `{b.options}`"
                  for b in selected if b.group == "issue 15"]
    if halide:
        lines += ["", "## Halide's apps (issue 26): tcstage's kernel against the app's own GPU "
                  "schedule, same run (wall clock, synchronised, arrays on the GPU)", "",
                  *HALIDE_HEADER, *halide, "", "tcstage options: `auto` (options=\"auto\"), "
                  "`documented`: each app's GPU_OPTIONS (examples/halide/)"]
    return "\n".join(lines + [""] + footer) + "\n"


@functools.cache
def _define(source: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define(source)


# -- without a GPU ---------------------------------------------------------------------------

def compile_only(selected: list[Bench], out: str | None = None, apps=()) -> int:
    """Compiles every case (TC -> CUDA, then nvcc for sm_90) and prints what ptxas reports:
    registers per thread, spilled bytes (private arrays that stayed in local memory) and static
    shared memory. A case that does not compile is a row saying why; the exit status is then 1."""
    from tcstage.cuda.nvcc import resources
    lines = ["# gpu_bench --compile-only: every case compiled for sm_90, nothing run", "",
             "No GPU was used: the timings, bandwidths and goals of the benchmark are "
             "unmeasured.", "",
             "| case | group | compile s | grid | block | promoted shared bytes | private | "
             "registers | smem bytes (ptxas) | spill bytes (st/ld) | nvcc |",
             "|---|---|---:|---|---|---:|---|---:|---:|---|---|"]
    notes, status = [], 0

    def text() -> str:
        said = ["", "What the compiler said about the options (TCWarnings):", "", *notes] \
            if notes else []
        return "\n".join(lines + said) + "\n"

    def emit(line):
        lines.append(line)
        print(line, flush=True)
        if out:
            Path(out).write_text(text(), encoding="utf-8")

    print("\n".join(lines))
    for b in selected:
        start = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", tc.TCWarning)
                prog = _define(b.source)
                fn = prog[b.function]
                k = tc.compile(prog, b.function, *[s for _, s, _ in shapes(fn, b.sizes)],
                               options=b.options, target="cuda-emulated")
            seconds = time.perf_counter() - start
            promos = k.compiled.promoted.promotions
            shared = sum(p.nbytes for p in promos if p.memory == "shared")
            private = ", ".join(p.buffer + "".join(f"[{d}]" for d in p.padded)
                                for p in promos if p.memory == "private") or "-"
            usage = resources(k.cuda_source)  # raises with nvcc's message if it does not compile
            regs, smem, spills = ("-", "-", "-") if usage is None else (
                usage["registers"], usage["shared"],
                f"{usage['spill_stores']}/{usage['spill_loads']}")
            notes += [f"- {b.name}: {str(w.message).splitlines()[0]}" for w in caught
                      if issubclass(w.category, tc.TCWarning)]
            emit(f"| {b.name} | {b.group} | {seconds:.2f} | {k.grid} | {k.block} | {shared} | "
                 f"{private} | {regs} | {smem} | {spills} | "
                 f"{'no nvcc' if usage is None else 'ok'} |")
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            status = 1
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            emit(f"| {b.name} | {b.group} | | | | | | | | | FAILED: {type(e).__name__}: {first} |")
    for app_name in (a.split("/", 1)[1] for a in apps):  # Halide's apps: both option sets
        import importlib

        import numpy as np
        module = importlib.import_module(f"examples.halide.{app_name}")
        args = module.inputs(np.random.default_rng(0), "bench")
        for label, options in _option_sets(module):
            start = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", tc.TCWarning)
                    k = tc.compile(tc.from_halide(module.build().outputs[0], name=app_name),
                                   *args, output_shape=module.output_shapes(args)[0],
                                   options=options, target="cuda-emulated")
                seconds = time.perf_counter() - start
                usage = resources(k.cuda_source)
                shared = max(p.shared_bytes for p in k.compiled.parts)
                emit(f"| halide/{app_name} ({label}) | halide | {seconds:.2f} | "
                     f"{' '.join(str(p.grid) for p in k.launches)} | {k.block} | {shared} | - | "
                     f"{'-' if usage is None else usage['registers']} | "
                     f"{'-' if usage is None else usage['shared']} | - | "
                     f"{'no nvcc' if usage is None else 'ok'} |")
            except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
                status = 1
                emit(f"| halide/{app_name} ({label}) | halide | | | | | | | | | FAILED: "
                     f"{type(e).__name__}: {str(e).strip()[:200]} |")
    if notes:
        print(text()[len("\n".join(lines)):].rstrip())
    if out:
        Path(out).write_text(text(), encoding="utf-8")
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="about how long to time each side of a case (fewer runs if slow)")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-halide", action="store_true", help="leave Halide's apps out")
    parser.add_argument("--halide-long", action="store_true",
                        help=f"only the Halide apps that take minutes to compile "
                             f"({', '.join(HALIDE_LONG)})")
    args = parser.parse_args(argv)
    benches = all_benches()
    apps = [] if args.no_halide else [f"halide/{a}" for a in HALIDE_APPS]
    if args.halide_long:
        benches, apps = [], [f"halide/{a}" for a in HALIDE_LONG]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        known = apps if args.halide_long or args.no_halide else \
            apps + [f"halide/{a}" for a in HALIDE_LONG]
        unknown = sorted(set(wanted) - {b.name for b in benches} - set(known))
        if unknown:
            parser.error(f"unknown case(s) {', '.join(unknown)}; known: "
                         f"{', '.join([b.name for b in benches] + apps)}")
        benches = [b for b in benches if b.name in wanted]
        apps = [a for a in known if a in wanted]
    if args.compile_only:
        return compile_only(benches, args.out, apps)
    import torch
    if not torch.cuda.is_available():
        print("gpu_bench needs a GPU (torch.cuda.is_available() is False); "
              "--compile-only checks the cases without one", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = gpu_name()
    peak, peak_text = hbm_peak(name)
    title = [f"# tcstage vs PyTorch {torch.__version__} on {name}", "",
             f"Times in us (CUDA events, up to {args.runs} runs or about {args.seconds:g} s per "
             "side after a warm-up); tcstage / PyTorch below 1: tcstage is faster. HBM peak "
             f"used for bandwidth shares: {peak_text}."]
    paper, issue15, status = [], [], 0
    for b in benches:
        row, figures = measure(b, args.runs, args.seconds, peak)
        line = (paper_line if b.group == "paper" else issue15_line)(row, figures)
        (paper if b.group == "paper" else issue15).append(line)
        status |= bool(row.failed or row.wrong)
        print(line, flush=True)
        if args.out:
            Path(args.out).write_text(report(title, paper, issue15, benches, []),
                                      encoding="utf-8")
    def progress(rows):
        if args.out:
            Path(args.out).write_text(report(title, paper, issue15, benches, [], rows),
                                      encoding="utf-8")
    halide = halide_lines(args.runs, args.seconds, apps, progress) if apps else []
    status |= any("FAILED" in line or "WRONG" in line for line in halide)
    text = report(title, paper, issue15, benches, [], halide)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
