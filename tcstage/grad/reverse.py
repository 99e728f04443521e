"""The backward TC of a TC function: reverse-mode differentiation, statement by statement.

Each forward statement `W(L) op= rhs(v)` over its iteration box D contributes, for every
differentiable read X(e(v)) in rhs, the update `d_X(e(v)) += d_W(L) * d rhs / d X(e(v))` for all
v in D (`derivative.partials`). TC writes only plain indices on the left, so the update is
*reindexed*: each subscript of the read becomes a fresh index u, and one variable of the
subscript is solved for u (`h + kh = u` gives `h = u - kh`; a stride gives a division with a
divisibility guard), with a guard keeping that variable within its forward range. A read whose
subscripts cannot be solved (a table index `I(i,k)`, a constant, a repeated index) gets a
scatter statement at its own subscripts, `d_LUT(I(i,k), j) += ...`, visiting each forward
point once; the gradient reaching a forward scatter is read at its subscripts (a gather).

Tensors are taken in versions: a statement that overwrites (`=` after the first definition, or
`+=!` again) or reads its own tensor starts a new version, whose gradient passes to the previous
version where it did not overwrite. Temporaries and intermediate versions are recomputed in the
backward function (only outputs are passed to it). Ranges: every index gets the range it had in
the forward function, from range inference (or from a tensor's shape in the backward signature),
so the backward visits exactly the forward points, borders included.
"""

from __future__ import annotations

import attrs

from tcstage.errors import TCError, TCRangeError
from tcstage.grad import Backward
from tcstage.grad import source as S
from tcstage.grad.derivative import differentiable, partials
from tcstage.grad.invariance import stabilisers
from tcstage.grad.normalized import Normalization, normalizations
from tcstage.grad.text import GradStatement, equal_trees, polish
from tcstage.halide import ranges as R
from tcstage.lang import checked as C
from tcstage.lang.builtins import BUILTINS
from tcstage.lang.types import FLOAT16, FLOAT32, FLOAT64, INT32

_SPELLING = {FLOAT32: "float", FLOAT64: "double", FLOAT16: "half", INT32: "int"}
_INDEX_NAMES = ("y", "x", "z", "u", "v", "w", "t", "s", "r", "q", "p")


# Values for scalar inputs at which `_forward_ranges` infers the forward's ranges (the first
# is the one the backward's text is written from)
TRIAL_SCALARS = (2, 3, 1, 5)


@attrs.define(eq=False)
class _Version:
    """One value of a tensor between overwrites."""

    tensor: str
    name: str  # its name in the backward function
    statements: list  # indices of the forward statements writing it
    prev: "_Version | None"  # the version it starts from ('accumulate' / 'overwrite')
    kind: str  # 'first', 'accumulate' (adds to prev) or 'overwrite' (replaces part of prev)
    final: bool = False
    varied: bool = False


def backward(source_or_program, name: str, keep: bool = False) -> Backward:
    """The backward function of TC function `name` (see `tcstage.grad`); a rank-polymorphic
    one's keeps `...` (`_polymorphic`), and keeps no temporaries."""
    from tcstage.program import PolymorphicFunction, Program, define
    program = source_or_program if isinstance(source_or_program, Program) \
        else define(source_or_program)
    fn = program[name]
    if isinstance(fn, PolymorphicFunction):
        return _polymorphic(fn, program)
    from tcstage.grad import memo
    # (as written: no float32 accumulators; kept on disk for the next process, grad/memo.py)
    return memo.memoised(memo.program_key("backward", program, name, str(keep)),
                         lambda: _Generator(fn.written, keep).run(), memo.encode_attrs,
                         memo.decode_backward)


# The run of a rank-polymorphic function is written out with these names to differentiate it,
# then they are read back as `...`: two dimensions, so that every place the run stands is seen
# as the whole of it, in order.
_RUN_SIZES, _RUN_INDICES = ("ELLIPSIS_D0", "ELLIPSIS_D1"), ("ellipsis_i0", "ellipsis_i1")


def _polymorphic(fn, program) -> Backward:
    """The backward function of a rank-polymorphic TC, with `...` where the forward has it:
    derived for a run of two dimensions named apart (`_RUN_SIZES`, `_RUN_INDICES`), then read
    back as `...` in types and subscript lists (`_as_run`). Where the derivation uses a run's
    variable otherwise, the backward cannot keep `...`: an error says so."""
    from tcstage.lang.ellipsis import instantiate
    from tcstage.lang.sema import check_module
    d = instantiate(fn.definition, 2, (list(_RUN_SIZES), list(_RUN_INDICES)))
    module = attrs.evolve(fn._others, defs=(*fn._others.defs, d))
    b = _Generator(check_module(module)[fn.name]).run()
    return attrs.evolve(b, source=_as_run(b, fn.name))


def _as_run(b: Backward, forward: str) -> str:
    """The backward source of the two-dimensional instance with its run written `...`.

    Per statement: the variables the derivation named afresh where the run stands in a
    parameter's subscripts (`d_M_total(y, x) = d_M(y, x)`) take the run's names; a where
    clause bounding the run's variables (a gradient broadcast over the run, `d_X(..., n) +=!
    d_S(n)`, has nothing else to bound them) becomes a read of the forward input whose gradient
    the statement computes, in a select whose branches are equal, `X(..., n) == X(..., n) ? v :
    v`, which gives the run its ranges and leaves the value alone; then the run's names are
    written `...`."""
    import re

    from tcstage.lang import ast
    from tcstage.lang.parser import parse
    module = parse(b.source)
    d = next(x for x in module.defs if x.name.name == b.name)
    runs = {}  # parameter -> the position of the run in its subscripts
    for p in d.params:
        names = [dim.name for dim in p.type.dims]
        if _RUN_SIZES[0] in names:
            runs[p.name.name] = names.index(_RUN_SIZES[0])
    source_of = {v: k for k, v in b.d_inputs.items()}  # gradient -> the input it is of
    text, pieces, last = b.source, [], 0
    for st in d.statements:
        piece = text[st.span.start:st.span.end]
        rename = {}
        reads = [n for n in ast.walk(st.rhs) if isinstance(n, ast.Apply)]
        for read in reads + [ast.Apply(st.tensor, st.indices, st.span)]:
            k = runs.get(read.name.name)
            if k is None:
                continue
            for j, marker in enumerate(_RUN_INDICES):
                a = read.args[k + j] if k + j < len(read.args) else None
                if isinstance(a, ast.Ident) and a.name != marker:
                    rename[a.name] = marker
        for old, new in rename.items():
            piece = re.sub(rf"\b{re.escape(old)}\b", new, piece)
        bounds = [w for w in st.where if w.var.name in _RUN_INDICES or w.var.name in rename]
        if bounds:
            anchor = source_of.get(st.tensor.name)
            if anchor is None or len(bounds) != len(_RUN_INDICES):
                _no_run(forward)
            head, rest = piece.split(" where ", 1)
            kept = [w for w in rest.split(", ") if not w.split(" in ")[0].strip()
                    in (*_RUN_INDICES, *rename)]
            lhs, op, value = re.match(r"(.*?\))\s*(\+=!|\*=!|min=!|max=!|\+=|\*=|=)\s*(.*)",
                                      head).groups()
            read = anchor + lhs[len(st.tensor.name):]
            piece = f"{lhs} {op} {read} == {read} ? ({value}) : ({value})" + \
                (f" where {', '.join(kept)}" if kept else "")
        pieces.append(text[last:st.span.start] + piece)
        last = st.span.end
    text = "".join(pieces) + text[last:]
    text = re.sub(r",\s*".join(rf"\b{n}\b" for n in _RUN_SIZES), "...", text)
    text = re.sub(r",\s*".join(rf"\b{n}\b" for n in _RUN_INDICES), "...", text)
    if any(re.search(rf"\b{n}\b", text) for n in (*_RUN_SIZES, *_RUN_INDICES)):
        _no_run(forward)
    return text


