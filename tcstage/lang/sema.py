"""Semantic checks: from `ast.Def` to the typed `checked.Function`, or a `TCSemanticError`.

The rules (spec 000 and the paper, Section 3):
- Size variables, tensors and index variables share one namespace. An identifier not otherwise
  in scope is an index variable local to its statement.
- Index variables only on the right are reduction variables and need a reduction operator.
- Inputs are never written. A statement may read the tensor it writes only at the point it
  writes (`A(i,j) = fmax(A(i,j), 0)`), and only in a plain assignment: inside a reduction the
  result would depend on evaluation order.
- An output whose first statement reads its old values (`C(i,j) = b * C(i,j)`) or accumulates
  without '!' (`C(i) += ...`) is *in/out*: the caller supplies its initial values (`out=`), and
  its shape is that of the supplied tensor, written `C.0`, `C.1`, ... as TC's dimension syntax.
- Output types are inferred from the right-hand side of their first statement; later statements
  convert to that type.
"""

from __future__ import annotations

import difflib
import math
import operator

import attrs

from tcstage.errors import Span, TCSemanticError
from tcstage.lang import ast
from tcstage.lang import checked as C
from tcstage.lang import inline
from tcstage.lang.builtins import BUILTINS
from tcstage.lang.lexer import number_value
from tcstage.lang.types import (BOOL, FLOAT32, INT32, INT64, SCALAR_TYPES, UINT64, ScalarType,
                                cast_value, promote)

REDUCTIONS = ("+", "*", "min", "max")

# Halide's CPU compile time doubles with each tensor read nested in a subscript (`A(A(A(i)))`),
# so that depth is bounded far below the expression depth.
MAX_READ_NESTING = 8


def check_module(module: ast.Module) -> dict[str, C.Function]:
    defs: dict[str, ast.Def] = {}
    for d in module.defs:
        if d.name.name in defs:
            raise TCSemanticError(f"redefinition of TC function '{d.name.name}'", d.name.span)
        defs[d.name.name] = d
    callees = _Callees(defs)
    return {name: callees.check(d).function for name, d in defs.items()}


class _Callees:
    """The functions of one source, checked once each, callees before their callers (a call
    may name a function defined before or after it); a cycle of calls is an error."""

    def __init__(self, defs: dict[str, ast.Def]):
        self.defs = defs
        self.done: dict[str, inline.Callee] = {}
        self.active: list[str] = []  # the functions being checked, callers first

    def check(self, d: ast.Def) -> inline.Callee:
        name = d.name.name
        if name not in self.done:
            self.active.append(name)
            try:
                self.done[name] = _check(d, self)
            finally:
                self.active.pop()
        return self.done[name]

    def resolve(self, call: ast.TCCall) -> inline.Callee:
        name = call.callee.name
        if name in self.active:
            cycle = " -> ".join([*self.active[self.active.index(name):], name])
            raise TCSemanticError(f"recursive call of TC function '{name}' ({cycle})",
                                  call.callee.span,
                                  ("TC functions are inlined into their callers, so no function "
                                   "may call itself, directly or through others",))
        d = self.defs.get(name)
        if d is None:
            raise TCSemanticError(f"unknown TC function '{name}'{_suggest(name, self.defs)}",
                                  call.callee.span,
                                  ("a call names a 'def' of the same source",))
        return self.check(d)


def _suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def check_def(d: ast.Def) -> C.Function:
    """The checked function of a lone definition (calls need `check_module`)."""
    return _check(d, _Callees({d.name.name: d})).function


