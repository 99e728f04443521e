"""The Halide apps ported in examples/halide/ compute what their independent numpy references
compute: Halide's own realize of each pipeline, unscheduled (or, where inlining everything
cannot run, with every stage computed at the root) and with the app's manual CPU schedule,
on small random inputs; exact for integer pipelines, within a bound derived from the sizes
for float ones. The manual GPU schedules are lowered for a CUDA target (no GPU needed), and the
tcstage options an app documents for its CUDA kernel (GPU_OPTIONS) run under emulation."""

import sys
from pathlib import Path

import halide as hl
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # examples/ is not installed; import it from the checkout
    sys.path.insert(0, str(ROOT))

from examples.halide import APPS, common, load  # noqa: E402


# Halide takes seconds to compile these (the 33 stages of stencil_chain, the pyramids'
# dozens of Funcs, conv_layer's unrolled CUDA schedule); they run with the slow tests.
SLOW = {("cpu", "stencil_chain"), ("cpu", "local_laplacian"), ("gpu", "conv_layer"),
        ("gpu", "stencil_chain"), ("gpu", "local_laplacian"), ("gpu", "interpolate")}


def _cases(kind):
    return [pytest.param(name, id=name, marks=[pytest.mark.slow] if (kind, name) in SLOW else [])
            for name in APPS]


def _module(name):
    return load(name)


def _unscheduled_cases():
    for name in APPS:
        how = getattr(_module(name), "UNSCHEDULED", "ok")
        if how == "infeasible":
            yield pytest.param(name, "root", id=f"{name}-root")
        else:
            marks = [pytest.mark.slow] if how == "slow" else []
            yield pytest.param(name, "unscheduled", id=f"{name}-unscheduled", marks=marks)


def _check(name, schedule):
    m = _module(name)
    rng = np.random.default_rng(sum(map(ord, name)))
    args = m.inputs(rng, "small")
    app = m.build()
    schedule(app)
    got = common.realize(app, args, m.output_shapes(args))
    want = m.reference(*args)
    tolerance = getattr(m, "tolerance", lambda args: 0)(args)
    assert len(got) == len(want) == len(app.outputs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if tolerance == 0:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=0, atol=tolerance)


@pytest.mark.parametrize("name, how", list(_unscheduled_cases()))
def test_algorithm_matches_reference(name, how):
    _check(name, common.compute_root_all if how == "root" else (lambda app: None))


@pytest.mark.parametrize("name", _cases("cpu"))
def test_manual_cpu_schedule_matches_reference(name):
    _check(name, _module(name).schedule_cpu)


@pytest.mark.parametrize("name", [c for c in _cases("gpu")
                                  if hasattr(_module(c.values[0]), "schedule_gpu")])
def test_manual_gpu_schedule_lowers_for_cuda(name, tmp_path):
    m = _module(name)
    app = m.build()
    m.schedule_gpu(app)
    target = hl.get_host_target().with_feature(hl.TargetFeature.CUDA)
    # Lowering checks what a GPU schedule can get wrong (loop types, nesting, bounds); the
    # statement embeds the kernels' PTX, whose entry points name their block loops.
    hl.Pipeline(app.outputs).compile_to_lowered_stmt(str(tmp_path / "gpu.stmt"), app.params,
                                                     hl.StmtOutputFormat.Text, target)
    assert b"block_id" in (tmp_path / "gpu.stmt").read_bytes()


GPU_OPTIONS = [name for name in APPS if hasattr(_module(name), "GPU_OPTIONS")]


# (stencil_chain and interpolate, the longest at 30-40 s each, run in the slow step: the
# README's command stays near 5 minutes on a cold emulator cache)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in (
    "stencil_chain", "interpolate") else []) for n in GPU_OPTIONS])
def test_documented_tcstage_options_match_reference(name):
    import warnings

    import tcstage as tc
    m = _module(name)
    args = m.inputs(np.random.default_rng(sum(map(ord, name))), "small")
    fn = tc.from_halide(m.build().outputs[0], name=name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (a small image has few tiles)
        kernel = tc.compile(fn, *args, output_shape=m.output_shapes(args)[0],
                            options=m.GPU_OPTIONS, target="cuda-emulated")
    [want] = m.reference(*args)
    got = np.asarray(kernel(*args))
    tolerance = getattr(m, "tolerance", lambda args: 0)(args)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0,
                               atol=tolerance)


@pytest.mark.parametrize("name", APPS)
def test_app_contract(name):
    """Fresh Funcs per build, params in infer_arguments order, inputs of matching types."""
    m = _module(name)
    a, b = m.build(), m.build()
    assert a.outputs[0].name() != b.outputs[0].name()  # Halide uniquifies names of new Funcs
    args = m.inputs(np.random.default_rng(0), "small")
    assert [p.name() for p in a.params] == [x.name for x in hl.Pipeline(a.outputs).infer_arguments()]
    for p, arg in zip(a.params, args):
        if isinstance(p, hl.ImageParam):
            assert arg.ndim == p.dimensions() and arg.dtype == common.numpy_type(p.type())
        else:
            assert np.isscalar(arg)


def test_call_overhead_benchmark_compares_the_same_schedule():
    """halide_bench.py --overhead times tcstage's call and Halide's realize of one manual
    schedule (checking that both give the same outputs first) and reports their difference."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import halide_bench

    row = halide_bench.call_overhead("camera_pipe", budget_s=0.05)
    assert row["tcstage_us"] > 0 and row["realize_us"] > 0
    assert row["overhead_us"] == pytest.approx(row["tcstage_us"] - row["realize_us"], abs=0.2)
    assert "| camera_pipe | 56x160 3x4 3x4 |" in halide_bench.overhead_table([row])
