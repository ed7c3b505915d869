"""Boxed-answer accuracy: any dataset with a ``prompt`` and a ``ground_truth`` column.

The prompt is either text or a conversation (a list of ``{"role", "content"}`` turns, the
conversational format TRL uses); the ground truth is whatever a correct ``\\boxed{...}`` holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.tasks.base import Message, Problem, RewardFunction, Split, TaskError, check_count
from rlvr.tasks.sources import dataset_splits, load_rows, require_columns

PROMPT_COLUMN = "prompt"
GROUND_TRUTH_COLUMN = "ground_truth"


def _messages(value: Any, source: str, row: int) -> tuple[Message, ...]:
    try:
        turns = tuple(Message(role=str(t["role"]), content=str(t["content"])) for t in value)
    except (TypeError, KeyError) as exc:
        raise TaskError(
            f"dataset {source!r} row {row}: a list prompt must hold {{'role', 'content'}} turns"
        ) from exc
    if not turns:
        raise TaskError(f"dataset {source!r} row {row}: empty prompt")
    return turns


def to_problem(row: dict[str, Any], index: int, source: str) -> Problem:
    """One dataset row as a Problem; an empty prompt or a missing ground truth is an error."""
    prompt, truth = row[PROMPT_COLUMN], row[GROUND_TRUTH_COLUMN]
    if truth is None or not str(truth).strip():
        raise TaskError(f"dataset {source!r} row {index}: empty {GROUND_TRUTH_COLUMN!r}")
    problem_id = f"boxed/{index}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TaskError(f"dataset {source!r} row {index}: empty {PROMPT_COLUMN!r}")
        return Problem(id=problem_id, task="boxed", question=prompt.strip(), ground_truth=str(truth).strip())
    messages = _messages(prompt, source, index)
    return Problem(
        id=problem_id,
        task="boxed",
        question=messages[-1].content,
        ground_truth=str(truth).strip(),
        messages=messages,
    )


class BoxedTask:
    """A user's dataset, local (under ``data_roots``) or from the hub."""

    name = "boxed"
    reward_function: RewardFunction = "boxed"

    def __init__(self, source: str, data_roots: Sequence[str | Path] = ()) -> None:
        if not source or not source.strip():
            raise TaskError("the boxed-answer reward needs a dataset: the Dataset field is empty")
        self.source = source.strip()
        self.data_roots = tuple(data_roots)

    def splits(self) -> tuple[Split, ...]:
        return tuple(dataset_splits(self.source, self.data_roots))

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """All rows of the split, or ``n`` of them (a seeded order for training, file order
        otherwise)."""
        rows = load_rows(self.source, split, self.data_roots)
        require_columns(rows, (PROMPT_COLUMN, GROUND_TRUTH_COLUMN), self.source)
        problems = [to_problem(row, i, self.source) for i, row in enumerate(rows)]
        seeded_order = split == "train" if shuffle is None else shuffle
        if seeded_order:
            problems.sort(key=lambda p: hashlib.sha256(f"rlvr.boxed:{seed}:{p.id}".encode()).digest())
        if n is not None:
            check_count(n, "prompts", low=1, high=len(problems))
            problems = problems[:n]
        return problems
