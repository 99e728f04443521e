#!/usr/bin/env python3
"""CPU benchmark of tcstage against numpy and PyTorch (CPU) on the classic TC kernels.

    python benchmarks/cpu_bench.py [--quick] [--out FILE] [--schedule NAME] [--only K1,K2]

For every kernel row, all in this one process, the script

1. measures the front-end latency of one function: a fresh ``tc.define(source)`` (parse, semantic
   checks, range inference) followed by ``f.lower(*args)`` (building the Halide Funcs); the median
   over several runs, in milliseconds;
2. compiles and runs the tcstage kernel once (the compile time is reported too) and checks every
   output against a numpy reference; the PyTorch result is checked the same way, so that both
   baselines are known to compute the same thing.  A wrong or crashing row is reported with an
   ERROR marker instead of timings;
3. times tcstage, numpy and PyTorch, each as the median of repeated calls after a warm-up call,
   with enough repetitions to fill a time budget per measurement;
4. prints a markdown table (and writes it to ``--out``), with the machine description on top.

Ratios are ``time_tcstage / time_baseline``: below 1 tcstage is faster than the baseline.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the table still comes out, with the torch columns empty
    torch = None
    F = None

import tcstage as tc

# lut1/lut2 warn (once per definition) that their data-dependent subscripts are not bounds
# checked; the inputs here are in range, and the repeated definitions would repeat the warning.
warnings.filterwarnings("ignore", category=tc.TCWarning)

# ---------------------------------------------------------------------------------------------
# TC sources (exactly those of the issue)
# ---------------------------------------------------------------------------------------------

SOURCES = {
    "tmm": "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }",
    "gemm": "def gemm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
    "tbmm": "def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) "
            "{ Z(b,n,k) +=! X(b,n,m) * Y(b,k,m) }",
    "gconv": "def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) "
             "{ O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw) }",
    "lut1": "def lut1(float(E,D) LUT, int(B,L) I) -> (O) { O(i,j) +=! LUT(I(i,k),j) }",
    "lut2": """def lut2(float(E1,D) LUT1, int(B,L1) I1, float(E2,D) LUT2, int(B,L2) I2) -> (O1, O2) {
  O1(i,j) +=! LUT1(I1(i,k),j)
  O2(i,j) +=! LUT2(I2(i,k),j)
}""",
    "mlp1": """def mlp1(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b,n) +=! I(b,m) * W1(n,m)
  O1(b,n) = fmaxf(O1(b,n) + B1(n), 0)
}""",
    "mlp3": """def mlp3(float(B,M) I, float(O,N) W2, float(O) B2, float(P,O) W3, float(P) B3, float(Q,P) W4, float(Q) B4) -> (O2, O3, O4) {
  O2(b,o) +=! I(b,n) * W2(o,n)
  O2(b,o) = fmaxf(O2(b,o) + B2(o), 0)
  O3(b,p) +=! O2(b,o) * W3(p,o)
  O3(b,p) = fmaxf(O3(b,p) + B3(p), 0)
  O4(b,q) +=! O3(b,p) * W4(q,p)
  O4(b,q) = fmaxf(O4(b,q) + B4(q), 0)
}""",
    "maxpool": "def maxpool(float(B,C,H,W) I) -> (O) "
               "{ O(b,c,i,j) max=! I(b,c,2*i+kh,2*j+kw) where kh in 0:2, kw in 0:2 }",
}

# ---------------------------------------------------------------------------------------------
# Kernel cases: inputs, numpy reference, torch baseline
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    kernel: str  # TC function name (key of SOURCES)
    sizes: str  # human-readable sizes for the table
    make_inputs: Callable[[np.random.Generator], tuple]  # numpy inputs, in TC argument order
    numpy_fn: Callable[..., tuple]  # numpy baseline; returns a tuple of outputs
    torch_prep: Callable[..., tuple] | None = None  # numpy inputs -> torch inputs (untimed)
    torch_fn: Callable[..., tuple] | None = None  # torch baseline; returns a tuple of tensors
    notes: list[str] = field(default_factory=list)
    flops: float | None = None  # multiply-adds x 2 of a contraction (for GFLOP/s)


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def _t(*arrays):
    return tuple(torch.from_numpy(a) for a in arrays)


def _tmm_case(M, K, N):
    return Case(
        "tmm", f"M={M} K={K} N={N}",
        lambda r: (_f32(r, M, K), _f32(r, N, K)),
        lambda A, B: (A @ B.T,),
        _t,
        lambda A, B: (torch.matmul(A, B.t()),),
        flops=2.0 * M * K * N,
    )


def _gemm_case(M, K, N):
    return Case(
        "gemm", f"M={M} K={K} N={N}",
        lambda r: (_f32(r, M, K), _f32(r, K, N)),
        lambda A, B: (A @ B,),
        _t,
        lambda A, B: (torch.matmul(A, B),),
        flops=2.0 * M * K * N,
    )


def _tbmm_case(B, N, M, K):
    return Case(
        "tbmm", f"B={B} N={N} M={M} K={K}",
        lambda r: (_f32(r, B, N, M), _f32(r, B, K, M)),
        lambda X, Y: (np.matmul(X, Y.transpose(0, 2, 1)),),
        _t,
        lambda X, Y: (torch.bmm(X, Y.transpose(1, 2)),),
        flops=2.0 * B * N * M * K,
    )


def _gconv_case(N, G, F_, C, H, W, KH=3, KW=3):
    OH, OW = H - KH + 1, W - KW + 1

    def ref(I, W1):
        out = np.zeros((N, G, F_, OH, OW), dtype=np.float32)
        for kh in range(KH):
            for kw in range(KW):
                out += np.einsum("ngchw,gfc->ngfhw", I[:, :, :, kh:kh + OH, kw:kw + OW],
                                 W1[:, :, :, kh, kw], optimize=True)
        return (out,)

    def prep(I, W1):  # grouped conv2d views: (N, G*C, H, W) input, (G*F, C, KH, KW) weights
        return (torch.from_numpy(I).view(N, G * C, H, W),
                torch.from_numpy(W1).view(G * F_, C, KH, KW))

    return Case(
        "gconv", f"N={N} G={G} F={F_} C={C} H=W={H} (in) k=3x3 -> {OH}x{OW}",
        lambda r: (_f32(r, N, G, C, H, W), _f32(r, G, F_, C, KH, KW, scale=0.1)),
        ref, prep,
        lambda I, W1: (F.conv2d(I, W1, groups=G).view(N, G, F_, OH, OW),),
        flops=2.0 * N * G * F_ * C * OH * OW * KH * KW,
    )


def _lut1_case(E, D, L, B):
    def prep(LUT, I):  # embedding_bag wants int64 indices; convert once, outside the timing
        return torch.from_numpy(LUT), torch.from_numpy(I.astype(np.int64))

    return Case(
        "lut1", f"E={E} D={D} L={L} B={B}",
        lambda r: (_f32(r, E, D), r.integers(0, E, (B, L), dtype=np.int32)),
        lambda LUT, I: (LUT[I].sum(axis=1),),
        prep,
        lambda LUT, I: (F.embedding_bag(I, LUT, mode="sum"),),
    )


def _lut2_case(E, D, L, B):
    def prep(LUT1, I1, LUT2, I2):
        return (torch.from_numpy(LUT1), torch.from_numpy(I1.astype(np.int64)),
                torch.from_numpy(LUT2), torch.from_numpy(I2.astype(np.int64)))

    return Case(
        "lut2", f"E1=E2={E} D={D} L1=L2={L} B={B}",
        lambda r: (_f32(r, E, D), r.integers(0, E, (B, L), dtype=np.int32),
                   _f32(r, E, D), r.integers(0, E, (B, L), dtype=np.int32)),
        lambda LUT1, I1, LUT2, I2: (LUT1[I1].sum(axis=1), LUT2[I2].sum(axis=1)),
        prep,
        lambda LUT1, I1, LUT2, I2: (F.embedding_bag(I1, LUT1, mode="sum"),
                                    F.embedding_bag(I2, LUT2, mode="sum")),
    )


def _mlp1_case(B, M, N):
    s = 1.0 / np.sqrt(M)
    return Case(
        "mlp1", f"B={B} M={M} N={N}",
        lambda r: (_f32(r, B, M), _f32(r, N, M, scale=s), _f32(r, N)),
        lambda I, W1, B1: (np.maximum(I @ W1.T + B1, 0),),
        _t,
        lambda I, W1, B1: (torch.relu(F.linear(I, W1, B1)),),
        flops=2.0 * B * M * N,
    )


def _mlp3_case(B, N, O, P, Q):
    def inputs(r):
        return (_f32(r, B, N), _f32(r, O, N, scale=1 / np.sqrt(N)), _f32(r, O),
                _f32(r, P, O, scale=1 / np.sqrt(O)), _f32(r, P),
                _f32(r, Q, P, scale=1 / np.sqrt(P)), _f32(r, Q))

    def ref(I, W2, B2, W3, B3, W4, B4):
        O2 = np.maximum(I @ W2.T + B2, 0)
        O3 = np.maximum(O2 @ W3.T + B3, 0)
        O4 = np.maximum(O3 @ W4.T + B4, 0)
        return O2, O3, O4

    def tref(I, W2, B2, W3, B3, W4, B4):
        O2 = torch.relu(F.linear(I, W2, B2))
        O3 = torch.relu(F.linear(O2, W3, B3))
        O4 = torch.relu(F.linear(O3, W4, B4))
        return O2, O3, O4

    return Case("mlp3", f"B={B} N={N} O={O} P={P} Q={Q}", inputs, ref, _t, tref,
                flops=2.0 * B * (N * O + O * P + P * Q))


def _maxpool_case(B, C, H, W):
    return Case(
        "maxpool", f"B={B} C={C} H={H} W={W} (2x2/2)",
        lambda r: (_f32(r, B, C, H, W),),
        # the maximum of the four strided 2x2 corners: much faster in numpy than
        # I.reshape(B, C, H // 2, 2, W // 2, 2).max(axis=(3, 5)), and the same values
        lambda I: (np.maximum(np.maximum(I[:, :, 0::2, 0::2], I[:, :, 0::2, 1::2]),
                              np.maximum(I[:, :, 1::2, 0::2], I[:, :, 1::2, 1::2])),),
        _t,
        lambda I: (F.max_pool2d(I, 2),),
    )


def all_cases() -> list[Case]:
    return [
        _tmm_case(128, 32, 256),
        _tmm_case(128, 1024, 1024),
        _gemm_case(512, 512, 512),
        _gemm_case(1024, 1024, 1024),
        _tbmm_case(500, 26, 72, 26),
        _gconv_case(32, 32, 16, 16, 16, 16),
        _lut1_case(100000, 64, 50, 128),
        _lut2_case(100000, 64, 50, 128),
        _mlp1_case(128, 512, 256),
        _mlp3_case(128, 512, 256, 128, 64),
        _maxpool_case(32, 64, 56, 56),
    ]


# ---------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def time_phased(fns: dict[str, Callable[[], object]], budget_s: float, min_reps: int,
                max_reps: int, rounds: int = 3, gap_s: float = 0.2
                ) -> dict[str, tuple[float, float, int]]:
    """Times several implementations of one computation: {name: (median s, min s, calls)}.

    Each function first gets one untimed warm-up call and one timed call that sets its
    repetition count (as many calls as fit in `budget_s`, within [min_reps, max_reps]).  The
    calls are then made in `rounds` rounds; in each round every implementation runs its share
    of calls as one block, after a pause of `gap_s` and an untimed warm-up call.

    Blocks rather than call-by-call interleaving, and the pause, because the libraries' thread
    pools get in each other's way: OpenBLAS's workers keep spinning for a while after a numpy
    call, and a Halide kernel run during that time got only one core (mlp1: 2.7 ms instead of
    1.45 ms on 2 cores).  Several rounds, so that a spell of interference from outside hits
    more than one implementation."""
    times: dict[str, list[float]] = {}
    reps: dict[str, int] = {}
    for name, fn in fns.items():
        time.sleep(gap_s)
        fn()
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        times[name] = [first]
        reps[name] = max(min_reps, min(max_reps, int(budget_s / max(first, 1e-7))))
    n_rounds = max(1, min(rounds, min(reps.values()) - 1))
    for r in range(n_rounds):
        for name, fn in fns.items():
            # this round's share of the calls still to be made
            todo = (reps[name] - 1) * (r + 1) // n_rounds - (reps[name] - 1) * r // n_rounds
            time.sleep(gap_s)
            fn()
            for _ in range(todo):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), len(v)) for k, v in times.items()}


def wait_for_quiet(max_load: float, max_wait_s: float, window_s: float = 0.5) -> float | None:
    """Waits until other processes use at most `max_load` of the CPU over a `window_s` window,
    or `max_wait_s` has passed; returns the last window's load."""
    deadline = time.time() + max_wait_s
    while True:
        with ForeignLoad() as load:
            time.sleep(window_s)
        if load.fraction is None or load.fraction <= max_load or time.time() >= deadline:
            return load.fraction


