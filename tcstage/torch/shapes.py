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

from collections.abc import Mapping

import torch

from tcstage.errors import TCError
from tcstage.halide.solver import Tree, tree_to_str

_CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def evaluate_symbolic(tree: Tree, values: Mapping[str, object]):
    """`tree` with `values` (ints or SymInts) bound to its variables; an int or a SymInt."""
    tag = tree[0]
    if tag == "int":
        return int(tree[1])
    if tag == "var":
        try:
            return values[tree[1]]
        except KeyError:
            raise TCError(f"output shape needs a value for '{tree[1]}'") from None
    if tag == "cast" and tree[1].startswith(("int", "uint")):
        return evaluate_symbolic(tree[2], values)  # sizes are far from any wrap-around
    if tag == "select":
        cond = evaluate_symbolic(tree[1], values)
        return torch.sym_ite(cond, evaluate_symbolic(tree[2], values),
                             evaluate_symbolic(tree[3], values))
    if tag == "not":
        return torch.sym_not(evaluate_symbolic(tree[1], values))
    if tag in ("add", "sub", "mul", "div", "mod", "min", "max", "and", "or") or tag in _CMP:
        a, b = evaluate_symbolic(tree[1], values), evaluate_symbolic(tree[2], values)
        if tag == "add":
            return a + b
        if tag == "sub":
            return a - b
        if tag == "mul":
            return a * b
        if tag == "div":
            return _euclid_div(a, b)
        if tag == "mod":
            return a - _euclid_div(a, b) * b
        if tag == "min":
            return torch.sym_min(a, b)
        if tag == "max":
            return torch.sym_max(a, b)
        if tag == "and":
            return a & b
        if tag == "or":
            return a | b
        return _CMP[tag](a, b)
    raise TCError(f"cannot compute the output shape {tree_to_str(tree)} on symbolic sizes "
                  f"(no symbolic form for '{tag}')")


def _euclid_div(a, b):
    if isinstance(b, int):
        if b == 0:
            return 0  # Halide: x / 0 == 0
        if b < 0:  # Euclidean: q = -floor(a / -b)
            return -(a // -b)
    return a // b
