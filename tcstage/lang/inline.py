"""Inlining of TC function calls: `(a, b) = f(x, y)` becomes f's statements, renamed into the
caller, before they are checked there. Everything after `sema` sees ordinary statements.

The renaming (docs/language.md, "Calling a TC function"):
- f's inputs become the call's arguments, f's outputs the call's results;
- f's temporaries get fresh names `f_T` (`f_T_1`, ... where that is taken): names the caller's
  source never uses, so they cannot clash with it, and readable in errors and `ranges()`;
- f's size variables become the sizes of the arguments' dimensions: a size variable of the
  caller (or a constant) where the argument is an input, else `X.k` (the extent range inference
  gives the caller's tensor `X`);
- f's index variables keep their names, unless a name is a tensor or size variable of the
  caller; then they get a fresh one as well.
Every span keeps pointing into f's source, with a note naming the call (`Span.context`), so
any later error at an inlined statement says which call put it there.
"""

from __future__ import annotations

import difflib

import attrs

from tcstage.errors import Source, Span, TCSemanticError
from tcstage.lang import ast
from tcstage.lang import checked as C
from tcstage.lang.lexer import tokenize


@attrs.frozen
class Callee:
    """A checked TC function with what inlining it needs."""

    function: C.Function
    statements: tuple[ast.Statement, ...]  # its statements, its own calls already inlined


@attrs.frozen
class Scope:
    """The caller at the point of a call."""

    function: str  # the caller's name
    tensors: dict  # name -> C.Tensor: the tensors defined before the call
    size_vars: dict  # the caller's size variables
    names: frozenset  # every identifier the caller's source uses
    globals: frozenset  # the caller's tensor and size variable names (all statements)
    used: set  # names given out by earlier calls of this caller (mutable, shared)
    # Tensors first set to a bare literal, whose type a later statement may still set (see
    # sema's hints): a type mismatch of theirs goes to `deferred`, an error only if it stays.
    provisional: frozenset = frozenset()
    deferred: list = attrs.field(factory=list)


def inline(call: ast.TCCall, callee: Callee, scope: Scope) -> tuple[ast.Statement, ...]:
    """The statements that replace `call`, or a TCSemanticError at the call."""
    fn = callee.function
    name = call.callee.name
    _check_shape(call, fn, scope)
    sizes = _bind_sizes(call, fn, scope)

    avoid = set(scope.names) | set(scope.tensors) | scope.used | scope.globals
    for s in callee.statements:
        avoid |= _statement_names(s)
    renames = {t.name: a.name for t, a in zip(fn.inputs, call.args)}
    renames.update({o: r.name for o, r in zip(fn.outputs, call.results)})
    for t in fn.tensors.values():
        if t.kind == "temp":
            renames[t.name] = C.fresh_name(f"{name}_{t.name}", avoid)
    taken = set(scope.globals) | set(scope.tensors) | scope.used | set(renames.values())
    scope.used.update(renames.values())  # (index variables are local: they need not be kept)

    shown = ", ".join([f"{a} -> {b}" for a, b in renames.items() if a != b]
                      + [f"{v} = {_size_text(sizes[v])}" for v in fn.size_vars
                         if _size_text(sizes[v]) != v])
    src = call.span
    note = (f"in '{name}', inlined into '{scope.function}' by the call at "
            f"{src.source.filename}:{src.line}:{src.column}" + (f" ({shown})" if shown else ""))
    r = _Renamer(fn, renames, sizes, note, taken, avoid, scope, call)
    return tuple(r.statement(s) for s in callee.statements)


