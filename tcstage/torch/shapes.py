"""Output shapes of a TC call from range inference, on PyTorch's symbolic sizes.

Range inference gives every output extent as a tree over the size variables (and the scalar
inputs it specialises on). Evaluating those trees on `torch.SymInt`s instead of ints gives the
fake (shape-only) implementation `torch.compile` and `torch.export` trace with: the output
shape stays a formula of the input sizes, so a new batch size needs no new graph.

The arithmetic is Halide's (see `tcstage.halide.solver`): division and modulo are Euclidean.
For a positive divisor that is floor division, which SymInts have; a negative constant divisor
is rewritten into one; a symbolic divisor is taken to be positive (it is a size).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import torch

from tcstage.errors import TCError
from tcstage.halide.solver import Arithmetic, Tree, evaluate, tree_to_str


def evaluate_symbolic(tree: Tree, values: Mapping[str, object]):
    """`tree` with `values` (ints or SymInts) bound to its variables; an int or a SymInt."""
    return evaluate(tree, values, SYMBOLIC_ARITHMETIC)


def _int_cast(type_text: str, v):
    if not type_text.startswith(("int", "uint")):
        raise TCError(f"cannot compute an output shape on symbolic sizes (no symbolic form for "
                      f"a cast to {type_text})")
    return v  # sizes are far from any wrap-around


def _unsupported(tree: Tree) -> TCError:
    return TCError(f"cannot compute the output shape {tree_to_str(tree)} on symbolic sizes "
                   f"(no symbolic form for '{tree[0]}')")


SYMBOLIC_ARITHMETIC = Arithmetic(
    ops={
        "int": int, "add": operator.add, "sub": operator.sub, "mul": operator.mul,
        "div": lambda a, b: _euclid_div(a, b), "mod": lambda a, b: a - _euclid_div(a, b) * b,
        "min": torch.sym_min, "max": torch.sym_max,
        "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
        "gt": operator.gt, "ge": operator.ge,
        "and": lambda a, b: a & b(), "or": lambda a, b: a | b(), "not": torch.sym_not,
        "select": lambda c, then, other: torch.sym_ite(c, then(), other()),
        "cast": _int_cast,
    },
    missing=lambda name: TCError(f"output shape needs a value for '{name}'"),
    unsupported=_unsupported,
)


def _euclid_div(a, b):
    if isinstance(b, int):
        if b == 0:
            return 0  # Halide: x / 0 == 0
        if b < 0:  # Euclidean: q = -floor(a / -b)
            return -(a // -b)
    return a // b
