"""Scop extraction: the polyhedral model of a TC function, read from its Halide Funcs.

Each Func definition (a pure definition or an update) is one statement `S<k>`, in program order.
Its iteration domain is the box its loops cover: the tensor's inferred extent for pure Vars, the
RDom bounds for reduction variables. Reads and writes become isl maps from the domain to the
tensor's index space (row-major, TC's order). A subscript that is not quasi-affine (an indirect
`X(I(i,j))`, a product of variables) becomes a *may* access over that whole dimension.

Sizes are isl parameters (TC's size variable names), constrained in the context to be
non-negative, or fixed to a call's values when `sizes` are given (the paper injects them before
scheduling). Dependences are exact dataflow computed by isl over the program order.

Reading this from the Funcs, not from the TC AST, is deliberate: a Halide pipeline written by
hand in Python enters the same flow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs
import islpy as isl

from tcstage.errors import Span, TCArgumentError, TCError, TCSemanticError
from tcstage.halide.lower import Lowered
from tcstage.halide.solver import Tree, inline_lets, isl_name, tree_to_isl, tree_to_str
from tcstage.lang import checked as C
from tcstage.poly import budget
from tcstage.poly.budget import bounded


@attrs.frozen
class Access:
    tensor: str
    relation: isl.Map  # statement domain -> tensor[...]
    exact: bool  # False: a may-access (some subscript is not affine)
    text: str  # the access as the TC writes it (Lowered.reference_text)
    subscripts: tuple = ()  # its subscripts as Halide value trees, in TC order
    halide_name: str = ""  # the Func or input buffer that Halide's value trees read


@attrs.frozen
class Statement:
    name: str  # the isl tuple name, S0, S1, ...
    tensor: str  # the tensor it writes
    definition: int  # index among the Func's definitions (0: pure)
    tc_statement: int  # index of the TC statement it comes from
    iterators: tuple[str, ...]  # isl names of its loop variables, outermost first
    halide_iterators: tuple[str, ...]  # the same, as Halide names them
    domain: isl.Set
    write: Access
    reads: tuple[Access, ...]
    lhs: tuple[Tree, ...]  # the Func definition's arguments (Halide order, innermost first)
    value: Tree  # its value
    reduction_vars: tuple[str, ...]  # isl names of the iterators that are RDom variables
    # the loop nest it shares with the statements of the same key (the elements of one Tuple
    # definition, updated point by point together); None: a loop nest of its own
    together: tuple | None = None


@attrs.frozen
class Scop:
    name: str
    params: tuple[str, ...]  # isl parameter names
    param_sizes: dict  # isl parameter name -> TC size symbol
    context: isl.Set
    statements: tuple[Statement, ...]
    tensor_extents: dict  # tensor -> isl.Set of its valid indices
    schedule: isl.Schedule  # the canonical one: a sequence with one band per statement

    @property
    def domain(self) -> isl.UnionSet:
        return _union([s.domain for s in self.statements], isl.UnionSet, self.context)

    def reads(self, exact_only: bool = False) -> isl.UnionMap:
        return _union([a.relation for s in self.statements for a in s.reads
                       if a.exact or not exact_only], isl.UnionMap, self.context)

    def writes(self) -> isl.UnionMap:
        return _union([s.write.relation for s in self.statements], isl.UnionMap, self.context)

    def dependences(self) -> "Dependences":
        return compute_dependences(self)


@attrs.frozen
class Dependences:
    flow: isl.UnionMap  # read after write
    anti: isl.UnionMap  # write after read
    output: isl.UnionMap  # write after write

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.anti).union(self.output)


def _union(parts, kind, context: isl.Set):
    """The union of isl sets (kind UnionSet) or maps (kind UnionMap); empty in the context's
    parameter space when there are none."""
    lift = kind.from_set if kind is isl.UnionSet else kind.from_map
    out = kind.empty(context.get_space())
    for p in parts:
        out = out.union(lift(p))
    return out


def extract_scop(lowered: Lowered, sizes: Mapping[str, int] | None = None) -> Scop:
    """The scop of a lowered TC function; `sizes` (TC size symbols) fixes the parameters."""
    fn, ranges = lowered.fn, lowered.ranges
    size_symbols = lowered.size_symbols()  # Halide extent symbol -> TC size
    # the user's size names first, so that they keep their plain isl names (`T_0`: `_T_0`)
    tc_sizes = sorted({d for t in fn.tensors.values() for d in t.dims if d and not d.isdigit()},
                      key=lambda d: (not d.isidentifier(), d))
    param_names = unique_isl_names(tc_sizes)
    params = tuple(param_names.values())
    names = dict(param_names)
    names.update({h: param_names.get(t, t) for h, t in size_symbols.items()})  # t: a size or a constant
    param_text = f"[{', '.join(params)}]"
    constraints = [f"{p} >= 0" for p in params]
    for s, v in (sizes or {}).items():
        if s in param_names:
            constraints.append(f"{param_names[s]} = {int(v)}")
    context = isl.Set(f"{param_text} -> {{ : {' and '.join(constraints) or 'true'} }}")

    def isl_text(tree: Tree, local: Mapping[str, str]) -> str:
        return tree_to_isl(tree, {**names, **local})

    extents: dict[str, isl.Set] = {}
    bounds: dict[str, list[tuple[Tree, Tree]]] = {}
    for t, tb in ranges.tensors.items():
        bounds[t] = _index_ranges(lowered, t)
        idx = [f"a{k}" for k in range(len(bounds[t]))]
        cond = " and ".join(c for a, (lo, hi) in zip(idx, bounds[t])
                            for c in _within(lo, a, hi, isl_text)) or "true"
        extents[t] = isl.Set(f"{param_text} -> {{ {t}[{', '.join(idx)}] : {cond} }}") \
            .intersect_params(context)

    halide_names = lowered.halide_names()
    definitions = {t: lowered.definitions(t) for t in lowered.funcs}  # over every version
    statements = []
    for k, (tensor, index, tc_index) in enumerate(lowered.order):
        d = definitions[tensor][index]
        statements.append(_statement(f"S{k}", tensor, index, tc_index, d, bounds[tensor],
                                     halide_names, isl_text, param_text, context, extents,
                                     lowered.reference_text, set(params)))
    schedule = _canonical_schedule(statements, context)
    return Scop(fn.name, params, {p: s for s, p in param_names.items()}, context,
                tuple(statements), extents, schedule)


def unique_isl_names(symbols, taken=frozenset()) -> dict[str, str]:
    """symbol -> a name isl (and C) accept: isl_name(symbol), with a numeric suffix where that
    is already taken by an earlier symbol or by `taken` (`T_0` and `T.0` both read `_T_0`;
    a variable named like a parameter would silently become that parameter)."""
    out, used = {}, set(taken)
    for s in symbols:
        name, k = isl_name(s), 1
        while name in used:
            name, k = f"{isl_name(s)}_{k}", k + 1
        used.add(name)
        out[s] = name
    return out


def specialize(scop: Scop, sizes: Mapping[str, int]) -> Scop:
    """The scop with its size parameters fixed to `sizes` (TC size symbol -> value): the paper
    injects the sizes of a call just in time, after a parametric schedule was computed."""
    fixed = [f"{p} = {int(sizes[t])}" for p, t in scop.param_sizes.items() if t in sizes]
    if not fixed:
        return scop
    context = scop.context.intersect(
        isl.Set(f"[{', '.join(scop.params)}] -> {{ : {' and '.join(fixed)} }}"))

    def access(a: Access) -> Access:
        return attrs.evolve(a, relation=a.relation.intersect_params(context))

    statements = tuple(attrs.evolve(s, domain=s.domain.intersect_params(context),
                                    write=access(s.write), reads=tuple(map(access, s.reads)))
                       for s in scop.statements)
    extents = {t: e.intersect_params(context) for t, e in scop.tensor_extents.items()}
    schedule = scop.schedule.intersect_domain(
        _union([s.domain for s in statements], isl.UnionSet, context))
    return attrs.evolve(scop, context=context, statements=statements, tensor_extents=extents,
                        schedule=schedule)


def _statement(name, tensor, index, tc_index, d, tensor_bounds, halide_names, isl_text,
               param_text, context, extents, reference_text, taken) -> Statement:
    lhs = d["args"]
    rvars = {rv[0]: rv for rv in d["rvars"]}
    # Loop variables: the left-hand ones in TC order (outermost first), then the remaining RDom
    # variables, outermost first (Halide lists them innermost first).
    # (once each: a scatter such as `O(i, i) += ...` writes one variable twice)
    lhs_vars = list(dict.fromkeys(a[1] for a in reversed(lhs) if a[0] == "var"))
    iterators = lhs_vars + [v for v in reversed(list(rvars)) if v not in lhs_vars]
    local = unique_isl_names(iterators, taken)
    conds = []
    rank = len(lhs)
    for pos, a in enumerate(lhs):  # Halide position pos is TC dimension rank - 1 - pos
        if a[0] == "var" and a[1] not in rvars:
            lo, hi = tensor_bounds[rank - 1 - pos]
            conds += _within(lo, local[a[1]], hi, isl_text)
    for v, (_, lo, extent) in rvars.items():
        conds += _within(lo, local[v], _end(lo, extent), isl_text)
    guards = []  # a Halide RDom.where: its affine conjuncts bound the domain, the others
    for c in _conjuncts(inline_lets(d.get("predicate", ("int", True)))):  # guard the value
        try:
            conds.append(isl_text(c, local))
        except ValueError:
            guards.append(c)
    vec = ", ".join(local[v] for v in iterators)
    domain = isl.Set(f"{param_text} -> {{ {name}[{vec}] : {' and '.join(conds) or 'true'} }}") \
        .intersect_params(context).coalesce()

    def access(t: str, args: tuple, source: str) -> Access:
        subs, exact = [], True
        for k, a in enumerate(reversed(args)):
            try:
                subs.append(isl_text(a, local))
            except ValueError:
                subs.append(None)
                exact = False
        out = [f"a{k}" for k in range(len(subs))]
        eqs = [f"{o} = {s}" for o, s in zip(out, subs) if s is not None]
        rel = isl.Map(f"{param_text} -> {{ {name}[{vec}] -> {t}[{', '.join(out)}] : "
                      f"{' and '.join(eqs) or 'true'} }}").intersect_domain(domain)
        if not exact:  # may-access: anywhere within the tensor along the unknown subscripts
            rel = rel.intersect_range(extents[t])
        text = reference_text(tc_index, t, tuple(reversed(args)))
        return Access(t, rel, exact, text, tuple(reversed(args)), source)

    values = [inline_lets(v) for v in d["values"]]
    if guards:  # where the guard fails, the element keeps its value: the domain stays affine
        own = next(h for h, t in halide_names.items() if t == tensor)
        guard = guards[0]
        for c in guards[1:]:
            guard = ("and", guard, c)
        values = [("select", guard, v, ("read", own, lhs)) for v in values]
    reads = []
    for node in reads_in(values):
        t = halide_names.get(node[1])
        if t is None:
            raise TCError(f"statement {name} reads '{node[1]}', which is neither a tensor of the "
                          "function nor one of its inputs")
        reads.append(access(t, node[2], node[1]))
    return Statement(name, tensor, index, tc_index, tuple(local[v] for v in iterators),
                     tuple(iterators), domain, access(tensor, lhs, ""), tuple(reads), lhs,
                     values[0], tuple(local[v] for v in iterators if v in rvars),
                     d.get("together"))


def _conjuncts(predicate: Tree) -> list[Tree]:
    if predicate == ("int", True):
        return []
    if predicate[0] == "and":
        return _conjuncts(predicate[1]) + _conjuncts(predicate[2])
    return [predicate]


def _index_ranges(lowered: Lowered, tensor: str) -> list[tuple[Tree, Tree]]:
    """Per dimension of the tensor, its index range [lo, end) as trees. A tensor that a
    statement shapes ends where that statement's range does: Halide simplified its extent
    (hi - lo + 1) into a form from which lo + extent no longer cancels back to hi + 1
    (max(x, 0) + min(-x, 0) + ...), and isl can only write that as case splits."""
    ranges = lowered.ranges
    bounds = ranges.tensors[tensor]
    n = ranges.shaped_by.get(tensor)
    if n is None or ranges.statements[n].tensor != tensor:
        return [(lo, _end(lo, extent)) for lo, extent in zip(bounds.mins, bounds.extents)]
    shaping = ranges.statements[n].ranges
    his = [shaping[v].hi for v in lowered.fn.statements[n].indices]
    return [(lo, ("add", hi, ("int", 1))) for lo, hi in zip(bounds.mins, his)]


def _end(lo: Tree, extent: Tree) -> Tree:
    """lo + extent, cancelling lo where the extent is written hi - lo (+ c)."""
    if extent[0] == "sub" and extent[2] == lo:
        return extent[1]
    if extent[0] == "add" and extent[1][0] == "sub" and extent[1][2] == lo:
        return ("add", extent[1][1], extent[2])
    return ("add", lo, extent)


def _within(lo: Tree, var: str, hi: Tree, isl_text) -> list[str]:
    """Constraints lo <= var < hi as conjuncts: var >= max(a, b) is var >= a and var >= b, and
    var < min(a, b) is var < a and var < b. isl would write min and max as disjunctions, and
    nested ones (range inference makes them from several size relations) multiply into dozens
    of disjuncts per domain, over which exact dataflow analysis explodes."""
    return ([f"{isl_text(a, {})} <= {var}" for a in _terms(lo, "max")]
            + [f"{var} < {isl_text(b, {})}" for b in _terms(hi, "min")])


_DUAL = {"max": "min", "min": "max"}


def _terms(tree: Tree, tag: str, limit: int = 16) -> list[Tree]:
    """Terms whose `tag` (max or min) is tree, with sums and differences distributed over it:
    max(a, b) - c is max(a - c, b - c) and c - min(a, b) is max(c - a, c - b). [tree] itself
    where it has no such form, or where distributing would make more than `limit` terms."""
    kind = tree[0]
    if kind == tag:
        out = _terms(tree[1], tag, limit) + _terms(tree[2], tag, limit)
    elif kind in ("add", "sub"):
        right = _terms(tree[2], tag if kind == "add" else _DUAL[tag], limit)
        out = [(kind, a, b) for a in _terms(tree[1], tag, limit) for b in right]
    else:
        return [tree]
    return out if len(out) <= limit else [tree]


def reads_in(trees, seen: set | None = None):
    """The read nodes of value trees, each before the reads in its subscripts. A node the
    trees share (inline_lets shares a let's value wherever it was used) counts once."""
    seen = set() if seen is None else seen
    for t in trees:
        if not isinstance(t, tuple) or not t or id(t) in seen:
            continue
        seen.add(id(t))
        if t[0] == "read":
            yield t
            yield from reads_in(t[2], seen)
        elif t[0] == "call":
            yield from reads_in(t[2], seen)
        else:
            yield from reads_in(t[1:], seen)


def _canonical_schedule(statements, context: isl.Set) -> isl.Schedule:
    """A sequence of one filter per statement, each with a band over its loops (outermost
    first): the program order of the TC. Consecutive statements that share a loop nest
    (`together`) have one band, with their sequence inside it."""
    schedule, k = None, 0
    while k < len(statements):
        run = statements[k:_shared_nest(statements, k)[1] + 1]
        k += len(run)
        domain = isl.UnionSet(run[0].domain)
        for s in run[1:]:
            domain = domain.union(isl.UnionSet(s.domain))
        part = isl.Schedule.from_domain(domain)
        if run[0].iterators:
            band = isl.UnionMap("{ }")
            for s in run:
                vec = ", ".join(s.iterators)
                band = band.union(isl.UnionMap(f"{{ {s.name}[{vec}] -> [{vec}] }}"))
            part = part.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(band))
        if len(run) > 1:
            filters = isl.UnionSetList.from_union_set(isl.UnionSet(run[0].domain))
            for s in run[1:]:
                filters = filters.add(isl.UnionSet(s.domain))
            node = part.get_root().child(0)
            node = node.child(0) if run[0].iterators else node
            part = node.insert_sequence(filters).get_schedule()
        schedule = part if schedule is None else schedule.sequence(part)
    return schedule


