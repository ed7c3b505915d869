"""The benchmark score columns, defined once: their names, titles and what each counts.

The benchmark service computes them (services/benchmark/catalog.py), and the CLI, the web console's
evaluation legend and the docs show these words; benchmark.proto's header says the same. Every
column is a share of the n evaluated questions, so each has a standard error (`standard_error`).
"""

from __future__ import annotations

import math

SCORE_COLUMNS: tuple[str, ...] = ("accuracy", "accuracy_strict", "format", "answered")

TITLES: dict[str, str] = {"accuracy": "Accuracy", "accuracy_strict": "Accuracy Strict", "format": "Format",
                          "answered": "Answered"}

DEFINITIONS: dict[str, str] = {
    "accuracy": "the final answer is correct, wherever it stands",
    "accuracy_strict": ("correct and written exactly as the ground truth (whitespace trimmed) in its canonical "
                        "place: the \\boxed{} for boxed datasets, else the <answer> block, else the last line; "
                        "independent of format"),
    "format": "exactly one <think> block then one <answer> block, right or wrong",
    "answered": "finished rather than cut off at the length limit",
}
"""What each column counts, as a share of the evaluated questions."""


def standard_error(share: float, n: int) -> float:
    """sqrt(p (1 - p) / n): how far a share measured on n questions may sit from the model's share
    on the whole task by the luck of which questions were drawn (0 for n = 0).

    >>> round(standard_error(0.22, 50), 4)
    0.0586
    """
    return math.sqrt(max(0.0, share * (1.0 - share)) / n) if n > 0 else 0.0
