"""A Supervised (SFT) job: a fresh LoRA adapter trained on a labeled dataset with TRL's SFTTrainer.

`run_sft` is what run_job (runner.py) calls for a job whose method is SFT, once the device and the
base model are known. It shares the RLVR job's lifecycle: the same adapter folder rewritten after
every step (what Download Adapter and Merge Model read, and what a killed job leaves), the same
periodic checkpoints (`advanced.checkpoint_every`: the adapter under checkpoints/step-N and TRL's
whole state under trl/checkpoint-N, which a re-dispatched job resumes from exactly), the same
cancel flag, progress and MetricEvents (loss, learning rate, token accuracy, tokens per second and,
at the `advanced.eval_every` steps and the last, the held-out loss).

The data (JobSpec.sft.dataset): `prompt` and `completion` columns (text, or chat messages each), or
one `messages` column (a chat), which is trained as its prompt (every message but the last) and its
completion (the last, an assistant message): so the loss falls on the completion's tokens only
(`completion_only_loss`, the default), as TRL does for prompt/completion data. The held-out split is
the dataset's `test` split when it has one, else 5% of the training split (at least one example)
held back, seeded; it is read only when `advanced.eval_every` is on.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rlvr.common.errors import FailedPrecondition
from rlvr.jobspec import sft_columns_problem, sft_steps
from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.job.config import JobConfig, SftSettings
from rlvr.services.trainer.job.distributed import Group
from rlvr.services.trainer.job.engine import (
    MICRO_BATCH_BUDGET,
    TRL_DIR,
    checkpointing_on,
    fitting_divisor,
    token_bytes,
)
from rlvr.services.trainer.job.policy import load_policy
from rlvr.tasks.base import TaskError
from rlvr.tasks.sources import Rows, dataset_splits, load_rows
from rlvr.v1 import common_pb2


class SftDeps(Protocol):
    """What run_sft reads of run_job's JobDeps (runner.py)."""

    @property
    def group(self) -> Group: ...
    @property
    def publish(self) -> Callable[[common_pb2.MetricEvent], None]: ...
    @property
    def cancel(self) -> threading.Event: ...
    @property
    def on_step(self) -> Callable[[int, int], None] | None: ...
    @property
    def space(self) -> artifacts.DiskSpace | None: ...


class SftProgress(Protocol):
    """What run_sft writes of run_job's JobResult: the steps done (whose adapter is saved) and the total."""

    steps_done: int
    total_steps: int

log = logging.getLogger("rlvr.trainer.sft")

HELDOUT_SPLIT = "test"
HELDOUT_SHARE = 0.05


def sft_rows(rows: Rows, source: str, split: str) -> Rows:
    """The rows as SFTTrainer's prompt/completion examples; FailedPrecondition naming the columns
    an SFT dataset needs when it has neither set (CreateJob refuses a local file so already)."""
    if not rows:
        raise FailedPrecondition(f"sft.dataset: {source!r} ({split}) is empty")
    columns = list(rows[0])
    if all(c in columns for c in ("prompt", "completion")):
        return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]
    if "messages" in columns:
        out = []
        for i, r in enumerate(rows):
            chat = r["messages"]
            if not isinstance(chat, list) or len(chat) < 2 or not isinstance(chat[-1], dict) \
                    or chat[-1].get("role") != "assistant":
                raise FailedPrecondition(f"sft.dataset: {source!r} ({split}) row {i}: messages must be a chat of at "
                                         "least two messages ending with an assistant message")
            out.append({"prompt": chat[:-1], "completion": chat[-1:]})
        return out
    raise FailedPrecondition(f"sft.dataset: {source!r} ({split}) {sft_columns_problem(columns)}")


