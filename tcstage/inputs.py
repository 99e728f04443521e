"""Arguments for a TC function at given sizes: shapes for shape-only calls and random values
for runs (the CLI's `run`, the autotuner's tuning inputs, the benchmarks)."""

from __future__ import annotations

import numpy as np

from tcstage.lang import checked as C


def is_shape(a) -> bool:
    """Whether a call argument is a shape tuple standing in for an array."""
    return isinstance(a, tuple) and all(isinstance(d, (int, np.integer)) for d in a)


def call_shapes(fn: C.Function, sizes: dict) -> tuple[list, list]:
    """Arguments for shape-only calls (output_shapes, ranges, compile): input shapes and scalar
    values, and the shapes of the in/out outputs."""
    def shape(t: C.Tensor) -> tuple[int, ...]:
        return tuple(int(d) if d.isdigit() else sizes[d] for d in t.dims)
    inputs = [shape(t) if t.rank else sizes[t.name] for t in fn.caller_inputs]
    return inputs, [shape(fn.tensors[n]) for n in fn.outputs if fn.tensors[n].inout]


def as_out(outs: list):
    """The out= argument for a list of in/out arrays: None, one, or a tuple. (Shapes always go
    as a tuple: a lone shape tuple would read as one shape per output.)"""
    return (tuple(outs) if len(outs) > 1 else outs[0]) if outs else None


def random_inputs(fn: C.Function, sizes: dict, seed: int) -> tuple[list, list]:
    """Random arguments for fn at complete `sizes`: (inputs, out= arrays). Integer tensors read
    inside subscripts hold indices within the extent they index."""
    rng = np.random.default_rng(seed)
    bounds = index_bounds(fn, lambda d: int(d) if d.isdigit() else sizes[d])
    inputs, out_shapes = call_shapes(fn, sizes)
    args = [_random_tensor(rng, t.type, s, bounds.get(t.name)) if t.rank else s
            for t, s in zip(fn.caller_inputs, inputs)]
    inouts = [fn.tensors[n] for n in fn.outputs if fn.tensors[n].inout]
    return args, [_random_tensor(rng, t.type, s, None) for t, s in zip(inouts, out_shapes)]


def index_bounds(fn: C.Function, size) -> dict[str, int]:
    """For integer inputs used inside subscripts: the smallest extent they index."""
    bounds: dict[str, int] = {}
    for st in fn.statements:
        for r in (n for n in C.walk(st.rhs) if isinstance(n, C.Read)):
            target = fn.tensors.get(r.tensor)
            if target is None or target.kind != "input":
                continue
            for k, arg in enumerate(r.args):
                for inner in (n for n in C.walk(arg) if isinstance(n, C.Read)):
                    extent = size(target.dims[k])
                    bounds[inner.tensor] = min(bounds.get(inner.tensor, extent), extent)
    return bounds


def _random_tensor(rng, t, shape, index_bound):
    """Values drawn directly in the tensor's type: no float64 array twice the size first."""
    if t.is_float:
        direct = t.numpy in (np.float32, np.float64)
        values = rng.standard_normal(shape, dtype=t.numpy if direct else np.float32)
        return values if direct else values.astype(t.numpy)
    if t.kind == "bool":
        return rng.integers(0, 2, size=shape, dtype=np.bool_)
    high = min(max(index_bound or 10, 1), int(np.iinfo(t.numpy).max) + 1)
    return rng.integers(0, high, size=shape, dtype=t.numpy)
