"""Reductions split across the threads of a block (parallelReductions, issue 15): full sums, row
statistics, softmax, layernorm and TC's moments kernels, for every reduction operator and
several types, run as emulated CUDA and compared with numpy.

Tolerances: a sum of n terms in any order differs from the exact sum by at most
(n - 1) * u * sum(|a_i|) (u: the unit roundoff of the accumulator), so sums are checked
against float64 numpy with atol = n * u * sum(|a|); min and max are exact, and integer
reductions are compared exactly.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tcstage as tc
from tcstage.cuda import nvcc

M = tc.MappingOptions
WIDE = M().mapToThreads(256).mapToBlocks(16)

SOURCE = """
def full_sum(float(N) A) -> (O) { O() +=! A(i) }
def row_sum(float(R, C) A) -> (O) { O(r) +=! A(r, c) }
def row_prod(double(R, C) A) -> (O) { O(r) *=! A(r, c) }
def row_max(float(R, C) A) -> (O) { O(r) max=! A(r, c) }
def col_min(int32(R, C) A) -> (O) { O(c) min=! A(r, c) }
def int_sum(int64(R, C) A) -> (O) { O(r) +=! A(r, c) }
def sum3(float(R, C, D) A) -> (O) { O(r) +=! A(r, c, d) }
def half_sum(half(R, C) A) -> (O) { O(r) +=! A(r, c) }
def softmax(float(N, C) X) -> (Mx, E, S, Y) {
    Mx(n) max=! X(n, c)
    E(n, c) = exp(X(n, c) - Mx(n))
    S(n) +=! E(n, c)
    Y(n, c) = E(n, c) / S(n)
}
def layernorm(float(N, C) X, float(C) g, float(C) b) -> (mean, var, Y) {
    mean(n) +=! X(n, c) / C
    var(n) +=! (X(n, c) - mean(n)) * (X(n, c) - mean(n)) / C
    Y(n, c) = g(c) * (X(n, c) - mean(n)) * rsqrt(var(n) + 1e-5) + b(c)
}
def moments(float(N, K) I) -> (mean, var) {
    mean(n) +=! I(n, k)
    var(n) +=! I(n, k) * I(n, k)
    mean(n) = mean(n) / K
    var(n) = var(n) / K - mean(n) * mean(n)
}
def tc_sum(float(N, K) I) -> (s) { s(n) +=! I(n, k) }
def tc_var(float(N, K) I, float(N) mean) -> (var) {
    var(n) +=! I(n, k) * I(n, k)
    var(n) = var(n) / K - mean(n) * mean(n)
}
"""

_program = None


def program():
    global _program
    if _program is None:
        _program = tc.define(SOURCE)
    return _program


def run(name, *args, options=WIDE):
    k = tc.compile(program(), name, *args, options=options, target="cuda-emulated")
    out = k(*args)
    return k, out if isinstance(out, tuple) else (out,)


def sum_tolerance(terms: np.ndarray, axis=None, dtype=np.float32) -> np.ndarray:
    """n * u * sum(|a|): the bound on any summation order's error (see the module doc)."""
    n = terms.size if axis is None else terms.shape[axis]
    return n * np.finfo(dtype).eps * np.abs(terms.astype(np.float64)).sum(axis=axis) + 1e-30


def split(k) -> list:
    return list(k.compiled.mapped.reductions)


def test_full_sum_is_split_over_a_block_not_one_thread():
    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    k, (o,) = run("full_sum", a)
    assert k.block == (256, 1, 1) and len(split(k)) == 1
    assert "__shfl_down_sync" in k.cuda_source
    expected = a.astype(np.float64).sum()
    assert abs(float(o) - expected) <= sum_tolerance(a)


def test_switching_it_off_keeps_one_thread():
    a = np.arange(100, dtype=np.float32)
    k, (o,) = run("full_sum", a, options=WIDE.parallelReductions(False))
    assert k.block == (1, 1, 1) and not split(k)
    assert float(o) == 4950.0


@pytest.mark.parametrize("rows,cols", [(4, 1000), (3, 1), (5, 33), (2, 4097)])
def test_row_sum_at_awkward_sizes(rows, cols):
    a = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    k, (o,) = run("row_sum", a)
    assert split(k) or cols == 1
    np.testing.assert_array_less(np.abs(o - a.astype(np.float64).sum(1)),
                                 sum_tolerance(a, axis=1))


