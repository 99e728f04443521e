"""The front end on inputs that used to crash it or be read wrong (issue 10): deep nesting,
malformed and oversized literals, input that is not text, option text and objects, and TC's
grammar for rank-0 tensors and equivalence annotations.

Whatever the input, `tc.define` returns a Program or raises a located TCError; what it accepts
compiles and runs. References are numpy computations of the TC semantics.
"""

import pickle

import numpy as np
import pytest

import tcstage as tc
from tcstage.lang import parser, sema
from tcstage.options import MappingOptions, TCOptionsError

rng = np.random.default_rng(10)

# The limits docs/language.md states.
MAX_EXPRESSION_DEPTH, MAX_READ_NESTING = 256, 8


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def rejected(cls, source):
    with pytest.raises(cls) as info:
        tc.define(source, "user.tc")
    return info.value


# -- deep nesting ----------------------------------------------------------------------------

def test_the_documented_limits():
    assert (parser.MAX_EXPRESSION_DEPTH, sema.MAX_READ_NESTING) == (256, 8)


HEAD = "def f(float(N) A) -> (B) {\n  B(i) = "


@pytest.mark.parametrize("rhs", [
    "-" * 3000 + "A(i)",
    " + ".join(["A(i)"] * 3000),
    "fmax(" * 1500 + "A(i)" + ", 0.5)" * 1500,
    "i < 1 ? A(i) : " * 1000 + "A(i)",
], ids=["unary minus", "long sum", "calls", "conditionals"])
def test_absurd_nesting_is_a_located_syntax_error(rhs):
    # These raised RecursionError in the parser or the checker.
    err = rejected(tc.TCSyntaxError, HEAD + rhs + "\n}")
    assert f"nested too deeply: more than {MAX_EXPRESSION_DEPTH} levels" in err.message
    assert err.line == 2 and err.column >= 10
    # the caret line shows a window of the 10,000-character line, not all of it
    assert len(str(err)) < 800 and str(err).split("\n")[2].strip().startswith("^")


def test_nested_reads_are_bounded():
    # `A(A(...A(i)...))` 1,500 deep raised RecursionError; Halide's compile time doubles with
    # each level, so reads nest at most MAX_READ_NESTING deep.
    deep = "A(" * 1500 + "i" + ")" * 1500
    err = rejected(tc.TCSyntaxError, "def f(int32(N) A) -> (B) { B(i) = " + deep + " }")
    assert "nested too deeply" in err.message
    over = MAX_READ_NESTING + 1
    source = "def f(int32(N) A) -> (B) {\n  B(i) = " + "A(" * over + "i" + ")" * over + "\n}"
    err = rejected(tc.TCSemanticError, source)
    assert f"tensor reads nested more than {MAX_READ_NESTING} deep" in err.message
    assert err.span.text() == "A(i)" and "temporary" in str(err)

    A = rng.permutation(6).astype(np.int32)
    n = MAX_READ_NESTING
    with pytest.warns(tc.TCWarning):  # subscripts computed from tensor values are not checked
        got = tc.define("def f(int32(N) A) -> (B) { B(i) = " + "A(" * n + "i" + ")" * n + " }").f(A)
    expected = np.arange(6)
    for _ in range(n):
        expected = A[expected]
    np.testing.assert_array_equal(got, expected)


def test_parentheses_add_no_depth():
    A = f32(5)
    got = tc.define(HEAD + "(" * 2000 + "A(i)" + ")" * 2000 + " * 2\n}").f(A)
    np.testing.assert_allclose(got, A * 2, rtol=1e-6)


def test_expressions_at_the_depth_limit_run_on_the_cpu_and_under_emulation():
    """The limit is safe for every later pass: a left-deep sum of 255 terms (the deepest
    chain allowed) and a statement mixing unary minus, conditionals, calls and sums, each
    exactly MAX_EXPRESSION_DEPTH levels deep, against numpy. One level more is refused."""
    D = MAX_EXPRESSION_DEPTH
    terms = [f"A(i) * {k % 7 - 3}" if k % 3 == 0 else "B(i)" if k % 3 == 1 else "i"
             for k in range(D - 2)]  # a Binary above each term but the first; A(i) * c is 3 deep
    chain = " + ".join(terms)  # the first term is 3 levels deep, each '+' adds one: D
    mixed, reference = "A(i)", lambda A, B, i: A.astype(np.float64)  # 2 levels
    levels = 2
    for k in range(D - 2):
        kind = k % 4
        if kind == 0:
            mixed, levels = f"-{mixed}", levels + 1
            reference = (lambda r: lambda A, B, i: -r(A, B, i))(reference)
        elif kind == 1:
            mixed, levels = f"tanh({mixed})", levels + 1
            reference = (lambda r: lambda A, B, i: np.tanh(r(A, B, i)))(reference)
        elif kind == 2:
            mixed, levels = f"(i < 2 ? B(i) : {mixed})", levels + 1
            reference = (lambda r: lambda A, B, i: np.where(i < 2, B, r(A, B, i)))(reference)
        else:
            mixed, levels = f"fmax({mixed}, -0.5)", levels + 1
            reference = (lambda r: lambda A, B, i: np.maximum(r(A, B, i), -0.5))(reference)
    assert levels == D
    source = (f"def f(float(N) A, float(N) B) -> (S, T) {{\n  S(i) = {chain}\n"
              f"  T(i) = {mixed}\n}}")
    A, B, i = f32(6), f32(6), np.arange(6)
    expected_sum = sum(A.astype(np.float64) * (k % 7 - 3) if k % 3 == 0 else B if k % 3 == 1
                       else i for k in range(D - 2))
    expected = (expected_sum, reference(A, B, i))
    for got in (tc.define(source).f(A, B),
                tc.compile(source, "f", A, B, target="cuda-emulated")(A, B)):
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3)

    err = rejected(tc.TCSyntaxError, source.replace(f"S(i) = {chain}", f"S(i) = {chain} + i"))
    assert "nested too deeply" in err.message


