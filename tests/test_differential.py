"""Differential testing: random well-formed TC programs (tests/fuzz/programs.py) on the CPU
path (default schedule and schedule=None) and as emulated CUDA kernels under random
MappingOptions, against an explicit-loop reference (tests/fuzz/reference.py) that infers ranges
by brute force from spec 001's rules, never through tcstage's range inference.

The sample is fixed (seeds below) and deterministic; benchmarks/fuzz_campaign.py runs the long
campaign. The first tests check the reference itself against the spec's worked examples and
hand computations.
"""

import random

import numpy as np
import pytest

from fuzz import differential, mapping, programs
from fuzz import nodes as N
from fuzz import reference as R
from fuzz.limits import time_limit

CPU_SEEDS = range(0, 12)
EMULATED_SEEDS = range(12, 17)
TIME_LIMIT_S = 180


def _report(case, findings) -> str:
    lines = [f"seed {case.seed}: {len(findings)} finding(s) for", case.source]
    lines += [str(f) for f in findings]
    return "\n".join(lines)


# -- the reference against the spec's worked examples --------------------------------------------

def _read(t, *args):
    return N.Read(t, tuple(args), "float32")


def _run(statements, inputs: dict, sizes: dict, outputs=("A",)):
    decls = tuple(N.Input(name, str(a.dtype), tuple(d)) for name, (a, d) in inputs.items())
    p = N.Program("f", decls, outputs, tuple(statements), sizes)
    return R.run(p, {k: a for k, (a, _) in inputs.items()}, {})


def _var(v):
    return N.Var(v)


def _lit(n):
    return N.Num(str(n), n, "int32")


def test_reference_reversed_index_range_is_spec_001s_corrected_one():
    # A(i) = B(10 - i): 0 <= 10 - i < I gives 11 - I <= i < 11 (docs/language.md).
    B = np.arange(4, dtype=np.float32)
    st = N.Statement("A", ("i",), "=", True, _read("B", N.binary("-", _lit(10), _var("i"))))
    r = _run([st], {"B": (B, ("I",))}, {"I": 4})
    assert r.ranges[0] == {"i": (7, 11)}
    assert r.tensors["A"].mins == (7,)
    np.testing.assert_array_equal(r.tensors["A"].values, B[::-1])


def test_reference_strided_and_pooled_ranges():
    # B(2*i) gives 0 <= i < (I+1)/2; B(2*i) + B(2*i+1) gives 0 <= i < I/2 (spec 001).
    B = np.arange(7, dtype=np.float32)
    two_i = N.binary("*", _lit(2), _var("i"))
    one = N.Statement("A", ("i",), "=", True, _read("B", two_i))
    pool = N.Statement("A", ("i",), "=", True, N.binary(
        "+", _read("B", two_i), _read("B", N.binary("+", two_i, _lit(1)))))
    assert _run([one], {"B": (B, ("I",))}, {"I": 7}).ranges[0] == {"i": (0, 4)}
    r = _run([pool], {"B": (B, ("I",))}, {"I": 7})
    assert r.ranges[0] == {"i": (0, 3)}
    np.testing.assert_array_equal(r.tensors["A"].values, [1, 5, 9])


def test_reference_stencil_resolves_k_first_then_i():
    # A(i) +=! B(i + k) * K(k): round 1 bounds k by K, round 2 bounds i (spec 001).
    B = np.arange(6, dtype=np.float32)
    K = np.array([1, 2, 3], np.float32)
    st = N.Statement("A", ("i",), "+", True, N.binary(
        "*", _read("B", N.binary("+", _var("i"), _var("k"))), _read("K", _var("k"))))
    r = _run([st], {"B": (B, ("N",)), "K": (K, ("W",))}, {"N": 6, "W": 3})
    assert r.ranges[0] == {"i": (0, 4), "k": (0, 3)}
    np.testing.assert_array_equal(r.tensors["A"].values, np.convolve(B, K[::-1], "valid"))


def test_reference_matmul_and_in_out_accumulation():
    rng = np.random.default_rng(0)
    A = rng.integers(-3, 4, (3, 4)).astype(np.float32)
    B = rng.integers(-3, 4, (4, 5)).astype(np.float32)
    st = N.Statement("C", ("i", "j"), "+", True, N.binary(
        "*", _read("A", _var("i"), _var("k")), _read("B", _var("k"), _var("j"))))
    r = _run([st], {"A": (A, ("M", "K")), "B": (B, ("K", "N"))}, {"M": 3, "K": 4, "N": 5}, ("C",))
    np.testing.assert_array_equal(r.tensors["C"].values, A @ B)
    # O(i) += A(0, 0) where i in 0:1 with out=ones(4): only O(0) changes (issue 10).
    p = N.Program("f", (N.Input("A", "float32", ("M", "K")),), ("O",), (N.Statement(
        "O", ("i",), "+", False, _read("A", _lit(0), _lit(0)),
        (N.Where("i", _lit(0), _lit(1)),)),), {"M": 3, "K": 4}, {"O": (4,)})
    r = R.run(p, {"A": A}, {"O": np.ones(4, np.float32)})
    np.testing.assert_array_equal(r.tensors["O"].values, [1 + A[0, 0], 1, 1, 1])


