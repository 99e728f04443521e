"""Hardening of the CUDA path: inputs beside the well-trodden ones compile to kernels that are
right (equal to explicit loops under emulation, race-free, nvcc-clean through conftest), and
everything that goes wrong is a TCError or TCWarning that says what and where.

Covered: rank-0 tensors in promotion; barriers at the end of loop iterations and statements
outside the block-mapped bands; random small programs under promotion; 64-bit indexing of large
tensors; names that clash with C++, CUDA or the generated code, and isl names that clash with
each other; options that cannot take effect; located back-end errors; pycuda's errors; and
internal errors named by stage.
"""

import math
import re
import sys
import types
import warnings

import numpy as np
import pytest

import tcstage as tc
from tcstage import compiler
from tcstage.cuda import codegen, launch
from tcgen import random_program

M = tc.MappingOptions
rng = np.random.default_rng(10)


def f32(*shape):
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)


def run(source, name, *args, options=None, out=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(source, name, *args, options=options, target="cuda-emulated",
                            out=out)
    return kernel, kernel(*args, out=out)


# -- rank-0 tensors ----------------------------------------------------------------------------

PROMOTE_ALL = M().tile(4, 4).mapToThreads(4, 4).mapToBlocks(2, 2).useSharedMemory(True) \
    .usePrivateMemory(True)


@pytest.mark.parametrize("source,options,n", [
    ("def f(float(N) A) -> (T) { T() +=! A(n) }", PROMOTE_ALL, 9),
    # (mlp's 128 threads would split this reduction across threads, which keeps its
    # accumulators in registers of their own instead of a promoted buffer; TC's mlp preset
    # leaves promotion off)
    ("def f(float(2) I0) -> (T0) { T0() +=! I0(k) }",
     M.mlp().parallelReductions(False).useSharedMemory(True).usePrivateMemory(True), 2),
])
def test_reductions_to_a_scalar_are_promoted(source, options, n):
    A = f32(n)
    kernel, T = run(source, "f", A, options=options)
    assert any(p.sizes == () for p in kernel.compiled.promoted.promotions)
    np.testing.assert_allclose(T, A.sum(), rtol=1e-5)


@pytest.mark.parametrize("options", [PROMOTE_ALL, "mlp", M().tile(2).mapToThreads(4)
                                     .useSharedMemory(True).usePrivateMemory(True).unroll(4)])
def test_a_scalar_shared_by_every_thread(options):
    """A rank-0 temporary written by one thread and read by all of them, and a rank-0 output
    updated in place: promoted buffers of no dimension, barriers between writer and readers."""
    source = """def f(float(N) A) -> (B, R) {
      S() max=! A(n)
      B(i) = A(i) / S()
      R() +=! B(i) * A(i)
      R() = R() + S()
    }"""
    A = f32(11)
    _, (B, R) = run(source, "f", A, options=options)
    np.testing.assert_allclose(B, A / A.max(), rtol=1e-5)
    np.testing.assert_allclose(R, (A / A.max() * A).sum() + A.max(), rtol=1e-5)


# -- barriers and blocks ---------------------------------------------------------------------

def test_initialisation_by_other_threads_is_ordered_before_the_accumulation():
    """The identity of U is written by several threads and accumulated by thread 0 in later
    iterations of a loop that encloses both: every iteration in which anything runs ends with
    a barrier, not only those in which the last statement of the loop body runs."""
    source = """def f(float(P) A, float(P) B) -> (T, U) {
      T(i) max=! B(i) * A(n)
      U(j,l,k) +=! (B(k) * T(j+2) + T(l) + B(m-1)) * A(n)
    }"""
    A, B = f32(3), f32(3)
    kernel, (T, U) = run(source, "f", A, B, options="mlp")
    expected_T = (B[:, None] * A[None, :]).max(axis=1)
    inner = B[None, None, :] * expected_T[:, None, None] + expected_T[None, :, None]
    expected_U = (3 * inner + B.sum()) * A.sum()  # sum over m of B(m-1), n of A(n)
    np.testing.assert_allclose(T, expected_T, rtol=1e-5)
    np.testing.assert_allclose(U, expected_U, rtol=1e-5)


# Random programs (tests/tcgen.py) under promotion, against explicit loops; the emulator fails
# on a race. (seed, sizes, options): 17 has statements outside the block-mapped band, which must
# not run in every block; in 257 a thread reads from global memory an element of T1 that
# another thread keeps in a private copy, which must then stay in global memory.
RANDOM_CASES = [
    (17, {"P": 4, "Q": 4}, "conv"),
    (257, {"P": 3, "Q": 3}, M().tile(1, 4).mapToThreads(8).mapToBlocks(3).unroll(4)
     .useSharedMemory(True).usePrivateMemory(True).unrollCopyShared(True)
     .scheduleFusionStrategy("Min")),
    (13, {"P": 3, "Q": 3}, M().tile(2, 4).mapToThreads(4, 2).mapToBlocks(2, 2)
     .useSharedMemory(True).usePrivateMemory(True)),
    (25, {"P": 3, "Q": 4}, "mlp"),
    (35, {"P": 4, "Q": 2}, M().tile(1, 2, 2).mapToThreads(2, 4).useSharedMemory(True)
     .usePrivateMemory(True).unroll(4).scheduleFusionStrategy("Max")),
    (15, {"P": 2, "Q": 3}, M().tile(1, 2, 2).mapToThreads(2, 4).useSharedMemory(True)
     .usePrivateMemory(True).unroll(4).scheduleFusionStrategy("Max")),
]


@pytest.mark.parametrize("seed,sizes,options", RANDOM_CASES,
                         ids=[str(seed) for seed, *_ in RANDOM_CASES])
def test_random_programs_with_promotion_match_loops(seed, sizes, options):
    program = random_program(seed)
    args = program.inputs(sizes, np.random.default_rng(seed))
    _, got = run(program.source, "f", *args, options=options)
    got = got if isinstance(got, tuple) else (got,)
    for name, g, e in zip(program.outputs, got, program.reference(sizes, args)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * np.abs(e).max(),
                                   err_msg=f"{name} of\n{program.source}")


# -- 64-bit indexing ---------------------------------------------------------------------------

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


def test_tensors_of_two_to_the_31_elements_are_indexed_in_64_bits():
    big = tc.compile(TMM, "tmm", (2**16, 8), (2**15, 8), options="mlp",
                     target="cuda-emulated")  # C has 2**31 elements (compiled, never run)
    source = big.cuda_source
    assert "int64_t _M" in source and "int64_t _N" in source
    assert "for (int64_t " in source and "for (int " not in source
    assert re.search(r"C\[\(\(int64_t\)", source)  # the flat index computed in 64 bits
    small = tc.compile(TMM, "tmm", (40, 8), (30, 8), options="mlp", target="cuda-emulated")
    assert "int _M" in small.cuda_source and "int64_t" not in small.cuda_source


def test_64_bit_kernels_compute_the_same(monkeypatch):
    monkeypatch.setattr(codegen, "INT_ELEMENTS", 1)  # every kernel indexes in 64 bits
    A, B = f32(13, 6), f32(9, 6)
    kernel, C = run(TMM, "tmm", A, B, options=M().tile(4, 4, 2).mapToThreads(2, 2)
                    .mapToBlocks(2, 2).useSharedMemory(True).usePrivateMemory(True).unroll(4))
    assert "int64_t _M" in kernel.cuda_source
    np.testing.assert_allclose(C, A @ B.T, rtol=1e-5)
    # subscripts computed with / % min max in 64 bits; int32 values stay int32
    source = """def f(float(N) A, int32(N) I) -> (B, C) {
      B(i) = A(i / 2) + A(min(i, 3)) * A(max(N - 1 - i, 0) % 5) where i in 0:N
      C(i) = I(i) / 3 + min(I(i), 7) + I(i) % 4
    }"""
    A, I, i = f32(9), np.arange(-4, 5, dtype=np.int32), np.arange(9)
    kernel, (B, C) = run(source, "f", A, I, options="mlp")
    assert "tc::div<int64_t>" in kernel.cuda_source and "tc::div<int32_t>" in kernel.cuda_source
    np.testing.assert_allclose(B, A[i // 2] + A[np.minimum(i, 3)] * A[(8 - i) % 5], rtol=1e-6)
    np.testing.assert_array_equal(C, I // 3 + np.minimum(I, 7) + I % 4)


def _euclidean(a, b, dtype):
    """Halide's integer division and remainder: a = q * b + r with 0 <= r < |b|; x / 0 and
    x % 0 are 0; the quotient wraps to dtype (the most negative value / -1 is itself)."""
    q, r = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        rem = x % abs(y) if y else 0
        q.append((x - rem) // y if y else 0)
        r.append(rem)
    return np.array(q).astype(dtype), np.array(r).astype(dtype)  # (astype wraps)


def test_integer_division_is_euclidean_and_total_as_on_the_cpu():
    """Negative divisors, zero divisors and the most negative value over -1, in signed and
    unsigned types: C's / and % truncate toward zero, are undefined there, and trap on x86
    (the emulator's machine); the kernel computes what Halide computes."""
    source = """def f(int32(N) A, int32(N) D, int8(N) A8, int8(N) D8, uint32(N) AU, uint32(N) DU)
        -> (Q, R, Q8, R8, QU, RU) {
      Q(i) = A(i) / D(i)
      R(i) = A(i) % D(i)
      Q8(i) = A8(i) / D8(i)
      R8(i) = A8(i) % D8(i)
      QU(i) = AU(i) / DU(i)
      RU(i) = AU(i) % DU(i)
    }"""
    low, high = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    A = np.array([7, -7, 7, -7, 6, -6, 5, -5, 0, low, low, low, high, 3], np.int32)
    D = np.array([2, 2, -2, -2, -3, -3, 0, 0, 0, -1, 0, 7, low, 1], np.int32)
    A8 = np.array([7, -7, 7, -7, 6, -6, 5, -5, 0, -128, -128, -128, 127, 3], np.int8)
    D8 = np.array([2, 2, -2, -2, -3, -3, 0, 0, 0, -1, 0, 7, -128, 1], np.int8)
    AU = np.array([7, 0, 5, 2**32 - 1, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9], np.uint32)
    DU = np.array([2, 0, 0, 3, 2**32 - 1, 1, 5, 2, 3, 2, 4, 0, 3, 9], np.uint32)
    args = (A, D, A8, D8, AU, DU)
    expected = [*_euclidean(A, D, np.int32), *_euclidean(A8, D8, np.int8),
                *_euclidean(AU, DU, np.uint32)]
    _, got = run(source, "f", *args, options="pointwise")
    for name, g, cpu, e in zip(("Q", "R", "Q8", "R8", "QU", "RU"), got,
                               tc.define(source).f(*args), expected):
        np.testing.assert_array_equal(cpu, e, err_msg=f"{name} on the CPU")
        np.testing.assert_array_equal(g, e, err_msg=f"{name} under emulation")


# -- builtins -------------------------------------------------------------------------------------

_ONE = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
        "tanh": np.tanh, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
        "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
        "exp2": np.exp2, "log2": np.log2, "log10": np.log10,
        "erf": np.vectorize(math.erf), "floor": lambda x: np.floor(4 * x),
        "ceil": lambda x: np.ceil(4 * x), "trunc": lambda x: np.trunc(4 * x),
        "fabs": lambda x: np.abs(x - 1), "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
_TWO = {"pow": np.power, "fmax": np.fmax, "fmin": np.fmin, "atan2": np.arctan2,
        "fmod": lambda x, y: np.fmod(4 * x, y)}
_ARGS = {"floor": "4 * A(i)", "ceil": "4 * A(i)", "trunc": "4 * A(i)", "fabs": "A(i) - 1"}


@pytest.mark.parametrize("dtype,numpy_type,tolerance", [
    ("float", np.float32, 1e-5), ("double", np.float64, 1e-12), ("half", np.float16, 4e-3)])
def test_every_builtin_runs_in_every_float_type(dtype, numpy_type, tolerance):
    """Halide names float16 math `exp_f16` and rounding `round` (ties to even): CUDA's math
    library has neither, so they go through float32 and rint."""
    names = [*_ONE, *_TWO, "round"]
    lines = [f"O{k}(i) = {f}({_ARGS.get(f, 'A(i)')})" for k, f in enumerate(_ONE)]
    lines += [f"O{len(_ONE) + k}(i) = {f}(A(i), B(i))" for k, f in enumerate(_TWO)]
    lines.append(f"O{len(names) - 1}(j) = round(R(j))")
    source = (f"def f({dtype}(N) A, {dtype}(N) B, {dtype}(M) R) -> "
              f"({', '.join(f'O{k}' for k in range(len(names)))}) {{\n  "
              + "\n  ".join(lines) + "\n}")
    A, B = (np.linspace(0.15, 0.85, 6).astype(numpy_type) for _ in range(2))
    R = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.25, -2.75], numpy_type)
    _, outputs = run(source, "f", A, B, R, options="pointwise")
    a, b = A.astype(np.float64), B.astype(np.float64)
    expected = [f(a) for f in _ONE.values()] + [f(a, b) for f in _TWO.values()] + [np.round(R)]
    for name, got, want in zip(names, outputs, expected):
        tol = max(tolerance, 1e-6) if name == "erf" else tolerance  # Halide's erf is float32
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol,
                                   err_msg=name)


# -- names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["int", "main", "if", "threadIdx", "printf", "__syncthreads",
                                  "half", "expf", "time", "rand", "index", "cudaFree", "tc_f"])
