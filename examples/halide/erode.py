"""Erosion: the minimum over a 5x5 window, as a 5-wide minimum along x and then along y, of
an 8-bit planar colour image whose edge pixels repeat outward (Halide's erode app)."""

from __future__ import annotations

import functools

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import SMALL_IMAGE, App, vector_width

BENCH_SIZE = (3, 2560, 1536)  # (C, H, W): planar, so c is Halide's outermost dimension

# tcstage's options for its CUDA kernel (docs/halide.md): overlapped tiles of one channel's
# 32 x 64 outputs
GPU_OPTIONS = (tc.MappingOptions().tile(1, 32, 64).mapToThreads(64, 4).mapToBlocks(4, 1024, 1024)
               .overlappedTiles(True))


def _min_of(values):
    return functools.reduce(hl.min, values)


def build() -> App:
    image = hl.ImageParam(hl.UInt(8), 3, "input")
    x, y, c = hl.Var("x"), hl.Var("y"), hl.Var("c")
    # Clamped coordinates, as the original app writes them. (BoundaryConditions.repeat_edge
    # means the same, but marks its clamps `likely`, and Halide's loop partitioning of 25
    # inlined such reads takes it tens of seconds to compile.)
    edge = hl.Func("edge")
    edge[x, y, c] = image[hl.clamp(x, 0, image.width() - 1), hl.clamp(y, 0, image.height() - 1), c]
    erode_x = hl.Func("erode_x")
    erode_x[x, y, c] = _min_of([edge[x + d, y, c] for d in range(-2, 3)])
    erode_y = hl.Func("erode_y")
    erode_y[x, y, c] = _min_of([erode_x[x, y + d, c] for d in range(-2, 3)])
    return App("erode", [erode_y], [image], {"erode_x": erode_x})


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    shape = (3, *SMALL_IMAGE) if size == "small" else BENCH_SIZE
    return [rng.integers(0, 256, size=shape, dtype=np.uint8)]


def output_shapes(args) -> list[tuple]:
    return [args[0].shape]


def reference(image: np.ndarray) -> list[np.ndarray]:
    padded = np.pad(image, ((0, 0), (2, 2), (2, 2)), mode="edge")
    w, h = image.shape[2], image.shape[1]
    along_x = np.min([padded[:, :, d:d + w] for d in range(5)], axis=0)
    along_y = np.min([along_x[:, d:d + h, :] for d in range(5)], axis=0)
    return [along_y]


def schedule_cpu(app: App) -> None:
    # Both passes over whole images, each in parallel strips of 8 rows, vectorized along x.
    (erode_y,), erode_x = app.outputs, app.stages["erode_x"]
    vec = vector_width(hl.UInt(8))
    for f in (erode_x, erode_y):
        x, y, c = f.args()
        yo, yi = hl.Var("yo"), hl.Var("yi")
        f.compute_root().split(y, yo, yi, 8).parallel(yo).vectorize(x, vec)


def schedule_gpu(app: App) -> None:
    (erode_y,), erode_x = app.outputs, app.stages["erode_x"]
    for f in (erode_x, erode_y):
        x, y, c = f.args()
        xi, yi = hl.Var("xi"), hl.Var("yi")
        f.compute_root().gpu_tile(x, y, xi, yi, 32, 8)
