"""Reverse-mode automatic differentiation of TC functions, as TC source.

`gradient(source_or_program, name)` returns the text of a TC function `<name>_grad` that users
can read, edit, tune and run like any other TC; `backward(...)` returns the same text with the
correspondence between the two functions' tensors (what the PyTorch glue needs).

The backward function's signature:

    def f_grad(<f's inputs>, <f's outputs>, <d_output for each output>) -> (<d_input for each
               floating-point input, scalars included, in input order>)

Integer inputs get no gradient. Names are `d_<tensor>`, with a numeric suffix where that name is
taken.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Backward:
    """The backward TC of one forward function, and how its tensors map to the forward's."""

    source: str  # TC text defining `name` (a whole, self-contained TC program)
    name: str  # the backward function's name: f"{forward}_grad"
    forward: str  # the forward function's name
    inputs: tuple  # the backward function's parameters in order: forward inputs, forward
    #                outputs, then the gradients of the outputs
    d_outputs: dict  # forward output -> backward parameter receiving its gradient
    d_inputs: dict  # forward input (floating-point only) -> backward output holding its gradient


def backward(source_or_program, name: str) -> Backward:
    """The backward function of TC function `name` of a source text or Program."""
    from tcstage.grad.reverse import backward as generate
    return generate(source_or_program, name)


def gradient(source_or_program, name: str) -> str:
    """TC source of the backward function of `name`: `def <name>_grad(inputs..., outputs...,
    d_outputs...) -> (d_inputs...)`; readable, editable, and accepted by `tc.define`."""
    return backward(source_or_program, name).source
