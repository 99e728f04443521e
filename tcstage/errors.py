"""One exception family for everything a user can get wrong, with compiler-style locations.

Every error that points into TC source carries a `Span`; `str(error)` then reads like a
compiler diagnostic::

    matmul.tc:2:19: error: unknown tensor or function 'Bx'; did you mean 'B'?
      C(i, j) +=! A(i, k) * Bx(k, j)
                            ^~
"""

from __future__ import annotations

import contextlib
import threading

import attrs


@attrs.frozen
class Source:
    """TC source text and the name it came from (a file name or '<string>')."""

    text: str
    filename: str = "<string>"

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        line = self.text.count("\n", 0, offset) + 1
        col = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return line, col

    def line_text(self, line: int) -> str:
        return self.text.split("\n")[line - 1] if self.text else ""


@attrs.frozen
class Span:
    """A half-open character range [start, end) in a `Source`.

    `context`: notes every error at this span adds, such as the call that inlined the text
    (a TC function's statements copied into its caller keep spans into the callee's source)."""

    source: Source = attrs.field(eq=False, repr=False)
    start: int
    end: int
    context: tuple[str, ...] = attrs.field(default=(), eq=False, repr=False)

    def to(self, other: "Span") -> "Span":
        """The span covering both self and other."""
        return Span(self.source, min(self.start, other.start), max(self.end, other.end),
                    self.context)

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def column(self) -> int:
        return self.source.line_col(self.start)[1]

    def text(self) -> str:
        return self.source.text[self.start:self.end]

    def render(self, window: int = 100) -> str:
        """The source line holding the span's start, with a caret run under the span. A line
        longer than `window` shows only the part around the caret, between '...'."""
        line, col = self.source.line_col(self.start)
        text = self.source.line_text(line)
        width = max(1, min(self.end, self.start + len(text) - col + 1) - self.start)
        if len(text) > window:
            first = max(0, min(col - 1 - window // 2, len(text) - window))
            head = "..." if first > 0 else ""
            tail = "..." if first + window < len(text) else ""
            text = head + text[first:first + window] + tail
            col += len(head) - first
            width = min(width, len(text) - len(tail) - col + 1)
        return f"  {text}\n  {' ' * (col - 1)}^{'~' * (width - 1)}"


class TCError(Exception):
    """Base of every error tcstage reports about user input (source, arguments, options)."""

    def __init__(self, message: str, span: Span | None = None, notes: tuple[str, ...] = ()):
        self.message = message
        self.span = span
        self.notes = tuple(notes)
        super().__init__(str(self))

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def __str__(self) -> str:
        if self.span is None:
            head = f"error: {self.message}"
        else:
            s = self.span
            head = f"{s.source.filename}:{s.line}:{s.column}: error: {self.message}\n{s.render()}"
        context = self.span.context if self.span is not None else ()
        return "\n".join([head, *(f"  note: {n}" for n in (*self.notes, *context))])


class TCSyntaxError(TCError):
    """Malformed TC source: the lexer or parser could not read it."""


class TCSemanticError(TCError):
    """Well-formed TC that breaks a language rule (scoping, types, reductions, in-place use)."""


class TCRangeError(TCError):
    """Range inference could not give an index variable a unique range."""


class TCPartitionError(TCRangeError):
    """A tensor defined piecewise (statements whose where clauses write different parts of it)
    whose pieces overlap, or leave elements that no piece writes."""


class TCArgumentError(TCError):
    """A call passed tensors or values that do not match the function's signature."""


class TCIndexError(TCArgumentError, IndexError):
    """An index tensor holds a value outside the dimension it indexes (an IndexError too, as
    PyTorch's own gathers raise)."""


class TCWarning(UserWarning):
    """A precondition tcstage cannot check, such as reads that range inference did not bound."""


_deferral = threading.local()


@contextlib.contextmanager
def warnings_deferred():
    """Collects this thread's TCWarnings (`warn`) into the list it yields instead of issuing
    them: for work done ahead on a thread of its own (a backward kernel compiled while the
    forward runs), whose warnings belong to the call that later uses it."""
    collected: list[str] = []
    previous = getattr(_deferral, "messages", None)
    _deferral.messages = collected
    try:
        yield collected
    finally:
        _deferral.messages = previous


def deferred_warnings() -> list[str] | None:
    """The list this thread's warnings go to in `warnings_deferred`; None outside it."""
    return getattr(_deferral, "messages", None)


def warn(message: str) -> None:
    """Issues a TCWarning attributed to the first caller outside tcstage (or collects it, in
    `warnings_deferred`)."""
    import os
    import sys
    import warnings

    collected = getattr(_deferral, "messages", None)
    if collected is not None:
        collected.append(message)
        return

    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, TCWarning, stacklevel=level)
