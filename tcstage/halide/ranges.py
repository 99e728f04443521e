"""Range inference (spec 001), with Halide's solver.

For each statement, in order:

1. Variables named in a `where` clause take that range; all others are *unresolved*.
2. Every subscript of every tensor access gives the condition `min <= subscript < min + extent`.
   The accesses are the reads on the right-hand side and, once a tensor has a shape (an input,
   an in/out output, or a tensor defined by an earlier statement), the write on the left.
3. Rounds: a subscript counts in a round when exactly one of its variables is unresolved. Its
   condition, with the variables resolved in earlier rounds (or by `where`) eliminated by
   `and_condition_over_domain`, is solved for that variable with `solve_for_inner_interval`.
   Several conditions on one variable in one round intersect. A round that resolves nothing
   is an error naming the variables.
4. A variable with no lower bound starts at 0; one with no upper bound is an error.
5. Subscripts never used (several variables resolved in the same round, like `C(i + j)`) and
   subscripts that depend on tensor values (`B(C(i))`) are preconditions: checked statically
   when Halide can prove them, otherwise reported as a `TCWarning`.

A tensor's shape comes from the ranges of the left-hand variables of its first statement (or,
where that statement cannot bound them, of the first later statement of the tensor that can:
see `_shape_of`), or is the box holding its pieces, statements whose where clauses write
different parts of it (`_Partition`); a range need not start at 0 (`A(i) = B(10 - i)` gives `11 - I <= i < 11`), and the tensor is then
stored from its minimum. Ranges are symbolic in the size variables. Scalar inputs that appear in
subscripts or where clauses are *specialised*: their values are substituted before solving (see
`needs_specialization`), since the solver cannot divide by an unknown stride.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import attrs
import halide as hl
import islpy as isl

from tcstage.errors import Span, TCPartitionError, TCRangeError
from tcstage.halide import solver
from tcstage.halide.exprs import DataDependent, constant, to_halide
from tcstage.halide.solver import Tree, evaluate, isl_name, tree_to_expr, tree_to_isl, tree_to_str
from tcstage.lang import checked as C

ZERO, ONE = ("int", 0), ("int", 1)


@attrs.frozen
class Range:
    """Inclusive bounds lo <= var <= hi, as trees over size variables."""

    lo: Tree
    hi: Tree

    def text(self, var: str) -> str:
        return f"{tree_to_str(self.lo)} <= {var} < {tree_to_str(simplify_tree(('add', self.hi, ONE)))}"

    def evaluate(self, values: Mapping[str, int]) -> tuple[int, int]:
        """Concrete half-open [begin, end)."""
        return evaluate(self.lo, values), evaluate(self.hi, values) + 1


@attrs.frozen
class TensorBounds:
    mins: tuple[Tree, ...]
    extents: tuple[Tree, ...]


@attrs.frozen
class Precondition:
    message: str
    span: Span | None = attrs.field(eq=False, default=None)


@attrs.frozen
class StatementRanges:
    tensor: str
    ranges: dict  # var -> Range, left-hand variables first
    span: Span | None = attrs.field(eq=False, default=None)
    # (read, dimension) pairs whose subscript a guard or `??` keeps within the tensor, so that
    # it did not constrain the ranges: lowering clamps them (the value under the guard does not
    # change, and Halide's bounds inference, which ignores guards, sees a finite region). A read
    # is numbered in the order of `checked.walk` over the right-hand side.
    clamped: frozenset = frozenset()


@attrs.frozen
class FunctionRanges:
    statements: tuple[StatementRanges, ...]
    tensors: dict  # name -> TensorBounds, inputs included
    preconditions: tuple[Precondition, ...]
    scalars: tuple  # (name, value) pairs the ranges were specialised on
    shaped_by: dict = attrs.field(factory=dict)  # tensor -> index of the statement shaping it


def needs_specialization(fn: C.Function) -> frozenset[str]:
    """Scalar inputs whose values range inference needs: those in subscripts or where bounds."""
    scalars = set(fn.scalar_inputs)
    used = set()
    for st in fn.statements:
        exprs = [a for n in C.walk(st.rhs) if isinstance(n, C.Read) for a in n.args]
        exprs += [x for a in st.scatter for x in (a, *(b for n in C.walk(a)
                                                       if isinstance(n, C.Read) for b in n.args))]
        exprs += [b for w in st.where for b in (w.lo, w.hi)]
        for e in exprs:
            used |= {n.name for n in C.walk(e) if isinstance(n, C.ScalarParam)} & scalars
    return frozenset(used)


def simplify_tree(tree: Tree, env: Mapping[str, hl.Expr] | None = None) -> Tree:
    """Halide's simplification of a tree (variables are free unless env binds them)."""
    env = env or {v: hl.Var(v) for v in solver.tree_vars(tree)}
    return solver.simplify(tree_to_expr(tree, env))


