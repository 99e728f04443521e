"""What a tuning run produces, for either space (MappingOptions on CUDA, CpuSchedule on the
CPU): one `Candidate` per proposal, and the `TuneResult`.

Every proposal is a record. The counts add up the same way everywhere (`tally`):

    proposed = pruned before compiling + evaluated
    evaluated = ok + wrong + failed + pruned after compiling

A candidate pruned before compiling (a launch shape the device refuses, a repeat) cost nothing
and does not count against a candidate budget; everything compiled does.
"""

from __future__ import annotations

import math

import attrs

STATUSES = ("ok", "wrong", "compile_error", "timeout", "crash", "pruned")
FAILED = ("compile_error", "timeout", "crash")
# how a candidate was checked against the CPU reference: on the GPU, by emulating every block,
# or by emulating a sample of its blocks (large kernels); anything else says why not
CHECKS = ("gpu", "emulated", "sampled", "cpu")


def is_checked(how: str) -> bool:
    return how.split(" ", 1)[0] in CHECKS


@attrs.frozen
class Candidate:
    """One proposal: `options` (the schedule's text), `status` (one of STATUSES), `time`
    (seconds per call, measured or predicted; None unless ok), `generation`."""

    index: int
    options: str
    status: str
    time: float | None
    generation: int
    detail: str = ""  # why it failed or was pruned
    predicted: float | None = None  # the cost model's time
    checked: str = ""  # "gpu", "emulated", "sampled (k of n blocks)", "cpu", or why not
    kernel: str | None = None  # hash of the generated kernel (equal hashes: equal kernels)
    source: str = "search"  # "search", "given" (a listed candidate) or where a warm start came from
    compiled: bool = True  # False: pruned before compiling (cost nothing)
    seconds: float | None = None  # since the run started, when this record was made

    @property
    def is_checked(self) -> bool:
        return is_checked(self.checked)


def tally(history) -> dict[str, int]:
    """The counts of a history, in the order they add up (see the module docstring)."""
    statuses = [c.status for c in history]
    before = sum(not c.compiled for c in history)
    counts = {"proposed": len(history), "pruned before compiling": before,
              "evaluated": len(history) - before,
              "ok": statuses.count("ok"), "wrong": statuses.count("wrong"),
              "failed": sum(statuses.count(s) for s in FAILED),
              "pruned after compiling": sum(c.status == "pruned" and c.compiled
                                            for c in history)}
    return counts


def tally_text(history) -> str:
    c = tally(history)
    return (f"{c['evaluated']} evaluated (ok {c['ok']}, wrong {c['wrong']}, failed "
            f"{c['failed']}, pruned after compiling {c['pruned after compiling']}), "
            f"{c['pruned before compiling']} pruned before compiling")


@attrs.frozen
class TuneResult:
    options: object  # the best: MappingOptions (target "cuda") or CpuSchedule (target "cpu")
    time: float  # seconds per call of the best, measured or predicted
    measured_on: str  # the GPU's name, "model", or the CPU ("cpu: ...")
    history: tuple[Candidate, ...]
    function: str
    sizes: dict
    strategy: str
    seconds: float  # tuning time
    checked: bool  # whether the best was checked against the CPU result
    interrupted: bool = False
    device: str = ""  # the cache key's device
    how_checked: str = ""  # the best's check: "gpu", "emulated", "sampled (...)", "cpu", or why not
    stopped: str = ""  # why the search ended: "budget", "time", "space", "interrupted", "list"

    def curve(self) -> list[tuple[int, float]]:
        """(candidates evaluated, best time so far) after each improvement; candidates pruned
        before compiling do not count (they cost nothing)."""
        points, best, evaluated = [], math.inf, 0
        for c in self.history:
            evaluated += c.compiled
            if c.status == "ok" and c.time is not None and c.time < best and \
                    (c.is_checked or not self.checked):
                best = c.time
                points.append((evaluated, best))
        return points

    def counts(self) -> dict[str, int]:
        return tally(self.history)

    def __str__(self) -> str:
        how = "measured on " + self.measured_on if self.measured_on != "model" else \
            "predicted by the cost model"
        check = f"checked: {self.how_checked}" if self.checked else \
            f"NOT checked ({self.how_checked or 'no candidate could be'})"
        return (f"best for {self.function} ({', '.join(f'{k}={v}' for k, v in self.sizes.items())}): "
                f"{self.time * 1e6:.2f} us per call, {how}; {check}\n  {self.options}\n"
                f"  {len(self.history)} candidates: {tally_text(self.history)}; "
                f"{self.seconds:.1f} s with {self.strategy}"
                f"{'; interrupted' if self.interrupted else ''}"
                f"{'; stopped by the time budget' if self.stopped == 'time' else ''}")
