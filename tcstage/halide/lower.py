"""Lowering a checked, range-inferred TC function to Halide Funcs.

Each tensor an statement defines becomes one `hl.Func`; each statement becomes the Func's pure
definition (the first statement) or an update (later ones, and the reduction after an
identity initialisation). Reduction variables become an `RDom` over their inferred ranges. A
later statement whose left-hand ranges cover only part of the tensor writes through RDom
variables, so exactly the inferred points are written.

This Func graph is the boundary to the polyhedral middle end, so it stays a faithful image of
the TC: no scheduling here.

Layout: TC is row-major and Halide lists dimensions innermost first. `_halide_order` is the
single place where subscripts are reversed; numpy arrays wrapped by `hl.Buffer` are reversed
the same way by Halide itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import halide as hl

from tcstage.halide.exprs import constant, halide_type, to_halide
from tcstage.halide.ranges import FunctionRanges, Range, simplify_tree
from tcstage.halide import solver
from tcstage.halide.solver import Tree, tree_to_expr, tree_to_str
from tcstage.lang import checked as C
from tcstage.lang.types import INT64, ScalarType


def _halide_order(args) -> tuple:
    return tuple(reversed(list(args)))


def storage_type(t: ScalarType) -> ScalarType:
    """Halide's Python buffers have no uint64; such tensors travel as int64 bit patterns."""
    return INT64 if t.name == "uint64" else t


@attrs.define(eq=False)
class Lowered:
    """The Halide image of one TC function (for one specialisation of its scalar inputs)."""

    fn: C.Function
    ranges: FunctionRanges
    params: dict  # input name -> hl.ImageParam (tensors) or hl.Param (scalars)
    inout_params: dict  # in/out output name -> hl.ImageParam holding the caller's values
    funcs: dict  # defined tensor name -> hl.Func
    outputs: list  # one hl.Func per output, in return order, in storage types
    order: list  # (tensor, definition index, TC statement index) in program order
    # per TC statement: the Halide names of its RDom variables -> its TC index names
    var_names: list

    def reference_text(self, statement: int, tensor: str, args: Sequence[Tree]) -> str:
        """`T(a, b)` as the TC statement reads or writes it, from Halide subscript trees (TC
        order): TC names for index variables, tensors and sizes (`A(m, kk)`, not
        `A(m, C_r$x)`). It also identifies a reference within its statement."""
        names = {**self.halide_names(), **self.size_symbols(), **self.var_names[statement]}
        return f"{tensor}(" + ", ".join(tree_to_str(_as_tc(a, names)) for a in args) + ")"

    def halide_names(self) -> dict[str, str]:
        """Tensor name for each Func or buffer name that Halide expressions read."""
        names = {f.name(): t for t, f in self.funcs.items()}
        for t, p in [*self.params.items(), *self.inout_params.items()]:
            if isinstance(p, hl.ImageParam):  # reads name its internal, uniquified Func
                names[hl.Func(p).name()] = t
        return names

    def size_symbols(self) -> dict[str, str]:
        """TC size symbol (`N`, or `C.0` for an in/out output) for each Halide extent symbol."""
        symbols = {}
        for t, p in [*self.params.items(), *self.inout_params.items()]:
            dims = self.fn.tensors[t].dims
            for k, d in enumerate(dims):
                symbols[f"{p.name()}.extent.{len(dims) - 1 - k}"] = d
        return symbols

    def describe(self) -> str:
        """Human-readable definitions of every Func, in statement order."""
        def text(e) -> str:
            return tree_to_str(solver.to_tree(e))

        lines = []
        for name, f in self.funcs.items():
            t = self.fn.tensors[name]
            lines.append(f"Func {name} ({t.kind}, {t.type}), arguments innermost first:")
            args = ", ".join(a.name() for a in f.args())
            lines.append(f"  {name}({args}) = {text(f.value())}")
            for k in range(f.num_update_definitions()):
                upd = ", ".join(text(a) for a in f.update_args(k))
                lines.append(f"  {name}({upd}) = {text(f.update_value(k))}")
        return "\n".join(lines)