def _no_run(forward: str):
    raise TCError(f"the gradient of rank-polymorphic '{forward}' uses its '...' run outside "
                  "subscript lists, so it cannot be written with '...'",
                  notes=("differentiate an instance of one rank: tc.gradient on the source "
                         "with '...' written out",))


def _pointwise_updates_as_assignments(fn: C.Function) -> C.Function:
    """`T(i) *= e`, `T(i) min= e` and `T(i) max= e` without '!' and without reduction indices
    (TC's wavenet gates `NonLin(b,c,rf) *= sigmoid(...)` this way) combine each element with one
    value: they are `T(i) = T(i) * e` (or min, max), which differentiates as any overwrite that
    reads its own earlier value. Over reduction indices they stay what they are: a product or
    an extremum over the caller's values, refused by the generators."""
    statements = []
    for st in fn.statements:
        if st.reduction in ("*", "min", "max") and not st.init and not st.reduction_vars \
                and not st.scatter:
            t = fn.tensors[st.tensor].type
            own = C.Read(st.tensor, st.lhs_args, t, st.span)
            value = st.rhs if st.rhs.type == t else C.Cast(t, st.rhs, st.span)
            combined = C.Binary("*", own, value, t, st.span) if st.reduction == "*" \
                else C.Call(st.reduction, (own, value), t, st.span)
            st = attrs.evolve(st, reduction=None, rhs=combined)
        statements.append(st)
    return attrs.evolve(fn, statements=tuple(statements))


def _reads_bound(st: C.Statement) -> bool:
    """Whether every index of statement st is a plain subscript of one of its reads, or has a
    where range: what range inference needs of a tensor's first statement."""
    plain = {a.name for n in C.walk(st.rhs) if isinstance(n, C.Read)
             for a in n.args if isinstance(a, C.IndexVar)}
    return all(v in plain or any(w.var == v for w in st.where) for v in st.variables)


