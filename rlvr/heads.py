"""What every service knows about a Head job's adapter: a classification or regression head on the
base model's last token (transformers' AutoModelForSequenceClassification), the base frozen or under
a LoRA, saved as one PEFT adapter (the LoRA and the head's `score` layer, peft's modules_to_save).

The folder is an ordinary adapter folder (adapter_config.json, adapter_model.safetensors: Download,
the object store and checkpoints carry it unchanged); what makes it a head is the `rlvr_head` entry
of the safetensors file's metadata, a JSON :class:`HeadInfo` (the task, the classes in the head's
output order, the class a reward scores, the base model, the text length). A head trained on the
frozen base (rank 0) carries a rank-1 LoRA of zeros on one projection, so that it is a PEFT adapter
like any other and loads the same way.

The trainer writes it (services/trainer/job/head.py); the reward service scores completions with it
(`HeadScorer`, services/reward/heads.py), and Merge Model writes base + head as one model folder.
torch, transformers and peft are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlvr.adapters import ADAPTER_FILES

METADATA_KEY = "rlvr_head"
PREFIX = "head_"  # a head's reward key: head_<job id>
WEIGHTS = ADAPTER_FILES[1]  # adapter_model.safetensors
POSITIVE_LABELS = ("1", "true", "yes", "correct", "positive")  # a reward's default class, lower-cased
FROZEN_BASE_TARGET = "q_proj"  # where a rank-0 head's zero LoRA sits (any one module would do)


@dataclass(frozen=True)
class HeadInfo:
    """A trained head's own description (the `rlvr_head` metadata of its weights)."""

    task: str  # "classification" or "regression"
    classes: tuple[str, ...]  # classification: the head's outputs in order; () for regression
    reward_label: str  # classification: the class whose probability a reward scores; "" for regression
    base_model: str  # as the job named it (rlvr.models.resolve_model resolves it where it is loaded)
    text_column: str = "text"
    label_column: str = "label"
    max_seq_length: int = 512
    lora_rank: int = 0  # 0 = the base frozen

    @property
    def num_labels(self) -> int:
        return len(self.classes) if self.task == "classification" else 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HeadInfo:
        data = json.loads(text)
        data["classes"] = tuple(str(c) for c in data.get("classes", ()))
        return cls(**data)


def sample_text(prompt: str, completion: str) -> str:
    """The text a head used as a reward reads of one completion: the prompt (as the dataset states it),
    a newline, the completion; the completion alone when there is no prompt. Train a head for a reward
    on texts made so."""
    return f"{prompt}\n{completion}" if prompt else completion


def default_reward_label(classes: Sequence[str]) -> str:
    """The class a head used as a reward scores when the job named none: the first of 1, true, yes,
    correct, positive (any case) among the classes, else the last class in sorted order."""
    lower = {c.lower(): c for c in classes}
    for name in POSITIVE_LABELS:
        if name in lower:
            return lower[name]
    return class_order(classes)[-1]


@dataclass(frozen=True)
class LabelsProblem:
    """What makes a Head job's rows unfit for its task: the field to fix and why, in words that follow
    the dataset's name ("has no 'score' column, which method HEAD reads")."""

    field: str  # "head.dataset", "head.text_column", "head.label_column" or "head.reward_label"
    why: str


def label_text(value: Any) -> str:
    """A label as a class name: text as is, a whole number as its digits (1 and 1.0 are one class,
    whichever file format held it)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def class_order(classes: Sequence[str]) -> tuple[str, ...]:
    """The classes in the head's output order: by value when every one is a number (2 before 10),
    else as text."""
    if all(_number(c) for c in classes):
        return tuple(sorted(classes, key=lambda c: (float(c), c)))
    return tuple(sorted(classes))


def labels_problem(rows: Sequence[Mapping[str, Any]], text_column: str, label_column: str, task: str,
                   reward_label: str = "") -> tuple[tuple[str, ...], LabelsProblem | None]:
    """(classes, problem) of a Head job's rows: the classes in the head's order (`class_order`; () for
    regression), and what makes the rows unfit for the task (None when they fit): no rows, a missing
    column, an empty label, one class only, a label that is not a number for regression, a
    reward_label that is not a class. The scheduler's check at CreateJob and the trainer's both say it."""
    if not rows:
        return (), LabelsProblem("head.dataset", "is empty")
    columns = list(rows[0])
    for column, field in ((text_column, "head.text_column"), (label_column, "head.label_column")):
        if column not in columns:
            return (), LabelsProblem(field, f"has no {column!r} column, which method HEAD reads; columns present: "
                                            f"{columns}")
    for i, row in enumerate(rows):
        if row.get(label_column) is None or str(row[label_column]).strip() == "":
            return (), LabelsProblem("head.dataset", f"row {i}: its {label_column!r} label is empty")
    if task == "regression":
        for i, row in enumerate(rows):
            if not _number(row[label_column]):
                return (), LabelsProblem("head.dataset", f"row {i}: label {row[label_column]!r} of column "
                                                         f"{label_column!r} is not a number, which a regression "
                                                         "head learns (head.task regression)")
        return (), None
    classes = class_order(list({label_text(row[label_column]) for row in rows}))
    if len(classes) < 2:
        return classes, LabelsProblem("head.dataset", f"column {label_column!r} has one class only "
                                                      f"({classes[0]!r}): a classification head needs two at least")
    if reward_label and reward_label not in classes:
        return classes, LabelsProblem("head.reward_label", f"has no class {reward_label!r}; its classes: "
                                                           f"{list(classes)}")
    return classes, None


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def head_key(job_id: str) -> str:
    """The reward key of a Head job's adapter: head_<job id>, "-" read as "_"."""
    return PREFIX + re.sub(r"[^a-z0-9_]", "_", job_id.lower())