def test_reference_rejects_what_is_not_well_formed():
    B = np.arange(4, dtype=np.float32)
    unbounded = N.Statement("A", ("i", "j"), "=", True, _read("B", _var("i")))
    with pytest.raises(R.Invalid, match="cannot infer the range of j"):
        _run([unbounded], {"B": (B, ("I",))}, {"I": 4})
    out_of_bounds = N.Statement("A", ("i",), "=", True, _read("B", _var("i")),
                                (N.Where("i", _lit(0), _lit(5)),))
    with pytest.raises(R.Invalid, match="out of bounds"):
        _run([out_of_bounds], {"B": (B, ("I",))}, {"I": 4})
    # Differential seed 500015: an input named `expf` makes `expf(x)` a read of it in TC
    # (docs/language.md), while the generator meant the builtin
    hidden = N.Statement("A", ("i",), "=", True, N.call("expf", _read("B", _var("i"))))
    with pytest.raises(R.Invalid, match="hides the builtin"):
        _run([hidden], {"B": (B, ("I",)), "expf": (B, ("I",))}, {"I": 4})


def test_reference_refuses_guarded_reads_that_change_the_ranges():
    """Differential seed 300168: in `O(k) +=! L <= k ? L : D(k, k)` the else branch's guard
    keeps k below L, so tcstage's guarded-read rule (docs/language.md) leaves k without an upper
    bound where spec 001's rounds give 0:L; the reference does not model that rule and refuses
    the statement. A guard that changes nothing (another read bounds k the same) is kept."""
    D = np.arange(9, dtype=np.float32).reshape(3, 3)
    W = np.arange(3, dtype=np.float32)
    k, size = _var("k"), N.Size("L")
    guarded = N.select(N.binary("<=", size, k), N.binary("*", size, _lit(1)), _read("D", k, k))
    st = N.Statement("A", ("k",), "+", True, guarded)
    with pytest.raises(R.NotModelled, match="guarded read"):
        _run([st], {"D": (D, ("L", "L"))}, {"L": 3})
    kept = N.Statement("A", ("k",), "+", True, N.binary("+", guarded, _read("W", k)))
    r = _run([kept], {"D": (D, ("L", "L")), "W": (W, ("L",))}, {"L": 3})
    assert r.ranges[0] == {"k": (0, 3)}
    # A guard that does not keep the read within D (k < L + 1) changes nothing either.
    loose = N.select(N.binary("<=", N.binary("+", size, _lit(1)), k), size, _read("D", k, k))
    r = _run([N.Statement("A", ("k",), "+", True, loose)], {"D": (D, ("L", "L"))}, {"L": 3})
    assert r.ranges[0] == {"k": (0, 3)}


def test_reference_knows_which_outputs_are_in_out():
    # An output is in/out when its first statement reads it or accumulates without '!'.
    A = np.arange(3, dtype=np.float32)
    decl = (N.Input("A", "float32", ("N",)),)
    plain = N.Statement("O", ("i",), "=", True, _read("A", _var("i")))
    accumulates = N.Statement("O", ("i",), "+", False, _read("A", _var("i")))
    for st, inout in ((plain, False), (accumulates, True)):
        p = N.Program("f", decl, ("O",), (st,), {"N": 3}, {"O": (3,)} if inout else {})
        assert R.inout_outputs(p) == ({"O"} if inout else set())
        with pytest.raises(R.Invalid, match="in/out outputs"):
            R.run(p, {"A": A}, {} if inout else {"O": np.zeros(3, np.float32)})


def test_reference_scatter_accumulates_at_computed_subscripts():
    # H(b) = 0 where b in 0:4; H(X(i)) += A(i): a histogram (docs/language.md, "Scatter").
    A = np.array([1, 2, 3, 4, 5], np.float32)
    X = np.array([3, 0, 3, 1, 3], np.int32)
    decls = (N.Input("A", "float32", ("N",)), N.Input("X", "int32", ("N",), index_bound="N"))
    init = N.Statement("H", ("b",), "=", True, N.Num("0", 0, "int32"),
                       (N.Where("b", _lit(0), _lit(4)),))
    hist = N.Statement("H", (), "+", False, _read("A", _var("i")),
                       scatter=(N.Read("X", (_var("i"),), "int32"),))
    p = N.Program("f", decls, ("H",), (init, hist), {"N": 5})
    assert N.render_statement(hist) == "H(X(i)) += A(i)"
    r = R.run(p, {"A": A, "X": X}, {})
    np.testing.assert_array_equal(r.tensors["H"].values, [2, 4, 0, 9])


