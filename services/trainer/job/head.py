"""A Head job: a classification or regression head on the base model (frozen, or under a fresh LoRA),
trained on a dataset's text and label columns with transformers' Trainer.

`run_head` is what run_job (runner.py) calls for a job whose method is HEAD. It shares the SFT
job's lifecycle (sft.py's StepProgress: the adapter rewritten after every step, checkpoints under
trl/ that a re-dispatched job resumes from exactly, the cancel flag, progress and MetricEvents).
The model is transformers' AutoModelForSequenceClassification of the base (the last token's hidden
state through a `score` layer: peft's SEQ_CLS task saves that layer with the LoRA); its adapter
folder carries the head's description (rlvr/heads.py), which is what lets the reward service score
with it and Merge Model write it whole.

Held out: the dataset's `test` split when it has one, else 10% of the training split (at least one
row), seeded. It is evaluated at the `advanced.eval_every` steps and always at the last:
classification gives the held-out loss, accuracy, macro F1 and each class's F1; regression the mean
squared error (its held-out loss).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlvr.common.errors import FailedPrecondition
from rlvr.heads import (
    FROZEN_BASE_TARGET,
    HeadInfo,
    default_reward_label,
    head_model,
    label_text,
    labels_problem,
    stamp_head,
)
from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.job.config import HeadSettings, JobConfig, one_line
from rlvr.services.trainer.job.engine import (
    TRL_DIR,
    checkpointing_on,
)
from rlvr.services.trainer.job.quantization import bnb_config, torch_dtype
from rlvr.services.trainer.job.sft import (
    HELDOUT_SPLIT,
    SftDeps,
    SftProgress,
    StepProgress,
    held_back,
    micro_batch,
    resumed_done,
    sft_resume_point,
)
from rlvr.tasks.base import TaskError
from rlvr.tasks.sources import Rows, dataset_splits, load_rows
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.trainer.head")

HELDOUT_SHARE = 0.10
NEVER = 10**9  # eval_steps when only the last step evaluates


def _card(job: JobConfig) -> HeadSettings:
    if job.head is None:
        raise FailedPrecondition("method HEAD: the job has no head card")
    return job.head


def head_data(job: JobConfig) -> tuple[Rows, Rows, HeadInfo]:
    """(train, held-out) rows as {"text", "label"} and the head's description (its classes, the class a
    reward scores); FailedPrecondition naming head.dataset and what the rows lack."""
    head = _card(job)

    def load(split: str) -> Rows:
        try:
            return load_rows(head.dataset, split, job.data_roots)
        except TaskError as e:
            raise FailedPrecondition(f"head.dataset: {e}") from e

    train = load(head.dataset_split)
    classes, problem = labels_problem(train, head.text_column, head.label_column, head.task, head.reward_label)
    if problem is not None:
        raise FailedPrecondition(f"{problem.field}: {head.dataset!r} ({head.dataset_split}) {problem.why}")
    try:
        separate = head.dataset_split != HELDOUT_SPLIT and HELDOUT_SPLIT in dataset_splits(head.dataset, job.data_roots)
    except TaskError as e:
        raise FailedPrecondition(f"head.dataset: {e}") from e
    if separate:
        heldout = load(HELDOUT_SPLIT)
        held_classes, problem = labels_problem(heldout, head.text_column, head.label_column, head.task)
        unknown = sorted(set(held_classes) - set(classes))
        if problem is not None and "one class only" not in problem.why:  # a test split may hold one class
            raise FailedPrecondition(f"{problem.field}: {head.dataset!r} ({HELDOUT_SPLIT}) {problem.why}")
        if unknown:
            raise FailedPrecondition(f"head.dataset: {head.dataset!r} ({HELDOUT_SPLIT}) has the classes {unknown}, "
                                     f"which its {head.dataset_split!r} split lacks: the head cannot predict them")
    elif len(train) < 2:
        raise FailedPrecondition(f"head.dataset: {head.dataset!r} has {len(train)} row and no {HELDOUT_SPLIT!r} "
                                 "split: nothing to hold out")
    else:
        train, heldout = held_back(train, job.seed, HELDOUT_SHARE)

    def rows(raw: Rows) -> Rows:
        return [{"text": str(r[head.text_column]), "label": r[head.label_column]} for r in raw]

    info = HeadInfo(task=head.task, classes=classes,
                    reward_label=(head.reward_label or default_reward_label(classes)) if classes else "",
                    base_model=job.base_model, text_column=head.text_column, label_column=head.label_column,
                    max_seq_length=head.max_seq_length, lora_rank=head.lora_rank)
    return rows(train), rows(heldout), info


def head_policy(job: JobConfig, base_path: str, device: str, info: HeadInfo) -> tuple[Any, Any]:
    """(peft model, tokenizer): the base with a fresh head, under a fresh LoRA of the card's rank, or
    (rank 0) a frozen rank-1 LoRA of zeros on one projection: the base frozen, the head alone trained,
    and still one PEFT adapter to save, download and load."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import set_seed

    head = _card(job)
    set_seed(job.seed)  # the head and the LoRA A matrices are random: the seed makes the run reproducible
    quant = bnb_config(job.quantization, sharded=False)
    try:
        model, tokenizer = head_model(base_path, info, torch_dtype(job.precision), device, quant)
    except OSError as e:
        raise FailedPrecondition(f"base_model: cannot load {job.base_model!r}: {one_line(e)}") from e
    if quant is not None:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    init_weights = True if job.lora_init == "default" else job.lora_init
    if head.lora_rank:
        targets: Any = head.target_modules if head.target_modules == "all-linear" else head.target_modules.split(",")
        lora = LoraConfig(task_type="SEQ_CLS", r=head.lora_rank, lora_alpha=head.lora_alpha,
                          lora_dropout=head.lora_dropout, target_modules=targets, init_lora_weights=init_weights)
    else:
        linear = [n.rpartition(".")[2] for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and n != "score"]
        if not linear:
            raise FailedPrecondition(f"head.lora_rank: 0 needs a linear layer of {job.base_model!r} to hold the "
                                     "frozen base's zero LoRA, and it has none; give a rank above 0")
        target = FROZEN_BASE_TARGET if FROZEN_BASE_TARGET in linear else linear[0]
        lora = LoraConfig(task_type="SEQ_CLS", r=1, lora_alpha=1, target_modules=[target], init_lora_weights=True)
    try:
        model = get_peft_model(model, lora)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise FailedPrecondition(f"head.target_modules: {head.target_modules!r} on {job.base_model!r}: "
                                 f"{one_line(e)}") from e
    if not head.lora_rank:
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.requires_grad_(False)  # B stays 0: the base exactly
    return model, tokenizer


