"""Progress of a tuning run, on stderr: a rich bar on a terminal; elsewhere (a log, a pipe, CI)
one plain line per generation, since a redrawn bar collapses there into one truncated line."""

from __future__ import annotations

import sys
import time

from tcstage.tune.result import tally, tally_text


class Progress:
    """`enabled`: show anything at all. The bar runs to whichever limit the run has: `seconds`
    of wall time, else `budget` candidates evaluated."""

    def __init__(self, enabled: bool, what: str, budget: int | None, seconds: float | None,
                 stream=None):
        self.enabled, self.what, self.budget, self.seconds = enabled, what, budget, seconds
        self.stream = stream or sys.stderr
        self.history: list = []
        self.best = None
        self.started = time.monotonic()
        self.bar = None
        self.terminal = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        if self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn
            limit = f"of {seconds:g} s" if seconds else f"of {budget} evaluated"
            self.bar = Bar(TextColumn(f"tuning {what}"), BarColumn(), TextColumn(limit),
                           TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
                           console=Console(file=self.stream), transient=False)
            self.task = self.bar.add_task("tune", total=seconds or budget or 1, status="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def _best(self) -> str:
        return f"; best {self.best.time * 1e6:.2f} us" if self.best is not None else ""

    def update(self, candidate, best) -> None:
        self.history.append(candidate)
        self.best = best
        if self.bar is None:
            return
        counts = tally(self.history)
        done = time.monotonic() - self.started if self.seconds else counts["evaluated"]
        self.bar.update(self.task, completed=done, status=(
            f"generation {candidate.generation}: {tally_text(self.history)}{self._best()}"))

    def generation(self, number: int) -> None:
        """A generation ended: without a terminal, its line."""
        if self.enabled and self.bar is None:
            print(f"tuning {self.what}: generation {number}, "
                  f"{time.monotonic() - self.started:.0f} s: {tally_text(self.history)}"
                  f"{self._best()}", file=self.stream, flush=True)
