"""The GRPO step, run by TRL's `GRPOTrainer` with our rollouts, scores, sync and metrics plugged in.

DESIGN.md names TRL as the engine, and it gives the per-step control this worker needs through two
documented seams, so nothing of TRL is patched:

- `rollout_func` (trl 1.16): every step's completions come from our `PolicyGenerator`: the rollout
  service (vllm backend) or the job's own vLLM engine (vllm_colocate), with each completion's
  adapter version checked, or the policy itself in-process (transformers backend). It is also
  where generation is timed.
- a `TrainerCallback`: after each optimizer step it saves the adapter (PEFT files only; for a job
  with an init_adapter, init + trained written as one adapter), pushes it to the rollout service
  (or loads it into the colocated engine) as version = step number, writes periodic checkpoints,
  checks the cancel flag, and turns the step's record plus TRL's log line into one `MetricEvent`.

TRL keeps what it does well: the grpo/dapo/dr_grpo losses, group-relative advantages, the KL term,
entropy, clipping and the optimizer. The KL reference is the policy the job started from. The
adapter TRL trains is always fresh (B = 0): a job's init_adapter is merged into the base weights
before (`runner.load_policy`), so the reference (TRL's frozen copy of the fresh adapter, or the
adapters disabled) is the base model, or base + init_adapter for a stacked job. One step = `batch_size`
completions = `batch_size / group_size` prompts x `group_size` samples, on-policy (one optimizer
step per generation, so no importance ratio is needed).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.v1 import common_pb2
from services.trainer.config import JobConfig
from services.trainer.dynamic import MAX_DRAW_FACTOR, Group, PromptDraw, select_groups, split_groups
from services.trainer.metrics import StepRecord, metric_event
from services.trainer.rollouts import AdapterTag, PolicyGenerator, Sampling
from services.trainer.scorers import Scorer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16

log = logging.getLogger("rlvr.trainer.engine")

# TRL's output_dir holds nothing we keep (save_strategy="no"); artifacts go through `StepHooks`.
_TRL_DIR = "trl"


@dataclass
class StepHooks:
    """What the engine calls out to; the runner provides them (artifacts, events, progress)."""

    save_adapter: Callable[[Any, int], Path]  # (peft model, step) -> the directory holding the step's adapter
    publish: Callable[[common_pb2.MetricEvent], None]
    cancel: threading.Event


def grpo_args(job: JobConfig, total_steps: int, output_dir: Path, use_cpu: bool) -> Any:  # -> GRPOConfig
    """TRL's config for a job. CPU facts (DESIGN.md): fp32 and no gradient checkpointing, whose
    defaults (bf16, checkpointing on) make steps 8-13x slower here."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=job.batch_size,
        gradient_accumulation_steps=1,
        num_generations=job.group_size,
        max_completion_length=job.max_completion_tokens,
        learning_rate=job.learning_rate,
        # The spec's Learning Rate is the rate: held constant rather than decayed to zero.
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=total_steps,
        num_train_epochs=job.epochs,
        loss_type=job.loss_type,
        # Dr. GRPO drops the per-group std normalisation (its length/difficulty bias fix).
        scale_rewards="none" if job.loss_type == "dr_grpo" else "group",
        beta=job.kl_beta,
        temperature=job.temperature,
        num_iterations=1,
        seed=job.seed,
        data_seed=job.seed,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=use_cpu,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
    )


def _step_seed(job_seed: int, step: int) -> int:
    """The sampling seed of a step's own rollouts."""
    return (job_seed * 1_000_003 + step) % 2**63


def _round_seed(job_seed: int, step: int, extra_round: int) -> int:
    """The sampling seed of dynamic sampling's extra round of a step: mixed so that it meets no
    other step's or round's seed (see `_step_seed`)."""
    mixed = (job_seed * 1_000_003 + step) * 0x9E3779B97F4A7C15 + extra_round * 0xBF58476D1CE4E5B9
    return (mixed ^ (mixed >> 31)) % 2**63


