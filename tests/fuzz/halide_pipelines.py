"""Random valid Halide pipelines (Python `halide`), run through `tc.from_halide` on the CPU under
every schedule and as emulated CUDA kernels, against Halide's own realize.

A case is Python source defining `build()`, which makes fresh Funcs and Params on every call and
returns `(outputs, {name: ImageParam or Param})`: the reference and the path under test each
build their own copy from the same text, so nothing one does to its Funcs reaches the other, and
the text is the reproducer. Generated per seed (deterministic):

- 1-5 Funcs of 1-3 dimensions, each of one type (Int(32), Int(16), UInt(8), Float(32)); pointwise
  arithmetic (+, -, *, // and % by constants, a division by data now and then: Halide defines
  x/0 = 0), casts, `select`, `min`/`max`/`clamp`, `abs`; shifted, halved, clamped and transposed
  reads of earlier Funcs;
- ImageParams read directly or through `BoundaryConditions` (repeat_edge, constant_exterior,
  mirror_image, mirror_interior); scalar `Param`s;
- RDom reductions (sum, product, min, max: a pure init, then one update), over small RDoms or an
  input's width, now and then with an affine `where`; a histogram (an update whose first
  subscript is clamped data);
- (issue 27, from a random stream of their own) tables held as `hl.Buffer`s, `hl.undef` pure
  definitions, RDom extents computed from float Params, `RDom.where` conditions that are not
  affine, `hl.argmin`/`hl.argmax` (Tuple-valued updates);
- one or two outputs; two calls per case, the second at sizes no larger than the first, with
  awkward extents (1, primes, 17, 33); inputs sized by Halide's own bounds inference.

Values are exact, so results compare exactly: every Func's value is clamped (Float(32) values
also rounded to quarters), products of two non-constant values take clamped operands and the
reduction terms are clamped, so no Int(32) overflows (Halide leaves that undefined) and every
Float(32) value and partial sum is a multiple of 1/64 below 2^17: exact in float32 whatever the
order of a reduction (parallel reductions on CUDA) or an FMA contraction.
"""

from __future__ import annotations

import random
import re
import time
import warnings

import attrs
import numpy as np

TYPES = ("i32", "i16", "u8", "f32")
HL_TYPE = {"i32": "hl.Int(32)", "i16": "hl.Int(16)", "u8": "hl.UInt(8)", "f32": "hl.Float(32)"}
NUMPY = {"i32": np.int32, "i16": np.int16, "u8": np.uint8, "f32": np.float32}
SIZES = (1, 2, 3, 5, 7, 11, 13, 17, 33)
BOUNDARIES = ("repeat_edge", "constant_exterior", "mirror_image", "mirror_interior")
VARS = ("x", "y", "z")
SCHEDULES = ("auto", "tcstage", "Mullapudi2016", "root", "as_written")


@attrs.frozen
class Call:
    """One call: arguments by name (arrays in numpy order, scalars) and the output shapes."""
    args: dict
    shapes: tuple


@attrs.frozen
class Case:
    seed: int
    source: str  # defines build()
    calls: tuple  # of Call; calls[1:] at sizes no larger than calls[0]


# -- the generator -----------------------------------------------------------------------------

@attrs.define
class _Producer:
    name: str  # as read in the source (a Func, an input or its boundary-condition Func)
    type: str
    is_input: bool = False
    input: str = ""  # the input's name, for reads that are direct


