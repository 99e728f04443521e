"""Scop extraction from the Halide Funcs: domains, accesses and dependences compared with
relations written by hand, and the static out-of-bounds check."""

import warnings

import islpy as isl
import pytest

import tcstage as tc
from tcstage.poly.scop import check_bounds, extract_scop


def scop_of(source, name=None, sizes=None, args=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        prog = tc.define(source)
    f = prog[name or prog.names[0]]
    return extract_scop(f.lower(*args), sizes)


def same(a, b_text):
    b = type(a)(b_text)
    return a.is_equal(b)


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }"
P = "[_K, _M, _N] -> "
CTX = "_K >= 0 and _M >= 0 and _N >= 0"


def test_matmul_domains_and_accesses():
    scop = scop_of(MM)
    init, update = scop.statements
    assert scop.params == ("_K", "_M", "_N")
    assert same(init.domain, P + "{ S0[i, j] : " + CTX + " and 0 <= i < _M and 0 <= j < _N }")
    assert same(update.domain, P + "{ S1[i, j, k] : " + CTX +
                " and 0 <= i < _M and 0 <= j < _N and 0 <= k < _K }")
    assert update.reduction_vars == ("_C_r_x",)
    by_tensor = {a.tensor: a for a in update.reads}
    assert same(by_tensor["A"].relation.remove_redundancies(), P + "{ S1[i, j, k] -> A[i, k] : "
                + CTX + " and 0 <= i < _M and 0 <= j < _N and 0 <= k < _K }")
    assert same(by_tensor["B"].relation, P + "{ S1[i, j, k] -> B[k, j] : " + CTX +
                " and 0 <= i < _M and 0 <= j < _N and 0 <= k < _K }")
    assert all(a.exact for a in update.reads)
    assert same(update.write.relation, P + "{ S1[i, j, k] -> C[i, j] : " + CTX +
                " and 0 <= i < _M and 0 <= j < _N and 0 <= k < _K }")


def test_matmul_dataflow():
    deps = scop_of(MM).dependences()
    expected = P + ("{ S0[i, j] -> S1[i, j, 0] : _K > 0 and 0 <= i < _M and 0 <= j < _N and "
                    "_M >= 0 and _N >= 0; "
                    "S1[i, j, k] -> S1[i, j, k + 1] : 0 <= i < _M and 0 <= j < _N and "
                    "0 <= k < _K - 1 }")
    assert deps.flow.is_equal(isl.UnionMap(expected))


def test_fixed_sizes_are_in_the_context():
    scop = scop_of(MM, sizes={"M": 4, "K": 3, "N": 5})
    assert scop.domain.intersect_params(scop.context).is_subset(
        isl.UnionSet(P + "{ S0[i, j] : 0 <= i < 4 and 0 <= j < 5; "
                     "S1[i, j, k] : 0 <= i < 4 and 0 <= j < 5 and 0 <= k < 3 }"))
    count = scop.statements[1].domain.intersect_params(scop.context).count_val()
    assert count.to_python() == 4 * 5 * 3


def test_mlp1_statements_follow_the_tc():
    src = ("def MLP1(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {\n"
           "  O1(b,n) = B1(n)\n  O1(b,n) += I(b,m) * W1(n,m)\n  O1(b,n) = fmaxf(O1(b,n), 0)\n}")
    scop = scop_of(src)
    assert [(s.tensor, s.tc_statement) for s in scop.statements] == [("O1", 0), ("O1", 1), ("O1", 2)]
    flow = scop.dependences().flow
    # The bias reaches the first reduction step; the last step reaches the relu.
    assert not flow.intersect(isl.UnionMap(
        "[_B, _M, _N] -> { S0[b, n] -> S1[b, n, 0] : _M > 0 }")).is_empty()
    assert not flow.intersect(isl.UnionMap(
        "[_B, _M, _N] -> { S1[b, n, m] -> S2[b, n] : m = _M - 1 }")).is_empty()
    # The relu never reads the bias directly when there is something to reduce.
    assert flow.intersect(isl.UnionMap(
        "[_B, _M, _N] -> { S0[b, n] -> S2[b, n] : _M > 0 }")).is_empty()


def test_indirect_read_is_a_may_access_over_the_dimension():
    scop = scop_of("def lut(float(E,D) L, int(B,K) I) -> (O) { O(i,j) +=! L(I(i,k),j) }",
                   sizes={"B": 2, "K": 3, "D": 4, "E": 10})
    update = scop.statements[1]
    lut = next(a for a in update.reads if a.tensor == "L")
    assert not lut.exact
    image = lut.relation.intersect_params(scop.context).range()
    assert image.is_equal(isl.Set("[_B, _D, _E, _K] -> { L[a, j] : 0 <= a < 10 and 0 <= j < 4 }")
                          .intersect_params(scop.context))
    assert next(a for a in update.reads if a.tensor == "I").exact


def test_ranges_not_starting_at_zero():
    scop = scop_of("def rev(float(I) B) -> (A) { A(i) = B(10 - i) }")
    s, = scop.statements
    assert same(s.domain, "[_I] -> { S0[i] : _I >= 0 and 11 - _I <= i <= 10 }")
    assert scop.tensor_extents["A"].is_equal(
        isl.Set("[_I] -> { A[a] : _I >= 0 and 11 - _I <= a <= 10 }"))


def test_specialised_strides_are_affine():
    src = ("def s(int sh, float(N) X) -> (Y) { Y(i) = X(sh * i) }")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        f = tc.define(src).s
    scop = extract_scop(f.lower(3, (10,)))
    read, = scop.statements[0].reads
    assert read.exact
    assert same(read.relation, "[_N] -> { S0[i] -> X[3i] : _N >= 0 and 0 <= i <= floor((_N - 1)/3) }")


def test_out_of_bounds_for_every_size_is_an_error():
    scop = scop_of("def f(float(N) B) -> (A) { A(i) = B(i + 1) where i in 0:N }")
    with pytest.raises(tc.TCError, match=r"accesses B\(i \+ 1\) outside B"):
        check_bounds(scop)


def test_precondition_is_an_error_only_when_sizes_prove_it():
    src = "def pre(float(I) B, float(K) C, float(J) D) -> (A) { A(i,j) = B(i) * C(i + j) * D(j) }"
    check_bounds(scop_of(src))  # fine for some sizes: only the range warning applies
    check_bounds(scop_of(src, sizes={"I": 3, "J": 4, "K": 6}))
    with pytest.raises(tc.TCError, match="outside C"):
        check_bounds(scop_of(src, sizes={"I": 3, "J": 4, "K": 5}))


def test_canonical_schedule_is_a_sequence_of_bands():
    root = scop_of(MM).schedule.get_root()
    sequence = root.child(0)
    assert sequence.get_type() == isl.schedule_node_type.sequence
    assert sequence.n_children() == 2
    band = sequence.child(1).child(0)
    assert band.get_type() == isl.schedule_node_type.band
    assert band.band_n_member() == 3