@pytest.mark.parametrize("options", [
    WIDE,
    M().tile(1, 128).mapToThreads(128).mapToBlocks(4),  # a combine per column tile
    M().mapToThreads(32, 4).mapToBlocks(8),  # the y threads' share is the identity
    M().mapToThreads(1024).mapToBlocks(2),
], ids=["wide", "tiled", "xy", "1024"])
def test_row_sum_under_several_options(options):
    a = np.random.default_rng(1).uniform(-1, 1, (6, 700)).astype(np.float32)
    k, (o,) = run("row_sum", a, options=options)
    assert split(k)
    np.testing.assert_array_less(np.abs(o - a.astype(np.float64).sum(1)),
                                 sum_tolerance(a, axis=1))


@pytest.mark.parametrize("name,shape,blocks", [
    ("full_sum", (5000,), (8,)),
    ("row_sum", (3, 3000), (3, 4)),
    ("row_max", (3, 3000), (3, 5)),
    ("col_min", (2000, 3), (3, 6)),
])
def test_split_across_blocks_combines_in_block_order(name, shape, blocks):
    rng = np.random.default_rng(9)
    a = (rng.integers(-1000, 1000, shape).astype(np.int32) if name == "col_min"
         else rng.standard_normal(shape).astype(np.float32))
    k = tc.compile(program(), name, a, options=M().mapToThreads(256).mapToBlocks(*blocks),
                   target="cuda-emulated")
    (r,) = split(k)
    d, n = r.across
    assert k.grid[d] == n > 1 and set(k.scratch) == {"_part0", "_count0"}
    call = k.prepare(a)  # the same arrays launched twice: the last block resets the count
    call.launch()
    got = call()
    reference = {"full_sum": lambda x: x.astype(np.float64).sum(),
                 "row_sum": lambda x: x.astype(np.float64).sum(1),
                 "row_max": lambda x: x.max(1), "col_min": lambda x: x.min(0)}[name](a)
    if name in ("row_max", "col_min"):
        np.testing.assert_array_equal(got, reference)
    else:
        axis = None if a.ndim == 1 else 1
        np.testing.assert_array_less(np.abs(got - reference), sum_tolerance(a, axis=axis))


def test_blocks_split_only_a_reduction_that_waits_for_nothing():
    """Blocks cannot wait for each other: a reduction that reads what the kernel computes, or
    shares its loops with another statement, stays within a block (review findings: T's points
    spread over blocks and then pinned to the first ones; Q read O from other blocks)."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal((4, 300)).astype(np.float32)
    k = tc.compile("def f(float(N,K) A) -> (T, O) { T(i,j) = A(i,j)*2\n O(i) +=! T(i,j) }", "f",
                   a, options=M().mapToThreads(32).mapToBlocks(4, 8), target="cuda-emulated")
    assert all(r.across is None for r in split(k))
    t, o = k(a)
    np.testing.assert_array_equal(t, 2 * a)
    np.testing.assert_array_less(np.abs(o - 2 * a.astype(np.float64).sum(1)),
                                 2 * sum_tolerance(a, axis=1))
    b = rng.standard_normal((9, 130)).astype(np.float32)
    k = tc.compile("def f(float(N,K) A) -> (O, Q) { O(i) +=! A(i,j)\n Q(i) +=! A(i,j) - O(i) }",
                   "f", b, options=M().mapToThreads(32).mapToBlocks(16, 2),
                   target="cuda-emulated")
    o, q = k(b)
    b64 = b.astype(np.float64)
    np.testing.assert_allclose(q, (b64 - b64.sum(1, keepdims=True)).sum(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape,blocks", [((6, 70), (4,)), ((6, 300), (4, 4))])
def test_dynamic_sizes_keep_reductions_within_blocks(shape, blocks):
    a = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    source = "def f(float(N,K) A) -> (O) { O(i) +=! A(i,j) }" if len(blocks) > 1 else \
        "def f(float(N,K) A) -> (O) { O() +=! A(i,j) }"
    k = tc.compile(source, "f", a, options=M().mapToThreads(64).mapToBlocks(*blocks),
                   dynamic=("N",), target="cuda-emulated")
    assert all(r.across is None for r in split(k))
    axis = 1 if len(blocks) > 1 else None
    exact = a.astype(np.float64).sum(axis=axis)
    np.testing.assert_array_less(np.abs(k(a) - exact), sum_tolerance(a, axis=axis))


def test_a_reduction_leaves_the_threads_to_outer_loops_that_fill_a_warp():
    """gconv with the paper's manual options: the (h, w) band gives 7 x 7 threads, so its
    inner band of reduction loops stays sequential (it once took the threads instead)."""
    with open("examples/gconv.tc") as f:
        program_ = tc.define(f.read())
    options = M.parse("MappingOptions().tile(1, 1, 1).mapToThreads(7, 7, 4).mapToBlocks(32, 32)"
                      ".useSharedMemory(True).unrollCopyShared(True)")
    k = tc.compile(program_, "gconv", (32, 32, 16, 16, 16), (32, 16, 16, 3, 3), options=options)
    assert k.block == (7, 7, 1) and not split(k)


def test_whole_warps_never_exceed_a_block():
    """Rounding x up to whole warps would give 32 x 8 x 8 threads: the reduction stays
    sequential instead, and the kernel keeps the 4 x 8 x 8 it had."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((8, 8, 4)).astype(np.float32)
    a = rng.standard_normal((2, 300)).astype(np.float32)
    k = tc.compile("def f(float(P,Q,R) X, float(N,K) A) -> (B, S) { B(p,q,r) = X(p,q,r) * 2.0\n"
                   " S(i) +=! A(i,j) }", "f", x, a, options=M().mapToThreads(4, 8, 8),
                   target="cuda-emulated")
    assert math.prod(k.block) <= 1024 and not split(k)
    b, s = k(x, a)
    np.testing.assert_array_equal(b, 2 * x)
    np.testing.assert_allclose(s, a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


def test_product_max_min_and_integers():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.9, 1.1, (3, 300))
    k, (o,) = run("row_prod", p)
    assert split(k)[0].reduction.operator == "mul"
    np.testing.assert_allclose(o, p.prod(1), rtol=1e-12)

    x = rng.standard_normal((5, 77)).astype(np.float32)
    x[2] = -np.inf
    k, (o,) = run("row_max", x)
    assert split(k)[0].reduction.operator == "max"
    np.testing.assert_array_equal(o, x.max(1))

    i = rng.integers(-1000, 1000, (300, 7), dtype=np.int32)
    k, (o,) = run("col_min", i)
    assert split(k)[0].reduction.operator == "min"
    np.testing.assert_array_equal(o, i.min(0))

    j = rng.integers(-2**40, 2**40, (3, 500), dtype=np.int64)
    k, (o,) = run("int_sum", j)
    assert split(k)
    np.testing.assert_array_equal(o, j.sum(1))