@attrs.frozen
class _Access:
    tensor: str
    dim: int
    arg: C.Expr
    span: Span | None
    variables: frozenset
    cond: hl.Expr | None  # None: the subscript depends on tensor values
    write: bool = False  # the statement's own left-hand side
    # A guarded read whose guard does not keep this subscript within the tensor (or not
    # provably): its text, and whether some condition of the guard could not be reasoned
    # about (it reads tensors, or is not affine). None for an unguarded access.
    guard: str | None = None
    undecided: bool = False
    # The subscript `v` of a `T(...) ?? value` read: it never narrows v's range, but where
    # nothing else bounds v, it gives v the extent of T's dimension (see `solve`).
    fallback: bool = False


def infer_ranges(fn: C.Function, scalars: Mapping[str, int] | None = None) -> FunctionRanges:
    scalars = dict(scalars or {})
    missing = needs_specialization(fn) - scalars.keys()
    if missing:
        raise TCRangeError(f"range inference for '{fn.name}' needs the value of scalar input"
                           f"{'s' if len(missing) > 1 else ''} {', '.join(sorted(missing))}, "
                           "which appear in subscripts or where clauses", fn.span)
    symbols: dict[str, hl.Expr] = {s: hl.Expr(hl.Var(s)) for s in fn.size_vars}
    bounds: dict[str, TensorBounds] = {}
    for t in fn.tensors.values():
        if t.kind == "input" or t.inout:
            symbols.update({d: hl.Expr(hl.Var(d)) for d in t.dims if not d.isdigit()})
            bounds[t.name] = TensorBounds((ZERO,) * t.rank, tuple(
                ("int", int(d)) if d.isdigit() else ("var", d) for d in t.dims))
    for s in fn.scalar_inputs:
        t = fn.tensors[s]
        symbols[s] = constant(scalars[s], t.type) if s in scalars else hl.Expr(hl.Var(s))
    preconditions: list[Precondition] = []
    statements = []
    shaped_by: dict[str, int] = {}  # tensor -> the statement its shape comes from
    assembling: dict[str, _Partition] = {}  # tensors whose pieces may still extend them
    finished: dict[str, C.Statement] = {}  # tensors whose shape a statement used -> it
    for n, st in enumerate(fn.statements):
        for t in [t for t in assembling if _reads(st, t)]:  # its shape is used: complete
            assembling.pop(t).check_complete(fn)
            finished[t] = st
        try:
            piece = False
            if st.tensor in finished and _may_extend(st):
                _not_after_read(fn, st, finished[st.tensor], symbols, bounds)
            if st.tensor not in bounds:
                shaped_by[st.tensor], bounds[st.tensor] = _shape_of(fn, n, symbols, bounds)
                piece = shaped_by[st.tensor] == n
            elif st.tensor in assembling and _may_extend(st) and \
                    (free := _unshaped(fn, st, symbols, bounds)) is not None:
                box = [free.ranges[v] for v in st.indices]
                piece = assembling[st.tensor].extends(box, st)
                if piece:  # the tensor is the union of its pieces: no statement alone shapes it
                    shaped_by.pop(st.tensor, None)
                    bounds[st.tensor] = assembling[st.tensor].bounds()
            # The statement a shape comes from is not constrained by that shape again.
            write_constrains = shaped_by.get(st.tensor) != n and not piece
            sr = _StatementInference(fn, st, symbols, bounds, preconditions,
                                     write_constrains).run()
            statements.append(sr)
            if piece and st.tensor not in assembling and not fn.tensors[st.tensor].inout:
                assembling[st.tensor] = _Partition(st.tensor, [(n, st, [sr.ranges[v] for v in
                                                                       st.indices])])
        except TCRangeError as error:
            raise _with_scalar_values(error, st, scalars, symbols) from None
    for partition in assembling.values():
        partition.check_complete(fn)
    return FunctionRanges(tuple(statements), bounds, tuple(preconditions),
                          tuple(sorted((k, v) for k, v in scalars.items())), shaped_by)


def _unshaped(fn: C.Function, st: C.Statement, symbols, bounds) -> StatementRanges | None:
    """st's ranges without its tensor's shape (as a further piece's), or None where they are
    not determined without it (`O(v, k) *=! B(v, k + x) where v in 0:2`: only O's shape
    bounds k): such a statement cannot be seen to reach outside the pieces, so it is an
    ordinary update, which the shape constrains (differential fuzz seed 20567 was rejected)."""
    try:
        return _StatementInference(fn, st, symbols, bounds, [], False).run()
    except TCRangeError:
        return None