def _check(d: ast.Def, callees: _Callees) -> inline.Callee:
    tensors: dict[str, C.Tensor] = {}
    size_vars: dict[str, tuple[str, int]] = {}
    inputs = []
    for p in d.params:
        name = p.name.name
        scalar = SCALAR_TYPES.get(p.type.scalar.name)
        if scalar is None:
            raise TCSemanticError(
                f"unknown type '{p.type.scalar.name}'{_suggest(p.type.scalar.name, SCALAR_TYPES)}",
                p.type.scalar.span, ("known types: " + ", ".join(sorted(SCALAR_TYPES)),))
        if name in size_vars:
            owner, k = size_vars[name]
            raise TCSemanticError(f"tensor '{name}' has the name of a size variable (dimension {k} "
                                  f"of '{owner}'); size variables and tensors share one namespace",
                                  p.name.span, ("rename the tensor or the size variable",))
        if name in tensors:
            raise TCSemanticError(f"'{name}' is declared twice in the signature of '{d.name.name}'",
                                  p.name.span)
        for k, dim in enumerate(p.type.dims):
            if dim.name.isdigit():  # a constant size
                if int(dim.name) >= 2**31:
                    raise TCSemanticError(f"constant size {dim.name} does not fit in 32 bits; "
                                          "sizes and indices are 32-bit integers", dim.span)
                continue
            if dim.name in tensors:
                raise TCSemanticError(f"size variable '{dim.name}' has the name of tensor "
                                      f"'{dim.name}'; size variables and tensors share one namespace",
                                      dim.span)
            size_vars.setdefault(dim.name, (name, k))
        if name in size_vars:
            raise TCSemanticError(f"tensor '{name}' has the name of a size variable", p.name.span,
                                  ("size variables and tensors share one namespace",))
        t = C.Tensor(name, "input", scalar, tuple(x.name for x in p.type.dims), span=p.span)
        tensors[name] = t
        inputs.append(t)

    outputs = []
    for r in d.returns:
        if r.name in tensors and tensors[r.name].kind == "input":
            raise TCSemanticError(f"output '{r.name}' is also an input; TC never writes its inputs",
                                  r.span, ("return a new tensor, e.g. 'B(i) = A(i)'",))
        if r.name in size_vars:
            raise TCSemanticError(f"output '{r.name}' has the name of a size variable", r.span)
        if r.name in outputs:
            raise TCSemanticError(f"output '{r.name}' is listed twice", r.span)
        outputs.append(r.name)

    # A tensor first set to a bare literal (`C(i) = 0`) takes its type from the first later
    # statement with a typed right-hand side (`C(i) += A(i,k) * x(k)` makes C float): check once
    # to learn those types, then again with them.
    hints: dict[str, ScalarType] = {}
    names, globals_ = inline.def_names(d)
    while True:
        defined, statements, weak_origin, learned = dict(tensors), [], set(), {}
        # learned from a read of a provisional type: (the type, the provisional tensors read)
        tentative: dict[str, tuple[ScalarType, frozenset]] = {}
        derived: set[str] = set()  # typed by a first statement reading a provisional type
        expanded, inlined, used, deferred = [], {}, set(), []
        for written in d.statements:
            call = _as_call(written, defined, size_vars, callees)
            if call is None:
                parts = (written,)
            else:  # replaced by the callee's statements, checked here like the caller's own
                callee = callees.resolve(call)
                inlined[call.callee.name] = callee.function
                provisional = frozenset(weak_origin - hints.keys())
                scope = inline.Scope(d.name.name, defined, size_vars, names, globals_, used,
                                     provisional, deferred)
                parts = inline.inline(call, callee, scope)
            for s in parts:
                checker = _StatementChecker(defined, size_vars, outputs, s, hints,
                                            frozenset(callees.defs))
                stmt, tensor = checker.check()
                # (a right-hand side reading a tensor whose own type is not learned yet,
                # `d_I(v, v) += d_T(k, v)` after `d_T(y, x) = 0`, or one typed from such a
                # tensor, has that type for now: it teaches a type only where nothing else
                # does, else d_I stayed int32 for good and truncated its gradients)
                pending = (weak_origin - hints.keys()) | derived
                reads = {n.tensor for n in C.walk(stmt.rhs) if isinstance(n, C.Read)}
                if checker.weak and stmt.first_definition:
                    weak_origin.add(tensor.name)
                elif stmt.first_definition and reads & pending:
                    derived.add(tensor.name)
                elif not checker.weak and tensor.name in weak_origin and tensor.name not in hints:
                    if reads & pending:
                        tentative.setdefault(tensor.name, (checker.rhs_type,
                                                           frozenset(reads & pending)))
                    else:
                        learned.setdefault(tensor.name, checker.rhs_type)
                defined[tensor.name] = tensor
                statements.append(stmt)
                expanded.append(s)
        if not learned:
            # (one tensor at a time along a chain: `B(k) += T(k)` waits while T's own type is
            # tentative too, else B took T's provisional int32 for good and truncated W's
            # doubles that T sums, gradient fuzz seed 973668; a cycle takes them all)
            undecided = {t for t in tentative if t not in hints}
            learned = {t: ty for t, (ty, via) in tentative.items()
                       if t in undecided and not via & (undecided - {t})} or \
                {t: ty for t, (ty, _) in tentative.items() if t in undecided}
        if not learned:
            if deferred:  # a call's argument whose type no later statement changed
                raise deferred[0]
            break
        hints.update(learned)
    tensors = defined

    for r in d.returns:
        if r.name not in tensors:
            raise TCSemanticError(f"output '{r.name}' is never defined by a statement", r.span)
    fn = C.Function(d.name.name, tuple(inputs), tuple(outputs), tensors, size_vars,
                    tuple(statements), span=d.span, callees=tuple(inlined.values()))
    return inline.Callee(fn, tuple(expanded))


