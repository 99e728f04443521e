"""half and bfloat16: in the language, on the CPU (Halide) and under emulated CUDA, with sums and
products accumulated in float32 (tcstage/lang/accumulate.py).

References are numpy in float64 on the inputs' exact values. Tolerances come from the sizes:
with u the unit roundoff of the narrow type (2**-11 for half, 2**-8 for bfloat16) and n terms
of magnitudes |t_k| summed in float32 (the products of two narrow values are exact there, any
order of summation),

    |result - exact| <= 2 u |exact| + n 2**-24 sum |t_k|

(float32's error bound on the sum, then one rounding to the narrow type, which differs from
rounding the exact value by at most one narrow ulp). A statement after the sum (a bias, a max)
rounds once more: one u of its operands' magnitudes per rounding.
"""

import warnings

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc
from tcstage.lang.types import BFLOAT16, FLOAT16, FLOAT32, promote

TYPES = [("half", np.dtype(np.float16), 2.0**-11),
         ("bfloat16", np.dtype(ml_dtypes.bfloat16), 2.0**-8)]
F32_U = 2.0**-24
rng = np.random.default_rng(15)

KERNELS = """
def kernels(T(M,K) A, T(N,K) B, T(G,N,K) X, T(G,M,K) Y, T(N) bias) -> (C, Z, O, S, R) {
  C(m,n) +=! A(m,k) * B(n,k)
  Z(g,n,m) +=! X(g,n,k) * Y(g,m,k)
  O(m,n) +=! A(m,k) * B(n,k)
  O(m,n) = O(m,n) + bias(n)
  O(m,n) = fmax(O(m,n), 0)
  S() +=! A(m,k)
  R(m) +=! A(m,k)
}
"""
SIZES = {"M": 5, "N": 3, "K": 48, "G": 2}


def define(text, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return tc.define(text, **kwargs)


def narrow(dtype, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def kernel_inputs(dtype):
    s = SIZES
    return [narrow(dtype, s["M"], s["K"]), narrow(dtype, s["N"], s["K"]),
            narrow(dtype, s["G"], s["N"], s["K"]), narrow(dtype, s["G"], s["M"], s["K"]),
            narrow(dtype, s["N"])]


def references(A, B, X, Y, bias):
    """(exact value, sum of |terms|, terms summed) per output, in float64."""
    A, B, X, Y, bias = (np.asarray(a, np.float64) for a in (A, B, X, Y, bias))
    K = A.shape[1]
    C, Cabs = A @ B.T, np.abs(A) @ np.abs(B).T
    Z = np.einsum("gnk,gmk->gnm", X, Y)
    Zabs = np.einsum("gnk,gmk->gnm", np.abs(X), np.abs(Y))
    return {"C": (C, Cabs, K), "Z": (Z, Zabs, K),
            "O": (np.maximum(C + bias, 0), Cabs + np.abs(bias), K),
            "S": (np.array(A.sum()), np.array(np.abs(A).sum()), A.size),
            "R": (A.sum(1), np.abs(A).sum(1), K)}


def assert_within(got, exact, magnitude, n, u, roundings=1, what=""):
    """`got` against the exact values: float32 summation of n terms, then `roundings` to
    the narrow type (see the module docstring)."""
    got = np.asarray(got, np.float64)
    bound = 2 * u * np.abs(exact) + n * F32_U * magnitude + (roundings - 1) * u * magnitude
    assert got.shape == exact.shape, what
    bad = np.abs(got - exact) > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} beyond the bound, "
                           f"worst {np.max(np.abs(got - exact) - bound)}")


def check_kernels(results, inputs, dtype, u):
    for name, got in zip("CZOSR", results):
        assert got.dtype == dtype, name
        exact, magnitude, n = references(*inputs)[name]
        assert_within(got, exact, magnitude, n, u, roundings=2 if name == "O" else 1, what=name)


# -- the language ---------------------------------------------------------------------------

def test_types_promotion_and_literals():
    assert promote(FLOAT16, BFLOAT16) == FLOAT32  # neither holds the other's values
    assert promote(BFLOAT16, FLOAT32) == FLOAT32
    fn = define("def f(bfloat16(N) A, half(N) H) -> (B, C, D) {\n"
                "  B(i) = A(i) * 0.5 + 1\n  C(i) = A(i) + H(i)\n  D(i) = exp(A(i))\n}").f.checked
    assert [str(fn.tensors[n].type) for n in "BCD"] == ["bfloat16", "float32", "bfloat16"]


