"""Repeated CPU calls take a short path once a call with the same argument layout was checked
(program._fast_key): it must give the same answers and the same errors as the full path."""

import warnings
from pathlib import Path

import numpy as np
import pytest

import tcstage as tc

SCALE = "def scale(float(N,M) A, float s) -> (O) { O(i,j) = A(i,j) * s }"
SHIFT = "def shift(float(N) A, int32 k) -> (O) { O(i) = A(i + k) where i in 0:N-k }"


def f32(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def test_new_values_same_layout_give_new_results():
    f = tc.define(SCALE).scale
    for s in (2.0, 3.0, 2.0):
        A = f32(5, 7) + s
        np.testing.assert_allclose(f(A, s), A * np.float32(s), rtol=1e-6)
    assert f.compile_count == 1


def test_layouts_that_differ_in_strides_flags_or_dtype_are_each_checked():
    f = tc.define(SCALE).scale
    A = f32(6, 8)
    np.testing.assert_allclose(f(A, 2.0), A * 2, rtol=1e-6)
    T = np.asfortranarray(A)  # same shape, other strides: copied for Halide, same values
    np.testing.assert_allclose(f(T, 2.0), A * 2, rtol=1e-6)
    R = A.copy()
    R.flags.writeable = False
    np.testing.assert_allclose(f(R, 2.0), A * 2, rtol=1e-6)
    with pytest.raises(tc.TCArgumentError, match="expects A of type float"):
        f(A.astype(np.float64), 2.0)
    with pytest.raises(tc.TCArgumentError, match="expects A of rank 2"):
        f(A[0], 2.0)


def test_scalars_in_subscripts_are_part_of_the_layout():
    f = tc.define(SHIFT).shift
    A = np.arange(10, dtype=np.float32)
    for k in (1, 3, 1, 3):
        np.testing.assert_array_equal(f(A, k), A[k:])


def test_several_outputs_come_back_as_a_tuple_every_time():
    f = tc.define("def two(float(N) A) -> (B, C) { B(i) = A(i) + 1\n C(i) = A(i) * 2 }").two
    A = f32(9)
    for _ in range(2):
        B, C = f(A)
        np.testing.assert_allclose(B, A + 1, rtol=1e-6)
        np.testing.assert_allclose(C, A * 2, rtol=1e-6)


# -- the prepared run (jit.PreparedRun): a repeated call passes addresses, nothing more -----------

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def _fast(f):
    """The one memoised short path of `f`."""
    (fast,) = f._fast_calls.values()
    return fast


def test_repeated_calls_run_prepared_on_numpy_arrays_and_tensors():
    torch = pytest.importorskip("torch")
    A, B = f32(33, 20), f32(20, 17)
    for make in (lambda a: a, torch.from_numpy):
        f = tc.define(MATMUL).mm
        first = f(make(A), make(B))
        for k in range(3):  # new values in the same layout, so the same prepared run
            A2, B2 = A + k, B - k
            C = f(make(A2), make(B2))
            assert type(C) is type(first)
            np.testing.assert_allclose(np.asarray(C), A2 @ B2, rtol=1e-4, atol=1e-4)
        if tc.halide.aot.enabled():
            assert _fast(f).prepared is not None


def test_layouts_halide_cannot_take_as_they_are_keep_the_full_run():
    """A transposed array is copied for Halide on every call, so it has no prepared run; a
    read-only one is only read and has one."""
    f = tc.define(SCALE).scale
    T = np.asfortranarray(f32(6, 8))
    for _ in range(2):
        np.testing.assert_allclose(f(T, 2.0), T * 2, rtol=1e-6)
    assert _fast(f).prepared is None
    g = tc.define(SCALE).scale
    R = f32(6, 8)
    R.flags.writeable = False
    for _ in range(2):
        np.testing.assert_allclose(g(R, 2.0), R * 2, rtol=1e-6)
    if tc.halide.aot.enabled():
        assert _fast(g).prepared is not None


def test_outputs_aligned_to_64_bytes_only_are_written_correctly(monkeypatch):
    """OUTPUT_ALIGNMENT is 64 (PyTorch's): outputs that start 64 bytes past a 128-byte
    boundary, read back by a reduction's vectorised update, hold numpy's values."""
    import tcstage.program as program

    def misaligned(shape, dtype, alignment=64):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        raw = np.empty(nbytes + 192, np.uint8)
        start = (64 - raw.ctypes.data) % 128
        out = raw[start:start + nbytes].view(dtype).reshape(shape)
        assert out.ctypes.data % 128 == 64
        return out
    monkeypatch.setattr(program, "aligned_empty", misaligned)
    f = tc.define(MATMUL).mm
    A, B = f32(64, 48), f32(48, 80)
    f(A, B)
    for _ in range(2):  # through the prepared run, which allocates with aligned_empty
        np.testing.assert_allclose(f(A, B), A @ B, rtol=1e-4, atol=1e-4)
    softmax = tc.define("""def softmax(float(N,C) X) -> (Y, M, S) {
      M(n) max=! X(n,c)
      S(n) +=! exp(X(n,c) - M(n))
      Y(n,c) = exp(X(n,c) - M(n)) / S(n)
    }""").softmax
    X = f32(16, 100)
    softmax(X)
    Y = softmax(X)[0]
    E = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(Y, E / E.sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("shape, dtype", [((4,), "f4"), ((3, 5, 7), "f8"), ((), "f4"),
                                          ((0, 3), "i4"), ((2, 3), "u1"), ((1000,), "f2")])
def test_aligned_outputs_are_fresh_writable_c_order_arrays_on_64_bytes(shape, dtype):
    """aligned_empty (every numpy output) takes its address from `_native.address`, whose
    value numpy's own `ctypes.data` must agree with; empty and 0-dimensional shapes too."""
    from tcstage.halide import _native
    from tcstage.halide.jit import aligned_empty
    arrays = [aligned_empty(shape, dtype) for _ in range(3)]
    for a in arrays:
        assert a.shape == shape and a.dtype == np.dtype(dtype)
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
        assert _native.address(a) == a.ctypes.data and a.ctypes.data % 64 == 0
        a[...] = 7
    assert all(np.all(a == 7) for a in arrays)  # (no two share memory)


def test_a_failed_prepared_run_falls_back_to_the_full_run():
    """A nonzero status from the prepared call leaves the call to the full run, which gives the
    result (or, for a real failure, says what failed)."""
    import attrs
    f = tc.define(SCALE).scale
    A = f32(4, 5)
    f(A, 3.0)
    ((key, fast),) = f._fast_calls.items()
    if fast.prepared is None:
        pytest.skip("no kernel cache here: no prepared runs")
    f._fast_calls[key] = attrs.evolve(fast, prepared=attrs.evolve(fast.prepared,
                                                                    call=lambda hosts: -1))
    np.testing.assert_allclose(f(A, 3.0), A * 3, rtol=1e-6)


def test_threads_share_a_prepared_run_without_sharing_buffers():
    from concurrent.futures import ThreadPoolExecutor
    f = tc.define(SCALE).scale
    inputs = [f32(64, 64) + k for k in range(8)]
    f(inputs[0], 2.0)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(20):
            results = list(pool.map(lambda a: f(a, 2.0), inputs))
            for a, r in zip(inputs, results):
                np.testing.assert_array_equal(r, a * np.float32(2))


# -- compile_ahead: a kernel compiled on a thread of its own, for a later call -----------------------

def test_a_kernel_compiled_ahead_serves_the_call_and_keeps_its_warnings():
    """The call after compile_ahead compiles nothing and gets the warnings the compile made
    (here range inference's, specialised to k), issued at the call, not on the thread."""
    import warnings
    f = tc.define("def f(float(N) A, int32 k) -> (O) { O(i) = A(i + k) where i in 0:3 }").f
    A = np.arange(10, dtype=np.float32)
    with warnings.catch_warnings(record=True) as early:
        warnings.simplefilter("always")
        f.compile_ahead(A, 2).join()
    assert [w for w in early if issubclass(w.category, tc.TCWarning)] == []
    assert f.compile_count == 1
    with pytest.warns(tc.TCWarning, match="only if 5 <= N"):
        np.testing.assert_array_equal(f(A, 2), A[2:5])
    assert f.compile_count == 1


def test_a_call_while_its_kernel_compiles_ahead_waits_for_it():
    f = tc.define(MATMUL).mm
    A, B = f32(40, 30), f32(30, 20)
    thread = f.compile_ahead(A, B)
    np.testing.assert_allclose(f(A, B), A @ B, rtol=1e-4, atol=1e-4)  # (maybe while it runs)
    thread.join()
    assert f.compile_count == 1


def test_a_kernel_that_fails_ahead_fails_at_the_call():
    f = tc.define(SCALE).scale
    f.compile_ahead(f32(3, 4), "two").join()  # (a string for the scalar: the call's error)
    with pytest.raises(tc.TCArgumentError):
        f(f32(3, 4), "two")
    np.testing.assert_allclose(f(f32(3, 4), 2.0), f32(3, 4) * 2, rtol=1e-6)


def test_zero_dimensional_arrays_for_scalars_are_read_every_call():
    """A rank-polymorphic function at rank 0 takes its tensors as scalars: 0-dimensional
    arrays and tensors whose values change under the same memo key (shape, dtype, strides). A
    prepared run baked the first call's values in, and a later call returned them (opcheck of
    any_rank's softmax gradient found it)."""
    f = tc.define("def f(float(...) X, float(...) Y) -> (O) { O(...) = X(...) * 2 + Y(...) }").f
    for x, y in [(1.0, 2.0), (3.0, -1.0), (0.5, 0.25)]:
        got = f(np.array(x, np.float32), np.array(y, np.float32))
        assert float(got) == 2 * x + y
    torch = pytest.importorskip("torch")
    for x, y in [(1.0, 2.0), (3.0, -1.0)]:
        got = f(torch.tensor(x), torch.tensor(y))
        assert float(got) == 2 * x + y


@pytest.mark.parametrize("kind", ["float", "double", "half"])
def test_float_scalars_are_passed_with_each_call_by_one_memo(kind):
    """A float scalar (a loss passed to its backward) changes with every call: the memo's key
    leaves its value out and its prepared run passes it, converted to the TC's type (a double's
    bits, a half rounded), where it once baked the first value in and missed on every new one."""
    dtype = {"float": np.float32, "double": np.float64, "half": np.float16}[kind]
    f = tc.define(f"def scale({kind}(N) A, {kind} s) -> (O) {{ O(i) = A(i) * s }}").scale
    A = np.linspace(-2, 2, 11).astype(dtype)
    for s in (2.5, 0.1, np.float32(-3.25), np.float64(1e-3), 7.0):
        want = A * dtype(s) if kind != "half" else (A.astype(np.float32) *
                                                    np.float32(np.float16(s))).astype(dtype)
        np.testing.assert_array_equal(f(A, s), want)
    assert len(f._fast_calls) == 3  # (one per type: Python float, numpy float32 and float64)
    if tc.halide.aot.enabled():
        assert all(fast.prepared is not None for fast in f._fast_calls.values())
    with pytest.raises(tc.TCArgumentError, match="scalar input s"):
        f(A, "two")


def test_a_float_for_an_integer_scalar_is_refused_on_every_call():
    f = tc.define(SHIFT).shift
    A = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(f(A, 2), A[2:])
    for _ in range(2):
        with pytest.raises(tc.TCArgumentError, match="scalar input k of 'shift' is int32"):
            f(A, 2.0)


def test_a_last_dimension_of_one_with_any_stride_is_taken():
    """numpy calls `c[:, None]` C-contiguous though its last stride is 0; Halide refused it
    (its innermost stride must be 1). Both calls, the full one and the memoised one, give
    numpy's result."""
    f = tc.define("def colsum(float(K, 1) A) -> (O) { O(j) +=! A(k, j) }").colsum
    c = np.arange(5, dtype=np.float32)
    column = c[:, None]
    assert column.flags.c_contiguous and column.strides[-1] == 0
    for _ in range(2):
        np.testing.assert_array_equal(f(column), [c.sum()])


LAYERS = (Path(__file__).parent.parent / "examples" / "layers.tc").read_text()


@pytest.mark.parametrize("shapes", [((1, 0, 5, 5), (2, 0, 3, 3)), ((0, 2, 5, 5), (3, 2, 3, 3)),
                                    ((2, 2, 0, 4), (3, 2, 3, 3))])
def test_empty_arrays_give_empty_or_zero_results(shapes):
    """numpy gives an empty array strides of 0 in every dimension, which Halide refused (its
    innermost stride must be 1), and a schedule's splits failed on an empty output: a sum over
    nothing is 0, an output with no elements is returned as it is, on both call paths."""
    f = tc.define(LAYERS).padconv
    I, W = f32(*shapes[0]), f32(*shapes[1])
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = I.shape[2:]
    windows = np.stack([padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)])
    expected = np.einsum("kcnhw,fck->nfhw", windows.transpose(0, 2, 1, 3, 4),
                         W.reshape(*W.shape[:2], 9)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "runs unscheduled" fallback)
        for _ in range(2):
            out = f(I, W)
            assert out.shape == expected.shape
            np.testing.assert_array_equal(out, expected)  # (zeros, or no elements)


def test_empty_rows_and_batches_through_a_torch_operator_and_its_gradient():
    torch = pytest.importorskip("torch")
    import tcstage.torch as tct
    op = tct.op(LAYERS, "layernorm")
    F = torch.nn.functional
    torch.manual_seed(0)
    for n, c in ((1, 0), (0, 4), (3, 1)):
        x, g, b = (torch.randn(*s, requires_grad=True) for s in ((n, c), (c,), (c,)))
        dy = torch.randn(n, c)
        ours = op(x, g, b)
        theirs = F.layer_norm(x, (c,), g, b, eps=1e-5)
        torch.testing.assert_close(ours, theirs)
        for a, e in zip(torch.autograd.grad(ours, (x, g, b), dy),
                        torch.autograd.grad(theirs, (x, g, b), dy)):
            # (over one column d_X is 0, a difference of terms near dY * G / sqrt(1e-5))
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-5)