NARROW = {"float": np.float32, "half": np.float16, "bfloat16": ml_dtypes.bfloat16}
OPERATORS = {"+=!": np.sum, "*=!": np.prod, "min=!": np.min, "max=!": np.max}


@pytest.mark.parametrize("op", OPERATORS)
@pytest.mark.parametrize("type_name", NARROW)
def test_every_operator_for_float_half_and_bfloat16(type_name, op):
    """Row reductions split over 128 threads: + and * accumulate in float32 (the narrow types'
    default accumulator), min and max shuffle the narrow values themselves."""
    dtype = NARROW[type_name]
    rng = np.random.default_rng(len(op) + len(type_name))
    values = rng.uniform(0.99, 1.01, (3, 300)) if op == "*=!" else rng.standard_normal((3, 300))
    a = values.astype(dtype)
    k = tc.compile(f"def f({type_name}(R, C) A) -> (O) {{ O(r) {op} A(r, c) }}", "f", a,
                   options=M().mapToThreads(128).mapToBlocks(3), target="cuda-emulated")
    (r,) = split(k)
    assert r.threads == 128 and r.reduction.dtype == (
        "float32" if op in ("+=!", "*=!") else {"float": "float32", "half": "float16",
                                                "bfloat16": "bfloat16"}[type_name])
    got = k(a).astype(np.float64)
    exact = OPERATORS[op](a.astype(np.float64), axis=1)
    if op in ("min=!", "max=!"):
        np.testing.assert_array_equal(got, exact)
        return
    u = {"float": 2.0**-24, "half": 2.0**-11, "bfloat16": 2.0**-8}[type_name]
    terms = np.abs(a.astype(np.float64)) if op == "+=!" else np.abs(np.log(a.astype(np.float64)))
    # float32 partial results in any order, then one rounding to the tensor's type
    bound = 300 * 2.0**-24 * (terms.sum(1) if op == "+=!" else np.abs(exact)) * 2 \
        + u * np.abs(exact) + 1e-30
    np.testing.assert_array_less(np.abs(got - exact), bound)