class _Generator:
    def __init__(self, fn: C.Function, keep: bool = False):
        fn = _pointwise_updates_as_assignments(fn)
        self.fn = fn
        self.keep = keep
        self.kept: tuple[str, ...] = ()  # temporaries taken as parameters (`kept_temporaries`)
        self.where = f"the gradient of '{fn.name}'"
        self.taken = set(fn.tensors) | set(fn.size_vars) | set(BUILTINS) | {fn.name}
        for t in fn.tensors.values():
            self.taken |= {d for d in t.dims if d and not d.isdigit()}
        for st in fn.statements:
            self.taken |= set(st.variables)
        self.trials = self._forward_ranges()

    # -- names -----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = _name(base, self.taken)
        self.taken.add(name)
        return name

    # -- forward facts -----------------------------------------------------------------------
    def _forward_ranges(self) -> list[R.FunctionRanges]:
        """Range inference of the forward function; where it specialises on scalar inputs, for
        trial values (TRIAL_SCALARS), so that what does not depend on them can be told apart:
        a range the same in every trial is taken as independent of them. Two trials were
        fooled by small constant sizes: `O() +=! B(s * k)` over a B of 4 has k in [0, 2) for s
        = 2 and for s = 3, and the gradient summed two of B's four points for s = 1 (gradient
        fuzz seed 973585). The values past the first two are left out where range inference
        fails for them (a division by s - 1)."""
        needed = sorted(R.needs_specialization(self.fn))
        if not needed:
            return [R.infer_ranges(self.fn)]
        out = []
        for k, value in enumerate(TRIAL_SCALARS):
            try:
                out.append(R.infer_ranges(self.fn, {s: value for s in needed}))
            except TCRangeError as e:
                if k < 2:
                    raise TCError(f"{self.where}: range inference of the forward function fails "
                                  f"for {', '.join(needed)} = {value}: {e.message}") from None
        return out

    def same_in_trials(self, get) -> bool:
        first = get(self.trials[0])
        return all(equal_trees(get(t), first) for t in self.trials[1:])

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> Backward:
        fn = self.fn
        self.versions_of(fn)
        self.signature()
        self.activity()
        self.normalized = normalizations(fn, self.same_range)
        self.statements: list[GradStatement] = []
        self.grad_started: set[str] = set()  # gradient tensors with a statement (or inputs)
        self.grad_names: dict = {}
        for v in self.all_versions:
            if v.final and fn.tensors[v.tensor].kind == "output":
                name = self.d_outputs[v.tensor]
                if any(isinstance(r, C.Read) and r.tensor == v.tensor for k in
                       range(len(fn.statements)) if v in self.reads_of[k].values()
                       for r in C.walk(fn.statements[k].rhs)):  # read later too
                    total = self.fresh(f"{name}_total")
                    idx = self.index_names(fn.tensors[v.tensor].rank)
                    read = C.Read(name, tuple(S.var(i) for i in idx), fn.tensors[v.tensor].type)
                    self.emit(GradStatement(total, idx, "=", read, ()))
                    name = total
                self.grad_names[v] = name
                self.grad_started.add(name)
        for n in reversed(range(len(fn.statements))):
            self.statement_backward(n)
        d_inputs = {}
        for t in fn.inputs:
            name = self.grad_names.get(t.name)
            if name is not None and name in self.grad_started:
                d_inputs[t.name] = name
        if not d_inputs:
            raise TCError(f"{self.where}: no input of '{fn.name}' has a gradient (no output "
                          "depends differentiably on a floating-point input)")
        recompute = self.recomputed()
        if self.keep:
            self.kept = self.kept_temporaries(recompute)
            recompute = self.recomputed()
        return self.assemble(recompute, d_inputs)

    def versions_of(self, fn: C.Function) -> None:
        """Splits each tensor's statements into versions; `reads_of[n]` maps each tensor
        statement n reads to the version it sees."""
        current: dict[str, _Version] = {}
        self.all_versions: list[_Version] = []
        self.version_of: list[_Version] = []
        self.reads_of: list[dict] = []
        counts: dict[str, int] = {}
        last_read: dict[str, int] = {}  # tensor -> the last statement that read it
        for n, st in enumerate(fn.statements):
            self.reads_of.append(dict(current))
            tensor = fn.tensors[st.tensor]
            if tensor.inout:
                raise TCError(
                    f"{self.where}: output '{st.tensor}' starts from the caller's values (its "
                    f"first statement {'reads it' if st.reduction is None else 'accumulates with ' + repr(st.reduction + '=') + ' without !'}); "
                    "the gradient of an in/out output is not generated",
                    st.span, ("give it a first statement that defines it (such as '+=!')",))
            cur = current.get(st.tensor)
            self_read = any(isinstance(x, C.Read) and x.tensor == st.tensor for x in C.walk(st.rhs))
            if cur is None:
                version = _Version(st.tensor, "", [n], None, "first")
            elif st.reduction == "+" and not st.init and not self_read and all(
                    fn.statements[k].reduction in (None, "+") for k in cur.statements) and \
                    last_read.get(st.tensor, -1) <= cur.statements[-1]:
                # (a statement between read the sum so far: a version of its own, else that
                # read was recomputed from the finished sum; fuzz seed 970457)
                cur.statements.append(n)
                version = cur
            elif st.reduction in ("*", "min", "max") and not st.init:
                raise TCError(f"{self.where}: the statement updates '{st.tensor}' with "
                              f"'{st.reduction}=' without '!'; its gradient is not generated",
                              st.span, ("compute the reduction into a new tensor with "
                                        f"'{st.reduction}=!', then combine the two",))
            else:
                kind = "accumulate" if st.reduction == "+" and not st.init else "overwrite"
                version = _Version(st.tensor, "", [n], cur, kind)
            if version is not cur:
                self.all_versions.append(version)
                counts[st.tensor] = counts.get(st.tensor, 0) + 1
            current[st.tensor] = version
            self.version_of.append(version)
            for x in C.walk(st.rhs):
                if isinstance(x, C.Read):
                    last_read[x.tensor] = n
            if st.reduction == "*":
                raise TCError(f"{self.where}: the gradient of a product reduction ('*=!') is "
                              "not generated", st.span,
                              ("write the product as exp of a sum of logs where the factors "
                               "are positive",))
        for v in current.values():
            v.final = True
        seen: dict[str, int] = {}
        for v in self.all_versions:
            seen[v.tensor] = seen.get(v.tensor, 0) + 1
            if v.final:
                v.name = v.tensor
            else:
                v.name = self.fresh(f"{v.tensor}_{seen[v.tensor]}")

    def signature(self) -> None:
        """Output shapes in the backward signature: a size variable or constant where the
        forward extent is one, else a new size variable (named after the output)."""
        fn = self.fn
        self.out_dims: dict[str, list[str]] = {}
        self.dim_notes: list[str] = []
        self.size_values: dict[str, str] = {}  # a new size variable -> its value, as text
        self.size_exprs: dict[str, C.Expr] = {}  # ... and as an expression
        for name in fn.outputs:
            dims = []
            for d in range(fn.tensors[name].rank):
                if not self.same_in_trials(lambda fr: fr.tensors[name].mins[d]) or not equal_trees(
                        self.trials[0].tensors[name].mins[d], R.ZERO):
                    raise TCError(f"{self.where}: output '{name}' does not start at index 0 "
                                  f"in dimension {d}; its gradient is not generated")
                ext = self.trials[0].tensors[name].extents[d]
                if self.same_in_trials(lambda fr: fr.tensors[name].extents[d]) and \
                        ext[0] in ("var", "int"):
                    dims.append(str(ext[1]))
                    continue
                fresh = self.fresh(f"{name}_{d}")
                dims.append(fresh)
                if self.same_in_trials(lambda fr: fr.tensors[name].extents[d]):
                    self.dim_notes.append(f"{fresh} = {S.to_tc(_tree_expr(ext))}")
                    self.size_values[fresh] = S.to_tc(_tree_expr(ext))
                    self.size_exprs[fresh] = _tree_expr(ext)
                else:
                    self.dim_notes.append(f"{fresh}: the extent of {name}'s dimension {d}")
            self.out_dims[name] = dims
        self.d_outputs = {o: self.fresh(f"d_{o}") for o in fn.outputs}

    def activity(self) -> None:
        """Which versions depend differentiably on a floating-point input. A stabiliser (the
        max a softmax subtracts, see `invariance`) does not: no output depends on it."""
        fn = self.fn
        constant = stabilisers(fn)
        for n, st in enumerate(fn.statements):
            v = self.version_of[n]
            if st.tensor in constant:
                continue
            if v.prev is not None and v.prev.varied:
                v.varied = True
            for leaf in _leaves(st.rhs):
                if isinstance(leaf, C.ScalarParam) or fn.tensors[leaf.tensor].kind == "input":
                    v.varied = True
                elif self.reads_of[n][leaf.tensor].varied:
                    v.varied = True

    # -- ranges ------------------------------------------------------------------------------
    def dim_range(self, tensor: str, d: int) -> tuple[C.Expr, C.Expr]:
        """[lo, hi) of a tensor's dimension, as the backward function can write it."""
        t = self.fn.tensors[tensor]
        if t.kind == "input":
            return S.const(0), _size(t.dims[d])
        if t.kind == "output":
            return S.const(0), _size(self.out_dims[tensor][d])
        if self.same_in_trials(lambda fr: (fr.tensors[tensor].mins[d],
                                            fr.tensors[tensor].extents[d])):
            b = self.trials[0].tensors[tensor]
            return _tree_expr(b.mins[d]), _tree_expr(R.simplify_tree(("add", b.mins[d],
                                                                    b.extents[d])))
        raise TCError(f"{self.where}: the shape of temporary '{tensor}' depends on the values "
                      "of scalar inputs; its gradient is not generated")

    def var_range(self, n: int, v: str) -> tuple[C.Expr, C.Expr]:
        """[lo, hi) of index v in forward statement n."""
        st = self.fn.statements[n]
        stated = next((w for w in st.where if w.var == v), None)
        if v in st.indices and (stated is None or self.fn.tensors[st.tensor].kind == "output"):
            d = st.indices.index(v)

            def covers(fr):
                b, r = fr.tensors[st.tensor], fr.statements[n].ranges[v]
                return equal_trees(r.lo, b.mins[d]) and equal_trees(
                    R.simplify_tree(("add", r.hi, R.ONE)), R.simplify_tree(("add", b.mins[d],
                                                                        b.extents[d])))
            # (an output's whole dimension, though a where clause states it: as the size the
            # backward's parameters give it, `h in 0:O_2` for `h in 0:(H + 1) / 2`, so that
            # range inference sees d_O(n,f,h,w) read within d_O and the read needs no padded
            # copy; a strided convolution's two gradients then compile apart)
            if all(covers(fr) for fr in self.trials):
                return self.dim_range(st.tensor, d)
        if stated is not None:
            return self.renamed(n, stated.lo), self.renamed(n, stated.hi)
        if self.same_in_trials(lambda fr: (fr.statements[n].ranges[v].lo,
                                            fr.statements[n].ranges[v].hi)):
            r = self.trials[0].statements[n].ranges[v]
            return _tree_expr(r.lo), _tree_expr(R.simplify_tree(("add", r.hi, R.ONE)))
        raise TCError(f"{self.where}: the range of '{v}' depends on the values of scalar "
                      "inputs; its gradient is not generated (write a where clause for it)",
                      st.span)

    def same_range(self, n: int, v: str, k: int, w: str) -> bool:
        """Whether index v of forward statement n and index w of statement k range alike."""
        try:
            return all(S.to_tc(a) == S.to_tc(b)
                       for a, b in zip(self.var_range(n, v), self.var_range(k, w)))
        except TCError:  # (a range that depends on scalar inputs' values)
            return False

    def covers(self, n: int) -> bool:
        """Whether statement n writes every element of its tensor."""
        st = self.fn.statements[n]
        for d, v in enumerate(st.indices):
            if S.to_tc(self.var_range(n, v)[0]) != S.to_tc(self.dim_range(st.tensor, d)[0]) or \
                    S.to_tc(self.var_range(n, v)[1]) != S.to_tc(self.dim_range(st.tensor, d)[1]):
                return False
        return True

    # -- statements --------------------------------------------------------------------------
    def renamed(self, n: int, e: C.Expr) -> C.Expr:
        """e of forward statement n with tensors named as the versions it reads."""
        names = {t: v.name for t, v in self.reads_of[n].items()}
        return S.rename_tensors(e, names)

    def index_names(self, rank: int) -> tuple[str, ...]:
        return tuple(_INDEX_NAMES[k] if k < len(_INDEX_NAMES) else f"i{k}" for k in range(rank))

    def emit(self, st: GradStatement) -> None:
        self.statements.append(st)

    def grad_of(self, target) -> str:
        """The gradient tensor's name of a version or an input (by name)."""
        name = self.grad_names.get(target)
        if name is None:
            base = target if isinstance(target, str) else target.name
            name = self.grad_names[target] = self.fresh(f"d_{base}")
        return name

    def statement_backward(self, n: int) -> None:
        fn = self.fn
        st = fn.statements[n]
        w = self.version_of[n]
        d_w = self.grad_names.get(w)
        if d_w is None or d_w not in self.grad_started:
            return  # no gradient reaches what this statement writes
        # A scatter's gradient is read at its own subscripts: a gather, d_H(I(i)).
        lhs = tuple(self.renamed(n, a) for a in st.scatter) if st.scatter \
            else tuple(S.var(i) for i in st.indices)
        tensor = fn.tensors[st.tensor]
        seed = C.Read(d_w, lhs, tensor.type)
        if w.prev is not None and n == w.statements[0] and w.prev.varied:
            self.pass_to_previous(n, w, d_w)
        rule = self.normalized.get(n)
        if rule is not None:
            self.normalized_backward(rule, seed, C.Read(w.name, lhs, tensor.type))
            return
        rhs = self.renamed(n, st.rhs)
        if st.reduction in ("max", "min"):
            box = tuple((v, *self.var_range(n, v)) for v in st.variables)
            candidate, value = rhs, C.Read(w.name, lhs, tensor.type)
            if not _stored(rhs):
                # A computed value may round differently here than in the forward function
                # (Halide contracts and reorders float arithmetic per Func), so `rhs == W(L)`
                # could miss the selected element: the backward stores its own values and
                # their extremum, and compares stored values only.
                values = self.fresh(f"{w.name}_values")
                self.emit(GradStatement(values, st.variables, "=", rhs, box))
                candidate = C.Read(values, tuple(S.var(v) for v in st.variables), tensor.type)
                extremum = self.fresh(f"{w.name}_{st.reduction}")
                self.emit(GradStatement(extremum, st.indices, f"{st.reduction}=!", candidate,
                                         box))
                value = C.Read(extremum, lhs, tensor.type)
            count = self.fresh(f"{w.name}_ties")
            hit = S.compare("==", candidate, value)
            self.emit(GradStatement(count, st.indices, "+=!",
                                     S.select(hit, S.const(1), S.const(0)), box))
            seed = S.select(hit, S.div(seed, C.Read(count, lhs, INT32)), S.const(0))
        # A statement that alone defines its version, `E(n,c) = exp(X(n,c) - M(n))`, has its
        # value at hand in the backward: exp's derivative reads E instead of computing exp
        # again, and a quotient's divisor gets -d * Y / S (softmax's).
        value = C.Read(w.name, lhs, tensor.type) \
            if st.reduction is None and not st.scatter and w.statements == [n] else None
        self.contribute_partials(n, rhs, seed, value)

    def contribute_partials(self, n: int, rhs: C.Expr, seed: C.Expr,
                            value: C.Expr | None = None) -> None:
        """The gradient `seed` of `rhs` (statement n's, renamed) to each differentiable leaf."""
        fn = self.fn
        where = f"{self.where}, statement '{_text(fn.statements[n])}'"
        for leaf, g in partials(rhs, seed, where, value):
            if isinstance(leaf, C.ScalarParam):
                target = leaf.name
            elif fn.tensors[_forward_name(self, n, leaf.tensor)].kind == "input":
                target = leaf.tensor
            else:
                target = next(v for v in self.reads_of[n].values() if v.name == leaf.tensor)
                if not target.varied:
                    continue
            self.contribute(n, target, leaf, g)

    def normalized_backward(self, rule: Normalization, d_y: C.Read, y: C.Read) -> None:
        """A softmax's or log-softmax's gradient in closed form (`normalized`): the row sum
        it needs, then the gradient of its argument, with no exponential computed again but
        exp(Y) of a log-softmax."""
        n = rule.output
        st = self.fn.statements[n]
        box = tuple((v, *self.var_range(n, v)) for v in st.indices)
        kept = tuple(S.var(v) for v in rule.kept)
        if rule.kind == "softmax":
            total = self.fresh(f"{y.tensor}_dot_{d_y.tensor}")
            self.emit(GradStatement(total, rule.kept, "+=!", S.mul(d_y, y), box))
            row = C.Read(total, kept, y.type)
            g = S.mul(y, S.sub(d_y, row))
        else:
            total = self.fresh(f"{d_y.tensor}_sum")
            self.emit(GradStatement(total, rule.kept, "+=!", d_y, box))
            row = C.Read(total, kept, y.type)
            g = S.sub(d_y, S.mul(S.call("exp", y), row))
        g = S.substitute(g, {v: S.var(w) for v, w in rule.renaming})
        self.contribute_partials(rule.argument_at,
                                 self.renamed(rule.argument_at, rule.argument), g)

    def pass_to_previous(self, n: int, w: _Version, d_w: str) -> None:
        """The gradient of the previous version where statement n did not overwrite it."""
        st = self.fn.statements[n]
        rank = self.fn.tensors[st.tensor].rank
        if w.kind == "overwrite" and self.covers(n):
            return
        d_prev = self.grad_of(w.prev)
        idx = self.index_names(rank)
        self.emit(GradStatement(d_prev, idx, "=", C.Read(d_w, tuple(S.var(i) for i in idx),
                                                          self.fn.tensors[st.tensor].type), ()))
        if w.kind == "overwrite":
            self.emit(GradStatement(d_prev, st.indices, "=", S.const(0),
                                     tuple((v, *self.var_range(n, v)) for v in st.indices)))
        self.grad_started.add(d_prev)

    def contribute(self, n: int, target, leaf: C.Expr, g: C.Expr) -> None:
        """d_target(u) += g, reindexed so that the left-hand side is plain indices."""
        st = self.fn.statements[n]
        forward_tensor = target if isinstance(target, str) else target.tensor
        d_target = self.grad_of(target)
        args = leaf.args if isinstance(leaf, C.Read) else ()
        used = set(st.variables)
        lhs: list[str] = []
        subst: dict[str, C.Expr] = {}
        guards: list[C.Expr] = []
        solved: list[str] = []
        fresh_index = iter(x for x in _INDEX_NAMES + tuple(f"u{k}" for k in range(16))
                           if x not in self.taken and x not in used)
        phases: dict[str, _Phase] = {}  # left-hand index -> how its dimension splits
        for arg in args:
            arg = S.substitute(arg, subst)
            if isinstance(arg, C.IndexVar) and arg.name not in lhs:
                lhs.append(arg.name)
                continue
            u = next(fresh_index)
            lhs.append(u)
            decomposed = S.linear(arg) if not C.has_read(arg) else None
            choice = None
            if decomposed is not None:
                coeffs, _ = decomposed
                candidates = [(v, c) for v, c in coeffs.items()
                              if v not in lhs and v in used and not C.free_vars(c)
                              and not S.is_zero(c) and not C.has_read(c)]
                candidates.sort(key=lambda vc: (vc[0] not in st.indices,
                                                not (S.is_const(vc[1], 1) or S.is_const(vc[1], -1))))
                choice = candidates[0] if candidates else None
            if choice is None:  # a table index, a repeated index: scatter instead
                self.scatter_to(n, target, leaf, g)
                return
            x, c = choice
            coeffs, offset = decomposed
            phase = self.phase_split(n, leaf, coeffs, offset, x, c, lhs, used, phases,
                                     forward_tensor)
            if phase is not None:
                subst = {key: S.substitute(e, phase.values) for key, e in subst.items()}
                subst.update(phase.values)
                solved.append(x)
                phases[u] = phase
                continue
            rest = S.const(0)  # the other terms, then the constant: `kh - 1`
            for v, cv in coeffs.items():
                if v != x:
                    rest = S.add(rest, S.mul(cv, S.var(v)))
            rest = S.add(rest, offset)
            diff = S.sub(S.var(u), rest)
            if S.is_const(c, 1):
                value = diff
            elif S.is_const(c, -1):
                value = S.neg(diff)
            else:
                guards.append(S.compare("==", C.Binary("%", diff, c, INT32), S.const(0)))
                value = S.div(diff, c)
            subst = {k: S.substitute(e, {x: value}) for k, e in subst.items()}
            subst[x] = value
            solved.append(x)
        guards = [S.substitute(gd, subst) for gd in guards]
        # A solved index kept within its forward range only because a factor of g reads the
        # gradient (or an input) at exactly that index over that tensor's whole dimension
        # (`d_out(b, op, h, w)` with h in 0:out_2): the factor read with `?? 0` says the same,
        # and the CPU computes it as a padded copy instead of testing every point.
        padded_reads, implied = self.padded_instead(n, g, solved, modulo=bool(guards))
        for x in solved:
            if x in implied:
                continue
            lo, hi = self.var_range(n, x)
            e = subst[x]
            guards.append(S.compare("<=", lo, e) if not S.is_const(lo, 0)
                          else S.compare(">=", e, lo))
            guards.append(S.compare("<", e, hi))
        # A partner is at least its low bound by construction; its high bound is a guard, not
        # a padded read: the weights padded with `?? 0` made conv_s2's phases 40% slower.
        guards += [S.compare("<", subst[ph.partner], ph.partner_hi) for ph in phases.values()]
        where, final_where, positions = [], [], {}
        for d, u in enumerate(lhs):
            lo, hi = self.dim_range(forward_tensor, d)
            final_where.append((u, lo, hi))
            if u in phases:
                ph = phases[u]
                where.append((ph.quotient, S.const(0), _ceil_div(hi, ph.stride)))
                positions[u] = S.add(S.mul(S.const(ph.stride), S.var(ph.quotient)),
                                     S.var(ph.phase))
                continue
            if u in used and u not in subst:  # a forward index: guard where it was narrower
                flo, fhi = self.var_range(n, u)
                if S.to_tc(flo) != S.to_tc(lo):
                    guards.append(S.compare("<=", flo, S.var(u)))
                if S.to_tc(fhi) != S.to_tc(hi):
                    guards.append(S.compare("<", S.var(u), fhi))
            where.append((u, lo, hi))
        for v in st.variables:
            if v not in lhs and v not in subst:
                where.append((v, *self.var_range(n, v)))
        where += [(ph.step, S.const(0), ph.steps) for ph in phases.values()]
        # The read itself, at the new indices (equal under the guards), reads best.
        at_u = C.Read(leaf.tensor, tuple(positions.get(u, S.var(u)) for u in lhs), leaf.type) \
            if isinstance(leaf, C.Read) else leaf
        reads_itself = isinstance(leaf, C.Read) and any(m == leaf for m in C.walk(g))
        g = S.rebuild(g, lambda m: at_u if m == leaf else None)
        g = S.substitute(g, subst)
        if reads_itself:  # (a phase's last quotient may reach past the dimension)
            guards += [S.compare("<", positions[u], final_where[d][2])
                       for d, u in enumerate(lhs) if u in phases]
        rhs = S.select(S.conj(guards), g, S.const(0)) if guards else g
        first = d_target not in self.grad_started
        padded = frozenset(S.to_tc(S.substitute(
            S.rebuild(r, lambda m: at_u if m == leaf else None), subst)) for r in padded_reads)
        op = "+=!" if first else "+="
        if phases:
            self.emit_in_phases(d_target, op, lhs, phases, rhs, where, final_where, padded,
                                leaf.type)
        else:
            rhs, where = _count_absent(rhs, set(lhs), where)
            self.emit(GradStatement(d_target, tuple(lhs), op, rhs, tuple(where), padded))
        self.grad_started.add(d_target)

    def phase_split(self, n: int, leaf: C.Read, coeffs: dict, offset: C.Expr,
                    x: str, c: C.Expr, lhs: list, used: set, phases: dict,
                    forward_tensor: str) -> "_Phase | None":
        """How the gradient at u = s*x + k + offset (a strided window: `2*h + kh - 1`, stride
        s > 1, k a reduction index with unit coefficient) is computed without testing
        divisibility: u = s*q + p, and for each phase p only the k with k = p - offset modulo s
        contribute, k = k0(p) + s*j. So x = q + (p - offset - k0(p))/s - j: each phase is a
        dense window over q, which vectorises, and no point visits the taps of other phases.
        None where the subscript has another form, or k appears elsewhere in the read."""
        st = self.fn.statements[n]
        c0 = S._uncast(c)
        if not (isinstance(c0, C.Const) and isinstance(c0.value, int) and c0.value > 1) or \
                len(coeffs) != 2 or C.free_vars(offset) or C.has_read(offset):
            return None
        k = next(v for v in coeffs if v != x)
        ck = S._uncast(coeffs[k])
        if not (isinstance(ck, C.Const) and ck.value in (1, -1)) or k not in used or \
                k in st.indices or k in lhs or any(k in C.free_vars(a) for i, a in
                                                    enumerate(leaf.args) if i != len(lhs) - 1):
            return None
        u, d = lhs[-1], len(lhs) - 1
        if not S.is_const(self.dim_range(forward_tensor, d)[0], 0):
            return None
        s, sign = c0.value, ck.value
        taken = used | set(lhs) | self.taken | {name for ph in phases.values()
                                                for name in (ph.quotient, ph.phase, ph.step)}
        quotient = _name(f"{u}o", taken)
        phase = _name(f"{u}p", taken | {quotient})
        step = _name(f"j{k}", taken | {quotient, phase})
        lo, hi = self.var_range(n, k)
        # With a = sign*(p - offset) - lo: k = lo + a % s + s*j and x = q + sign*(a / s - j)
        # (TC's / and % round down, so a = s*(a / s) + a % s for every a).
        a = S.sub(S.mul(S.const(sign), S.sub(S.var(phase), offset)), lo)
        k_value = S.add(S.add(lo, C.Binary("%", a, S.const(s), INT32)),
                        S.mul(S.const(s), S.var(step)))
        x_value = S.sub(S.add(S.var(quotient), S.mul(S.const(sign), S.div(a, S.const(s)))),
                        S.mul(S.const(sign), S.var(step)))
        lo0, hi0 = S._uncast(lo), S._uncast(hi)
        extent = S.const(hi0.value - lo0.value) \
            if isinstance(lo0, C.Const) and isinstance(hi0, C.Const) else S.sub(hi, lo)
        return _Phase(s, quotient, phase, step, _ceil_div(extent, s), k, hi,
                      {x: x_value, k: k_value})

    def emit_in_phases(self, d_target: str, op: str, lhs: list, phases: dict, rhs: C.Expr,
                       where: list, final_where: list, padded: frozenset, type) -> None:
        """The gradient of a strided window (see phase_split) in two statements: by phase, into
        a temporary whose phase indices precede its quotient indices (`d_I_phases(n, c, yp, xp,
        yo, xo)`), then gathered into place (`d_I(n, c, y, x) = d_I_phases(n, c, y % 2, ...)`)."""
        first_split = min(k for k, u in enumerate(lhs) if u in phases)
        indices = [*lhs[:first_split], *(phases[u].phase for u in lhs if u in phases),
                   *(phases[u].quotient if u in phases else u for u in lhs[first_split:])]
        where = [*where, *((ph.phase, S.const(0), S.const(ph.stride)) for ph in phases.values())]
        rhs, where = _count_absent(rhs, set(indices), where)
        order = {name: k for k, name in enumerate(indices)}
        where.sort(key=lambda w: order.get(w[0], len(order)))
        staged = self.fresh(f"{d_target}_phases")
        self.emit(GradStatement(staged, tuple(indices), "+=!", rhs, tuple(where), padded))
        at = {u: (C.Binary("%", S.var(u), S.const(ph.stride), INT32),
                  S.div(S.var(u), S.const(ph.stride))) for u, ph in phases.items()}
        args = [*(S.var(u) for u in lhs[:first_split]), *(at[u][0] for u in lhs if u in phases),
                *(at[u][1] if u in phases else S.var(u) for u in lhs[first_split:])]
        self.emit(GradStatement(d_target, tuple(lhs), "=" if op == "+=!" else op,
                                C.Read(staged, tuple(args), type), tuple(final_where)))

    def padded_instead(self, n: int, g: C.Expr, solved: list[str], modulo: bool):
        """(reads of g to pad, the solved indices whose range guards they replace): each a
        factor of g's top-level product that reads the statement's output gradient or an
        input with a solved index as a plain subscript whose forward range is the whole
        dimension. None where a divisibility guard (`modulo`) stays anyway."""
        if modulo or not solved:
            return (), set()
        st = self.fn.statements[n]
        own = self.grad_names.get(self.version_of[n])
        factors, stack = [], [g]
        while stack:
            e = stack.pop()
            if isinstance(e, C.Binary) and e.op == "*":
                stack += [e.lhs, e.rhs]
            else:
                factors.append(e)
        reads, implied = [], set()
        for r in factors:
            if not isinstance(r, C.Read) or any(map(C.has_read, r.args)):
                continue
            forward = self.fn.tensors.get(r.tensor)
            tensor = st.tensor if r.tensor == own else \
                r.tensor if forward is not None and forward.kind == "input" else None
            if tensor is None:
                continue
            covered = set()
            for d, a in enumerate(r.args):
                if isinstance(a, C.IndexVar) and a.name in solved:
                    lo, hi = self.var_range(n, a.name)
                    dlo, dhi = (S.to_tc(b) for b in self.dim_range(tensor, d))
                    if S.to_tc(lo) == dlo and S.to_tc(hi) in (dhi, self.size_values.get(dhi)):
                        covered.add(a.name)
            if covered:
                reads.append(r)
                implied |= covered
        return tuple(reads), implied

    def scatter_to(self, n: int, target, leaf: C.Read, g: C.Expr) -> None:
        """d_target(subscripts of the read) += g over the forward statement's points: the
        gradient of a read whose subscripts cannot be solved for new indices (a table read
        `LUT(I(i,k), j)`, a diagonal `X(i, i)`) is a scatter-add."""
        st = self.fn.statements[n]
        forward_tensor = target if isinstance(target, str) else target.tensor
        d_target = self.grad_of(target)
        if d_target not in self.grad_started:
            idx = self.index_names(len(leaf.args))
            self.emit(GradStatement(d_target, idx, "=", S.const(0), tuple(
                (i, *self.dim_range(forward_tensor, d)) for d, i in enumerate(idx))))
            self.grad_started.add(d_target)
        used = {x for a in leaf.args for x in C.free_vars(a)}
        g, where = _count_absent(g, used, [(v, *self.var_range(n, v)) for v in st.variables])
        self.emit(GradStatement(d_target, (), "+=", g, tuple(where), scatter=leaf.args))

    # -- recomputation and the text ------------------------------------------------------------
    def recomputed(self) -> list[int]:
        """Forward statements the backward statements need, in order (not those of the kept
        temporaries, which it takes as parameters)."""
        return sorted(self._recomputation()[0])

    def _recomputation(self) -> tuple[set[int], set[str]]:
        """The forward statements the backward needs, and the names it reads."""
        needed = {r.tensor for st in self.statements for r in C.walk(st.rhs)
                  if isinstance(r, (C.Read, C.DimOf))}
        needed |= {e.tensor for st in self.statements for _, lo, hi in st.where
                   for x in (lo, hi) for e in C.walk(x) if isinstance(e, C.DimOf)}
        out: set[int] = set()
        for n in reversed(range(len(self.fn.statements))):
            v = self.version_of[n]
            given = self.fn.tensors[v.tensor].kind == "output" or v.tensor in self.kept
            if v.name in needed and not (v.final and given):
                out.add(n)
                rhs = self.renamed(n, self.fn.statements[n].rhs)
                needed |= {r.tensor for r in C.walk(rhs) if isinstance(r, (C.Read, C.DimOf))}
                if self.starts_from_prev(n):  # (assemble copies the previous version first)
                    needed.add(v.prev.name)
        return out, needed

    def kept_temporaries(self, recompute: list[int]) -> tuple[str, ...]:
        """The temporaries the backward would recompute that it takes as parameters instead
        (keep=True): each written in one version, by a reduction (the passes a norm's
        backward spent on its mean and variance again), and of extents that are sizes of the
        forward's (so the parameter's type states them), in forward order."""
        fn, recompute = self.fn, set(recompute)
        counts: dict[str, int] = {}
        for v in self.all_versions:
            counts[v.tensor] = counts.get(v.tensor, 0) + 1
        kept = []
        for v in self.all_versions:
            t = fn.tensors[v.tensor]
            if not v.final or t.kind != "temp" or counts[v.tensor] != 1 or \
                    not set(v.statements) <= recompute or \
                    all(fn.statements[n].reduction is None for n in v.statements):
                continue
            if all(self.same_in_trials(lambda fr: fr.tensors[v.tensor].extents[d]) and
                   self.trials[0].tensors[v.tensor].extents[d][0] in ("var", "int") and
                   self.same_in_trials(lambda fr: fr.tensors[v.tensor].mins[d]) and
                   equal_trees(self.trials[0].tensors[v.tensor].mins[d], R.ZERO)
                   for d in range(t.rank)):
                kept.append(v.tensor)
        self.kept = tuple(kept)
        needed = self._recomputation()[1]  # (one read only by another kept one: not passed)
        return tuple(k for k in kept if k in needed)

    def starts_from_prev(self, n: int) -> bool:
        """Whether statement n starts a version from the previous version's values: it
        overwrites part of its tensor only (the rest keeps them), or it accumulates onto them
        (`O() += ...` after `O() min=! ...`, a version of its own: its recompute started
        from nothing, an invalid backward TC; gradient fuzz seed 972344)."""
        v = self.version_of[n]
        return v.statements[0] == n and (v.kind == "accumulate" or
                                         v.kind == "overwrite" and not self.covers(n))

    def assemble(self, recompute: list[int], d_inputs: dict) -> Backward:
        fn = self.fn
        self.recompute = []  # (per statement of the body's recomputed part: its forward one)
        body = []
        for n in recompute:
            st = fn.statements[n]
            if self.starts_from_prev(n):
                # (a version that overwrote part of its tensor holds the previous version's
                # values elsewhere: recomputed from a copy of it, not from nothing)
                v = self.version_of[n]
                idx = self.index_names(fn.tensors[st.tensor].rank)
                body.append(GradStatement(v.name, idx, "=", C.Read(
                    v.prev.name, tuple(S.var(i) for i in idx), fn.tensors[st.tensor].type), ()))
                self.recompute.append(None)
            self.recompute.append(n)
            op = "=" if st.reduction is None else f"{st.reduction}={'!' if st.init else ''}"
            where = tuple((w.var, self.renamed(n, w.lo), self.renamed(n, w.hi)) for w in st.where)
            copy = GradStatement(self.version_of[n].name, st.indices, op,
                                 self.renamed(n, st.rhs), where,
                                 scatter=tuple(self.renamed(n, a) for a in st.scatter))
            if not _reads_bound(st):
                # (`O(r, m) = 0.0`, whose ranges the forward took from O's later statements:
                # its copy starts a tensor of its own, so it states them)
                copy = self.state_ranges(len(body), copy)
            body.append(copy)
        body += self.statements
        name = self.fresh(f"{fn.name}_grad")

        def decl(t: C.Tensor, tname: str, dims) -> str:
            spelled = _SPELLING.get(t.type, t.type.name)
            return f"{spelled}({', '.join(dims)}) {tname}" if t.rank else f"{spelled} {tname}"

        params = [decl(t, t.name, t.dims) for t in fn.inputs]
        params += [decl(fn.tensors[o], o, self.out_dims[o]) for o in fn.outputs]
        params += [decl(fn.tensors[k], k, [str(e[1]) for e in self.trials[0].tensors[k].extents])
                   for k in self.kept]
        params += [decl(fn.tensors[o], self.d_outputs[o], self.out_dims[o]) for o in fn.outputs]
        outs = [d_inputs[t.name] for t in fn.inputs if t.name in d_inputs]
        header = [f"# The gradient of '{fn.name}', generated by tcstage (tc.gradient)."]
        header += [f"# {note}" for note in self.dim_notes]
        head = "\n".join(header) + f"\ndef {name}({', '.join(params)}) -> ({', '.join(outs)}) {{\n"
        text = polish(head, body, len(self.recompute), self.state_ranges, self.where)
        inputs = tuple(t.name for t in fn.inputs) + tuple(fn.outputs) + self.kept + tuple(
            self.d_outputs[o] for o in fn.outputs)
        return Backward(text, name, fn.name, inputs, dict(self.d_outputs), d_inputs, self.kept)

    def state_ranges(self, k: int, st: GradStatement) -> GradStatement:
        """Recomputed statement k with a where clause for each of its indices."""
        n = self.recompute[k] if k < len(self.recompute) else None
        if n is None:  # (a gradient statement, or a copy of a previous version: as it is)
            return st
        stated = {w[0] for w in st.where}
        # (an output's extent that a new size variable names, `O0_1_2 = min(L, 5)`, is
        # written as its value: the recomputed pieces of a tensor are checked against each
        # other's inferred ranges, which know min(L, 5) but not O0_1_2; the backward was
        # refused as overlapping, gradient fuzz seed 973846)
        sizes = self.size_exprs

        def value(e: C.Expr) -> C.Expr:
            return S.rebuild(e, lambda x: sizes.get(x.name) if isinstance(x, C.SizeVar)
                             else None) if sizes else e
        return attrs.evolve(st, where=st.where + tuple(
            (v, *map(value, self.var_range(n, v))) for v in self.fn.statements[n].variables
            if v not in stated))