def _reads(st: C.Statement, tensor: str) -> bool:
    """Whether st uses the values or the shape of tensor (a read, `T.n`, or an update of it
    that reads its old values)."""
    if st.tensor == tensor and st.reduction is not None and not st.init:
        return True
    exprs = [st.rhs, *st.scatter, *(b for w in st.where for b in (w.lo, w.hi))]
    return any(isinstance(x, (C.Read, C.DimOf)) and x.tensor == tensor
               for e in exprs for x in C.walk(e))


def _may_extend(st: C.Statement) -> bool:
    """Whether st may be a further piece of its tensor: a where clause gives one of its
    left-hand indices (others are updates, constrained by the tensor's shape as spec 001 says).
    """
    return any(w.var in st.indices for w in st.where)


@attrs.define
class _Partition:
    """The pieces of a tensor so far: (statement index, statement, left-hand box)."""

    tensor: str
    pieces: list

    def extends(self, box: list[Range], st: C.Statement) -> bool:
        """Whether box (the left-hand ranges of st) is a new piece: not within the pieces so
        far. A statement within them updates them; one that reaches outside them must not
        overlap them (TCPartitionError)."""
        try:
            union, new = self.union(), self.box_set([r for r in box])
        except (ValueError, isl.Error):  # bounds isl cannot read: an ordinary update
            return False
        if not self.escapes(new, union, box):
            return False
        common = new.intersect(union).intersect_params(self.large([box], new, union))
        if not common.is_empty():
            first = next(p for p in self.pieces
                         if not self.box_set(p[2]).intersect(new).is_empty())
            raise TCPartitionError(
                f"'{self.tensor}' is defined in pieces, and this statement's range "
                f"({_box_text(st, box)}) overlaps the piece '{_statement_text(first[1])}' "
                f"({_box_text(first[1], first[2])}){_example(common, st)} while it also "
                f"extends '{self.tensor}' beyond it", st.span,
                ("pieces of a tensor (statements whose where clauses write different parts of "
                 "it) must not overlap; a statement within the pieces before it updates them",))
        self.pieces.append((None, st, box))
        return True

    def escapes(self, new: isl.Set, union: isl.Set, box: list[Range]) -> bool:
        """Whether new reaches outside union for every size (large enough that each piece and
        new are non-empty): a statement within the pieces for some sizes (`O(i) = 0 where i in
        1:2` after `O(i) = X(i) where i in 0:N`, within for N >= 2) is an update, constrained
        by the shape as before, with a precondition where it is not within."""
        within = new.subtract(union).params().complement().intersect(
            self.large([box], new, union))
        return within.is_empty()

    def large(self, boxes, *sets: isl.Set) -> isl.Set:
        """The sizes at least twice every constant of the pieces' bounds (plus 2): sizes where
        no piece is empty by accident of being small."""
        params = []
        for st in sets:
            params += [st.get_dim_name(isl.dim_type.param, k)
                       for k in range(st.dim(isl.dim_type.param))]
        params = sorted(set(params))
        constants = [abs(t[1]) for box in [*boxes, *(p[2] for p in self.pieces)] for r in box
                     for t in _subtrees((r.lo, r.hi)) if t[0] == "int"]
        least = 2 * max(constants, default=0) + 2
        cond = " and ".join(f"{p} >= {least}" for p in params) or "true"
        return isl.Set(f"[{', '.join(params)}] -> {{ : {cond} }}")

    def bounds(self) -> TensorBounds:
        """The smallest box holding every piece."""
        rank = len(self.pieces[0][2])
        mins, extents = [], []
        for k in range(rank):
            lo, hi = self.pieces[0][2][k].lo, self.pieces[0][2][k].hi
            for _, _, box in self.pieces[1:]:
                lo, hi = ("min", lo, box[k].lo), ("max", hi, box[k].hi)
            lo = simplify_tree(lo)
            mins.append(lo)
            extents.append(simplify_tree(("add", ("sub", simplify_tree(hi), lo), ONE)))
        return TensorBounds(tuple(mins), tuple(extents))

    def check_complete(self, fn: C.Function) -> None:
        """The pieces must cover the box that holds them: an element no piece writes would be
        a silent 0."""
        if len(self.pieces) < 2:
            return
        try:
            union = self.union()
            hull = self.box_set([Range(lo, simplify_tree(("sub", ("add", lo, ext), ONE)))
                                 for lo, ext in zip(*attrs.astuple(self.bounds(), recurse=False))])
        except (ValueError, isl.Error):
            return
        holes = hull.subtract(union)
        holes = holes.intersect_params(self.large([], holes))
        if holes.is_empty():
            return
        last = self.pieces[-1][1]
        texts = "; ".join(f"'{_statement_text(st)}' ({_box_text(st, box)})"
                          for _, st, box in self.pieces)
        raise TCPartitionError(
            f"'{self.tensor}' is defined in pieces that leave elements no statement writes"
            f"{_example(holes, last)}: {texts}", last.span,
            ("the shape of a tensor defined in pieces is the smallest box holding them; add "
             "the missing piece, or widen a where clause",))

    def union(self) -> isl.Set:
        out = None
        for _, _, box in self.pieces:
            b = self.box_set(box)
            out = b if out is None else out.union(b)
        return out

    def box_set(self, box: list[Range]) -> isl.Set:
        names = {}
        for r in box:
            for t in (r.lo, r.hi):
                names.update({v: isl_name(v) for v in solver.tree_vars(t)})
        dims = [f"a{k}" for k in range(len(box))]
        conds = [f"{tree_to_isl(r.lo, names)} <= {d} <= {tree_to_isl(r.hi, names)}"
                 for d, r in zip(dims, box)]
        params = sorted(names.values())
        conds += [f"{p} >= 0" for p in params]
        return isl.Set(f"[{', '.join(params)}] -> {{ [{', '.join(dims)}] : "
                       f"{' and '.join(conds) or 'true'} }}")


