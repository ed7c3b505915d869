"""Median and range over repeated runs of one configuration: what every benchmark the docs quote prints.

A single run on a shared host lands anywhere in a wide band (the trainer_step figures of issue 27
moved by 1.6x between two runs of the same command); the docs quote the median and the range of at
least `MIN_REPEATS` runs made in one invocation, so a reader's run can be compared with the range.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_REPEATS = 3


@dataclass(frozen=True)
class Spread:
    """Median, lowest and highest of a configuration's repeats (None: no run produced a value)."""

    median: float | None
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        got = [v for v in values if v is not None]
        if not got:
            return cls(None, None, None, 0)
        return cls(statistics.median(got), min(got), max(got), len(got))

    def cell(self, digits: int = 3) -> str:
        """"median [low-high]", or "-" without values; a single value prints alone."""
        if self.median is None:
            return "-"
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"

    def to_json(self) -> dict[str, float | int | None]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def check_repeats(repeats: int) -> int:
    """`repeats`, refused below MIN_REPEATS (argparse's type= for a --repeats flag)."""
    try:
        value = int(repeats)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeats: {repeats!r} is not a whole number") from None
    if value < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"--repeats must be at least {MIN_REPEATS} (a median and a range need three runs)")
    return value