class _StepCallback:
    """The per-step seam (a transformers TrainerCallback; built in `make_callback` so that this
    module imports transformers lazily)."""

    def __init__(self, engine: GrpoEngine) -> None:
        self.engine = engine

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.record = StepRecord(step=state.global_step + 1, adapter_version=self.engine.live.version)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.record.optimizer_done_at = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = self.engine
        step = state.global_step
        started = time.perf_counter()  # sync = saving the PEFT files + pushing them to rollout
        adapter_dir = engine.hooks.save_adapter(engine.model, step)  # unwrapped: the PeftModel itself
        engine.adapter_step = step
        tag = AdapterTag(engine.job.adapter_name, step)
        engine.generator.publish_adapter(adapter_dir, tag)
        engine.live = tag
        engine.record.sync_seconds = time.perf_counter() - started
        engine.record.finish()
        if engine.hooks.cancel.is_set():
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        engine = self.engine
        if not logs or "loss" not in logs or engine.record.step != state.global_step:
            return  # the end-of-training summary, or a log line of no step of ours
        event = metric_event(engine.job.job_id, engine.total_steps, engine.record, logs, engine.job.kl_beta > 0)
        log.info(
            "step %d/%d reward %.3f accuracy %.3f format %.3f loss %.4f length %.1f (%.2f s)%s",
            event.step, event.total_steps, event.reward_mean, event.accuracy, event.format, event.loss,
            event.completion_length_mean, event.step_seconds,
            f" groups with signal {engine.record.groups_with_signal}/{engine.record.groups_drawn}"
            if engine.record.groups_drawn else "",
        )
        engine.hooks.publish(event)


def make_callback(engine: GrpoEngine) -> Any:  # -> TrainerCallback
    from transformers import TrainerCallback

    class StepCallback(_StepCallback, TrainerCallback):
        pass

    return StepCallback(engine)