def compute_dependences(scop: Scop) -> Dependences:
    """Exact dataflow in program order (may-accesses make may-dependences). Exact writes kill:
    a read followed by exact writes of its element depends only on the first of them, which the
    later ones follow through output dependences. Each statement's dependences are computed
    from the statements that can reach it (`_reaching`), so that a long chain of in-place
    updates of one tensor costs linear time and gives a linear number of dependences. Raises
    WorkLimitExceeded where a statement's analysis exceeds its budget (`budget.DEPENDENCES`)."""
    none = isl.UnionMap.empty(scop.context.get_space())

    def union(accesses) -> isl.UnionMap:
        return _union([a.relation for a in accesses], isl.UnionMap, scop.context)

    def dataflow(sink, must_source, may_source, kill, schedule) -> isl.UnionMap:
        info = isl.UnionAccessInfo.from_sink(sink).set_must_source(must_source) \
            .set_may_source(may_source).set_kill(kill).set_schedule(schedule)
        return info.compute_flow().get_may_dependence()

    flow = anti = output = none
    for k, statement in enumerate(scop.statements):
        sources = _reaching(scop.statements, k)
        schedule = _canonical_schedule([s for s, _ in sources], scop.context)
        writes = [s.write for s, tensors in sources if s.write.tensor in tensors]
        reads = union(a for s, tensors in sources for a in s.reads if a.tensor in tensors)
        must, writes = union(w for w in writes if w.exact), union(writes)
        sink_reads, sink_write = union(statement.reads), union([statement.write])
        with bounded(budget.DEPENDENCES, f"the dependence analysis of statement "
                                         f"{statement.name} (TC statement "
                                         f"{statement.tc_statement + 1})"):
            flow = flow.union(dataflow(sink_reads, must, writes, none, schedule))
            anti = anti.union(dataflow(sink_write, none, reads, must, schedule))
            output = output.union(dataflow(sink_write, must, writes, none, schedule))
    return Dependences(flow=flow, anti=anti, output=output)


