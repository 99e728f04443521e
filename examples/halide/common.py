"""What every ported Halide app shares: the App record, binding and realizing with Halide, and
the small helpers the apps' schedules and numpy references use.

Layout: numpy arrays are row-major, Halide lists dimensions innermost first, so a numpy array
of shape (H, W) is the Halide buffer with x in [0, W) and y in [0, H); `hl.Buffer(ndarray)`
reverses the axes itself (reverse_axes=True), and so does every conversion here.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import halide as hl
import numpy as np


@attrs.frozen
class App:
    """One Halide pipeline, built afresh: its outputs, its parameters in the order a caller
    passes arguments (that of `hl.Pipeline(outputs).infer_arguments()`), and its inner Funcs
    by name, which the schedules reach for."""
    name: str
    outputs: list
    params: list
    stages: dict = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        inferred = [a.name for a in hl.Pipeline(self.outputs).infer_arguments()]
        ours = [p.name() for p in self.params]
        assert ours == inferred, f"{self.name}: params {ours} != infer_arguments {inferred}"


_NUMPY_TYPES = {
    (hl.TypeCode.UInt, 8): np.uint8, (hl.TypeCode.UInt, 16): np.uint16,
    (hl.TypeCode.UInt, 32): np.uint32, (hl.TypeCode.Int, 8): np.int8,
    (hl.TypeCode.Int, 16): np.int16, (hl.TypeCode.Int, 32): np.int32,
    (hl.TypeCode.Float, 32): np.float32, (hl.TypeCode.Float, 64): np.float64,
}


def numpy_type(t: hl.Type) -> type:
    return _NUMPY_TYPES[(t.code(), t.bits())]


def bind(app: App, args: Sequence) -> list:
    """Set each parameter of the app to its argument; returns the Buffers, which must outlive
    the run (they view the arrays' memory)."""
    assert len(args) == len(app.params), f"{app.name}: {len(app.params)} arguments, got {len(args)}"
    keep = []
    for p, a in zip(app.params, args):
        if isinstance(p, hl.ImageParam):
            a = np.ascontiguousarray(a, dtype=numpy_type(p.type()))
            assert a.ndim == p.dimensions(), f"{p.name()}: rank {p.dimensions()}, got {a.ndim}"
            keep.append(hl.Buffer(a))
            p.set(keep[-1])
        else:
            p.set(a)
    return keep


def output_buffers(app: App, output_shapes: Sequence[tuple]) -> tuple[list, list]:
    """Fresh numpy outputs of the given row-major shapes and the Halide Buffers viewing them."""
    arrays = [np.empty(shape, dtype=numpy_type(f.type())) for f, shape in zip(app.outputs, output_shapes)]
    return arrays, [hl.Buffer(a) for a in arrays]


def realize(app: App, args: Sequence, output_shapes: Sequence[tuple]) -> list[np.ndarray]:
    """Halide's own result of the app (as scheduled now) for these arguments, as numpy arrays."""
    keep = bind(app, args)
    arrays, buffers = output_buffers(app, output_shapes)
    hl.Pipeline(app.outputs).realize(buffers)
    del keep
    return arrays


def compute_root_all(app: App) -> None:
    """Compute every inner stage over its whole region before its consumers: the schedule the
    pyramid apps need to be realizable at all (inlined, each level would recompute the whole
    pyramid below it for every point, exponentially in the depth)."""
    for f in app.stages.values():
        f.compute_root()


# (H, W) of the tests' images: the manual schedules, like the originals, split an output's
# loops into whole vectors (64 lanes of uint8 here) and strips of rows (up to 32), and Halide
# needs the output to hold at least one of each (a guarded tail compiles several times slower).
SMALL_IMAGE = (40, 64)


def vector_width(t: hl.Type) -> int:
    """Lanes of the host's natural vector for this type (the generators' natural_vector_size)."""
    return hl.get_host_target().natural_vector_size(t)


# numpy helpers for the references


def clamped_rows_cols(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """a[rows, cols] (outer product of the index vectors) with indices clamped into a: Halide's
    repeat_edge boundary condition over the first two axes."""
    r = np.clip(rows, 0, a.shape[0] - 1)
    c = np.clip(cols, 0, a.shape[1] - 1)
    return a[np.ix_(r, c)]


def float_tolerance(terms: int, magnitude: float = 1.0) -> float:
    """Absolute tolerance of a float32 result summing `terms` terms of size `magnitude` in an
    order that may differ from the reference's (each addition may round by half an ulp)."""
    return 4 * terms * magnitude * float(np.finfo(np.float32).eps)
