"""Automatic differentiation of TC functions, as TC source: reverse mode (gradients) and forward
mode (Jacobian-vector products).

`gradient(source_or_program, name)` returns the text of a TC function `<name>_grad` that users
can read, edit, tune and run like any other TC; `backward(...)` returns the same text with the
correspondence between the two functions' tensors (what the PyTorch glue needs).

The backward function's signature:

    def f_grad(<f's inputs>, <f's outputs>, <d_output for each output>) -> (<d_input for each
               floating-point input, scalars included, in input order>)

Integer inputs get no gradient. Names are `d_<tensor>`, with a numeric suffix where that name is
taken.

`jvp(source_or_program, name)` returns the text of `<name>_jvp`, the forward-mode derivative:

    def f_jvp(<f's inputs>, <t_input for each floating-point input, scalars included>)
        -> (<f's outputs>, <t_output for each floating-point output>)

where each `t_` tensor is a tangent (a direction in the input space and the derivative of the
output along it) of its tensor's shape; `forward(...)` returns it with the correspondence.
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
    # forward temporaries the backward takes as parameters (after the forward outputs, before
    # the gradients), where it was generated with keep=True; empty in `tc.gradient`'s form
    kept: tuple = ()


@attrs.frozen
class Jvp:
    """The forward-mode derivative TC of one function, and how its tensors map to the
    forward's."""

    source: str  # TC text defining `name` (a whole, self-contained TC program)
    name: str  # f"{forward}_jvp"
    forward: str  # the forward function's name
    inputs: tuple  # its parameters in order: forward inputs, then the inputs' tangents
    t_inputs: dict  # forward floating-point input -> the parameter taking its tangent
    t_outputs: dict  # forward floating-point output -> the output holding its tangent


def backward(source_or_program, name: str, keep: bool = False) -> Backward:
    """The backward function of TC function `name` of a source text or Program. keep=True:
    the reductions into temporaries that it would recompute are parameters instead
    (`Backward.kept`), for a caller whose forward call returns them too (tcstage.torch)."""
    from tcstage.grad.reverse import backward as generate
    return generate(source_or_program, name, keep)


def gradient(source_or_program, name: str) -> str:
    """TC source of the backward function of `name`: `def <name>_grad(inputs..., outputs...,
    d_outputs...) -> (d_inputs...)`; readable, editable, and accepted by `tc.define`."""
    return backward(source_or_program, name).source


def forward(source_or_program, name: str) -> Jvp:
    """The forward-mode derivative of TC function `name` of a source text or Program."""
    from tcstage.grad.tangents import forward as generate
    return generate(source_or_program, name)


def jvp(source_or_program, name: str) -> str:
    """TC source of the forward-mode derivative of `name`: `def <name>_jvp(inputs...,
    t_inputs...) -> (outputs..., t_outputs...)`; readable, editable, and accepted by
    `tc.define`."""
    return forward(source_or_program, name).source
