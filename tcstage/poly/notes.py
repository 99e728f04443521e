"""Facts about options that could not take effect as written (a tile size past the last loop, a
thread dimension no loop can use, a promotion depth beyond the tree). The passes return them
with their results; the compiler warns about each and keeps them on the compiled kernel, where
an explanation of the mapping can reuse them."""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class OptionNote:
    option: str  # the option as the chain writes it: 'tile(4, 4, 4)'
    why: str  # what happened instead, and why

    def __str__(self) -> str:
        return f"{self.option}: {self.why}"


def call(name: str, values: Sequence) -> str:
    """An option call as the chain writes it: call('tile', (4, 4)) == 'tile(4, 4)'."""
    return f"{name}({', '.join(map(str, values))})"
