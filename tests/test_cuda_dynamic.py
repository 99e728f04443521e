"""tc.compile(..., dynamic=("B",)): one kernel, compiled once, serves every value of the named
size variables. Each kernel runs under emulation for several values (1, below a tile, not a
multiple of one, above the blocks asked for) against numpy's einsum; the conftest also compiles
every generated kernel with nvcc."""

import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage import api
from tcstage.cuda import nvcc

TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
  C(m,n) +=! A(m,kk) * B(n,kk)
}
"""
TBMM = """
def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {
  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)
}
"""
MLP1 = """
def mlp1(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b, n) +=! I(b, m) * W1(n, m)
  O1(b, n) = O1(b, n) + B1(n)
  O1(b, n) = fmax(O1(b, n), 0)
}
"""
STRIDED = """
def strided(float(N) X, int32 s) -> (Y) {
  Y(i) = X(i * s) where i in 0:N/s
}
"""

rng = np.random.default_rng(13)


def rand(*shape):
    return rng.random(shape, dtype=np.float32) - 0.5


@pytest.fixture
def compiles(monkeypatch):
    """Counts the compilations behind tc.compile (the in-process cache serves the others)."""
    calls = []
    original = api.compile_cuda

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "compile_cuda", counted)
    return calls


def test_tbmm_one_kernel_for_every_batch_size(compiles):
    options = tc.MappingOptions().tile(4, 8).mapToThreads(8, 4).mapToBlocks(16)
    kernel = tc.compile(TBMM, "tbmm", (10, 6, 5), (10, 7, 5), options=options,
                        target="cuda-emulated", dynamic=("B",))
    assert kernel.dynamic == ("B",)
    assert "int64_t _B" in kernel.cuda_source  # a kernel argument, 64-bit indices
    for b in (0, 1, 3, 4, 10, 37, 70):  # 70: more tiles (18) than the 16 blocks asked for
        X, Y = rand(b, 6, 5), rand(b, 7, 5)
        np.testing.assert_allclose(kernel(X, Y), np.einsum("bnm,bkm->bnk", X, Y),
                                   rtol=1e-5, atol=1e-5)
        # tile 4 along b: ceil(B / 4) blocks, at most the 16 asked for
        assert kernel.launch_grid({"B": b}) == (max(1, min(-(-b // 4), 16)), 1, 1)
        # other batch sizes find the same kernel, without compiling again
        assert tc.compile(TBMM, "tbmm", (b, 6, 5), (b, 7, 5), options=options,
                          target="cuda-emulated", dynamic=("B",)) is kernel
    assert compiles == ["tbmm"]


def test_shared_memory_promotion_with_dynamic_rows(compiles):
    """The tiles of A and B along the tiled, dynamic M are bounded by the tile (32), so both
    are promoted to shared memory once, for every M."""
    options = tc.MappingOptions().tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(4, 4) \
        .useSharedMemory(True).unroll(4)
    kernel = tc.compile(TMM, "tmm", (70, 20), (40, 20), options=options,
                        target="cuda-emulated", dynamic="M")
    shared = {p.tensor: p.sizes for p in kernel.compiled.promoted.promotions
              if p.memory == "shared"}
    assert shared == {"A": (32, 20), "B": (32, 20)}
    for m in (1, 5, 32, 33, 70, 150):
        A, B = rand(m, 20), rand(40, 20)
        np.testing.assert_allclose(kernel(A, B), np.einsum("mk,nk->mn", A, B),
                                   rtol=1e-5, atol=1e-5)
        assert kernel.launch_grid({"M": m}) == (min(-(-m // 32), 4), 2, 1)
    assert compiles == ["tmm"]


def test_register_tiling_and_unrolling_with_dynamic_batch(compiles):
    options = tc.MappingOptions().tile(16, 16).mapToThreads(4, 4).mapToBlocks(8, 8) \
        .useRegisterTiling(True).usePrivateMemory(True).unroll(16)
    kernel = tc.compile(MLP1, "mlp1", (20, 12), (24, 12), (24,), options=options,
                        target="cuda-emulated", dynamic=("B",))
    private = {p.tensor for p in kernel.compiled.promoted.promotions if p.memory == "private"}
    assert "O1" in private  # a thread's outputs stay in registers over the reduction
    assert kernel.compiled.mapped.unrolled > 0
    for b in (1, 3, 16, 17, 40):
        I, W, bias = rand(b, 12), rand(24, 12), rand(24)
        want = np.maximum(np.einsum("bm,nm->bn", I, W) + bias, 0)
        np.testing.assert_allclose(kernel(I, W, bias), want, rtol=1e-5, atol=1e-5)
    assert compiles == ["mlp1"]


def test_footprint_growing_with_a_dynamic_size_is_not_promoted():
    """M not tiled: A's tile per block is all of its M rows, so no fixed-size buffer holds it;
    it stays in global memory with a note, and the kernel is right for every M."""
    options = tc.MappingOptions().tile(0, 32).mapToThreads(32, 8).mapToBlocks(4) \
        .useSharedMemory(True)
    with pytest.warns(tc.TCWarning, match=r"A \(A\(m, kk\)\) is not promoted: its tile grows "
                                          r"with the dynamic size\(s\) M"):
        kernel = tc.compile(TMM, "tmm", (10, 20), (40, 20), options=options,
                            target="cuda-emulated", dynamic=("M",))
    assert {p.tensor for p in kernel.compiled.promoted.promotions} == {"B"}
    assert any("grows with the dynamic size(s) M" in why
               for why in kernel.compiled.promoted.declined)
    for m in (1, 9, 41):
        A, B = rand(m, 20), rand(40, 20)
        np.testing.assert_allclose(kernel(A, B), A @ B.T, rtol=1e-5, atol=1e-5)


def test_the_other_sizes_stay_fixed():
    kernel = tc.compile(TMM, "tmm", (8, 20), (40, 20), target="cuda-emulated",
                        options=tc.MappingOptions().tile(4).mapToThreads(8).mapToBlocks(4),
                        dynamic=("M",))
    with pytest.raises(tc.TCArgumentError, match=r"compiled for K=20, N=40, M any; the "
                                                 r"arguments give K=20, N=41"):
        kernel(rand(5, 20), rand(41, 20))
    with pytest.raises(tc.TCArgumentError, match="size variable K is 20"):
        kernel(rand(5, 20), rand(40, 21))


def test_without_dynamic_sizes_nothing_changes():
    options = tc.MappingOptions().tile(4).mapToThreads(8).mapToBlocks(4)
    kernel = tc.compile(TMM, "tmm", (8, 20), (40, 20), options=options,
                        target="cuda-emulated")
    assert kernel.dynamic == () and "int _M" in kernel.cuda_source
    with pytest.raises(tc.TCArgumentError, match="compiled for K=20, M=8, N=40"):
        kernel(rand(9, 20), rand(40, 20))
    # a dynamic kernel is another cache entry
    assert tc.compile(TMM, "tmm", (8, 20), (40, 20), options=options, target="cuda-emulated",
                      dynamic=("M",)) is not kernel


@pytest.mark.parametrize("dynamic, message", [
    (("Q",), r"'tmm' has no size variable Q \(its size variables: K, M, N\)"),
    (("m",), r"has no size variable m; did you mean 'M'\?"),
    (("N", "Kk"), r"has no size variable Kk; did you mean 'K'\?"),
    (("A",), r"A is a tensor of 'tmm', not a size variable"),
    ((3,), r"dynamic= takes names of size variables"),
    (3, r"dynamic= takes names of size variables"),  # not iterable: was a raw TypeError
])
def test_dynamic_names_are_checked(dynamic, message):
    with pytest.raises(tc.TCError, match=message):
        tc.compile(TMM, "tmm", (8, 20), (40, 20), target="cuda-emulated", dynamic=dynamic)


def test_a_scalar_cannot_be_dynamic():
    with pytest.raises(tc.TCError, match=r"s is a scalar input of 'strided', not a size "
                                         r"variable.*specialised"):
        tc.compile(STRIDED, "strided", (10,), 2, target="cuda-emulated", dynamic=("s",))


def test_dynamic_size_beside_a_specialised_scalar():
    kernel = tc.compile(STRIDED, "strided", (10,), 2, target="cuda-emulated", dynamic=("N",),
                        options=tc.MappingOptions().tile(8).mapToThreads(8).mapToBlocks(4))
    for n in (1, 2, 9, 40):
        X = rand(n)
        np.testing.assert_array_equal(kernel(X, 2), X[: (n // 2) * 2: 2])


def test_dynamic_kernel_source_compiles_with_nvcc():
    if nvcc.nvcc_path() is None:
        pytest.skip("nvcc is not installed here")
    options = tc.MappingOptions().tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(4, 4) \
        .useSharedMemory(True).unroll(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(TBMM, "tbmm", (10, 26, 72), (10, 26, 72), options=options,
                            target="cuda", dynamic=("B",))
    assert nvcc.compile_check(kernel.cuda_source)


def test_halide_pipelines_have_no_dynamic_sizes():
    hl = pytest.importorskip("halide")
    inp = hl.ImageParam(hl.Float(32), 1, "inp")
    x = hl.Var("x")
    f = hl.Func("f")
    f[x] = inp[x] * 2
    with pytest.raises(tc.TCError, match="dynamic= is for TC functions"):
        tc.compile(tc.from_halide(f, name="double"), (8,), output_shape=(8,),
                   target="cuda-emulated", dynamic=("x",))


def test_describe_and_explain_name_the_dynamic_sizes():
    kernel = tc.compile(TMM, "tmm", (8, 20), (40, 20), target="cuda-emulated",
                        options=tc.MappingOptions().tile(4).mapToThreads(8).mapToBlocks(4),
                        dynamic=("M",))
    assert "(dynamic: M)" in kernel.describe()
    assert "M dynamic (now 8)" in kernel.explain()
    assert "computed at launch from the dynamic sizes M" in kernel.cuda_source


def test_cli_show_and_run_take_dynamic(capsys):
    from pathlib import Path

    from tcstage.cli import main
    tmm = Path(__file__).parent.parent / "examples" / "tmm.tc"
    options = "MappingOptions().tile(8, 8).mapToThreads(8, 8).mapToBlocks(4, 4)"
    assert main(["show", str(tmm), "--cuda", "--options", options, "--sizes", "M=16,K=8,N=12",
                 "--dynamic", "M"]) == 0
    assert "computed at launch from the dynamic sizes M" in capsys.readouterr().out
    assert main(["run", str(tmm), "--target", "cuda-emulated", "--options", options,
                 "--sizes", "M=5,K=8,N=12", "--dynamic", "M", "--repeat", "1"]) == 0
    assert main(["run", str(tmm), "--target", "cuda-emulated", "--sizes", "M=5,K=8,N=12",
                 "--dynamic", "Mx", "--repeat", "1"]) == 1
    assert "did you mean 'M'?" in capsys.readouterr().err