# -- checks at the call ------------------------------------------------------------------------
def _check_shape(call: ast.TCCall, fn: C.Function, scope: Scope) -> None:
    name = call.callee.name
    params = ", ".join(t.name for t in fn.inputs)
    if len(call.args) != len(fn.inputs):
        n = len(fn.inputs)
        raise TCSemanticError(
            f"'{name}' takes {n} argument{'' if n == 1 else 's'} ({params}), but the call passes "
            f"{len(call.args)}", call.span, _defined_at(fn))
    if len(call.results) != len(fn.outputs):
        n = len(fn.outputs)
        raise TCSemanticError(
            f"'{name}' returns {n} tensor{'' if n == 1 else 's'} ({', '.join(fn.outputs)}), but "
            f"the call takes {len(call.results)} result{'' if len(call.results) == 1 else 's'}",
            call.span, _defined_at(fn))
    for o in fn.outputs:
        if fn.tensors[o].inout:
            t = fn.tensors[o]
            raise TCSemanticError(
                f"'{name}' cannot be called from a TC: its output '{o}' starts from values its "
                "caller supplies (an in/out output), and a call supplies none", call.span,
                (f"'{o}' is in/out because its first statement (line {t.span.line}) reads it or "
                 "accumulates without '!'" if t.span is not None else
                 f"'{o}' reads its own values before defining them",
                 "start it from the reduction's identity ('+=!') or compute it from a copy"))
    for p, a in zip(fn.inputs, call.args):
        where = f"argument '{a.name}' for parameter '{p.name}' of '{name}'"
        t = scope.tensors.get(a.name)
        if t is None:
            if a.name in scope.size_vars:
                raise TCSemanticError(f"{where} is a size variable; pass a tensor or a scalar",
                                      a.span)
            if a.name in scope.globals:
                raise TCSemanticError(f"{where} is defined only after this call", a.span,
                                      ("a call reads tensors defined before it",))
            close = difflib.get_close_matches(a.name, list(scope.tensors), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise TCSemanticError(f"{where} is not a tensor of '{scope.function}'{hint}", a.span)
        declared = f"parameter '{p.name}' is declared '{_declared(p)}'"
        if t.rank != p.rank:
            raise TCSemanticError(f"{where} has rank {t.rank}, not {p.rank}", a.span,
                                  (declared,))
        if t.type != p.type:
            error = TCSemanticError(f"{where} holds {t.type}, not {p.type}", a.span,
                                    (declared, "a call converts nothing: the types must be the "
                                     "same"))
            if a.name not in scope.provisional:
                raise error
            scope.deferred.append(error)
    seen = set()
    for r, o in zip(call.results, fn.outputs):
        where = f"result '{r.name}' of the call of '{name}' (its output '{o}')"
        existing = scope.tensors.get(r.name)
        if existing is not None:
            what = "an input" if existing.kind == "input" else "already defined"
            raise TCSemanticError(f"{where} is {what}; a call defines new tensors", r.span,
                                  ("give the result a new name",))
        if r.name in scope.size_vars:
            raise TCSemanticError(f"{where} has the name of a size variable", r.span)
        if r.name in seen:
            raise TCSemanticError(f"{where} is listed twice", r.span)
        seen.add(r.name)


def _declared(p: C.Tensor) -> str:
    return p.span.text() if p.span is not None else f"{p.type} {p.name}"


def _defined_at(fn: C.Function) -> tuple[str, ...]:
    if fn.span is None:
        return ()
    return (f"'{fn.name}' is defined at {fn.span.source.filename}:{fn.span.line}",)


# A size of the caller: an int (a constant), a str (a size variable), or (tensor, k): the
# extent of the caller's non-input tensor along k, known once ranges are inferred.
def _actual(t: C.Tensor, k: int):
    if t.kind == "input":
        d = t.dims[k]
        return int(d) if d.isdigit() else d
    return (t.name, k)


def _size_text(size) -> str:
    return f"{size[0]}.{size[1]}" if isinstance(size, tuple) else str(size)


def _bind_sizes(call: ast.TCCall, fn: C.Function, scope: Scope) -> dict:
    """Each size variable of the callee -> a size of the caller. Sizes of inputs are compared
    (a constant, or a size variable of the caller); the extents of temporaries are not known
    before range inference, so a size variable bound to one takes an input's size where another
    argument gives one."""
    name = call.callee.name
    bound: dict = {}  # size var -> (size, argument, parameter, dimension)
    for p, a in zip(fn.inputs, call.args):
        t = scope.tensors[a.name]
        for k, d in enumerate(p.dims):
            size = _actual(t, k)
            if d.isdigit():
                if not isinstance(size, tuple) and size != int(d):
                    raise TCSemanticError(
                        f"argument '{a.name}' for parameter '{p.name}' of '{name}' has size "
                        f"{size} in dimension {k}, not {d}", a.span,
                        (f"parameter '{p.name}' is declared '{_declared(p)}'",))
                continue
            prev = bound.get(d)
            if prev is None or isinstance(prev[0], tuple) and not isinstance(size, tuple):
                bound[d] = (size, a.name, p.name, k)
            elif not isinstance(size, tuple) and size != prev[0]:
                _, a0, p0, k0 = prev
                raise TCSemanticError(
                    f"the call of '{name}' gives size variable '{d}' two sizes: dimension {k0} "
                    f"of '{a0}' (for '{p0}') is {prev[0]}, dimension {k} of '{a.name}' (for "
                    f"'{p.name}') is {size}", a.span,
                    (f"'{name}' declares both dimensions as '{d}'; give them one size variable "
                     f"in the signature of '{scope.function}'",))
    return {v: b[0] for v, b in bound.items()}


# -- renaming ----------------------------------------------------------------------------------
class _Renamer:
    """Copies the callee's statements into the caller's names, every span with the call note."""

    def __init__(self, fn: C.Function, renames, sizes, note, taken, avoid, scope, call):
        self.fn, self.renames, self.sizes, self.note = fn, renames, sizes, note
        self.taken, self.avoid, self.scope, self.call = taken, avoid, scope, call
        self.indices: dict[str, str] = {}
        self.param_dims = {t.name: t.dims for t in fn.inputs}

    def span(self, s: Span) -> Span:
        return Span(s.source, s.start, s.end, (*s.context, self.note))

    def ident(self, e: ast.Ident, name: str | None = None) -> ast.Ident:
        return ast.Ident(e.name if name is None else name, self.span(e.span))

    def index(self, e: ast.Ident) -> ast.Ident:
        """An index variable, renamed where its name is a tensor or size of the caller."""
        n = e.name
        if n not in self.indices:
            self.indices[n] = C.fresh_name(n, self.avoid) if n in self.taken else n
        return self.ident(e, self.indices[n])

    def size(self, size, at: Span) -> ast.Expr:
        span = self.span(at)
        if isinstance(size, int):
            return ast.Number(str(size), span)
        if isinstance(size, str):
            return ast.Ident(size, span)
        return ast.DimRef(ast.Ident(size[0], span), size[1], span)

    def statement(self, s: ast.Statement) -> ast.Statement:
        eq = s.equivalent
        if eq is not None:
            eq = ast.Equivalent(eq.name, tuple(self.expr(a) for a in eq.args), self.span(eq.span))
        where = tuple(ast.RangeConstraint(self.index(w.var), self.expr(w.lo), self.expr(w.hi),
                                          self.span(w.span)) for w in s.where)
        out = ast.Statement(self.ident(s.tensor, self.renames[s.tensor.name]),
                            tuple(self.index(i) if isinstance(i, ast.Ident) else self.expr(i)
                                  for i in s.indices), s.op, s.init,
                            self.expr(s.rhs), where, self.span(s.span), eq)
        return attrs.evolve(out, text=self.text(s.text or s.span.text()))

    def text(self, text: str) -> str:
        """The statement's text with the caller's names, spacing and comments kept."""
        names = {**self.renames, **self.indices,
                 **{v: _size_text(self.sizes[v]) for v in self.fn.size_vars}}
        out, pos, previous = [], 0, None
        for token in tokenize(Source(text)):
            # `in` after an identifier is the where clause's keyword, not a tensor `in`
            keyword = token.text == "in" and previous is not None and previous.kind == "ident"
            if token.kind == "ident" and token.text in names and not keyword:
                out += [text[pos:token.span.start], names[token.text]]
                pos = token.span.end
            previous = token
        return "".join(out) + text[pos:]

    def expr(self, e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Number):
            return ast.Number(e.text, self.span(e.span))
        if isinstance(e, ast.Ident):
            if e.name in self.fn.size_vars:
                return self.size(self.sizes[e.name], e.span)
            if e.name in self.renames:
                return self.ident(e, self.renames[e.name])
            return self.index(e)
        if isinstance(e, ast.DimRef):
            dims = self.param_dims.get(e.tensor.name)
            if dims is not None:  # `A.k` of an input is the size it was declared with
                d = dims[e.dim]
                return self.size(int(d) if d.isdigit() else self.sizes[d], e.span)
            return ast.DimRef(self.ident(e.tensor, self.renames[e.tensor.name]), e.dim,
                              self.span(e.span))
        if isinstance(e, ast.Apply):
            n = e.name.name
            if n in self.renames:
                name = self.ident(e.name, self.renames[n])
            else:  # a builtin function: the caller must not hide it with a tensor
                if n in self.scope.globals:
                    raise TCSemanticError(
                        f"'{self.fn.name}' calls the builtin function '{n}', but '{n}' names a "
                        f"tensor or size of '{self.scope.function}', where the call inlines it",
                        self.call.span, (f"rename '{n}' in '{self.scope.function}'",))
                name = self.ident(e.name)
            return ast.Apply(name, tuple(self.expr(a) for a in e.args), self.span(e.span))
        if isinstance(e, ast.Unary):
            return ast.Unary(e.op, self.expr(e.operand), self.span(e.span))
        if isinstance(e, ast.Binary):
            return ast.Binary(e.op, self.expr(e.lhs), self.expr(e.rhs), self.span(e.span))
        if isinstance(e, ast.Ternary):
            return ast.Ternary(self.expr(e.cond), self.expr(e.then), self.expr(e.other),
                               self.span(e.span))
        if isinstance(e, ast.Padded):
            return ast.Padded(self.expr(e.read), self.expr(e.value), self.span(e.span))
        raise AssertionError(e)


# -- names a source uses -----------------------------------------------------------------------
def expr_names(e: ast.Expr) -> set[str]:
    if isinstance(e, ast.Number):
        return set()
    if isinstance(e, ast.Ident):
        return {e.name}
    if isinstance(e, ast.DimRef):
        return {e.tensor.name}
    if isinstance(e, ast.Apply):
        return {e.name.name}.union(*(expr_names(a) for a in e.args))
    if isinstance(e, ast.Unary):
        return expr_names(e.operand)
    if isinstance(e, ast.Binary):
        return expr_names(e.lhs) | expr_names(e.rhs)
    if isinstance(e, ast.Ternary):
        return expr_names(e.cond) | expr_names(e.then) | expr_names(e.other)
    if isinstance(e, ast.Padded):
        return expr_names(e.read) | expr_names(e.value)
    raise AssertionError(e)


def _statement_names(s: ast.Statement | ast.TCCall) -> set[str]:
    if isinstance(s, ast.TCCall):
        return {x.name for x in (*s.results, *s.args)}
    names = {s.tensor.name}.union(*(expr_names(i) for i in s.indices)) | expr_names(s.rhs)
    for w in s.where:
        names |= {w.var.name} | expr_names(w.lo) | expr_names(w.hi)
    return names


def def_names(d: ast.Def) -> tuple[frozenset, frozenset]:
    """Every identifier of `d`, and those naming its tensors and size variables."""
    globals_ = {p.name.name for p in d.params} | {x.name for p in d.params for x in p.type.dims}
    globals_ |= {r.name for r in d.returns}
    for s in d.statements:
        globals_ |= {r.name for r in s.results} if isinstance(s, ast.TCCall) else {s.tensor.name}
    names = set(globals_)
    for s in d.statements:
        names |= _statement_names(s)
    return frozenset(names), frozenset(globals_)
