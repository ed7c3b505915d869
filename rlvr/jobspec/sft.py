"""The Training Method and the supervised cards (SFT's and Head's) checked: what such a job reads, and
what it refuses."""

from __future__ import annotations

from google.protobuf.message import Message

from rlvr.common.errors import InvalidArgument, Violations, out_of_range
from rlvr.jobspec.fields import _checked, _enum
from rlvr.jobspec.ranges import (
    HEAD_LABEL_COLUMN,
    HEAD_TASK_NAMES,
    HEAD_TEXT_COLUMN,
    MAX_STEPS_HIGH,
    METHOD_KEYS,
    METHOD_NAMES,
    SFT_COLUMN_SETS,
    SFT_MAX_STEPS_DEFAULT,
    SFT_READS_ADVANCED,
    TARGET_MODULES_RE,
    C,
)
from rlvr.v1 import common_pb2

SFT_DEFAULT_SPLIT = "train"
Card = common_pb2.SftConfig | common_pb2.HeadConfig  # a supervised card


def _set_fields(msg: Message, group: str) -> list[str]:
    """The paths of the fields of `msg` set to something (protobuf's ListFields: a field with presence
    set, a repeated one not empty, another not its default), in field-number order."""
    return [f"{group}.{field.name}" for field, _ in msg.ListFields()]


def drop_rlvr_fields(spec: common_pb2.JobSpec) -> list[str]:
    """An SFT spec without what only RLVR reads (the reward, the GRPO card and the Advanced Options
    outside `SFT_READS_ADVANCED`), so that the resolved spec holds their defaults and nothing of them
    is refused; returns the paths that were set (the warning names them)."""
    dropped = _set_fields(spec.reward, "reward") + _set_fields(spec.grpo, "grpo")
    spec.ClearField("reward")
    spec.ClearField("grpo")
    a = spec.advanced
    for path in _set_fields(a, "advanced"):
        name = path.removeprefix("advanced.")
        if name not in SFT_READS_ADVANCED:
            dropped.append(path)
            a.ClearField(name)
    return dropped


def is_sft(spec: common_pb2.JobSpec) -> bool:
    return spec.method == C.TRAINING_METHOD_SFT


def is_head(spec: common_pb2.JobSpec) -> bool:
    return spec.method == C.TRAINING_METHOD_HEAD


def is_supervised(spec: common_pb2.JobSpec) -> bool:
    """A job that learns a labeled dataset (SFT or Head): no reward, no generation, its own card."""
    return spec.method in (C.TRAINING_METHOD_SFT, C.TRAINING_METHOD_HEAD)


def _lora_targets(msg: Card, path: str, v: Violations) -> None:
    msg.target_modules = msg.target_modules.replace(" ", "") or "all-linear"
    if not TARGET_MODULES_RE.match(msg.target_modules):
        v.add(out_of_range(path, msg.target_modules,
                           '"all-linear" (default) or a comma list of module names'))


