"""Random well-formed TC functions with their inputs: `case(seed)` is deterministic.

A program is built one statement at a time; each candidate statement is checked by running the
reference (reference.py) on the program so far, and is kept only if the program stays
well-formed (every range bounded and non-empty, every read in bounds and of written elements,
no overflow, no NaN). So the generator may write anything the language allows (affine, reversed,
strided and scalar-strided subscripts, convolution-like sums of indices, integer division,
indirect reads through integer index tensors, constants, every reduction operator with and
without '!', `where` clauses in both syntaxes, temporaries, in/out outputs, rank-0 tensors,
updates after uses, initialise-then-accumulate pairs, mixed float/double/int types; with the
"scatter" feature, accumulations at computed subscripts) and the reference decides what is valid.

Values: floats are multiples of 1/4 in [-2, 2] and integers small, so that +, -, *, min, max
and division by powers of two are exact in float32. Each expression's exactness is tracked
(fraction and magnitude bits, `_Precision`); operations that turn a rounding difference into a
large one (comparisons, floor/round, fmod, %) are only applied to exact operands, so the
comparison of results can be exact where the values are, and tolerant only where a
transcendental function made them inexact.
"""

from __future__ import annotations

import math
import random

import attrs
import numpy as np

from . import nodes as N
from . import reference as R


@attrs.frozen
class Case:
    """A program, the values of its inputs and in/out outputs, and what the reference computed."""

    seed: int
    program: N.Program
    values: dict  # input -> array or scalar
    inout_values: dict  # in/out output -> its starting values
    expected: R.Result
    exact: dict  # output -> whether its values are exact (compare bit for bit)

    @property
    def source(self) -> str:
        return self.program.source

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def args(self) -> tuple:
        """Positional arguments in signature order."""
        return tuple(self.values[i.name] for i in self.program.inputs)

    def fresh_outs(self):
        """Copies of the in/out starting values in output order (calls update them in place)."""
        copies = tuple(np.array(self.inout_values[o], copy=True) for o in self.program.outputs
                       if o in self.program.inout_shapes)
        if not copies:
            return None
        return copies[0] if len(copies) == 1 else copies


def make_case(seed: int, p: N.Program, values: dict, inout_values: dict,
              refuse_pieces: bool = False) -> Case:
    """Runs the reference on p; raises reference.Invalid if p is not well-formed."""
    values = {i.name: values[i.name] for i in p.inputs}
    inout_values = {o: inout_values[o] for o in p.inout_shapes}
    expected = R.run(p, values, inout_values, refuse_pieces=refuse_pieces)
    precisions = exactness(p, expected)
    exact = {o: precisions[o].fits(expected.types[o]) for o in p.outputs}
    return Case(seed, p, values, inout_values, expected, exact)


class _Retry(Exception):
    pass


# -- precision bookkeeping -----------------------------------------------------------------------

@attrs.frozen
class _Precision:
    """Values are multiples of 2**-frac below 2**mag in magnitude; exact if nothing rounded."""

    exact: bool
    frac: int
    mag: int

    def fits(self, t: str) -> bool:
        return self.exact and (not N.is_float(t) or self.frac + self.mag <= (
            22 if t == "float32" else 50))


_INEXACT_FNS = {"exp", "log", "sqrt", "tanh", "sin", "cos", "sigmoid", "exp2", "atan", "erf",
                "pow", "atan2"}
_STEP_FNS = {"floor", "ceil", "round", "trunc"}


def _literal_bits(value: float) -> tuple[int, int]:
    frac = 0
    while value * 2 ** frac != int(value * 2 ** frac):
        frac += 1
    return frac, max(1, math.ceil(math.log2(abs(value) + 1)))