def test_functions_named_like_cpp_or_cuda_compile(name):
    """(conftest compiles every kernel with nvcc; the emulator compiles it with g++)"""
    A = f32(5)
    kernel, B = run(f"def {name}(float(N) A) -> (B) {{ B(i) = A(i) * 2 }}", name, A,
                    options="pointwise")
    np.testing.assert_allclose(B, 2 * A)
    assert kernel.name != name and f"TC function '{name}'" in kernel.describe()


def test_tensors_named_like_math_functions_and_macros_compile():
    source = """def f(float(N) expf, float(N) tanhf, float(N) sqrtf, float(N) floorf)
        -> (NULL, NAN, INFINITY) {
      NULL(i) = exp(expf(i)) + tanh(tanhf(i))
      NAN(i) = sqrt(sqrtf(i)) * floor(floorf(i) * 3)
      INFINITY(i) +=! NULL(i) * NAN(j) where j in 0:N
    }"""
    e, t, s, f = (f32(4) for _ in range(4))
    _, (null, nan, inf) = run(source, "f", e, t, s, f, options="pointwise")
    np.testing.assert_allclose(null, np.exp(e) + np.tanh(t), rtol=1e-5)
    np.testing.assert_allclose(nan, np.sqrt(s) * np.floor(f * 3), rtol=1e-5)
    np.testing.assert_allclose(inf, null * nan.sum(), rtol=1e-5)