class ForeignLoad:
    """CPU time used by *other* processes while a block runs, as a fraction of all cores
    (busy time of the whole machine from /proc/stat, less this process's own CPU time).  Other
    work on a small machine disturbs the multi-threaded timings; the table reports it."""

    def __init__(self):
        self.fraction: float | None = None

    @staticmethod
    def _machine_busy_s() -> float | None:
        try:
            with open("/proc/stat") as fh:
                fields = [int(x) for x in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self):
        self._busy0, self._own0, self._t0 = self._machine_busy_s(), self._own_s(), time.time()
        return self

    def __exit__(self, *exc):
        busy1, own1, wall = self._machine_busy_s(), self._own_s(), time.time() - self._t0
        if self._busy0 is not None and busy1 is not None and wall > 0.05:
            foreign = (busy1 - self._busy0) - (own1 - self._own0)
            self.fraction = max(0.0, foreign / (wall * (os.cpu_count() or 1)))
        return False


def front_end_ms(kernel: str, args: tuple, runs: int) -> tuple[float, float, float]:
    """Median (define + lower, define, lower) in ms over `runs` fresh definitions."""
    src = SOURCES[kernel]
    getattr(tc.define(src), kernel).lower(*args)  # untimed: first-use costs (imports, caches)
    total, d_only, l_only = [], [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        f = getattr(tc.define(src), kernel)
        t1 = time.perf_counter()
        f.lower(*args)
        t2 = time.perf_counter()
        total.append((t2 - t0) * 1e3)
        d_only.append((t1 - t0) * 1e3)
        l_only.append((t2 - t1) * 1e3)
    return statistics.median(total), statistics.median(d_only), statistics.median(l_only)


def check(name: str, got: tuple, ref: tuple) -> tuple[bool, float, str]:
    """Compares outputs with np.allclose(rtol=1e-3, atol=1e-3 * scale), where scale is the
    largest magnitude of the reference output (at least 1): a sum of K products carries float32
    rounding proportional to the size of its terms, not of its (possibly small) result."""
    if len(got) != len(ref):
        return False, float("nan"), f"{name}: {len(got)} outputs, expected {len(ref)}"
    worst = 0.0
    for k, (g, r) in enumerate(zip(got, ref)):
        g = np.asarray(g)
        if g.shape != r.shape:
            return False, float("nan"), f"{name}: output {k} shape {g.shape}, expected {r.shape}"
        scale = max(1.0, float(np.abs(r).max()) if r.size else 1.0)
        err = float(np.abs(g.astype(np.float64) - r.astype(np.float64)).max()) if r.size else 0.0
        worst = max(worst, err / scale)
        if not np.allclose(g, r, rtol=1e-3, atol=1e-3 * scale):
            return False, worst, (f"{name}: output {k} differs from numpy "
                                  f"(max abs error {err:.3g}, output scale {scale:.3g})")
    return True, worst, ""


# ---------------------------------------------------------------------------------------------
# One row
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    kernel: str
    sizes: str
    front_ms: float | None = None
    define_ms: float | None = None
    lower_ms: float | None = None
    compile_s: float | None = None
    tc_ms: float | None = None
    np_ms: float | None = None
    torch_ms: float | None = None
    tc_min_ms: float | None = None
    np_min_ms: float | None = None
    torch_min_ms: float | None = None
    tc_calls: int | None = None
    foreign_load: float | None = None  # CPU share used by other processes while timing
    retries: int = 0  # timings redone because other processes loaded the machine
    max_rel_err: float | None = None
    alt_ms: float | None = None  # the compared schedule (--compare), median and best
    alt_min_ms: float | None = None
    flops: float | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)


