"""The Halide apps ported under examples/halide/, through tc.from_halide: the CPU call and the
emulated CUDA kernel (several MappingOptions; each kernel also passes nvcc, see conftest.py)
equal Halide's own realize of the same pipeline, built afresh and unscheduled."""

import warnings

import numpy as np
import pytest

import tcstage as tc
from examples.halide import APPS as ALL_APPS
from examples.halide import common, load

# Pyramids and long stencil chains take tens of seconds to compile and emulate: the slow step.
SLOW = {"interpolate", "local_laplacian", "stencil_chain"}
APPS = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
        for name in ALL_APPS]
# apps of many stages (14 launches and more: 30 to 45 s to compile each here) take the first
# option set only
ONE_OPTION_SET = {"lens_blur", "camera_pipe"}

OPTIONS = [
    tc.MappingOptions().tile(4, 16).mapToThreads(16, 4).mapToBlocks(8, 8),
    tc.MappingOptions().tile(8, 8).mapToThreads(8, 8).mapToBlocks(4, 4).useSharedMemory(True)
    .usePrivateMemory(True).unroll(2),
    tc.MappingOptions().scheduleFusionStrategy("Max").tile(2, 32).mapToThreads(32, 2)
    .useSharedMemory(True),
]


def assert_same(got, expected, tolerance):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        if tolerance:
            np.testing.assert_allclose(g, e, rtol=0, atol=tolerance)
        else:
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("name", APPS)
def test_port(name):
    app = load(name)
    args = app.inputs(np.random.default_rng(3), "small")
    shapes = [tuple(s) for s in app.output_shapes(args)]
    reference = app.build()
    if getattr(app, "UNSCHEDULED", None):  # inlined it would take minutes (pyramids)
        common.compute_root_all(reference)
    expected = common.realize(reference, args, shapes)
    tolerance = app.tolerance(args) if hasattr(app, "tolerance") else 0
    built = app.build()
    if hasattr(app, "random_seeds"):  # random_float hashes with numbers each build draws anew:
        expected = app.reference(*args)  # the numpy reference uses those of the last build
    f = tc.from_halide(built.outputs, name=built.name)
    shape = shapes[0] if len(shapes) == 1 else shapes
    # (the CPU call schedules the unscheduled pipeline, structured or Mullapudi2016, so float
    # code may round differently from the inlined reference)
    assert_same(f(*args, output_shape=shape), expected, tolerance)
    # (a structured schedule Halide refuses falls back to Mullapudi2016 with a note: a bug)
    assert "structured schedule failed" not in f.last_cpu_kernel.note
    for options in OPTIONS[:1] if name in ONE_OPTION_SET else OPTIONS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)  # options a small app cannot use
            kernel = tc.compile(f, *args, output_shape=shape, options=options,
                                target="cuda-emulated")
        assert_same(kernel(*args), expected, tolerance)