def head_args(job: JobConfig, device: str, output_dir: Path, model: Any) -> Any:
    """transformers' TrainingArguments for the job and its model."""
    from transformers import TrainingArguments

    head = _card(job)
    share = head.batch_size // job.num_processes  # each process's examples of a step
    micro = micro_batch(job, share, head.max_seq_length, model.config)
    parameters = sum(p.numel() for p in model.parameters())
    checkpoints = {"save_strategy": "steps", "save_steps": job.checkpoint_every, "save_total_limit": 2} \
        if job.checkpoint_every else {"save_strategy": "no"}
    return TrainingArguments(
        output_dir=str(output_dir), learning_rate=head.learning_rate, num_train_epochs=head.epochs,
        max_steps=head.max_steps, per_device_train_batch_size=micro, per_device_eval_batch_size=micro,
        gradient_accumulation_steps=share // micro, logging_steps=1, report_to=[], disable_tqdm=True,
        seed=job.seed, data_seed=job.seed, use_cpu=device == "cpu", bf16=job.precision == "bf16",
        fp16=job.precision == "fp16", gradient_checkpointing=checkpointing_on(job, parameters, device == "cpu"),
        dataloader_num_workers=0, save_only_model=False, eval_strategy="steps",
        eval_steps=job.eval_every or NEVER, remove_unused_columns=False, include_num_input_tokens_seen="non_padding",
        # The head's loss is a mean over its examples, and DDP averages the processes' gradients: a mean
        # over the step's examples already. Scaling the loss by the process count as for a token sum
        # (transformers' default) doubled a two-process job's loss and moved its adapter 10% off.
        average_tokens_across_devices=False,
        **checkpoints,
    )


