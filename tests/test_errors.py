"""Every mistake a user can make in TC source gets a TCError with file, line, column and a caret
under the offending text, and a message that says what is wrong."""

import pytest

import tcstage as tc

# (source, error class, message fragment, (line, column) of the caret, text under the caret)
CASES = [
    # syntax
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i\n}", tc.TCSyntaxError,
     "expected ',' or ')', found '}'", (3, 1), "}"),
    ("def f(float(N) A) -> (B) {\n  B(i+1) = A(i)\n}", tc.TCSemanticError,
     "writes at computed subscripts, which only an update of a tensor defined by an earlier "
     "statement may do", (2, 5), "i+1"),
    ("def f(float(N) A) -> (B) {\n  B(i) == A(i)\n}", tc.TCSyntaxError,
     "expected '=' or a reduction operator", (2, 8), "=="),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) @ 2\n}", tc.TCSyntaxError,
     "unexpected character '@'", (2, 15), "@"),
    ("def f(float(N) A) (B) { B(i) = A(i) }", tc.TCSyntaxError, "expected '->'", (1, 19), "("),
    ("fed f(float(N) A) -> (B) { B(i) = A(i) }", tc.TCSyntaxError, "expected 'def'", (1, 1),
     "fed"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) where i 0:N\n}", tc.TCSyntaxError,
     "expected 'in' after 'i'", (2, 23), "0"),
    ("def f(float(N) A) -> (B) {\n  B(i) = 1.5x\n}", tc.TCSyntaxError, "malformed number",
     (2, 10), "1.5x"),
    # names and scoping
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) + Ax(i)\n}", tc.TCSemanticError,
     "unknown tensor or function 'Ax'; did you mean 'A'?", (2, 17), "Ax"),
    ("def f(float(N) A) -> (B) {\n  B(i) = expp(A(i))\n}", tc.TCSemanticError,
     "unknown tensor or function 'expp'; did you mean 'exp'?", (2, 10), "expp"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i, i)\n}", tc.TCSemanticError,
     "'A' has rank 1 but is read with 2 subscripts", (2, 10), "A(i, i)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = exp(A(i), 1)\n}", tc.TCSemanticError,
     "'exp' takes 1 argument, not 2", (2, 10), "exp(A(i), 1)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A\n}", tc.TCSemanticError,
     "tensor 'A' has rank 1; read it with 1 subscript", (2, 10), "A"),
    ("def f(float(N) A, float(N) A) -> (B) { B(i) = A(i) }", tc.TCSemanticError,
     "'A' is declared twice", (1, 28), "A"),
    ("def f(float(N) A, float(M) N) -> (B) { B(i) = A(i) }", tc.TCSemanticError,
     "tensor 'N' has the name of a size variable", (1, 28), "N"),
    ("def f(flaot(N) A) -> (B) { B(i) = A(i) }", tc.TCSemanticError,
     "unknown type 'flaot'; did you mean 'float'?", (1, 7), "flaot"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float(N) A) -> (B) { B(i) = A(i) }",
     tc.TCSemanticError, "redefinition of TC function 'f'", (2, 5), "f"),
    ("def f(float(N) A) -> (B, C) { B(i) = A(i) }", tc.TCSemanticError,
     "output 'C' is never defined", (1, 26), "C"),
    ("def f(float(N) A) -> (B) {\n  B(N) = A(0)\n}", tc.TCSemanticError,
     "left-hand index 'N' is a size variable", (2, 5), "N"),
    ("def f(float(N,N) A) -> (B) {\n  B(i, i) = A(i, i)\n}", tc.TCSemanticError,
     "'i' appears twice on the left-hand side", (2, 8), "i"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A.1\n}", tc.TCSemanticError,
     "'A' has rank 1, so it has no dimension 1", (2, 10), "A.1"),
    # writes
    ("def f(float(N) A) -> (B) {\n  A(i) = 0\n  B(i) = A(i)\n}", tc.TCSemanticError,
     "cannot write input 'A'", (2, 3), "A"),
    ("def f(float(N) A) -> (A) { A(i) = A(i) }", tc.TCSemanticError,
     "output 'A' is also an input", (1, 23), "A"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i)\n  B(i, j) = 0\n}", tc.TCSemanticError,
     "'B' has rank 1 but is written with 2 indices", (3, 3), "B"),
    # reductions and in-place rules
    ("def f(float(N,M) A) -> (B) {\n  B(i) = A(i, j)\n}", tc.TCSemanticError,
     "index variable 'j' appears only on the right-hand side", (2, 15), "j"),
    ("def f(float(N,N) A) -> (B) {\n  B(i, j) = A(i, j)\n  B(i, j) = B(j, i)\n}",
     tc.TCSemanticError, "read at a different point than it is written", (3, 13), "B(j, i)"),
    ("def f(float(N,M) A) -> (B) {\n  B(i) = 0\n  B(i) += B(i) * A(i, k)\n}",
     tc.TCSemanticError, "read inside a reduction into 'B'", (3, 11), "B(i)"),
    # The spec resets B before the right-hand side runs, so the read could only see 0; this
    # used to be an internal lowering error.
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i)\n  B(i) +=! A(i) + B(i)\n}", tc.TCSemanticError,
     "'B' is read in a statement that first resets it with '+=!'", (3, 19), "B(i)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i)\n  B(i) max=! B(i)\n}", tc.TCSemanticError,
     "'B' is read in a statement that first resets it with 'max=!'", (3, 14), "B(i)"),
    ("def f(float(N) A) -> (B) {\n  T(i) += A(i)\n  B(i) = T(i)\n}", tc.TCSemanticError,
     "temporary 'T' accumulates with '+=' before any statement has defined it", (2, 3), "T"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) where k in 0:N\n}", tc.TCSemanticError,
     "where clause constrains 'k', which the statement does not use", (2, 21), "k"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) where i in 0:A(0)\n}", tc.TCSemanticError,
     "range bound may not read a tensor", (2, 28), "A(0)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) where i in 0:1.5\n}", tc.TCSemanticError,
     "range bound must be an integer", (2, 28), "1.5"),
    # types
    ("def f(float(N) A) -> (B) {\n  B(i) = A(A(i))\n}", tc.TCSemanticError,
     "subscript must be an integer, not float32", (2, 12), "A(i)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) % 2\n}", tc.TCSemanticError,
     "'%' needs integer operands", (2, 10), "A(i) % 2"),
    # range inference
    ("def f(float(N) A) -> (B) {\n  B(i, j) = A(i)\n}", tc.TCRangeError,
     "cannot infer the range of 'j': it does not index any tensor", (2, 8), "j"),
    ("def f(float(N) A) -> (B) {\n  B(i) +=! A(i + j)\n}", tc.TCRangeError,
     "ambiguous", (2, 5), "i"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i * i)\n}", tc.TCRangeError,
     "cannot solve the subscript 'i * i'", (2, 12), "i * i"),
    # a parenthesised operand is quoted with its parentheses (it lost the '(')
    ("def f(float(N) A) -> (B) {\n  B(i) = A((i + 1) % N)\n}", tc.TCRangeError,
     "cannot solve the subscript '(i + 1) % N'", (2, 12), "(i + 1) % N"),
]


