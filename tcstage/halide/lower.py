"""Lowering a checked, range-inferred TC function to Halide Funcs.

Each tensor a statement defines becomes one `hl.Func`; each statement becomes the Func's pure
definition (the first statement) or an update (later ones, and the reduction after an
identity initialisation). Reduction variables become an `RDom` over their inferred ranges. A
statement whose left-hand ranges cover only part of the tensor writes through RDom variables,
so exactly the inferred points are written; when it is the tensor's first, a pure definition
before it gives the other points the caller's values (an in/out output) or 0.

Halide freezes a Func once another Func reads it, while TC lets a statement update a tensor
that earlier statements read (they see it before the update). Such an update starts a new
*version* of the tensor: a new Func whose pure definition copies the previous one. A statement
that overwrites the whole tensor without reading it (`=`, or a reduction with `!`) starts a
version of its own, without the copy. The versions share the tensor's storage in the
polyhedral model (`Lowered.definitions` leaves the copies out), so only the CPU pipeline sees
them.

Reads that Halide's simplifier removes (`0 * A(i)`, a branch of `l < l ? A(l) : B(j)`) are
left out of the definition: Halide's bounds inference gives them no region, and the
Mullapudi2016 autoscheduler fails on a Func with none.

This Func graph is the boundary to the polyhedral middle end, so it stays a faithful image of
the TC: no scheduling here.

Layout: TC is row-major and Halide lists dimensions innermost first. `_halide_order` is the
single place where subscripts are reversed; numpy arrays wrapped by `hl.Buffer` are reversed
the same way by Halide itself.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence

import attrs
import halide as hl
import numpy as np

from tcstage.errors import TCError
from tcstage.halide.exprs import constant, halide_type, to_halide
from tcstage.halide.ranges import FunctionRanges, Range, simplify_tree
from tcstage.halide import _native, solver
from tcstage.halide.solver import Tree, tree_to_expr, tree_to_str
from tcstage.lang import checked as C
from tcstage.lang.types import FLOAT32, FLOAT64, INT64, ScalarType


# What the Halide bindings raise when Halide refuses something (its own errors, and pybind11's
# conversions of arguments it cannot represent).
HALIDE_FAILURES = (hl.HalideError, RuntimeError, TypeError, ValueError, OverflowError)


def _halide_order(args) -> tuple:
    return tuple(reversed(list(args)))


def storage_type(t: ScalarType) -> ScalarType:
    """Halide's Python buffers have no uint64; such tensors travel as int64 bit patterns."""
    return INT64 if t.name == "uint64" else t


@attrs.frozen(eq=False)
class Version:
    """One Func of a tensor. A statement that updates a tensor another Func has read starts a
    version whose pure definition copies the previous one; a statement that overwrites the
    whole tensor without reading it starts one of its own."""

    func: hl.Func
    copies_previous: bool


@attrs.define(eq=False)
class Lowered:
    """The Halide image of one TC function (for one specialisation of its scalar inputs)."""

    fn: C.Function
    ranges: FunctionRanges
    params: dict  # input name -> hl.ImageParam (tensors) or hl.Param (scalars)
    inout_params: dict  # in/out output name -> hl.ImageParam holding the caller's values
    funcs: dict  # defined tensor name -> hl.Func (its last version)
    outputs: list  # one hl.Func per output, in return order, in storage types
    # (tensor, index in definitions(tensor), TC statement index) in program order
    order: list
    # per TC statement: the Halide names of its RDom variables -> its TC index names
    var_names: list
    versions: dict  # defined tensor name -> its Versions, oldest first (the last: funcs[name])
    pads: tuple = ()  # CPU: the Funcs of padded inputs (`T(...) ?? 0`), Halide's constant_exterior
    pad_strides: dict = attrs.Factory(dict)  # pad Func name -> (input, the stride it is split
    #                                           by: `_lower_statement`'s `padded_input`)
    absent: frozenset = frozenset()  # inputs lowered as having no elements (`lower`)

    def definitions(self, tensor: str) -> list[dict]:
        """The tensor's definitions as plain data (`_native.func_definitions`), in program
        order over its versions, without the copies that start a later version."""
        out = []
        for v in self.versions[tensor]:
            out += _native.func_definitions(v.func)["definitions"][int(v.copies_previous):]
        return out

    def reference_text(self, statement: int, tensor: str, args: Sequence[Tree]) -> str:
        """`T(a, b)` as the TC statement reads or writes it, from Halide subscript trees (TC
        order): TC names for index variables, tensors and sizes (`A(m, kk)`, not
        `A(m, C_r$x)`). It also identifies a reference within its statement."""
        names = {**self.halide_names(), **self.size_symbols(), **self.var_names[statement]}
        return f"{tensor}(" + ", ".join(tree_to_str(_as_tc(a, names)) for a in args) + ")"

    def halide_names(self) -> dict[str, str]:
        """Tensor name for each Func or buffer name that Halide expressions read."""
        names = {v.func.name(): t for t, vs in self.versions.items() for v in vs}
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
        for name, versions in self.versions.items():
            t = self.fn.tensors[name]
            for k, f in enumerate(v.func for v in versions):
                version = f", version {k + 1}" if k else ""
                lines.append(f"Func {name} ({t.kind}, {t.type}){version}, arguments innermost "
                             "first:")
                args = ", ".join(a.name() for a in f.args())
                lines.append(f"  {name}({args}) = {text(f.value())}")
                for u in range(f.num_update_definitions()):
                    upd = ", ".join(text(a) for a in f.update_args(u))
                    lines.append(f"  {name}({upd}) = {text(f.update_value(u))}")
        return "\n".join(lines)