def lower(fn: C.Function, ranges: FunctionRanges, scalars: Mapping[str, int] | None = None
          ) -> Lowered:
    scalars = dict(scalars or {})
    params, symbols = {}, {}
    for t in fn.inputs:
        st = storage_type(t.type)
        if t.rank == 0:
            params[t.name] = hl.Param(halide_type(st), t.name)
            symbols[t.name] = constant(scalars[t.name], t.type) if t.name in scalars \
                else _load(params[t.name], t.type)
            continue
        p = hl.ImageParam(halide_type(st), t.rank, t.name)
        params[t.name] = p
        for k, d in enumerate(t.dims):
            if not d.isdigit():
                symbols.setdefault(d, p.dim(t.rank - 1 - k).extent())
    inout_params = {}
    for t in fn.tensors.values():
        if t.inout:
            p = hl.ImageParam(halide_type(storage_type(t.type)), t.rank, f"{t.name}_in")
            inout_params[t.name] = p
            for k, d in enumerate(t.dims):
                symbols[d] = p.dim(t.rank - 1 - k).extent()
    funcs: dict[str, hl.Func] = {}
    order: list[tuple[str, int, int]] = []
    var_names: list[dict[str, str]] = []
    for n, (st, sr) in enumerate(zip(fn.statements, ranges.statements)):
        shapes_tensor = ranges.shaped_by.get(st.tensor) == n or fn.tensors[st.tensor].inout \
            and st.first_definition
        before = funcs[st.tensor].num_update_definitions() + 1 if st.tensor in funcs else 0
        var_names.append(_lower_statement(fn, st, sr, ranges, params, inout_params, funcs,
                                          symbols, shapes_tensor))
        after = funcs[st.tensor].num_update_definitions() + 1
        order += [(st.tensor, k, n) for k in range(before, after)]
    outputs = []
    for name in fn.outputs:
        f = funcs[name]
        if fn.tensors[name].type.name == "uint64":
            view = hl.Func(f"{name}_bits")
            view[f.args()] = hl.reinterpret(hl.Int(64), f[f.args()])
            f = view
        outputs.append(f)
    return Lowered(fn, ranges, params, inout_params, funcs, outputs, order, var_names)


def _load(value: hl.Expr | hl.Param, t: ScalarType) -> hl.Expr:
    e = value if isinstance(value, hl.Expr) else hl.Expr(value)
    return hl.reinterpret(hl.UInt(64), e) if t.name == "uint64" else e


def _identity(op: str, t: ScalarType) -> hl.Expr:
    ht = halide_type(t)
    if op == "+":
        return constant(0, t)
    if op == "*":
        return constant(1, t)
    # Halide's float max()/min() are the infinities: true identities of min and max.
    return ht.max() if op == "min" else ht.min()


def _combine(op: str, a: hl.Expr, b: hl.Expr) -> hl.Expr:
    return {"+": lambda: a + b, "*": lambda: a * b,
            "min": lambda: hl.min(a, b), "max": lambda: hl.max(a, b)}[op]()


