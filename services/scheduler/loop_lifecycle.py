"""A loop's statuses and the moves between them: the table `LoopManager._transition` (loops.py),
the one writer of a loop's status, checks every move against.

A loop is created QUEUED (`LoopManager.create`). While it is open its status says what it does now;
the driver (loop_driver.py) moves it as its rounds go:

    QUEUED        the baseline is next, or the round's job waits for a trainer worker
    TRAINING      the round's job runs
    BENCHMARKING  the baseline or the round's adapter is being scored

An open loop may move to any other open status (a job that is queued again after running takes the
loop from TRAINING back to QUEUED; a driver resumed after a restart finds the round further on than
the stored status says) or to an end. An ended loop (TARGET_REACHED, ROUNDS_SPENT, PLATEAUED, FAILED,
STOPPED) never moves again, and no status moves to itself: the driver writes a status only when it
changes. No store, no events: statuses in, a verdict out.
"""

from __future__ import annotations

from rlvr.common.errors import FailedPrecondition
from rlvr.services.scheduler.convert import LOOP_TERMINAL

QUEUED, TRAINING, BENCHMARKING = "QUEUED", "TRAINING", "BENCHMARKING"
TARGET_REACHED, ROUNDS_SPENT, PLATEAUED = "TARGET_REACHED", "ROUNDS_SPENT", "PLATEAUED"
FAILED, STOPPED = "FAILED", "STOPPED"
OPEN = (QUEUED, TRAINING, BENCHMARKING)
ENDS = (TARGET_REACHED, ROUNDS_SPENT, PLATEAUED, FAILED, STOPPED)
assert frozenset(ENDS) == LOOP_TERMINAL

TABLE: dict[str, tuple[str, ...]] = {
    **{source: tuple(s for s in OPEN if s != source) + ENDS for source in OPEN},
    **{end: () for end in ENDS},
}
"""Each status -> the statuses a loop in it may move to."""


class LoopTransitionRefused(FailedPrecondition):
    """A move the table does not allow; `status` is the loop's status when it was asked."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


def check(loop_id: str, source: str, to: str) -> None:
    """Nothing when the table lets a loop in `source` move to `to`; else LoopTransitionRefused
    naming the loop, both statuses and the statuses it may move to."""
    if to in TABLE.get(source, ()):
        return
    if to not in TABLE:
        raise LoopTransitionRefused(f"loop {loop_id}: {to!r} is not a loop status; allowed: "
                                    f"{', '.join(TABLE)}", source)
    if source in ENDS:
        raise LoopTransitionRefused(f"loop {loop_id} has already ended ({source}): it never moves again "
                                    f"(asked for {to})", source)
    allowed = ", ".join(TABLE.get(source, ()))
    raise LoopTransitionRefused(f"loop {loop_id} cannot move from {source} to {to}; from {source} it may move "
                                f"to: {allowed or 'nothing'}", source)