class _Gen:
    def __init__(self, seed: int):
        self.rng = random.Random(f"halide/{seed}")
        # the constructs added for issue 27 draw from a stream of their own, so that a seed's
        # pipeline changes only where one of them is drawn
        self.extra = random.Random(f"halide-constructs/{seed}")
        self.tables = True
        self.lines: list[str] = []
        self.params: list[tuple[str, str]] = []
        self.used_params: set[str] = set()

    # expressions are Python source of type `t`
    def const(self, t: str) -> str:
        r = self.rng
        if t == "f32":
            return f"hl.f32({r.randint(-16, 16) / 4})"
        lo = 0 if t == "u8" else -9
        return f"hl.cast({HL_TYPE[t]}, {r.randint(lo, 9)})"

    def cast(self, src: str, t: str, code: str) -> str:
        if src == t:
            return code
        if src == "f32" and t == "u8":  # (float to unsigned out of range is undefined)
            return f"hl.u8(hl.clamp({code}, 0.0, 255.0))"
        return f"hl.cast({HL_TYPE[t]}, {code})"

    def subscript(self, dims: int, ctx) -> list[str]:
        r = self.rng
        vs = list(VARS[:dims])
        if dims > 1 and r.random() < 0.1:
            r.shuffle(vs)  # a transposed read
        out = []
        for v in vs:
            k = r.random()
            if v in ctx.unbound:  # (not a variable of the update's left-hand side)
                out.append(f"{r.choice(ctx.rvars)} + {r.randint(-1, 1)}")
            elif ctx.rvars and k < 0.45:
                rv = r.choice(ctx.rvars)
                out.append(f"{v} + {rv}" + (f" + {r.randint(-1, 1)}" if r.random() < 0.3 else ""))
            elif k < 0.75:
                dx = r.choice((0, 0, 0, 1, 2, -1, -2))
                out.append(v if dx == 0 else f"{v} + {dx}" if dx > 0 else f"{v} - {-dx}")
            elif k < 0.85:
                out.append(f"{v} // 2")
            elif k < 0.92:
                out.append(f"2 * {v} + {r.randint(0, 1)}")
            else:
                out.append(f"hl.clamp({v} + {r.randint(-2, 2)}, 0, {r.choice((0, 3, 6, 16))})")
        return out

    def leaf(self, t: str, ctx) -> str:
        r = self.rng
        if self.tables and self.extra.random() < 0.03:  # a table the algorithm holds (an
            # embedded Buffer; not in a subscript: a region must not depend on its values)
            table = [self.extra.randint(0, 9) for _ in range(self.extra.choice((3, 8)))]
            v = self.extra.choice([v for v in VARS[:ctx.dims] if v not in ctx.unbound] or ["0"])
            # (a copy that owns its values: a Buffer made on a temporary array only views it)
            read = (f"hl.Buffer(np.array({table}, dtype=np.int32)).copy()"
                    f"[hl.clamp({v} + {self.extra.randint(-2, 2)}, 0, {len(table) - 1})]")
            return self.cast("i32", t, read)
        k = r.random()
        if k < 0.12:
            return self.const(t)
        if k < 0.2:
            v = r.choice([v for v in VARS[:ctx.dims] if v not in ctx.unbound] or ["0"])
            return f"hl.cast({HL_TYPE[t]}, {v})"
        if k < 0.27 and self.params:
            name, pt = r.choice(self.params)
            self.used_params.add(name)
            return self.cast(pt, t, name) if pt != t else f"hl.cast({HL_TYPE[t]}, {name})"
        if not ctx.producers:
            return self.const(t)
        # favour the most recent producers, so that the pipeline is a chain more often
        p = ctx.producers[-1] if r.random() < 0.4 else r.choice(ctx.producers)
        name = p.name
        if p.is_input:
            name = f"@{p.input}@"  # direct or through its boundary condition: rendered later
        read = f"{name}[{', '.join(self.subscript(ctx.dims, ctx))}]"
        return self.cast(p.type, t, read) if p.type != t else f"hl.cast({HL_TYPE[t]}, {read})"

    def clamp_small(self, t: str, code: str) -> str:
        lo, hi = (0, 15) if t == "u8" else (-64, 64)
        return f"hl.clamp({code}, {self._c(t, lo)}, {self._c(t, hi)})"

    def _c(self, t: str, v) -> str:
        return f"hl.f32({float(v)})" if t == "f32" else f"hl.cast({HL_TYPE[t]}, {v})"

    def expr(self, t: str, ctx, depth: int) -> str:
        r = self.rng
        if depth <= 0 or r.random() < 0.25:
            return self.leaf(t, ctx)
        k = r.random()
        sub = lambda: self.expr(t, ctx, depth - 1)  # noqa: E731
        if k < 0.2:
            return f"({sub()} + {sub()})"
        if k < 0.3:
            return f"({sub()} - {sub()})"
        if k < 0.42:
            if r.random() < 0.5:
                c = r.choice((2, 3, -1, 0.5)) if t == "f32" else r.choice((2, 3, -1))
                return f"({sub()} * {self._c(t, c)})"
            a, b = self.leaf(t, ctx), self.leaf(t, ctx)
            return f"({self.clamp_small(t, a)} * {self.clamp_small(t, b)})"
        if k < 0.5:
            if t == "f32":
                return f"({sub()} / {self._c(t, r.choice((2, 4, -2)))})"
            if r.random() < 0.15:  # by data: Halide defines x / 0 as 0
                return f"({sub()} // {self.leaf(t, ctx)})"
            return f"({sub()} // {self._c(t, r.choice((2, 3, 4) if t == 'u8' else (2, 3, 4, -3)))})"
        if k < 0.56:
            if t == "f32":
                return f"({sub()} % {self._c(t, r.choice((3, 4)))})"
            if r.random() < 0.15:
                return f"({sub()} % {self.leaf(t, ctx)})"
            return f"({sub()} % {self._c(t, r.choice((3, 4, 5) if t == 'u8' else (3, 4, 5, -3)))})"
        if k < 0.66:
            return f"hl.{r.choice(('min', 'max'))}({sub()}, {sub()})"
        if k < 0.72:
            lo = r.randint(0, 3) if t == "u8" else r.randint(-6, 0)
            return f"hl.clamp({sub()}, {self._c(t, lo)}, {self._c(t, lo + r.randint(0, 8))})"
        if k < 0.86:
            op = r.choice(("<", "<=", ">", ">=", "==", "!="))
            cond = f"({sub()} {op} {sub()})"
            if r.random() < 0.2:
                cond = f"({cond} {r.choice(('&', '|'))} ({sub()} > {self.const(t)}))"
            return f"hl.select({cond}, {sub()}, {sub()})"
        if k < 0.9 and t != "u8":
            return f"hl.abs({sub()})" if t == "f32" else f"hl.cast({HL_TYPE[t]}, hl.abs({sub()}))"
        if k < 0.95 and t != "f32":
            other = r.choice(("i32", "i16", "u8", "f32"))
            return self.cast(other, t, self.expr(other, ctx, depth - 1))
        return f"({sub()} + {sub()})"

    def bounded(self, t: str, code: str) -> str:
        """A Func's value: clamped (Float(32) values rounded to quarters too)."""
        if t == "u8":
            return code
        if t == "f32":
            return f"(hl.round(hl.clamp({code}, hl.f32(-100.0), hl.f32(100.0)) * 4) / 4)"
        return f"hl.clamp({code}, {self._c(t, -100)}, {self._c(t, 100)})"