def read_head(folder: Path) -> HeadInfo | None:
    """The head's description when `folder` holds a Head job's adapter; None for any other adapter
    (or none). A head whose description does not read is a ValueError naming the folder."""
    from safetensors import safe_open

    path = Path(folder) / WEIGHTS
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            text = (f.metadata() or {}).get(METADATA_KEY)
    except Exception as e:  # safetensors' SafetensorError (a cut or foreign file) is no OSError
        raise ValueError(f"{path}: not a readable safetensors file: {e}") from e
    if text is None:
        return None
    try:
        return HeadInfo.from_json(text)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{folder}: its head description does not read: {e}") from e


def stamp_head(folder: Path, info: HeadInfo) -> None:
    """Writes `info` into the metadata of `folder`'s weights (peft's save leaves only its own), in place
    through a temporary file, so that a reader sees the old file or the new one."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(folder) / WEIGHTS
    with safe_open(str(path), "pt") as f:
        metadata = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  # safe_open is no mapping
    metadata[METADATA_KEY] = info.to_json()
    staging = path.with_name(f".{path.name}.staging")
    save_file(tensors, str(staging), metadata=metadata)
    os.replace(staging, path)


def head_model(base_path: str, info: HeadInfo, dtype: Any = "auto", device: str = "cpu",
               quantization_config: Any = None) -> tuple[Any, Any]:
    """(sequence-classification model, tokenizer) for the head's task on the base, the head freshly
    initialised; its pad token set (the model reads the last token before the padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tokenizer = AutoTokenizer.from_pretrained(base_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # A text longer than max_seq_length loses its start, never its end: a completion's answer is last.
    tokenizer.truncation_side = "left"
    labels = {"id2label": dict(enumerate(info.classes)), "label2id": {c: i for i, c in enumerate(info.classes)}} \
        if info.task == "classification" else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the fresh `score` layer as missing: it is meant to be
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            base_path, num_labels=info.num_labels, dtype=dtype, quantization_config=quantization_config,
            device_map=device if quantization_config is not None else None,
            problem_type="single_label_classification" if info.task == "classification" else "regression",
            **labels)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    if quantization_config is None:
        model.to(device)
    return model, tokenizer


def load_head(base_path: str, folder: Path, dtype: Any = "auto", device: str = "cpu") -> tuple[Any, Any, HeadInfo]:
    """(peft model in eval mode, tokenizer, description) of the trained head in `folder` on the base."""
    from peft import PeftModel

    info = read_head(folder)
    if info is None:
        raise ValueError(f"{folder} holds no Head job's adapter (its weights carry no {METADATA_KEY!r} description)")
    model, tokenizer = head_model(base_path, info, dtype, device)
    model = PeftModel.from_pretrained(model, str(folder)).to(device)
    model.eval()
    return model, tokenizer, info


def head_outputs(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int, batch_size: int = 16
                 ) -> list[list[float]]:
    """Each text's head output: the class probabilities (classification) or [the number] (regression)."""
    import torch

    out: list[list[float]] = []
    classify = getattr(model.config, "problem_type", "") != "regression"
    device = next(model.parameters()).device
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[start:start + batch_size]), truncation=True, max_length=max_length,
                              padding=True, return_tensors="pt").to(device)
            logits = model(**batch).logits.float()
            values = logits.softmax(dim=-1) if classify else logits
            out.extend(values.tolist())
    return out


class HeadScorer:
    """A trained head as a reward: each text's score, in [0, 1] (the reward class's probability; a
    regression's number clipped to 0-1)."""

    def __init__(self, base_path: str, folder: Path, device: str = "cpu") -> None:
        self.model, self.tokenizer, self.info = load_head(base_path, folder, "auto", device)
        self.index = self.info.classes.index(self.info.reward_label) if self.info.task == "classification" else 0

    def scores(self, texts: Sequence[str]) -> list[float]:
        outputs = head_outputs(self.model, self.tokenizer, texts, self.info.max_seq_length)
        return [min(1.0, max(0.0, float(o[self.index]))) for o in outputs]
