"""What a task is: a source of problems, each a prompt plus the ground truth the reward checks.

A task knows nothing about models or scoring. The trainer asks a task for training prompts, the
benchmark service for its held-out split; both render them with :func:`rlvr.tasks.render_prompt`
and send the ground truth to the reward service under the task's ``reward_function`` name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Split = str  # a dataset's split name: "train", "test", or whatever else a dataset has
RewardFunction = Literal["math_pairs", "gsm8k", "boxed", "code"]

# The spec's range for the "Synthetic prompts" field (and a sane cap on dataset prompts asked for).
MIN_PROMPTS = 8
MAX_PROMPTS = 100_000
DEFAULT_SYNTHETIC_PROMPTS = 256


class TaskError(ValueError):
    """A task cannot produce prompts from what it was given (bad dataset, column, path, count).

    A ``ValueError`` so that the gRPC shells map it to ``INVALID_ARGUMENT``; the message names the
    problem and, for datasets, the columns that are there.
    """


@dataclass(frozen=True)
class Message:
    """One chat turn, as in a conversational dataset's ``prompt`` column."""

    role: str
    content: str


@dataclass(frozen=True)
class Problem:
    """One prompt of a task and the ground truth its reward function checks.

    ``question`` is the problem as a user would read it (no answer-format instruction: rendering adds
    that). ``compact`` is an even shorter statement for models that declare the compact prompt form,
    e.g. the character-level tiny model where every character costs a token. ``messages`` is set
    when the dataset's prompt is already a conversation; it then takes the place of ``question``.
    ``columns`` holds the dataset row's other columns (beyond the prompt and the ground truth), for
    the rewards that read them (e.g. a code reward's ``tests``).
    """

    id: str
    task: RewardFunction
    question: str
    ground_truth: str
    compact: str | None = None
    messages: tuple[Message, ...] | None = None
    columns: Mapping[str, Any] = field(default_factory=dict)


class Task(Protocol):
    """A source of problems. ``split="train"`` feeds training, ``split="test"`` the benchmarks,
    unless a job names another split of its dataset (``reward.dataset_split``)."""

    name: str
    reward_function: RewardFunction

    def splits(self) -> tuple[Split, ...]:
        """The splits this task's data has (TaskError when the dataset cannot be read)."""
        ...

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """``n`` problems of ``split`` (all of it when None for datasets), deterministic for a
        seed: a seeded order when ``shuffle`` (default: for "train"), the data's own order
        otherwise (so a benchmark's first n questions are the same for every model)."""
        ...


def heldout_split(splits: tuple[Split, ...] | list[Split], source: str) -> Split:
    """The split a benchmark scores on by default: "test", or a one-split dataset's only split
    (a single local file)."""
    if "test" in splits:
        return "test"
    if len(splits) == 1:
        return splits[0]
    raise TaskError(f"dataset {source!r} has no 'test' split; name one of {', '.join(splits)}")


def check_count(n: int, what: str = "prompts", low: int = MIN_PROMPTS, high: int = MAX_PROMPTS) -> int:
    """Validate a requested number of prompts against the spec's range."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TaskError(f"{what} must be an integer, got {n!r}")
    if not low <= n <= high:
        raise TaskError(f"{what} must be between {low} and {high}, got {n}")
    return n