@attrs.define
class _Ctx:
    dims: int
    producers: list
    rvars: list = attrs.Factory(list)
    unbound: tuple = ()  # pure variables an update's left-hand side lacks


def _generate(seed: int) -> tuple[str, list[str], list[str], int, dict, list[str]]:
    """(source with {input} placeholders, input names, param names, dims, input types,
    output names)."""
    g = _Gen(seed)
    r = g.rng
    dims = r.choice((1, 2, 2, 2, 3))
    n_inputs = r.choice((1, 1, 2))
    inputs = [f"in{i}" for i in range(n_inputs)]
    in_types = {n: r.choice(TYPES) for n in inputs}
    g.params = [(f"p{i}", r.choice(("i32", "f32"))) for i in range(r.choice((0, 0, 1, 2)))]
    L = g.lines
    L.append(f"    {', '.join(VARS)} = {', '.join(f'hl.Var({v!r})' for v in VARS)}")
    for n in inputs:
        L.append(f"    {n} = hl.ImageParam({HL_TYPE[in_types[n]]}, {dims}, {n!r})")
    for n, t in g.params:
        L.append(f"    {n} = hl.Param({HL_TYPE[t]}, {n!r})")
    L.append("@BOUNDARIES@")
    producers = [_Producer(n, in_types[n], True, n) for n in inputs]
    funcs: list[_Producer] = []
    lhs = ", ".join(VARS[:dims])
    n_funcs = r.randint(1, 5)
    for i in range(n_funcs):
        name, t = f"f{i}", r.choice(TYPES)
        ctx = _Ctx(dims, producers + funcs)
        L.append(f"    {name} = hl.Func({name!r})")
        kind = r.random()
        if kind < 0.55 or (i == 0 and kind < 0.7):
            value = g.bounded(t, g.expr(t, ctx, r.randint(1, 3)))
            if g.extra.random() < 0.1:  # no pure value: an update defines every element
                # (over a one-point RDom: Halide warns about an update of pure variables alone)
                L.append(f"    {name}[{lhs}] = hl.undef({HL_TYPE[t]})")
                L.append(f"    u{name} = hl.RDom([(0, 1)], 'u{name}')")
                value = f"{value} + hl.cast({HL_TYPE[t]}, u{name}.x)"
            L.append(f"    {name}[{lhs}] = {value}")
        elif kind < 0.85:
            _reduction(g, name, t, ctx, inputs, lhs)
        else:
            _histogram(g, name, t, ctx, lhs)
        funcs.append(_Producer(name, t))
    outputs = [funcs[-1].name]
    if len(funcs) > 1 and r.random() < 0.3:
        outputs.append(r.choice(funcs[:-1]).name)
    params = ", ".join(f"{n!r}: {n}" for n in inputs + [p for p, _ in g.params])
    L.append(f"    return [{', '.join(outputs)}], {{{params}}}, "
             f"[{', '.join(f.name for f in funcs)}]")
    return "\n".join(L), inputs, [p for p, _ in g.params], dims, in_types, outputs, \
        dict(g.params)


