"""Small random TC programs with an explicit-loop reference, for testing the CUDA path.

Every index variable gets its range from a `where` clause, and every subscript is a variable
plus a constant chosen to stay inside the tensor, so the reference below needs no range
inference: it runs the loops the `where` clauses spell out, statement after statement, on numpy
arrays. Programs have one to four statements over inputs `A(P)`, `B(P, Q)`, `C(Q)`: new outputs
and temporaries of rank 0 to 3 (ranges may start at 1 or stop one short), reductions with
`+=!`, `max=!`, `min=!`, and in-place updates (`=` reading the point it writes, `+=`), whose
statements read earlier tensors at shifted subscripts: the patterns that make threads exchange
data through shared memory.
"""

from __future__ import annotations

import itertools
import random

import attrs
import numpy as np

INPUTS = {"A": ("P",), "B": ("P", "Q"), "C": ("Q",)}
NAMES = "ijklmn"


@attrs.frozen
class Dim:
    """An index range lo:size-cut (lo in {0, 1}, cut in {0, 1}, never both 1)."""

    lo: int
    size: str
    cut: int

    def text(self) -> str:
        return f"{self.lo}:{self.size}{' - 1' if self.cut else ''}"

    def values(self, sizes) -> range:
        return range(self.lo, sizes[self.size] - self.cut)


@attrs.frozen
class Statement:
    tensor: str
    lhs: tuple  # (variable name, Dim)
    reductions: tuple  # (variable name, Dim)
    op: str  # '=', '+=', '+=!', 'max=!', 'min=!'
    rhs: tuple  # expression tree: ('read', tensor, ((var | None, offset), ...)), ('num', v),
    # ('bin', op, a, b)

    def text(self) -> str:
        lhs = ", ".join(v for v, _ in self.lhs)
        where = ", ".join(f"{v} in {d.text()}" for v, d in self.lhs + self.reductions)
        return f"  {self.tensor}({lhs}) {self.op} {_text(self.rhs)}" + \
            (f" where {where}" if where else "")


@attrs.frozen
class Program:
    statements: tuple
    shapes: dict  # tensor -> tuple of Dim (inputs: Dim(0, size, 0))
    outputs: tuple

    @property
    def source(self) -> str:
        return (f"def f(float(P) A, float(P, Q) B, float(Q) C) -> ({', '.join(self.outputs)}) "
                "{\n" + "\n".join(s.text() for s in self.statements) + "\n}")

    def inputs(self, sizes, rng):
        return [rng.uniform(0.5, 1.5, [sizes[d] for d in dims]).astype(np.float32)
                for dims in INPUTS.values()]

    def reference(self, sizes, arrays):
        """The outputs, computed by running each statement's loops in order."""
        values = dict(zip(INPUTS, (a.astype(np.float64) for a in arrays)))
        for s in self.statements:
            dims = self.shapes[s.tensor]
            if s.tensor not in values:
                values[s.tensor] = np.zeros([len(d.values(sizes)) for d in dims])
            target = values[s.tensor]

            def at(tensor, index):
                offsets = tuple(d.lo for d in self.shapes[tensor])
                return tuple(i - o for i, o in zip(index, offsets))

            loops = [d.values(sizes) for _, d in s.lhs]
            reds = [d.values(sizes) for _, d in s.reductions]
            names = [v for v, _ in s.lhs] + [v for v, _ in s.reductions]
            new = target.copy()
            for point in itertools.product(*loops):
                acc = {"=": None, "+=": target[at(s.tensor, point)], "+=!": 0.0,
                       "max=!": -np.inf, "min=!": np.inf}[s.op]
                for red in itertools.product(*reds):
                    env = dict(zip(names, point + red))
                    v = _eval(s.rhs, env, values, at)
                    acc = v if s.op == "=" else (acc + v if s.op in ("+=", "+=!") else
                                                 max(acc, v) if s.op == "max=!" else min(acc, v))
                new[at(s.tensor, point)] = acc
            values[s.tensor] = new
        return [values[o] for o in self.outputs]


