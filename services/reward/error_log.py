"""One log line per distinct reward error, not one per completion.

A faulty reward fails the same way on most completions it sees, for every step of a job: logging
each would bury the log. The first time an error is seen it is logged with how many completions of
that call it hit; after that, its further occurrences are counted and summed up in one line at most
every `interval_s` while they go on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

MAX_DISTINCT = 1000  # errors remembered; past that the oldest are forgotten (and logged again if seen)


class ErrorLog:
    def __init__(self, log: logging.Logger, interval_s: float = 60.0) -> None:
        self.log = log
        self.interval_s = interval_s
        self._seen: dict[str, float] = {}  # error -> when it was last logged
        self._since: Counter[str] = Counter()  # occurrences not yet logged

    def note(self, errors: Sequence[str], scored: int) -> None:
        """The errors of one call that scored `scored` completions."""
        now = time.monotonic()
        for error, count in Counter(errors).items():
            last = self._seen.get(error)
            if last is None:
                self.log.warning("reward error on %d of %d completions (each scored 0): %s", count, scored, error)
                self._remember(error, now)
                continue
            self._since[error] += count
            if now - last >= self.interval_s:
                self.log.warning("reward error on %d more completions in the last %.0f s: %s", self._since.pop(error),
                                 now - last, error)
                self._seen[error] = now

    def _remember(self, error: str, now: float) -> None:
        if len(self._seen) >= MAX_DISTINCT:
            oldest = next(iter(self._seen))
            del self._seen[oldest]
            self._since.pop(oldest, None)
        self._seen[error] = now
