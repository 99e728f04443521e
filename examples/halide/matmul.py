"""Matrix multiply C = A @ B in float32 (from Halide's cuda_mat_mul app, which has only a GPU
schedule; the CPU schedule here is a register-blocked one in the same spirit).

In Halide's terms (x innermost): prod(x, y) = sum over r of A(r, y) * B(x, r), with A of
numpy shape (M, K), B (K, N) and the output (M, N)."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import App, float_tolerance, vector_width

BENCH_SIZE = 1024  # the app's square size

# tcstage's options for its CUDA kernel (docs/halide.md): 32 x 64 output tiles, k in steps of
# 32 through shared memory, each thread's 2 x 8 outputs in registers (register tiling)
GPU_OPTIONS = (tc.MappingOptions().tile(32, 64, 32).mapToThreads(8, 16).mapToBlocks(32, 16)
               .useSharedMemory(True).usePrivateMemory(True).useRegisterTiling(True).unroll(16))


def build() -> App:
    A = hl.ImageParam(hl.Float(32), 2, "A")
    B = hl.ImageParam(hl.Float(32), 2, "B")
    x, y = hl.Var("x"), hl.Var("y")
    r = hl.RDom([(0, A.width())])
    prod = hl.Func("prod")
    prod[x, y] = hl.f32(0)
    prod[x, y] += A[r.x, y] * B[x, r.x]
    out = hl.Func("out")
    out[x, y] = prod[x, y]
    return App("matmul", [out], [A, B], {"prod": prod})


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    m, k, n = (24, 20, 64) if size == "small" else (BENCH_SIZE,) * 3
    return [rng.standard_normal((m, k), dtype=np.float32),
            rng.standard_normal((k, n), dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    return [(args[0].shape[0], args[1].shape[1])]


def reference(A: np.ndarray, B: np.ndarray) -> list[np.ndarray]:
    return [(A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)]


def tolerance(args) -> float:
    A, B = args
    return float_tolerance(A.shape[1], float(np.abs(A).max() * np.abs(B).max()))


def schedule_cpu(app: App) -> None:
    # Tiles of 2 vectors by 8 rows of the output accumulate in registers (16 accumulators)
    # while r runs innermost; row blocks of tiles run in parallel.
    (out,), prod = app.outputs, app.stages["prod"]
    x, y = out.args()
    xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
    vec = vector_width(hl.Float(32))
    out.tile(x, y, xo, yo, xi, yi, 2 * vec, 8).parallel(yo).vectorize(xi, vec).unroll(xi)
    px, py = prod.args()
    prod.compute_at(out, xo).vectorize(px, vec).unroll(px).unroll(py)
    r = prod.rvars(0)[0]
    prod.update().reorder(px, py, r).vectorize(px, vec).unroll(px).unroll(py)


def schedule_gpu(app: App) -> None:
    # As the original: 64x16 tiles per block, each thread a 4x8 block of outputs held in
    # registers, with the rows of A and B it reads staged per step of r.
    (out,), prod = app.outputs, app.stages["prod"]
    A, B = app.params
    x, y = out.args()
    xi, yi, xii, yii = hl.Var("xi"), hl.Var("yi"), hl.Var("xii"), hl.Var("yii")
    (out.tile(x, y, xi, yi, 64, 16).tile(xi, yi, xii, yii, 4, 8)
     .gpu_blocks(x, y).gpu_threads(xi, yi).unroll(xii).unroll(yii))
    px, py = prod.args()
    r = prod.rvars(0)[0]
    prod.compute_at(out, xi).vectorize(px).unroll(py)
    prod.update().reorder(px, py, r).vectorize(px).unroll(py).unroll(r, 8)
    for staged in (A.in_(), B.in_()):
        a0, a1 = staged.args()
        staged.compute_at(prod, r).vectorize(a0).unroll(a1)
