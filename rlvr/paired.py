"""Paired comparison of two evaluations that asked the same questions: the gain in points, its
standard error, and whether it stands out of the noise.

Two evaluations of one question set are paired (the same question, asked of two models), so the
noise that matters is that of the per-question differences, not of each score alone: a model that
fixes 30 questions and breaks 28 moved 0.4 points on 500, however far each score sits from 50%.
For 0/1 scores the test is McNemar's, exact (a two-sided binomial test on the questions that
changed); for fractional scores (a reward's share of tests passed) a paired z-test on the
per-question differences. The CLI (`rlvr eval compare`, `rlvr demo`), the web console and the
loop's real-gain rule read this one definition. Pure: numbers in, a verdict out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlvr.v1 import benchmark_pb2, common_pb2

SIGNIFICANCE = 0.05
"""A gain whose two-sided p-value is below this is called real."""


def mcnemar_p(gained: int, lost: int) -> float:
    """Exact two-sided McNemar p-value: the chance, if neither model were better, of a split of
    the `gained + lost` changed questions at least this uneven (binomial, p = 1/2).

    >>> mcnemar_p(0, 0)
    1.0
    >>> round(mcnemar_p(10, 0), 5)
    0.00195
    """
    changed = gained + lost
    if changed == 0:
        return 1.0
    tail = sum(math.comb(changed, k) for k in range(min(gained, lost) + 1)) / 2.0 ** changed
    return min(1.0, 2.0 * tail)


def _normal_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


@dataclass(frozen=True)
class Comparison:
    """`after` against `before` on the same n questions (scores as shares, 0-1)."""

    n: int
    before: float
    after: float
    gained: int  # questions wrong before and right after (score 0 -> 1; 0 for fractional scores)
    lost: int  # right before, wrong after
    se: float  # standard error of the gain, as a share
    p_value: float
    test: str  # "McNemar exact" or "paired z"

    @property
    def gain_points(self) -> float:
        return 100.0 * (self.after - self.before)

    @property
    def se_points(self) -> float:
        return 100.0 * self.se

    @property
    def real(self) -> bool:
        """The gain (or loss) is unlikely to be the luck of sampling at SIGNIFICANCE."""
        return self.p_value < SIGNIFICANCE and self.after != self.before

    def p_text(self) -> str:
        return "p < 0.001" if self.p_value < 0.001 else f"p = {self.p_value:.3f}"

    def verdict(self) -> str:
        """One line: '+31.0 points (SE 2.1), p < 0.001 (McNemar exact, n = 500): a real gain'."""
        head = (f"{self.gain_points:+.1f} points (SE {self.se_points:.1f}), {self.p_text()} "
                f"({self.test}, n = {self.n})")
        if not self.real:
            return f"{head}: not distinguishable from noise at this size"
        return f"{head}: a real {'gain' if self.after > self.before else 'loss'}"


def compare(before: Sequence[float], after: Sequence[float]) -> Comparison:
    """Pairs per-question scores (0-1) of the same questions, in the same order.

    >>> c = compare([0, 0, 1, 0] * 50, [1, 1, 1, 0] * 50)
    >>> (c.n, c.gained, c.lost, round(c.gain_points, 1), c.real)
    (200, 100, 0, 50.0, True)
    """
    if len(before) != len(after):
        raise ValueError(f"paired scores need the same questions: {len(before)} before, {len(after)} after")
    n = len(before)
    if n == 0:
        return Comparison(0, 0.0, 0.0, 0, 0, 0.0, 1.0, "none")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    mean = sum(diffs) / n
    variance = max(0.0, sum(d * d for d in diffs) / n - mean * mean)
    se = math.sqrt(variance / n)
    binary = all(v in (0.0, 1.0) for v in (*before, *after))
    gained = sum(1 for d in diffs if d > 0) if binary else 0
    lost = sum(1 for d in diffs if d < 0) if binary else 0
    if binary:
        p, test = mcnemar_p(gained, lost), "McNemar exact"
    else:
        p, test = (_normal_p(mean / se) if se > 0 else (1.0 if mean == 0 else 0.0)), "paired z"
    return Comparison(n, sum(before) / n, sum(after) / n, gained, lost, se, p, test)


def per_question(column: str, results: Sequence[benchmark_pb2.QuestionResult]) -> dict[int, float]:
    """Question index -> its value in a score column (rlvr/scores.py's SCORE_COLUMNS): the share
    that column averages over the questions."""
    value = {
        "accuracy": lambda r: r.accuracy,
        "accuracy_strict": lambda r: float(r.strict),
        "format": lambda r: r.format,
        "answered": lambda r: float(r.finish_reason == common_pb2.FINISH_REASON_STOP),
    }[column]
    return {r.index: value(r) for r in results}


def compare_columns(column: str, before: Sequence[benchmark_pb2.QuestionResult],
                    after: Sequence[benchmark_pb2.QuestionResult]) -> Comparison | None:
    """The two evaluations' results compared in `column`; None when they cover other questions."""
    b, a = per_question(column, before), per_question(column, after)
    if not b or sorted(b) != sorted(a):
        return None
    return compare([b[i] for i in sorted(b)], [a[i] for i in sorted(b)])
