"""`CpuSchedule`: the parameters of the structure-aware CPU schedule, as a chain.

The CPU counterpart of `MappingOptions`: an immutable, hashable value built by chain calls,
printed as the chain itself and read back by `CpuSchedule.parse` (nothing is evaluated)::

    tc.CpuSchedule().registerTile(2, 6).vectorize(8).unrollReduction(2).pack(False)

Every option left at its default (0 for sizes) is chosen by the scheduler from the TC's
structure and sizes; see docs/cpu.md.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from tcstage.errors import TCError

__all__ = ["CpuSchedule", "TCScheduleError"]


class TCScheduleError(TCError):
    """An invalid CPU schedule option, or CpuSchedule text that cannot be read."""


def _count(name: str, low: int, high: int):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TCScheduleError(f"CpuSchedule.{name}: expected an integer, got {value!r}")
        if not low <= value <= high:
            raise TCScheduleError(f"CpuSchedule.{name}: {value} is out of range "
                                  f"[{low}, {high}]" + (" (0: chosen by the scheduler)"
                                                        if low == 0 else ""))
        return value
    return check


def _flag(name: str):
    def check(value):
        if not isinstance(value, bool):
            raise TCScheduleError(f"CpuSchedule.{name}: expected True or False, got {value!r}")
        return value
    return check


def _lanes(value):
    _count("vectorize", 0, 64)(value)
    if value and value & (value - 1):
        raise TCScheduleError(f"CpuSchedule.vectorize: {value} lanes is not a power of two")
    return value


def _tile(value):
    if not isinstance(value, tuple) or len(value) != 2:
        raise TCScheduleError(f"CpuSchedule.registerTile takes (vectors, rows), got {value!r}")
    _count("registerTile (vectors)", 0, 8)(value[0])
    _count("registerTile (rows)", 0, 32)(value[1])
    if value[0] * value[1] > 64:
        raise TCScheduleError(f"CpuSchedule.registerTile{value}: {value[0] * value[1]} "
                              "accumulators cannot stay in registers (at most 64)")
    return value


@attrs.frozen
class CpuSchedule:
    """How the structure-aware scheduler schedules one TC function on the CPU.

    registerTile(vectors, rows): a reduction's output tile, `vectors` vectors wide in its
    innermost dimension and `rows` high in the next (0: chosen from the sizes and the
    target's register count). vectorize(lanes): lanes per vector (0: the target's natural
    width; smaller suits small tensors). unrollReduction(n): unroll the innermost reduction
    loop by n. pack(b): copy operands read across
    the vectorised dimension into contiguous panels. parallel(b): run the outer loop on every
    core. inlinePointwise(b): compute a pointwise temporary inside its readers rather than
    once (fusion; those read by a reduction are always computed once).
    """

    register_tile: tuple = attrs.field(default=(0, 0), converter=_tile,
                                       metadata={"method": "registerTile"})
    vector_lanes: int = attrs.field(default=0, converter=_lanes,
                                    metadata={"method": "vectorize"})
    unroll_reduction: int = attrs.field(default=1, converter=_count("unrollReduction", 1, 16),
                                        metadata={"method": "unrollReduction"})
    pack_operands: bool = attrs.field(default=True, converter=_flag("pack"),
                                      metadata={"method": "pack"})
    parallel_outer: bool = attrs.field(default=True, converter=_flag("parallel"),
                                       metadata={"method": "parallel"})
    inline_pointwise: bool = attrs.field(default=True, converter=_flag("inlinePointwise"),
                                         metadata={"method": "inlinePointwise"})

    def _with(self, **changes) -> CpuSchedule:
        return attrs.evolve(self, **changes)

    def registerTile(self, vectors: int, rows: int) -> CpuSchedule:  # noqa: N802 - TC style
        return self._with(register_tile=(vectors, rows))

    def vectorize(self, lanes: int) -> CpuSchedule:
        return self._with(vector_lanes=lanes)

    def unrollReduction(self, n: int) -> CpuSchedule:  # noqa: N802
        return self._with(unroll_reduction=n)

    def pack(self, on: bool = True) -> CpuSchedule:
        return self._with(pack_operands=on)

    def parallel(self, on: bool = True) -> CpuSchedule:
        return self._with(parallel_outer=on)

    def inlinePointwise(self, on: bool = True) -> CpuSchedule:  # noqa: N802
        return self._with(inline_pointwise=on)

    def calls(self) -> list[tuple[str, tuple]]:
        """(method, arguments) for each option that differs from the default, in a fixed
        order."""
        default = CpuSchedule()
        out = []
        for field in attrs.fields(CpuSchedule):
            value = getattr(self, field.name)
            if value != getattr(default, field.name):
                out.append((field.metadata["method"],
                            value if isinstance(value, tuple) else (value,)))
        return out

    def __str__(self) -> str:
        return "CpuSchedule()" + "".join(
            f".{m}({', '.join(str(a) for a in args)})" for m, args in self.calls())

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> CpuSchedule:
        """The schedule `str` printed: `CpuSchedule()` (optionally `tc.`-qualified, or left
        out) then `.method(args)` calls with integer or True/False arguments."""
        if not isinstance(text, str):
            raise TCScheduleError(f"CpuSchedule.parse expects a string, got "
                                  f"{type(text).__name__}")
        rest = re.sub(r"^\s*((tc|tcstage)\.)?(CpuSchedule\(\s*\))?", "", text.strip())
        methods = {f.metadata["method"]: f for f in attrs.fields(cls)}
        result = cls()
        position = len(text.strip()) - len(rest)
        for m in re.finditer(r"\s*\.\s*(\w+)\s*\(([^()]*)\)\s*|(.)", rest):
            if m.group(3) is not None:
                raise TCScheduleError(f"CpuSchedule.parse: unexpected {m.group(3)!r} at "
                                      f"character {position + m.start() + 1} of {text!r}")
            name, raw = m.group(1), m.group(2)
            if name not in methods:
                import difflib
                near = difflib.get_close_matches(name, list(methods), n=1)
                raise TCScheduleError(f"CpuSchedule has no option {name!r}"
                                      + (f" (did you mean {near[0]!r}?)" if near else "")
                                      + f"; options: {', '.join(methods)}")
            args = [_value(a, name) for a in raw.split(",")] if raw.strip() else []
            wanted = _ARITY.get(name, 1)
            if len(args) != wanted and not (wanted == 1 and not args and name in _FLAGS):
                raise TCScheduleError(f"CpuSchedule.{name} takes {wanted} argument"
                                      f"{'s' * (wanted > 1)}, got {len(args)} in {text!r}")
            result = getattr(result, name)(*args)
        return result

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in attrs.fields(CpuSchedule) for v in [getattr(self, f.name)]}


_ARITY = {"registerTile": 2}  # the others take one argument
_FLAGS = {"pack", "parallel", "inlinePointwise"}  # which may also be called bare: .pack()


def _value(raw: str, method: str):
    word = raw.strip()
    if word in ("True", "true"):
        return True
    if word in ("False", "false"):
        return False
    if re.fullmatch(r"[+-]?\d+", word):
        digits = len(word.lstrip("+-"))
        if digits > 19:  # (Python refuses to read more than 4300 digits at all)
            raise TCScheduleError(f"CpuSchedule.{method}: an integer of {digits} digits is out "
                                  "of range (at most 19)")
        return int(word)
    shown = word if len(word) <= 40 else word[:37] + "..."
    raise TCScheduleError(f"CpuSchedule.{method}: cannot read argument {shown!r} (integers and "
                          "True/False only)")
