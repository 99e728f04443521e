"""Bounds on isl's work, so that every polyhedral stage ends on any input.

isl counts its *operations* (pivots of its simplex tableaux) when given a maximum, and fails
the call that exceeds it; `bounded(n)` turns that failure into `WorkLimitExceeded`, which the
stages catch to fall back to a simpler method (dependences with the sizes fixed, a schedule in
program order, no memory promotion) or to end with a clear TCError. A pivot takes from about a
microsecond on small tableaux to tens on large ones. The budgets allow more than ten times
what the paper's kernels, the test suite and a chain of 100 in-place updates need, and a few
seconds of work at most; compile-time knobs, not options: tests lower them to force fallbacks.
"""

from __future__ import annotations

import contextlib

import islpy as isl

from tcstage.errors import TCError

# Per statement's dataflow analysis (dependences are computed one sink statement at a time).
DEPENDENCES = 2_000_000
# The isl scheduler, once per strategy tried.
SCHEDULE = 3_000_000
# Memory promotion of one kernel.
PROMOTION = 5_000_000
# isl's AST of a kernel (about a million operations a second); then with coscheduled statement
# instances grouped, which is cheaper but may test more conditions inside loops.
AST = 3_000_000
GROUPED_AST = 30_000_000
# The cost model's coalescing analysis of one access (tcstage/tune/model.py): past it the
# access counts as uncoalesced.
COST_MODEL = 1_000_000

# isl fails an exhausted quota with the message of whatever it was doing ("syntax error" while
# parsing), so exhaustion is recognised by a small computation that needs a pivot failing too.
_PROBE = isl.BasicSet("{ [i, j] : 0 <= i <= 10 and 0 <= j <= 10 and i + j >= 5 and 2i - j <= 3 }")


class WorkLimitExceeded(TCError):
    """An isl computation needed more operations than its budget."""


@contextlib.contextmanager
def bounded(operations: int, what: str):
    """isl calls inside the block fail after `operations` operations in all, with
    WorkLimitExceeded naming `what` was being computed. Not reentrant: isl has one counter."""
    ctx = isl.DEFAULT_CONTEXT
    ctx.set_max_operations(operations)
    ctx.reset_operations()
    try:
        yield
    except isl.Error as error:
        if not _exhausted():
            raise
        raise WorkLimitExceeded(f"{what} needs more than {operations} isl operations") \
            from error
    finally:
        ctx.set_max_operations(0)
        ctx.reset_operations()


def _exhausted() -> bool:
    try:
        _PROBE.lexmin()
    except isl.Error:
        return True
    return False
