"""What CreateJob (and CreateLoop) can check of a job's dataset before anything is queued.

A job whose reward reads a dataset (Boxed-answer accuracy, a plugin's, the code reward given one)
names its data: a local file or folder under the data roots, or a hub dataset.
A dataset that cannot be read would otherwise fail the job 10-35 s later at dispatch; here it is
INVALID_ARGUMENT naming `reward.dataset` (or `reward.dataset_split`, listing the splits the data has)
and nothing is created. Local data is checked for real: the path is inside a data root, the split
exists, and its first row has the prompt and ground_truth columns and every column the job's rewards
and its environment declare they read (only the head is read; a missing one is named with the reward
or the environment that reads it). A hub
name is checked for its shape, and for a hub this scheduler can reach: on a closed machine it is
refused at once with that reason, instead of a trainer finding out later.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlvr.common.errors import InvalidArgument
from rlvr.environments.base import EnvironmentInfo
from rlvr.heads import labels_problem
from rlvr.jobspec import HEAD_TASK_NAMES, sft_columns_problem
from rlvr.rewards.registry import Catalog
from rlvr.tasks import TaskError
from rlvr.tasks.dataset import GROUND_TRUTH_COLUMN, PROMPT_COLUMN
from rlvr.tasks.sources import (
    check_hub_name,
    dataset_splits,
    hub_reachable,
    load_rows,
    local_splits,
    looks_local,
    peek_columns,
    resolve_local,
)
from rlvr.v1 import common_pb2


def check_dataset(reward: common_pb2.RewardConfig, data_roots: Sequence[Path], catalog: Catalog | None = None,
                  environment: EnvironmentInfo | None = None) -> None:
    """Raises InvalidArgument when a resolved spec's dataset or split cannot be trained on (by its
    rewards, and by `environment`, the job's environment's declaration, when it has one)."""
    if not reward.dataset:
        return  # the reward makes its prompts; the splits of a reward's own data are checked by resolve_spec
    info = (catalog.rewards if catalog is not None else {}).get(reward.key)
    if info is not None and info.dataset_names:
        return  # the dataset names one of the reward's own tasks, which resolve_spec checked: no data to read
    source, split = reward.dataset, reward.dataset_split
    columns = _columns(source, split, data_roots, "reward")
    if columns is None:
        return  # a hub dataset's columns are checked when the trainer loads it
    missing = [c for c in (PROMPT_COLUMN, GROUND_TRUTH_COLUMN) if c not in columns]
    if missing:
        raise InvalidArgument(f"reward.dataset: {source!r} ({split}) has no {' and no '.join(map(repr, missing))} "
                              f"column; columns present: {columns}")
    for term in reward.terms or [common_pb2.RewardTerm(key=reward.key)]:
        info = (catalog.rewards if catalog is not None else {}).get(term.key)
        lacking = [c for c in (info.columns if info is not None else ()) if c not in columns]
        if info is not None and lacking:
            raise InvalidArgument(f"reward.dataset: {source!r} ({split}) has no {lacking[0]!r} column, which the "
                                  f"{info.display_name} reward ({term.key}) reads; columns present: {columns}")
    lacking = [c for c in (environment.columns if environment is not None else ()) if c not in columns]
    if environment is not None and lacking:
        raise InvalidArgument(f"reward.dataset: {source!r} ({split}) has no {lacking[0]!r} column, which the "
                              f"{environment.display_name} environment ({environment.key}) reads; columns present: "
                              f"{columns}")


def check_sft_dataset(sft: common_pb2.SftConfig, data_roots: Sequence[Path]) -> None:
    """A Supervised (SFT) job's dataset (sft.dataset) as `check_dataset` checks a reward's: readable,
    with its split, and (local data) the prompt and completion columns or a messages column."""
    columns = _columns(sft.dataset, sft.dataset_split, data_roots, "sft")
    problem = sft_columns_problem(columns) if columns is not None else ""
    if problem:
        raise InvalidArgument(f"sft.dataset: {sft.dataset!r} ({sft.dataset_split}) {problem}")


def check_head_dataset(head: common_pb2.HeadConfig, data_roots: Sequence[Path]) -> None:
    """A Head job's dataset (head.dataset) as `check_dataset` checks a reward's: readable, with its split,
    and (local data, every row read) the text and label columns, two classes at least, or numbers for
    regression, and head.reward_label among the classes."""
    if _columns(head.dataset, head.dataset_split, data_roots, "head") is None:
        return  # a hub dataset's rows are checked when the trainer loads it
    try:
        rows = load_rows(head.dataset, head.dataset_split, data_roots)
    except TaskError as e:
        raise InvalidArgument(f"head.dataset: {e}") from None
    task = HEAD_TASK_NAMES.get(head.task, "classification")
    _, problem = labels_problem(rows, head.text_column, head.label_column, task, head.reward_label)
    if problem is not None:
        raise InvalidArgument(f"{problem.field}: {head.dataset!r} ({head.dataset_split}) {problem.why}")


def _columns(source: str, split: str, data_roots: Sequence[Path], card: str) -> list[str] | None:
    """The columns of a local dataset's split (None for a hub dataset, whose columns the trainer
    checks), or InvalidArgument naming `<card>.dataset` or `<card>.dataset_split`."""
    try:
        if looks_local(source):
            splits = list(local_splits(resolve_local(source, data_roots)))
        else:
            check_hub_name(source)
            if not hub_reachable():
                raise InvalidArgument(
                    f"{card}.dataset: {source!r} names a Hugging Face hub dataset, and the hub is not reachable "
                    "from the scheduler; give a local JSONL/Parquet/CSV file or a folder of split files under "
                    "the data roots instead")
            splits = dataset_splits(source, data_roots)
    except TaskError as e:
        raise InvalidArgument(f"{card}.dataset: {e}") from None
    if split not in splits:
        raise InvalidArgument(f"{card}.dataset_split: {split!r} is not a split of {source!r}; it has: "
                              f"{', '.join(splits)}")
    if not looks_local(source):
        return None
    try:
        return peek_columns(source, split, data_roots)
    except TaskError as e:
        raise InvalidArgument(f"{card}.dataset: {e}") from None
