"""Median and range over repeated runs of one configuration: what every benchmark the docs quote prints.

A single run on a shared host lands anywhere in a wide band (the trainer_step figures of issue 27
moved by 1.6x between two runs of the same command); the docs quote the median and the range of at
least `MIN_REPEATS` runs made in one invocation, so a reader's run can be compared with the range.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

    def cell(self, digits: int = 3, of: int | None = None, fmt: str = "") -> str:
        """"median [low-high]", or "-" without values; a single value prints alone. With `of` (the
        repeats run), " (k of n)" follows when only k of those n runs gave a value. Each number is
        formatted with `digits` decimals, or with the format spec `fmt` (".2g") when given."""
        if self.median is None:
            return "-"
        spec = fmt or f".{digits}f"
        text = (f"{self.median:{spec}}" if self.n == 1
                else f"{self.median:{spec}} [{self.low:{spec}}-{self.high:{spec}}]")
        return text + (f" ({self.n} of {of})" if of is not None and self.n < of else "")

    def to_json(self) -> dict[str, float | int | None]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spread:
        """The Spread `to_json` wrote."""
        return cls(data["median"], data["min"], data["max"], data["n"])


def spreads(rows: Iterable[Mapping[str, Any]], key: str, by: str,
            configs: Iterable[Hashable] = ()) -> dict[Hashable, Spread]:
    """Per configuration (`row[by]`, in the order first seen): the Spread of `row[key]` over that
    configuration's rows, one row per run (a missing key or None: that run gave no value). Each of
    `configs` comes first and is there even without a row (an empty Spread: none of its runs kept)."""
    values: dict[Hashable, list[float | None]] = {config: [] for config in configs}
    for row in rows:
        values.setdefault(row[by], []).append(row.get(key))
    return {config: Spread.of(got) for config, got in values.items()}


def tally(oks: Iterable[bool], word: str = "ok") -> str:
    """"k/n ok": how many of a configuration's n runs passed (a pass/fail column over the repeats)."""
    got = list(oks)
    return f"{sum(1 for ok in got if ok)}/{len(got)} {word}"


def check_repeats(repeats: str | int) -> int:
    """`repeats`, refused below MIN_REPEATS (argparse's type= for a --repeats flag)."""
    try:
        value = int(repeats)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeats: {repeats!r} is not a whole number") from None
    if value < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"--repeats must be at least {MIN_REPEATS} (a median and a range need three runs)")
    return value
