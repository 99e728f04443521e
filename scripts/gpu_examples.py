#!/usr/bin/env python3
"""Runs a few generated kernels on the GPU (target="cuda") and checks them against the CPU
path, so that `compute-sanitizer` (memcheck, racecheck) can watch real launches
(benchmarks/gpu_check.sh runs both tools on it):

    compute-sanitizer --tool memcheck python3 scripts/gpu_examples.py
    python3 scripts/gpu_examples.py --target cuda-emulated     # the same without a GPU
    python3 scripts/gpu_examples.py --compile-only             # nvcc only: registers, spills

Kernels: the paper's tmm, tbmm, MLP1, 2LUT (shared and private memory, register tiling, the
two-stage promotion of indirectly read tables), a convolution, the backward TCs of MLP1 and of a
table read (a scatter), one kernel with a dynamic batch size run at two sizes, and issue 15's
kernels: a full sum and a row sum split across threads and blocks (shuffles, shared memory,
atomics), softmax and layernorm as TCs, half and bfloat16 tmm with tensor cores, and a
two-stage stencil as a kernel sequence and as overlapped tiles (each block's intermediate in
shared memory, behind a barrier).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tcstage as tc  # noqa: E402

M = tc.MappingOptions


def example(name: str) -> str:
    return (ROOT / "examples" / f"{name}.tc").read_text()


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


SUMS = """
def full_sum(float(N) A) -> (O) {
  O() +=! A(i)
}
def row_sum(float(R, C) A) -> (O) {
  O(r) +=! A(r, c)
}
"""
BLUR = """
def blur(float(H, W) I) -> (O) {
  B(y, x) = (I(y, x) + I(y, x + 1) + I(y, x + 2)) / 3
  O(y, x) = (B(y, x) + B(y + 1, x) + B(y + 2, x)) / 3
}
"""
TMM_NARROW = """
def tmm_half(half(M,K) A, half(N,K) B) -> (C) {
  C(m,n) +=! A(m,k) * B(n,k)
}
def tmm_bf16(bfloat16(M,K) A, bfloat16(N,K) B) -> (C) {
  C(m,n) +=! A(m,k) * B(n,k)
}
"""
# Relative tolerance against the CPU path by output dtype (times the output's largest magnitude,
# at least 1, for the absolute one): reductions are reassociated across threads, and half
# rounds every partial result.
RTOL = {np.dtype(np.float16): 1e-2, np.dtype(ml_dtypes.bfloat16): 2e-2}


def cases(rng):
    lut_index = rng.integers(0, 100, (16, 20)).astype(np.int32)
    yield "tmm", example("tmm"), "tmm", (f32(rng, 64, 96), f32(rng, 80, 96)), \
        M().tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(4, 4).useSharedMemory(True), ()
    yield "tbmm", example("tbmm"), "tbmm", (f32(rng, 50, 26, 72), f32(rng, 50, 26, 72)), \
        M().tile(1).mapToThreads(26, 7).mapToBlocks(50).usePrivateMemory(True), ()
    yield "MLP1", example("mlp"), "MLP1", (f32(rng, 64, 96), f32(rng, 48, 96), f32(rng, 48)), \
        M().tile(16, 16).mapToThreads(16, 16).useRegisterTiling(True).unroll(4), ()
    yield "2LUT", example("lut"), "2LUT", (f32(rng, 100, 64), lut_index, f32(rng, 100, 64),
                                           lut_index), \
        M().tile(1, 64).mapToThreads(64).mapToBlocks(16).useSharedMemory(True), ()
    yield "conv2d", example("conv"), "conv2d", (f32(rng, 2, 8, 18, 18), f32(rng, 4, 8, 3, 3)), \
        M().tile(1, 1, 8, 8).mapToThreads(8, 8).mapToBlocks(2, 4).useSharedMemory(True), ()
    mlp_grad = tc.gradient(example("mlp"), "MLP1")
    x, w, b = f32(rng, 32, 40), f32(rng, 24, 40), f32(rng, 24)
    y = tc.define(example("mlp")).MLP1(x, w, b)
    yield "MLP1_grad", mlp_grad, "MLP1_grad", (x, w, b, y, f32(rng, *y.shape)), \
        M().tile(8, 8).mapToThreads(8, 8).mapToBlocks(4, 4), ()
    lut_grad = tc.gradient(example("lut"), "1LUT")
    table, out = f32(rng, 100, 64), None
    out = tc.define(example("lut"))["1LUT"](table, lut_index)
    yield "1LUT_grad", lut_grad, "1LUT_grad", (table, lut_index, out, f32(rng, *out.shape)), \
        M().tile(8, 64).mapToThreads(64).mapToBlocks(8), ()
    yield "tmm_dynamic", example("tmm"), "tmm", (f32(rng, 70, 32), f32(rng, 48, 32)), \
        M().tile(16, 16).mapToThreads(16, 16).mapToBlocks(8, 8).useSharedMemory(True), ("M",)
    yield "full_sum", SUMS, "full_sum", (f32(rng, 5000),), \
        M().mapToThreads(128).mapToBlocks(8), ()
    yield "row_sum", SUMS, "row_sum", (f32(rng, 6, 1500),), \
        M().mapToThreads(128).mapToBlocks(6, 4), ()
    rows = M().outerScheduleFusionStrategy("Max").tile(1).mapToThreads(64).mapToBlocks(12) \
        .useSharedMemory(True)
    yield "softmax", example("layers"), "softmax", (f32(rng, 12, 300),), rows, ()
    yield "layernorm", example("layers"), "layernorm", (f32(rng, 12, 300), f32(rng, 300),
                                                        f32(rng, 300)), rows, ()
    stencil = M().tile(16, 32).mapToThreads(32, 8).mapToBlocks(8, 8)
    yield "blur_sequence", BLUR, "blur", (f32(rng, 70, 100),), stencil, ()
    yield "blur_overlapped", BLUR, "blur", (f32(rng, 70, 100),), \
        stencil.overlappedTiles(True), ()
    cores = M().tile(32, 32, 32).mapToThreads(32, 4).mapToBlocks(2, 3).useSharedMemory(True) \
        .useTensorCores(True)
    for name, dtype in (("half", np.float16), ("bf16", ml_dtypes.bfloat16)):
        operands = (rng.standard_normal((64, 96)).astype(dtype),
                    rng.standard_normal((80, 96)).astype(dtype))
        yield f"tmm_{name}_tc", TMM_NARROW, f"tmm_{name}", operands, cores, ()


def close(got, expected) -> bool:
    expected = np.asarray(expected)
    rtol = RTOL.get(expected.dtype, 1e-3)
    scale = max(1.0, float(np.abs(expected.astype(np.float64)).max())) if expected.size else 1.0
    return np.allclose(np.asarray(got, dtype=np.float64), expected.astype(np.float64), rtol=rtol,
                       atol=rtol * scale)


def compile_only(selected) -> int:
    """Compiles each case to CUDA and with nvcc (sm_90), printing what ptxas reports."""
    from tcstage.cuda.nvcc import resources
    failed = 0
    for label, src, name, args, options, dynamic in selected:
        try:
            kernel = tc.compile(tc.define(src), name, *args, options=options,
                                target="cuda-emulated", dynamic=dynamic)
            usage = resources(kernel.cuda_source)
            detail = "no nvcc" if usage is None else \
                f"{usage['registers']} registers, {usage['shared']} bytes shared, spills " \
                f"{usage['spill_stores']}/{usage['spill_loads']}"
            print(f"{label:12s} compiled  grid {kernel.grid} block {kernel.block}: {detail}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            failed += 1
            print(f"{label:12s} FAILED  {type(e).__name__}: {str(e).strip().splitlines()[0]}",
                  flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda", choices=["cuda", "cuda-emulated"])
    ap.add_argument("--compile-only", action="store_true",
                    help="compile each kernel with nvcc and print its resources; run nothing")
    ap.add_argument("--only", help="comma-separated kernel labels")
    opts = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    selected = [c for c in cases(rng) if not opts.only or c[0] in opts.only.split(",")]
    if opts.compile_only:
        return compile_only(selected)
    failed = 0
    for label, src, name, args, options, dynamic in selected:
        try:
            prog = tc.define(src)
            expected = prog[name](*args)
            expected = expected if isinstance(expected, tuple) else (expected,)
            kernel = tc.compile(prog, name, *args, options=options, target=opts.target,
                                dynamic=dynamic)
            got = kernel(*args)
            got = got if isinstance(got, tuple) else (got,)
            ok = all(close(g, e) for g, e in zip(got, expected))
            if dynamic:  # the same kernel at a smaller batch
                small = (args[0][:33], args[1])
                ok &= close(kernel(*small), prog[name](*small))
            verdict = "ok" if ok else "WRONG"
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            ok, verdict = False, f"FAILED  {type(e).__name__}: {str(e).strip().splitlines()[0]}"
        print(f"{label:12s} {verdict}", flush=True)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
