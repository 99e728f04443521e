"""A convolution layer, 3x3 filter over all input channels, with bias and relu (Halide's
conv_layer app), float32.

Halide's dimensions, innermost first, and the numpy shapes they make:
  input(ci, x, y, n)   -> (N, H + 2, W + 2, CI)   (NHWC, unpadded: the output shrinks by 2)
  filter(co, kx, ky, ci) -> (CI, 3, 3, CO), indexed [ci, ky, kx, co]
  bias(co)             -> (CO,)
  relu(co, x, y, n)    -> (N, H, W, CO)
Arguments come in Halide's order (infer_arguments: buffers by name): bias, filter, input.
"""

from __future__ import annotations

import halide as hl
import numpy as np

import tcstage as tc
from examples.halide.common import App, float_tolerance, vector_width

BENCH_SIZES = dict(N=5, CI=128, CO=128, W=100, H=80)  # the app's own

# tcstage's options for its CUDA kernel (docs/halide.md): a block per 8 x 32 (x, co) tile of
# one row, its operands' tiles in shared memory and each thread's outputs in registers
GPU_OPTIONS = (tc.MappingOptions().tile(1, 1, 8, 32).mapToThreads(32, 8).mapToBlocks(5, 80, 13)
               .unroll(4).useSharedMemory(True).usePrivateMemory(True))

SMALL_SIZES = dict(N=2, CI=4, CO=64, W=6, H=5)


def build() -> App:
    image = hl.ImageParam(hl.Float(32), 4, "input")
    weights = hl.ImageParam(hl.Float(32), 4, "filter")
    bias = hl.ImageParam(hl.Float(32), 1, "bias")
    c, x, y, n = hl.Var("c"), hl.Var("x"), hl.Var("y"), hl.Var("n")
    # r.x: input channel, r.y and r.z: the filter's column and row
    r = hl.RDom([(0, image.dim(0).extent()), (0, 3), (0, 3)])
    conv = hl.Func("conv")
    conv[c, x, y, n] = bias[c]
    conv[c, x, y, n] += weights[c, r.y, r.z, r.x] * image[r.x, x + r.y, y + r.z, n]
    relu = hl.Func("relu")
    relu[c, x, y, n] = hl.max(0, conv[c, x, y, n])
    return App("conv_layer", [relu], [bias, weights, image], {"conv": conv})


def inputs(rng: np.random.Generator, size: str = "small") -> list:
    s = SMALL_SIZES if size == "small" else BENCH_SIZES
    return [rng.standard_normal((s["CO"],), dtype=np.float32),
            rng.standard_normal((s["CI"], 3, 3, s["CO"]), dtype=np.float32),
            rng.standard_normal((s["N"], s["H"] + 2, s["W"] + 2, s["CI"]), dtype=np.float32)]


def output_shapes(args) -> list[tuple]:
    _, weights, image = args
    n, hp, wp, _ = image.shape
    return [(n, hp - 2, wp - 2, weights.shape[3])]


def reference(bias: np.ndarray, weights: np.ndarray, image: np.ndarray) -> list[np.ndarray]:
    n, hp, wp, _ = image.shape
    h, w = hp - 2, wp - 2
    out = np.broadcast_to(bias.astype(np.float64), (n, h, w, bias.shape[0])).copy()
    for ky in range(3):
        for kx in range(3):
            window = image[:, ky:ky + h, kx:kx + w, :].astype(np.float64)
            out += np.einsum("nhwi,io->nhwo", window, weights[:, ky, kx, :].astype(np.float64))
    return [np.maximum(out, 0).astype(np.float32)]


def tolerance(args) -> float:
    bias, weights, image = args
    terms = 9 * image.shape[3] + 1
    return float_tolerance(terms, float(np.abs(image).max() * np.abs(weights).max() + np.abs(bias).max()))