def _subtrees(trees):
    stack = list(trees)
    while stack:
        t = stack.pop()
        yield t
        stack.extend(x for x in t[1:] if isinstance(x, tuple))


def _not_after_read(fn, st: C.Statement, reader: C.Statement, symbols, bounds) -> None:
    """A statement that would extend a tensor (a further piece) after another statement used
    its shape is an error: that statement saw a smaller tensor."""
    sr = _unshaped(fn, st, symbols, bounds)
    if sr is None:  # (an ordinary update)
        return
    box = [sr.ranges[v] for v in st.indices]
    b = bounds[st.tensor]
    shape = [Range(lo, simplify_tree(("sub", ("add", lo, ext), ONE)))
             for lo, ext in zip(b.mins, b.extents)]
    partition = _Partition(st.tensor, [(None, reader, shape)])
    try:
        escapes = partition.escapes(partition.box_set(box), partition.box_set(shape), box)
    except (ValueError, isl.Error):
        return
    if escapes and reader is st:  # (an update without '!' reads the elements it writes)
        raise TCPartitionError(
            f"this statement updates {st.tensor} outside its shape ({_box_text(st, shape)}), "
            f"which the statements before it set: an update reads {st.tensor}'s values where "
            "it writes, and there are none", st.span,
            (f"write those elements of {st.tensor} first, or start from nothing with "
             f"'{st.reduction}=!'" if st.reduction else
             f"write those elements of {st.tensor} first, or keep the update within the shape",))
    if escapes:
        raise TCPartitionError(
            f"this statement writes {st.tensor} outside its shape ({_box_text(st, shape)}) "
            f"after '{_statement_text(reader)}' used {st.tensor}: a tensor defined in pieces "
            "takes its shape from the pieces before its first use", st.span,
            (f"move this statement before '{_statement_text(reader)}'",))


def _box_text(st: C.Statement, box: list[Range]) -> str:
    return ", ".join(r.text(v) for v, r in zip(st.indices, box))


def _example(points: isl.Set, st: C.Statement) -> str:
    """ ' (at i = 1 for N = 3)': a point of the set, in the statement's index names."""
    try:
        point = points.sample_point()
        values = [point.get_coordinate_val(isl.dim_type.set, k).to_python()
                  for k in range(points.dim(isl.dim_type.set))]
        params = [(points.get_dim_name(isl.dim_type.param, k)[1:],
                   point.get_coordinate_val(isl.dim_type.param, k).to_python())
                  for k in range(points.dim(isl.dim_type.param))]
    except (isl.Error, AttributeError):
        return ""
    at = ", ".join(f"{v} = {x}" for v, x in zip(st.indices, values))
    sizes = ", ".join(f"{p} = {x}" for p, x in params)
    return f" (at {at}{' for ' + sizes if sizes else ''})"


def _with_scalar_values(error: TCRangeError, st: C.Statement, scalars: Mapping[str, int],
                        symbols) -> TCRangeError:
    """error, naming the values of the specialised scalar inputs the statement uses: a range
    that cannot be inferred for one value (a stride `s * i` with s = 0) is a property of
    the call, not of the TC."""
    exprs = [a for r in C.walk(st.rhs) if isinstance(r, C.Read) for a in r.args]
    exprs += [b for w in st.where for b in (w.lo, w.hi)]
    used = sorted({n.name for e in exprs for n in C.walk(e)
                   if isinstance(n, C.ScalarParam) and n.name in scalars})
    if not used:
        return error
    values = ", ".join(f"{s} = {scalars[s]}" for s in used)
    notes = []
    for e in exprs:
        if not any(isinstance(n, C.ScalarParam) and n.name in scalars for n in C.walk(e)):
            continue
        env = {**symbols, **{v: hl.Expr(hl.Var(v)) for v in st.variables}}
        try:
            remaining = solver.tree_vars(solver.simplify(to_halide(e, env)))
        except DataDependent:
            continue
        for v in sorted(C.free_vars(e) - remaining):
            notes.append(f"with {values}, the subscript '{_text(e)}' does not depend on '{v}'")
    return TCRangeError(f"{error.message} (for scalar input{'s' if len(used) > 1 else ''} "
                        f"{values} of this call)", error.span, (*notes, *error.notes))


