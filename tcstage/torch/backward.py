"""The backward TC of an operator: generated (`tcstage.grad.backward`) or written by the user.

The backward function's signature (the contract of `tcstage.grad`):

    def f_grad(<f's inputs>, <f's outputs>, <d_output per output>) -> (<d_input per
               floating-point input, scalars included, in input order>)

User text (`tct.op(..., backward=text)`) defines `<f>_grad`, or exactly one function; it is
checked against the forward function by position (names may differ), so a mistake is a TCError
naming the parameter, never a wrong gradient or a shape error deep inside PyTorch.
"""

from __future__ import annotations

from tcstage.errors import TCError
from tcstage.grad import Backward
from tcstage.lang import checked as C


def backward_from_text(forward: C.Function, text: str, filename: str = "<backward>") -> Backward:
    """A `Backward` for `forward` from user-written TC text, validated against its signature."""
    from tcstage.program import define

    if not isinstance(text, str):
        raise TCError(f"backward= takes TC source text, got {type(text).__name__}")
    program = define(text, filename)
    wanted = f"{forward.name}_grad"
    if wanted in program.names:
        name = wanted
    elif len(program.names) == 1:
        name = program.names[0]
    else:
        raise TCError(f"the backward text defines {', '.join(program.names)}; name the backward "
                      f"function '{wanted}' (or define only one function)")
    fn = program[name].checked
    n_in, n_out = len(forward.inputs), len(forward.outputs)
    params = [t.name for t in fn.inputs]
    backward = Backward(
        source=text, name=name, forward=forward.name, inputs=tuple(params),
        d_outputs=dict(zip(forward.outputs, params[n_in + n_out:])),
        d_inputs=dict(zip(_differentiable(forward), fn.outputs)))
    check_backward(forward, fn, backward, every_input=True)
    return backward


def _differentiable(forward: C.Function) -> list[str]:
    return [t.name for t in forward.inputs if t.type.is_float]


def check_backward(forward: C.Function, fn: C.Function, backward: Backward,
                   every_input: bool = False) -> None:
    """Checks `fn` (the checked backward function of `backward`) against `forward`: parameters
    are the forward's inputs, outputs and one gradient per output, in that order, with the same
    ranks and type families; outputs are one gradient per floating-point input (`every_input`,
    user text) or per input in `backward.d_inputs` (the generated backward leaves out inputs
    without a differentiable dependence)."""
    n_in, n_out = len(forward.inputs), len(forward.outputs)
    fwd_outputs = [forward.tensors[o] for o in forward.outputs]
    expected = ([(t, f"forward input {t.name}") for t in forward.inputs]
                + [(t, f"forward output {t.name}") for t in fwd_outputs]
                + [(t, f"the gradient of output {t.name}") for t in fwd_outputs])
    names = [t.name for t, _ in expected[:n_in + n_out]] + [f"d_{o}" for o in forward.outputs]
    params = ", ".join(_declare(t, forward, n) for (t, _), n in zip(expected, names))
    signature = (f"def {fn.name}({params}) -> "
                 f"({', '.join('d_' + n for n in _differentiable(forward))})")
    note = (f"the backward of '{forward.name}' takes (inputs..., outputs..., d_outputs...) and "
            f"returns one gradient per floating-point input: {signature}",)
    if len(fn.inputs) != len(expected):
        raise TCError(f"backward '{fn.name}' takes {len(fn.inputs)} parameters; the backward of "
                      f"'{forward.name}' takes {len(expected)} ({n_in} inputs, {n_out} outputs, "
                      f"{n_out} output gradients)", fn.span, note)
    for k, (param, (want, role)) in enumerate(zip(fn.inputs, expected)):
        if param.rank != want.rank:
            raise TCError(f"parameter {k + 1} of '{fn.name}' ({param.name}) is {role}, of rank "
                          f"{want.rank}; it is declared with rank {param.rank}", param.span, note)
        if param.type.is_float != want.type.is_float or \
                (not want.type.is_float and param.type != want.type):
            raise TCError(f"parameter {k + 1} of '{fn.name}' ({param.name}) is {role}, of type "
                          f"{want.type}; it is declared {param.type}", param.span, note)
    wanted = [x for x in _differentiable(forward) if every_input or x in backward.d_inputs]
    if len(fn.outputs) != len(wanted):
        raise TCError(f"backward '{fn.name}' returns {len(fn.outputs)} tensors; it must return "
                      f"one gradient per floating-point input of '{forward.name}' "
                      f"({', '.join(wanted) or 'none'})", fn.span, note)
    for grad, name in zip(fn.outputs, wanted):
        got, want = fn.tensors[grad], forward.tensors[name]
        if got.rank != want.rank:
            raise TCError(f"output {grad} of '{fn.name}' is the gradient of {name}, of rank "
                          f"{want.rank}; it has rank {got.rank}", fn.span, note)
    if backward.forward != forward.name or list(backward.d_inputs) != wanted or \
            list(backward.d_inputs.values()) != list(fn.outputs):
        raise TCError(f"backward '{fn.name}' does not follow the convention for '{forward.name}'",
                      fn.span, note)


def _declare(t: C.Tensor, forward: C.Function, name: str) -> str:
    if not t.rank:
        return f"{t.type} {name}"
    dims = t.dims if all(t.dims) else _output_dims(forward, t.name)
    return f"{t.type}({', '.join(dims)}) {name}"


def _output_dims(forward: C.Function, name: str) -> tuple[str, ...]:
    """An output's extents as text (for messages), from range inference where it needs no
    scalar values."""
    from tcstage.halide import ranges as R
    from tcstage.halide.solver import tree_to_str
    try:
        extents = R.infer_ranges(forward).tensors[name].extents
        return tuple(tree_to_str(e) for e in extents)
    except TCError:
        return tuple(f"{name}.{k}" for k in range(forward.tensors[name].rank))
