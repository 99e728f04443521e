"""Recursive-descent parser from TC source to `ast.Module`.

Expression precedence is C's: `?:` < `||` < `&&` < `== !=` < `< <= > >=` < `+ -` < `* / %` <
unary `- !` < postfix (`T(...)`, `T.n`).
"""

from __future__ import annotations

from tcstage.errors import Source, Span, TCSyntaxError
from tcstage.lang import ast
from tcstage.lang.lexer import Token, tokenize

ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!")
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
            close = self.expect(")").span
            type_span = scalar.span.to(close)
        else:
            type_span = scalar.span
        name = self.ident(f"a parameter name after the type '{type_span.text()}'")
        return ast.Param(ast.TensorType(scalar, tuple(dims), type_span), name, scalar.span.to(name.span))

    def dim(self) -> ast.Ident:
        """A size variable, or a constant size such as the spec's `int(1) S`."""
        if self.tok.kind == "number" and self.tok.text.isdigit():
            token = self.advance()
            return ast.Ident(str(int(token.text)), token.span)
        return self.ident("a size variable or a constant size")

    def statement(self) -> ast.Statement:
        if self.at("(") or (self.tok.kind == "ident" and self.peek().text == "="):
            raise TCSyntaxError(
                "calling a TC function from another TC ('(A, B) = f(...)') is not supported",
                self.tok.span, ("call the functions one after the other from Python",))
        tensor = self.ident("a statement such as 'O(i) = ...'")
        if not self.at("("):
            raise self.error(f"'(' and the index list after '{tensor.name}'")
        self.advance()
        indices = [] if self.at(")") else self.comma_list(self.lhs_index, ")")
        self.expect(")")
        if not (self.tok.kind == "op" and self.tok.text in ASSIGN_OPS):
            raise self.error("'=' or a reduction operator (+=, *=, min=, max=, optionally with '!')")
        op_token = self.advance()
        op = op_token.text.rstrip("!")
        rhs = self.expr()
        where = []
        if self.at("where"):
            self.advance()
            where = self.comma_list_open(self.range_constraint)
        end = where[-1].span if where else _span(rhs)
        return ast.Statement(tensor, tuple(indices), op, op_token.text.endswith("!"), rhs,
                             tuple(where), tensor.span.to(end))

    def lhs_index(self) -> ast.Ident:
        expr = self.expr()
        if isinstance(expr, ast.Ident):
            return expr
        raise TCSyntaxError(
            "an index on the left-hand side must be a plain index variable, "
            f"not the expression '{_span(expr).text()}'", _span(expr),
            ("write the computed subscript on the right-hand side instead",))

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
    def expr(self) -> ast.Expr:
        cond = self.binary(0)
        if not self.at("?"):
            return cond
        self.advance()
        then = self.expr()
        self.expect(":", " in the conditional 'c ? a : b'")
        other = self.expr()
        return ast.Ternary(cond, then, other, _span(cond).to(_span(other)))

    def binary(self, level: int) -> ast.Expr:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.tok.kind == "op" and self.tok.text in _BINARY_LEVELS[level]:
            op = self.advance().text
            rhs = self.binary(level + 1)
            lhs = ast.Binary(op, lhs, rhs, _span(lhs).to(_span(rhs)))
        return lhs

    def unary(self) -> ast.Expr:
        if self.at("-", "!", "+"):
            op = self.advance()
            operand = self.unary()
            return operand if op.text == "+" else ast.Unary(op.text, operand, op.span.to(_span(operand)))
        return self.primary()

    def primary(self) -> ast.Expr:
        token = self.tok
        if token.kind == "number":
            self.advance()
            return ast.Number(token.text, token.span)
        if self.at("("):
            self.advance()
            inner = self.expr()
            self.expect(")", " to close the parenthesis")
            return inner
        if token.kind == "ident":
            name = self.ident()
            if self.at("("):
                self.advance()
                args = [] if self.at(")") else self.comma_list(self.expr, ")")
                close = self.expect(")").span
                return ast.Apply(name, tuple(args), name.span.to(close))
            if self.at("."):
                self.advance()
                if self.tok.kind != "number" or not self.tok.text.isdigit():
                    raise self.error(f"a dimension number after '{name.name}.'")
                dim = self.advance()
                return ast.DimRef(name, int(dim.text), name.span.to(dim.span))
            return name
        raise self.error("an expression")


def _span(expr: ast.Expr) -> Span:
    return expr.span