# -- tokens ----------------------------------------------------------------------------------

@pytest.mark.parametrize("literal, fragment", [
    (".5f2", "malformed number '.5f2'"),  # AttributeError
    ("1.5e3x", "malformed number '1.5e3x'"),
    ("0x1Fp3", None),  # a name: it is no C literal and holds letters
    ("08", "octal literal"),
    ("1.2.3", "expected"),
    ("1e", None), ("0x", None), ("1uf", None),
    ("1e+", "expected an expression"),
    ("1..2", "expected"),
    ("\u0661\u0662", "unexpected character"),  # Arabic-Indic digits are not TC digits
    ("1_000", None),
    ("1'000", "unexpected character"),
    ("0b101", None),
])
def test_malformed_literals_are_syntax_errors_or_names(literal, fragment):
    with pytest.raises(tc.TCError) as info:
        tc.define(f"def f(float(N) A) -> (B) {{ B(i) = A(i) * {literal} }}")
    if fragment is None:  # a name, taken for an index variable that nothing reduces
        assert isinstance(info.value, tc.TCSemanticError)
        assert f"index variable '{literal}'" in info.value.message
    else:
        assert isinstance(info.value, tc.TCSyntaxError) and fragment in info.value.message


def test_unpaired_surrogate_is_refused_where_it_is():
    # It used to pass the front end and fail compiling under emulation (UnicodeEncodeError:
    # the TC's text goes into the CUDA source as comments).
    source = "def f(float(N) A) -> (B) {\n  B(i) = # \ud800 comment\n  A(i)\n}"
    err = rejected(tc.TCSyntaxError, source)
    assert "unpaired surrogate U+D800" in err.message and (err.line, err.column) == (2, 12)
    str(err).encode("utf-8")  # the message itself can be printed


@pytest.mark.parametrize("source", [None, b"def f(float(N) A) -> (B) { B(i) = A(i) }", 42,
                                    ["def f(float(N) A) -> (B) { B(i) = A(i) }"]])
def test_define_takes_text_only(source):
    with pytest.raises(tc.TCArgumentError, match=f"takes the TC source as a str, got "
                                                 f"{'None' if source is None else type(source).__name__}"):
        tc.define(source)
    with pytest.raises(tc.TCArgumentError, match="filename as a str"):
        tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }", filename=b"f.tc")


# -- literals --------------------------------------------------------------------------------

@pytest.mark.parametrize("source, cls, fragment, caret", [
    ("def f(float(N) A) -> (B) { B(i) = A(i + 4294967297) }", tc.TCSemanticError,
     "integer literal 4294967297 does not fit in 32 bits; subscripts", "4294967297"),
    ("def f(float(N) A) -> (B) { B(i) = A(i + 0xffffffffffffffff) }", tc.TCSemanticError,
     "integer literal 18446744073709551615 does not fit in 32 bits", "0xffffffffffffffff"),
    ("def f(float(N) A) -> (B) { B(i) +=! A(i) where i in 0:4294967296 + N }",
     tc.TCSemanticError, "does not fit in 32 bits; range bounds", "4294967296"),
    ("def f(float(N) A) -> (B) { B(i) +=! A(i + kw) where kw in -2147483648:2 }",
     tc.TCRangeError, "overflows 32-bit integers", "B(i) +=! A(i + kw) where kw in -2147483648:2"),
    ("def f(float(4294967297) A) -> (B) { B(i) = A(i) }", tc.TCSemanticError,
     "constant size 4294967297 does not fit in 32 bits", "4294967297"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) + 18446744073709551616 }", tc.TCSemanticError,
     "integer literal 18446744073709551616 does not fit in 64 bits", "18446744073709551616"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) + 4294967296 * 4294967296 }", tc.TCSemanticError,
     "does not fit in 64 bits", "4294967296 * 4294967296"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) * 1e400 }", tc.TCSemanticError,
     "floating-point literal '1e400' is out of range", "1e400"),
    ("def f(uint8(N) X) -> (C) { C(i) = X(i)\n C(i) = 300 }", tc.TCSemanticError,
     "integer literal 300 does not fit in uint8", "300"),
])
def test_literals_that_do_not_fit_are_located_errors(source, cls, fragment, caret):
    # A raw TypeError from Halide's bindings, a ValueError about 'signed_integer_overflow', or
    # a silent wrap (A(i + 4294967297) read A(i + 1)) before.
    err = rejected(cls, source)
    assert fragment in err.message and err.span.text() == caret