def test_tensors_named_like_lower_case_macros_compile():
    """GNU mode defines `linux` and `unix`; the C library's errno, stdin and the signal
    fields the emulator's runtime includes (si_pid) are macros; M_PIf is math.h's."""
    source = """def f(float(N) linux, float(N) errno, float(N) stdin) -> (M_PIf, si_pid) {
      M_PIf(i) = linux(i) * errno(i)
      si_pid(i) = M_PIf(i) + stdin(i)
    }"""
    a, b, c = (f32(4) for _ in range(3))
    _, (m, s) = run(source, "f", a, b, c, options="pointwise")
    np.testing.assert_allclose(m, a * b, rtol=1e-6)
    np.testing.assert_allclose(s, a * b + c, rtol=1e-6)


def test_isl_names_never_collide():
    """A size `T_0` beside the in/out output T (whose own size is `T.0`), and an index
    variable named like Halide's reduction variable of the same statement (`C_r$x`)."""
    A = f32(3)
    _, T = run("def f(float(T_0) A) -> (T) { T(i) += A(i) * 2 }", "f", A,
               options="pointwise", out=np.ones(3, np.float32))
    np.testing.assert_allclose(T, 1 + 2 * A)
    A = f32(3, 4)
    _, C = run("def f(float(N, K) A) -> (C) { C(C_r_x) +=! A(C_r_x, k) }", "f", A)
    np.testing.assert_allclose(C, A.sum(axis=1), rtol=1e-5)