def _reduction(g: _Gen, name: str, t: str, ctx: _Ctx, inputs, lhs: str) -> None:
    r = g.rng
    op = r.choice(("sum", "sum", "product", "min", "max"))
    rdom = f"r{name}"
    direct_input = None
    if op != "product" and r.random() < 0.2:
        direct_input = r.choice(inputs)
        g.lines.append(f"    {rdom} = hl.RDom([(0, {direct_input}.width())], {rdom!r})")
        rvars = [f"{rdom}.x"]
    else:
        n = r.choice((1, 1, 2))
        boxes = [(r.choice((0, 0, -1, 1)), r.choice((1, 2, 3, 4) if op != "product" else (1, 2)))
                 for _ in range(n)]
        floats = [p for p, pt in g.params if pt == "f32"]
        if floats and g.extra.random() < 0.3:  # an extent computed from a float Param
            p = g.extra.choice(floats)
            g.used_params.add(p)
            extents = [f"hl.clamp(hl.cast(hl.Int(32), hl.ceil({p} * 2)), 1, {e})"
                       for _, e in boxes]
            g.lines.append(f"    {rdom} = hl.RDom([{', '.join(f'({lo}, {e})' for (lo, _), e in zip(boxes, extents))}], {rdom!r})")
        else:
            g.lines.append(f"    {rdom} = hl.RDom({boxes!r}, {rdom!r})")
        rvars = [f"{rdom}.{c}" for c in "xy"[:n]]
        if op == "sum" and r.random() < 0.15:
            v = r.choice(VARS[:ctx.dims])
            g.lines.append(f"    {rdom}.where({rvars[0]} <= {v} + {r.randint(-1, 2)})")
        if op == "sum" and g.extra.random() < 0.2:  # a condition that is not affine
            g.lines.append(f"    {rdom}.where({rvars[-1]} * {rvars[-1]} <= "
                           f"{g.extra.randint(0, 4)})")
    if op in ("min", "max") and direct_input is None and g.extra.random() < 0.3:
        # where the extremum is: Halide's inline argmin/argmax, a Tuple-valued update
        term = g.bounded(t, g.expr(t, _Ctx(ctx.dims, ctx.producers, rvars), r.randint(1, 2)))
        where = f"hl.arg{op}({rdom}, {term})[{g.extra.randrange(len(rvars) + 1)}]"
        g.lines.append(f"    {name}[{lhs}] = {g.cast('i32', t, where) if g.extra.random() < 0.7 else g.bounded(t, where)}")
        return
    init = g.bounded(t, g.expr(t, _Ctx(ctx.dims, ctx.producers), r.randint(0, 2)))
    g.lines.append(f"    {name}[{lhs}] = {init}")
    if direct_input is not None:
        rest = ", ".join(VARS[1:ctx.dims])
        src = next(p for p in ctx.producers if p.is_input and p.input == direct_input)
        term = g.cast(src.type, t, f"@{direct_input}@[{rdom}.x{', ' + rest if rest else ''}]")
        if r.random() < 0.5:
            term = f"({term} + {g.expr(t, _Ctx(ctx.dims, ctx.producers), 1)})"
    else:
        term = g.expr(t, _Ctx(ctx.dims, ctx.producers, rvars), r.randint(1, 2))
    me = f"{name}[{lhs}]"
    if op == "sum":
        term = f"hl.clamp({term}, {g._c(t, 0 if t == 'u8' else -8)}, {g._c(t, 8)})"
        g.lines.append(f"    {me} += {term}" if r.random() < 0.5 else f"    {me} = {me} + {term}")
    elif op == "product":
        if t == "f32":
            term = f"hl.round({term})"
        term = f"hl.clamp({term}, {g._c(t, 0 if t == 'u8' else -2)}, {g._c(t, 2)})"
        g.lines.append(f"    {me} = {me} * {term}")
    else:
        term = g.bounded(t, term)
        g.lines.append(f"    {me} = hl.{op}({me}, {term})")