def precision(e: N.Expr, tensors: dict) -> _Precision:
    """How exact e is, given each tensor's `_Precision`."""
    p = lambda x: precision(x, tensors)  # noqa: E731
    if isinstance(e, N.Num):
        return _Precision(True, *_literal_bits(float(e.value)))
    if isinstance(e, (N.Var, N.Size, N.Dim)):
        return _Precision(True, 0, 7)
    if isinstance(e, N.Scalar):
        return _Precision(True, 0 if e.type in N.INT_TYPES else 2, 2)
    if isinstance(e, N.Read):
        return tensors[e.tensor]
    if isinstance(e, N.Unary):
        x = p(e.x)
        return x if e.op == "-" else _Precision(x.exact, 0, 1)
    if isinstance(e, N.Binary):
        a, b = p(e.a), p(e.b)
        exact = a.exact and b.exact
        if e.op in N.COMPARISONS or e.op in ("&&", "||"):
            return _Precision(exact, 0, 1)
        if e.op in "+-":
            out = _Precision(exact, max(a.frac, b.frac), max(a.mag, b.mag) + 1)
        elif e.op == "*":
            out = _Precision(exact, a.frac + b.frac, a.mag + b.mag)
        elif e.type in N.INT_TYPES:  # / and % of integers
            out = _Precision(exact, 0, a.mag)
        elif isinstance(e.b, N.Num) and float(e.b.value) in (2.0, 4.0):
            out = _Precision(exact, a.frac + int(math.log2(float(e.b.value))), a.mag)
        else:
            out = _Precision(False, 0, a.mag + 8)
        return attrs.evolve(out, exact=out.fits(e.type))
    if isinstance(e, N.Call):
        xs = [p(a) for a in e.args]
        exact = all(x.exact for x in xs)
        fn = e.canonical
        if fn in _STEP_FNS:
            return _Precision(exact, 0, xs[0].mag)
        if fn in ("fabs", "abs", "max", "min", "fmax", "fmin", "fmod"):
            return attrs.evolve(_Precision(exact, max(x.frac for x in xs), max(x.mag for x in xs)),
                                exact=exact and _Precision(exact, max(x.frac for x in xs),
                                                           max(x.mag for x in xs)).fits(e.type))
        mag = {"exp": min(200, int(2 ** min(xs[0].mag, 7) * 1.45) + 1),
               "exp2": min(200, 2 ** min(xs[0].mag, 7) + 1), "sqrt": xs[0].mag // 2 + 1,
               "log": max(2, xs[0].mag), "pow": 4 * xs[0].mag}.get(fn, 2)
        return _Precision(False, 0, mag)
    if isinstance(e, N.Select):
        c, a, b = p(e.cond), p(e.a), p(e.b)
        return _Precision(c.exact and a.exact and b.exact, max(a.frac, b.frac), max(a.mag, b.mag))
    raise TypeError(e)



def input_precision(i: N.Input) -> _Precision:
    """What the generator's input values are: quarters in [-2, 2], small integers, indices."""
    if i.index_bound is not None:
        return _Precision(True, 0, 3)
    return _Precision(True, 2 if N.is_float(i.type) else 0, 2)


def exactness(p: N.Program, result: R.Result) -> dict:
    """Each tensor's precision after all statements of p (result: the reference's run)."""
    known = {i.name: input_precision(i) for i in p.inputs}
    for n, st in enumerate(p.statements):
        t = result.types[st.tensor]
        old = known.get(st.tensor)
        if old is None and st.tensor in p.inout_shapes:
            old = known[st.tensor] = _Precision(True, 2, 2)  # the caller's values
        q = precision(st.rhs, known)
        if N.is_float(st.rhs.type) and not N.is_float(t):
            q = _Precision(q.exact, 0, q.mag)
        terms = int(np.prod([hi - lo for v, (lo, hi) in result.ranges[n].items()
                             if v in st.reduction_vars]))
        if st.op == "+":
            q = _Precision(q.exact, q.frac, q.mag + math.ceil(math.log2(max(terms, 1))))
        elif st.op == "*":
            q = _Precision(q.exact, q.frac * terms, q.mag * terms)
        if old is not None:
            exact = q.exact and old.exact
            if st.op == "+" and not st.init:
                q = _Precision(exact, max(q.frac, old.frac), max(q.mag, old.mag) + 1)
            elif st.op == "*" and not st.init:
                q = _Precision(exact, q.frac + old.frac, q.mag + old.mag)
            else:  # elements outside the statement's range keep their old values
                q = _Precision(exact, max(q.frac, old.frac), max(q.mag, old.mag))
        known[st.tensor] = attrs.evolve(q, exact=q.fits(t))
    return known


# -- the generator ---------------------------------------------------------------------------------

_SIZE_NAMES = ("N", "M", "K", "P", "Q", "R", "S", "L")
_INPUT_NAMES = ("A", "B", "C", "D", "E", "I0", "I1", "W", "Y", "Z")
_ODD_TENSOR_NAMES = ("expf", "NULL", "NAN", "INFINITY", "sqrtf", "int", "threadIdx", "printf")
_ODD_FUNCTION_NAMES = ("main", "int", "float", "class", "printf", "threadIdx", "__syncthreads",
                       "2fn", "if")
_VAR_NAMES = ("i", "j", "k", "l", "m", "n", "p", "q", "r", "kh", "x1", "_v")
_TYPES = (("float32", 70), ("float64", 10), ("int32", 20))


def _weighted(rng: random.Random, pairs):
    values, weights = zip(*pairs)
    return rng.choices(values, weights)[0]


def _float_literal(rng: random.Random, value: float) -> N.Num:
    text = repr(float(value))
    form = rng.random()
    if form < 0.15:
        text += "f"
    elif form < 0.22 and text.startswith("0."):
        text = text[1:]
    elif form < 0.27:
        text = f"{value:e}"
    return N.Num(text, float(value), "float32")