def lower(fn: C.Function, ranges: FunctionRanges, scalars: Mapping[str, int] | None = None,
          cpu: bool = False, rounded: Mapping[tuple[str, str], int] | None = None,
          absent: frozenset = frozenset()) -> Lowered:
    """The Halide Funcs of `fn`. `cpu`: for the CPU back end alone, whose builtins may take
    forms Halide vectorises there but the CUDA printer would not print as CUDA's own functions
    (exprs.to_halide's `cpu`). `rounded`: (tensor, reduction index) -> a multiple its loop
    runs to (the CPU scheduler's request, `RoundedRows`; see `_lower_statement`). `absent`:
    inputs the call passes with no elements. No element of one is ever read, so its reads are
    the padding value (`T(i) ?? v`) or, never evaluated, 0: Halide's bounds inference wants at
    least the one element a padded or clamped read is clamped to, which an empty buffer lacks."""
    scalars = dict(scalars or {})
    params, symbols = {}, {}
    for t in fn.inputs:
        st = storage_type(t.type)
        if t.rank == 0:
            # Halide's Python Param.set rounds every float through float32, so a double travels
            # as its int64 bit pattern (set_scalar), reinterpreted here; a Callable takes no
            # half or bfloat16 argument, so those travel as float32 (exactly), cast here.
            params[t.name] = hl.Param(halide_type(_param_type(t.type)), t.name)
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
    pads: dict[tuple, hl.Func] = {}  # (tensor, padding value, stride) -> its padded Func
    versions: dict[str, list[Version]] = {}
    listed: dict[str, int] = {}  # tensor -> its definitions in `order` so far
    read_by_others: set[str] = set()  # tensors whose current Func another Func reads
    order: list[tuple[str, int, int]] = []
    var_names: list[dict[str, str]] = []
    for n, (st, sr) in enumerate(zip(fn.statements, ranges.statements)):
        partial = [] if ranges.shaped_by.get(st.tensor) == n else _partial_vars(
            st, sr, ranges.tensors[st.tensor])
        fresh = st.first_definition or not partial and _overwrites(st)
        if fresh:
            funcs[st.tensor] = hl.Func(st.tensor)
            versions.setdefault(st.tensor, []).append(Version(funcs[st.tensor], False))
        elif st.tensor in read_by_others:  # Halide would refuse the update: a new version
            funcs[st.tensor] = _next_version(funcs[st.tensor], st.tensor)
            versions[st.tensor].append(Version(funcs[st.tensor], True))
        read_by_others.discard(st.tensor)  # funcs[st.tensor] is not read yet
        folded = cpu and _folds(st, partial, funcs[st.tensor])
        before = 0 if folded else _count_definitions(funcs[st.tensor])
        try:
            rdom_names, reads = _lower_statement(fn, st, sr, ranges, params, inout_params,
                                                 funcs, symbols, partial, fresh, cpu, pads,
                                                 folded, {v: m for (t, v), m in
                                                          (rounded or {}).items()
                                                          if t == st.tensor}, absent)
        except HALIDE_FAILURES as e:
            raise TCError(f"internal error lowering '{fn.name}' to Halide, at statement "
                          f"{n + 1}: {str(e).strip()}", st.span) from e
        var_names.append(rdom_names)
        if folded:  # (one Func holds the tensor's value so far: it replaces the last version)
            versions[st.tensor][-1] = Version(funcs[st.tensor], False)
        read_by_others |= reads - {st.tensor}
        added = _count_definitions(funcs[st.tensor]) - before
        order += [(st.tensor, listed.get(st.tensor, 0) + k, n) for k in range(added)]
        listed[st.tensor] = listed.get(st.tensor, 0) + added
    outputs = []
    for name in fn.outputs:
        f = funcs[name]
        if fn.tensors[name].type.name == "uint64":
            view = hl.Func(f"{name}_bits")
            view[f.args()] = hl.reinterpret(hl.Int(64), f[f.args()])
            f = view
        outputs.append(f)
    return Lowered(fn, ranges, params, inout_params, funcs, outputs, order, var_names,
                   versions, tuple(pads.values()),
                   {f.name(): (t, stride) for (t, _, stride, _), f in pads.items()},
                   frozenset(absent))


