"""Tasks: where prompts and their ground truths come from (Math Pairs, GSM8K, boxed datasets).

``get_task`` maps the reward card's choice to a task; ``render_prompt`` turns a problem into the
prompt text a given model sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlvr.rewards.registry import RewardInfo
from rlvr.tasks.base import (
    DEFAULT_SYNTHETIC_PROMPTS,
    MAX_PROMPTS,
    MIN_PROMPTS,
    Message,
    Problem,
    RewardFunction,
    Split,
    Task,
    TaskError,
    heldout_split,
)
from rlvr.tasks.boxed import BoxedTask
from rlvr.tasks.dataset import DatasetTask
from rlvr.tasks.gsm8k import GSM8KTask
from rlvr.tasks.math_pairs import MathPairsTask
from rlvr.tasks.render import (
    COMPACT_STYLE,
    FULL_STYLE,
    PROMPT_STYLE_KEY,
    PromptStyle,
    model_dir_prompt_style,
    prompt_messages,
    prompt_style,
    render_prompt,
)


def get_task(name: str, dataset: str | None = None, data_roots: Sequence[str | Path] = ()) -> Task:
    """The task of the reward `name` (a registry key): where its prompts come from.

    A reward with prompts of its own (Math Pairs, GSM8K) ignores ``dataset``, as the spec says
    (:func:`ignored_dataset_warning` words the job warning); one that needs a dataset reads it
    (required), under one of ``data_roots`` when local."""
    from rlvr.rewards.registry import UnavailableReward, UnknownReward, get_reward

    try:
        definition = get_reward(name)
    except (UnknownReward, UnavailableReward) as e:
        raise TaskError(f"unknown reward function {name!r}: {e}") from None
    return task_of(definition, dataset, data_roots)


def task_of(reward: RewardInfo, dataset: str | None = None, data_roots: Sequence[str | Path] = ()) -> Task:
    """Where a reward's prompts come from: its own problems (unless it takes a dataset and one is
    given), or the dataset's rows (``prompt``, ``ground_truth`` and the columns it reads)."""
    roots = tuple(Path(r) for r in data_roots)
    problems = getattr(reward, "problems", None)  # a RewardDefinition's; a bare RewardInfo has none
    if problems is not None and not (reward.accepts_dataset and dataset):
        return problems(dataset, roots)
    return DatasetTask(dataset or "", roots, key=reward.key, columns=reward.columns)


def ignored_dataset_warning(name: str, dataset: str | None) -> str | None:
    """The job warning the spec asks for when a Dataset is given to a reward that ignores it."""
    from rlvr.rewards.registry import load_registry

    definition = load_registry().rewards.get(name)
    if not dataset or definition is None or definition.takes_dataset:
        return None
    short = definition.display_name.split(" (")[0].removesuffix(" accuracy")
    why = f"{short} uses {definition.data_name} dataset" if definition.data_name else \
        f"{short} generates its own prompts"
    return f"the Dataset field ({dataset!r}) is ignored: {why}"


__all__ = [
    "COMPACT_STYLE",
    "DEFAULT_SYNTHETIC_PROMPTS",
    "FULL_STYLE",
    "MAX_PROMPTS",
    "MIN_PROMPTS",
    "PROMPT_STYLE_KEY",
    "BoxedTask",
    "DatasetTask",
    "GSM8KTask",
    "MathPairsTask",
    "Message",
    "Problem",
    "PromptStyle",
    "RewardFunction",
    "Split",
    "Task",
    "TaskError",
    "get_task",
    "heldout_split",
    "ignored_dataset_warning",
    "task_of",
    "model_dir_prompt_style",
    "prompt_messages",
    "prompt_style",
    "render_prompt",
]
