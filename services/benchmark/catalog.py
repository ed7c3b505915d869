"""The benchmarks the service knows, and the score breakdown of an evaluation.

A benchmark is a reward function plus a fixed question set: the held-out Math Pairs problems
(the very set `rlvr models build-tiny` measures), the bundled GSM8K test split, or any dataset with
`prompt` and `ground_truth` columns scored on its boxed answer. Questions come from the reward
service's held-out split, so training and benchmarking share one definition of each task.

The score columns, as protos/rlvr/v1/benchmark.proto defines them (n = questions evaluated):
accuracy = correct final answers, wherever they stand / n; accuracy_strict = correct and written
exactly as the ground truth in the answer's canonical place (the reward's `strict`) / n, never above
accuracy and independent of format; format = the exact <think>...</think><answer>...</answer>
structure, right or wrong / n; answered = completions that finished (STOP) rather than being cut
off at the length limit / n.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from rlvr.common.errors import InvalidArgument
from rlvr.scores import SCORE_COLUMNS
from rlvr.tasks import math_pairs
from rlvr.tasks.gsm8k import BUNDLED_DIR

RewardName = Literal["math_pairs", "gsm8k", "boxed"]
DEFAULT_SCORE_COLUMN = "accuracy"


@dataclass(frozen=True)
class Benchmark:
    name: str
    display_name: str
    description: str
    reward_function: RewardName
    needs_dataset: bool = False
    default_score_column: str = DEFAULT_SCORE_COLUMN

    @property
    def size(self) -> int:
        """Questions in the whole benchmark (0 when it depends on the dataset)."""
        if self.reward_function == "math_pairs":
            return math_pairs.DEFAULT_HELDOUT_N
        if self.reward_function == "gsm8k":
            return _gsm8k_test_size()
        return 0


@lru_cache(maxsize=1)
def _gsm8k_test_size() -> int:
    with (BUNDLED_DIR / "test.jsonl").open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "rlvr-math-pairs-heldout",
            "RLVR Math Pairs held-out",
            "Held-out Math Pairs problems (add adjacent pairs, multiply the sums), never a training "
            "prompt of any seed; the set `rlvr models build-tiny` reports its accuracy on.",
            "math_pairs",
        ),
        Benchmark(
            "gsm8k",
            "GSM8K",
            "Grade-school word problems: the bundled openai/gsm8k test split, or its first `limit`.",
            "gsm8k",
        ),
        Benchmark(
            "boxed",
            "Boxed answer",
            "Any dataset with prompt and ground_truth columns (request field `dataset`), scored on "
            "the final \\boxed{...} answer.",
            "boxed",
            needs_dataset=True,
        ),
    )
}


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called `name`; ValueError naming the known ones otherwise."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise InvalidArgument(f"benchmark: {name!r} is not a benchmark; choose one of {', '.join(BENCHMARKS)}") from None


def check_score_column(column: str) -> str:
    if column not in SCORE_COLUMNS:
        raise InvalidArgument(f"score_column: {column!r} is not a score column; choose one of {', '.join(SCORE_COLUMNS)}")
    return column


@dataclass(frozen=True)
class Tally:
    """Sums over the questions evaluated so far; the shares are these over `n`."""

    n: int = 0
    correct: float = 0.0
    strict: int = 0
    formatted: float = 0.0
    answered: int = 0

    def add(self, accuracy: float, strict: bool, format_: float, finished: bool) -> Tally:
        return Tally(
            self.n + 1,
            self.correct + accuracy,
            self.strict + int(strict),
            self.formatted + format_,
            self.answered + int(finished),
        )

    def share(self, column: str) -> float:
        if self.n == 0:
            return 0.0
        value = {
            "accuracy": self.correct,
            "accuracy_strict": self.strict,
            "format": self.formatted,
            "answered": self.answered,
        }[check_score_column(column)]
        return value / self.n


def tally(rows: Iterable[tuple[float, bool, float, bool]]) -> Tally:
    """(accuracy, strict, format, finished) per question -> the tally."""
    total = Tally()
    for accuracy, strict, format_, finished in rows:
        total = total.add(accuracy, strict, format_, finished)
    return total