def _as_call(s: ast.Statement | ast.TCCall, tensors, size_vars, callees: _Callees
             ) -> ast.TCCall | None:
    """The call a statement makes: a `TCCall`, or `a = f(x, y)` where `f` is a TC function of
    the source and no tensor, size variable or builtin of that name hides it."""
    if isinstance(s, ast.TCCall):
        return s
    rhs = s.rhs
    if not isinstance(rhs, ast.Apply):
        return None
    name = rhs.name.name
    if name not in callees.defs or name in tensors or name in size_vars or name in BUILTINS:
        return None
    if s.indices or s.op != "=" or s.where or s.equivalent is not None:
        raise TCSemanticError(
            f"'{name}' is a TC function: a call defines whole tensors, with '=' and no index "
            "list, 'where' or '<=>'", s.span, (f"write '({s.tensor.name}) = {name}(...)'",))
    for a in rhs.args:
        if not isinstance(a, ast.Ident):
            raise TCSemanticError(
                "an argument of a TC function call is the name of a tensor or scalar, "
                f"not the expression '{a.span.text()}'", a.span,
                ("compute it into a tensor first, then pass that tensor",))
    return ast.TCCall((s.tensor,), rhs.name, tuple(rhs.args), s.span)


class _StatementChecker:
    """Checks one statement against the tensors defined so far."""

    def __init__(self, tensors, size_vars, outputs, s: ast.Statement, hints,
                 functions: frozenset = frozenset()):
        self.tensors, self.size_vars, self.outputs, self.s = tensors, size_vars, outputs, s
        self.hints = hints
        self.functions = functions  # the TC functions of the source
        self.var_spans: dict[str, Span] = {}
        self.self_reads: list[Span] = []
        self.read_nesting = 0  # tensor reads around the subscript being checked

    def error(self, message: str, span: Span, *notes: str) -> TCSemanticError:
        return TCSemanticError(message, span, notes)

    def check(self) -> tuple[C.Statement, C.Tensor]:
        s = self.s
        name = s.tensor.name
        existing = self.tensors.get(name)
        if existing is not None and existing.kind == "input":
            raise self.error(f"cannot write input '{name}'; TC never writes its inputs", s.tensor.span,
                             "write the result into a new tensor and return it")
        if name in self.size_vars:
            raise self.error(f"cannot write size variable '{name}'", s.tensor.span)
        rank = len(s.indices)
        if existing is not None and existing.rank != rank:
            raise self.error(f"'{name}' has rank {existing.rank} but is written with {rank} "
                             f"ind{'ex' if rank == 1 else 'ices'}", s.tensor.span)
        plain = all(isinstance(i, ast.Ident) and not _is_scalar_input(self.tensors.get(i.name))
                    for i in s.indices)  # (`O(s) += ...` with s a scalar input: a scatter)
        repeated = plain and len({i.name for i in s.indices}) < rank
        if not plain or repeated and existing is not None and s.reduction is not None \
                and not s.init:
            return self.check_scatter(existing)
        self.lhs = []
        for idx in s.indices:
            if idx.name in self.tensors or idx.name in self.size_vars or idx.name == name:
                what = "size variable" if idx.name in self.size_vars else "tensor"
                raise self.error(f"left-hand index '{idx.name}' is a {what}, not an index variable",
                                 idx.span, "use a fresh name such as 'i'")
            if idx.name in self.lhs:
                raise self.error(f"index variable '{idx.name}' appears twice on the left-hand side",
                                 idx.span, "TC writes each element at most once per statement point; "
                                 "index the diagonal on the right-hand side instead")
            self.lhs.append(idx.name)
            self.var_spans.setdefault(idx.name, idx.span)
        self.rank = rank
        rhs, weak = self.expr(s.rhs)
        self.weak, self.rhs_type = weak, rhs.type
        where = self.where_clause()
        rhs_vars = [v for v in self.var_spans if v not in self.lhs]
        reduction = s.reduction
        if reduction is None and rhs_vars:
            v = rhs_vars[0]
            raise self.error(
                f"index variable '{v}' appears only on the right-hand side, so the statement reduces "
                "over it, but '=' is not a reduction", self.var_spans[v],
                f"use a reduction operator such as '+=!' (or put '{v}' on the left-hand side)")
        if self.self_reads and rhs_vars:
            raise self.error(
                f"'{name}' is read inside a reduction into '{name}'; the result would depend on the "
                "order of evaluation", self.self_reads[0],
                f"compute the reduction into a new tensor, then combine it with '{name}'")
        if self.self_reads and s.init:
            # The spec resets the tensor before evaluating the right-hand side, so such a read
            # could only ever see the identity: almost surely not what was meant.
            raise self.error(
                f"'{name}' is read in a statement that first resets it with '{s.op}!'; the read "
                "would see only the reduction's identity", self.self_reads[0],
                f"use '{s.op}' to accumulate into the current values of '{name}'")

        inout = False
        if existing is None:
            accumulates = reduction is not None and not s.init
            if self.self_reads or accumulates:
                if name not in self.outputs:
                    why = "reads its own values" if self.self_reads else f"accumulates with '{s.op}'"
                    raise self.error(
                        f"temporary '{name}' {why} before any statement has defined it",
                        self.self_reads[0] if self.self_reads else s.tensor.span,
                        f"initialise it first, or use '{s.op}!' to start from the identity")
                inout = True
            ttype = self.hints.get(name, rhs.type) if weak else rhs.type
            if ttype == _SELF_WEAK:
                ttype = FLOAT32
            if reduction in ("+", "*") and ttype == BOOL:
                ttype = INT32
            dims = tuple(f"{name}.{k}" for k in range(rank)) if inout else ("",) * rank
            tensor = C.Tensor(name, "output" if name in self.outputs else "temp", ttype, dims,
                              inout=inout, span=s.tensor.span)
        else:
            tensor = existing
        rhs = _convert(_retype_self(rhs, name, tensor.type), tensor.type)
        stmt = C.Statement(name, tuple(self.lhs), tuple(rhs_vars), reduction, s.init, rhs, where,
                           first_definition=existing is None, span=s.span, var_spans=self.var_spans,
                           text=s.text)
        return stmt, tensor

    def check_scatter(self, existing: C.Tensor | None) -> tuple[C.Statement, C.Tensor]:
        """`T(I(i), j) += ...`: a statement writing at computed subscripts. Several points may
        write one element, so it must accumulate (+=, *=, min=, max=, which do not depend on
        the order) into a tensor an earlier statement defined (which gives its shape)."""
        s = self.s
        name = s.tensor.name
        lhs = f"{name}({', '.join(_span_of(i).text() for i in s.indices)})"
        computed = [i for i in s.indices if not isinstance(i, ast.Ident)]
        span = _span_of(computed[0]) if computed else s.tensor.span.to(_span_of(s.indices[-1]))
        if existing is None:
            raise self.error(
                f"'{lhs}' writes at computed subscripts, which only an update of a tensor "
                "defined by an earlier statement may do (a tensor's shape comes from a statement "
                "writing plain index variables)", span,
                f"define it first, such as '{name}({', '.join('ijklmn'[:len(s.indices)])}) = 0 "
                "where ...', then accumulate into it with '+='")
        if s.reduction is None or s.init:
            why = ("with '=', two points writing one element would leave either value"
                   if s.reduction is None else
                   f"'{s.op}!' would start from the identity at elements no statement point names")
            raise self.error(f"'{lhs}' writes at computed subscripts, so it must accumulate into "
                             f"the values {name} has: {why}", span,
                             "use '+=', '*=', 'min=' or 'max=' (without '!')")
        self.lhs = None  # no plain written point: any self-read is refused below
        self.rank = len(s.indices)
        args = []
        for idx in s.indices:
            e, _ = self.expr(idx)
            if not e.type.is_int:
                raise self.error(f"a subscript must be an integer, not {e.type}", _span_of(idx))
            args.append(_index(e, "subscripts"))
        rhs, weak = self.expr(s.rhs)
        self.weak, self.rhs_type = weak, rhs.type
        where = self.where_clause()
        if self.self_reads:
            raise self.error(f"'{name}' is read by a statement that writes it at computed "
                             "subscripts; the result would depend on the order of evaluation",
                             self.self_reads[0], "compute the values into a new tensor first")
        rhs = _convert(_retype_self(rhs, name, existing.type), existing.type)
        stmt = C.Statement(name, (), tuple(self.var_spans), s.reduction, False, rhs, where,
                           first_definition=False, span=s.span, var_spans=self.var_spans,
                           text=s.text, scatter=tuple(args))
        return stmt, existing

    def where_clause(self) -> tuple[C.RangeConstraint, ...]:
        s = self.s
        where = tuple(self.range_constraint(w) for w in s.where)
        seen = set()
        for w in s.where:
            if w.var.name in seen:
                raise self.error(f"'{w.var.name}' is constrained twice in the where clause", w.var.span)
            seen.add(w.var.name)
        unused_where = [w for w in s.where if w.var.name not in self.var_spans]
        if unused_where:
            w = unused_where[0]
            raise self.error(f"the where clause constrains '{w.var.name}', which the statement "
                             "does not use", w.var.span)
        return where

    # -- where clauses: size expressions -------------------------------------------------------
    def range_constraint(self, w: ast.RangeConstraint) -> C.RangeConstraint:
        v = w.var.name
        if v in self.tensors or v in self.size_vars:
            raise self.error(f"the where clause constrains '{v}', which is not an index variable",
                             w.var.span)
        lo = self.size_expr(w.lo)
        hi = self.size_expr(w.hi)
        if isinstance(lo, C.Const) and isinstance(hi, C.Const) and hi.value < lo.value:
            raise self.error(f"the where range of '{v}' ends before it starts: "
                             f"{lo.value}:{hi.value}", w.span,
                             f"an empty range has equal bounds, such as '{v} in "
                             f"{lo.value}:{lo.value}'")
        return C.RangeConstraint(v, lo, hi, span=w.span)

    def size_expr(self, e: ast.Expr) -> C.Expr:
        """A bound in a where clause: integers, size variables, scalar inputs and `T.n` only."""
        for node in ast.walk(e):
            if isinstance(node, ast.Apply) and node.name.name not in BUILTINS:
                raise self.error("a range bound may not read a tensor; only sizes, constants and "
                                 "scalar inputs", node.span)
            t = self.tensors.get(node.name) if isinstance(node, ast.Ident) else None
            if t is not None and t.kind != "input":
                raise self.error(f"a range bound may not read tensor '{node.name}' (its values "
                                 "are known only when it runs); only sizes, constants and "
                                 "scalar inputs", node.span)
            if isinstance(node, ast.Ident) and node.name not in self.size_vars \
                    and node.name not in self.tensors:
                raise self.error(f"range bound uses '{node.name}', which is neither a size variable "
                                 "nor a scalar input", node.span)
        saved = dict(self.var_spans)
        out, _ = self.expr(e)
        self.var_spans = saved
        if not out.type.is_int:
            raise self.error(f"a range bound must be an integer, not {out.type}", e.span)
        return _index(out, "range bounds")

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, e: ast.Expr) -> tuple[C.Expr, bool]:
        """The typed expression and whether it is weakly typed (a literal)."""
        if isinstance(e, ast.Number):
            return _number(e), True
        if isinstance(e, ast.Ident):
            return self.ident(e), False
        if isinstance(e, ast.DimRef):
            return self.dimref(e), False
        if isinstance(e, ast.Apply):
            return self.apply(e), False
        if isinstance(e, ast.Unary):
            x, weak = self.expr(e.operand)
            if e.op == "!":
                return C.Unary("!", _to_bool(x), BOOL, span=e.span), weak
            if x.type == BOOL:
                x = _convert(x, INT32)
            if isinstance(x, C.Const):  # a negative literal is one constant, typed by its value
                return _literal(-x.value, e.span), weak
            return C.Unary("-", x, x.type, span=e.span), weak
        if isinstance(e, ast.Binary):
            return self.binary(e)
        if isinstance(e, ast.Padded):
            return self.padded(e), False
        if isinstance(e, ast.Ternary):
            cond, _ = self.expr(e.cond)
            (a, b), weak = self.unify(*self.expr(e.then), *self.expr(e.other))
            return C.Select(_to_bool(cond), a, b, a.type, span=e.span), weak
        raise AssertionError(e)

    def padded(self, e: ast.Padded) -> C.Expr:
        """`T(args) ?? value`: the read of a tensor whose shape is known before this statement
        (an input or an earlier-defined tensor), with value converted to the tensor's type."""
        r = e.read
        name = r.name.name if isinstance(r, ast.Apply) else None
        if name is None or name not in self.tensors and name != self.s.tensor.name:
            raise self.error("'??' gives the value of a tensor read outside the tensor, so it "
                             f"must follow a tensor read, not '{r.span.text()}'", e.span,
                             "write it as in 'I(h + kh - 1) ?? 0'")
        if name == self.s.tensor.name:
            raise self.error(f"'??' on '{name}', the tensor this statement writes: its shape is "
                             "what the statement infers, so no read of it is outside it",
                             e.span, "read an input or a tensor defined by an earlier statement")
        if not r.args:
            raise self.error(f"'??' on the scalar '{name}': a scalar has no outside", e.span)
        read = self.apply(r)
        value, weak = self.expr(e.value)
        if not weak and value.type.is_float and not read.type.is_float:
            raise self.error(f"the value after '??' is {value.type}, but '{name}' holds "
                             f"{read.type}", _span_of(e.value),
                             f"convert it explicitly, or use a value of type {read.type}")
        if isinstance(value, C.Const) and isinstance(value.value, float) \
                and not read.type.is_float and not value.value.is_integer():
            raise self.error(f"the value after '??' is {value.value}, but '{name}' holds "
                             f"{read.type}", _span_of(e.value))
        return C.Padded(read, _convert(value, read.type), read.type, span=e.span)

    def ident(self, e: ast.Ident) -> C.Expr:
        n = e.name
        if n in self.size_vars:
            return C.SizeVar(n, span=e.span)
        t = self.tensors.get(n)
        if t is not None or n == self.s.tensor.name:
            if (t.rank if t is not None else self.rank) != 0:
                rank = t.rank if t is not None else self.rank
                raise self.error(f"tensor '{n}' has rank {rank}; read it with {rank} subscript"
                                 f"{'s' if rank > 1 else ''}, as in {n}({', '.join('ijkl'[:rank])})"
                                 if rank <= 4 else f"tensor '{n}' has rank {rank}", e.span)
            if t is not None and t.kind == "input":
                return C.ScalarParam(n, t.type, span=e.span)
            return self.read(e.name, (), e.span)
        if n in BUILTINS:
            raise self.error(f"'{n}' is a builtin function; call it as {n}(...)", e.span)
        self.var_spans.setdefault(n, e.span)
        return C.IndexVar(n, span=e.span)

    def dimref(self, e: ast.DimRef) -> C.Expr:
        t = self.tensors.get(e.tensor.name)
        if t is None:
            raise self.error(f"unknown tensor '{e.tensor.name}' in '{e.span.text()}'"
                             f"{_suggest(e.tensor.name, self.tensors)}", e.tensor.span)
        if not 0 <= e.dim < t.rank:
            raise self.error(f"'{t.name}' has rank {t.rank}, so it has no dimension {e.dim}",
                             e.span, f"dimensions count from 0 to {t.rank - 1}" if t.rank else
                             f"'{t.name}' is a scalar")
        if t.kind == "input":
            return C.SizeVar(t.dims[e.dim], span=e.span)
        return C.DimOf(t.name, e.dim, span=e.span)

    def apply(self, e: ast.Apply) -> C.Expr:
        n = e.name.name
        if n in self.tensors or n == self.s.tensor.name:
            rank = self.tensors[n].rank if n in self.tensors else self.rank
            # A tensor hides a builtin function of its name within the function.
            hidden = (f"'{n}' names a tensor here, which hides the builtin function '{n}'",) \
                if n in BUILTINS else ()
            if len(e.args) != rank:
                raise self.error(f"tensor '{n}' has rank {rank} but is read with {len(e.args)} "
                                 f"subscript{'s' if len(e.args) != 1 else ''}", e.span, *hidden)
            if self.read_nesting == MAX_READ_NESTING:
                raise self.error(
                    f"tensor reads nested more than {MAX_READ_NESTING} deep in subscripts",
                    e.span, "read the inner subscripts into a temporary tensor first, "
                    "as in 'T(i) = B(C(i))' and then 'A(T(i))'")
            t = self.tensors.get(n)
            if not e.args and t is not None and t.kind == "input":
                # `s()`: a rank-0 input read with its empty subscript list (as a
                # rank-polymorphic `S(...)` becomes at rank 0) is the scalar `s`
                return C.ScalarParam(n, t.type, span=e.span)
            args = []
            self.read_nesting += 1
            for a in e.args:
                x, _ = self.expr(a)
                if not x.type.is_int:
                    raise self.error(f"a subscript must be an integer, not {x.type}", a.span,
                                     *hidden)
                args.append(_index(x, "subscripts"))
            self.read_nesting -= 1
            return self.read(n, tuple(args), e.span)
        cast_to = SCALAR_TYPES.get(n)
        if cast_to is not None and n not in BUILTINS:  # a cast: `float(x)`, `int32(B(i))`, ...
            if len(e.args) != 1:
                raise self.error(f"the cast '{n}(...)' takes one argument, not {len(e.args)}",
                                 e.span, f"'{n}(x)' converts x to {cast_to}")
            return _cast(self.expr(e.args[0])[0], cast_to, e.span)
        b = BUILTINS.get(n)
        if b is None and n in self.functions:
            raise self.error(f"'{n}' is a TC function; a call is a statement of its own, not "
                             "part of an expression", e.span,
                             f"call it first, as in '(T) = {n}(...)', then read T")
        if b is None:
            raise self.error(f"unknown tensor or function '{n}'"
                             f"{_suggest(n, [*self.tensors, *BUILTINS])}", e.name.span)
        if len(e.args) != b.arity:
            raise self.error(f"'{n}' takes {b.arity} argument{'s' if b.arity > 1 else ''}, "
                             f"not {len(e.args)}", e.span)
        if b.arity == 2:
            (x, y), _ = self.unify(*self.expr(e.args[0]), *self.expr(e.args[1]))
            args = [x, y]
        else:
            args = [self.expr(e.args[0])[0]]
        if b.kind == "float":
            ftype = FLOAT32 if b.force_float32 or not args[0].type.is_float else args[0].type
            args = [_convert(a, ftype) for a in args]
        elif args[0].type == BOOL:
            args = [_convert(a, INT32) for a in args]
        return C.Call(b.canonical, tuple(args), args[0].type, span=e.span)

    def read(self, name: str, args: tuple, span: Span) -> C.Expr:
        t = self.tensors.get(name)
        if name == self.s.tensor.name:
            if self.lhs is not None and args and tuple(a.name if isinstance(a, C.IndexVar) else None for a in args) \
                    != tuple(self.lhs):
                written = ", ".join(self.lhs)
                raise self.error(
                    f"'{name}' is read at a different point than it is written ({name}({written})); "
                    "an in-place statement may only read the element it writes", span,
                    "write the result into a new tensor instead")
            self.self_reads.append(span)
            if t is None:  # the tensor's type is what this statement infers: weak for now
                return C.Read(name, args, _SELF_WEAK, span=span)
        return C.Read(name, args, t.type, span=span)

    def binary(self, e: ast.Binary) -> tuple[C.Expr, bool]:
        a, wa = self.expr(e.lhs)
        b, wb = self.expr(e.rhs)
        folded = _fold(e, a, b)
        if folded is not None:
            return folded, True
        (a, b), weak = self.unify(a, wa, b, wb)
        op = e.op
        if op in ("&&", "||"):
            return C.Binary(op, _to_bool(a), _to_bool(b), BOOL, span=e.span), weak
        if op in ("==", "!=", "<", "<=", ">", ">="):
            return C.Binary(op, a, b, BOOL, span=e.span), weak
        if op == "%" and a.type.is_float:
            raise self.error(f"'%' needs integer operands, not {a.type}", e.span,
                             "use fmod(a, b) for floating-point remainders")
        if a.type == BOOL:
            a, b = _convert(a, INT32), _convert(b, INT32)
        return C.Binary(op, a, b, a.type, span=e.span), weak

    def unify(self, a: C.Expr, wa: bool, b: C.Expr, wb: bool
              ) -> tuple[tuple[C.Expr, C.Expr], bool]:
        """Both operands (checked, and whether weakly typed) converted to their common type:
        literals adapt to the other side. (The callers check the operands themselves, so that
        each level of an expression costs few Python frames.)"""
        if a.type == _SELF_WEAK or b.type == _SELF_WEAK:
            t = b.type if a.type == _SELF_WEAK else a.type
            if t == _SELF_WEAK:
                t = FLOAT32
            return (_retype_weak(a, t), _retype_weak(b, t)), False
        if wa and wb:
            t = promote(a.type, b.type)
        elif wa:
            t = _beside(a, b.type)
        elif wb:
            t = _beside(b, a.type)
        else:
            t = promote(a.type, b.type)
        return (_convert(a, t), _convert(b, t)), wa and wb