def run_case(case: Case, schedule, budget_s: float, min_reps: int, max_reps: int,
             fe_runs: int, max_load: float = 1.0, retries: int = 0, quiet_wait_s: float = 0.0,
             max_spread: float = 2.0, seed: int = 0, compare=None) -> Row:
    """One table row.  With `max_load` < 1 the timings wait (up to `quiet_wait_s`) for the other
    processes' CPU share to drop to `max_load`, and are redone up to `retries` times when that
    share was higher while they ran, or when some implementation's median was more than
    `max_spread` times its best time."""
    row = Row(case.kernel, case.sizes, flops=case.flops)
    rng = np.random.default_rng(seed)
    args = case.make_inputs(rng)
    kw = {} if schedule == "default" else {"schedule": schedule}

    # 1. front end
    try:
        row.front_ms, row.define_ms, row.lower_ms = front_end_ms(case.kernel, args, fe_runs)
    except Exception as e:  # noqa: BLE001 - a benchmark reports, it does not stop
        row.error = f"front end failed: {type(e).__name__}: {e}"
        return row

    # 2. compile + first run + correctness
    ref = _as_tuple(case.numpy_fn(*args))
    f = getattr(tc.define(SOURCES[case.kernel]), case.kernel)
    try:
        t0 = time.perf_counter()
        got = _as_tuple(f(*args, **kw))
        row.compile_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        row.error = f"tcstage call failed: {type(e).__name__}: {e}"
        row.notes.append(traceback.format_exc(limit=3))
        return row
    ok, row.max_rel_err, msg = check("tcstage", got, ref)
    if not ok:
        row.error = f"WRONG RESULT: {msg}"
        return row

    # 3. timings: blocks of calls per implementation, in rounds (see time_phased)
    fns = {"tc": lambda: f(*args, **kw), "np": lambda: case.numpy_fn(*args)}
    if compare is not None:  # another tcstage schedule, checked and timed beside the default
        alt_ok, _, alt_msg = check(str(compare), _as_tuple(f(*args, schedule=compare)), ref)
        if alt_ok:
            fns["alt"] = lambda: f(*args, schedule=compare)
        else:
            row.notes.append(f"schedule {compare} disagrees with numpy ({alt_msg}); not timed")
    if torch is not None and case.torch_fn is not None:
        targs = case.torch_prep(*args)
        with torch.inference_mode():
            tout = tuple(t.numpy() for t in _as_tuple(case.torch_fn(*targs)))
        tok, _, tmsg = check("torch", tout, ref)
        if tok:
            def run_torch():
                with torch.inference_mode():
                    return case.torch_fn(*targs)
            fns["torch"] = run_torch
        else:  # a baseline that disagrees is not a baseline: keep tcstage's numbers
            row.notes.append(f"torch baseline disagrees with numpy ({tmsg}); not timed")
    for attempt in range(retries + 1):
        if max_load < 1:
            wait_for_quiet(max_load, quiet_wait_s)
        with ForeignLoad() as load:
            res = time_phased(fns, budget_s, min_reps, max_reps)
        row.foreign_load = load.fraction
        # a median far above the best time means the calls were stalled for part of the
        # measurement (seen on small VMs even without other processes: a virtual CPU that is
        # not running holds up every multi-threaded call for several milliseconds)
        spread = max(med / best for med, best, _ in res.values())
        loaded = load.fraction is not None and load.fraction > max_load
        if not loaded and spread <= max_spread:
            break
        if attempt < retries:
            row.retries += 1
    if row.foreign_load is not None and row.foreign_load > max_load and max_load < 1:
        row.notes.append(f"other processes used {100 * row.foreign_load:.0f}% of the CPU while "
                         f"this row was timed (after {row.retries} retries): its times are noisy")
    if spread > max_spread:
        worst = max(res, key=lambda k: res[k][0] / res[k][1])
        row.notes.append(f"unstable timing after {row.retries} retries: the {worst} median is "
                         f"{spread:.1f}x its best time; compare the best-of table")
    row.tc_ms, row.tc_min_ms, row.tc_calls = res["tc"][0] * 1e3, res["tc"][1] * 1e3, res["tc"][2]
    row.np_ms, row.np_min_ms = res["np"][0] * 1e3, res["np"][1] * 1e3
    if "torch" in res:
        row.torch_ms, row.torch_min_ms = res["torch"][0] * 1e3, res["torch"][1] * 1e3
    if "alt" in res:
        row.alt_ms, row.alt_min_ms = res["alt"][0] * 1e3, res["alt"][1] * 1e3
    return row


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def machine_description() -> list[str]:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        from importlib.metadata import version
        hl_ver = version("halide")
    except Exception:  # noqa: BLE001 - only for the header
        hl_ver = "?"
    lines = [
        f"- CPU: `lscpu` model name: {model or 'unknown'}; `platform.processor()`: "
        f"{platform.processor() or 'unknown'}; machine: {platform.machine()}",
        f"- cores: os.cpu_count() = {os.cpu_count()}, usable by this process = {usable}",
        f"- OS: {platform.platform()}; Python {platform.python_version()}",
        f"- numpy {np.__version__}; torch {torch.__version__ if torch else 'not installed'}"
        f" (threads: {torch.get_num_threads() if torch else '-'}); halide {hl_ver}; "
        f"tcstage {tc.__version__}{_git_revision()}",
    ]
    return lines


