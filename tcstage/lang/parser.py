"""Parser from TC source to `ast.Module`: recursive descent for the structure, operator
precedence with explicit stacks for expressions.

Expression precedence is C's: `?:` < `||` < `&&` < `== !=` < `< <= > >=` < `+ -` < `* / %` <
unary `- !` < `??` < postfix (`T(...)`, `T.n`). `T(x) ?? v` (T's element, or v outside T) binds
tightest of the infix operators: it belongs to the read, so `I(x) ?? 0 * W(k)` is
`(I(x) ?? 0) * W(k)` (see docs/language.md, Padding). An expression may nest at most
`MAX_EXPRESSION_DEPTH` operators and calls deep (parentheses alone add no depth).
"""

from __future__ import annotations

import attrs

from tcstage.errors import Source, Span, TCSyntaxError
from tcstage.lang import ast
from tcstage.lang.lexer import Token, number_value, tokenize

ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!")
# Deeper expressions are refused: every later pass (checking, range inference, lowering, scop
# extraction, CUDA code) walks expression trees recursively, within Python's recursion limit.
MAX_EXPRESSION_DEPTH = 256
_BINARY_LEVELS = (("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%"))


def parse(text: str, filename: str = "<string>") -> ast.Module:
    source = Source(text, filename)
    return _Parser(source, tokenize(source)).module()


def _describe(token: Token) -> str:
    return "end of input" if token.kind == "eof" else f"'{token.text}'"