def schedule_cpu(app: App) -> None:
    # The original's: an output block of tile_w vectors of channels by tile_h columns is
    # accumulated in registers while the reduction runs over all input channels and the 3x3
    # window; the filter's vectors for one input channel are staged, and the inputs broadcast.
    (relu,), conv = app.outputs, app.stages["conv"]
    _, weights, image = app.params
    target = hl.get_host_target()
    vec = vector_width(hl.Float(32))
    if target.has_feature(hl.TargetFeature.AVX512_Skylake) or (
            target.arch == hl.TargetArch.ARM and target.bits == 64):
        tile_w, tile_h = 4, 5  # 32 registers: 20 accumulators
    elif target.arch == hl.TargetArch.X86:
        tile_w, tile_h = 3, 4  # 16 registers: 12 accumulators
    else:
        tile_w, tile_h = 2, 4
    c, x, y, n = relu.args()
    co, ci, xo, xi = hl.Var("co"), hl.Var("ci"), hl.Var("xo"), hl.Var("xi")
    (relu.split(c, co, ci, vec * tile_w).split(x, xo, xi, tile_h)
     .reorder(ci, xi, xo, y, n, co)
     .vectorize(ci, vec).unroll(ci).unroll(xi)
     .parallel(y).parallel(n).parallel(co))
    cc, cx, cy, cn = conv.args()
    r_ci, r_kx, r_ky = conv.rvars(0)
    conv.compute_at(relu, xo).vectorize(cc, vec).unroll(cc).unroll(cx).unroll(cy)
    (conv.update().reorder(cc, cx, cy, r_ci, r_kx, r_ky, cn)
     .vectorize(cc, vec).unroll(cc).unroll(cx).unroll(cy).unroll(r_ci, 2))
    staged_filter = weights.in_()
    f0, _, _, f3 = staged_filter.args()
    staged_filter.compute_at(conv, r_ci).vectorize(f0, vec).unroll(f0).unroll(f3)
    staged_input = image.in_()
    staged_input.compute_at(conv, cx).unroll(staged_input.args()[0])


def schedule_gpu(app: App) -> None:
    # The original's CUDA schedule: each warp computes 32 output channels (one per lane) of a
    # 5x5 block of pixels in registers, stepping over the input channels 16 at a time.
    (relu,), conv = app.outputs, app.stages["conv"]
    image = app.params[2]
    c, x, y, n = relu.args()
    xo, xi, yo, yi, co, ci, t = (hl.Var(s) for s in ("xo", "xi", "yo", "yi", "co", "ci", "t"))
    (relu.compute_root().split(x, xo, xi, 5).split(y, yo, yi, 5).split(c, co, ci, 32)
     .reorder(xi, yi, ci, xo, yo, co, n).gpu_lanes(ci).unroll(xi).unroll(yi)
     .fuse(co, n, t).gpu_blocks(xo, yo, t))
    cc, cx, cy, cn = conv.args()
    r_ci, r_kx, r_ky = conv.rvars(0)
    rxo, rxi, rxii = hl.RVar("rxo"), hl.RVar("rxi"), hl.RVar("rxii")
    (conv.compute_at(relu, xo).store_in(hl.MemoryType.Register).gpu_lanes(cc).unroll(cx).unroll(cy)
     .update().split(r_ci, rxo, rxi, 16).split(rxi, rxi, rxii, 2)
     .reorder(cc, rxii, cx, cy, r_kx, r_ky, rxi, rxo)
     .gpu_lanes(cc).unroll(cx).unroll(cy).unroll(r_kx).unroll(r_ky).unroll(rxii))
    staged = image.in_()
    s0, s1, s2, _ = staged.args()
    so, si, st = hl.Var("so"), hl.Var("si"), hl.Var("st")
    # (its 16 channels bounded: the original compiles for fixed sizes, and without a known
    # extent Halide's bounds of the fused lane's row go negative, so the pipeline asks for the
    # input at x = -31 and stops, as it did on an H200)
    (staged.compute_at(conv, rxo).bound_extent(s0, 16).vectorize(s0, 2).split(s1, so, si, 4)
     .fuse(s0, si, st)
     .gpu_lanes(st).unroll(so).unroll(s2))
