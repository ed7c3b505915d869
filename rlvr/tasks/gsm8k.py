"""GSM8K accuracy: grade-school word problems, rewarded on the correct final number.

The spec calls it the built-in ``openai/gsm8k`` dataset; the machines this project runs on reach no
hub, so a copy (MIT licence) ships in ``rlvr/data/gsm8k`` and is what ``openai/gsm8k`` means here
(train split for training, test split for benchmarks). Another hub name or a local JSONL file with the
same ``question``/``answer`` columns can be given instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from rlvr.rewards.registry import RewardDefinition
from rlvr.rewards.scoring import answer_reward
from rlvr.tasks.base import NUMBER_INSTRUCTION, Problem, Split, TaskError, check_count
from rlvr.tasks.sources import Rows, check_split, dataset_splits, load_rows, require_columns

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "gsm8k"
BUILTIN_NAMES = frozenset({"openai/gsm8k", "gsm8k"})
BUNDLED_SPLITS: tuple[str, ...] = ("train", "test")


def ground_truth(answer_text: str) -> str:
    """The number after ``####`` with thousands separators removed.

    >>> ground_truth("48/2 = 24 clips\\n#### 1,450,000")
    '1450000'
    """
    marker = answer_text.rfind("####")
    if marker < 0:
        raise TaskError(f"GSM8K answer has no '####' final answer: {answer_text[-80:]!r}")
    value = answer_text[marker + 4 :].strip().removeprefix(":").strip().replace(",", "")  # "####: 55" too
    if not value:
        raise TaskError(f"GSM8K answer has an empty final answer: {answer_text[-80:]!r}")
    return value


@lru_cache(maxsize=2)
def _bundled_rows(split: Split) -> tuple[tuple[str, str], ...]:
    path = BUNDLED_DIR / f"{split}.jsonl"
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple((row["question"], row["answer"]) for row in rows)


class GSM8KTask:
    """GSM8K from the bundled copy, or from ``source`` (a local JSONL/Parquet/CSV or a hub name)."""

    name = "gsm8k"
    reward_function = "gsm8k"

    def __init__(self, source: str | None = None, data_roots: Sequence[str | Path] = ()) -> None:
        self.source = None if source in BUILTIN_NAMES else source
        self.data_roots = tuple(data_roots)

    def splits(self) -> tuple[Split, ...]:
        if self.source is None:
            return BUNDLED_SPLITS
        return tuple(dataset_splits(self.source, self.data_roots, hub_config="main"))

    def _rows(self, split: Split) -> list[tuple[str, str]]:
        if self.source is None:
            return list(_bundled_rows(check_split("openai/gsm8k", split, BUNDLED_SPLITS)))
        rows: Rows = load_rows(self.source, split, self.data_roots, hub_config="main")
        require_columns(rows, ("question", "answer"), self.source)
        return [(str(r["question"]), str(r["answer"])) for r in rows]

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """All problems of the split, or ``n`` of them: a seeded shuffle for training, file order
        otherwise (so a benchmark's first n questions are the same for every model)."""
        rows = self._rows(split)
        order = list(range(len(rows)))
        seeded_order = split == "train" if shuffle is None else shuffle
        if seeded_order:
            # a hash order rather than random.shuffle, whose algorithm may change between Pythons
            order.sort(key=lambda i: hashlib.sha256(f"rlvr.gsm8k:{seed}:{i}".encode()).digest())
        if n is not None:
            check_count(n, "prompts", low=1, high=len(rows))
            order = order[:n]
        return [
            Problem(
                id=f"gsm8k/{split}/{i}",
                task="gsm8k",
                question=rows[i][0].strip(),
                ground_truth=ground_truth(rows[i][1]),
            )
            for i in order
        ]


REWARD = RewardDefinition(
    key="gsm8k",
    display_name="GSM8K accuracy",
    description="Grade-school word problems from the built-in openai/gsm8k; rewards the correct final number. "
                "The Dataset field is ignored.",
    needs_dataset=False,
    default_benchmark="gsm8k",
    benchmark_display_name="GSM8K",
    instruction=NUMBER_INSTRUCTION,
    splits=BUNDLED_SPLITS,
    data_name="the built-in openai/gsm8k",
    heldout_size=len(_bundled_rows("test")),
    score=answer_reward("gsm8k"),
    problems=lambda dataset, data_roots: GSM8KTask(None, data_roots),
    order=1,
)