class _Parser:
    def __init__(self, source: Source, tokens: list[Token]):
        self.source, self.tokens, self.pos = source, tokens, 0

    # -- token helpers ---------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def at(self, *texts: str) -> bool:
        return self.tok.kind in ("op", "keyword") and self.tok.text in texts

    def advance(self) -> Token:
        token = self.tok
        self.pos += 1
        return token

    def error(self, what: str, token: Token | None = None) -> TCSyntaxError:
        token = token or self.tok
        return TCSyntaxError(f"expected {what}, found {_describe(token)}", token.span)

    def expect(self, text: str, context: str = "") -> Token:
        if not self.at(text):
            raise self.error(f"'{text}'{context}")
        return self.advance()

    def ident(self, what: str = "an identifier") -> ast.Ident:
        if self.tok.kind != "ident":
            raise self.error(what)
        token = self.advance()
        return ast.Ident(token.text, token.span)

    def comma_list(self, item, close: str) -> list:
        items = [item()]
        while self.at(","):
            self.advance()
            items.append(item())
        if not self.at(close):
            raise self.error(f"',' or '{close}'")
        return items

    # -- top level ---------------------------------------------------------------------------
    def module(self) -> ast.Module:
        defs = []
        while self.tok.kind != "eof":
            if not self.at("def"):
                raise self.error("'def' to start a TC function")
            defs.append(self.definition())
        if not defs:
            raise TCSyntaxError("no TC function found: the source holds no 'def'", self.tok.span)
        return ast.Module(tuple(defs), self.source)

    def definition(self) -> ast.Def:
        start = self.expect("def").span
        name = self.ident("the function name after 'def'")
        self.expect("(", " to open the parameter list")
        params = [] if self.at(")") else self.comma_list(self.param, ")")
        self.expect(")")
        self.expect("->", " between the parameters and the outputs")
        if self.at("("):
            self.advance()
            returns = self.comma_list(lambda: self.ident("an output name"), ")")
            self.expect(")")
        else:  # the spec's single-output shorthand: `-> A`
            returns = [self.ident("an output name or '(' after '->'")]
        self.expect("{", " to open the function body")
        statements = []
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise TCSyntaxError(f"missing '}}' closing the body of '{name.name}'",
                                    Span(self.source, self.tok.span.start, self.tok.span.start), (
                                        f"the body opened at line {start.line}",))
            statements.append(self.statement())
        end = self.advance().span
        return ast.Def(name, tuple(params), tuple(returns), tuple(statements), start.to(end))

    def param(self) -> ast.Param:
        scalar = self.ident("a type such as 'float' or 'float(N, M)'")
        dims = []
        if self.at("("):
            self.advance()
            dims = self.comma_list(self.dim, ")")
            runs = [d for d in dims if d.name == "..."]
            if len(runs) > 1:
                raise TCSyntaxError("a tensor type has at most one '...' (the run of dimensions "
                                    "it stands for would be ambiguous)", runs[1].span)
            close = self.expect(")").span
            type_span = scalar.span.to(close)
        else:
            type_span = scalar.span
        name = self.ident(f"a parameter name after the type '{type_span.text()}'")
        return ast.Param(ast.TensorType(scalar, tuple(dims), type_span), name, scalar.span.to(name.span))

    def dim(self) -> ast.Ident:
        """A size variable, a constant size such as the spec's `int(1) S`, or `...`: a run of
        dimensions (a rank-polymorphic TC, lang/ellipsis.py)."""
        if self.at("..."):
            return ast.Ident("...", self.advance().span)
        if self.tok.kind == "number" and self.tok.text.isdigit():
            token = self.advance()
            return ast.Ident(str(number_value(token.text)), token.span)
        return self.ident("a size variable or a constant size")

    def statement(self) -> ast.Statement | ast.TCCall:
        if self.at("("):  # `(a, b) = f(x, y)`
            start = self.advance().span
            results = self.comma_list(lambda: self.ident("a result name"), ")")
            self.expect(")")
            return self.call(start, results)
        if self.tok.kind == "ident" and self.peek().kind == "op" and self.peek().text == ",":
            first = self.ident()  # `a, b = f(x, y)`: no other statement has a ',' here
            self.advance()
            rest = self.comma_list_open(lambda: self.ident("a result name"))
            return self.call(first.span, [first, *rest])
        tensor = self.ident("a statement such as 'O(i) = ...'")
        indices, listed = [], self.at("(")  # a rank-0 tensor may omit its empty list
        if listed:
            self.advance()
            indices = [] if self.at(")") else self.comma_list(self.lhs_index, ")")
            self.expect(")")
        if not (self.tok.kind == "op" and self.tok.text in ASSIGN_OPS):
            what = "'=' or a reduction operator (+=, *=, min=, max=, optionally with '!')"
            raise self.error(what if listed else
                             f"'(' and the index list after '{tensor.name}', or {what}")
        op_token = self.advance()
        op = op_token.text.rstrip("!")
        rhs = self.expr()
        equivalent = self.equivalent() if self.at("<=>") else None
        where = []
        if self.at("where"):
            self.advance()
            where = self.comma_list_open(self.range_constraint)
            if self.at("<=>"):
                raise TCSyntaxError("an equivalence annotation '<=> f(...)' goes before 'where'",
                                    self.tok.span)
        # (the last token read: an expression's own span leaves out a closing ')' of `/ (K)`)
        end = self.tokens[self.pos - 1].span
        return ast.Statement(tensor, tuple(indices), op, op_token.text.endswith("!"), rhs,
                             tuple(where), tensor.span.to(end), equivalent)

    def at_call_results(self) -> bool:
        """Whether the tokens ahead are `(a, b) =`: the results of a call statement. Statements
        are separated by whitespace only, so `... * s` followed by `(C) = f(x)` would otherwise
        read as the call `s(C)`; no expression has `(names) =` in it."""
        k = self.pos + 1
        while self.tokens[k].kind == "ident":
            k += 1
            if self.tokens[k].kind != "op" or self.tokens[k].text != ",":
                break
            k += 1
        close, after = self.tokens[k], self.tokens[min(k + 1, len(self.tokens) - 1)]
        return close.kind == "op" and close.text == ")" and after.kind == "op" \
            and after.text in ASSIGN_OPS

    def call(self, start: Span, results: list[ast.Ident]) -> ast.TCCall:
        """The rest of a call statement after its results: `= f(x, y)`."""
        self.expect("=", " after the results of a TC function call")
        callee = self.ident("the name of the TC function to call")
        self.expect("(", f" after '{callee.name}' to open its argument list")
        args = [] if self.at(")") else self.comma_list(self.call_argument, ")")
        close = self.expect(")").span
        return ast.TCCall(tuple(results), callee, tuple(args), start.to(close))

    def call_argument(self) -> ast.Ident:
        if self.tok.kind == "ident" and self.peek().kind == "op" and self.peek().text in (",", ")"):
            return self.ident()
        expr = self.expr()
        raise TCSyntaxError(
            "an argument of a TC function call is the name of a tensor or scalar, "
            f"not the expression '{_span(expr).text()}'", _span(expr),
            ("compute it into a tensor first, then pass that tensor",))

    def equivalent(self) -> ast.Equivalent:
        """`<=> name(args)` (TC's grammar places it between the right-hand side and `where`)."""
        start = self.expect("<=>").span
        name = self.ident("the name of an equivalent library call after '<=>'")
        self.expect("(", f" after '{name.name}'")
        args = self.expr_list(")")
        close = self.expect(")").span
        return ast.Equivalent(name, tuple(args), start.to(close))

    def lhs_index(self) -> ast.Expr:
        """An index variable, or (a scatter, checked by sema) any subscript expression."""
        return self.expr()

    def comma_list_open(self, item) -> list:
        """A comma list with no closing bracket (the where clause)."""
        items = [item()]
        while self.at(",") and self.peek().kind == "ident":
            self.advance()
            items.append(item())
        return items

    def range_constraint(self) -> ast.RangeConstraint:
        var = self.ident("an index variable in the where clause")
        if self.tok.kind == "ident" and self.tok.text == "in":
            self.advance()
            lo = self.expr()
            self.expect(":", " in the range 'lo:hi'")
            hi = self.expr()
            return ast.RangeConstraint(var, lo, hi, var.span.to(_span(hi)))
        if self.at("="):  # the older `k = [lo, hi[` (half-open) or `k = [lo, hi]` (closed)
            self.advance()
            self.expect("[", " to open the range '[lo, hi['")
            lo = self.expr()
            self.expect(",", " in the range '[lo, hi['")
            hi = self.expr()
            if not self.at("[", "]"):
                raise self.error("'[' (half-open) or ']' (closed) to end the range")
            close = self.advance()
            if close.text == "]":
                one = ast.Number("1", close.span)
                hi = ast.Binary("+", hi, one, _span(hi))
            return ast.RangeConstraint(var, lo, hi, var.span.to(close.span))
        raise self.error(f"'in' after '{var.name}' (as in '{var.name} in 0:N')")

    # -- expressions -------------------------------------------------------------------------
    # Operator precedence parsing with explicit stacks instead of recursion, so that no
    # nesting reaches Python's recursion limit here; MAX_EXPRESSION_DEPTH then bounds the
    # trees every later pass walks recursively.
    def expr(self) -> ast.Expr:
        operands: list[tuple[ast.Expr, int]] = []  # (node, depth)
        pending: list[_Pending] = []
        while True:
            self.operand(operands, pending)
            if not self.operator(operands, pending):
                return operands.pop()[0]

    def operand(self, operands: list, pending: list) -> None:
        """Reads prefix operators and opening brackets up to one operand, pushing them."""
        while True:
            token = self.tok
            if self.at("-", "!"):
                pending.append(_Pending("unary", self.advance(), _UNARY_PRECEDENCE))
            elif self.at("+"):  # unary plus changes nothing
                self.advance()
            elif self.at("("):
                pending.append(_Pending("paren", self.advance()))
            elif token.kind == "number":
                operands.append((ast.Number(self.advance().text, token.span), 1))
                return
            elif self.at("..."):  # (where it may stand is checked by lang/ellipsis.py)
                operands.append((ast.Dots(self.advance().span), 1))
                return
            elif token.kind == "ident":
                name = self.ident()
                if self.at("(") and not self.at_call_results():
                    open_ = self.advance()
                    if not self.at(")"):
                        pending.append(_Pending("call", open_, name=name, first=len(operands)))
                        continue
                    close = self.advance()
                    operands.append((ast.Apply(name, (), name.span.to(close.span)), 1))
                elif self.at("."):
                    self.advance()
                    if self.tok.kind != "number" or not self.tok.text.isdigit():
                        raise self.error(f"a dimension number after '{name.name}.'")
                    dim = self.advance()
                    operands.append((ast.DimRef(name, number_value(dim.text),
                                                name.span.to(dim.span)), 1))
                else:
                    operands.append((name, 1))
                return
            else:
                raise self.error("an expression")

    def operator(self, operands: list, pending: list) -> bool:
        """Reads closing brackets and one operator after an operand; False at the end of the
        expression (a token that cannot continue it)."""
        while True:
            token = self.tok
            precedence = _BINARY_PRECEDENCE.get(token.text) if token.kind == "op" else None
            if self.at("??"):
                precedence = _PADDED_PRECEDENCE
            if precedence is not None:
                _reduce(operands, pending, lambda p: p.precedence >= precedence)
                pending.append(_Pending("binary", self.advance(), precedence))
                return True
            if self.at("?"):
                _reduce(operands, pending, lambda p: p.precedence > _TERNARY_PRECEDENCE)
                pending.append(_Pending("?", self.advance(), _TERNARY_PRECEDENCE))
                return True
            if self.at(":", ",", ")"):
                _reduce(operands, pending, lambda p: p.kind in ("unary", "binary", ":"))
                top = pending[-1] if pending else None
                if top is None:
                    return False  # a ':' of a range, a ',' or ')' of an enclosing list
                if token.text == ":" and top.kind == "?":
                    pending[-1] = attrs.evolve(top, kind=":")
                    self.advance()
                    return True
                if token.text == "," and top.kind == "call":
                    self.advance()
                    return True
                if token.text == ")" and top.kind in ("paren", "call"):
                    close = self.advance()
                    pending.pop()
                    if top.kind == "paren" and not isinstance(operands[-1][0], ast.Ident):
                        # no node, but the span takes the parentheses: a caret under
                        # `(i + 1) % N` quotes it whole, not `i + 1) % N`
                        node, depth = operands.pop()
                        operands.append((attrs.evolve(node, span=top.token.span.to(close.span)),
                                         depth))
                    if top.kind == "call":  # else: parentheses add no node
                        args = operands[top.first:]
                        del operands[top.first:]
                        operands.append(_node(ast.Apply(top.name, tuple(a for a, _ in args),
                                                        top.name.span.to(close.span)),
                                              1 + max(d for _, d in args)))
                    continue
            _reduce(operands, pending, lambda p: p.kind in ("unary", "binary", ":"))
            if not pending:
                return False
            raise self.error({"paren": "')' to close the parenthesis",
                              "call": "',' or ')'",
                              "?": "':' in the conditional 'c ? a : b'"}[pending[-1].kind])

    def expr_list(self, close: str) -> list[ast.Expr]:
        return [] if self.at(close) else self.comma_list(self.expr, close)