def _text(e) -> str:
    if e[0] == "num":
        return repr(e[1])
    if e[0] == "read":
        subs = []
        for var, c in e[2]:
            subs.append(str(c) if var is None else var if c == 0 else
                        f"{var} {'+' if c > 0 else '-'} {abs(c)}")
        return f"{e[1]}({', '.join(subs)})"
    return f"({_text(e[2])} {e[1]} {_text(e[3])})"


def _eval(e, env, values, at):
    if e[0] == "num":
        return e[1]
    if e[0] == "read":
        index = tuple(c if var is None else env[var] + c for var, c in e[2])
        return values[e[1]][at(e[1], index)] if e[1] not in INPUTS else values[e[1]][index]
    a, b = _eval(e[2], env, values, at), _eval(e[3], env, values, at)
    return {"+": a + b, "-": a - b, "*": a * b}[e[1]]


def _dim(r: random.Random) -> Dim:
    size = r.choice("PQ")
    lo = r.choice((0, 0, 1))
    return Dim(lo, size, 0 if lo else r.choice((0, 0, 1)))


def _subscript(r: random.Random, dim: Dim, variables):
    """(variable, offset) keeping every value inside dim for all sizes, or (None, constant)."""
    fits = []
    for v, d in variables:
        low, high = dim.lo - d.lo, d.cut - dim.cut  # offsets that stay inside
        if d.size == dim.size and low <= high:
            fits.append((v, r.randint(low, high) if r.random() < 0.5 else max(low, min(0, high))))
    return r.choice(fits) if fits else (None, dim.lo)


def random_program(seed: int, max_statements: int = 4) -> Program:
    r = random.Random(seed)
    shapes = {t: tuple(Dim(0, s, 0) for s in dims) for t, dims in INPUTS.items()}
    statements, defined, outputs = [], [], []
    for k in range(r.randint(1, max_statements)):
        update = defined and r.random() < 0.3
        if update:
            tensor = r.choice(defined)
            dims = tuple(Dim(1, d.size, 0) if d.lo == 0 and d.cut == 0 and r.random() < 0.3
                         else d for d in shapes[tensor])
            op = r.choice(("=", "+="))
        else:
            tensor = f"T{k}"
            dims = tuple(_dim(r) for _ in range(r.choice((0, 1, 1, 2, 2, 3))))
            op = r.choice(("=", "+=!", "+=!", "max=!", "min=!"))
        names = iter(r.sample(NAMES, len(NAMES)))
        lhs = tuple((next(names), d) for d in dims)
        reductions = () if op == "=" else \
            tuple((next(names), _dim(r)) for _ in range(r.choice((0, 1, 1, 2))))
        variables = lhs + reductions
        sources = list(INPUTS) + [t for t in defined if t != tensor]
        terms = []
        for _ in range(r.randint(1, 3)):
            source = r.choice(sources)
            terms.append(("read", source, tuple(_subscript(r, d, variables)
                                                for d in shapes[source])))
        used = {v for t in terms for v, _ in t[2]}
        for v, d in reductions:  # every reduction variable is read somewhere
            if v not in used:
                terms.append(("read", "A" if d.size == "P" else "C", ((v, 0),)))
        if update and op == "=" and r.random() < 0.7:  # read the point it writes
            terms.append(("read", tensor, tuple((v, 0) for v, _ in lhs)))
        if r.random() < 0.3:
            terms.append(("num", r.choice((0.5, 2.0, 3.0))))
        rhs = terms[0]
        for t in terms[1:]:
            rhs = ("bin", r.choice("+-*"), rhs, t)
        statements.append(Statement(tensor, lhs, reductions, op, rhs))
        if not update:
            shapes[tensor] = dims
            defined.append(tensor)
            if r.random() < 0.75:
                outputs.append(tensor)
    if not outputs:
        outputs.append(defined[-1])
    return Program(tuple(statements), shapes, tuple(outputs))
