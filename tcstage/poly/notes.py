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
    """An option call as the chain writes it: call('tile', (4, 4)) == 'tile(4, 4)', and a
    fusion strategy quoted, `scheduleFusionStrategy("Max")`."""
    return f"{name}({', '.join(_text(v) for v in values)})"


def _text(value) -> str:
    name = getattr(value, "name", None)  # (an enum: FusionStrategy)
    return f'"{name}"' if isinstance(name, str) and not isinstance(value, str) else str(value)


# Options tcstage accepts, stores and prints (TC's option sets use them: matchLibraryCalls in 36
# of TC's 80 tuned sets, a non-default intra-tile fusion in 30) but that never act here.
NO_EFFECT = {
    "unrollGpuTile": "tcstage does not implement it",
    "matchLibraryCalls": "no library calls are generated",
    "intraTileScheduleFusionStrategy": "tcstage does not reschedule inside tiles",
    "intraTileScheduleAllowSkewing": "tcstage does not reschedule inside tiles",
    "intraTileSchedulePositiveOrthant": "tcstage does not reschedule inside tiles",
    "outerSchedulePositiveOrthant": "tcstage does not implement it",
}


def no_effect_notes(calls) -> tuple[OptionNote, ...]:
    """A note for each call (method, args) of an option that never acts in tcstage."""
    return tuple(OptionNote(call(method, args), NO_EFFECT[method])
                 for method, args in calls if method in NO_EFFECT)
