"""Calling a TC function on CPU PyTorch tensors: numpy views in (no copy where Halide can read
them), PyTorch tensors out. References: numpy on the tensors' values."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tcstage as tc  # noqa: E402

rng = np.random.default_rng(29)

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"


@pytest.fixture(scope="module")
def tmm():
    return tc.define(TMM).tmm


def tensor(*shape, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def test_torch_in_torch_out(tmm):
    A, B = tensor(5, 7), tensor(4, 7)
    C = tmm(A, B, schedule=None)
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float32 and C.shape == (5, 4)
    np.testing.assert_allclose(C.numpy(), A.numpy() @ B.numpy().T, rtol=1e-5, atol=1e-5)


def test_numpy_in_numpy_out_and_mixed_in_torch_out(tmm):
    A, B = tensor(3, 2), tensor(6, 2)
    assert isinstance(tmm(A.numpy(), B.numpy(), schedule=None), np.ndarray)
    for args in [(A, B.numpy()), (A.numpy(), B)]:
        C = tmm(*args, schedule=None)
        assert isinstance(C, torch.Tensor)
        np.testing.assert_allclose(C.numpy(), A.numpy() @ B.numpy().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda: tensor(7, 5).t(),                       # transposed
    lambda: tensor(10, 9)[::2, 1::2],               # strided slice with an offset
    lambda: tensor(1, 4).expand(5, 4),              # stride 0
    lambda: tensor(5, 8)[:, 2:6],                   # rows with a gap
    lambda: tensor(5, 4, dtype=torch.float64).float().requires_grad_(),
], ids=["transposed", "sliced", "expanded", "narrowed", "requires_grad"])
def test_non_contiguous_and_grad_inputs(tmm, make):
    A = make()
    B = tensor(3, A.shape[1])[:, :]
    expected = A.detach().numpy() @ B.numpy().T
    C = tmm(A, B.t().contiguous().t())
    assert isinstance(C, torch.Tensor) and not C.requires_grad
    np.testing.assert_allclose(C.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tc_type, dtype", [
    ("double", torch.float64), ("half", torch.float16), ("int32", torch.int32),
    ("int64", torch.int64), ("uint8", torch.uint8), ("int16", torch.int16),
])
def test_dtypes(tc_type, dtype):
    f = tc.define(f"def f({tc_type}(N, M) A) -> (S) {{ S(n) +=! A(n, m) }}").f
    A = (torch.arange(12) % 7).to(dtype).reshape(3, 4)
    S = f(A, schedule=None)
    assert isinstance(S, torch.Tensor) and S.dtype == dtype
    np.testing.assert_array_equal(S.numpy(), A.numpy().sum(1, dtype=A.numpy().dtype))


def test_bool_and_float_outputs_of_several_outputs():
    f = tc.define("""def f(float(N) A) -> (P, Q) {
      P(i) = A(i) > 0
      Q(i) = A(i) * 2
    }""").f
    assert f.checked.tensors["P"].type.name == "bool"
    A = tensor(6)
    P, Q = f(A, schedule=None)
    assert P.dtype == torch.bool and Q.dtype == torch.float32
    np.testing.assert_array_equal(P.numpy(), A.numpy() > 0)
    np.testing.assert_allclose(Q.numpy(), A.numpy() * 2)


def test_outputs_share_memory_with_their_numpy_arrays(tmm):
    # torch.from_numpy: the result is a view of the array Halide wrote, not a copy of it.
    C = tmm(tensor(2, 3), tensor(2, 3), schedule=None)
    view = C.numpy()
    view[0, 0] = 123.0
    assert C[0, 0].item() == 123.0


def test_contiguous_inputs_reach_halide_without_a_copy(monkeypatch):
    from tcstage.halide import aot, jit
    given = []  # the arrays Halide's buffers are made over (a JIT's, or the kernel cache's)
    real, real_run = jit.halide_buffer, aot.AotPipeline.run
    monkeypatch.setattr(jit, "halide_buffer", lambda a: given.append(a) or real(a))
    monkeypatch.setattr(aot.AotPipeline, "run",
                        lambda self, values, mins: given.extend(values) or
                        real_run(self, values, mins))
    f = tc.define("def f(float(N) A) -> (O) { O(i) = A(i) + 1 }").f
    A = torch.arange(6, dtype=torch.float32)[1:]  # contiguous, with a storage offset
    np.testing.assert_array_equal(f(A, schedule=None).numpy(), A.numpy() + 1)
    assert given[0].ctypes.data == A.data_ptr()


def test_out_tensors_are_updated_in_place_and_returned():
    f = tc.define("def f(float(N) A) -> (O) { O(i) += A(i) * O(i) }").f
    A, start = tensor(8), tensor(8)
    for out in [start.clone(), start.clone()[::1], torch.stack([start, start], 1)[:, 0]]:
        got = f(A, out=out, schedule=None)
        assert got is out
        np.testing.assert_allclose(out.numpy(), (start + A * start).numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_out_tensor_requiring_grad_is_refused():
    f = tc.define("def f(float(N) A) -> (O) { O(i) += A(i) }").f
    with pytest.raises(tc.TCArgumentError, match="out= tensor O requires grad"):
        f(tensor(3), out=tensor(3).requires_grad_(), schedule=None)


def test_scalars_as_zero_dimensional_tensors():
    f = tc.define("def f(float(N) A, float s) -> (O) { O(i) = A(i) * s }").f
    A = tensor(5)
    O = f(A, torch.tensor(3.0), schedule=None)
    np.testing.assert_allclose(O.numpy(), A.numpy() * 3, rtol=1e-6)


def test_tensors_by_name_and_shape_queries(tmm):
    A, B = tensor(2, 3), tensor(4, 3)
    np.testing.assert_allclose(tmm(B=B, A=A, schedule=None).numpy(),
                               A.numpy() @ B.numpy().T, rtol=1e-5, atol=1e-5)
    assert tmm.output_shapes(A, B) == [(2, 4)]


def test_a_tensor_on_another_device_is_a_clear_error(tmm):
    # The meta device stands in for CUDA here: any tensor not on the CPU is refused by name.
    A = torch.empty(2, 3, device="meta")
    with pytest.raises(tc.TCArgumentError, match=r"A is a PyTorch tensor on meta; calling the "
                                                 r"TC function runs on the CPU"):
        tmm(A, tensor(4, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_tensor_is_a_clear_error(tmm):
    with pytest.raises(tc.TCArgumentError, match="A is a PyTorch tensor on cuda"):
        tmm(tensor(2, 3).cuda(), tensor(4, 3))


def test_a_dtype_numpy_lacks_is_a_clear_error(tmm):
    with pytest.raises(tc.TCArgumentError, match="A is a PyTorch tensor of dtype "
                                                 "torch.float8_e4m3fn"):
        tmm(tensor(2, 3, dtype=torch.float8_e4m3fn), tensor(4, 3))


def test_bfloat16_tensors_are_viewed_through_their_bits(tmm):
    """numpy has no bfloat16: a bf16 tensor is taken as ml_dtypes' bfloat16 view of its memory,
    and a bf16 TC's outputs come back as bf16 tensors."""
    f = tc.define("def f(bfloat16(N) X) -> (Y) { Y(i) = X(i) * 2 }").f
    X = tensor(6, dtype=torch.bfloat16)
    Y = f(X[::2])  # (strided: viewed, then copied where Halide needs a dense array)
    assert isinstance(Y, torch.Tensor) and Y.dtype == torch.bfloat16
    assert torch.equal(Y, X[::2] * 2)
    with pytest.raises(tc.TCArgumentError, match="expects A of type float32.*got bfloat16"):
        tmm(tensor(2, 3, dtype=torch.bfloat16), tensor(4, 3))