def _folds(st: C.Statement, partial: list[str], func: hl.Func) -> bool:
    """Whether the statement's accumulation is folded into its tensor's pure definition (CPU):
    it combines one value into each point of the whole tensor (no reduction indices, no
    `where` narrower than the tensor, no scatter, no read of the tensor itself), and the
    tensor's Func has no updates yet: `d_E(n,c) +=! a` then `d_E(n,c) += b` become
    `d_E(n,c) = (0 + a) + b`, the same operations in the same order. Each update is a pass of
    its own over the tensor on the CPU (a softmax gradient's d_E and d_X took 1.5x the time of
    the folded ones); the CUDA path keeps one definition per statement (its scop)."""
    return st.reduction is not None and not st.reduction_vars and not partial and \
        not st.scatter and (not func.defined() or func.num_update_definitions() == 0) and \
        (st.init or func.defined()) and \
        not any(isinstance(r, C.Read) and r.tensor == st.tensor for r in C.walk(st.rhs))


def _inner_indices(st: C.Statement) -> frozenset[str]:
    """The indices of a statement's innermost loops as the CPU scheduler orders them (and
    vectorises them): its last left-hand index and its reduction indices."""
    return frozenset(st.indices[-1:] + st.reduction_vars)


def _reciprocals(e: C.Expr, inner: frozenset[str]) -> C.Expr:
    """e with each floating-point `a / b` whose divisor does not change along the `inner`
    indices written `a * (1 / b)`: Halide computes the reciprocal once, outside those loops
    (or folds it), where a division per element cost more than the rest of a layer norm's
    arithmetic (`X(n,c) / C`: 0.058 -> 0.039 ms at 256x512). The product is within about
    1.5 ulp of the quotient rather than correctly rounded: docs/cpu.md. Read nodes are kept
    as they are (StatementRanges identifies them)."""
    parts = C.children(e)
    new = tuple(_reciprocals(c, inner) for c in parts)
    if any(a is not b for a, b in zip(new, parts)):
        e = C.with_children(e, new)
    if isinstance(e, C.Binary) and e.op == "/" and e.type.is_float and \
            not C.free_vars(e.rhs) & inner and not _power_of_two(e.rhs):
        one = C.Const(1, e.type)
        return C.Binary("*", e.lhs, C.Binary("/", one, e.rhs, e.type), e.type)
    return e


def _power_of_two(e: C.Expr) -> bool:
    """A constant divisor whose reciprocal is exact: Halide already multiplies by it."""
    e = e.operand if isinstance(e, C.Cast) else e
    if not isinstance(e, C.Const) or isinstance(e.value, bool) or e.value == 0:
        return False
    m, _ = math.frexp(abs(float(e.value)))
    return m == 0.5


def _count_definitions(f: hl.Func) -> int:
    return f.num_update_definitions() + 1 if f.defined() else 0


def _partial_vars(st: C.Statement, sr, bounds) -> list[str]:
    """The left-hand variables whose range may not cover the tensor's extent."""
    return [v for k, v in enumerate(st.indices)
            if not _covers(sr.ranges[v], bounds.mins[k], bounds.extents[k])]


def _overwrites(st: C.Statement) -> bool:
    """Whether the statement (covering its whole tensor) replaces every value without reading
    the old ones: then it needs no update of the tensor's Func, but can start a new one."""
    return st.init or st.reduction is None and not any(
        isinstance(r, C.Read) and r.tensor == st.tensor for r in C.walk(st.rhs))


def _next_version(f: hl.Func, tensor: str) -> hl.Func:
    """A new Func for `tensor`, starting as a copy of f (which other Funcs read)."""
    new = hl.Func(tensor)
    args = f.args()
    new[args] = f[args]
    return new


