"""Tests for tcstage.halide._native and tcstage.halide.solver.

Expected values are worked out by hand (or by brute-force enumeration of the
integer points satisfying a condition), never taken from the code under test.
"""

import itertools

import halide as hl
import pytest

from tcstage.halide import _native
from tcstage.halide.solver import (
    Interval,
    and_over_domain,
    evaluate,
    simplify,
    solve_inner_interval,
    tree_to_expr,
    tree_to_str,
    tree_vars,
)


def V(name):
    return hl.Expr(hl.Var(name))


def interval_points(iv, values):
    """Integer points of an inclusive interval whose bounds are trees."""
    lo = evaluate(iv.lo, values)
    hi = evaluate(iv.hi, values)
    return set(range(lo, hi + 1))


def brute_force(pred, lo=-60, hi=60):
    return {x for x in range(lo, hi + 1) if pred(x)}


# ---------------------------------------------------------------------------
# solve_for_inner_interval


def test_reversed_index_interval_matches_hand_formula():
    i, I = V("i"), V("I")
    iv = solve_inner_interval((0 <= 10 - i) & (10 - i < I), "i")
    assert isinstance(iv, Interval)
    assert iv.lo is not None and iv.hi is not None
    assert tree_vars(iv.lo) <= {"I"} and tree_vars(iv.hi) <= {"I"}
    # By hand: 10 - i >= 0  <=>  i <= 10;  10 - i < I  <=>  i > 10 - I  <=>  i >= 11 - I.
    for n in (-3, 0, 1, 2, 7, 11, 100):
        assert evaluate(iv.lo, {"I": n}) == 11 - n
        assert evaluate(iv.hi, {"I": n}) == 10
    assert tree_to_str(iv.lo) == "11 - I"
    assert tree_to_str(iv.hi) == "10"


def test_reversed_index_interval_brute_force():
    i, I = V("i"), V("I")
    iv = solve_inner_interval((0 <= 10 - i) & (10 - i < I), "i")
    for n in range(1, 21):
        expected = brute_force(lambda x: 0 <= 10 - x < n)
        assert interval_points(iv, {"I": n}) == expected, n