def head_metrics(info: HeadInfo) -> Any:
    """Trainer's compute_metrics: accuracy, macro F1 and f1/<class> per class (classification), mse."""
    import numpy as np

    def compute(prediction: Any) -> dict[str, float]:
        logits, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
        if info.task == "regression":
            return {"mse": float(np.mean((logits.reshape(-1) - labels.reshape(-1)) ** 2))}
        predicted = logits.argmax(axis=-1)
        out = {"accuracy": float(np.mean(predicted == labels))}
        scores = []
        for index, name in enumerate(info.classes):
            tp = float(np.sum((predicted == index) & (labels == index)))
            denominator = float(np.sum(predicted == index) + np.sum(labels == index))
            f1 = 2 * tp / denominator if denominator else 0.0
            out[f"f1/{name}"] = f1
            scores.append(f1)
        out["f1"] = float(np.mean(scores))
        return out

    return compute


def run_head(job: JobConfig, deps: SftDeps, result: SftProgress, device: str, base_path: str) -> None:
    """Trains the job's head to its last step, a cancel, or a failure (raised); `result` says the steps
    done and total as they happen."""
    from datasets import Dataset
    from transformers import DataCollatorWithPadding, PrinterCallback, Trainer, TrainerCallback

    from rlvr.jobspec import sft_steps

    head = _card(job)
    train_rows, heldout_rows, info = head_data(job)
    result.total_steps = sft_steps(head.max_steps, head.epochs, head.batch_size, len(train_rows))
    model, tokenizer = head_policy(job, base_path, device, info)
    adapter = artifacts.adapter_dir(job.artifact_root, job.job_id)
    space = deps.space or artifacts.DiskSpace(job.artifact_root, cancel=deps.cancel)
    resume = deps.group.on_main(lambda: sft_resume_point(job))  # the speaker tidies; every process resumes

    def stamp(staging: Path) -> None:  # before the folder replaces the adapter: never a head without it
        stamp_head(staging, info)

    def save(trained: Any, dest: Path) -> Path:
        return artifacts.save_adapter(trained, dest, finish=stamp)

    def restore(checkpoint: Path) -> Path:
        return artifacts.copy_adapter(checkpoint, adapter, finish=stamp)

    def eval_metrics(event: common_pb2.MetricEvent, logs: dict[str, float]) -> None:
        event.heldout_loss = float(logs.get("eval_mse", logs["eval_loss"]))
        if info.task == "classification":
            event.heldout_accuracy = float(logs["eval_accuracy"])
            event.heldout_f1 = float(logs["eval_f1"])
            for name in info.classes:
                event.class_f1[name] = float(logs[f"eval_f1/{name}"])

    def evaluates(step: int, total: int) -> bool:
        return step == total or bool(job.eval_every) and step % job.eval_every == 0

    class LastStepEvaluates(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step >= state.max_steps:
                control.should_evaluate = True

    label_of = (lambda v: info.classes.index(label_text(v))) if info.task == "classification" else float

    def encode(rows: Rows) -> Any:
        data = Dataset.from_list([{"text": r["text"], "labels": label_of(r["label"])} for r in rows])
        return data.map(lambda b: tokenizer(b["text"], truncation=True, max_length=head.max_seq_length),
                        batched=True, remove_columns=["text"])

    # a head's step logs nothing beyond StepProgress's own (loss, learning rate, tokens/s)
    steps = StepProgress(job, deps, result, save, space, evaluates, lambda event, logs: None, eval_metrics,
                         tokens_log="num_input_tokens_seen")
    trainer = Trainer(model=model, args=head_args(job, device, job.job_dir / TRL_DIR, model),
                      train_dataset=encode(train_rows), eval_dataset=encode(heldout_rows),
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=head_metrics(info),
                      callbacks=[LastStepEvaluates(), steps.callback()])
    trainer.remove_callback(PrinterCallback)  # the MetricEvents carry the logs
    log.info("job %s: a %s head (%s) on %d rows (%d held out) of %s, %s", job.job_id, info.task,
             f"LoRA rank {head.lora_rank}" if head.lora_rank else "frozen base", len(train_rows),
             len(heldout_rows), head.dataset, f"resuming from step {resume[1]}" if resume else "from step 0")
    if not resumed_done(resume, deps, result, space, restore):
        trainer.train(resume_from_checkpoint=str(resume[0]) if resume else None)
