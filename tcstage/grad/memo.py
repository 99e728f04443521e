"""Generated derivatives kept on disk, so that a new process reads what an earlier one made.

Generating a backward TC analyses the forward's ranges (isl, Halide's solver) and checks the
text it prints: 0.05-0.35 s for the layers of examples/nn.tc on the development machine, paid
by every process that makes a tcstage.torch operator, and again for the keeping pair at its
first recorded call. The result is a pure function of the program's text, the function's name
and tcstage itself, so it is kept in `root()/derived` (`diskcache.TextCache`) under a digest of
those. Refusals (TCErrors) are not kept: they are made again, with their message.
"""

from __future__ import annotations

import attrs

from tcstage.diskcache import TextCache

DERIVED = TextCache("derived")


def program_key(kind: str, program, name: str, *more: str) -> str | None:
    """The memo's key for a derivative of `name` in `program`; None for a program without its
    source text (nothing to key it by)."""
    if program.source is None:
        return None
    return DERIVED.key(kind, program.source, program.filename,
                       str(program.narrow_accumulation), name, *more)


def memoised(key: str | None, make, encode, decode):
    """decode(the value kept under `key`), else make() (kept as encode(it))."""
    if key is not None:
        found = DERIVED.get(key)
        if found is not None:
            try:
                return decode(found)
            except (KeyError, TypeError, ValueError):
                pass  # (another layout of the value: made again)
    made = make()
    if key is not None:
        DERIVED.put(key, encode(made))
    return made


def encode_attrs(value) -> dict:
    return attrs.asdict(value, recurse=False)


def decode_backward(value: dict):
    from tcstage.grad import Backward
    return Backward(value["source"], value["name"], value["forward"], tuple(value["inputs"]),
                    dict(value["d_outputs"]), dict(value["d_inputs"]), tuple(value["kept"]))
