"""Rank-polymorphic TCs (`...`, docs/language.md "Any rank"): the layers written once for every
rank, checked against numpy at ranks 0 to 5 on the CPU and under emulated CUDA, their generated
gradients (which keep `...`) against finite differences, the PyTorch operators with
torch.library.opcheck, the command line, and an error located for each misuse."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc

ROOT = Path(__file__).parent.parent
LAYERS = (ROOT / "examples" / "any_rank.tc").read_text()
RNG = np.random.default_rng(30)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def layernorm(x, g, b):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + 1e-5) + b


# name -> (make inputs for a leading shape, numpy reference of the last output)
CASES = {
    "softmax": (lambda lead: [RNG.standard_normal((*lead, 5))], softmax),
    "log_softmax": (lambda lead: [RNG.standard_normal((*lead, 5))], log_softmax),
    "layernorm": (lambda lead: [RNG.standard_normal((*lead, 6)), RNG.standard_normal(6),
                                RNG.standard_normal(6)], layernorm),
    "bias_add": (lambda lead: [RNG.standard_normal((*lead, 4)), RNG.standard_normal(4)],
                 lambda x, b: x + b),
    "batched_matmul": (lambda lead: [RNG.standard_normal((*lead, 3, 4)),
                                     RNG.standard_normal((*lead, 4, 2))],
                       lambda a, b: np.matmul(a, b)),
    "leading_sum": (lambda lead: [RNG.standard_normal((*lead, 3))],
                    lambda x: x.reshape(-1, x.shape[-1]).sum(0)),
    "scale_shift": (lambda lead: [RNG.standard_normal(lead), RNG.standard_normal(lead), 0.5],
                    lambda x, s, c: x * s + c),
}
LEADS = [(), (2,), (3, 1), (2, 1, 3), (1, 2, 2, 1), (2, 1, 1, 2, 1)]  # ranks 0 to 5
SLOW = pytest.mark.slow  # (the higher ranks in the slow step: each rank compiles anew)


@functools.cache  # (one Program: its instances and their kernels serve every test)
def program(dtype="float"):
    text = LAYERS if dtype == "float" else LAYERS.replace("float(", f"{dtype}(") \
        .replace("float c", f"{dtype} c")
    return tc.define(text)


def last(out):
    return out[-1] if isinstance(out, tuple) else out


@pytest.mark.parametrize("lead", [pytest.param(s, marks=[SLOW] if len(s) > 2 else [])
                                  for s in LEADS], ids=lambda s: f"rank{len(s)}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_layers_on_the_cpu_at_every_rank(name, lead):
    make, reference = CASES[name]
    args = make(lead)
    got = last(program("double")[name](*args))
    np.testing.assert_allclose(got, reference(*args), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lead", [(), (2, 1, 3), pytest.param((2,), marks=SLOW),
                                  pytest.param((2, 1, 1, 2, 1), marks=SLOW)],
                         ids=lambda s: f"rank{len(s)}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_layers_as_emulated_cuda_at_several_ranks(name, lead):
    make, reference = CASES[name]
    args = [a.astype(np.float32) if isinstance(a, np.ndarray) else a for a in make(lead)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(program(), name, *args, target="cuda-emulated",
                            options=tc.MappingOptions().tile(2).mapToThreads(8, 2).mapToBlocks(4))
    got = last(kernel(*args))
    want = reference(*[a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_each_rank_is_an_instance_of_its_own():
    p = program()
    f = p["softmax"]
    assert isinstance(f, tc.PolymorphicFunction) and "any rank" in repr(f)
    assert f.instance(2) is f.instance(2) and f.instance(2) is not f.instance(1)
    assert [t.rank for t in f.instance(2).checked.inputs] == [3]
    assert f.output_shapes((2, 3, 5)) == [(2, 3), (2, 3, 5), (2, 3), (2, 3, 5)]
    assert f.output_shapes((5,))[0] == ()
    ranges = f.ranges((4, 5))
    assert "0 <= d0 < D0" in str(ranges[0]) and "[0, 4)" in str(ranges[0])
    with pytest.raises(tc.TCError, match="rank-polymorphic.*instance"):
        f.checked  # noqa: B018


@pytest.mark.parametrize("name", ["softmax", "leading_sum", pytest.param("layernorm", marks=SLOW),
                                  pytest.param("batched_matmul", marks=SLOW),
                                  pytest.param("bias_add", marks=SLOW)])
def test_gradients_keep_the_run_and_match_finite_differences(name):
    back = tc.gradient(program("double"), name)
    assert "..." in back
    grads = tc.define(back)[f"{name}_grad"]
    assert isinstance(grads, tc.PolymorphicFunction)
    fwd = program("double")[name]
    make, _ = CASES[name]
    for lead in [(), (2,), (2, 1, 3)]:
        args = make(lead)
        outs = fwd(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        seeds = [RNG.standard_normal(np.shape(o)) for o in outs]
        got = grads(*args, *outs, *seeds)
        got = got if isinstance(got, tuple) else (got,)
        floats = [k for k, a in enumerate(args) if isinstance(a, np.ndarray)]

        def loss(values):
            res = fwd(*values)
            res = res if isinstance(res, tuple) else (res,)
            return sum(float((r * s).sum()) for r, s in zip(res, seeds))
        for k, g in zip(floats, got):
            direction = RNG.standard_normal(args[k].shape)
            eps = 1e-6
            plus = [a + eps * direction if i == k else a for i, a in enumerate(args)]
            minus = [a - eps * direction if i == k else a for i, a in enumerate(args)]
            numeric = (loss(plus) - loss(minus)) / (2 * eps)
            assert abs(numeric - float((g * direction).sum())) <= 1e-6 * (1 + abs(numeric)), \
                (name, lead, k)


def test_pytorch_operators_at_any_rank():
    torch = pytest.importorskip("torch")
    import tcstage.torch as tct
    matmul_op = tct.op(LAYERS, "batched_matmul")
    for lead in [(), (2, 3)]:
        a = torch.randn(*lead, 3, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(*lead, 4, 2, dtype=torch.float64, requires_grad=True)
        torch.testing.assert_close(matmul_op(a, b), a @ b)
        assert torch.autograd.gradcheck(matmul_op, (a, b))


@pytest.mark.slow
def test_pytorch_operators_at_any_rank_pass_opcheck():
    torch = pytest.importorskip("torch")
    import tcstage.torch as tct
    softmax_op = tct.op(LAYERS, "softmax")
    matmul_op = tct.op(LAYERS, "batched_matmul")
    for lead in [(), (2,), (2, 3)]:
        x = torch.randn(*lead, 5, dtype=torch.float64, requires_grad=True)
        torch.testing.assert_close(softmax_op(x)[-1], torch.softmax(x, -1))
        assert torch.autograd.gradcheck(lambda t: softmax_op(t)[-1], (x,))
        a = torch.randn(*lead, 3, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(*lead, 4, 2, dtype=torch.float64, requires_grad=True)
        torch.library.opcheck(matmul_op.op, (a, b))
        torch.library.opcheck(softmax_op.op, (x,))


def test_the_command_line_takes_the_run_as_a_size(capsys):
    from tcstage.cli import main
    run = ["run", str(ROOT / "examples" / "any_rank.tc"), "--fn", "softmax"]
    assert main(run + ["--sizes", "...=2x3,N=5"]) == 0
    assert "Y(2, 3, 5)" in capsys.readouterr().out
    assert main(run + ["--sizes", "...=,N=5", "--target", "cuda-emulated"]) == 0
    assert "inputs:  X(5,)" in capsys.readouterr().out
    assert main(run + ["--sizes", "N=5"]) != 0
    assert "--sizes '...=2x3'" in capsys.readouterr().err


@pytest.mark.parametrize("source, message", [
    ("def f(float(..., N, ...) X) -> (Y) { Y(i) = X(i) }", "at most one '...'"),
    ("def f(float(..., N) X) -> (Y) { Y(..., i) = X(..., i) where i in 0:... }",
     "cannot be bounded by a where clause"),
    ("def f(float(N) X) -> (Y) { Y(..., i) = X(i) }", "needs a '...' in the signature"),
    ("def f(float(..., N) X) -> (Y) { Y(..., i) = X(..., ..., i) }",
     "a subscript list has at most one '...'"),
    ("def f(float(..., N) X) -> (Y) { Y(..., i) = exp(...) }", "'exp' is not a tensor"),
    ("def f(float(..., N) X) -> (Y) { Y(..., i) = ... + X(..., i) }", "it is not a value"),
    ("def f(float(..., N) X) -> (Y) { Y(..., i) = X(..., i) }\n"
     "def g(float(N) A) -> (B) { (B) = f(A) }", "a call from another TC function"),
])
def test_misuses_are_located(source, message):
    with pytest.raises(tc.TCError, match=message) as info:
        tc.define(source)
    assert "^" in str(info.value)


def test_call_errors_name_the_tensors():
    f = tc.define("def f(float(..., N) X, float(...) S) -> (Y) "
                  "{ Y(..., n) = X(..., n) * S(...) }")["f"]
    with pytest.raises(tc.TCArgumentError, match=r"'X' has rank 0, too small for its type "
                                                 r"'float\(\.\.\., N\)'") as info:
        f(np.float32(1), np.float32(2))
    assert "^" in str(info.value)
    with pytest.raises(tc.TCArgumentError, match=r"the '\.\.\.' of 'X' stands for 2 dimensions "
                                                 r"\(rank 3\), that of 'S' for 1"):
        f(np.ones((2, 3, 4), np.float32), np.ones(2, np.float32))
    with pytest.raises(tc.TCArgumentError, match=r"the '\.\.\.' of 'X' stands for sizes "
                                                 r"\(2, 3\), that of 'S' for \(2, 4\)"):
        f(np.ones((2, 3, 4), np.float32), np.ones((2, 4), np.float32))