def test_several_reduction_loops_keep_the_outer_ones_sequential_per_thread():
    a = np.random.default_rng(3).standard_normal((3, 40, 50)).astype(np.float32)
    k, (o,) = run("sum3", a)
    assert split(k)
    np.testing.assert_array_less(np.abs(o - a.astype(np.float64).sum((1, 2))),
                                 sum_tolerance(a.reshape(3, -1), axis=1))


def test_half_inputs_accumulate_in_float_across_threads():
    a = np.random.default_rng(4).uniform(0, 1, (3, 2000)).astype(np.float16)
    k, (o,) = run("half_sum", a)
    assert split(k) and split(k)[0].reduction.dtype == "float32"
    exact = a.astype(np.float64).sum(1)
    # float32 partial sums, then one rounding to half
    np.testing.assert_array_less(np.abs(o.astype(np.float64) - exact),
                                 sum_tolerance(a, axis=1) + np.abs(exact) * 2.0**-11)


def test_softmax():
    x = np.random.default_rng(5).standard_normal((7, 300)).astype(np.float32)
    k, (mx, e, s, y) = run("softmax", x)
    assert {r.reduction.operator for r in split(k)} == {"max", "add"}
    np.testing.assert_array_equal(mx, x.max(1))
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)


def test_layernorm():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 600)).astype(np.float32)
    g, b = rng.standard_normal(600).astype(np.float32), rng.standard_normal(600).astype(np.float32)
    k, (mean, var, y) = run("layernorm", x, g, b)
    assert len(split(k)) == 2
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(1), atol=1e-5)
    np.testing.assert_allclose(var, x64.var(1), rtol=1e-4)
    ref = g * (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) + b
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_tc_moments_sum_and_var():
    i = np.random.default_rng(7).uniform(0, 1, (6, 3000)).astype(np.float32)
    i64 = i.astype(np.float64)
    k, (mean, var) = run("moments", i)
    assert len(split(k)) == 2
    np.testing.assert_allclose(mean, i64.mean(1), rtol=1e-5)
    np.testing.assert_allclose(var, (i64 ** 2).mean(1) - i64.mean(1) ** 2, atol=1e-5)
    k, (s,) = run("tc_sum", i)
    np.testing.assert_array_less(np.abs(s - i64.sum(1)), sum_tolerance(i, axis=1))
    mean = i.mean(1).astype(np.float32)
    k, (v,) = run("tc_var", i, mean)
    assert split(k)
    np.testing.assert_allclose(v, (i64 ** 2).mean(1) - mean.astype(np.float64) ** 2, atol=1e-5)