def _lhs_bounds(st: C.Statement, sr: StatementRanges) -> TensorBounds:
    lhs = [sr.ranges[v] for v in st.indices]
    return TensorBounds(tuple(r.lo for r in lhs), tuple(
        _no_overflow(simplify_tree(("add", ("sub", r.hi, r.lo), ONE)), st) for r in lhs))


def _no_overflow(tree: Tree, st: C.Statement) -> Tree:
    """tree, unless Halide's simplifier folded a constant that overflows 32 bits in it (its
    marker is a call to `signed_integer_overflow`, which no later step can use)."""
    if _has_call(tree, "signed_integer_overflow"):
        raise TCRangeError("the index arithmetic of this statement overflows 32-bit integers",
                           st.span, ("subscripts, where bounds and the ranges and extents they "
                                     "give are 32-bit integers, as in Halide",))
    return tree


def _has_call(tree: Tree, name: str) -> bool:
    stack = [tree]  # (no recursion: trees are as deep as the TC's expressions)
    while stack:
        t = stack.pop()
        if t and t[0] == "call" and t[1] == name:
            return True
        stack.extend(x for x in t[1:] if isinstance(x, tuple))
    return False


def _shape_of(fn: C.Function, first: int, symbols, bounds) -> tuple[int, TensorBounds]:
    """The shape of the tensor that statement `first` defines first.

    It comes from the ranges of that statement's left-hand variables. Where that statement
    cannot bound them (the paper's `O1(b,n) = B1(n)` before `O1(b,n) += I(b,m) * W1(n,m)`),
    the first later statement of the same tensor that can gives the shape, and the earlier
    statements are inferred against it. This only accepts programs the per-statement rule
    rejects; it never changes a range that rule infers. A statement into the tensor's float32
    accumulator (lang/accumulate.py: the `+=` of a half MLP1 now writes `O1_acc`) counts as one
    of the tensor's own.
    """
    st = fn.statements[first]
    try:
        return first, _lhs_bounds(st, _StatementInference(fn, st, symbols, bounds, []).run())
    except TCRangeError as error:
        for n, later in enumerate(fn.statements[first + 1:], start=first + 1):
            # (a scatter, `O(b, 1) += ...`, has no left-hand variable per dimension to give
            # a shape: its box had too few dimensions, an IndexError later)
            own = later.tensor == st.tensor or \
                fn.tensors[later.tensor].accumulates == st.tensor
            if not own or later.scatter:
                continue
            try:
                sr = _StatementInference(fn, later, symbols, bounds, []).run()
            except TCRangeError:
                continue
            return n, _lhs_bounds(later, sr)
        raise error


@functools.lru_cache(maxsize=4096)
def _empty(text: str) -> bool:
    """Whether the isl set `text` is empty (False where isl cannot read it). Memoised: the
    analyses of one function ask the same question once per read of a tensor and once per
    pass (a convolution's gradient asked 84 questions, 12 of them distinct, 0.4 s of isl)."""
    try:
        return isl.Set(text).is_empty()
    except isl.Error:
        return False


