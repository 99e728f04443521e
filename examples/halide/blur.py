"""3x3 box blur, separable, with the edge pixels repeated outward (Halide's blur app).

The window here is centred (x-1..x+1) where the original reads x..x+2, so the boundary
condition is exercised on both sides; the output keeps the input's size. uint16 in and out,
valid for images of at most 14 bits (three of them are summed in uint16)."""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App, vector_width

BENCH_SIZE = (2560, 1536)  # (H, W): the Halide apps' usual test image

# tcstage's options for its CUDA kernel (docs/halide.md): overlapped tiles of 32 x 64 outputs,
# each block computing the rows of blur_x its tile needs in shared memory
GPU_OPTIONS = (tc.MappingOptions().tile(32, 64).mapToThreads(64, 4).mapToBlocks(1024, 1024)
               .overlappedTiles(True))


def build() -> App:
    image = hl.ImageParam(hl.UInt(16), 2, "input")
    x, y = hl.Var("x"), hl.Var("y")
    edge = hl.BoundaryConditions.repeat_edge(image)
    blur_x = hl.Func("blur_x")
    blur_x[x, y] = (edge[x - 1, y] + edge[x, y] + edge[x + 1, y]) // 3
    blur_y = hl.Func("blur_y")
    blur_y[x, y] = (blur_x[x, y - 1] + blur_x[x, y] + blur_x[x, y + 1]) // 3
    return App("blur", [blur_y], [image], {"blur_x": blur_x})


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = SMALL_IMAGE if size == "small" else BENCH_SIZE
    return [rng.integers(0, 1 << 14, size=shape, dtype=np.uint16)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray) -> list[np.ndarray]:
    padded = np.pad(image.astype(np.int64), 1, mode="edge")
    horizontal = (padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) // 3
    vertical = (horizontal[:-2] + horizontal[1:-1] + horizontal[2:]) // 3
    return [vertical.astype(np.uint16)]


def schedule_cpu(app: App) -> None:
    # Strips of 32 rows run in parallel; within a strip blur_x is kept in a rolling buffer of
    # three rows (stored per strip, computed per output vector), so each row is blurred once.
    (blur_y,), blur_x = app.outputs, app.stages["blur_x"]
    x, y = blur_y.args()
    yi = hl.Var("yi")
    vec = vector_width(hl.UInt(16))
    blur_y.split(y, y, yi, 32).parallel(y).vectorize(x, vec)
    blur_x.store_at(blur_y, y).compute_at(blur_y, x).vectorize(blur_x.args()[0], vec)


def schedule_gpu(app: App) -> None:
    # Each thread computes a column of 8 outputs, two lanes wide, so the rows of blur_x it
    # needs are reused between consecutive outputs rather than recomputed (inlined).
    (blur_y,) = app.outputs
    x, y = blur_y.args()
    xi, yi, y_inner = hl.Var("xi"), hl.Var("yi"), hl.Var("y_inner")
    (blur_y.vectorize(x, 2).split(y, y, y_inner, 8).reorder(y_inner, x).unroll(y_inner)
     .gpu_tile(x, y, xi, yi, 32, 1))