def test_reference_scatter_write_bounds_its_ranges():
    # O(i) = A(i); O(i + 1) max= 2.5: the write alone gives -1 <= i < N - 1 (spec 001's
    # rounds on the write), so every element is visited once. O(i, i) += B(i, j): repeated
    # variable, the diagonal gets the row sums.
    A = np.array([1, 3, 2], np.float32)
    decls = (N.Input("A", "float32", ("N",)),)
    first = N.Statement("O", ("i",), "=", True, _read("A", _var("i")))
    shifted = N.Statement("O", (), "max", False, N.Num("2.5", 2.5, "float32"),
                          scatter=(N.binary("+", _var("i"), _lit(1)),))
    r = R.run(N.Program("f", decls, ("O",), (first, shifted), {"N": 3}), {"A": A}, {})
    assert r.ranges[1] == {"i": (-1, 2)}
    np.testing.assert_array_equal(r.tensors["O"].values, [2.5, 3, 2.5])
    B = np.arange(9, dtype=np.float32).reshape(3, 3)
    decls = (N.Input("B", "float32", ("N", "N")),)
    zero = N.Statement("O", ("i", "j"), "=", True, _read("B", _var("i"), _var("j")))
    diag = N.Statement("O", (), "+", False, _read("B", _var("i"), _var("j")),
                       scatter=(_var("i"), _var("i")))
    r = R.run(N.Program("f", decls, ("O",), (zero, diag), {"N": 3}), {"B": B}, {})
    np.testing.assert_array_equal(r.tensors["O"].values, B + np.diag(B.sum(1)))


def test_generated_programs_are_deterministic_and_well_formed():
    for seed in (0, 1, 2):
        a, b = programs.case(seed), programs.case(seed)
        assert a.source == b.source
        for o in a.program.outputs:
            np.testing.assert_array_equal(a.expected.tensors[o].values,
                                          b.expected.tensors[o].values)
        assert "def " in a.source and a.program.outputs


# -- tcstage against the reference ---------------------------------------------------------------

@pytest.mark.parametrize("seed", CPU_SEEDS)
def test_cpu_matches_reference(seed):
    case = programs.case(seed)
    with time_limit(TIME_LIMIT_S, "the CPU path"):
        findings = differential.check(case, ())
    assert not findings, _report(case, findings)


# Programs with scatter statements (programs.SCATTER_FEATURES): affine, constant, repeated,
# scalar, data-dependent, halved and reversed subscripts under +=, *=, min=, max=.
SCATTER_SEEDS = (5, 8, 14, 17, 22, 68, 113, 132)


@pytest.mark.parametrize("seed", SCATTER_SEEDS)
def test_scatter_programs_match_reference(seed):
    case = programs.case(seed, programs.SCATTER_FEATURES)
    assert any(st.scatter is not None for st in case.program.statements)
    options = [mapping.random_options(random.Random(f"options/{seed}"))]
    with time_limit(TIME_LIMIT_S, "the CPU path and emulation"):
        findings = differential.check(case, options)
    assert not findings, _report(case, findings)


@pytest.mark.parametrize("seed", EMULATED_SEEDS)
def test_emulated_kernel_matches_reference(seed):
    case = programs.case(seed)
    options = [mapping.random_options(random.Random(f"options/{seed}"))]
    with time_limit(TIME_LIMIT_S, "emulation"):
        findings = differential.check(case, options, cpu_schedules=())
    assert not findings, _report(case, findings)


def test_a_kernel_sequence_is_also_checked_with_one_option_set_per_launch():
    """What check() adds for a kernel of several launches (mapping.per_launch): tc.compile's
    list form, the set that decided the launches then one drawn set per later launch, none with
    overlapped tiles; it maps each launch by its own set and the values stay right."""
    import warnings

    import tcstage as tc
    source = ("def blur(float(H,W) I) -> (B, O) {\n"
              "  B(y,x) = I(y,x) + I(y,x+1)  where y in 0:H, x in 0:W-1\n"
              "  O(y,x) = B(y,x) + B(y+1,x)  where y in 0:H-1, x in 0:W-1\n}\n")
    first = tc.MappingOptions().tile(8, 8).mapToThreads(8, 4).mapToBlocks(4, 4)
    I = np.arange(9 * 13, dtype=np.float32).reshape(9, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(tc.define(source), "blur", I, options=first,
                            target="cuda-emulated")
    assert len(kernel.launches) == 2
    (sets,) = mapping.per_launch(first, kernel)
    assert sets[0] is first and len(sets) == 2 and not sets[1].overlapped_tiles
    assert mapping.per_launch(first.overlappedTiles(True), kernel) == []
    assert mapping.per_launch(sets, kernel) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        again = tc.compile(tc.define(source), "blur", I, options=sets, target="cuda-emulated")
    B = I[:, :-1] + I[:, 1:]
    np.testing.assert_array_equal(again(I)[1], B[:-1] + B[1:])
    assert [launch.options for launch in again.launches] == sets