class GrpoEngine:
    """One job's TRL trainer with our seams; `run()` trains until total_steps or cancel."""

    def __init__(
        self,
        job: JobConfig,
        model: Any,  # a peft PeftModel over the (possibly quantized) base
        tokenizer: PreTrainedTokenizerBase,
        prompts: Sequence[tuple[str, str]],  # (rendered prompt, ground truth)
        generator: PolicyGenerator,
        scorer: Scorer,
        hooks: StepHooks,
        total_steps: int,
        initial: AdapterTag,
        use_cpu: bool,
    ) -> None:
        from datasets import Dataset
        from transformers import PrinterCallback
        from trl import GRPOTrainer

        self.job = job
        self.tokenizer = tokenizer
        self.generator = generator
        self.scorer = scorer
        self.hooks = hooks
        self.total_steps = total_steps
        self.live = initial  # the policy the next rollouts must come from
        self.adapter_step = 0  # the last step whose adapter is saved
        self.record = StepRecord(step=0)
        self._prompt_ids: dict[str, list[int]] = {}
        self._truth = dict(prompts)
        if job.dynamic_sampling and len(self._truth) < len({(p, a) for p, a in prompts}):
            # The rollout function sees prompts, not dataset rows: one question, one answer.
            clash = next(p for p, a in prompts if self._truth[p] != a)
            raise ValueError(f"advanced.dynamic_sampling: the training set asks {clash[-80:]!r} with different "
                             "answers; dynamic sampling needs one answer per question")
        self._draw = PromptDraw(prompts, job.seed) if job.dynamic_sampling else None
        dataset = Dataset.from_dict({"prompt": [p for p, _ in prompts], "ground_truth": [t for _, t in prompts]})
        self.trainer = GRPOTrainer(
            model=model,
            reward_funcs=self._reward,
            args=grpo_args(job, total_steps, job.job_dir / _TRL_DIR, use_cpu),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=self._rollout,
        )
        self.trainer.remove_callback(PrinterCallback)  # our own one line per step replaces its dicts
        self.trainer.add_callback(make_callback(self))
        bind = getattr(generator, "bind", None)
        if bind is not None:  # in-process generators sample from the very model TRL trains
            bind(self.trainer.accelerator.unwrap_model(self.trainer.model))

    @property
    def model(self) -> Any:
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def run(self) -> None:
        self.trainer.train()

    def _ids(self, prompt: str) -> list[int]:
        ids = self._prompt_ids.get(prompt)
        if ids is None:
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            self._prompt_ids[prompt] = ids
        return ids

    def _rollout(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func: `prompts` holds each prompt `group_size` times in a row."""
        g = self.job.group_size
        unique = prompts[::g]
        if len(prompts) != len(unique) * g or any(prompts[i] != unique[i // g] for i in range(len(prompts))):
            raise RuntimeError(f"expected each prompt {g} times in a row from TRL's sampler, got {len(prompts)} rows")
        step = self.record.step
        if hasattr(self.generator, "step"):
            self.generator.step = step  # for its error messages
        sampling = Sampling(
            group_size=g, max_tokens=self.job.max_completion_tokens, temperature=self.job.temperature,
            seed=_step_seed(self.job.seed, step),
        )
        batch = self.generator.generate([self._ids(p) for p in unique], sampling, self.live)
        self.record.generate_seconds = batch.seconds
        self.record.adapter_version = batch.adapter.version if batch.adapter.name == self.job.adapter_name else 0
        if self._draw is not None:
            return self._with_signal(unique, batch, sampling)
        self.record.completion_lengths = [len(c) for c in batch.completion_ids]
        self.record.clipped = list(batch.clipped)
        logprobs = batch.logprobs if batch.logprobs and all(batch.logprobs) else None
        return {"prompt_ids": batch.prompt_ids, "completion_ids": batch.completion_ids, "logprobs": logprobs}

    def _score_groups(self, prompts: list[str], truths: list[str], batch: Any) -> list[Group]:
        g = self.job.group_size
        started = time.perf_counter()
        texts = self.tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
        scores = self.scorer.score(texts, [t for t in truths for _ in range(g)])
        self.record.score_seconds += time.perf_counter() - started
        return split_groups(batch, prompts, truths, scores, g)

    def _with_signal(self, unique: list[str], first: Any, sampling: Sampling) -> dict[str, Any]:
        """Dynamic sampling (services/trainer/dynamic.py): further prompts' groups replace groups
        without a reward spread; every generated completion counts in the step's metrics."""
        assert self._draw is not None
        need = len(unique)
        groups = self._score_groups(unique, [self._truth[p] for p in unique], first)
        step = self.record.step
        for extra_round in range(1, MAX_DRAW_FACTOR):
            if sum(g.has_signal for g in groups) >= need:
                break
            drawn = self._draw.take(need)
            more = self.generator.generate(
                [self._ids(p) for p, _ in drawn],
                replace(sampling, seed=_round_seed(self.job.seed, step, extra_round)),
                self.live,
            )
            self.record.generate_seconds += more.seconds
            groups += self._score_groups([p for p, _ in drawn], [t for _, t in drawn], more)
        chosen = select_groups(groups, need)
        every = [c for grp in groups for c in grp.completion_ids]
        self.record.policy_scores = [s for grp in groups for s in grp.scores]
        self.record.completion_lengths = [len(c) for c in every]
        self.record.clipped = [c for grp in groups for c in grp.clipped]
        self.record.groups_with_signal = sum(g.has_signal for g in groups)
        self.record.groups_drawn = len(groups)
        rows = lambda field: [row for grp in chosen for row in getattr(grp, field)]  # noqa: E731
        logprobs = rows("logprobs") if all(grp.logprobs for grp in chosen) else None
        return {
            "prompt_ids": rows("prompt_ids"), "completion_ids": rows("completion_ids"),
            "logprobs": logprobs if logprobs and all(logprobs) else None,
            # per row: TRL hands it to the reward function in place of the dataset's column
            "ground_truth": [grp.truth for grp in chosen for _ in range(self.job.group_size)],
        }

    def _reward(self, completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        """TRL's reward function: the scorer's total reward; the components go to the record."""
        started = time.perf_counter()
        scores = self.scorer.score(completions, ground_truth)
        self.record.scores = scores
        self.record.score_seconds += time.perf_counter() - started
        self.record.scored_at = time.perf_counter()
        return [s.reward for s in scores]