def _histogram(g: _Gen, name: str, t: str, ctx: _Ctx, lhs: str) -> None:
    """h[v] = 0; h[clamp(data(r), 0, bins - 1), rest] += weight(r)."""
    r = g.rng
    rdom, bins = f"r{name}", r.choice((4, 8, 17))
    g.lines.append(f"    {rdom} = hl.RDom([(0, {r.choice((3, 5, 7))})], {rdom!r})")
    g.lines.append(f"    {name}[{lhs}] = {g._c(t, 0)}")
    data_ctx = _Ctx(ctx.dims, ctx.producers, [f"{rdom}.x"], ("x",))
    g.tables = False
    data = g.expr("i32", data_ctx, r.randint(0, 2))
    g.tables = True
    weight = g._c(t, 1) if r.random() < 0.6 else \
        f"hl.clamp({g.expr(t, data_ctx, 1)}, {g._c(t, 0)}, {g._c(t, 3)})"
    rest = VARS[1:ctx.dims]
    target = ", ".join([f"hl.clamp({data}, 0, {bins - 1})", *rest])
    g.lines.append(f"    {name}[{target}] += {weight}")


# -- sizes and values --------------------------------------------------------------------------

def _render(body: str, inputs, modes: dict, boundary_lines: list[str]) -> str:
    for n in inputs:
        body = body.replace(f"@{n}@", n if modes[n] == "direct" else f"{n}_b")
    body = body.replace("@BOUNDARIES@", "\n".join(boundary_lines) or "    pass")
    return "import halide as hl\nimport numpy as np\n\n\ndef build():\n" + body + "\n"


