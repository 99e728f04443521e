"""A TC program at another floating-point precision: the same text with every floating-point
input declared as the requested type.

PyTorch users expect a layer written with `float` to run in float64 when given float64 tensors
(that is how `torch.autograd.gradcheck` checks gradients). TC types come from declarations only:
literals are weak (they take the type beside them), outputs and temporaries take the type of
their right-hand side. So retyping the declared inputs retypes the whole function, except for
CUDA's single-precision builtin spellings (`expf`, `fmaxf`, ...), which convert to float32 as C
would; those become their canonical names (`exp`, `fmax`), which keep their argument's type.

The rewrite is done on the source text at the spans the parser recorded, so the result is
ordinary TC text (readable, hashed and defined like any other) with the same lines.
"""

from __future__ import annotations

import attrs

from tcstage.errors import Source, Span, TCError
from tcstage.lang import ast
from tcstage.lang.builtins import BUILTINS
from tcstage.lang.parser import parse
from tcstage.lang.types import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, SCALAR_TYPES, ScalarType

#: The spelling written for each floating-point type.
SPELLING = {FLOAT16: "half", BFLOAT16: "bfloat16", FLOAT32: "float", FLOAT64: "double"}


def retype_source(text: str, to: ScalarType, filename: str = "<string>") -> str:
    """`text` with every floating-point input (tensors and scalars, in every function) declared
    as `to`, and single-precision builtin spellings replaced by their canonical names."""
    if to not in SPELLING:
        raise TCError(f"TC has no floating-point type {to}; supported: "
                      f"{', '.join(str(t) for t in SPELLING)}")
    module = parse(text, filename)
    edits = []  # (start, end, replacement)
    for d in module.defs:
        for p in d.params:
            declared = SCALAR_TYPES.get(p.type.scalar.name)
            if declared is not None and declared.is_float:
                edits.append((p.type.scalar.span.start, p.type.scalar.span.end, SPELLING[to]))
        for node in _nodes(d.statements):
            if isinstance(node, ast.Apply):
                builtin = BUILTINS.get(node.name.name)
                if builtin is not None and builtin.force_float32:
                    edits.append((node.name.span.start, node.name.span.end, builtin.canonical))
    out, last = [], 0
    for start, end, replacement in sorted(edits):
        out.append(text[last:start])
        out.append(replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def retype(program, to: ScalarType):
    """A new `Program` defined from `program`'s source retyped to `to` (see `retype_source`),
    accumulating as `program` does; `program` itself where retyping changes nothing."""
    from tcstage.program import define

    if program.source is None:
        raise TCError("retyping needs the program's TC source; this Program was built without it")
    text = retype_source(program.source, to, program.filename)
    if text == program.source:  # (already of that type: float32 tensors to a float TC)
        return program
    return define(text, program.filename, narrow_accumulation=program.narrow_accumulation)


def _nodes(value):
    """Every syntax node under `value` (a node or a tuple of them), parents first."""
    if isinstance(value, tuple):
        for v in value:
            yield from _nodes(v)
    elif attrs.has(type(value)) and not isinstance(value, (Span, Source)):
        yield value
        for field in attrs.fields(type(value)):
            if field.name != "span":
                yield from _nodes(getattr(value, field.name))
