"""The benchmarks the service knows, and the score breakdown of an evaluation.

A benchmark is a reward plus a fixed question set, its held-out split: every reward the reward
service has makes one, named by the reward's `default_benchmark` (the held-out Math Pairs problems,
the very set `rlvr models build-tiny` measures; the bundled GSM8K test split; any dataset with
`prompt` and `ground_truth` columns scored on its boxed answer; a plugin's dataset scored by it).
Questions come from the reward service's held-out split, so training and benchmarking share one
definition of each task.

The score columns, as protos/rlvr/v1/benchmark.proto defines them (n = questions evaluated):
accuracy = correct final answers, wherever they stand / n; accuracy_strict = correct and written
exactly as the ground truth in the answer's canonical place (the reward's `strict`) / n, never above
accuracy and independent of format; format = the exact <think>...</think><answer>...</answer>
structure, right or wrong / n; answered = completions that finished (STOP) rather than being cut
off at the length limit / n.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlvr.common.errors import InvalidArgument
from rlvr.rewards.registry import Catalog, RewardInfo, load_registry
from rlvr.scores import SCORE_COLUMNS

RewardName = str  # a reward's key
DEFAULT_SCORE_COLUMN = "accuracy"


@dataclass(frozen=True)
class Benchmark:
    name: str
    display_name: str
    description: str
    reward_function: RewardName
    needs_dataset: bool = False
    default_score_column: str = DEFAULT_SCORE_COLUMN
    size: int = 0  # questions in the whole benchmark (0 when it depends on the dataset)
    accepts_dataset: bool = False  # it has questions of its own, and takes a dataset's instead

    @property
    def takes_dataset(self) -> bool:
        return self.needs_dataset or self.accepts_dataset

    @classmethod
    def of(cls, reward: RewardInfo) -> Benchmark:
        """The benchmark a reward makes of its held-out split."""
        return cls(name=reward.benchmark, display_name=reward.benchmark_title,
                   description=f"The held-out split of {reward.display_name}: {reward.description}".rstrip(": "),
                   reward_function=reward.key, needs_dataset=reward.needs_dataset, size=reward.heldout_size,
                   accepts_dataset=reward.accepts_dataset)


def benchmarks_of(catalog: Catalog | None = None) -> dict[str, Benchmark]:
    """Every reward's benchmark, by name (catalog: the reward service's; default this process's)."""
    return {b.name: b for b in (Benchmark.of(i) for i in (catalog or load_registry().catalog()).infos())}


def get_benchmark(name: str, benchmarks: Mapping[str, Benchmark] | None = None) -> Benchmark:
    """The benchmark called `name`; InvalidArgument naming the known ones otherwise."""
    known = benchmarks if benchmarks is not None else benchmarks_of()
    try:
        return known[name]
    except KeyError:
        raise InvalidArgument(f"benchmark: {name!r} is not a benchmark; choose one of {', '.join(known)}") from None


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