def sft_data(job: JobConfig) -> tuple[Rows, Rows]:
    """(train, held-out) examples; held-out is empty unless advanced.eval_every is on."""
    sft = _card(job)
    try:
        train = sft_rows(load_rows(sft.dataset, sft.dataset_split, job.data_roots), sft.dataset, sft.dataset_split)
        if not job.eval_every:
            return train, []
        if sft.dataset_split != HELDOUT_SPLIT and HELDOUT_SPLIT in dataset_splits(sft.dataset, job.data_roots):
            return train, sft_rows(load_rows(sft.dataset, HELDOUT_SPLIT, job.data_roots), sft.dataset, HELDOUT_SPLIT)
    except TaskError as e:
        raise FailedPrecondition(f"sft.dataset: {e}") from e
    if len(train) < 2:
        raise FailedPrecondition(f"advanced.eval_every: {sft.dataset!r} has {len(train)} example and no "
                                 f"{HELDOUT_SPLIT!r} split: nothing to hold out")
    return held_back(train, job.seed, HELDOUT_SHARE)


def held_back(rows: Rows, seed: int, share: float) -> tuple[Rows, Rows]:
    """(kept, held out): `share` of the rows (at least one) held out, chosen by the seed."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:max(1, round(len(rows) * share))])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def _card(job: JobConfig) -> SftSettings:
    if job.sft is None:
        raise FailedPrecondition("method SFT: the job has no sft card")
    return job.sft


def micro_batch(job: JobConfig, batch: int, seq_length: int, config: Any, budget: int = MICRO_BATCH_BUDGET) -> int:
    """Examples per forward/backward of one process (their gradients accumulate into the step), for
    `batch` examples per process: job.micro_batch_size when it divides it, else the largest divisor
    whose rows of `seq_length` tokens fit `budget` (engine.py's estimate of a token's training memory,
    as an RLVR job splits its batch)."""
    if job.micro_batch_size and batch % job.micro_batch_size == 0:
        return job.micro_batch_size
    return fitting_divisor(batch, token_bytes(config) * seq_length, budget)


def sft_micro_batch(job: JobConfig, config: Any, budget: int = MICRO_BATCH_BUDGET) -> int:
    """An SFT job's micro-batch (`micro_batch`) for its share of sft.batch_size."""
    sft = _card(job)
    return micro_batch(job, sft.batch_size // job.num_processes, sft.max_seq_length, config, budget)


def sft_args(job: JobConfig, device: str, output_dir: Path, model: Any) -> Any:
    """TRL's SFTConfig for the job and its model (the micro-batch and "auto" gradient checkpointing
    depend on its size)."""
    from trl import SFTConfig

    sft = _card(job)
    micro = sft_micro_batch(job, model.config)
    parameters = sum(p.numel() for p in model.parameters())
    # at most two checkpoints kept (as an RLVR job keeps): the newest whole one is what a resume needs
    checkpoints = {"save_strategy": "steps", "save_steps": job.checkpoint_every, "save_total_limit": 2} \
        if job.checkpoint_every else {"save_strategy": "no"}
    evaluation = {"eval_strategy": "steps", "eval_steps": job.eval_every, "per_device_eval_batch_size": micro} \
        if job.eval_every else {"eval_strategy": "no"}
    return SFTConfig(
        output_dir=str(output_dir), learning_rate=sft.learning_rate, num_train_epochs=sft.epochs,
        max_steps=sft.max_steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=sft.batch_size // job.num_processes // micro, max_length=sft.max_seq_length, packing=sft.packing,
        completion_only_loss=sft.completion_only_loss, logging_steps=1, report_to=[], disable_tqdm=True,
        seed=job.seed, data_seed=job.seed, use_cpu=device == "cpu", bf16=job.precision == "bf16",
        fp16=job.precision == "fp16", gradient_checkpointing=checkpointing_on(job, parameters, device == "cpu"),
        dataloader_num_workers=0, save_only_model=False, **checkpoints, **evaluation,
    )


CHECKPOINT_FILES = ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt")


def _whole(checkpoint: Path) -> tuple[int, int] | None:
    """The step and the run's step count of a whole TRL checkpoint (its trainer_state.json, written
    last, reads back and names the step; the adapter, optimizer and scheduler are there), None for
    one cut short."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        step, total = int(state["global_step"]), int(state["max_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    whole = all((checkpoint / name).is_file() for name in CHECKPOINT_FILES)
    return (step, total) if whole and checkpoint.name == f"checkpoint-{step}" else None


def sft_resume_point(job: JobConfig) -> tuple[Path, int, int] | None:
    """Where a re-dispatched SFT job (`job.resume`) goes on from: its newest whole TRL checkpoint, its
    step and the run's step count; checkpoints after it that were cut short are removed. None (a
    clean TRL folder) for a first run, or a job with no whole checkpoint: it starts again from step
    0, with the same seed the same run."""
    trl = job.job_dir / TRL_DIR
    found = sorted((p for p in trl.glob("checkpoint-*") if p.name.rpartition("-")[2].isdigit()),
                   key=lambda p: int(p.name.rpartition("-")[2]), reverse=True) if job.resume else []
    for checkpoint in found:
        whole = _whole(checkpoint)
        if whole is not None:
            return checkpoint, *whole
        shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(trl, ignore_errors=True)
    return None


class StepProgress:
    """What a supervised job (SFT, Head) does at each of its trainer's steps, as a transformers
    TrainerCallback (`callback()`): the adapter saved (`save`, through the disk-space guard; a copy
    under checkpoints/step-N at the checkpoint_every steps), then its progress and its MetricEvent
    (loss, learning rate, and what `train_metrics` reads of the step's logs; at a step that
    `evaluates`, held until the evaluation's logs are added by `eval_metrics`), the cancel honoured."""

    def __init__(self, job: JobConfig, deps: SftDeps, result: SftProgress, save: Callable[[Any, Path], Path],
                 space: artifacts.DiskSpace, evaluates: Callable[[int, int], bool],
                 train_metrics: Callable[[common_pb2.MetricEvent, dict[str, float]], None],
                 eval_metrics: Callable[[common_pb2.MetricEvent, dict[str, float]], None], *,
                 tokens_log: str) -> None:
        self.job, self.deps, self.result, self.save, self.space = job, deps, result, save, space
        self.group = deps.group
        self.evaluates, self.train_metrics, self.eval_metrics = evaluates, train_metrics, eval_metrics
        self.tokens_log = tokens_log  # the log's running token count (TRL's num_tokens, transformers' own)
        self.adapter = artifacts.adapter_dir(job.artifact_root, job.job_id)
        self.tokens = 0.0
        self.step_started = time.perf_counter()
        self.pending: common_pb2.MetricEvent | None = None

    def callback(self) -> Any:
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                outer.result.total_steps = int(state.max_steps)
                outer.tokens = float(getattr(state, "num_input_tokens_seen", 0) or 0)

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                outer.step_started = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                outer.step_end(int(state.global_step), int(state.max_steps), kw["model"], control)

            def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
                       **kw: Any) -> None:
                outer.log(int(state.global_step), int(state.max_steps), logs or {})

            def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                outer.publish()

        return Callback()

    def step_end(self, step: int, total: int, trained: Any, control: Any) -> None:
        job = self.job

        def write() -> Path:
            path = self.save(trained, self.adapter)
            if job.checkpoint_every and step % job.checkpoint_every == 0:
                artifacts.copy_adapter(path, artifacts.checkpoint_dir(job.artifact_root, job.job_id, step))
            return path

        if self.group.is_main:  # one writer of the job's folder (each process holds the whole adapter)
            self.space.write(f"step {step}'s adapter", write)
        self.result.steps_done = step
        if self.deps.on_step is not None:  # the speaker's only
            self.deps.on_step(step, total)
        if self.group.any(self.deps.cancel.is_set()):  # every process stops at the same step, or none
            control.should_training_stop = True

    def log(self, step: int, total: int, logs: dict[str, float]) -> None:
        if "eval_loss" in logs and self.pending is not None:
            self.eval_metrics(self.pending, logs)
            self.publish()
            return
        if "loss" not in logs:
            return
        self.publish()
        seconds = time.perf_counter() - self.step_started
        event = common_pb2.MetricEvent(job_id=self.job.job_id, step=step, total_steps=total,
                                       loss=float(logs["loss"]), learning_rate=float(logs.get("learning_rate", 0)),
                                       train_seconds=seconds, step_seconds=seconds, adapter_version=step - 1)
        event.time.GetCurrentTime()
        if self.tokens_log in logs:
            tokens = float(logs[self.tokens_log])
            event.tokens_per_second = (tokens - self.tokens) / max(seconds, 1e-9)
            self.tokens = tokens
        self.train_metrics(event, logs)
        self.pending = event
        if not self.evaluates(step, total):
            self.publish()

    def publish(self) -> None:
        if self.pending is not None and self.pending.step > self.job.stored_steps:
            self.deps.publish(self.pending)
        self.pending = None


