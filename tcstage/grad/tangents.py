"""The forward-mode derivative of a TC function (its Jacobian-vector product), as TC source.

Each floating-point tensor W that depends on a floating-point input gets a tangent `t_W`, written
by one statement per statement of W, with the same left-hand side, operator and ranges:
`W(L) op= rhs` gets `t_W(L) op= sum over the differentiable reads X(e) of rhs of
d rhs / d X(e) * t_X(e)` (`derivative.partials` with a unit seed). Sums and assignments are
linear, so their tangents take the same operator; a `max=!` or `min=!` passes the tangent of the
selected element, split evenly between ties (as the gradient does); a product reduction is
refused. The tangent statement comes just before its forward statement, so both read the values
the forward statement reads (a statement that reads what it overwrites included), except a
min/max's, which compares against the value just computed and so comes after it. No reindexing is
needed: unlike the gradient, a tangent flows along the reads, in the forward function's order.
"""

from __future__ import annotations

import attrs

from tcstage.errors import TCError
from tcstage.grad import Jvp
from tcstage.grad import source as S
from tcstage.grad.derivative import differentiable, partials
from tcstage.grad.invariance import stabilisers
from tcstage.grad.reverse import _SPELLING, _Generator, _stored, _text, _tree_expr
from tcstage.grad.text import GradStatement, polish
from tcstage.halide import ranges as R
from tcstage.lang import checked as C
from tcstage.lang.types import INT32


def forward(source_or_program, name: str) -> Jvp:
    """The forward-mode derivative of TC function `name` (see `tcstage.grad.jvp`)."""
    from tcstage.program import PolymorphicFunction, Program, define
    program = source_or_program if isinstance(source_or_program, Program) \
        else define(source_or_program)
    fn = program[name]
    if isinstance(fn, PolymorphicFunction):
        raise TCError(f"the forward derivative of rank-polymorphic '{name}' is not generated",
                      notes=("differentiate an instance of one rank: tc.jvp on the source with "
                             "'...' written out",))
    return _Tangents(fn.written).run()