def build(source: str):
    """(outputs, {name: ImageParam or Param}, every Func generated) of a fresh copy of the
    pipeline."""
    space: dict = {}
    exec(compile(source, "<halide pipeline>", "exec"), space)  # noqa: S102 - our own text
    return space["build"]()


def _required(source: str, shapes, scalars: dict, extents: dict) -> dict:
    """{input: [(min, max)] in Halide order} that Halide's bounds inference (through tcstage's
    native helper: no JIT) asks for over the outputs' boxes, with the inputs' Halide-order
    `extents`; (0, -1) where it asks for nothing. (The reference's realize checks it.)"""
    from tcstage.halide import _native
    from tcstage.halide.pipeline import _constant

    outs, params, _ = build(source)
    import halide as hl

    # (a data-dependent subscript may read a Float(32) Param: the region depends on its value)
    known = {n: v if isinstance(v, int) else hl.f32(v) for n, v in scalars.items()}
    for n, ext in extents.items():
        for k, e in enumerate(ext):
            known[f"{n}.min.{k}"], known[f"{n}.extent.{k}"] = 0, e
    boxes = [[(0, e - 1) for e in reversed(s)] for s in shapes]
    found = _native.required_regions(outs, boxes, known)
    names = {f.name(): i for i, f in enumerate(outs)}
    return {(names[n] if n in names else n): [tuple(_constant(t, n) for t in dim) for dim in dims]
            for n, dims in found.items() if n in extents or n in names}


def _shapes(rng: random.Random, dims: int, n_out: int, limit: int, smaller_than=None):
    out = []
    for i in range(n_out):
        while True:
            if smaller_than is None:
                s = tuple(rng.choice(SIZES) for _ in range(dims))
            else:
                s = tuple(rng.choice([v for v in SIZES if v <= m] or [1])
                          for m in smaller_than[i])
            if int(np.prod(s)) <= limit:
                break
        out.append(s)
    return tuple(out)


def _values(rng: np.random.Generator, t: str, shape) -> np.ndarray:
    if t == "f32":
        return (rng.integers(-16, 17, shape) / 4).astype(np.float32)
    lo = 0 if t == "u8" else -8
    return rng.integers(lo, 21 if t == "u8" else 9, shape).astype(NUMPY[t])