def _param_type(t: ScalarType) -> ScalarType:
    """The type a scalar input's Param has (see `lower`)."""
    return INT64 if t == FLOAT64 else FLOAT32 if t.is_narrow_float else storage_type(t)


def _load(value: hl.Expr | hl.Param, t: ScalarType) -> hl.Expr:
    e = value if isinstance(value, hl.Expr) else hl.Expr(value)
    if t == FLOAT64 and isinstance(value, hl.Param):
        return hl.reinterpret(hl.Float(64), e)
    if t.is_narrow_float and isinstance(value, hl.Param):
        return hl.cast(halide_type(t), e)
    return hl.reinterpret(hl.UInt(64), e) if t.name == "uint64" else e


def set_scalar(param: hl.Param, value, t: ScalarType) -> None:
    """Gives a scalar input's Param its value, exactly (see `lower`)."""
    param.set(scalar_argument(value, t))


def scalar_argument(value, t: ScalarType):
    """A scalar input's value as its Param carries it (see `lower`): a double as its int64 bit
    pattern, a uint64 as the int64 of the same bits, a half or bfloat16 as the float32 of its
    value rounded to its type, others as Python numbers."""
    if t == FLOAT64:
        return int(np.float64(value).view(np.int64))
    if t.is_narrow_float:
        return float(np.float32(t.numpy.type(value)))
    if t.name == "uint64":
        return int(np.int64(np.uint64(value)))
    return value.item() if isinstance(value, np.generic) else value


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
                     funcs, symbols, partial: list[str], fresh: bool, cpu: bool = False,
                     pads: dict | None = None, folded: bool = False,
                     rounded: Mapping[str, int] | None = None, absent: frozenset = frozenset()
                     ) -> tuple[dict[str, str], frozenset]:
    """Adds the statement's definitions to its tensor's Func (`fresh`: a Func without
    definitions yet). Left-hand variables that cover the whole tensor stay pure (parallel)
    Vars; the `partial` ones are RDom variables limited to the statement's range. Returns the
    Halide names of its RDom variables -> their TC names, and the tensors it reads. `pads`:
    the padded inputs' Funcs by (tensor, padding value), shared by the statements (CPU).
    `folded` (`_folds`): the statement's value is combined into a new Func's pure definition
    with the tensor's value so far (funcs[tensor] becomes that Func).
    `rounded`: reduction index -> m, for a reduction over the whole tensor: its loop runs to
    the next multiple of m, adding the identity past its range (a select: a blend per term,
    which Halide's loop partitioning kept in the full vectors too, `likely` or not). There
    it reads inputs through their padded Funcs (as `T(...) ?? 0`), dense buffers the scheduler
    computes, and other tensors with their subscripts clamped (lanes gathered). The CPU
    scheduler vectorises that loop by m lanes: its last vector then needs no mask, and masked
    stores of a tile's partial sums had kept them in memory for the whole loop."""
    tensor = fn.tensors[st.tensor]
    rounded = {v: m for v, m in (rounded or {}).items() if v in st.reduction_vars} \
        if fresh and not partial and st.init and not st.scatter and not folded else {}
    pads = {} if pads is None else pads
    if cpu:
        st = attrs.evolve(st, rhs=_reciprocals(st.rhs, _inner_indices(st)))

    def tree(t: Tree) -> hl.Expr:
        return tree_to_expr(t, symbols)

    func = funcs[st.tensor]
    pure = [hl.Var(v) for v in st.indices] if fresh else \
        [hl.Var(a.name()) for a in _halide_order(func.args())]
    names: dict[str, hl.Expr] = dict(symbols)
    lhs_rdom = _rdom([sr.ranges[v] for v in partial], tree, f"{st.tensor}_lhs") if partial else None
    rvars = [v for v in st.reduction_vars]
    full_rdom = _rdom([sr.ranges[v] for v in partial + rvars], tree, f"{st.tensor}_r",
                      [rounded.get(v, 1) for v in partial + rvars]) if partial or rvars else None
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
    # an update's pure variables are the first definition's: in `O(r, kh) = ...` then
    # `O(kh, m) +=! I(kh) ... I(r)`, Halide's r is this statement's kh (the texts that identify
    # references would otherwise name I(kh) and the reduction's I(r) alike)
    rdom_names.update({p.name(): v for p, v in zip(pure, st.indices)
                       if v not in partial and p.name() != v})

    read_tensors: dict[str, str] = {}  # Halide name read -> tensor
    dead: frozenset[str] = frozenset()  # Halide names whose reads the simplifier removes
    variables = {t[1]: e for e in names.values() for t in [solver.to_tree(e)] if t[0] == "var"}

    # reads by identity -> their number in walk order (StatementRanges.clamped)
    numbers = {id(r): n for n, r in enumerate(n for n in C.walk(st.rhs) if isinstance(n, C.Read))}

    def read(r: C.Read, args: list[hl.Expr], padded_dims=None) -> hl.Expr:
        """`padded_dims`: for the read of a `??`, the dimensions it tests (and clamps)."""
        if r.tensor in absent:  # (never evaluated: see `lower`)
            return constant(0, r.type)
        b = ranges.tensors[r.tensor]
        past = {k for k, a in enumerate(r.args) if C.free_vars(a) & rounded.keys()}
        if padded_dims is None and pads_on_cpu(r) and (past or phased(r, args)):
            # (a rounded loop reads past the tensor's end; a reduction reads it by a stride)
            return padded_input(r, args, constant(0, fn.tensors[r.tensor].type))
        if past and padded_dims is None:
            padded_dims = past
        n = numbers.get(id(r))
        # (a read of the tensor written, at the point written, is inside it wherever the write
        # is: never clamped, and Halide refuses a self-reference whose pure variables moved)
        at_write = r.tensor == st.tensor and not st.scatter
        args = _halide_order([
            _simplified(x, variables) if at_write and isinstance(a, C.IndexVar) and
            k < len(st.indices) and a.name == st.indices[k] else
            _clamp(x, b.mins[k], b.extents[k], tree)
            if C.has_read(a) or (k in padded_dims if padded_dims is not None
                                 else (n, k) in sr.clamped) else
            _simplified(x, variables) for k, (a, x) in enumerate(zip(r.args, args))])
        if r.tensor in params:
            source = params[r.tensor]
        elif r.tensor == st.tensor and st.first_definition:  # an in/out output's old values
            source = inout_params[r.tensor]
        else:
            source = funcs[r.tensor]
        name = hl.Func(source).name() if isinstance(source, hl.ImageParam) else source.name()
        if name in dead:
            return constant(0, r.type)
        read_tensors[name] = r.tensor
        if isinstance(source, hl.Func):  # a FuncRef: an Expr, so that select() takes it
            return hl.Expr(source[args])
        return _load(source[args], fn.tensors[r.tensor].type)

    def dim(d: C.DimOf) -> hl.Expr:
        return tree(ranges.tensors[d.tensor].extents[d.dim])

    def pads_on_cpu(r: C.Read) -> bool:
        return cpu and r.tensor in params and fn.tensors[r.tensor].type.is_float and \
            not any(map(C.has_read, r.args))

    def phased(r: C.Read, args: list[hl.Expr]) -> tuple[hl.Expr, int] | None:
        """(v, s) where a reduction reads input r by a stride s along index v in its
        innermost subscript and reads each point for several output points (an output index
        its subscripts do not use: a convolution's filters). Read once per output point (a
        pooling window), a copy by phase only added its pass: 2x2 max pooling of
        32x64x56x56 took 2.2-2.5 ms, 4.8-5.4 with the copy (ad hoc)."""
        reused = set(st.indices) - set().union(*map(C.free_vars, r.args))
        return _stride(args[-1], variables) if st.reduction_vars and reused else None

    def padded_input(r: C.Read, args: list[hl.Expr], value: hl.Expr) -> hl.Expr:
        """A read of input r.tensor's padded Func (one per tensor, value and stride, however
        many statements read it). Read by a stride s in its innermost subscript, `2*w + kw - 1`
        (a strided convolution, its weight gradient: `phased`), the Func holds the input split by
        phase, P(x, p, ...) = T(s*x + p, ...) (innermost first), read at (w + (kw - 1) / s,
        (kw - 1) % s): each phase contiguous, where a vector of the strided read cost s loads
        and the shuffles that deinterleave them, at every read."""
        b = ranges.tensors[r.tensor]
        source = params[r.tensor]
        args = [_simplified(x, variables) for x in args]
        strided = phased(r, args)
        stride = strided[1] if strided else 1
        # Only the dimensions a read can leave are tested: `I(n, c, h + kh - 1, ...) ?? 0`
        # never leaves I along n or c, and a test there (which Halide cannot rule out: the
        # output's sizes are its own parameters) split the loops over n into three copies of
        # the whole body, inside and past both ends (padconv's forward: 31 KB of code).
        bounded = tuple(k for k, a in enumerate(r.args)
                        if not (isinstance(a, C.IndexVar) and a.name not in rounded and
                                _covers(sr.ranges[a.name], b.mins[k], b.extents[k])))
        key = (r.tensor, str(solver.simplify(value)), stride, bounded)
        if key not in pads:
            exterior = hl.BoundaryConditions.constant_exterior(
                source, hl.cast(source.type(), value), _halide_order(
                    [hl.Range(tree(b.mins[k]), tree(b.extents[k])) if k in bounded else
                     hl.Range(hl.Expr(), hl.Expr()) for k in range(len(r.args))]))
            # (names for reports; Halide wants them distinct within a pipeline)
            name = f"{r.tensor}_padded" if stride == 1 else f"{r.tensor}_phases"
            taken = sum(k[0] == r.tensor and k[2] == stride for k in pads)
            pad = pads[key] = hl.Func(name if not taken else f"{name}{taken}")
            dims = [hl.Var(f"{r.tensor}_{d}") for d in reversed(range(len(r.args)))]
            if stride == 1:
                pad[dims] = exterior[dims]
            else:
                phase = hl.Var(f"{r.tensor}_phase")
                pad[[dims[0], phase, *dims[1:]]] = exterior[[dims[0] * stride + phase, *dims[1:]]]
        pad = pads[key]
        read_tensors[pad.name()] = r.tensor
        if stride > 1:
            v, s = strided
            rest = _simplified(args[-1] - v * s, variables)
            args = [*args[:-1], _simplified(rest % s, variables),
                    _simplified(v + rest // s, variables)]
        return _load(pad[_halide_order(args)], fn.tensors[r.tensor].type)

    def padded(p: C.Padded, args: list[hl.Expr], value: hl.Expr) -> hl.Expr:
        """`T(args) ?? value`: on the CPU, for an input and a constant value, a read of T's
        padded Func; else Halide's constant_exterior spelled as the select it makes (a
        guarded read of T with its subscripts clamped into T), so that the Func reads T
        itself and the polyhedral model sees the guard."""
        if p.read.tensor in absent:  # (outside it everywhere)
            return value
        b = ranges.tensors[p.read.tensor]
        if pads_on_cpu(p.read) and not solver.tree_vars(solver.simplify(value)) and \
                not solver.read_names(solver.simplify(value)):
            # On the CPU, a padded input is a Func of its own (Halide's constant_exterior):
            # the scheduler can compute it once, dense, and the reader's loops then load
            # vectors without a select and clamped (gathered) lanes per element (a padded
            # convolution ran 8x slower than the same one without `??`).
            return padded_input(p.read, args, value)
        tested, inside = set(), None
        for k, (a, x) in enumerate(zip(p.read.args, args)):
            if isinstance(a, C.IndexVar) and a.name not in rounded and \
                    _covers(sr.ranges[a.name], b.mins[k], b.extents[k]):
                continue  # (`n` over exactly T's dimension: never outside it)
            x = _simplified(x, variables)
            lo, end = tree(b.mins[k]), tree(simplify_tree(("add", b.mins[k], b.extents[k])))
            within = (lo <= x) & (x < end)
            inside = within if inside is None else inside & within
            tested.add(k)
        if inside is None:
            return read(p.read, args, padded_dims=frozenset())
        return hl.select(inside, read(p.read, args, padded_dims=frozenset(tested)), value)

    # A sum of negations, `d_mean(n) +=! -d_xc(n,c)` (gradients are full of them), is summed
    # as the negation of a sum: the same values exactly (negation is exact), and an update
    # Halide can prove associative. It refused to vectorise `R + (0 - x)` or reorder its
    # RVars, which left such sums crossing rows of memory (CPU only: the CUDA path keeps one
    # definition per statement).
    negated = cpu and fresh and not partial and not folded and st.init and \
        st.reduction == "+" and isinstance(st.rhs, C.Unary) and st.rhs.op == "-" and \
        tensor.type.is_float
    if negated:
        st = attrs.evolve(st, rhs=st.rhs.operand)
    # A sum of `cond ? x : 0` whose condition reads nothing (the phases of a strided
    # convolution's input gradient: `(yp + 1) % 2 + 2 * jkh < KH && ... ? ... : 0`) sums x
    # where cond holds, the RDom's predicate (CPU only: the polyhedral model takes the
    # select): Halide skips those points, where the select computed and discarded them (7 of
    # the 16 taps of a 3x3 stride-2 gradient's phases). Not where the condition tests the
    # innermost output index, which the CPU schedules vectorise: a predicate on it masks
    # every vector (a 2x2 max pooling's gradient ran 2x slower so, 0.3 -> 0.6-0.7 ms).
    predicate, rhs = None, None
    if cpu and fresh and not partial and not folded and st.init and st.reduction == "+" and \
            not st.scatter and isinstance(st.rhs, C.Select) and not C.has_read(st.rhs.cond) \
            and isinstance(st.rhs.other, C.Const) and st.rhs.other.value == 0 and \
            C.free_vars(st.rhs.cond) & set(st.reduction_vars) and \
            st.indices and st.indices[-1] not in C.free_vars(st.rhs.cond):
        predicate = to_halide(st.rhs.cond, names, read=read, dim=dim, padded=padded, cpu=cpu)
        then = to_halide(st.rhs.then, names, read=read, dim=dim, padded=padded, cpu=cpu)
        # (Halide loops over the RVars the value mentions, and drops a predicate's others)
        if solver.tree_vars(solver.simplify(predicate)) & {full_rdom[k].name() for k in range(
                full_rdom.dimensions())} <= solver.tree_vars(solver.simplify(then)):
            full_rdom.where(predicate)
            st, rhs = attrs.evolve(st, rhs=st.rhs.then), then
        else:
            predicate = None
    if rhs is None:
        rhs = to_halide(st.rhs, names, read=read, dim=dim, padded=padded, cpu=cpu)
    # (a read of the statement's own Func stays: it is no other Func's bounds, and without it
    # Halide warns on stderr that the update hides the earlier definitions, O0() = O0 * 0)
    dead = frozenset(read_tensors) - solver.read_names(solver.simplify(rhs)) - {func.name()}
    if dead:
        read_tensors.clear()
        rhs = to_halide(st.rhs, names, read=read, dim=dim, padded=padded, cpu=cpu)
    if rounded:
        inside = [names[v] <= tree(sr.ranges[v].hi) for v in rounded]
        rhs = hl.select(functools.reduce(operator.and_, inside), rhs,
                        hl.cast(rhs.type(), _identity(st.reduction, tensor.type)))
    if st.scatter:  # written where its subscripts say: clamped into the tensor (an index
        # out of range is undefined in TC, and must not make Halide allocate its whole type)
        b = ranges.tensors[st.tensor]
        lhs_args = [_clamp(to_halide(a, names, read=read, dim=dim, padded=padded, cpu=cpu),
                           b.mins[k], b.extents[k], tree) if C.has_read(a) else
                    _simplified(to_halide(a, names, read=read, dim=dim, padded=padded, cpu=cpu), variables)
                    for k, a in enumerate(st.scatter)]
    if full_rdom is not None and st.reduction is not None:
        rhs = _with_multiplicity(st.reduction, full_rdom, rhs,
                                 lhs_args + ([predicate] if predicate is not None else []))
    lhs = _halide_order(lhs_args)
    pure_lhs = _halide_order(pure)
    if folded:
        so_far = _identity(st.reduction, tensor.type) if st.init else func.value()
        if st.reduction in ("min", "max") and tensor.type.is_float:  # (as below)
            rhs = hl.select(hl.is_nan(rhs), _identity(st.reduction, tensor.type), rhs)
        whole = func if not func.defined() else hl.Func(st.tensor)
        whole[pure_lhs] = _combine(st.reduction, so_far, rhs)
        funcs[st.tensor] = whole
        return rdom_names, frozenset(read_tensors.values())
    if fresh and partial:
        # The statement writes part of the tensor: the other points keep the caller's values
        # (an in/out output) or are 0, and the statement is an update of those.
        func[pure_lhs] = _load(inout_params[st.tensor][pure_lhs], tensor.type) \
            if tensor.inout else constant(0, tensor.type)
    if fresh and not partial:
        if st.reduction is None:
            func[pure_lhs] = rhs
            return rdom_names, frozenset(read_tensors.values())
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
        if st.reduction in ("min", "max") and tensor.type.is_float:
            # NaN is skipped, as C's fmax folded from the identity skips it (docs/language.md,
            # NaN): filtered out of the value, the update stays a plain max that Halide can
            # prove associative and vectorise, and that CUDA's fmaxf folds alike
            rhs = hl.select(hl.is_nan(rhs), _identity(st.reduction, tensor.type), rhs)
        func[lhs] = _combine(st.reduction, hl.Expr(func[lhs]), rhs)
        if negated:
            func[pure_lhs] = -func[pure_lhs]
    return rdom_names, frozenset(read_tensors.values())


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


def _with_multiplicity(op: str, rdom: hl.RDom, rhs: hl.Expr, lhs_args) -> hl.Expr:
    """Halide loops over every dimension of an RDom that a definition mentions at all, and
    over none of one it does not mention. A reduction whose value mentions none of its
    variables (its only read was simplified away: `O() +=! 3 + 0 * W(i)`) still counts its
    points: a sum takes the value that many times, a product to that power (min and max are
    unchanged). Mentions as Halide sees them, in the value unsimplified: in `O(i) +=! C(i) +
    0 * C(p)` the value keeps `0 * C(p)` (C is read, so the read stays), and Halide loops over
    p (gradient fuzz seed 973238: counted from the simplified value, p's points were counted
    twice). One variable mentioned is enough for all of them: `d_E(j/2, j) += -(d_O0(j, kh) *
    E(kh, X(i, q)))` with X's read folded away loops over i and q too (seed 974618: their
    points were counted twice where only the unmentioned were multiplied in)."""
    used = set(solver.tree_vars(solver.to_tree(rhs)))
    for x in lhs_args:  # (Vars and RVars as Exprs; Exprs as they are)
        used |= solver.tree_vars(solver.to_tree(x if isinstance(x, hl.Expr) else hl.Expr(x)))
    dims = [rdom[k] for k in range(rdom.dimensions())]
    if any(r.name() in used for r in dims) or op in ("min", "max"):
        return rhs
    count = dims[0].extent()
    for r in dims[1:]:
        count = count * r.extent()
    if op == "+":
        return rhs * hl.cast(rhs.type(), count)
    power = hl.pow(hl.cast(hl.Float(64), rhs), hl.cast(hl.Float(64), count))
    return hl.cast(rhs.type(), power if rhs.type().is_float() else hl.round(power))


def _stride(x: hl.Expr, variables: Mapping[str, hl.Expr]) -> tuple[hl.Expr, int] | None:
    """(v, s) where subscript x is s * v + terms without v, for an index variable v and a
    constant s >= 2 (`2*w + kw - 1`); None for any other subscript."""
    def coefficients(t) -> dict | None:  # (of an affine tree's variables; None: not affine)
        match t:
            case ("var", name):
                return {name: 1}
            case ("add" | "sub", a, b):
                ca, cb = coefficients(a), coefficients(b)
                if ca is None or cb is None:
                    return None
                sign = 1 if t[0] == "add" else -1
                return {v: ca.get(v, 0) + sign * cb.get(v, 0) for v in ca.keys() | cb.keys()}
            case ("mul", a, ("int", k)) | ("mul", ("int", k), a):
                ca = coefficients(a)
                return None if ca is None else {v: k * c for v, c in ca.items()}
        return {} if not solver.tree_vars(t) else None

    found = coefficients(solver.simplify(x)) or {}
    strided = [(v, c) for v, c in found.items() if v in variables and c >= 2]
    return (variables[strided[0][0]], strided[0][1]) if len(strided) == 1 else None


def _rdom(rs: list[Range], tree, name: str, multiples=()) -> hl.RDom:
    """`multiples`: per range, a multiple its extent is rounded up to (1: none)."""
    extents = [tree(r.hi) - tree(r.lo) + 1 for r in rs]
    extents = [e if m == 1 else (e + (m - 1)) // m * m
               for e, m in zip(extents, multiples or [1] * len(rs))]
    return hl.RDom([hl.Range(tree(r.lo), e) for r, e in zip(rs, extents)], name)


def _clamp(x: hl.Expr, lo: Tree, extent: Tree, tree) -> hl.Expr:
    """A subscript computed from tensor values, clamped into the tensor: TC leaves an
    out-of-range value undefined, and clamping keeps that from reading outside memory (it also
    gives Halide's bounds inference a finite region)."""
    return hl.clamp(x, tree(lo), tree(lo) + tree(extent) - 1)


def _simplified(x: hl.Expr, variables: Mapping[str, hl.Expr]) -> hl.Expr:
    """An affine subscript, simplified: Halide's bounds inference takes `2*k - k` over
    k in [0, 9] as [-9, 18], and an input buffer must then hold that whole region."""
    try:
        return tree_to_expr(solver.simplify(x), variables)
    except ValueError:  # a form tree_to_expr does not rebuild: keep it as written
        return x