class _Tangents(_Generator):
    def __init__(self, fn: C.Function):
        super().__init__(fn)
        self.where = f"the forward derivative of '{fn.name}'"

    # (no versions here: the tangent statements interleave with the forward ones, so every
    # read sees the value the forward statement sees)
    def renamed(self, n: int, e: C.Expr) -> C.Expr:
        return e

    def dim_range(self, tensor: str, d: int):
        t = self.fn.tensors[tensor]
        if t.kind == "input":
            return super().dim_range(tensor, d)
        if not self.same_in_trials(lambda fr: (fr.tensors[tensor].mins[d],
                                                fr.tensors[tensor].extents[d])):
            raise TCError(f"{self.where}: the shape of '{tensor}' depends on the values of "
                          "scalar inputs; its tangent is not generated")
        b = self.trials[0].tensors[tensor]
        return _tree_expr(b.mins[d]), _tree_expr(R.simplify_tree(("add", b.mins[d],
                                                                b.extents[d])))

    def run(self) -> Jvp:
        fn = self.fn
        for st in fn.statements:
            if fn.tensors[st.tensor].inout:
                raise TCError(f"{self.where}: output '{st.tensor}' starts from the caller's "
                              "values; the derivative of an in/out output is not generated",
                              st.span, ("give it a first statement that defines it (such as "
                                        "'+=!')",))
        self.varied = self._varied()
        float_outputs = [o for o in fn.outputs if fn.tensors[o].type.is_float]
        tangent_of = {t.name: self.fresh(f"t_{t.name}") for t in fn.inputs if t.type.is_float}
        for name in fn.tensors:
            if name in self.varied and name not in tangent_of or name in float_outputs:
                tangent_of[name] = self.fresh(f"t_{name}")
        self.tangent_of = tangent_of
        if not any(o in self.varied for o in float_outputs):
            raise TCError(f"{self.where}: no floating-point output of '{fn.name}' depends "
                          "differentiably on a floating-point input")
        body: list[GradStatement] = []
        copies: dict[int, int] = {}  # body index of a forward statement's copy -> its index
        for n, st in enumerate(fn.statements):
            copy = self._copy(n)
            if st.tensor not in tangent_of:
                copies[len(body)] = n
                body.append(copy)
            elif st.reduction in ("min", "max"):
                copies[len(body)] = n
                body += [copy, *self._extremum_tangent(n)]
            else:
                copies[len(body) + 1] = n
                body += [self._tangent(n), copy]
        jvp_name = self.fresh(f"{fn.name}_jvp")

        def decl(t: C.Tensor, tname: str) -> str:
            spelled = _SPELLING.get(t.type, t.type.name)
            return f"{spelled}({', '.join(t.dims)}) {tname}" if t.rank else f"{spelled} {tname}"

        tangent_inputs = {t.name: tangent_of[t.name] for t in fn.inputs if t.type.is_float}
        params = [decl(t, t.name) for t in fn.inputs]
        params += [decl(t, tangent_inputs[t.name]) for t in fn.inputs if t.name in tangent_inputs]
        outputs = [*fn.outputs, *(tangent_of[o] for o in float_outputs)]
        head = (f"# The forward-mode derivative (Jacobian-vector product) of '{fn.name}', "
                f"generated by tcstage (tc.jvp).\n"
                f"def {jvp_name}({', '.join(params)}) -> ({', '.join(outputs)}) {{\n")
        def state_ranges(k: int, st: GradStatement) -> GradStatement:
            """A forward statement's copy whose read is padded, with where clauses for its
            indices (else the padding would change the ranges inferred for it)."""
            if k not in copies:
                return st
            stated = {w[0] for w in st.where}
            return attrs.evolve(st, where=st.where + tuple(
                w for w in self._box(copies[k]) if w[0] not in stated))
        text = polish(head, body, 0, state_ranges, self.where)
        inputs = tuple(t.name for t in fn.inputs) + tuple(tangent_inputs.values())
        return Jvp(text, jvp_name, fn.name, inputs, tangent_inputs,
                   {o: tangent_of[o] for o in float_outputs})

    def _varied(self) -> set[str]:
        """The tensors that depend differentiably on a floating-point input (to a fixed point:
        a tensor read before a later statement makes it varied is varied throughout)."""
        fn = self.fn
        varied: set[str] = set()
        constant = stabilisers(fn)  # (the max a softmax subtracts: see `invariance`)
        changed = True
        while changed:
            changed = False
            for st in fn.statements:
                if st.tensor in varied or st.tensor in constant or \
                        not fn.tensors[st.tensor].type.is_float:
                    continue
                if any(isinstance(leaf, C.ScalarParam) or leaf.tensor in varied
                       or fn.tensors[leaf.tensor].kind == "input"
                       for leaf in C.walk(st.rhs) if differentiable(leaf)):
                    varied.add(st.tensor)
                    changed = True
        return varied

    # -- statements --------------------------------------------------------------------------
    def _box(self, n: int) -> tuple:
        """Where clauses for statement n's variables (the tangent's right-hand side may read
        less than the forward's: a floor's derivative is zero); a variable whose range depends
        on scalar inputs gets none, and is inferred from the same reads as in the forward."""
        box = []
        for v in self.fn.statements[n].variables:
            try:
                box.append((v, *self.var_range(n, v)))
            except TCError:
                pass
        return tuple(box)

    def _copy(self, n: int) -> GradStatement:
        st = self.fn.statements[n]
        op = "=" if st.reduction is None else f"{st.reduction}={'!' if st.init else ''}"
        return GradStatement(st.tensor, st.indices, op, st.rhs,
                             tuple((w.var, w.lo, w.hi) for w in st.where), scatter=st.scatter)

    def _tangent_of_rhs(self, n: int) -> C.Expr:
        """sum over the differentiable reads of rhs of (d rhs / d read) * the read's tangent.
        The partials are taken with a stand-in for the tangent as their seed (they are linear
        in it), then each leaf's tangent replaces it: seeded with the constant 1, `X(n,c) / C`
        would give `1.0 / C`, a float32 literal's quotient in a double TC."""
        st, fn = self.fn.statements[n], self.fn
        padded = {e.read for e in C.walk(st.rhs) if isinstance(e, C.Padded)}
        plain = {e for e in C.walk(st.rhs) if isinstance(e, C.Read)} - padded
        seed = C.Read(self.fresh("seed"), (), fn.tensors[st.tensor].type)
        total = S.const(0)
        for leaf, partial in partials(st.rhs, seed, f"{self.where}, statement '{_text(st)}'"):
            if isinstance(leaf, C.ScalarParam):
                tangent = C.ScalarParam(self.tangent_of[leaf.name], leaf.type)
            elif leaf.tensor in self.tangent_of and (
                    leaf.tensor in self.varied or fn.tensors[leaf.tensor].kind == "input"):
                tangent = C.Read(self.tangent_of[leaf.tensor], leaf.args, leaf.type)
                if leaf in padded:
                    if leaf in plain:  # (one read both padded and not: its tangent is neither)
                        raise TCError(f"{self.where}: '{S.to_tc(leaf)}' is read both with and "
                                      "without '??' in one statement; write it one way",
                                      st.span)
                    tangent = C.Padded(tangent, S.const(0), leaf.type)
            else:
                continue
            total = S.add(total, S.rebuild(partial, lambda e: tangent if e == seed else None))
        return total

    def _tangent(self, n: int) -> GradStatement:
        st = self.fn.statements[n]
        if st.reduction == "*":
            raise TCError(f"{self.where}: the derivative of a product reduction ('*=!') is not "
                          "generated", st.span,
                          ("write the product as exp of a sum of logs where the factors are "
                           "positive",))
        op = "=" if st.reduction is None else f"+={'!' if st.init else ''}"
        return GradStatement(self.tangent_of[st.tensor], st.indices, op,
                             self._tangent_of_rhs(n), self._box(n), scatter=st.scatter)

    def _extremum_tangent(self, n: int) -> list[GradStatement]:
        """The tangent of a min/max reduction: that of the selected element, split between
        ties. A computed value may round differently here than in the forward statement
        (Halide contracts float arithmetic per Func), so such values are stored first and the
        stored ones compared."""
        st, fn = self.fn.statements[n], self.fn
        if not st.init or st.scatter or any(isinstance(r, C.Read) and r.tensor == st.tensor
                                            for r in C.walk(st.rhs)):
            raise TCError(f"{self.where}: the derivative of '{st.reduction}=' is generated for "
                          f"'{st.reduction}=!' over plain indices that does not read its own "
                          "tensor", st.span)
        box, type_ = self._box(n), fn.tensors[st.tensor].type
        lhs = tuple(S.var(i) for i in st.indices)
        out, candidate = [], st.rhs
        if not _stored(st.rhs):
            values = self.fresh(f"{st.tensor}_values")
            out.append(GradStatement(values, st.variables, "=", st.rhs, box))
            candidate = C.Read(values, tuple(S.var(v) for v in st.variables), type_)
            extremum = self.fresh(f"{st.tensor}_{st.reduction}")
            out.append(GradStatement(extremum, st.indices, f"{st.reduction}=!", candidate, box))
            value = C.Read(extremum, lhs, type_)
        else:
            value = C.Read(st.tensor, lhs, type_)
        ties = self.fresh(f"{st.tensor}_ties")
        hit = S.compare("==", candidate, value)
        out.append(GradStatement(ties, st.indices, "+=!", S.select(hit, S.const(1), S.const(0)),
                                 box))
        share = S.div(self._tangent_of_rhs(n), C.Read(ties, lhs, INT32))
        out.append(GradStatement(self.tangent_of[st.tensor], st.indices, "+=!",
                                 S.select(hit, share, S.const(0)), box))
        return out