def _lower_statement(fn, st: C.Statement, sr, ranges: FunctionRanges, params, inout_params,
                     funcs, symbols, shapes_tensor: bool) -> dict[str, str]:
    """Adds the statement's definitions to its Func; returns the Halide names of its RDom
    variables -> their TC names."""
    tensor = fn.tensors[st.tensor]
    bounds = ranges.tensors[st.tensor]

    def tree(t: Tree) -> hl.Expr:
        return tree_to_expr(t, symbols)

    if st.first_definition:
        funcs[st.tensor] = hl.Func(st.tensor)
        pure = [hl.Var(v) for v in st.indices]
    else:
        pure = [hl.Var(a.name()) for a in _halide_order(funcs[st.tensor].args())]
    func = funcs[st.tensor]

    # Left-hand variables that cover the whole tensor stay pure (parallel) Vars; others are
    # RDom variables limited to the statement's range.
    names: dict[str, hl.Expr] = dict(symbols)
    partial = [] if shapes_tensor else [
        v for k, v in enumerate(st.indices)
        if not _covers(sr.ranges[v], bounds.mins[k], bounds.extents[k])]
    lhs_rdom = _rdom([sr.ranges[v] for v in partial], tree, f"{st.tensor}_lhs") if partial else None
    rvars = [v for v in st.reduction_vars]
    full_rdom = _rdom([sr.ranges[v] for v in partial + rvars], tree, f"{st.tensor}_r") \
        if partial or rvars else None
    lhs_args = []
    for k, v in enumerate(st.indices):
        if v in partial:
            lhs_args.append(full_rdom[partial.index(v)])
        else:
            lhs_args.append(pure[k])
        names[v] = hl.Expr(lhs_args[-1])
    for j, v in enumerate(rvars):
        names[v] = hl.Expr(full_rdom[len(partial) + j])
    rdom_names = {full_rdom[j].name(): v for j, v in enumerate(partial + rvars)} \
        if full_rdom is not None else {}
    if lhs_rdom is not None:
        rdom_names.update({lhs_rdom[j].name(): v for j, v in enumerate(partial)})

    def read(r: C.Read, args: list[hl.Expr]) -> hl.Expr:
        b = ranges.tensors[r.tensor]
        args = [_clamp_if_data_dependent(a, x, b.mins[k], b.extents[k], tree)
                for k, (a, x) in enumerate(zip(r.args, args))]
        if r.tensor in params:
            return _load(params[r.tensor][_halide_order(args)], fn.tensors[r.tensor].type)
        if r.tensor == st.tensor and st.first_definition:  # an in/out output's old values
            return _load(inout_params[r.tensor][_halide_order(args)], tensor.type)
        return funcs[r.tensor][_halide_order(args)]

    def dim(d: C.DimOf) -> hl.Expr:
        return tree(ranges.tensors[d.tensor].extents[d.dim])

    rhs = to_halide(st.rhs, names, read=read, dim=dim)
    lhs = _halide_order(lhs_args)
    pure_lhs = _halide_order(pure)
    if st.first_definition:
        if st.reduction is None:
            func[pure_lhs] = rhs
            return rdom_names
        if st.init:
            func[pure_lhs] = _identity(st.reduction, tensor.type)
        else:
            func[pure_lhs] = _load(inout_params[st.tensor][pure_lhs], tensor.type)
    elif st.init and st.reduction is not None:
        init_lhs = _halide_order([lhs_rdom[partial.index(v)] if v in partial else pure[k]
                                  for k, v in enumerate(st.indices)])
        func[init_lhs] = _identity(st.reduction, tensor.type)
    if st.reduction is None:
        func[lhs] = rhs
    else:
        func[lhs] = _combine(st.reduction, func[lhs], rhs)
    return rdom_names


def _as_tc(tree: Tree, names: Mapping[str, str]) -> Tree:
    """tree as the TC writes it: variables and read Funcs renamed by `names` (others kept),
    the subscripts of reads in TC order (Halide lists them innermost first)."""
    if not isinstance(tree, tuple) or not tree:
        return tree
    if tree[0] == "var":
        return ("var", names.get(tree[1], tree[1]))
    if tree[0] == "read":
        return ("read", names.get(tree[1], tree[1]),
                tuple(_as_tc(a, names) for a in reversed(tree[2])))
    return tuple(_as_tc(t, names) if isinstance(t, tuple) else t for t in tree)


def _covers(r: Range, lo: Tree, extent: Tree) -> bool:
    """Whether the statement's range is provably the whole extent of the tensor."""
    hi = ("sub", ("add", lo, extent), ("int", 1))
    return simplify_tree(("sub", r.lo, lo)) == ("int", 0) \
        and simplify_tree(("sub", r.hi, hi)) == ("int", 0)


def _rdom(rs: list[Range], tree, name: str) -> hl.RDom:
    return hl.RDom([hl.Range(tree(r.lo), tree(r.hi) - tree(r.lo) + 1) for r in rs], name)


def _clamp_if_data_dependent(arg: C.Expr, x: hl.Expr, lo: Tree, extent: Tree, tree) -> hl.Expr:
    """Subscripts computed from tensor values are clamped into the tensor: TC leaves an
    out-of-range value undefined, and clamping keeps that from reading outside memory (it also
    gives Halide's bounds inference a finite region)."""
    if not C.has_read(arg):
        return x
    return hl.clamp(x, tree(lo), tree(lo) + tree(extent) - 1)