# -- options that cannot take effect -----------------------------------------------------------

def test_options_without_effect_are_warned_about_and_kept():
    options = M().tile(4, 4, 4).mapToThreads(4, 4).mapToBlocks(4, 4).useSharedMemory(True) \
        .sharedDepth(9).privateDepth(2)
    with pytest.warns(tc.TCWarning) as record:
        kernel = tc.compile("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }", "f", (16,),
                            options=options, target="cuda-emulated")
    messages = "\n".join(str(w.message) for w in record)
    for pattern in [r"tile\(4, 4, 4\): the outermost band has 1 loop",
                    r"mapToThreads\(4, 4\): only 1 loop can be split across threads.*"
                    r"threadIdx\.y stays 1",
                    r"mapToBlocks\(4, 4\): blockIdx\.y stays 1: the outer band has 1 loop",
                    r"sharedDepth\(9\): .*promoted at depth",
                    r"privateDepth\(2\): has no effect without usePrivateMemory\(True\)"]:
        assert re.search(pattern, messages), (pattern, messages)
    assert len(kernel.compiled.notes) == 5
    assert {n.option for n in kernel.compiled.notes} == {
        "tile(4, 4, 4)", "mapToThreads(4, 4)", "mapToBlocks(4, 4)", "sharedDepth(9)",
        "privateDepth(2)"}


