"""A forward function that also returns what its backward would recompute, and that backward.

The backward TC (`tcstage.grad.reverse`) takes the forward's inputs and outputs and recomputes
every temporary it reads: a layer norm's backward sums its rows twice more for the mean and
variance the forward had, a cross-entropy's for the row maxima and sums. Where the caller can
keep tensors from the forward call to the backward one (tcstage.torch's autograd), the forward
returns those reductions too and the backward takes them (`backward(..., keep=True)`), as
PyTorch's own layers save their statistics. The forward keeps its text: a copy of its
definition, renamed, returns the kept temporaries after its outputs, so it computes them
exactly as the forward does.
"""

from __future__ import annotations

import warnings

import attrs

from tcstage.errors import TCError, TCWarning
from tcstage.grad import Backward
from tcstage.halide import ranges as R
from tcstage.lang.parser import parse


@attrs.frozen
class Keeping:
    forward_source: str  # the program's text and the renamed copy of the forward definition
    forward_name: str  # the copy: returns the forward's outputs, then `backward.kept`
    backward: Backward  # takes (inputs, outputs, kept, output gradients)


def keeping(program, name: str) -> Keeping | None:
    """The forward and backward pair of `name` (a plain function of `program`, which must
    have its source) that keeps the reductions its backward would recompute; None where the
    backward recomputes none, or where the copy would not compute them over the same ranges.
    Kept on disk for the next process (grad/memo.py)."""
    from tcstage.grad import memo

    def decode(value: dict) -> Keeping | None:
        if value.get("none"):
            return None
        return Keeping(value["forward_source"], value["forward_name"],
                       memo.decode_backward(value["backward"]))

    def encode(made: Keeping | None) -> dict:
        if made is None:
            return {"none": True}
        return {"forward_source": made.forward_source, "forward_name": made.forward_name,
                "backward": memo.encode_attrs(made.backward)}
    return memo.memoised(memo.program_key("keeping", program, name),
                         lambda: _keeping(program, name), encode, decode)


def _keeping(program, name: str) -> Keeping | None:
    from tcstage.grad.reverse import backward as generate
    from tcstage.program import define
    b = generate(program, name, keep=True)
    if not b.kept:
        return None
    module = parse(program.source, program.filename)
    d = next(d for d in module.defs if d.name.name == name)
    taken = {e.name.name for e in module.defs}
    new_name, k = f"{name}_keeping", 1
    while new_name in taken:
        k += 1
        new_name = f"{name}_keeping{k}"
    text = module.source.text
    start, returns_end = d.span.start, d.returns[-1].span.end
    # (each kept temporary is returned through a copy, `mean_kept(n) = mean(n)`: the CPU
    # scheduler computes such copies with the rows that make them, `_row_copies`, where an
    # output the rows read would be a pass of its own)
    names = set(program[name].written.tensors) | set(program[name].written.size_vars)
    copies = []
    for t in b.kept:
        copy_name, k = f"{t}_kept", 1
        while copy_name in names:
            k += 1
            copy_name = f"{t}_kept{k}"
        names.add(copy_name)
        copies.append(copy_name)
    index = [f"i{k}" for k in range(max(program[name].written.tensors[t].rank for t in b.kept))]
    statements = "".join(
        f"\n  {c}({', '.join(index[:r])}) = {t}({', '.join(index[:r])})"
        for t, c in zip(b.kept, copies)
        for r in [program[name].written.tensors[t].rank])
    body_end = text.rindex("}", start, d.span.end)
    copy = (text[start:d.name.span.start] + new_name + text[d.name.span.end:returns_end]
            + "".join(f", {c}" for c in copies) + text[returns_end:body_end].rstrip()
            + statements + "\n" + text[body_end:d.span.end])
    source = f"{program.source}\n# (tcstage.torch: '{name}' returning what its backward reads)\n" \
             f"{copy}\n"
    with warnings.catch_warnings():  # (the program's own warnings, told when it was defined)
        warnings.simplefilter("ignore", TCWarning)
        copied = define(source, program.filename,
                        narrow_accumulation=program.narrow_accumulation)[new_name].written
    written = program[name].written
    try:
        ours, theirs = R.infer_ranges(copied), R.infer_ranges(written)
    except TCError:
        return None  # (one that needs scalar values to infer: the backward states them)
    for t, c in zip(b.kept, copies):
        if ours.tensors[c].extents != theirs.tensors[t].extents or \
                ours.tensors[c].mins != theirs.tensors[t].mins:
            return None
    return Keeping(source, new_name, b)
