"""Forward-mode AD through tcstage.torch operators (the generated tc.jvp TC):
torch.func.jvp / torch.autograd.forward_ad against the same layers written with PyTorch's
operators, and the errors. (PyTorch's gradcheck with check_forward_ad runs on every gradcheck
case in tests/test_torch_gradcheck.py.)"""

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402

import tcstage as tc  # noqa: E402
import tcstage.torch as tct  # noqa: E402
from test_torch_gradcheck import LAYERS  # noqa: E402  (tests/)


def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_func_jvp_matches_torch_layer_norm():
    torch.manual_seed(1)
    x, g, b = _f64(4, 6), _f64(6), _f64(6)
    tangents = (_f64(4, 6), _f64(6), _f64(6))
    got = torch.func.jvp(tct.op(LAYERS, "layernorm"), (x, g, b), tangents)
    want = torch.func.jvp(lambda x, g, b: torch.nn.functional.layer_norm(x, (6,), g, b, eps=1e-5),
                          (x, g, b), tangents)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-12, atol=1e-12)


def test_forward_ad_dual_tensors_match_torch_softmax():
    torch.manual_seed(2)
    x, t = _f64(3, 5), _f64(3, 5)
    with fwAD.dual_level():
        y = tct.op(LAYERS, "softmax")(fwAD.make_dual(x, t))
        primal, tangent = (v.clone() for v in fwAD.unpack_dual(y))
    want, want_t = torch.func.jvp(lambda x: torch.softmax(x, dim=1), (x,), (t,))
    torch.testing.assert_close(primal, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tangent, want_t, rtol=1e-12, atol=1e-12)


def test_inputs_without_a_tangent_and_python_numbers():
    """Only some inputs carry tangents; a float scalar (a Python number) has none."""
    op = tct.op("def axpy(float(N) X, float(N) Y, float a) -> (O) { O(i) = a * X(i) + Y(i) }",
                "axpy")
    x, y, t = _f64(5), _f64(5), _f64(5)
    _, t_out = torch.func.jvp(lambda y: op(x, y, 0.5), (y,), (t,))
    torch.testing.assert_close(t_out, t, rtol=0, atol=0)
    _, t_out = torch.func.jvp(lambda x: op(x, y, 0.5), (x,), (t,))
    torch.testing.assert_close(t_out, 0.5 * t, rtol=0, atol=0)


def test_no_forward_derivative_is_a_clear_error_not_a_zero_tangent():
    op = tct.op("def prod(float(N,K) X) -> (O) { O(n) *=! X(n,k) }", "prod")
    x = _f64(2, 3)
    op(x)  # (the forward operator works)
    with pytest.raises(tc.TCError, match="forward-mode differentiation .* product reduction"):
        torch.func.jvp(op, (x,), (torch.ones_like(x),))


def test_reverse_over_forward_is_a_clear_error():
    op = tct.op(LAYERS, "softmax")
    x = _f64(2, 3).requires_grad_()
    with fwAD.dual_level():
        y = op(fwAD.make_dual(x, torch.ones_like(x)))
        _, t = fwAD.unpack_dual(y)
        with pytest.raises(tc.TCError, match="reverse mode over forward mode"):
            t.sum().backward()