def _full_steps(msg: Card, path: str, v: Violations) -> None:
    if not msg.HasField("max_steps"):
        msg.max_steps = SFT_MAX_STEPS_DEFAULT
    elif msg.max_steps != -1 and not 1 <= msg.max_steps <= MAX_STEPS_HIGH:
        v.add(out_of_range(path, msg.max_steps, f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default Full)"))


def _validate_method(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    """`method` (unset: RLVR) and, for a Supervised (SFT) job, its card: every field in range, a
    dataset given, and none of what only RLVR does (an environment, a stacked init_adapter, several
    processes or nodes: refused with the reason). An RLVR job with an sft card set is warned."""
    with v.check():
        _enum(spec, "method", "method", METHOD_NAMES, C.TRAINING_METHOD_RLVR)
    if v.bad("method"):
        return
    method = METHOD_NAMES[spec.method]
    for card, owner in (("sft", C.TRAINING_METHOD_SFT), ("head", C.TRAINING_METHOD_HEAD)):
        if spec.method != owner and spec.HasField(card) and getattr(spec, card).ByteSize():
            warnings.append(f"{card}: ignored: it is {METHOD_NAMES[owner]}'s card and this job's method is "
                            f"{METHOD_KEYS[spec.method].upper()}")
    if not is_supervised(spec):
        return
    if is_head(spec):
        _validate_head(spec, warnings, v)
    else:
        s = spec.sft
        _card_rows(spec, "sft", "a Supervised (SFT) job; give a dataset with prompt and completion columns, or a "
                   "messages column", v)
        _full_steps(s, "sft.max_steps", v)
        _lora_targets(s, "sft.target_modules", v)
        if not s.HasField("completion_only_loss"):
            s.completion_only_loss = True
    key = METHOD_KEYS[spec.method].upper()
    only_rlvr = {
        "environment.key": (spec.environment.key.strip(), "an environment's episodes are generated and scored, "
                            "which is RLVR's"),
        "init_adapter": (spec.init_adapter.name or spec.init_adapter.path,
                         f"a {method} job trains a fresh adapter; stacking on another job's is RLVR's"),
        "advanced.num_nodes": (spec.advanced.num_nodes > 1, f"a {method} job runs on one trainer worker"),
    }
    for path, (value, why) in only_rlvr.items():
        if value and not v.bad(path):
            v.add(InvalidArgument(f"{path}: not allowed with method {key}: {why}"))
    card = spec.head if is_head(spec) else spec.sft
    procs = spec.advanced.num_processes
    if procs > 1 and not v.bad(f"{key.lower()}.batch_size", "advanced.num_processes") and card.batch_size % procs:
        v.add(InvalidArgument(f"{key.lower()}.batch_size: {card.batch_size} is not a multiple of "
                              f"advanced.num_processes {procs}: each process trains an equal share of every "
                              "step's examples"))


def _card_rows(spec: common_pb2.JobSpec, card: str, required_for: str, v: Violations) -> None:
    """What SFT's and Head's cards check alike: every ranged row, the dataset given (its error says
    `required_for`), stripped, and its split (default "train")."""
    _checked(spec, card, v)
    msg: Card = getattr(spec, card)
    if not msg.dataset.strip():
        v.add(InvalidArgument(f"{card}.dataset: required for {required_for}"))
    msg.dataset = msg.dataset.strip()
    msg.dataset_split = msg.dataset_split.strip() or SFT_DEFAULT_SPLIT


def _validate_head(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    """Head's card: every field in range, a dataset given, the columns named, the task known."""
    h = spec.head
    _card_rows(spec, "head", "a Head job; give a dataset with a text column and a label column", v)
    h.text_column = h.text_column.strip() or HEAD_TEXT_COLUMN
    h.label_column = h.label_column.strip() or HEAD_LABEL_COLUMN
    if h.text_column == h.label_column:
        v.add(InvalidArgument(f"head.label_column: {h.label_column!r} is head.text_column too; the head reads one "
                              "column and learns another"))
    with v.check():
        _enum(h, "task", "head.task", HEAD_TASK_NAMES, C.HEAD_TASK_CLASSIFICATION)
    _full_steps(h, "head.max_steps", v)
    _lora_targets(h, "head.target_modules", v)
    h.reward_label = h.reward_label.strip()
    if h.reward_label and h.task == C.HEAD_TASK_REGRESSION:
        warnings.append("head.reward_label: ignored: a regression head's score is its number, clipped to 0-1")


def sft_steps(max_steps: int, epochs: int, batch_size: int, n_examples: int | None) -> int:
    """An SFT job's step count: max_steps, or for Full (-1) epochs x ceil(examples / batch size), as
    transformers counts an epoch's steps; -1 while the example count is unknown (the trainer knows it
    once the dataset is loaded)."""
    if max_steps != -1:
        return max_steps
    if n_examples is None:
        return -1
    return max(1, epochs * -(-n_examples // batch_size))


def sft_total_steps(spec: common_pb2.JobSpec, n_examples: int | None) -> int:
    """A supervised job's (SFT or Head) step count from its card."""
    s: Card = spec.head if is_head(spec) else spec.sft
    return sft_steps(s.max_steps, s.epochs, s.batch_size, n_examples)


def sft_columns_problem(columns: list[str]) -> str:
    """What `columns` lack for SFT (SFT_COLUMN_SETS), in the words the scheduler's check and the
    trainer's both say; empty when they hold a set SFT trains on."""
    if any(all(c in columns for c in need) for need in SFT_COLUMN_SETS):
        return ""
    need = " or ".join(" and ".join(repr(c) for c in s) for s in SFT_COLUMN_SETS)
    return f"has no {need} column, which method SFT trains on; columns present: {columns}"