@pytest.mark.parametrize("source, cls, fragment, position, caret_text", CASES,
                         ids=[c[2][:40] for c in CASES])
def test_error_names_problem_and_place(source, cls, fragment, position, caret_text):
    with pytest.raises(cls) as info:
        tc.define(source, "user.tc")
    err = info.value
    assert fragment in err.message
    assert (err.line, err.column) == position
    assert err.span.text() == caret_text
    text = str(err)
    assert text.startswith(f"user.tc:{position[0]}:{position[1]}: error: ")
    # The caret line sits under the offending text.
    src_line, caret_line = text.split("\n")[1:3]
    col = caret_line.index("^")
    assert src_line[col:col + len(caret_text)] == caret_text


def test_all_errors_are_tcerrors():
    for cls in (tc.TCSyntaxError, tc.TCSemanticError, tc.TCRangeError, tc.TCArgumentError):
        assert issubclass(cls, tc.TCError)


def test_empty_source():
    with pytest.raises(tc.TCSyntaxError, match="no TC function"):
        tc.define("   # nothing here\n")


def test_missing_brace_points_at_the_end_and_the_opening():
    with pytest.raises(tc.TCSyntaxError) as info:
        tc.define("def f(float(N) A) -> (B) {\n  B(i) = A(i)\n")
    assert "missing '}'" in info.value.message
    assert "line 1" in str(info.value)


def test_unknown_function_name_in_program():
    prog = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }")
    with pytest.raises(tc.TCError, match="no TC function named 'g'; defined: f"):
        prog.g