def test_checked_program_accumulates_in_float32_and_the_option_keeps_it_narrow():
    text = ("def f(bfloat16(M,K) A) -> (S, X) {\n  S(m) +=! A(m,k)\n  X(m) max=! A(m,k)\n}")
    widened, kept = define(text).f, define(text, narrow_accumulation=True).f
    assert [str(r).splitlines()[0] for r in widened.ranges()] == [
        "S_acc(m) +=! A(m,k)", "S(m) = S_acc(m)", "X(m) max=! A(m,k)"]
    assert str(widened.checked.tensors["S_acc"].type) == "float32"
    assert [str(r).splitlines()[0] for r in kept.ranges()] == ["S(m) +=! A(m,k)",
                                                               "X(m) max=! A(m,k)"]
    # the gradient differentiates the function as written
    assert "_acc" not in tc.gradient(text.replace(", X", "").replace("  X(m) max=! A(m,k)\n", ""),
                                     "f")
    with pytest.raises(tc.TCArgumentError, match="narrow_accumulation takes True or False"):
        tc.define(text, narrow_accumulation="yes")


def test_errors_name_the_source_tensors():
    with pytest.raises(tc.TCRangeError, match="'O' takes its shape") as e:
        define("def f(half(N) A) -> (O) { O(i) +=! A(j) }")
    assert "O_acc" not in str(e.value)
    f = define("def f(bfloat16(N) A) -> (B) { B() +=! A(i) }").f
    with pytest.raises(tc.TCArgumentError, match=r"expects A of type bfloat16 \(ml_dtypes "
                                                 r"bfloat16\), got int64") as e:
        f(np.arange(3))
    assert "A.astype(ml_dtypes.bfloat16)" in str(e.value)
    with pytest.raises(tc.TCArgumentError, match="expects A of type bfloat16.*got float16"):
        f(np.ones(3, np.float16))


# -- CPU and emulated CUDA ---------------------------------------------------------------------

@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_pointwise_and_scalars(spelling, dtype, u):
    text = (f"def f({spelling}(N) A, {spelling}(N) B, {spelling} s) -> (C, E) {{\n"
            "  C(i) = A(i) * B(i) * s - 1.5\n  E(i) = exp(A(i))\n}")
    A, B = narrow(dtype, 16), narrow(dtype, 16)
    s = dtype.type(0.75)
    exact_c = np.float64(A) * np.float64(B) * 0.75 - 1.5
    magnitude_c = np.abs(np.float64(A) * np.float64(B) * 0.75) + 1.5
    exact_e = np.exp(np.float64(A))
    program = define(text)
    cpu = program.f(A, B, s)
    kernel = tc.compile(program, "f", A, B, s, options=tc.MappingOptions().mapToThreads(8),
                        target="cuda-emulated")
    for C, E in (cpu, kernel(A, B, float(s))):
        assert C.dtype == E.dtype == dtype
        # each of the 3 operations rounds once; exp is float32's, rounded once
        assert_within(C, exact_c, magnitude_c, 0, u, roundings=4, what="C")
        assert_within(E, exact_e, exact_e, 0, u, roundings=2, what="E")


@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_contractions_and_sums_on_the_cpu(spelling, dtype, u):
    inputs = kernel_inputs(dtype)
    check_kernels(define(KERNELS.replace("T(", f"{spelling}(")).kernels(*inputs), inputs,
                  dtype, u)


@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_contractions_and_sums_under_emulation(spelling, dtype, u):
    """The naive kernel (one thread), then tmm on a grid of blocks with shared memory and a row
    sum over threads."""
    inputs = kernel_inputs(dtype)
    program = define(KERNELS.replace("T(", f"{spelling}("))
    kernel = tc.compile(program, "kernels", *inputs, target="cuda-emulated")
    assert "float* tc_C_acc" in kernel.cuda_source
    check_kernels(kernel(*inputs), inputs, dtype, u)
    A, B = narrow(dtype, 16, 48), narrow(dtype, 8, 48)
    mapped = define(f"def tmm({spelling}(M,K) A, {spelling}(N,K) B) -> (C) {{\n"
                    "  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
                    f"def rows({spelling}(M,K) A) -> (R) {{ R(m) +=! A(m,k) }}")
    tiled = tc.MappingOptions().tile(4, 4).mapToThreads(4, 4).mapToBlocks(4, 2) \
        .useSharedMemory(True)
    kernel = tc.compile(mapped, "tmm", A, B, options=tiled, target="cuda-emulated")
    assert kernel.grid == (4, 2, 1) and kernel.block == (4, 4, 1)
    C = kernel(A, B)
    assert C.dtype == dtype
    assert_within(C, np.float64(A) @ np.float64(B).T, np.abs(np.float64(A)) @
                  np.abs(np.float64(B)).T, 48, u, what="tiled tmm")
    rows = tc.MappingOptions().mapToThreads(8).parallelReductions(False)
    R = tc.compile(mapped, "rows", A, options=rows, target="cuda-emulated")(A)
    assert_within(R, np.float64(A).sum(1), np.abs(np.float64(A)).sum(1), 48, u, what="rows")