# -- helpers ----------------------------------------------------------------------------------


@attrs.frozen
class _Phase:
    """A gradient dimension u = stride*quotient + phase, computed phase by phase
    (`_Generator.phase_split`): the forward index `partner` (below `partner_hi`) is
    partner(phase) + stride*step, step in 0:steps; `values` substitutes it and the strided
    index."""

    stride: int
    quotient: str
    phase: str
    step: str
    steps: C.Expr
    partner: str
    partner_hi: C.Expr
    values: dict


def _name(base: str, taken: set) -> str:
    """`base`, or base2, base3, ... (base_2, ... after a digit): the first not in `taken`."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}" if not base[-1].isdigit() else f"{base}_{k}"
    return name


def _ceil_div(e: C.Expr, s: int) -> C.Expr:
    """e / s rounded up, folded where e is a constant."""
    e0 = S._uncast(e)
    if isinstance(e0, C.Const) and not isinstance(e0.value, bool):
        return S.const(-(-e0.value // s))
    return S.div(S.add(e, S.const(s - 1)), S.const(s))


def _count_absent(rhs: C.Expr, lhs: set, where: list) -> tuple[C.Expr, list]:
    """rhs times the extent of each summed index it no longer mentions, and the where clauses
    of the rest: the forward sum visits every value of such an index (`O(i) +=! C(i) + D(i,k)`
    gives d_C(i) K times), and TC takes no where clause on an index a statement does not use."""
    mentioned = C.free_vars(rhs) | lhs
    kept = []
    for v, lo, hi in where:
        if v in mentioned:
            kept.append((v, lo, hi))
        else:
            rhs = S.mul(rhs, S.sub(hi, lo))
    return rhs, kept


def _stored(e: C.Expr) -> bool:
    """Whether e is a value as stored (a read, a scalar, a padded read), not a computed one."""
    while isinstance(e, C.Cast):
        e = e.operand
    return isinstance(e, (C.Read, C.ScalarParam, C.Padded))


def _leaves(e: C.Expr):
    return [n for n in C.walk(e) if differentiable(n)]


def _forward_name(gen: _Generator, n: int, name: str) -> str:
    """The forward tensor of a name in statement n's renamed right-hand side."""
    for t, v in gen.reads_of[n].items():
        if v.name == name:
            return t
    return name


def _text(st: C.Statement) -> str:
    return " ".join(st.span.text().split()) if st.span is not None else st.tensor


def _size(d: str) -> C.Expr:
    return S.const(int(d)) if d.isdigit() else C.SizeVar(d)


def _tree_expr(tree) -> C.Expr:
    """A range tree (over size variables and scalars) as a checked expression."""
    tag = tree[0]
    if tag == "int":
        return S.const(int(tree[1]))
    if tag == "var":
        return C.SizeVar(tree[1])
    ops = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}
    if tag in ops:
        return C.Binary(ops[tag], _tree_expr(tree[1]), _tree_expr(tree[2]), INT32)
    if tag in ("min", "max"):
        return C.Call(tag, (_tree_expr(tree[1]), _tree_expr(tree[2])), INT32)
    raise TCError(f"a range bound of the forward function ({tree!r}) cannot be written in TC")