@pytest.mark.parametrize("tile,blocks,grid", [
    ((32, 8), (1, 8), (1, 8, 1)),  # TC's idiom: the leading 1 is the m loop's, not n's
    ((16, 8), (1, 8), (1, 8, 1)),
    ((32, 8), (8, 8), (1, 8, 1)),  # m has one tile: 1 block along x, 8 along y
    ((8, 8), (8, 8), (4, 8, 1)),
])
def test_each_block_size_goes_to_the_loop_it_names(tile, blocks, grid):
    """A single-tile outer loop once shifted the block sizes onto the next loop: tmm at M = 32
    with tile(32, 8).mapToBlocks(1, 8) ran on one block (the 1 went to n), and the warning
    blamed a dependence. Size k goes to loop k, as in TC."""
    a, b = f32(32, 16), f32(64, 16)
    options = M().tile(*tile).mapToThreads(8).mapToBlocks(*blocks)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", tc.TCWarning)
        kernel = tc.compile("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                            "{ C(m,n) +=! A(m,k) * B(n,k) }", "tmm", a, b, options=options,
                            target="cuda-emulated")
    assert kernel.grid == grid
    np.testing.assert_allclose(kernel(a, b), a @ b.T, rtol=1e-5)
    notes = [str(w.message) for w in record if "mapToBlocks" in str(w.message)]
    if grid[0] == 1 and blocks[0] > 1:
        assert notes and "blockIdx.x stays 1: its loop, the outer band's first, has a single " \
            "value" in notes[0] and "dependence" not in notes[0]
    else:
        assert not notes


def test_threads_where_only_reductions_run_are_warned_about():
    # (with parallelReductions, the default, the reduction itself takes the threads)
    with pytest.warns(tc.TCWarning, match=r"mapToThreads\(32\): no loop can be split"):
        tc.compile("def f(float(N) A) -> (S) { S() +=! A(n) }", "f", (8,),
                   options=M().mapToThreads(32).parallelReductions(False),
                   target="cuda-emulated")


# -- located errors ----------------------------------------------------------------------------

def test_static_out_of_bounds_names_the_line_the_sizes_and_an_instance():
    source = "def f(float(N) B) -> (A) {\n  A(i) = B(i + 1) where i in 0:N\n}"
    with pytest.raises(tc.TCArgumentError) as info:
        tc.compile(source, "f", (4,), target="cuda-emulated")
    text = str(info.value)
    assert info.value.line == 2 and "  A(i) = B(i + 1) where i in 0:N\n" in text
    assert "         ^~~~~~~~" in text
    assert "for N=4: at i = 3 it reads B(4), and B has indices 0..3" in text
    assert "S0" not in text and "_N" not in text