def case(seed: int) -> Case:
    """The pipeline and calls of `seed`. An input that bounds inference would read below 0
    (tcstage's inputs start at 0) is read through a boundary condition."""
    body, inputs, params, dims, in_types, outputs, ptypes = _generate(seed)
    rng = random.Random(f"halide-sizes/{seed}")
    modes = {n: "direct" if rng.random() < 0.5 else rng.choice(BOUNDARIES) for n in inputs}
    nrng = np.random.default_rng(seed)
    limit = {1: 40, 2: 600, 3: 400}[dims]
    first = _shapes(rng, dims, len(outputs), limit)
    second = _shapes(rng, dims, len(outputs), limit, smaller_than=first)
    scalar_sets = [{p: (rng.randint(-3, 3) if ptypes[p] == "i32" else rng.randint(-8, 8) / 4)
                    for p in params} for _ in range(2)]
    extra = {n: [rng.choice(SIZES) for _ in range(dims)] for n in inputs}
    for _attempt in range(len(inputs) + 2):
        source = _render(body, inputs, modes, _boundaries(inputs, in_types, modes, rng))
        sizes = []
        for shapes, scalars in zip((first, second), scalar_sets):
            extents = {n: list(extra[n]) for n in inputs}
            for _ in range(3):  # (a width RDom reads what the width is)
                need = _required(source, shapes, scalars, extents)
                grown = {n: [max(e, hi + 1) if modes[n] == "direct" else e
                             for e, (lo, hi) in zip(extents[n], need.get(n, [(0, -1)] * dims))]
                         for n in inputs}
                if grown == extents:
                    break
                extents = grown
            # An update of an output may write past the box asked for (a histogram's bins): the
            # output is made that large (tcstage refuses smaller ones, as documented).
            shapes = tuple(tuple(max(e, need[i][k][1] + 1) for k, e in
                                 zip(range(len(s) - 1, -1, -1), s)) if i in need else s
                           for i, s in enumerate(shapes))
            sizes.append((extents, need, shapes))
        low = [n for n in inputs if modes[n] == "direct" and any(
            lo < 0 and hi >= lo for _, need, _ in sizes for lo, hi in need.get(n, ()))]
        if len(outputs) > 1 and any(lo < 0 for _, need, _ in sizes for i in range(len(outputs))
                                    for lo, _ in need.get(i, ())):
            # (the second output is read below 0 by the first: Halide computes an output over
            # its buffer only, so it refuses the pair; the first output alone it is)
            body = re.sub(r"return \[(\w+), \w+\]", r"return [\1]", body)
            outputs, first, second = outputs[:1], first[:1], second[:1]
            continue
        if not low:
            break
        for n in low:
            modes[n] = rng.choice(BOUNDARIES)
    else:
        raise AssertionError(f"seed {seed}: an input read below 0 through a boundary condition")
    calls = []
    for scalars, (extents, _, shapes) in zip(scalar_sets, sizes):
        args = {n: _values(nrng, in_types[n], tuple(reversed(extents[n]))) for n in inputs}
        for p in params:
            args[p] = scalars[p]
        calls.append(Call(args, shapes))
    return Case(seed, source, tuple(calls))


def _boundaries(inputs, in_types, modes, rng) -> list[str]:
    lines = []
    for n in inputs:
        m = modes[n]
        if m == "direct":
            continue
        if m == "constant_exterior":
            v = rng.randint(0, 5) if in_types[n] != "f32" else rng.randint(-8, 8) / 4
            lines.append(f"    {n}_b = hl.BoundaryConditions.constant_exterior({n}, "
                         f"hl.cast({HL_TYPE[in_types[n]]}, {v}))")
        else:
            lines.append(f"    {n}_b = hl.BoundaryConditions.{m}({n})")
    return lines


# -- the reference and the check ---------------------------------------------------------------

def reference(c: Case, call: Call) -> list[np.ndarray]:
    """Halide's realize of a fresh copy, every intermediate Func computed at the root (a
    schedule changes no value), one output at a time."""
    import halide as hl

    results = []
    n_out = len(build(c.source)[0])
    for i in range(n_out):
        outs, params, funcs = build(c.source)
        for n, p in params.items():
            if n in call.args:
                if isinstance(p, hl.ImageParam):
                    p.set(hl.Buffer(np.ascontiguousarray(call.args[n])))
                else:
                    p.set(call.args[n])
        for f in funcs:
            if f.name() != outs[i].name():
                f.compute_root()
        buf = hl.Pipeline([outs[i]]).realize(list(reversed(call.shapes[i])))
        results.append(np.array(buf))
    return results


def arguments(fn, call: Call) -> list:
    """The call's values in the order tcstage takes them (Halide's infer_arguments)."""
    return [call.args[a.name] for a in fn.arguments]