def test_wrong_dtype_names_the_input(tmm):
    with pytest.raises(tc.TCArgumentError, match="expects A of type float"):
        tmm(tensor(2, 3, dtype=torch.float64), tensor(4, 3))


def test_sparse_tensor_is_refused(tmm):
    with pytest.raises(tc.TCArgumentError, match="A is a torch.sparse_coo PyTorch tensor"):
        tmm(tensor(2, 3).to_sparse(), tensor(4, 3))


def test_varying_batch_sizes_of_torch_tensors_compile_once():
    f = tc.define(TMM).tmm
    B = tensor(5, 6)
    for m in [4, 9, 4, 6]:
        A = tensor(m, 6)
        np.testing.assert_allclose(f(A, B).numpy(), A.numpy() @ B.numpy().T, rtol=1e-4,
                                   atol=1e-4)
    assert f.compile_count == 1


def test_the_numpy_api_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys, numpy as np, tcstage as tc\n"
            f"f = tc.define({TMM!r}).tmm\n"
            "f(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), schedule=None)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_outputs_are_allocated_by_pytorch(monkeypatch):
    """A call with torch tensors puts its outputs in memory PyTorch allocated (aligned for
    Halide, OUTPUT_ALIGNMENT), not numpy's."""
    calls = []
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):
        calls.append(kwargs.get("dtype"))
        return real_empty(*args, **kwargs)

    prog = tc.define("def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }")
    a, b = torch.randn(5, 7), torch.randn(6, 7)
    monkeypatch.setattr(torch, "empty", counting_empty)
    c = prog.tmm(a, b)
    assert calls == [torch.uint8]  # (the first call: bytes, aligned by hand)
    assert c.data_ptr() % 64 == 0
    torch.testing.assert_close(c, a @ b.T, rtol=1e-5, atol=1e-5)
    again = prog.tmm(a, b)  # (a call in the same layout: its prepared run, a tensor of floats)
    assert calls[1:] == ([torch.float32] if tc.halide.aot.enabled() else [torch.uint8])
    assert again.data_ptr() % 64 == 0 and again.data_ptr() != c.data_ptr()
    torch.testing.assert_close(again, a @ b.T, rtol=1e-5, atol=1e-5)