def test_literals_are_exact_in_values():
    """C's rule where a literal does not fit the operand beside it; arithmetic on literals
    is exact; a negative literal is one constant."""
    source = """
    def lits(int32(N) A, int64(N) L, uint8(N) X) -> (B, C, D, E, F, G, H) {
      B(i) = A(i) + 4294967297
      C(i) = L(i) * 3000000000 + (-9223372036854775807 - 1) / 2
      D(i) = X(i) + 300
      E(i) = (A(i) > 0) + 5
      F(i) = A(i) * (100000 * 100000)
      G(i) = X(i) == -1
      H(i) = A(i) + -2147483648 / -1
    }"""
    A = np.array([-3, 0, 7, 2**31 - 1], np.int32)
    L = np.array([-5, 0, 1, 3], np.int64)
    X = np.array([0, 1, 255, 17], np.uint8)
    wide = A.astype(np.int64)
    expected = [wide + 4294967297, L * 3000000000 - 2**62, X.astype(np.int32) + 300,
                (A > 0).astype(np.int32) + 5, wide * 10**10, np.zeros(4, bool), wide + 2**31]
    for got, e in zip(tc.define(source).lits(A, L, X), expected):
        assert got.dtype == e.dtype
        np.testing.assert_array_equal(got, e)


# -- language gaps against the original TC ---------------------------------------------------

GAPS = """
def gaps(float(M) I, float(M, K) A, float(K, N) B) -> (S, Mx, C, expf, R) {
  S +=! I(i)
  Mx max=! I(i)
  C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j)) where k in 0:K
  expf(i) = exp(I(i)) - S / Mx
  R = S * 2 + Mx
}
"""


def test_rank0_without_index_list_equivalence_and_builtin_names():
    """TC's grammar: a rank-0 tensor written (`S +=! ...`, `R = ...`) and read (`S / Mx`)
    without an index list, and `<=> name(args)` before `where`; a tensor named like a builtin
    (`expf`, CUDA's spelling, is not a builtin in TC). CPU and emulated CUDA against numpy."""
    program = tc.define(GAPS)
    I, A, B = np.abs(f32(5)) + 0.5, f32(5, 3), f32(3, 4)
    expected = (I.sum(), I.max(), A @ B, np.exp(I) - I.sum() / I.max(), 2 * I.sum() + I.max())
    for got in (program.gaps(I, A, B), tc.compile(GAPS, "gaps", I, A, B,
                                                  target="cuda-emulated")(I, A, B)):
        assert [g.shape for g in got] == [(), (), (5, 4), (5,), ()]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_equivalence_is_kept_in_the_syntax_tree():
    st = parser.parse(GAPS).defs[0].statements[2]
    assert st.equivalent.name.name == "matmul" and len(st.equivalent.args) == 2
    assert [w.var.name for w in st.where] == ["k"]
    err = rejected(tc.TCSyntaxError, "def f(float(N) A) -> (B) { B(i) = A(i) <=> 3 }")
    assert "the name of an equivalent library call" in err.message
    err = rejected(tc.TCSyntaxError, "def f(float(N) A) -> (B) {\n"
                                     "  B(i) +=! A(k) where k in 0:N <=> sum(A(k))\n}")
    assert "goes before 'where'" in err.message and err.span.text() == "<=>"


def test_tensor_hiding_a_builtin_says_so():
    err = rejected(tc.TCSemanticError,
                   "def f(float(N) A) -> (exp) {\n  exp(i) = exp(A(i))\n}")
    assert "subscript must be an integer" in err.message
    assert "'exp' names a tensor here, which hides the builtin function 'exp'" in str(err)


# -- mapping options -------------------------------------------------------------------------

def test_option_text_with_deeply_nested_lists():
    # RecursionError before.
    with pytest.raises(TCOptionsError, match="nested lists are not option values") as info:
        MappingOptions.parse("MappingOptions().tile(" + "[" * 2000 + ")")
    assert info.value.span.start == len("MappingOptions().tile([")


def test_misspelled_option_method_suggests_the_right_one():
    options = MappingOptions().tile(4)
    with pytest.raises(AttributeError, match=r"no attribute 'mapToThread'; did you mean "
                                             r"'mapToThreads'\?"):
        options.mapToThread(32)
    with pytest.raises(AttributeError, match="did you mean 'useSharedMemory'"):
        options.usesharedmemory(True)
    assert not hasattr(options, "__array__") and not hasattr(options, "no_such_thing")
    assert pickle.loads(pickle.dumps(options)) == options