# The provisional type of a read of the tensor being defined by its first statement.
_SELF_WEAK = ScalarType("weak", 0)


def _retype_weak(e: C.Expr, t: ScalarType) -> C.Expr:
    if isinstance(e, C.Read) and e.type == _SELF_WEAK:
        return C.Read(e.tensor, e.args, t, span=e.span)
    return _convert(e, t)


def _retype_self(e: C.Expr, name: str, t: ScalarType) -> C.Expr:
    """Gives reads of the tensor being defined their final type."""
    if isinstance(e, C.Read) and e.tensor == name and e.type == _SELF_WEAK:
        return attrs.evolve(e, type=t)
    kids = C.children(e)
    if not kids:
        return e
    new = []
    for k in kids:  # a loop, not a generator: one Python frame per level of e
        new.append(_retype_self(k, name, t))
    return C.with_children(e, tuple(new))


def _number(n: ast.Number) -> C.Const:
    value = number_value(n.text)
    if isinstance(value, float):
        if math.isinf(value):
            raise TCSemanticError(f"floating-point literal '{n.text}' is out of range (it is "
                                  "larger than the largest double)", n.span)
        return C.Const(value, FLOAT32, span=n.span)
    return _literal(value, n.span)


def _literal(value: int | float, span: Span) -> C.Const:
    """A constant typed by its value, as C types a literal: float32 (weak, like every TC
    literal), else the first of int32, int64, uint64 that holds it."""
    if isinstance(value, float):
        return C.Const(value, FLOAT32, span=span)
    for t in (INT32, INT64, UINT64):
        if _fits(value, t):
            return C.Const(value, t, span=span)
    raise TCSemanticError(f"integer literal {value} does not fit in 64 bits", span)