def test_out_of_bounds_writes_are_called_writes():
    source = "def f(float(N) A, float(M) C) -> (B) {\n  B(i) = A(i)\n  B(j) += C(j) where j in 0:M\n}"
    with pytest.warns(tc.TCWarning, match="the write of B at subscript 'j'"):
        program = tc.define(source)
    with pytest.raises(tc.TCArgumentError, match=r"the write accesses B\(j\) outside B for "
                       r"M=5, N=3: at j = 3 it writes B\(3\)") as info:
        tc.compile(program, "f", (3,), (5,), target="cuda-emulated")
    assert info.value.line == 3


def _stand_in_pycuda(fail: str):
    """pycuda's driver, compiler and gpuarray modules, failing at `fail`."""
    class Error(Exception):
        pass

    class CompileError(Error):
        pass

    class GPUArray:
        def __init__(self, array):
            self.array, self.gpudata = array, 4096

        def get(self):
            if fail == "copy":
                raise Error("an illegal memory access was encountered")
            return self.array

    class Function:
        def prepare(self, signature):
            pass

        def prepared_call(self, grid, block, *values):
            if fail == "launch":
                raise Error("cuLaunchKernel failed: too many resources requested for launch")

    def source_module(source, **options):
        if fail == "compile":
            raise CompileError("ptxas fatal: Unresolved extern function 'tc_helper'")
        return types.SimpleNamespace(get_function=lambda name: Function())

    def zeros(shape, dtype):
        if fail == "allocate":
            raise Error("cuMemAlloc failed: out of memory")
        return GPUArray(np.zeros(shape, dtype))

    device = types.SimpleNamespace(compute_capability=lambda: (9, 0))
    driver = types.SimpleNamespace(Error=Error, Context=types.SimpleNamespace(
        get_device=lambda: device, get_current=lambda: "a context"))
    gpuarray = types.SimpleNamespace(GPUArray=GPUArray, zeros=zeros, to_gpu=GPUArray)
    return driver, types.SimpleNamespace(SourceModule=source_module), gpuarray


@pytest.mark.parametrize("fail,message", [
    ("compile", r"compiling kernel 'tc_f' with pycuda for sm_90 failed: ptxas fatal"),
    ("allocate", r"allocating and copying the arrays of 'f' to the GPU failed: cuMemAlloc"),
    ("launch", r"launching kernel 'tc_f' on grid \(1, 1, 1\), block \(4, 1, 1\) failed: "
               r"cuLaunchKernel"),
    ("copy", r"running kernel 'tc_f' and copying its outputs back failed: an illegal memory"),
])
def test_pycuda_errors_become_tc_errors(monkeypatch, fail, message):
    modules = _stand_in_pycuda(fail)
    monkeypatch.setattr(launch, "_pycuda", lambda: modules)
    kernel = tc.compile("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }", "f", (4,),
                        options=M().mapToThreads(4), target="cuda")
    with pytest.raises(tc.TCError, match=message) as info:
        kernel(f32(4))
    assert info.value.__cause__ is not None


