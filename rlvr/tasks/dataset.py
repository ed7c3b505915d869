"""A user's dataset as a task: rows with a ``prompt`` and a ``ground_truth`` column, and whatever
other columns the job's rewards read (each row's other columns travel with it as ``Problem.columns``).

The prompt is either text or a conversation (a list of ``{"role", "content"}`` turns, the
conversational format TRL uses); the ground truth is what the reward checks against. Every reward
without prompts of its own reads its data through this one task (Boxed-answer accuracy is one).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.tasks.base import Message, Problem, Split, TaskError, check_count
from rlvr.tasks.sources import dataset_splits, load_rows, require_columns

PROMPT_COLUMN = "prompt"
GROUND_TRUTH_COLUMN = "ground_truth"
BASE_COLUMNS = (PROMPT_COLUMN, GROUND_TRUTH_COLUMN)


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


def jsonable(value: Any) -> Any:
    """A column value as JSON-like data (what ScoreItem.columns carries): numpy/arrow values of a
    Parquet row become lists and numbers; NaN becomes None."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def to_problem(row: dict[str, Any], index: int, source: str, key: str = "boxed") -> Problem:
    """One dataset row as a Problem; an empty prompt or a missing ground truth is an error."""
    prompt, truth = row[PROMPT_COLUMN], row[GROUND_TRUTH_COLUMN]
    if truth is None or not str(truth).strip():
        raise TaskError(f"dataset {source!r} row {index}: empty {GROUND_TRUTH_COLUMN!r}")
    columns = {name: jsonable(value) for name, value in row.items() if name not in BASE_COLUMNS}
    problem_id = f"{key}/{index}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TaskError(f"dataset {source!r} row {index}: empty {PROMPT_COLUMN!r}")
        return Problem(id=problem_id, task=key, question=prompt.strip(), ground_truth=str(truth).strip(),
                       columns=columns)
    messages = _messages(prompt, source, index)
    return Problem(id=problem_id, task=key, question=messages[-1].content, ground_truth=str(truth).strip(),
                   messages=messages, columns=columns)


class DatasetTask:
    """A user's dataset, local (under ``data_roots``) or from the hub, for the reward ``key``, which
    reads ``columns`` besides the prompt and the ground truth."""

    def __init__(self, source: str, data_roots: Sequence[str | Path] = (), key: str = "boxed",
                 columns: Sequence[str] = ()) -> None:
        if not source or not source.strip():
            raise TaskError(f"the {key} reward needs a dataset: the Dataset field is empty")
        self.source = source.strip()
        self.data_roots = tuple(data_roots)
        self.name = self.reward_function = key
        self.columns = (*BASE_COLUMNS, *(c for c in columns if c not in BASE_COLUMNS))

    def splits(self) -> tuple[Split, ...]:
        return tuple(dataset_splits(self.source, self.data_roots))

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """All rows of the split, or ``n`` of them (a seeded order for training, file order
        otherwise)."""
        rows = load_rows(self.source, split, self.data_roots)
        require_columns(rows, self.columns, self.source)
        problems = [to_problem(row, i, self.source, self.name) for i, row in enumerate(rows)]
        seeded_order = split == "train" if shuffle is None else shuffle
        if seeded_order:
            problems.sort(key=lambda p: hashlib.sha256(f"rlvr.{self.name}:{seed}:{p.id}".encode()).digest())
        if n is not None:
            check_count(n, "prompts", low=1, high=len(problems))
            problems = problems[:n]
        return problems
