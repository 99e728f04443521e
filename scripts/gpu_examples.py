#!/usr/bin/env python3
"""Runs a few generated kernels on the GPU (target="cuda") and checks them against the CPU
path, so that `compute-sanitizer` (memcheck, racecheck) can watch real launches:

    compute-sanitizer --tool memcheck python3 scripts/gpu_examples.py
    python3 scripts/gpu_examples.py --target cuda-emulated     # the same without a GPU

Kernels: the paper's tmm, tbmm, MLP1, 2LUT (shared and private memory, register tiling, the
two-stage promotion of indirectly read tables), a convolution, the backward TCs of MLP1 and of a
table read (a scatter), and one kernel with a dynamic batch size run at two sizes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tcstage as tc  # noqa: E402

M = tc.MappingOptions


def example(name: str) -> str:
    return (ROOT / "examples" / f"{name}.tc").read_text()


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda", choices=["cuda", "cuda-emulated"])
    target = ap.parse_args(argv).target
    rng = np.random.default_rng(0)
    failed = 0
    for label, src, name, args, options, dynamic in cases(rng):
        prog = tc.define(src)
        expected = prog[name](*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        kernel = tc.compile(prog, name, *args, options=options, target=target, dynamic=dynamic)
        got = kernel(*args)
        got = got if isinstance(got, tuple) else (got,)
        ok = all(np.allclose(np.asarray(g), e, rtol=1e-3, atol=1e-3) for g, e in zip(got, expected))
        if dynamic:  # the same kernel at a smaller batch
            small = (args[0][:33], args[1])
            ok &= np.allclose(np.asarray(kernel(*small)), prog[name](*small), rtol=1e-3, atol=1e-3)
        print(f"{label:12s} {'ok' if ok else 'WRONG'}", flush=True)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