# C's precedence, loosest first: `?:` < `||` < `&&` < `== !=` < `< <= > >=` < `+ -` < `* / %`
# < unary `- !`.
_TERNARY_PRECEDENCE = 0
_BINARY_PRECEDENCE = {op: level + 1 for level, ops in enumerate(_BINARY_LEVELS) for op in ops}
_UNARY_PRECEDENCE = len(_BINARY_LEVELS) + 1
_PADDED_PRECEDENCE = _UNARY_PRECEDENCE + 1  # `T(x) ?? v`: part of the read


@attrs.frozen
class _Pending:
    """An operator or bracket whose operands are still being read. Kinds: 'unary', 'binary',
    'paren', 'call' (`name(`, its arguments from operand `first` on), '?' (a condition
    waiting for its ':') and ':' (a conditional waiting for its last operand)."""

    kind: str
    token: Token
    precedence: int = -1  # brackets: -1, below every operator
    name: ast.Ident | None = None
    first: int = 0


def _reduce(operands: list, pending: list, applies) -> None:
    """Builds nodes from the pending operators on top of the stack while `applies` to them."""
    while pending and applies(pending[-1]):
        p = pending.pop()
        if p.kind == "unary":
            x, d = operands.pop()
            node, depth = ast.Unary(p.token.text, x, p.token.span.to(_span(x))), d + 1
        elif p.kind == "binary":
            (b, db), (a, da) = operands.pop(), operands.pop()
            node = ast.Padded(a, b, _span(a).to(_span(b))) if p.token.text == "??" else \
                ast.Binary(p.token.text, a, b, _span(a).to(_span(b)))
            depth = max(da, db) + 1
        else:  # ':'
            (other, do), (then, dt), (cond, dc) = operands.pop(), operands.pop(), operands.pop()
            node = ast.Ternary(cond, then, other, _span(cond).to(_span(other)))
            depth = max(dc, dt, do) + 1
        operands.append(_node(node, depth))


def _node(node: ast.Expr, depth: int) -> tuple[ast.Expr, int]:
    if depth > MAX_EXPRESSION_DEPTH:
        raise TCSyntaxError(
            f"expression nested too deeply: more than {MAX_EXPRESSION_DEPTH} levels",
            _span(node), ("a chain such as 'a + b + c + ...' counts one level per operator; "
                          "split the expression over several statements through a temporary",))
    return node, depth


def _span(expr: ast.Expr) -> Span:
    return expr.span