def test_arrays_copied_or_updated_in_place_take_the_same_stride_fix():
    """Arrays that reach Halide through a converted view (uint64, another byte order) or as
    in/out outputs (`out=`) had the stride of 0 that numpy gives `c[:, None]` and empty arrays
    left as it was, and Halide refused them."""
    c = np.arange(3, dtype=np.float32)
    acc = tc.define("def acc(float(N,M) A) -> (O) { O(i,j) += A(i,j) }").acc
    out = acc(np.ones((3, 1), np.float32), out=c[:, None])
    np.testing.assert_array_equal(out.ravel(), [1, 2, 3])
    np.testing.assert_array_equal(c, [1, 2, 3])  # (updated in place, through the view)
    two = tc.define("def g(float(N) A, float(M) B) -> (O, P) {\n  O(i) += A(i)\n"
                    "  P(j) = B(j)\n}").g
    o, p = two(np.ones(0, np.float32), np.full(2, 5, np.float32), out=(np.zeros(0, np.float32),))
    assert o.shape == (0,)
    np.testing.assert_array_equal(p, [5, 5])
    for ty, A in (("uint64", np.ones((3, 0), np.uint64)),
                  ("uint64", np.arange(3, dtype=np.uint64)[:, None]),
                  ("float", np.ones((3, 0), ">f4"))):
        f = tc.define(f"def f({ty}(N,K) A) -> (O) {{ O(n) +=! A(n,k) }}").f
        np.testing.assert_array_equal(f(A), A.astype(np.float64).sum(1))


