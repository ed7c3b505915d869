"""Boxed-answer accuracy: any dataset with a ``prompt`` and a ``ground_truth`` column, rewarded on a
correct ``\\boxed{...}`` final answer (rlvr/rewards/scoring.py). Its rows are read by the one dataset
task every reward without prompts of its own shares (rlvr/tasks/dataset.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlvr.rewards.registry import RewardDefinition
from rlvr.rewards.scoring import answer_reward
from rlvr.tasks.base import TaskError
from rlvr.tasks.dataset import GROUND_TRUTH_COLUMN, PROMPT_COLUMN, DatasetTask, to_problem

__all__ = ["GROUND_TRUTH_COLUMN", "PROMPT_COLUMN", "REWARD", "BoxedTask", "to_problem"]


class BoxedTask(DatasetTask):
    """A user's dataset, local (under ``data_roots``) or from the hub."""

    def __init__(self, source: str, data_roots: Sequence[str | Path] = ()) -> None:
        if not source or not source.strip():
            raise TaskError("the boxed-answer reward needs a dataset: the Dataset field is empty")
        super().__init__(source, data_roots, key="boxed")


REWARD = RewardDefinition(
    key="boxed",
    display_name="Boxed-answer accuracy",
    description="Any dataset with prompt and ground_truth columns; rewards a correct \\boxed{...} final answer.",
    needs_dataset=True,
    default_benchmark="boxed",
    benchmark_display_name="Boxed answer",
    instruction="Think step by step inside <think></think>, then give the final answer as \\boxed{...} "
                "inside <answer></answer>.",
    score=answer_reward("boxed"),
    order=2,
)