def _fits(value, t: ScalarType) -> bool:
    """Whether the constant `value` is exactly representable in type t."""
    if isinstance(value, float) or t.is_float:
        return True
    if t.kind == "bool":
        return value in (0, 1)
    low, high = (-(1 << t.bits - 1), (1 << t.bits - 1) - 1) if t.kind == "int" else \
        (0, (1 << t.bits) - 1)
    return low <= value <= high


def _beside(literal: C.Expr, t: ScalarType) -> ScalarType:
    """The type of an operation between a literal and an operand of type t: t, as in Halide
    (`X(i) + 1` stays uint8 for uint8 X), unless the literal's value does not fit in t; then
    C's usual arithmetic conversions (`A(i) + 4294967297` is int64 for int32 A)."""
    if literal.type.is_float and not t.is_float:
        return FLOAT32
    if not isinstance(literal, C.Const) or _fits(literal.value, t):
        return t
    wider = promote(literal.type, t)
    return wider if _fits(literal.value, wider) else literal.type


# Integer arithmetic on two literals is computed exactly here, and the result typed by its
# value (Halide would fold it in the literals' 32-bit type, and overflow). `/` and `%` are
# Halide's Euclidean ones: the remainder is never negative.
_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul,
         "/": lambda a, b: (a - a % abs(b)) // b, "%": lambda a, b: a % abs(b)}