PADTO = "def padto(float(M) A, float(N) Z) -> (O) { O(i) = (A(i) ?? 0) + Z(i) }"
GATHER = "def emb(float(E,D) T, int32(B,L) I) -> (O) { O(b,d) +=! T(I(b,l),d) }"
CONV = ("def conv2d(float(B,IP,H,W) in, float(OP,IP,KH,KW) weight) -> (out) "
        "{ out(b,op,h,w) +=! in(b,ip,h + kh,w + kw) * weight(op,ip,kh,kw) }")


@pytest.mark.parametrize("target", ["cpu", "cuda-emulated"])
def test_inputs_without_elements_are_never_read(target):
    """Halide's bounds inference wants the element a padded or clamped read is clamped to,
    which an empty input lacks: the CPU refused the call ("accessed at 0, which is beyond the
    max (-1)") and the CUDA path leaked an isl error. No element of an empty input is ever
    read, so its kernel reads none (edge-size hunt)."""
    def run(src, name, *args):
        if target == "cpu":
            return tc.define(src)[name](*args)
        return tc.compile(src, name, *args, target=target)(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (the gather's unchecked subscript)
        tc.define(GATHER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z = np.arange(3, dtype=np.float32)
        np.testing.assert_array_equal(run(PADTO, "padto", np.ones(0, np.float32), Z), Z)
        np.testing.assert_array_equal(run(PADTO, "padto", np.full(2, 5, np.float32), Z),
                                      Z + [5, 5, 0])
        W = np.ones((4, 1, 0, 0), np.float32)  # (an empty window: out is H+1 x W+1 zeros)
        np.testing.assert_array_equal(run(CONV, "conv2d", f32(1, 1, 2, 2), W),
                                      np.zeros((1, 4, 3, 3), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        out = run(GATHER, "emb", np.ones((0, 3), np.float32), np.zeros((2, 0), np.int32))
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))


def test_a_kernel_planned_at_other_sizes_serves_an_empty_input():
    """A kernel planned at other sizes, then a call with an empty window: the schedule and its
    re-plan at extent 1 both read weight at -1, and the call ran unscheduled with a warning."""
    f = tc.define(CONV).conv2d
    f(f32(8, 16, 32, 32), f32(4, 16, 3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f(f32(1, 1, 1, 1), np.ones((4, 1, 0, 0), np.float32))
        np.testing.assert_array_equal(out, np.zeros((1, 4, 2, 2), np.float32))
        tmm = tc.define("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                        "{ C(m,n) +=! A(m,kk) * B(n,kk) }").tmm
        out = tmm(np.ones((3, 0), np.float32), np.ones((4, 0), np.float32), schedule="Li2018")
        np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))


def test_an_empty_output_read_by_another_in_an_empty_loop():
    """At P = 1, T is empty and U reads T(k, 1) over no k: Halide's bounds inference wanted
    T(., 1) all the same, outside T's extent, and the call ran unscheduled with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)  # (the definition's precondition note)
        f = tc.define("def f(float(P) A) -> (S, T, U) {\n  S(i) = A(i)\n"
                      "  T(i, l) = A(i) where l in 1:P\n"
                      "  U(k) = T(k, 1) where k in 0:P - 1\n}").f
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in (1, 3, 1):
            A = f32(p)
            S, T, U = f(A)
            np.testing.assert_array_equal(S, A)
            np.testing.assert_array_equal(T, np.repeat(A[:, None], p - 1, axis=1))
            np.testing.assert_array_equal(U, A[:p - 1])