def _git_revision() -> str:
    """' (git abc1234)', with '+changes' when tcstage's sources differ from that commit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(tc.__file__)))
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "tcstage"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (git {rev}{'+changes' if dirty else ''})" if rev else ""


def _fmt(x, digits=3):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}" if x < 1 else f"{x:.2f}"


def _ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def render(rows: list[Row], header: list[str], schedule_label: str, compare=None) -> str:
    out = list(header)
    out.append("")
    out.append(f"tcstage schedule: {schedule_label}. Times are medians, in milliseconds. "
               "Ratios are time_tcstage / time_baseline (< 1: tcstage is faster).")
    out.append("")
    out.append("| kernel | sizes | front end ms (define+lower) | compile s | tcstage ms | "
               "numpy ms | torch ms | tcstage/numpy | tcstage/torch |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fe = "-" if r.front_ms is None else (
            f"{r.front_ms:.1f} ({r.define_ms:.1f}+{r.lower_ms:.1f})")
        if r.error:
            out.append(f"| {r.kernel} | {r.sizes} | {fe} | {_fmt(r.compile_s)} | "
                       f"**ERROR** | - | - | - | - |")
        else:
            out.append(f"| {r.kernel} | {r.sizes} | {fe} | {_fmt(r.compile_s)} | "
                       f"{_fmt(r.tc_ms)} | {_fmt(r.np_ms)} | {_fmt(r.torch_ms)} | "
                       f"{_ratio(r.tc_ms, r.np_ms)} | {_ratio(r.tc_ms, r.torch_ms)} |")
    out.append("")
    out.append("Best-of times (the minimum instead of the median: less sensitive to other work on "
               "the machine), the CPU share other processes used while the row was timed, and the "
               "largest error of tcstage against numpy relative to the output's magnitude:")
    out.append("")
    out.append("| kernel | sizes | tcstage min ms | numpy min ms | torch min ms | "
               "tcstage/numpy (min) | tcstage/torch (min) | other load | tcstage calls | "
               "max rel err |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.error:
            continue
        load = "-" if r.foreign_load is None else f"{100 * r.foreign_load:.0f}%"
        if r.retries:
            load += f" ({r.retries} retr{'y' if r.retries == 1 else 'ies'})"
        err = "-" if r.max_rel_err is None else f"{r.max_rel_err:.1e}"
        out.append(f"| {r.kernel} | {r.sizes} | {_fmt(r.tc_min_ms)} | {_fmt(r.np_min_ms)} | "
                   f"{_fmt(r.torch_min_ms)} | {_ratio(r.tc_min_ms, r.np_min_ms)} | "
                   f"{_ratio(r.tc_min_ms, r.torch_min_ms)} | {load} | {r.tc_calls} | {err} |")
    if compare is not None:
        out.append("")
        out.append(f"The default schedule against tcstage's {compare} schedule, timed in the same "
                   "blocks (medians, ms; < 1: the default is faster):")
        out.append("")
        out.append(f"| kernel | sizes | default ms | {compare} ms | default/{compare} |")
        out.append("|---|---|---|---|---|")
        for r in rows:
            if not r.error:
                out.append(f"| {r.kernel} | {r.sizes} | {_fmt(r.tc_ms)} | {_fmt(r.alt_ms)} | "
                           f"{_ratio(r.tc_ms, r.alt_ms)} |")
    flops = [r for r in rows if r.flops and not r.error]
    if flops:
        out.append("")
        out.append("Arithmetic rate of the contractions (2 x multiply-adds / best time):")
        out.append("")
        out.append("| kernel | sizes | tcstage GFLOP/s | torch GFLOP/s |")
        out.append("|---|---|---|---|")
        for r in flops:
            rate = ["-" if t is None else f"{r.flops / (t * 1e-3) / 1e9:.0f}"
                    for t in (r.tc_min_ms, r.torch_min_ms)]
            out.append(f"| {r.kernel} | {r.sizes} | {rate[0]} | {rate[1]} |")
    problems = [r for r in rows if r.error or r.notes]
    if problems:
        out.append("")
        out.append("Errors and notes:")
        out.append("")
        for r in problems:
            if r.error:
                out.append(f"- **{r.kernel} ({r.sizes})**: {r.error}")
            for n in r.notes:
                if not n.startswith("Traceback"):
                    out.append(f"- {r.kernel} ({r.sizes}): {n}")
    fes = [r.front_ms for r in rows if r.front_ms is not None]
    if fes:
        out.append("")
        out.append(f"Front end: max {max(fes):.1f} ms, median {statistics.median(fes):.1f} ms per "
                   "function (target: < 20 ms).")
    return "\n".join(out) + "\n"


def warm_up_libraries(seconds: float = 1.0) -> None:
    """Runs numpy's and torch's thread pools for a while before the first row.

    On a 2-core VM the first torch calls of a process, made while OpenBLAS's worker threads
    still spin after a numpy call, were seen to take ~16 ms each for a few hundred ms (the
    OpenMP worker waits for a core); the first table row then measured that instead of torch."""
    a = np.ones((256, 256), dtype=np.float32)
    end = time.perf_counter() + seconds
    ta = torch.from_numpy(a) if torch is not None else None
    while time.perf_counter() < end:
        a @ a
        if ta is not None:
            with torch.inference_mode():
                torch.matmul(ta, ta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="short time budget per measurement and fewer front-end runs")
    ap.add_argument("--out", metavar="FILE", help="also write the markdown table to FILE")
    ap.add_argument("--schedule", default="default",
                    help="tcstage CPU schedule: default (the library's default), tcstage, a "
                         "'CpuSchedule()...' chain, Mullapudi2016, Adams2019, Li2018 or none")
    ap.add_argument("--compare", metavar="SCHEDULE", default=None,
                    help="also time tcstage with this schedule (e.g. Mullapudi2016) in the same "
                         "blocks, in its own table")
    ap.add_argument("--only", metavar="K1,K2",
                    help="run only these kernels (comma-separated TC function names)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds per measurement (default 0.5, or 0.1 with --quick)")
    ap.add_argument("--max-load", type=float, default=0.10,
                    help="largest CPU share (0-1) other processes may use while a row is timed; "
                         "above it the timing waits for quiet and is redone (default 0.10; "
                         "1 disables the check)")
    ap.add_argument("--retries", type=int, default=3,
                    help="how often a row's timing is redone under load (default 3)")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="seconds to wait at most for the machine to become quiet before "
                         "timing a row (default 30)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    opts = ap.parse_args(argv)

    schedule = opts.schedule
    if schedule.lower() == "none":
        schedule = None
    budget = opts.budget if opts.budget is not None else (0.1 if opts.quick else 0.5)
    min_reps, max_reps = (3, 200) if opts.quick else (5, 2000)
    fe_runs = 5 if opts.quick else 20
    if torch is not None:
        torch.set_num_threads(opts.threads)

    cases = all_cases()
    if opts.only:
        wanted = {k.strip() for k in opts.only.split(",")}
        cases = [c for c in cases if c.kernel in wanted]

    header = ["# tcstage CPU benchmark", ""]
    header += machine_description()
    header.append(f"- run: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, "
                  f"{'quick' if opts.quick else 'full'} mode, {budget:g} s per measurement "
                  f"({min_reps}-{max_reps} repetitions, in 3 rounds of blocks), front end median "
                  f"of {fe_runs} runs; rows timed again (up to {opts.retries}x) when other processes used "
                  f"more than {100 * opts.max_load:.0f}% of the CPU or a median was over 2x "
                  f"its best time")
    label = ("library default (" + _default_schedule() + ")") if schedule == "default" \
        else str(schedule)

    warm_up_libraries()
    rows = []
    start = time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        print(f"[{time.perf_counter() - start:7.1f}s] {case.kernel} {case.sizes} ...",
              file=sys.stderr, flush=True)
        row = run_case(case, schedule, budget, min_reps, max_reps, fe_runs,
                       opts.max_load, opts.retries, opts.quiet_wait, compare=opts.compare)
        rows.append(row)
        status = row.error or (f"tcstage {_fmt(row.tc_ms)} ms, numpy {_fmt(row.np_ms)} ms, "
                               f"torch {_fmt(row.torch_ms)} ms")
        print(f"          -> {status} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr,
              flush=True)
        for n in row.notes:
            print("          " + n.replace("\n", "\n          "), file=sys.stderr)
    header.append(f"- total benchmark time: {time.perf_counter() - start:.0f} s")

    text = render(rows, header, label, opts.compare)
    print(text)
    if opts.out:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        with open(opts.out, "w") as fh:
            fh.write(text)
    return 1 if any(r.error for r in rows) else 0


def _default_schedule() -> str:
    try:
        from tcstage.halide.jit import DEFAULT_SCHEDULE
        return str(DEFAULT_SCHEDULE)
    except ImportError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
