"""torch.autograd.gradcheck (float64, CPU), in reverse and forward mode, of TC operators whose
derivatives are the generated TCs (backward and jvp):
the paper's kernels, softmax, layernorm and a padded convolution, each written in float and run
in float64 because the operators are generic over floating types."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tcstage.torch as tct  # noqa: E402


def example(name):
    with open(f"examples/{name}.tc") as f:
        return f.read()


LAYERS = example("layers")


def f64(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def table_index(rows, *shape):
    return torch.randint(0, rows, shape, dtype=torch.int32)


CASES = {
    "tmm": (example("tmm"), "tmm", lambda: (f64(4, 5), f64(3, 5))),
    "tbmm": (example("tbmm"), "tbmm", lambda: (f64(2, 3, 4), f64(2, 5, 4))),
    "gconv": (example("gconv"), "gconv", lambda: (f64(2, 2, 2, 5, 4), f64(2, 2, 2, 3, 2))),
    "MLP1": (example("mlp"), "MLP1", lambda: (f64(3, 5), f64(4, 5), f64(4))),
    "MLP3": (example("mlp"), "MLP3", lambda: (f64(3, 5), f64(4, 5), f64(4), f64(3, 4), f64(3),
                                              f64(2, 3), f64(2))),
    "1LUT": (example("lut"), "1LUT", lambda: (f64(6, 3), table_index(6, 2, 4))),
    "2LUT": (example("lut"), "2LUT", lambda: (f64(6, 3), table_index(6, 2, 4), f64(5, 3),
                                              table_index(5, 2, 3))),
    "maxpool": (example("conv"), "maxpool2x2", lambda: (f64(2, 2, 6, 5),)),
    "conv2d": (example("conv"), "conv2d", lambda: (f64(1, 2, 6, 5), f64(3, 2, 3, 2))),
    "strided_conv": (example("sconv2d"), "sconv2d",
                     lambda: (2, 2, f64(1, 2, 7, 6), f64(3, 2, 3, 2), f64(3))),
    "softmax": (LAYERS, "softmax", lambda: (f64(3, 5),)),
    "layernorm": (LAYERS, "layernorm", lambda: (f64(3, 6), f64(6), f64(6))),
    "padded_conv": (LAYERS, "padconv", lambda: (f64(1, 2, 4, 5), f64(3, 2, 3, 3))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_gradcheck(case, mode):
    """Reverse mode through the backward TC; forward mode (torch.func.jvp, forward_ad) through
    the tc.jvp TC (tests/test_torch_jvp.py has more of it)."""
    src, name, make = CASES[case]
    torch.manual_seed(0)
    layer = tct.op(src, name)
    args = make()
    forward = {} if mode == "reverse" else dict(
        check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False)
    assert torch.autograd.gradcheck(layer, args, eps=1e-6, atol=1e-7, rtol=1e-5, **forward)


def test_generated_backward_matches_torch_autograd():
    """The same layer written with PyTorch's own operators gives the same gradients."""
    torch.manual_seed(1)
    x, g, b = f64(4, 6), f64(6), f64(6)
    y = tct.op(LAYERS, "layernorm")(x, g, b)
    d_y = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, g, b), d_y)
    x2, g2, b2 = (t.detach().clone().requires_grad_() for t in (x, g, b))
    ref = torch.nn.functional.layer_norm(x2, (6,), g2, b2, eps=1e-5)
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-10)
    want = torch.autograd.grad(ref, (x2, g2, b2), d_y)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a.numpy(), w.numpy(), rtol=1e-9, atol=1e-12)