@pytest.mark.parametrize("options", [
    WIDE.useSharedMemory(True).usePrivateMemory(True),
    # E's private copy in the first loop nest is read by other threads in the second: a
    # scope must see the statements outside it (promotion once looked only inside)
    WIDE.tile(1, 64).usePrivateMemory(True),
    # (the rows' point loop could take 4 threads: only the forced split takes the row loop)
    M().tile(4, 32).mapToThreads(32, 4).mapToBlocks(8).useSharedMemory(True)
    .parallelReductions(True),
    WIDE.scheduleFusionStrategy("Min"),
], ids=["promoted", "tiled-private", "tiled-xy", "unfused"])
@pytest.mark.parametrize("name", ["softmax", "layernorm", "moments"])
def test_row_statistics_under_promotion_and_fusion(name, options):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((7, 300)).astype(np.float32)
    args = [x] + ([rng.standard_normal(300).astype(np.float32) for _ in range(2)]
                  if name == "layernorm" else [])
    k, got = run(name, *args, options=options)
    assert len(split(k)) == 2 and k.grid[0] > 1  # rows on blocks, both statistics split
    expected = program()[name](*args)  # Halide's CPU result
    for g, e in zip(got, expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(nvcc.nvcc_path() is None, reason="nvcc is not installed")
def test_a_statistic_is_read_after_the_barrier_that_publishes_it():
    """On an H200, softmax's E came out inf everywhere: every thread loaded Mx(n) before the
    barrier after which thread 0's maximum is visible, and nvcc reused that load afterwards,
    because Mx was a `__restrict__` pointer (the emulator, compiled by GCC, reloads). Only the
    inputs are restricted now, and in the PTX the exp loop's operand is loaded after the last
    barrier before it."""
    x = np.random.default_rng(8).standard_normal((7, 300)).astype(np.float32)
    k, _ = run("softmax", x, options=WIDE.useSharedMemory(True).usePrivateMemory(True))
    signature = k.cuda_source.split("tc_softmax(", 1)[1].split(")", 1)[0]
    for p in signature.split(", "):
        if "*" in p:
            assert ("__restrict__" in p) == p.startswith("const "), p
    lines = nvcc.ptx(k.cuda_source).splitlines()
    first_exp = next(i for i, line in enumerate(lines) if "ex2.approx" in line)
    barrier = max(i for i, line in enumerate(lines[:first_exp]) if "bar.sync" in line)
    assert any("ld.global.f32" in line for line in lines[barrier:first_exp])


GROUP_NORM = """
def group_norm(float(N, G, D, H, W) I, float(G, D) gamma, float(G, D) beta) -> (mean, var, O) {
    mean(n, g) +=! I(n, g, d, h, w)
    var(n, g) +=! I(n, g, d, h, w) * I(n, g, d, h, w)
    mean(n, g) = mean(n, g) / (D * H * W)
    var(n, g) = var(n, g) / (D * H * W) - mean(n, g) * mean(n, g)
    O(n, g, d, h, w) = gamma(g, d) * (I(n, g, d, h, w) - mean(n, g))
                       * rsqrt(var(n, g) + 1e-5) + beta(g, d)
}
"""


@pytest.mark.parametrize("options", [
    M().mapToThreads(128).mapToBlocks(2, 4),
    M().mapToThreads(32, 4).mapToBlocks(8).useSharedMemory(True).parallelReductions(True),
], ids=["blocks", "shared"])
def test_tc_group_norm(options):
    """TC's group normalisation benchmark in one kernel: moments over three reduction loops
    (the innermost split over threads, the others sequential in each), then the normalisation."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 4, 3, 5, 7)).astype(np.float32)
    gamma, beta = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2))
    k = tc.compile(GROUP_NORM, "group_norm", x, gamma, beta, options=options,
                   target="cuda-emulated")
    assert len(split(k)) == 2
    mean, var, out = k(x, gamma, beta)
    flat = x.reshape(2, 4, -1).astype(np.float64)
    m, v = flat.mean(2), (flat ** 2).mean(2) - flat.mean(2) ** 2
    np.testing.assert_allclose(mean, m, atol=1e-6)
    np.testing.assert_allclose(var, v, rtol=1e-5, atol=1e-6)
    expected = gamma[None, :, :, None, None] * (x - m[:, :, None, None, None]) \
        / np.sqrt(v[:, :, None, None, None] + 1e-5) + beta[None, :, :, None, None]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_explain_says_how_the_reduction_was_split():
    a = np.zeros((4, 100), np.float32)
    k = tc.compile(program(), "row_sum", a, options=M().mapToThreads(128).mapToBlocks(4),
                   target="cuda-emulated")
    text = k.explain()
    assert "parallelReductions" in text and "128 threads" in text and "reassociated" in text


def test_parallel_reductions_are_text_and_searchable_options():
    o = M().mapToThreads(256).parallelReductions(False)
    assert str(o) == "MappingOptions().mapToThreads(256).parallelReductions(False)"
    assert M.parse(str(o)) == o


@pytest.mark.skipif(nvcc.nvcc_path() is None, reason="nvcc is not installed")
def test_ptx_has_warp_shuffles():
    a = np.zeros((4, 1000), np.float32)
    k = tc.compile(program(), "row_sum", a, options=WIDE, target="cuda-emulated")
    ptx = nvcc.ptx(k.cuda_source)
    assert ptx is not None and "shfl.sync.down" in ptx


@pytest.mark.parametrize("forced", [False, True])
def test_options_the_parallel_loops_can_take_map_as_tc_maps_them(forced):
    """Left unset, parallelReductions splits a reduction only where no loop free of
    dependences can take threads: tbmm with tile(1).mapToThreads(128).mapToBlocks(5) puts k
    (26 values) on threadIdx.x as TC does, where the split once put the reduction over m on
    128 threads (72 values, 56 idle). parallelReductions(True) still forces the split. Both
    compute the product."""
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(s).astype(np.float32) for s in ((10, 26, 72), (10, 26, 72)))
    options = M().tile(1).mapToThreads(128).mapToBlocks(5)
    if forced:
        options = options.parallelReductions(True)
    k = tc.compile("def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) "
                   "{ Z(b,n,k) +=! X(b,n,m) * Y(b,k,m) }", "tbmm", x, y, options=options,
                   target="cuda-emulated")
    assert bool(split(k)) == forced
    assert k.block == ((128, 1, 1) if forced else (26, 1, 1)) and k.grid == (5, 1, 1)
    np.testing.assert_allclose(k(x, y), np.einsum("bnm,bkm->bnk", x, y), rtol=1e-4, atol=1e-4)