def _fold(e: ast.Binary, a: C.Expr, b: C.Expr) -> C.Const | None:
    ints = [isinstance(x, C.Const) and x.type.is_int and x.type != BOOL for x in (a, b)]
    if not all(ints) or e.op not in _FOLD or (e.op in ("/", "%") and b.value == 0):
        return None  # (Halide defines x / 0 and x % 0 as 0)
    return _literal(_FOLD[e.op](a.value, b.value), e.span)


def _is_scalar_input(t: C.Tensor | None) -> bool:
    return t is not None and t.kind == "input" and t.rank == 0


def _index(e: C.Expr, what: str) -> C.Expr:
    """A subscript or range bound as Halide's 32-bit index: a literal that does not fit is an
    error, never a silent wrap."""
    for node in C.walk(e):
        if isinstance(node, C.Const) and not _fits(node.value, INT32):
            raise TCSemanticError(f"integer literal {node.value} does not fit in 32 bits; "
                                  f"{what} are 32-bit integers", node.span)
    return _convert(e, INT32)


def _convert(e: C.Expr, t: ScalarType) -> C.Expr:
    if e.type == t:
        return e
    if isinstance(e, C.Const):
        if t.kind in ("int", "uint") and isinstance(e.value, int) and not _fits(e.value, t):
            raise TCSemanticError(f"integer literal {e.value} does not fit in {t}", e.span)
        value = bool(e.value) if t == BOOL else float(e.value) if t.is_float else int(e.value)
        return C.Const(value, t, span=e.span)
    return C.Cast(t, e, span=e.span)


def _cast(e: C.Expr, t: ScalarType, span: Span) -> C.Expr:
    """An explicit cast of e to t, strongly typed (`float(0)` is a float32, not a literal that
    adapts). A constant is converted here, as the cast would at run time."""
    if isinstance(e, C.Const):
        return C.Const(cast_value(e.value, t), t, span=span)
    if t == BOOL:
        return _to_bool(e)
    return e if e.type == t else C.Cast(t, e, span=span)


def _to_bool(e: C.Expr) -> C.Expr:
    if e.type == BOOL:
        return e
    zero = C.Const(0.0 if e.type.is_float else 0, e.type)
    return C.Binary("!=", e, zero, BOOL, span=e.span)


def _span_of(e: ast.Expr) -> Span:
    return e.span