def _shared_nest(statements, k: int) -> tuple[int, int]:
    """The first and last index of the consecutive statements that share statement k's loop
    nest (`together`); (k, k) for a statement with a nest of its own."""
    first, last, key = k, k, statements[k].together
    if key is not None:
        while first > 0 and statements[first - 1].together == key:
            first -= 1
        while last + 1 < len(statements) and statements[last + 1].together == key:
            last += 1
    return first, last


def _reaching(statements, k: int) -> list[tuple[Statement, set[str]]]:
    """The statements whose accesses can be the source of a dependence into statement k, in
    program order, each with the tensors concerned: per tensor that k accesses, those from the
    last statement before k that exactly writes every element k accesses (it kills anything
    earlier, and all of it runs before k) through k itself."""
    touched: dict[str, isl.Set] = {}
    for a in (*statements[k].reads, statements[k].write):
        elements = a.relation.range()
        touched[a.tensor] = touched[a.tensor].union(elements) if a.tensor in touched \
            else elements
    # Statements sharing k's loop nest (a Tuple definition's elements) run interleaved with it:
    # those after k reach its later iterations, and none of them runs wholly before it.
    first, last = _shared_nest(statements, k)
    concerned: dict[int, set[str]] = {}
    for tensor, elements in touched.items():
        writers = [j for j in range(last + 1) if statements[j].write.tensor == tensor]
        if not writers:  # an input, or a tensor first written later: no dependence on it
            continue
        start = next((j for j in reversed(writers) if j < first and statements[j].write.exact
                      and elements.is_subset(statements[j].write.relation.range())), 0)
        for j in range(start, last + 1):
            if any(a.tensor == tensor for a in (*statements[j].reads, statements[j].write)):
                concerned.setdefault(j, set()).add(tensor)
    return [(statements[j], concerned[j]) for j in sorted(concerned)]