def run_sft(job: JobConfig, deps: SftDeps, result: SftProgress, device: str, base_path: str) -> None:
    """Trains the job's adapter to its last step, a cancel, or a failure (raised); `result` says the
    steps done and total as they happen."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTTrainer

    train_rows, heldout_rows = sft_data(job)
    model, tokenizer = load_policy(job, base_path, device)
    if isinstance(train_rows[0]["prompt"], list) and not getattr(tokenizer, "chat_template", None):
        raise FailedPrecondition(f"sft.dataset: its rows are chats, and {job.base_model!r} has no chat template "
                                 "to render them with; give prompt and completion text columns instead")
    sft = _card(job)
    # the step count before TRL knows it (a cancel while loading is a cancelled job); TRL's own at its start
    result.total_steps = sft_steps(sft.max_steps, sft.epochs, sft.batch_size, len(train_rows))
    adapter = artifacts.adapter_dir(job.artifact_root, job.job_id)
    trl_dir = job.job_dir / TRL_DIR
    space = deps.space or artifacts.DiskSpace(job.artifact_root, cancel=deps.cancel)
    resume = deps.group.on_main(lambda: sft_resume_point(job))  # the speaker tidies; every process resumes

    def sft_metrics(event: common_pb2.MetricEvent, logs: dict[str, float]) -> None:
        if "mean_token_accuracy" in logs:
            event.token_accuracy = float(logs["mean_token_accuracy"])
        if "entropy" in logs:
            event.entropy = float(logs["entropy"])

    def heldout_loss(event: common_pb2.MetricEvent, logs: dict[str, float]) -> None:
        event.heldout_loss = float(logs["eval_loss"])

    steps = StepProgress(job, deps, result, artifacts.save_adapter, space,
                         lambda step, total: bool(job.eval_every) and (step % job.eval_every == 0 or step == total),
                         sft_metrics, heldout_loss, tokens_log="num_tokens")
    train = Dataset.from_list(train_rows)
    heldout = Dataset.from_list(heldout_rows) if heldout_rows else None
    trainer = SFTTrainer(model=model, args=sft_args(job, device, trl_dir, model), train_dataset=train,
                         eval_dataset=heldout, processing_class=tokenizer, callbacks=[steps.callback()])
    trainer.remove_callback(PrinterCallback)  # the MetricEvents carry the logs
    log.info("job %s: SFT on %d examples (%d held out) of %s, %s", job.job_id, len(train_rows), len(heldout_rows),
             sft.dataset, f"resuming from step {resume[1]}" if resume else "from step 0")
    if not resumed_done(resume, deps, result, space, lambda checkpoint: artifacts.copy_adapter(checkpoint, adapter)):
        trainer.train(resume_from_checkpoint=str(resume[0]) if resume else None)


def resumed_done(resume: tuple[Path, int, int] | None, deps: SftDeps, result: SftProgress,
                 space: artifacts.DiskSpace, restore: Callable[[Path], Path]) -> bool:
    """Whether a supervised job has nothing left to train: resumed after its last step, or cancelled
    while loading. A resumed job's adapter is its checkpoint's again first (`restore`: the lost run may
    have left a later step's; the trainer's checkpoint holds it, as peft saved it)."""
    if resume is not None:
        checkpoint, step, total = resume
        if deps.group.is_main:
            space.write(f"step {step}'s adapter", lambda: restore(checkpoint))
        result.steps_done, result.total_steps = step, total
        if deps.on_step is not None:
            deps.on_step(step, total)
        if step >= total:  # lost after its last step: done (transformers would train one step more)
            return True
    return deps.group.any(deps.cancel.is_set())