def test_a_thread_without_a_current_context_gets_the_primary_one(monkeypatch):
    """A CUDA context is current per thread; pycuda makes the primary one current only on the
    thread that imported pycuda.autoprimaryctx, so a launch from a thread pool's worker failed
    on an H200 with 'invalid device context'. Each driver call now pushes the primary context
    where none is current, and pops it after, also when the call fails."""
    modules = _stand_in_pycuda("launch")
    events = []
    current = []
    modules[0].Context.get_current = lambda: current[-1] if current else None
    modules[0].Context.pop = lambda: events.append(("pop", current.pop()))
    primary = types.SimpleNamespace(
        push=lambda: (current.append("primary"), events.append(("push", "primary"))))
    monkeypatch.setitem(sys.modules, "pycuda", types.SimpleNamespace(autoprimaryctx=None))
    monkeypatch.setitem(sys.modules, "pycuda.autoprimaryctx",
                        types.SimpleNamespace(context=primary))
    sys.modules["pycuda"].autoprimaryctx = sys.modules["pycuda.autoprimaryctx"]
    monkeypatch.setattr(launch, "_pycuda", lambda: modules)
    kernel = tc.compile("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }", "f", (4,),
                        options=M().mapToThreads(4), target="cuda")
    with pytest.raises(tc.TCError, match="launching kernel 'tc_f'"):
        kernel(f32(4))
    assert events and current == []
    assert events == [e for _ in range(len(events) // 2)
                      for e in (("push", "primary"), ("pop", "primary"))]


def test_an_internal_error_names_its_stage_and_function(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("S7")

    monkeypatch.setattr(compiler, "promote", broken)
    with pytest.raises(tc.TCError, match=r"internal error in stage 'promote' of 'f': "
                       r"KeyError: 'S7'") as info:
        tc.compile("def f(float(N) A) -> (B) { B(i) = A(i) }", "f", (4,),
                   target="cuda-emulated")
    assert isinstance(info.value.__cause__, KeyError) and "please report" in str(info.value)


# -- block ids a band does not map --------------------------------------------------------------

@pytest.mark.parametrize("options", [M().mapToBlocks(1, 2), M().mapToThreads(4).mapToBlocks(1, 3),
                                     M().mapToThreads(2, 2).mapToBlocks(1, 1, 2)],
                         ids=["y", "threads-y", "z"])
def test_a_band_pins_the_block_ids_it_does_not_map(options):
    """Two independent groups of statements each get a band; with one block along x, the first
    group's band maps only x. It must run in block y = 0 (z = 0) only: it ran in every block
    along y, and the in-place update of O happened twice (fuzz seed 123)."""
    source = """def f(float(N) A, float(M, M, M) W) -> (O, T) {
      O(i) += A(i) * 2
      T(m, k, l) = W(m, k, l) + 1
    }"""
    A, W, O = f32(5), f32(4, 4, 4), f32(5)
    expected = O + 2 * A
    kernel, (O_, T) = run(source, "f", A, W, options=options, out=O)
    np.testing.assert_allclose(O_, expected, rtol=1e-6)
    np.testing.assert_allclose(T, W + 1, rtol=1e-6)
    assert max(kernel.grid[1:]) > 1


# -- private copies and the barriers between threads -------------------------------------------

def test_private_copy_out_is_not_moved_past_the_barrier_another_thread_waits_for():
    """Each thread computes its own element of O0 (private, copied out at the end of the
    scope), and in the next iteration of the loop around the scope thread 0 reads all of
    them. The barrier that ordered the write before the read lies inside the scope, before the
    copy-out: thread 0 read stale values (fuzz seed 200). Such a group stays in global memory."""
    source = """def f(float(K) W, float(4) A) -> (O0, O1) {
      O0(r) = A(r)
      O0(r) += fabs(A(r / 2)) - expf(2.0)
      O1(l, k) *=! 1.0 + (W(l) / 2.0f - O0(2 * n + _v) + O0(k)) / 4.0f where _v in 0:2
      O1(p, x1) = O1(p, x1) * O0(x1) where p in 0:1
    }"""
    W, A = f32(4), f32(4)
    O0 = A + np.abs(A[np.arange(4) // 2]) - np.float32(np.exp(2.0))
    O1 = np.ones((4, 4), np.float32)
    for n in range(2):
        for v in range(2):
            O1 *= 1 + (W[:, None] / 2 - O0[2 * n + v] + O0[None, :]) / 4
    O1[0] *= O0
    options = M().tile(4, 3, 3).mapToThreads(8).usePrivateMemory(True) \
        .outerScheduleFusionStrategy("Max")
    kernel, (got0, got1) = run(source, "f", W, A, options=options)
    np.testing.assert_allclose(got0, O0, rtol=1e-5)
    np.testing.assert_allclose(got1, O1, rtol=1e-4)
    assert any("O0" in d and "another instance of this scope" in d
               for d in kernel.compiled.promoted.declined)