class _StatementInference:
    def __init__(self, fn, st: C.Statement, symbols, bounds, preconditions,
                 write_constrains: bool = True):
        self.fn, self.st, self.bounds, self.preconditions = fn, st, bounds, preconditions
        self.write_constrains = write_constrains
        self.padded_vars: set[str] = set()  # variables in the subscripts of `T(...) ?? v` reads
        self.env = dict(symbols)
        self.env.update({v: hl.Expr(hl.Var(v)) for v in st.variables})

    def dim(self, e: C.DimOf) -> hl.Expr:
        return tree_to_expr(self.bounds[e.tensor].extents[e.dim], self.env)

    def tree(self, e: hl.Expr) -> Tree:
        return _no_overflow(solver.simplify(e), self.st)

    def expr(self, tree: Tree) -> hl.Expr:
        return tree_to_expr(_no_overflow(tree, self.st), self.env)

    def accesses(self, where: Mapping[str, Range]) -> tuple[list[_Access], frozenset]:
        """The accesses that constrain the ranges, and the (read, dimension) pairs that a guard
        keeps within their tensor (see `StatementRanges.clamped`)."""
        st = self.st
        # Reads of a tensor still without a shape (the one being shaped) constrain nothing.
        guarded = C.guarded_reads(st.rhs)
        guarded += [g for a in st.scatter for g in C.guarded_reads(a)]  # (after the rhs's)
        reads = [(n, g) for n, g in enumerate(guarded)
                 if g.read.args and g.read.tensor in self.bounds]
        written = None
        if st.tensor in self.bounds and self.write_constrains:  # the write, given a shape
            lhs_args = st.lhs_args
            written = C.GuardedRead(
                C.Read(st.tensor, lhs_args, self.fn.tensors[st.tensor].type, span=st.span), (),
                False)
            reads.append((-1, written))
        out, clamped = [], set()
        for n, g in reads:
            r = g.read
            b = self.bounds[r.tensor]
            write = g is written
            premises, undecided = self.guard_premises(g.guards, where) if g.guards else \
                (None, False)
            guard_text = " && ".join(_guard_text(x) for x in g.guards) if g.guards else None
            for k, arg in enumerate(r.args):
                variables = frozenset(C.free_vars(arg))
                if g.padded:  # `??`: the read happens only within the tensor
                    clamped.add((n, k))
                    self.padded_vars |= variables
                    if isinstance(arg, C.IndexVar):
                        x = self.env[arg.name]
                        lo = self.expr(b.mins[k])
                        hi = lo + self.expr(b.extents[k]) - 1
                        out.append(_Access(r.tensor, k, arg, r.span, variables,
                                           (lo <= x) & (x <= hi), fallback=True))
                    continue
                try:
                    x = to_halide(arg, self.env, dim=self.dim)
                except DataDependent:
                    out.append(_Access(r.tensor, k, arg, r.span, variables, None, write))
                    continue
                lo = self.expr(b.mins[k])
                hi = self.expr(b.mins[k]) + self.expr(b.extents[k]) - 1
                sides = [lo <= x, x <= hi]
                if g.guards or _clamps(arg):  # (`I(max(min(x, H - 1), 0))` is always within I)
                    if premises is None:
                        premises, undecided = self.guard_premises(g.guards, where)
                    sides = [c for c in sides if not self.implied(premises, c)]
                if len(sides) < 2:
                    clamped.add((n, k))
                if not sides:
                    continue
                cond = sides[0] if len(sides) == 1 else sides[0] & sides[1]
                out.append(_Access(r.tensor, k, arg, r.span, variables, cond, write,
                                   guard_text, undecided and bool(g.guards)))
        return out, frozenset(clamped)

    def guard_premises(self, guards, where: Mapping[str, Range]) -> tuple[list[str], bool]:
        """The guards' conditions in isl's syntax, with the where clause's ranges (the other
        facts that hold wherever the statement runs), and whether some condition of the guards
        could not be used (it reads tensor values, or is not affine)."""
        premises, undecided = [], False
        for v, r in where.items():
            premises.append(self.isl_condition((self.expr(r.lo) <= self.env[v])
                                               & (self.env[v] <= self.expr(r.hi))))
        for g in guards:
            for c in C.conjuncts(g):
                try:
                    e = to_halide(c.cond, self.env, dim=self.dim)
                    text = self.isl_condition(e if e.type() == hl.Bool() else e != 0)
                except (DataDependent, ValueError):
                    undecided = True
                    continue
                premises.append(text if c.holds else f"not {text}")
        return [p for p in premises if p is not None], undecided

    def isl_condition(self, e: hl.Expr) -> str | None:
        """e (boolean) in isl's syntax; raises ValueError where it is not affine."""
        tree = solver.simplify(e)
        return "(" + tree_to_isl(tree, {v: isl_name(v) for v in solver.tree_vars(tree)}) + ")"

    def implied(self, premises: list[str], side: hl.Expr) -> bool:
        """Whether the premises imply side for every value of the variables and every
        non-negative size (isl decides it exactly)."""
        try:
            conclusion = self.isl_condition(side)
        except ValueError:
            return False
        text = " and ".join(premises) or "true"
        names = set(re.findall(r"\b_[A-Za-z0-9_]*", f"{text} {conclusion}"))
        sizes = {isl_name(d) for d in self.size_symbols()}
        nonneg = [f"{n} >= 0" for n in sorted(names & sizes)]
        return _empty(f"[{', '.join(sorted(names))}] -> {{ [] : "
                      f"{' and '.join([*nonneg, text])} and not {conclusion} }}")

    def size_symbols(self) -> set[str]:
        """The names that stand for sizes (size variables, in/out outputs' `T.n`)."""
        out = set(self.fn.size_vars)
        for t in self.fn.tensors.values():
            out |= {d for d in t.dims if d and not d.isdigit()}
        return out

    def run(self) -> StatementRanges:
        st = self.st
        where: dict[str, Range] = {}
        for w in st.where:
            lo = self.tree(to_halide(w.lo, self.env, dim=self.dim))
            hi = self.tree(to_halide(w.hi, self.env, dim=self.dim) - 1)
            where[w.var] = Range(lo, hi)
        accesses, clamped = self.accesses(where)
        known, used = self.solve(accesses, where)
        self.check_guards(accesses, where, known, used)
        self.check_preconditions(accesses, used, known)
        for r in known.values():
            for bound in (r.lo, r.hi):
                _no_overflow(bound, st)
        return StatementRanges(st.tensor, {v: known[v] for v in st.variables}, span=st.span,
                               clamped=clamped)

    def solve(self, accesses, where, skip=frozenset()) -> tuple[dict, set]:
        """The rounds of spec 001 over the accesses (but those in `skip`): the ranges, and the
        accesses that gave them."""
        st = self.st
        known: dict[str, Range] = dict(where)
        used: set[int] = set()
        unresolved = [v for v in st.variables if v not in known]
        fallback = False  # a round that resolves nothing tries the `??` reads' plain subscripts
        while unresolved:
            found: dict[str, list] = {}
            for n, a in enumerate(accesses):
                free = [v for v in a.variables if v not in known]
                if a.cond is None or len(free) != 1 or n in skip or a.fallback != fallback:
                    continue
                v = free[0]
                cond = a.cond
                domain = {x: (self.expr(known[x].lo), self.expr(known[x].hi))
                          for x in a.variables if x in known}
                if domain:
                    cond = self.expr(solver.and_over_domain(cond, domain))
                solution = solver.solve_inner_interval(cond, v)
                if (solution.lo, solution.hi) == (ONE, ZERO):  # the solver's "no interval"
                    raise TCRangeError(
                        f"range inference cannot solve the subscript '{_text(a.arg)}' of "
                        f"{a.tensor} for '{v}' (it is not linear in '{v}', or never in bounds)",
                        a.arg.span or a.span, (f"add a where clause such as 'where {v} in 0:N'",))
                found.setdefault(v, []).append((solution, a))
                used.add(n)
            if not found:
                if not fallback:
                    fallback = True
                    continue
                raise self.unresolvable(unresolved, accesses, known)
            fallback = False
            for v, solutions in found.items():
                known[v] = self.intersect(v, solutions)
            unresolved = [v for v in unresolved if v not in known]
        return known, used

    def check_guards(self, accesses, where, known, used) -> None:
        """A guarded read whose guard does not (provably) keep it within its tensor constrains
        the ranges as an unguarded read does. Where that narrows a range that the other
        accesses would make wider, the user most likely meant the guard to protect the read: a
        warning names the read, its guard and the statement, never a silent change. (A read
        that alone gives a range, as `h >= 1 ? I(h - 1) : 0` gives h's upper bound, narrows
        nothing.)"""
        groups: dict[tuple, set[int]] = {}  # the same read under the same guard, together
        for n in sorted(used):
            a = accesses[n]
            if a.guard is not None:
                groups.setdefault((a.tensor, a.dim, _text(a.arg), a.guard), set()).add(n)
        for ns in groups.values():
            try:
                wider, _ = self.solve(accesses, where, frozenset(ns))
            except TCRangeError:  # without it a range is unknown: the read gives that range
                continue
            a = accesses[min(ns)]
            vs = sorted(v for v in a.variables if v in known and v in wider and (
                simplify_tree(("sub", known[v].lo, wider[v].lo)) != ZERO
                or simplify_tree(("sub", known[v].hi, wider[v].hi)) != ZERO))
            if not vs:
                continue
            read = a.span.text() if a.span is not None else a.tensor
            why = ("tcstage cannot decide whether the guard keeps it within "
                   f"{a.tensor} (part of the guard reads tensor values or is not affine)"
                   if a.undecided else f"the guard does not keep it within {a.tensor}")
            ranges = ", ".join(known[v].text(v) for v in vs)
            wide = ", ".join(wider[v].text(v) for v in vs)
            self.preconditions.append(Precondition(
                f"in '{self.fn.name}', statement '{_statement_text(self.st)}': the read {read} "
                f"under the guard '{a.guard}' narrows {ranges} (the other accesses allow {wide}), "
                f"because {why}; write the guard so that it keeps every subscript within "
                f"{a.tensor}, or read '{a.tensor}(...) ?? 0', which is 0 outside {a.tensor}",
                a.span))

    def intersect(self, v: str, solutions) -> Range:
        los = [s.lo for s, _ in solutions if s.lo is not None]
        his = [s.hi for s, _ in solutions if s.hi is not None]
        if not his:
            _, a = solutions[0]
            raise TCRangeError(
                f"range inference found no upper bound for '{v}' from the subscript "
                f"'{_text(a.arg)}' of {a.tensor}", a.arg.span or a.span,
                (f"add a where clause such as 'where {v} in 0:N'",))
        lo = los[0] if los else ZERO  # index variables start at 0 unless told otherwise
        for x in los[1:]:
            lo = ("max", lo, x)
        hi = his[0]
        for x in his[1:]:
            hi = ("min", hi, x)
        return Range(self.tree(self.expr(lo)), self.tree(self.expr(hi)))

    def unresolvable(self, unresolved, accesses, known) -> TCRangeError:
        v = unresolved[0]
        span = self.st.var_spans.get(v, self.st.span)
        mentions = [a for a in accesses if v in a.variables]
        where = f"add a where clause such as 'where {v} in 0:N'"
        if not mentions:
            notes = [where]
            if v in self.padded_vars:
                notes.append(f"a read 'T(...) ?? v' never limits a range (outside T it gives "
                             f"v), so the range of '{v}' must come from another tensor or a "
                             "where clause")
            if self.st.first_definition and v in self.st.indices:
                notes.append(f"'{self.st.tensor}' takes its shape from its first statement, so "
                             "that statement must bound every left-hand index; start with the "
                             "statement that does (for example the reduction, with '+=!')")
            return TCRangeError(f"cannot infer the range of '{v}': it does not index any tensor "
                                "whose shape is known", span, tuple(notes))
        affine = [a for a in mentions if a.cond is not None]
        if not affine:
            a = mentions[0]
            return TCRangeError(
                f"cannot infer the range of '{v}': its subscript '{_text(a.arg)}' of {a.tensor} "
                "depends on tensor values, which are unknown until run time", span, (where,))
        others = sorted({x for a in affine for x in a.variables if x not in known and x != v})
        names = ", ".join(f"'{x}'" for x in unresolved)
        return TCRangeError(
            f"cannot infer the ranges of {names}: every subscript using "
            f"'{v}' (such as '{_text(affine[0].arg)}') also uses unresolved "
            f"{', '.join(repr(o) for o in others)}, so the range is ambiguous", span,
            (f"add a where clause for one of them, such as 'where {unresolved[-1]} in 0:N'",))

    def holds_for_all_sizes(self, condition: Tree) -> bool:
        """Whether condition holds for all non-negative sizes (Halide's interval reasoning
        cannot show N/2 <= N; isl decides such Presburger facts exactly)."""
        if condition[0] == "int":  # a constant: true or false
            return bool(condition[1])
        names = {v: isl_name(v) for v in solver.tree_vars(condition)}
        try:
            text = tree_to_isl(condition, names)
        except ValueError:  # not affine: leave it to the warning
            return False
        params = ", ".join(names.values())
        nonneg = " and ".join(f"{n} >= 0" for n in names.values()) or "true"
        # (a form isl does not read is not shown to hold: left to the warning)
        return _empty(f"[{params}] -> {{ [] : {nonneg} and not ({text}) }}")

    def check_preconditions(self, accesses, used, known) -> None:
        domain = {v: (self.expr(r.lo), self.expr(r.hi)) for v, r in known.items()}
        for n, a in enumerate(accesses):
            if n in used or a.fallback:  # (a `??` read is never outside its tensor)
                continue
            b = self.bounds[a.tensor]
            lo, ext = tree_to_str(b.mins[a.dim]), b.extents[a.dim]
            hi = tree_to_str(simplify_tree(("add", b.mins[a.dim], ext)))
            if a.cond is None:
                self.preconditions.append(Precondition(
                    f"in '{self.fn.name}', the subscript '{_text(a.arg)}' of {a.tensor} depends on "
                    f"tensor values, which must lie in [{lo}, {hi}); this is not checked", a.span))
                continue
            remaining = solver.and_over_domain(a.cond, {v: domain[v] for v in a.variables})
            if self.holds_for_all_sizes(remaining):
                continue
            self.preconditions.append(Precondition(
                f"in '{self.fn.name}', the {'write' if a.write else 'read'} of {a.tensor} at "
                f"subscript '{_text(a.arg)}' stays "
                f"within [{lo}, {hi}) only if {tree_to_str(remaining)}; this is not checked "
                "at compile time", a.span))


def _text(e: C.Expr) -> str:
    return e.span.text() if e.span is not None else repr(e)


def _clamps(e: C.Expr) -> bool:
    """Whether the subscript e uses min or max (it may clamp itself into its tensor)."""
    return any(isinstance(n, C.Call) and n.fn in ("min", "max") for n in C.walk(e))


def _guard_text(g: C.Guard) -> str:
    text = _outer_parentheses_off(_text(g.cond))
    return text if g.holds else f"!({text})"


def _outer_parentheses_off(text: str) -> str:
    """`(a && b)` -> `a && b` (a parenthesised expression's span includes its parentheses)."""
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for k, ch in enumerate(text):
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and k < len(text) - 1:
                return text  # `(a) && (b)`: the first bracket closes early
        text = text[1:-1].strip()
    return text


def _statement_text(st: C.Statement) -> str:
    return C.statement_text(st)