@pytest.mark.parametrize("spelling, dtype, stall", [("half", np.float16, 2048),
                                                     ("bfloat16", ml_dtypes.bfloat16, 256)])
def test_float32_accumulation_is_used(spelling, dtype, stall):
    """4096 ones and 64 halves: 4128 is exact in both types, but a narrow running sum stops
    where adding 1 rounds back to itself (2048 in half, 256 in bfloat16)."""
    text = f"def total({spelling}(N) A) -> (S) {{ S() +=! A(i) }}"
    A = np.concatenate([np.ones(4096), np.full(64, 0.5)]).astype(dtype)
    widened, kept = define(text), define(text, narrow_accumulation=True)
    assert float(widened.total(A)) == 4128
    assert float(kept.total(A, schedule=None)) == stall  # the old behaviour: one narrow sum
    naive = tc.MappingOptions()
    assert float(tc.compile(widened, "total", A, options=naive,
                            target="cuda-emulated")(A)) == 4128
    assert float(tc.compile(kept, "total", A, options=naive, target="cuda-emulated")(A)) == stall


@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_in_out_and_scatter_sums_keep_untouched_points(spelling, dtype, u):
    """Accumulating into values the tensor has: copied into the float32 accumulator and back,
    exactly where the statement writes nothing."""
    text = (f"def f({spelling}(M,K) A, int32(K) I) -> (O, H) {{\n"
            "  O(m) += A(m,k)\n  H(j) = 0 where j in 0:6\n  H(I(k)) += A(0,k)\n}")
    A, I = narrow(dtype, 4, 64), np.arange(64, dtype=np.int32) % 4  # H(4), H(5) untouched
    start = narrow(dtype, 4, scale=100)
    O, H = define(text).f(A, I, out=start.copy())
    exact = np.float64(start) + np.float64(A).sum(1)
    assert_within(O, exact, np.abs(np.float64(start)) + np.abs(np.float64(A)).sum(1), 65, u)
    exact_h = np.array([np.float64(A[0, I == j]).sum() for j in range(6)])
    magnitude_h = np.array([np.abs(np.float64(A[0, I == j])).sum() for j in range(6)])
    assert_within(H, exact_h, magnitude_h, 16, u)
    assert (np.float64(H[4:]) == 0).all()


@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_min_and_max_are_exact(spelling, dtype, u):
    A = narrow(dtype, 6, 40)
    program = define(f"def f({spelling}(M,K) A) -> (L, H) {{\n  L(m) min=! A(m,k)\n"
                     "  H(m) max=! A(m,k)\n}")
    L, H = program.f(A)
    assert L.dtype == H.dtype == dtype
    np.testing.assert_array_equal(np.float64(L), np.float64(A).min(1))
    np.testing.assert_array_equal(np.float64(H), np.float64(A).max(1))


def test_bfloat16_cuda_source():
    program = define("def f(bfloat16(N) A, half(N) H) -> (S) { S() +=! A(i) * H(i) }")
    A = narrow(np.dtype(ml_dtypes.bfloat16), 8)
    source = tc.compile(program, "f", A, A.astype(np.float16), target="cuda-emulated").cuda_source
    assert "#include <cuda_bf16.h>" in source and "#include <cuda_fp16.h>" in source
    assert "const __nv_bfloat16* __restrict__ A" in source
    # (bfloat16 times half is float32: both converted, then summed in float32)
    assert "((float)(A[" in source and "((float)(H[" in source