def _int_literal(rng: random.Random, value: int) -> N.Num:
    form = rng.random()
    text = str(value)
    if form < 0.05 and value > 0:
        text = hex(value)
    elif form < 0.08 and value > 7:
        text = "0" + oct(value)[2:]
    return N.Num(text, value, "int32")


class _Generator:
    def __init__(self, rng: random.Random, features: frozenset):
        self.rng, self.features = rng, features
        self.sizes: dict = {}
        self.inputs: list[N.Input] = []
        self.values: dict = {}  # input -> value
        self.statements: list[N.Statement] = []
        self.outputs: list[str] = []
        self.inout: dict = {}  # in/out output -> shape
        self.inout_values: dict = {}
        self.types: dict = {}  # defined tensor -> type
        self.precision: dict = {}  # tensor -> _Precision
        self.shapes: dict = {}  # tensor -> (mins, extents), from the reference
        self.index_inputs: list[N.Input] = []
        self.stride: str | None = None
        self.name = "f"

    # -- signature ---------------------------------------------------------------------------
    def signature(self) -> None:
        rng = self.rng
        if "odd_names" in self.features and rng.random() < 0.05:
            self.name = rng.choice(_ODD_FUNCTION_NAMES)
        names = rng.sample(_SIZE_NAMES, rng.choice((1, 2, 2, 3, 3)))
        self.sizes = {n: rng.choice((1, 2, 3, 3, 4, 4, 5, 6)) for n in names}
        pool = list(_INPUT_NAMES)
        if "odd_names" in self.features and rng.random() < 0.05:
            pool[rng.randrange(len(pool))] = rng.choice(_ODD_TENSOR_NAMES)
        rng.shuffle(pool)
        for _ in range(rng.choice((1, 2, 2, 3, 3, 4))):
            rank = _weighted(rng, ((0, 8), (1, 35), (2, 37), (3, 20)))
            t = _weighted(rng, _TYPES)
            dims = tuple(rng.choice(names) if rng.random() < 0.9 else str(rng.randint(1, 5))
                         for _ in range(rank))
            self.add_input(N.Input(pool.pop(), t, dims))
        data_dims = sorted({d for i in self.inputs for d in i.dims})
        if data_dims and "indirect" in self.features and rng.random() < 0.4:
            rank = rng.choice((1, 1, 2))
            dims = tuple(rng.choice(names) for _ in range(rank))
            self.add_input(N.Input("X" if "X" not in pool else pool.pop(), "int32", dims,
                                   index_bound=rng.choice(data_dims)))
        if "strides" in self.features and rng.random() < 0.12:
            self.stride = "s"
            self.add_input(N.Input("s", "int32", ()))
        if "scatter" in self.features:  # material for computed subscripts
            if data_dims and not self.index_inputs and rng.random() < 0.5:
                dims = tuple(rng.choice(names) for _ in range(rng.choice((1, 1, 2))))
                self.add_input(N.Input("X", "int32", dims, index_bound=rng.choice(data_dims)))
            if rng.random() < 0.3:
                self.inputs.append(N.Input("t", "int32", ()))
                self.values["t"] = rng.randint(0, 2)
        rng.shuffle(self.inputs)
        # A size variable no input declares is not a size variable: TC would take it for an
        # index variable.
        used = {d for i in self.inputs for d in i.dims}
        self.sizes = {n: v for n, v in self.sizes.items() if n in used}

    def size_value(self, d: str) -> int:
        return int(d) if d.isdigit() else self.sizes[d]

    def add_input(self, i: N.Input) -> None:
        rng = self.rng
        shape = tuple(self.size_value(d) for d in i.dims)
        if i.index_bound is not None:
            value = np.array([rng.randrange(self.size_value(i.index_bound))
                              for _ in range(int(np.prod(shape)))], np.int32).reshape(shape)
            self.index_inputs.append(i)
        elif not i.dims:
            if i.name == self.stride:
                value = rng.randint(1, 3)
            else:
                value = rng.randint(-8, 8) / 4 if N.is_float(i.type) else rng.randint(-3, 3)
        elif N.is_float(i.type):
            value = (np.array([rng.randint(-8, 8) for _ in range(int(np.prod(shape)))]) / 4
                     ).astype(i.type).reshape(shape)
        else:
            value = np.array([rng.randint(-3, 3) for _ in range(int(np.prod(shape)))],
                             i.type).reshape(shape)
        self.inputs.append(i)
        self.values[i.name] = value
        self.precision[i.name] = input_precision(i)
        self.shapes[i.name] = ((0,) * len(shape), shape)

    # -- the program so far ------------------------------------------------------------------
    def program(self, statements, outputs, inout) -> N.Program:
        scalars = {i.name: self.values[i.name] for i in self.inputs if not i.dims}
        return N.Program(self.name, tuple(self.inputs), tuple(outputs), tuple(statements),
                         dict(self.sizes), dict(inout), scalars)

    def run_reference(self, statements, outputs, inout, inout_values) -> R.Result:
        p = self.program(statements, outputs, inout)
        return R.run(p, {i.name: self.values[i.name] for i in self.inputs}, inout_values,
                     refuse_pieces="scatter" in self.features)

    # -- statements --------------------------------------------------------------------------
    def fresh_vars(self, n: int) -> list[str]:
        return self.rng.sample(_VAR_NAMES, n)

    def readable(self, exclude: str | None) -> list[str]:
        names = [i.name for i in self.inputs if i.dims and i.index_bound is None]
        names += [t for t in self.types if t != exclude and self.shapes[t][1]]
        return names

    def subscript(self, var: str, others: list[str], dim_size: int, dim_name: str | None,
                  lo: int) -> N.Expr:
        """A subscript that `var` appears in (others: variables it may be combined with)."""
        rng = self.rng
        v = N.Var(var)
        two = _int_literal(rng, 2)
        r = rng.random()
        if r < 0.55:
            return v
        if r < 0.65:
            c = rng.randint(1, 2)
            return N.binary(rng.choice("+-"), v, _int_literal(rng, c))
        if r < 0.70 and dim_name and not dim_name.isdigit():
            # reversed: N - 1 - v (plus the dimension's start)
            e = N.binary("-", N.binary("-", N.Size(dim_name), _int_literal(rng, 1)), v)
            return N.binary("+", e, _int_literal(rng, lo)) if lo else e
        if r < 0.74 and "strides" in self.features:
            base = N.binary("*", two, v) if not self.stride or rng.random() < 0.5 else \
                N.binary("*", N.Scalar(self.stride, "int32"), v)
            if others and rng.random() < 0.6:
                return N.binary("+", base, N.Var(rng.choice(others)))
            return N.binary("+", base, _int_literal(rng, 1)) if rng.random() < 0.3 else base
        if r < 0.86 and others:
            return N.binary("+", v, N.Var(rng.choice(others)))
        if r < 0.89:
            return N.binary("/", v, two)
        if r < 0.905:
            return N.binary("-", N.binary("*", two, v), v)  # 2*v - v: affine, not syntactic
        return N.binary("+", v, _int_literal(rng, lo)) if lo else v

    def index_read(self, dim_name: str, vars_: list[str]) -> N.Expr | None:
        candidates = [i for i in self.index_inputs if i.index_bound == dim_name]
        if not candidates:
            return None
        x = self.rng.choice(candidates)
        return N.Read(x.name, tuple(N.Var(self.rng.choice(vars_)) for _ in x.dims), "int32")

    def read_of(self, tensor: str, anchor: str | None, vars_: list[str]) -> N.Read:
        """A read of `tensor` that mentions `anchor` (if given) and other statement variables."""
        rng = self.rng
        mins, extents = self.shapes[tensor]
        rank = len(extents)
        dims = self.dim_names(tensor)
        anchor_dim = rng.randrange(rank) if anchor else -1
        args = []
        for k in range(rank):
            if k == anchor_dim:
                args.append(self.subscript(anchor, [v for v in vars_ if v != anchor],
                                           extents[k], dims[k], mins[k]))
                continue
            r = rng.random()
            if r < 0.08:
                args.append(_int_literal(rng, rng.randrange(extents[k]) + mins[k]) if
                            mins[k] + extents[k] > 0 else N.Var(rng.choice(vars_)))
            elif r < 0.35 and dims[k] is not None and (x := self.index_read(dims[k], vars_)):
                args.append(x)
            else:
                var = rng.choice(vars_)
                args.append(self.subscript(var, [v for v in vars_ if v != var], extents[k],
                                           dims[k], mins[k]) if rng.random() < 0.4 else N.Var(var))
        return N.Read(tensor, tuple(args), self.type_of(tensor), bare=False)

    def dim_names(self, tensor: str) -> list:
        for i in self.inputs:
            if i.name == tensor:
                return list(i.dims)
        return [None] * len(self.shapes[tensor][1])

    def type_of(self, tensor: str) -> str:
        for i in self.inputs:
            if i.name == tensor:
                return i.type
        return self.types[tensor]

    def leaf(self, vars_: list[str], target: str | None) -> N.Expr:
        rng = self.rng
        r = rng.random()
        scalars = [i for i in self.inputs if not i.dims and i.name != self.stride]
        rank0 = [t for t in self.types if t != target and not self.shapes[t][1]]
        if r < 0.35:
            return _float_literal(rng, rng.randint(-8, 8) / 4)
        if r < 0.5:
            return _int_literal(rng, rng.randint(0, 4))
        if r < 0.62 and vars_:
            return N.Var(rng.choice(vars_))
        if r < 0.7 and self.sizes:
            return N.Size(rng.choice(sorted(self.sizes)))
        if r < 0.82 and scalars:
            s = rng.choice(scalars)
            return N.Scalar(s.name, s.type)
        if r < 0.95 and rank0:
            t = rng.choice(rank0)
            return N.Read(t, (), self.types[t], bare=rng.random() < 0.3)
        tensors = self.readable(target)
        if tensors:
            return self.read_of(rng.choice(tensors), None, vars_) if vars_ else \
                _float_literal(rng, 0.5)
        return _float_literal(rng, 1.0)

    def exact(self, e: N.Expr) -> bool:
        return precision(e, self.precision).fits(e.type)

    def combine(self, parts: list[N.Expr], vars_: list[str], target: str | None,
                depth: int = 0) -> N.Expr:
        """Joins the given subexpressions (all must appear) with random operators."""
        rng = self.rng
        while len(parts) < 2 and rng.random() < 0.5:
            parts.append(self.leaf(vars_, target))
        rng.shuffle(parts)
        e = self.decorate(parts[0], vars_, target)
        for x in parts[1:]:
            e = self.join(e, self.decorate(x, vars_, target), vars_, target)
        return e

    def join(self, a: N.Expr, b: N.Expr, vars_, target) -> N.Expr:
        rng = self.rng
        r = rng.random()
        numeric = a.type != "bool" and b.type != "bool"
        if r < 0.55 or not numeric:
            op = _weighted(rng, (("+", 4), ("-", 2), ("*", 3)))
            return N.binary(op, a, b)
        if r < 0.7:
            fn = rng.choice(("max", "min", "fmax", "fmin", "fmaxf"))
            return N.call(fn, a, b)
        if r < 0.85 and self.exact(a) and self.exact(b):
            cond = N.binary(rng.choice(N.COMPARISONS), a, self.leaf(vars_, target))
            if not self.exact(cond):
                return N.binary("+", a, b)
            if rng.random() < 0.2:
                cond = N.binary(rng.choice(("&&", "||")), cond,
                                N.binary("<", self.leaf(vars_, target), b))
                if not self.exact(cond):
                    return N.binary("+", a, b)
            return N.select(cond, a, b)
        if r < 0.9 and a.type in N.INT_TYPES and b.type in N.INT_TYPES:
            divided = N.binary(rng.choice("/%"), a, _int_literal(rng, rng.randint(1, 3)))
            return N.binary("+", divided, b)
        if r < 0.95 and N.is_float(a.type):
            halved = N.binary("/", a, _float_literal(rng, rng.choice((2.0, 4.0))))
            return N.binary("-", halved, b)
        if N.is_float(a.type) and self.exact(a) and "fmod" in self.features:
            return N.binary("+", N.call("fmod", a, _float_literal(rng, 1.5)), b)
        return N.binary("-", a, b)

    def decorate(self, e: N.Expr, vars_, target) -> N.Expr:
        rng = self.rng
        r = rng.random()
        if r < 0.7 or e.type == "bool":
            return e
        if r < 0.78:
            return N.unary("-", e)
        if r < 0.84:
            return N.call(rng.choice(("fabs", "abs")), e)
        if r < 0.9 and self.exact(e):
            return N.call(rng.choice(("floor", "ceil", "round", "trunc", "floorf")), e)
        fn = rng.choice(("exp", "tanh", "sigmoid", "sin", "cos", "sqrt", "log", "expf", "erf",
                         "atan"))
        if fn in ("sqrt", "log"):
            e = N.binary("+", N.call("fabs", e), _float_literal(rng, 1.0))
        if fn in ("exp", "expf") and precision(e, self.precision).mag > 3:
            fn = "tanh"
        return N.call(fn, e)

    # -- one statement ---------------------------------------------------------------------
    def statement(self) -> tuple[list[N.Statement], str, bool, bool]:
        """One candidate statement (or an initialise-then-accumulate pair), its tensor, whether
        that is an output and whether an in/out one; or _Retry."""
        rng = self.rng
        defined = list(self.types)
        if "scatter" in self.features and defined and rng.random() < 0.5:
            return self.scatter()
        update = defined and rng.random() < 0.35
        if update:
            target = rng.choice(defined)
            rank = len(self.shapes[target][1])
            is_output = target in self.outputs
        else:
            is_output = not self.outputs or rng.random() < 0.4
            target = f"O{sum(1 for o in self.outputs)}" if is_output else \
                f"T{sum(1 for t in self.types if t.startswith('T'))}"
            rank = _weighted(rng, ((0, 12), (1, 35), (2, 38), (3, 15)))
        lhs = self.fresh_vars(rank)
        n_red = _weighted(rng, ((0, 50), (1, 35), (2, 15)))
        red = [v for v in self.fresh_vars(len(_VAR_NAMES)) if v not in lhs][:n_red]
        vars_ = lhs + red
        inout = is_output and not update and "inout" in self.features and rng.random() < 0.25
        pair = not update and not inout and rank >= 1 and "pairs" in self.features \
            and rng.random() < 0.12

        # The variables' anchors: a where clause or a read that mentions them.
        where, anchored = [], set()
        for v in vars_:
            if rng.random() < (0.2 if v in red else 0.08):
                where.append(self.where(v))
                anchored.add(v)
        tensors = self.readable(target)
        if not tensors:
            raise _Retry
        parts = []
        for v in vars_:
            if v in anchored:
                continue
            with_anchor = self.read_of(rng.choice(tensors), v, vars_)
            anchored |= N.index_vars(with_anchor)
            parts.append(with_anchor)
        if not parts and vars_ and rng.random() < 0.7:
            parts.append(self.read_of(rng.choice(tensors), None, vars_))
        if not parts:
            parts.append(self.leaf(vars_, target))

        # The operator.
        if red:
            op = _weighted(rng, (("+", 40), ("max", 20), ("min", 20), ("*", 20)))
        else:
            op = "=" if rng.random() < 0.75 else rng.choice(("+", "*", "min", "max"))
        init = True if not update else rng.random() < 0.5
        self_read = None
        if update and op == "=" and not red and rng.random() < 0.5:
            self_read = N.Read(target, tuple(N.Var(v) for v in lhs), self.types[target],
                               bare=rank == 0 and rng.random() < 0.3)
        if inout:
            if op == "=" or rng.random() < 0.3:
                if red:
                    op = rng.choice(("+", "max", "min"))
                    init = False
                else:
                    op, init = "=", True
            else:
                init = False
        rhs = self.combine(parts, vars_, target)
        if op == "*" and red:  # keep products of many terms near 1
            rhs = N.binary("+", _float_literal(rng, 1.0), N.binary("/", rhs, _float_literal(
                rng, 4.0))) if N.is_float(rhs.type) else rhs
        if inout and op == "=":
            typed = rhs if rhs.type != "bool" and not rhs.weak else None
            if typed is None:
                raise _Retry
            me = N.Read(target, tuple(N.Var(v) for v in lhs), typed.type)
            rhs = N.binary(rng.choice("+*-"), me, typed) if rng.random() < 0.7 else \
                N.call("fmax" if N.is_float(typed.type) else "max", me, typed)
        elif self_read is not None:
            rhs = N.call(rng.choice(("fmax", "fmin", "max")), self_read, rhs) \
                if rng.random() < 0.4 else N.binary(rng.choice("+*-"), self_read, rhs)
        if rhs.type == "bool" and (op != "=" or rng.random() < 0.7):
            rhs = N.binary("*", rhs, self.leaf(vars_, target) if rng.random() < 0.5
                           else _float_literal(rng, 1.5))
        if update and self.types[target] in N.INT_TYPES and N.is_float(rhs.type) \
                and not self.exact(rhs):
            raise _Retry  # int = trunc(inexact float) could flip
        used = N.index_vars(rhs) | set(lhs)
        where = [w for w in where if w.var in used]  # TC rejects constraints on unused names
        if op != "=" and not (N.index_vars(rhs) - set(lhs)) and red and not inout:
            op = op if rng.random() < 0.5 else "="  # the reduction variables all went away
        st = N.Statement(target, tuple(lhs), op, init, rhs, tuple(where),
                         bare_lhs=rank == 0 and "bare_rank0" in self.features
                         and rng.random() < 0.2)
        if pair:
            first = N.Statement(target, tuple(lhs), "=", True, self.init_rhs(lhs, target), ())
            if op == "=":
                st = attrs.evolve(st, op="+", init=False)
            else:
                st = attrs.evolve(st, init=False)
            return [first, st], target, is_output, inout
        return [st], target, is_output, inout

    def scatter(self) -> tuple[list[N.Statement], str, bool, bool]:
        """An accumulation at computed subscripts into a tensor an earlier statement defined
        (docs/language.md, "Scatter statements"): affine, constant, repeated-variable, scalar
        and data-dependent subscripts; the reference rejects what does not stay in the tensor."""
        rng = self.rng
        targets = [t for t in self.types if self.shapes[t][1] and self.types[t] != "bool"]
        if not targets:
            raise _Retry
        target = rng.choice(targets)
        mins, extents = self.shapes[target]
        vars_ = self.fresh_vars(rng.choice((1, 2, 2, 3)))
        scalars = [i for i in self.inputs if not i.dims and i.type in N.INT_TYPES]
        subs = []
        for lo, ext in zip(mins, extents):
            indices = [i for i in self.index_inputs
                       if lo <= 0 and self.size_value(i.index_bound) <= lo + ext]
            v = rng.choice(vars_)
            r = rng.random()
            if r < 0.3:
                sub = N.Var(v)
            elif r < 0.5:
                sub = N.binary(rng.choice("+-"), N.Var(v), _int_literal(rng, rng.randint(1, 2)))
            elif r < 0.55:
                sub = N.binary("*", _int_literal(rng, 2), N.Var(v))
            elif r < 0.6 and len(vars_) > 1:
                sub = N.binary("+", N.Var(vars_[0]), N.Var(vars_[1]))
            elif r < 0.7:
                sub = _int_literal(rng, rng.randrange(ext)) if lo == 0 else N.binary(
                    "+", _int_literal(rng, rng.randrange(ext)), _int_literal(rng, lo)) \
                    if lo > 0 else N.binary("-", _int_literal(rng, rng.randrange(ext)),
                                            _int_literal(rng, -lo))
            elif r < 0.78 and scalars:
                s = rng.choice(scalars)
                sub = N.Scalar(s.name, s.type)
            elif indices:
                x = rng.choice(indices)
                sub = N.Read(x.name, tuple(N.Var(rng.choice(vars_)) for _ in x.dims), "int32")
            else:  # non-injective and reversed forms
                r = rng.random()
                sub = N.binary("/", N.Var(v), _int_literal(rng, 2)) if r < 0.3 else \
                    N.binary("-", _int_literal(rng, ext - 1), N.Var(v)) if r < 0.6 else N.Var(v)
            if lo and isinstance(sub, (N.Var, N.Binary)) and N.index_vars(sub) \
                    and rng.random() < 0.5:
                sub = N.binary("+", sub, _int_literal(rng, lo)) if lo > 0 else \
                    N.binary("-", sub, _int_literal(rng, -lo))
            subs.append(sub)
        plain = [a.name for a in subs if isinstance(a, N.Var)]
        if len(plain) == len(subs) and len(set(plain)) == len(plain):
            raise _Retry  # distinct plain variables: an ordinary update, not a scatter
        bound = {v for a in subs for v in N.index_vars(a)}
        where = [self.where(v) for v in vars_ if rng.random() < 0.1]
        bound |= {w.var for w in where}
        tensors = self.readable(target)
        if not tensors:
            raise _Retry
        parts = []
        for v in vars_:
            if v not in bound or rng.random() < 0.4:
                read = self.read_of(rng.choice(tensors), v, vars_)
                bound |= N.index_vars(read)
                parts.append(read)
        if not parts:
            parts.append(self.leaf(vars_, target))
        rhs = self.combine(parts, vars_, target)
        if any(r.tensor == target for r in N.reads(rhs)):
            raise _Retry  # a scatter reads no element of its own tensor
        op = _weighted(rng, (("+", 45), ("max", 20), ("min", 20), ("*", 15)))
        if rhs.type == "bool":
            rhs = N.binary("*", rhs, _float_literal(rng, 1.5))
        if op == "*":  # small factors near 1
            rhs = N.binary("+", _float_literal(rng, 1.0), N.binary(
                "/", rhs, _float_literal(rng, 4.0))) if N.is_float(rhs.type) else \
                N.select(N.binary(">", rhs, _int_literal(rng, 0)), _int_literal(rng, 2),
                         _int_literal(rng, 1))
        if self.types[target] in N.INT_TYPES and N.is_float(rhs.type) and not self.exact(rhs):
            raise _Retry  # int = trunc(inexact float) could flip
        used = N.index_vars(rhs) | {v for a in subs for v in N.index_vars(a)}
        where = [w for w in where if w.var in used]
        st = N.Statement(target, (), op, False, rhs, tuple(where), scatter=tuple(subs))
        return [st], target, target in self.outputs, False

    def init_rhs(self, lhs, target) -> N.Expr:
        """The right-hand side of an initialisation that bounds only some of lhs (or none)."""
        rng = self.rng
        tensors = [t for t in self.readable(target) if len(self.shapes[t][1]) == 1]
        if tensors and rng.random() < 0.7:
            t = rng.choice(tensors)
            return N.Read(t, (N.Var(rng.choice(lhs)),), self.type_of(t))
        return _float_literal(rng, rng.randint(-4, 4) / 4)

    def where(self, v: str) -> N.Where:
        rng = self.rng
        old = rng.random() < 0.2
        r = rng.random()
        sizes = sorted(self.sizes)
        if r < 0.4 or not sizes:
            lo, hi = _int_literal(rng, 0), _int_literal(rng, rng.randint(1, 3))
        elif r < 0.7:
            lo, hi = _int_literal(rng, 0), N.Size(rng.choice(sizes))
        elif r < 0.85:
            lo, hi = _int_literal(rng, 1), N.Size(rng.choice(sizes))
        elif self.stride and r < 0.9:
            lo, hi = _int_literal(rng, 0), N.Scalar(self.stride, "int32")
        else:
            lo, hi = _int_literal(rng, 0), N.binary("-", N.Size(rng.choice(sizes)),
                                                      _int_literal(rng, 1))
        return N.Where(v, lo, hi, old)

    # -- the whole program -------------------------------------------------------------------
    def build(self, max_statements: int) -> N.Program:
        rng = self.rng
        self.signature()
        wanted = _weighted(rng, ((1, 20), (2, 30), (3, 25), (4, 15), (6, 10)))
        wanted = min(wanted, max_statements)
        failures = 0
        while len(self.statements) < wanted and failures < 12:
            try:
                new, target, is_output, inout = self.statement()
                outputs = self.outputs + [target] if is_output and target not in self.outputs \
                    else list(self.outputs)
                inout_shapes, inout_values = dict(self.inout), dict(self.inout_values)
                if inout:
                    shape = self.inout_shape(new[0])
                    t = R.tensor_types(self.program(self.statements + new, outputs, {}))[target]
                    inout_shapes[target] = shape
                    inout_values[target] = self.random_array(shape, t)
                result = self.run_reference(self.statements + new, outputs, inout_shapes,
                                            inout_values)
            except (_Retry, R.Invalid):
                failures += 1
                continue
            self.statements += new
            self.outputs, self.inout, self.inout_values = outputs, inout_shapes, inout_values
            self.types = {**result.types}
            for name, t in result.tensors.items():
                if name not in self.values:
                    self.shapes[name] = (t.mins, t.extents)
            self.precision = exactness(self.program(self.statements, self.outputs, self.inout),
                                       result)
        if not self.outputs:
            raise _Retry
        return self.program(self.statements, self.outputs, self.inout)

    def inout_shape(self, st: N.Statement) -> tuple[int, ...]:
        """The out= shape of an in/out output: its natural range, sometimes larger or smaller."""
        rng = self.rng
        shapes = {n: s for n, s in self.shapes.items()}
        ev = R.Evaluator({n: R.Tensor("int32", m, np.zeros(e), np.ones(e, bool))
                          for n, (m, e) in shapes.items()}, self.sizes,
                         {i.name: self.values[i.name] for i in self.inputs if not i.dims}, {})
        try:
            natural = R.infer(st, shapes, ev, write_constrains=False)
            his = [natural[v][1] for v in st.lhs]
        except R.Invalid:
            his = [rng.randint(1, 6) for _ in st.lhs]
        shape = []
        for hi in his:
            r = rng.random()
            shape.append(max(1, hi + (0 if r < 0.5 else rng.randint(1, 2) if r < 0.8 else -1)))
        return tuple(shape)

    def random_array(self, shape, t: str) -> np.ndarray:
        rng = self.rng
        n = int(np.prod(shape))
        if N.is_float(t):
            return (np.array([rng.randint(-8, 8) for _ in range(n)]) / 4).astype(t).reshape(shape)
        if t == "bool":
            return np.array([rng.random() < 0.5 for _ in range(n)]).reshape(shape)
        return np.array([rng.randint(-3, 3) for _ in range(n)], t).reshape(shape)


ALL_FEATURES = frozenset({"indirect", "strides", "inout", "pairs", "fmod", "odd_names",
                          "bare_rank0"})
#: With scatter statements (`T(I(i), j) += ...`); not in ALL_FEATURES, so that the programs of
#: the seeds other tests pin stay as they are.
SCATTER_FEATURES = ALL_FEATURES | {"scatter"}
#: Without the language gaps and name classes the issue lists as open (rank-0 outputs written
#: without '()', function and tensor names that are C/CUDA keywords).
CORE_FEATURES = ALL_FEATURES - {"odd_names", "bare_rank0"}


def case(seed: int, features=ALL_FEATURES, max_statements: int = 6) -> Case:
    """The well-formed program of `seed`, its arguments and the reference's results."""
    for attempt in range(100):
        rng = random.Random(f"{seed}/{attempt}")
        g = _Generator(rng, frozenset(features))
        try:
            p = g.build(max_statements)
        except _Retry:
            continue
        return make_case(seed, p, g.values, g.inout_values,
                         refuse_pieces="scatter" in g.features)
    raise RuntimeError(f"no well-formed program for seed {seed}")