def check_bounds(scop: Scop, lowered: Lowered | None = None) -> None:
    """The paper's (D.A) \\ T = empty: an exact access that the model shows to leave its tensor
    for every size at which its statement runs is an error, reported before any code is
    generated. (An access that leaves it only for some sizes is a precondition: range
    inference warns about it, and fixed sizes turn it into this error.) With `lowered`, the
    error points into the TC source."""
    for s in scop.statements:
        for a in (s.write, *s.reads):  # (an update reads the element it writes)
            if not a.exact:
                continue
            outside = a.relation.range().subtract(scop.tensor_extents[a.tensor])
            if outside.is_empty():
                continue
            runs = scop.context.intersect(s.domain.params())
            if not runs.is_empty() and runs.is_subset(outside.params()):
                raise _out_of_bounds(scop, s, a, a is s.write, lowered)


def _out_of_bounds(scop: Scop, s: Statement, a: Access, write: bool,
                   lowered: Lowered | None) -> TCError:
    """The error for an access that leaves its tensor, in TC terms: the user's sizes and
    variable names, an instance that does it, the tensor's bounds, the place in the source."""
    sizes = {p: scop.param_sizes.get(p, p) for p in scop.params}
    names = dict(zip(s.iterators, s.halide_iterators))
    if lowered is not None:
        tc_names = lowered.var_names[s.tc_statement]
        names = {v: tc_names.get(h, h) for v, h in names.items()}
    pairs = a.relation.intersect_range(a.relation.range().subtract(
        scop.tensor_extents[a.tensor])).wrap()
    point = pairs.sample_point()
    n_params, n_in = pairs.dim(isl.dim_type.param), len(s.iterators)

    def value(kind, k) -> int:
        return point.get_coordinate_val(kind, k).to_python()

    params = [f"{sizes[pairs.get_dim_name(isl.dim_type.param, k)]}="
              f"{value(isl.dim_type.param, k)}" for k in range(n_params)
              if pairs.get_dim_name(isl.dim_type.param, k) in sizes]
    at = ", ".join(f"{names[v]} = {value(isl.dim_type.set, k)}"
                   for k, v in enumerate(s.iterators))
    element = ", ".join(str(value(isl.dim_type.set, n_in + k))
                        for k in range(pairs.dim(isl.dim_type.set) - n_in))
    extent = scop.tensor_extents[a.tensor]
    bounds = ", ".join(f"{_bound(extent, k, 'min', sizes)}..{_bound(extent, k, 'max', sizes)}"
                       for k in range(extent.dim(isl.dim_type.set)))
    kind, verb = ("write", "writes") if write else ("read", "reads")
    message = (f"in '{scop.name}', the {kind} accesses {a.text} outside {a.tensor}"
               f"{' for ' + ', '.join(params) if params else ''}: "
               f"{'at ' + at + ' it ' if at else 'it '}{verb} {a.tensor}({element}), and "
               f"{a.tensor} has indices {bounds}")
    span = _access_span(lowered, s, a, write) if lowered is not None else None
    fixed = all(scop.context.plain_get_val_if_fixed(isl.dim_type.param, k).is_int()
                for k in range(scop.context.dim(isl.dim_type.param)))
    kind_of_error = TCArgumentError if fixed and params else TCSemanticError
    return kind_of_error(message, span)


def _bound(extent: isl.Set, k: int, which: str, sizes: Mapping[str, str]) -> str:
    """The least or greatest index of a tensor along dimension k, in TC size names."""
    pa = getattr(extent, f"dim_{which}")(k)
    text = isl.AstBuild.from_context(pa.domain()).expr_from_pw_aff(pa).to_C_str()
    for p, tc in sizes.items():
        text = re.sub(rf"\b{re.escape(p)}\b", tc, text)
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _access_span(lowered: Lowered, s: Statement, a: Access, write: bool) -> Span | None:
    """Where the TC statement makes access a: its left-hand side, or the read of the tensor
    whose text matches (the first read of it otherwise)."""
    st = lowered.fn.statements[s.tc_statement]
    if st.span is None:
        return None
    if write:
        return Span(st.span.source, st.span.start, st.span.start + len(st.tensor))
    reads = [r for r in C.walk(st.rhs) if isinstance(r, C.Read) and r.tensor == a.tensor
             and r.span is not None]
    same = [r for r in reads if re.sub(r"\s", "", r.span.text()) == re.sub(r"\s", "", a.text)]
    return (same or reads or [st])[0].span