@pytest.mark.parametrize("spelling, dtype, u", TYPES)
def test_an_initialisation_before_the_sum_keeps_its_shape(spelling, dtype, u):
    """The paper's MLP1 and sconv2d start with `O1(b,n) = B1(n)`, which bounds only n: the
    shape comes from the later `+=`. In half and bfloat16 that `+=` writes a float32
    accumulator, and range inference failed ("cannot infer the range of 'b'") until the
    accumulator's statements counted as the tensor's own. On the CPU and emulated."""
    with open("examples/mlp.tc") as f:
        mlp = define(f.read().replace("float(", f"{spelling}("))
    with open("examples/sconv2d.tc") as f:
        sconv = define(f.read().replace("float(", f"{spelling}("))
    I, W, b = narrow(dtype, 4, 40), narrow(dtype, 3, 40), narrow(dtype, 3)
    exact = np.maximum(I.astype(np.float64) @ W.astype(np.float64).T + b.astype(np.float64), 0)
    magnitude = np.abs(I.astype(np.float64)) @ np.abs(W.astype(np.float64)).T + \
        np.abs(b.astype(np.float64))
    kernel = tc.compile(mlp, "MLP1", I, W, b, target="cuda-emulated")
    for got in (mlp["MLP1"](I, W, b), kernel(I, W, b)):
        assert got.dtype == dtype
        assert_within(got, exact, magnitude, 41, u, what="MLP1")
    X, Wt, B = narrow(dtype, 2, 3, 9, 8), narrow(dtype, 4, 3, 3, 3), narrow(dtype, 4)
    x, wt = X.astype(np.float64), Wt.astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    exact = np.einsum("nchwij,fcij->nfhw", windows, wt) + B.astype(np.float64)[:, None, None]
    magnitude = np.einsum("nchwij,fcij->nfhw", np.abs(windows), np.abs(wt)) + \
        np.abs(B.astype(np.float64))[:, None, None]
    got = sconv["sconv2d"](2, 2, X, Wt, B)
    assert got.dtype == dtype and got.shape == (2, 4, 4, 3)
    assert_within(got, exact, magnitude, 28, u, what="sconv2d")


def test_pytorch_operators_take_float16_mlp1():
    """docs/torch.md: a `float` TC runs in float16 with float16 tensors (MLP1 failed range
    inference that way)."""
    torch = pytest.importorskip("torch")
    import tcstage.torch as tct
    with open("examples/mlp.tc") as f:
        op = tct.op(f.read(), "MLP1")
    I, W, b = (torch.randn(*s, dtype=torch.float16) for s in ((4, 32), (3, 32), (3,)))
    got = op(I, W, b)
    exact = torch.relu(I.double() @ W.double().T + b.double())
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -10, atol=32 * 2 ** -11)


def test_pytorch_operators_take_bfloat16_and_the_option():
    """A `float` TC retyped to the call's bfloat16 tensors, accumulating as its Program says."""
    torch = pytest.importorskip("torch")
    import tcstage.torch as tct
    text = "def total(float(N) A) -> (S) { S() +=! A(i) }"
    A = torch.cat([torch.ones(4096), torch.full((64,), 0.5)]).bfloat16()
    S = tct.op(text, "total")(A)
    assert S.dtype == torch.bfloat16 and float(S) == 4128
    assert float(tct.op(define(text, narrow_accumulation=True), "total")(A)) == 256


def test_tuning_checks_narrow_outputs_within_a_few_ulps():
    """The tuner's check of a candidate's outputs against the CPU's: a float32 sum reassociated
    by a candidate may round to a neighbour of the reference's narrow value, a wrong one not."""
    from tcstage.tune.evaluate import compare
    for dtype, ulp in ((np.float16, 2.0**-10), (ml_dtypes.bfloat16, 2.0**-7)):
        want = np.array([1.0, -2.0, 300.0]).astype(dtype)
        neighbour = (np.float64(want) * (1 + ulp)).astype(dtype)
        assert compare([neighbour], [want], ["C"]) == ""
        assert "C[2]" in compare([(np.float64(want) * [1, 1, 2]).astype(dtype)], [want], ["C"])


def test_halides_note_that_narrow_floats_are_emulated_stays_out_of_the_output(capsys):
    """Halide prints "(b)float16 type operation is emulated" for every narrow compile on a CPU
    without native support (issue 29): dropped, while other output of the compile stays."""
    fn = define("def quiet_bf16(bfloat16(N,K) X, bfloat16(M,K) Y) -> (O) {\n"
                "  O(i,j) +=! X(i,k) * Y(j,k)\n}").quiet_bf16
    X = np.ones((4, 8), ml_dtypes.bfloat16)
    print("before")
    np.testing.assert_array_equal(fn(X, X).astype(np.float32), np.full((4, 4), 8.0))
    out, err = capsys.readouterr()
    assert out == "before\n" and "emulated" not in err