def test_even_stride_interval():
    i, I = V("i"), V("I")
    iv = solve_inner_interval((0 <= 2 * i) & (2 * i < I), "i")
    for n in range(1, 21):
        expected = brute_force(lambda x: 0 <= 2 * x < n)
        # hand formula: [0, ceil(I/2) - 1] = [0, (I+1)//2 - 1]
        assert expected == set(range(0, (n + 1) // 2))
        assert evaluate(iv.lo, {"I": n}) == 0
        assert evaluate(iv.hi, {"I": n}) == (n + 1) // 2 - 1
        assert interval_points(iv, {"I": n}) == expected


def test_odd_offset_stride_interval():
    i, I = V("i"), V("I")
    iv = solve_inner_interval((0 <= 2 * i + 1) & (2 * i + 1 < I), "i")
    for n in range(1, 21):
        expected = brute_force(lambda x: 0 <= 2 * x + 1 < n)
        assert expected == set(range(0, n // 2))  # hand formula [0, I/2 - 1]
        assert evaluate(iv.lo, {"I": n}) == 0
        assert evaluate(iv.hi, {"I": n}) == n // 2 - 1
        assert interval_points(iv, {"I": n}) == expected


def test_one_sided_condition_gives_unbounded_end():
    i, N = V("i"), V("N")
    lo, hi = _native.solve_for_inner_interval(i < N, "i")
    assert lo is None
    for n in (-4, 0, 9):
        assert evaluate(hi, {"N": n}) == n - 1
    lo, hi = _native.solve_for_inner_interval(i >= 3, "i")
    assert evaluate(lo, {}) == 3 and hi is None


def test_never_true_condition_gives_empty_interval():
    i = V("i")
    lo, hi = _native.solve_for_inner_interval(hl.Expr(False) & (i < 3), "i")
    assert evaluate(lo, {}) > evaluate(hi, {})


def test_solve_requires_boolean_condition():
    with pytest.raises(TypeError, match="boolean"):
        _native.solve_for_inner_interval(V("i") + 1, "i")


# ---------------------------------------------------------------------------
# and_condition_over_domain


def test_and_over_domain_removes_inner_variable():
    i, k, I = V("i"), V("k"), V("I")
    cond = (0 <= 2 * i + k) & (2 * i + k < I)
    tree = and_over_domain(cond, {"k": (hl.Expr(0), hl.Expr(1))})
    assert tree_vars(tree) <= {"i", "I"}
    for x, n in itertools.product(range(-12, 13), range(-5, 25)):
        expected = 0 <= 2 * x and 2 * x + 1 < n
        assert bool(evaluate(tree, {"i": x, "I": n})) == expected, (x, n)


def test_and_over_domain_accepts_int_bounds_and_symbolic_bounds():
    i, k, N = V("i"), V("k"), V("N")
    # i + k < N for all k in [0, N - 1]  <=>  i + N - 1 < N  <=>  i < 1
    tree = _native.and_condition_over_domain(i + k < N, {"k": (0, N - 1)})
    assert tree_vars(tree) <= {"i", "N"}
    for x, n in itertools.product(range(-5, 6), range(1, 8)):
        assert bool(evaluate(tree, {"i": x, "N": n})) == (x < 1)


def test_and_over_domain_bad_domain():
    i = V("i")
    with pytest.raises(TypeError):
        _native.and_condition_over_domain(i < 3, {"k": (0,)})
    with pytest.raises(TypeError):
        _native.and_condition_over_domain(i < 3, {"k": ("a", 1)})


# ---------------------------------------------------------------------------
# to_tree / simplify


def test_to_tree_shapes():
    i, N = V("i"), V("N")
    assert _native.to_tree(i + 1) == ("add", ("var", "i"), ("int", 1))
    assert _native.to_tree(7) == ("int", 7)
    assert _native.to_tree(hl.min(i, N) % 4) == ("mod", ("min", ("var", "i"), ("var", "N")), ("int", 4))
    assert _native.to_tree(i > N) == ("gt", ("var", "i"), ("var", "N"))
    assert _native.to_tree(i >= N) == ("ge", ("var", "i"), ("var", "N"))
    assert _native.to_tree(hl.logical_not(i != N)) == ("not", ("ne", ("var", "i"), ("var", "N")))
    assert _native.to_tree(hl.cast(hl.Float(32), i)) == ("cast", "float32", ("var", "i"))
    assert _native.to_tree(hl.cast(hl.UInt(8), i)) == ("cast", "uint8", ("var", "i"))
    assert _native.to_tree(hl.select(i < N, i, N)) == (
        "select",
        ("lt", ("var", "i"), ("var", "N")),
        ("var", "i"),
        ("var", "N"),
    )
    tag, name, args = _native.to_tree(hl.abs(i))
    assert (tag, name, args) == ("call", "abs", (("var", "i"),))
    f = _native.to_tree(hl.Expr(1.5))
    assert f == ("float", 1.5)


def test_simplify_constants_and_bool():
    assert simplify(hl.Expr(3) * 4 + 1) == ("int", 13)
    t = simplify(V("i") * 0 + 3 > 2)
    assert t == ("int", True) and t[1] is True


def test_bad_arguments_raise_type_error_with_message():
    with pytest.raises(TypeError, match="halide.Expr"):
        _native.to_tree("i + 1")
    with pytest.raises(TypeError, match="halide.Expr"):
        _native.simplify("i")
    with pytest.raises(TypeError, match="halide.Expr"):
        _native.solve_for_inner_interval("i < 3", "i")
    with pytest.raises(TypeError):
        _native.to_tree(None)


def test_unsupported_node_raises_value_error():
    with pytest.raises(ValueError, match="StringImm"):
        _native.to_tree(hl.Expr("hello"))


# ---------------------------------------------------------------------------
# Halide division semantics, evaluate()


def test_evaluate_floor_division_and_modulo():
    def ev(op, a, b):
        return evaluate((op, ("int", a), ("int", b)), {})

    assert ev("div", -7, 2) == -4  # C would give -3
    assert ev("mod", -7, 2) == 1  # C would give -1
    assert ev("div", 7, 2) == 3
    assert ev("div", -1, 4) == -1
    assert ev("mod", -1, 4) == 3
    # negative divisor: Euclidean (remainder never negative)
    assert ev("div", 7, -2) == -3
    assert ev("mod", 7, -2) == 1
    assert ev("div", -7, -2) == 4
    assert ev("mod", -7, -2) == 1
    # by zero: Halide defines both as 0
    assert ev("div", 5, 0) == 0
    assert ev("mod", 5, 0) == 0
    assert ev("div", -5, 0) == 0


def test_evaluate_agrees_with_halide_constant_folding():
    for a, b in itertools.product(range(-9, 10), range(-4, 5)):
        for op, make in (("div", lambda x, y: x / y), ("mod", lambda x, y: x % y)):
            folded = simplify(make(hl.Expr(a), hl.Expr(b)))
            assert folded == ("int", evaluate((op, ("int", a), ("int", b)), {})), (op, a, b)


def test_evaluate_misc():
    t = ("select", ("lt", ("var", "x"), ("int", 0)), ("sub", ("int", 0), ("var", "x")), ("var", "x"))
    assert evaluate(t, {"x": -5}) == 5 and evaluate(t, {"x": 4}) == 4
    assert evaluate(("cast", "uint8", ("int", 300)), {}) == 44
    assert evaluate(("cast", "int8", ("int", 200)), {}) == -56
    assert evaluate(("cast", "int32", ("float", -2.7)), {}) == -2
    assert evaluate(("let", "t", ("int", 3), ("mul", ("var", "t"), ("var", "t"))), {}) == 9
    with pytest.raises(ValueError):
        evaluate(("var", "missing"), {})


# ---------------------------------------------------------------------------
# tree_to_str


@pytest.mark.parametrize(
    "tree, text",
    [
        (("sub", ("int", 11), ("var", "I")), "11 - I"),
        (("div", ("add", ("var", "I"), ("int", 1)), ("int", 2)), "(I + 1)/2"),
        (("min", ("var", "N"), ("var", "M")), "min(N, M)"),
        (("add", ("var", "a"), ("int", -3)), "a - 3"),
        (("sub", ("var", "a"), ("int", -3)), "a + 3"),
        (("sub", ("var", "a"), ("add", ("var", "b"), ("var", "c"))), "a - (b + c)"),
        (("add", ("add", ("var", "a"), ("var", "b")), ("var", "c")), "a + b + c"),
        (("mul", ("add", ("var", "a"), ("var", "b")), ("var", "c")), "(a + b)*c"),
        (("add", ("mul", ("var", "a"), ("var", "b")), ("var", "c")), "a*b + c"),
        (("div", ("var", "a"), ("mul", ("var", "b"), ("var", "c"))), "a/(b*c)"),
        (("mod", ("var", "i"), ("int", 4)), "i % 4"),
        (
            ("and", ("le", ("int", 0), ("var", "i")), ("lt", ("var", "i"), ("var", "N"))),
            "0 <= i && i < N",
        ),
        (("not", ("lt", ("var", "i"), ("var", "N"))), "!(i < N)"),
        (("mul", ("var", "a"), ("int", -3)), "a*(-3)"),
        (("cast", "float32", ("var", "x")), "float32(x)"),
        (("select", ("gt", ("var", "x"), ("int", 0)), ("var", "x"), ("int", 0)), "select(x > 0, x, 0)"),
        (("int", True), "true"),
    ],
)
def test_tree_to_str(tree, text):
    assert tree_to_str(tree) == text


# ---------------------------------------------------------------------------
# tree_to_expr / tree_vars


def test_tree_to_expr_round_trip_and_integer_division():
    env = {"a": hl.Var("a"), "b": hl.Var("b"), "N": V("N")}
    tree = ("div", ("var", "a"), ("var", "b"))
    e = tree_to_expr(tree, env)
    assert e.type() == hl.Int(32)
    assert _native.to_tree(e) == tree  # a Halide Div node, not a float division
    tree = ("select", ("lt", ("var", "a"), ("var", "N")), ("mod", ("var", "a"), ("int", 3)), ("int", -1))
    assert _native.to_tree(tree_to_expr(tree, env)) == tree
    # constants: rebuilt Exprs fold to what evaluate() computes
    for a, b in ((-7, 2), (7, -2), (-7, -2), (5, 0)):
        t = ("add", ("div", ("int", a), ("int", b)), ("mod", ("int", a), ("int", b)))
        assert simplify(tree_to_expr(t, {})) == ("int", evaluate(t, {}))


def test_tree_to_expr_bool_constant_in_logic():
    env = {"i": hl.Var("i")}
    e = tree_to_expr(("and", ("int", 1), ("lt", ("var", "i"), ("int", 3))), env)
    assert e.type().is_bool()
    assert simplify(e) == ("lt", ("var", "i"), ("int", 3))


def test_tree_to_expr_unknown_variable():
    with pytest.raises(ValueError, match="'q'"):
        tree_to_expr(("add", ("var", "q"), ("int", 1)), {"i": hl.Var("i")})


def test_tree_vars():
    t = ("add", ("mul", ("var", "a"), ("int", 2)), ("call", "abs", (("var", "b"),)))
    assert tree_vars(t) == frozenset({"a", "b"})
    assert tree_vars(("let", "t", ("var", "x"), ("add", ("var", "t"), ("var", "y")))) == {"x", "y"}
    assert tree_vars(("int", 3)) == frozenset()


def test_constants_other_than_int32_and_float32_carry_their_type():
    import halide as hl
    from tcstage.halide import _native
    from tcstage.halide.solver import tree_to_expr

    assert _native.to_tree(hl.Expr(3)) == ("int", 3)
    assert _native.to_tree(hl.f32(1.5)) == ("float", 1.5)
    assert _native.to_tree(hl.u8(3)) == ("cast", "uint8", ("int", 3))
    assert _native.to_tree(hl.i64(2**40)) == ("cast", "int64", ("int", 2**40))
    tree = _native.to_tree(hl.f64(0.1))
    assert tree == ("cast", "float64", ("float", 0.1))
    rebuilt = tree_to_expr(tree, {})
    assert rebuilt.type() == hl.Float(64)
    assert _native.to_tree(rebuilt) == tree  # no detour through float32
