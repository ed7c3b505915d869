"""Tasks: where prompts and their ground truths come from (Math Pairs, GSM8K, boxed datasets).

``get_task`` maps the reward card's choice to a task; ``render_prompt`` turns a problem into the
prompt text a given model sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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

TASK_NAMES: tuple[RewardFunction, ...] = ("math_pairs", "gsm8k", "boxed")


def get_task(
    name: str,
    dataset: str | None = None,
    data_roots: Sequence[str | Path] = (),
    gsm8k_source: str | None = None,
) -> Task:
    """The task for a reward function name.

    ``dataset`` (the spec's Dataset field) is what ``boxed`` reads and is required there; Math Pairs
    and GSM8K ignore it, as the spec says (:func:`ignored_dataset_warning` words the job warning).
    ``gsm8k_source`` replaces the bundled GSM8K with a local file or another hub dataset.
    Local files must lie under one of ``data_roots``.
    """
    if name == "math_pairs":
        return MathPairsTask()
    if name == "gsm8k":
        return GSM8KTask(gsm8k_source, data_roots)
    if name == "boxed":
        return BoxedTask(dataset or "", data_roots)
    raise TaskError(f"unknown reward function {name!r}; choose one of {list(TASK_NAMES)}")


def ignored_dataset_warning(name: str, dataset: str | None) -> str | None:
    """The job warning the spec asks for when a Dataset is given to a reward that ignores it."""
    if dataset and name == "math_pairs":
        return f"the Dataset field ({dataset!r}) is ignored: Math Pairs generates its own prompts"
    if dataset and name == "gsm8k":
        return f"the Dataset field ({dataset!r}) is ignored: GSM8K uses the built-in openai/gsm8k dataset"
    return None


__all__ = [
    "COMPACT_STYLE",
    "DEFAULT_SYNTHETIC_PROMPTS",
    "FULL_STYLE",
    "MAX_PROMPTS",
    "MIN_PROMPTS",
    "PROMPT_STYLE_KEY",
    "TASK_NAMES",
    "BoxedTask",
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
    "model_dir_prompt_style",
    "prompt_messages",
    "prompt_style",
    "render_prompt",
]