def compare(expected: list, got) -> str | None:
    outs = got if isinstance(got, tuple) else (got,)
    if len(outs) != len(expected):
        return f"{len(outs)} results for {len(expected)} outputs"
    for i, (e, g) in enumerate(zip(expected, outs)):
        g = np.asarray(g)
        if g.shape != e.shape:
            return f"output {i}: shape {g.shape}, expected {e.shape}"
        if g.dtype != e.dtype:
            return f"output {i}: dtype {g.dtype}, expected {e.dtype}"
        bad = ~((g == e) | (np.isnan(g) & np.isnan(e)) if g.dtype.kind == "f" else (g == e))
        if bad.any():
            at = tuple(int(v) for v in np.argwhere(bad)[0])
            return (f"output {i}{list(at)}: got {g[at]!r}, expected {e[at]!r} "
                    f"({int(bad.sum())} of {bad.size} elements differ)")
    return None


def check(c: Case, options=(), *, schedules=SCHEDULES, progress=None,
          slow_s: float = 60.0) -> list:
    """Every finding for case `c`: each CPU schedule at both calls' sizes on one function, the
    caller's Funcs left unscheduled, and each MappingOptions emulated at the first call's."""
    import tcstage as tc
    from tcstage.halide import _native

    from . import mapping
    from .differential import Finding, _error

    findings: list = []

    def stage(name, options, fn):
        if progress:
            progress(name, options)
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            kind, error, detail = _error(e)
            findings.append(Finding(c.seed, kind, name, _opt(options), error, detail))
            return False, None
        if time.perf_counter() - start > slow_s:
            findings.append(Finding(c.seed, "slow", name, _opt(options), "slow",
                                    f"{time.perf_counter() - start:.1f} s"))
        return True, value

    def result(name, options, expected, got):
        why = compare(expected, got)
        if why:
            findings.append(Finding(c.seed, "mismatch", name, _opt(options), "mismatch", why))

    try:
        expected = [reference(c, call) for call in c.calls]
    except Exception as e:  # noqa: BLE001 - the generator made a pipeline Halide refuses
        return [Finding(c.seed, "harness", "reference", None, type(e).__name__, str(e)[:300])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs, _, _ = build(c.source)
        ok, fn = stage("from_halide", None, lambda: tc.from_halide(outs, name=f"fuzz{c.seed}"))
        if not ok:
            return findings
        for schedule in schedules:
            for k, (call, exp) in enumerate(zip(c.calls, expected)):
                name = f"cpu-{schedule}" + ("" if k == 0 else f"-call{k + 1}")
                ok, got = stage(name, None, lambda: fn(*arguments(fn, call),
                                                        output_shape=list(call.shapes),
                                                        schedule=schedule))
                if ok:
                    result(name, None, exp, got)
        left = _native.scheduled_functions(outs)
        if left:
            findings.append(Finding(c.seed, "mismatch", "caller-scheduled", None, "scheduled",
                                    f"the caller's Funcs were scheduled: {left}"))
        call, exp = c.calls[0], expected[0]
        todo = list(options)
        for o in todo:  # (a kernel of several launches adds its per-launch list)
            ok, kernel = stage("compile", o, lambda: tc.compile(
                fn, *arguments(fn, call), output_shape=list(call.shapes), options=o,
                target="cuda-emulated"))
            if ok:
                todo += mapping.per_launch(o, kernel)
                ok, got = stage("emulate", o, lambda: kernel(*arguments(fn, call)))
                if ok:
                    result("emulate", o, exp, got)
    return findings


def _opt(options) -> str | None:
    if isinstance(options, list):  # one set per launch
        return "[" + ", ".join(map(str, options)) + "]"
    return None if options is None else str(options)


def reproducer(c: Case, finding) -> str:
    """A script that replays `finding` of case `c`."""
    calls = [{"args": {n: (v.tolist() if isinstance(v, np.ndarray) else v)
                       for n, v in call.args.items()},
              "dtypes": {n: str(v.dtype) for n, v in call.args.items()
                         if isinstance(v, np.ndarray)},
              "shapes": call.shapes} for call in c.calls]
    return (f"# {finding}\n"
            f"# regenerate: tests/fuzz/halide_pipelines.case({c.seed})\n"
            f"{c.source}\n\nCALLS = {calls!r}\n")
