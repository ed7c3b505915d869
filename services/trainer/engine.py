"""TRL's `GRPOTrainer` set up for a job, its seams calling into the step (services/trainer/step.py).

DESIGN.md names TRL as the engine, and it gives the per-step control this worker needs through
documented seams, so nothing of TRL is patched. Each seam is one call into the step's `Step`,
which reads there in order (generate -> score -> update -> push -> publish):

- `rollout_func` (trl 1.16): `Step.rollout` generates the step's completions with our
  `PolicyGenerator` (the rollout service for the vllm backend, the job's own vLLM engine for
  vllm_colocate, the policy itself in-process for transformers) and scores each once.
- the reward function: `Step.rewards`, the rollout's scores of the rows TRL trains on.
- a `TrainerCallback`: a new `Step` at on_step_begin; `Step.updated` after the optimizer step;
  `Step.push` at on_step_end (save the adapter, push it as version = step number), then the cancel
  check; `Step.publish` with TRL's log line for the step (on_log).

TRL keeps what it does well: the grpo/dapo/dr_grpo losses, group-relative advantages, the KL term,
entropy, clipping and the optimizer. The KL reference is the policy the job started from. The
adapter TRL trains is always fresh (B = 0): a job's init_adapter is merged into the base weights
before (`runner.load_policy`), so the reference (TRL's frozen copy of the fresh adapter, or the
adapters disabled) is the base model, or base + init_adapter for a stacked job. One step = `batch_size`
completions = `batch_size / group_size` prompts x `group_size` samples, on-policy (one optimizer
step per generation, so no importance ratio is needed) unless advanced.max_async_steps > 0: then the
next steps are generated while this one trains (prefetch.py), and TRL's truncated importance
sampling against the rollout's logprobs corrects the lag (`trainer_class(correct_lag=True)`), its
ratio taken from the training forward rather than from TRL's extra no-grad pass (`lag_ratio`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.peers.types import AdapterTag, Score
from rlvr.services.trainer.config import JobConfig
from rlvr.services.trainer.distributed import Group, merge_records, shareable
from rlvr.services.trainer.dynamic import PromptDraw
from rlvr.services.trainer.prefetch import Prefetcher
from rlvr.services.trainer.rollouts import PolicyGenerator
from rlvr.services.trainer.scorers import Scorer
from rlvr.services.trainer.step import Step, StepContext, StepHooks, answers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16

__all__ = ["GrpoEngine", "StepHooks", "grpo_args"]

# TRL's output_dir: its checkpoints (`checkpoint-N`: the adapter, optimizer, LR scheduler, RNG
# states and trainer state, written every `checkpoint_every` steps) are what a resume starts from;
# the job's adapters go through `StepHooks`.
TRL_DIR = "trl"
# Written into a TRL checkpoint once the checkpoint is whole (TRL writes its files in place, so a
# kill mid-save leaves a checkpoint without it): our own part of the state, read back on resume.
RESUME_FILE = "rlvr-resume.json"


# The policy-lag correction of asynchronous steps (prefetch.py): TRL's truncated importance sampling.
LAG_CORRECTION = {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate",
                  "vllm_importance_sampling_clip_max": 3.0}


def grpo_args(job: JobConfig, total_steps: int, output_dir: Path, use_cpu: bool,
              processes: int = 1) -> Any:  # -> GRPOConfig
    """TRL's config for a job. CPU facts (DESIGN.md): no gradient checkpointing, and fp32 unless the
    job asks for mixed precision (advanced.precision); TRL's defaults (bf16, checkpointing on) make
    steps 8-13x slower here. With `processes` > 1 (advanced.num_processes) each process takes its
    share of the step's batch, whole groups each (rlvr/jobspec.py checks that they divide)."""
    from trl import GRPOConfig

    lag: dict[str, Any] = LAG_CORRECTION if job.max_async_steps else {}
    return GRPOConfig(
        **lag,
        output_dir=str(output_dir),
        per_device_train_batch_size=job.batch_size // processes,
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
        bf16=job.precision == "bf16",
        fp16=job.precision == "fp16",
        gradient_checkpointing=False,
        use_cpu=use_cpu,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
        # Checkpoints for crash recovery (`resume_checkpoint`): TRL/transformers' own, so a resume
        # is `train(resume_from_checkpoint=...)`. Two are kept: the older one is whole while the
        # newer one is being written.
        save_strategy="steps" if job.checkpoint_every > 0 else "no",
        save_steps=max(job.checkpoint_every, 1),
        save_total_limit=2,
        save_only_model=False,
    )


def checkpoints(job_dir: Path) -> list[tuple[int, Path]]:
    """The job's TRL checkpoint folders (`checkpoint-<step>`, whole or not) with their steps."""
    found = []
    for path in (job_dir / TRL_DIR).glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if suffix.isdigit():
            found.append((int(suffix), path))
    return found


def resume_checkpoint(job_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The job's last whole TRL checkpoint and our state saved with it (`RESUME_FILE`); None when
    there is none."""
    import json

    found = [(step, path) for step, path in checkpoints(job_dir) if (path / RESUME_FILE).is_file()]
    for _, path in sorted(found, reverse=True):
        try:
            return path, json.loads((path / RESUME_FILE).read_text())
        except (OSError, ValueError):
            continue
    return None


class EpochSampler:
    """TRL's RepeatSampler, resumable across epochs. RepeatSampler draws one permutation per epoch
    from its own generator, seeded once: a trainer resumed in epoch e starts a fresh sampler, which
    would draw epoch 0's order again. Told the epoch (transformers' Trainer calls `set_epoch`
    through accelerate's loader), this one first draws the permutations of the epochs before it,
    so a resumed run sees the same prompt order as an uninterrupted one; an uninterrupted run's
    order is RepeatSampler's own."""

    def __init__(self, inner: Any) -> None:  # a trl RepeatSampler
        self.inner = inner
        self.epoch = 0
        self._drawn = 0  # epoch permutations drawn from inner.generator so far
        self._orders: dict[int, list[int]] = {}  # the order of the epoch being yielded

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        import torch

        if self.inner.shuffle:
            while self._drawn < self.epoch:
                torch.randperm(self.inner.num_samples, generator=self.inner.generator)
                self._drawn += 1
        self._drawn += 1
        order = list(self.inner)  # drawn as RepeatSampler draws it (one permutation), kept for `peek`
        self._orders = {self.epoch: order}
        yield from order

    def peek(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s order (every index as the sampler yields it), without drawing it: the
        order being yielded, or a later epoch's from a copy of the sampler's generator (its next
        permutations are the ones `__iter__` will draw)."""
        import copy

        import torch

        if epoch in self._orders:
            return self._orders[epoch]
        if epoch < self._drawn:
            raise ValueError(f"epoch {epoch}'s order is drawn and gone")
        twin = copy.copy(self.inner)
        if self.inner.shuffle:
            twin.generator = torch.Generator()
            twin.generator.set_state(self.inner.generator.get_state())
            for _ in range(epoch - self._drawn):
                torch.randperm(twin.num_samples, generator=twin.generator)
        return list(twin)


class _StepCallback:
    """The step's seams in TRL's loop (a transformers TrainerCallback; built in `make_callback` so
    that this module imports transformers lazily)."""

    def __init__(self, engine: GrpoEngine) -> None:
        self.engine = engine

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.step = Step(self.engine.ctx, state.global_step + 1)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.current.updated()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine, group = self.engine, self.engine.group
        step = engine.current
        if group.world == 1:
            step.push(engine.model)  # unwrapped: the PeftModel itself
        else:
            # Rank 0 publishes the step with every rank's completions, saves and pushes the adapter
            # once; the others wait for the push (and fail with it) before they generate again, and
            # adopt it: a rollout server restarted without it gets it again from whichever rank finds
            # it gone (rank 0 may have generated its part before the server went away).
            parts = group.gather(shareable(step.record))
            if group.is_main:
                merge_records(step.record, parts)
            pushed = group.on_main(lambda: step.push(engine.model))
            live = AdapterTag(engine.ctx.job.adapter_name, step.number)
            if not group.is_main:
                engine.ctx.generator.adopt_adapter(pushed, live)
            engine.ctx.adapter_step = step.number
            engine.ctx.live = live
        # A cancel seen by any process stops them all after this step.
        if group.any(engine.ctx.hooks.cancel.is_set()):
            control.should_training_stop = True
        every = self.engine.ctx.job.checkpoint_every
        if control.should_save and (not every or state.global_step % every):
            control.should_save = False  # transformers' save at the last step: a finished job resumes nothing

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        step = self.engine.step
        if not self.engine.group.is_main:
            return  # rank 0 publishes the step (with every rank's completions: on_step_end)
        if not logs or "loss" not in logs or step is None or step.number != state.global_step:
            return  # the end-of-training summary, or a log line of no step of ours
        step.publish(logs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """TRL's checkpoint is written: ours goes beside it, last, marking it whole."""
        if not self.engine.group.is_main:
            return
        self.engine.save_resume_state(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step)


def make_callback(engine: GrpoEngine) -> Any:  # -> TrainerCallback
    from transformers import TrainerCallback

    class StepCallback(_StepCallback, TrainerCallback):
        pass

    return StepCallback(engine)


def can_defer_ratio(args: Any) -> bool:
    """Whether the lag ratio can come from the training forward (`trainer_class`): TRL's token_truncate
    correction, and each generation trained on before any optimizer step changes the policy (TRL's
    own condition for skipping its old-logprob pass). Else TRL's own pass runs."""
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(args.vllm_importance_sampling_mode == "token_truncate" and args.num_iterations == 1
                and args.gradient_accumulation_steps % generate_every == 0)


def lag_ratio(trainer: Any, logps: Any, inputs: dict[str, Any]) -> Any:
    """TRL's token_truncate importance ratio (trl 1.16, GRPOTrainer._generate_and_score_completions)
    from the policy's per-token logprobs `logps` (B, T) and the rollout's, with TRL's metrics of it."""
    import torch
    from trl.trainer.utils import nanmax, nanmin

    sampling = inputs["sampling_per_token_logps"]
    mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
    # NaN sampling logprobs (unscored tokens) give a ratio of 1, as in TRL.
    ratio = torch.exp(torch.nan_to_num((logps - sampling) * mask, nan=0.0))
    ratio = torch.clamp(ratio, min=trainer.vllm_importance_sampling_clip_min,
                        max=trainer.vllm_importance_sampling_clip_max)
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    gather = trainer.accelerator.gather
    zero = torch.tensor(0.0, device=logps.device)
    delta = torch.abs(logps - sampling)
    delta = delta[mask.bool() & ~torch.isnan(delta)]
    metrics["sampling/sampling_logp_difference/mean"].append(
        gather(delta.mean() if delta.numel() else zero).mean().item())
    metrics["sampling/sampling_logp_difference/max"].append(
        gather(delta.max() if delta.numel() else zero).max().item())
    flat = ratio[mask.bool()]
    metrics["sampling/importance_sampling_ratio/min"].append(
        nanmin(gather(flat.min() if flat.numel() else zero)).item())
    metrics["sampling/importance_sampling_ratio/mean"].append(
        gather(flat.mean() if flat.numel() else zero).nanmean().item())
    metrics["sampling/importance_sampling_ratio/max"].append(
        nanmax(gather(flat.max() if flat.numel() else zero)).item())
    return ratio


class _NoEngine:
    """TRL's vLLM handle for a trainer whose rollout_func generates: our Step pushes the adapters."""

    def sync_weights(self) -> None:
        pass


def trainer_class(correct_lag: bool = False) -> Any:  # -> type[GRPOTrainer]
    """GRPOTrainer with `EpochSampler` around its train sampler; with `correct_lag` (asynchronous
    steps, prefetch.py) also with TRL's importance-sampling correction against the rollout's own
    logprobs, which TRL applies only to vLLM rollouts (`use_vllm`): it is turned on after TRL's
    setup, so TRL starts no vLLM engine of its own, and its weight sync is a no-op. The correction's
    ratio comes from the loss's own forward (`deferred_ratio`, below), not from a forward of its own."""
    from trl import GRPOTrainer

    class Trainer(GRPOTrainer):
        deferred_ratio = False  # the lag ratio from the loss's own forward (`_compute_loss`)
        _ratio_inputs: dict[str, Any] | None = None  # the loss's inputs, until its forward

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.epoch_sampler: EpochSampler | None = getattr(self, "epoch_sampler", None)
            if correct_lag:
                self.use_vllm = True
                self.vllm_mode = "server"
                self.vllm_generation = _NoEngine()
                self._last_loaded_step = -1
                self.deferred_ratio = can_defer_ratio(self.args)

        # The lag ratio without TRL's extra pass. TRL computes exp(logp_old - logp_sampling) from a
        # no-grad forward of the whole batch (`old_per_token_logps`) in _generate_and_score_completions,
        # then trains with a second forward under the same adapter. When every generation is trained on
        # within one optimizer step (num_iterations == 1, gradient_accumulation_steps a multiple of
        # steps_per_generation: TRL's own condition for old == current, `can_defer_ratio`), no parameter
        # changes between those two forwards and the inputs are the same rows, so logp_old is the
        # training forward's logp, detached: the ratio is computed from that one instead, and TRL's PPO
        # ratio exp(logp - logp_old) is then exp(logp - logp.detach()) = 1 with TRL's gradient. prime-rl
        # does the same: its trainer takes the ratio against the rollout's `inference_logprobs` from
        # the training forward's `trainer_logprobs`, with no old-logprob pass (src/prime_rl/trainer/rl/
        # train.py and loss.py `compute_loss`). tests/test_trainer_lag_ratio.py: bit-equal on CPU.
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            if not self.deferred_ratio:
                return super()._generate_and_score_completions(inputs)
            self.vllm_importance_sampling_correction = False  # TRL's pass and ratio are skipped
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self.vllm_importance_sampling_correction = True

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            if not self.deferred_ratio or "importance_sampling_ratio" in inputs:
                return super()._compute_loss(model, inputs)
            self._ratio_inputs = inputs  # the loss's forward (below) fills in the ratio it then applies
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._ratio_inputs = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            inputs, self._ratio_inputs = self._ratio_inputs, None  # the loss's one forward of the policy
            if inputs is not None:
                inputs["importance_sampling_ratio"] = lag_ratio(self, result[0].detach(), inputs)
            return result

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            self.epoch_sampler = EpochSampler(super()._get_train_sampler(dataset))
            return self.epoch_sampler

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            # With kl_beta > 0 the policy holds TRL's frozen "ref" adapter too, which peft saves in a
            # sub-folder; transformers 5 then loads the sub-folders' adapters only, not the trained
            # one at the checkpoint's root: load that one (exactly its saved tensors).
            root = Path(resume_from_checkpoint) / "adapter_model.safetensors"
            peft_model = model if model is not None else self.model
            subdirs = [p for p in Path(resume_from_checkpoint).iterdir() if (p / root.name).is_file()]
            if root.is_file() and subdirs:
                from peft import set_peft_model_state_dict
                from safetensors.torch import load_file

                active = peft_model.active_adapters[0]
                result = set_peft_model_state_dict(peft_model, load_file(str(root)), adapter_name=active)
                missing = [k for k in result.unexpected_keys if "lora_" in k]
                if missing:
                    raise RuntimeError(f"checkpoint {root.parent.name}: the adapter has tensors the policy lacks: "
                                       f"{missing[:3]}")

    return Trainer


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
        group: Group | None = None,  # a job of several processes: this one's rank (distributed.py)
    ) -> None:
        from datasets import Dataset
        from transformers import PrinterCallback

        truth = answers(prompts)
        if job.dynamic_sampling and truth is None:
            # The rollout function sees prompts, not dataset rows: one question, one answer.
            clash = next(p for p, a in prompts if dict(prompts)[p] != a)
            raise ValueError(f"advanced.dynamic_sampling: the training set asks {clash[-80:]!r} with different "
                             "answers; dynamic sampling needs one answer per question")
        self.ctx = StepContext(
            job=job, tokenizer=tokenizer, generator=generator, scorer=scorer, hooks=hooks, total_steps=total_steps,
            truth=truth, draw=PromptDraw(prompts, job.seed) if job.dynamic_sampling else None, live=initial,
            newest=job.max_async_steps > 0,
        )
        self.step: Step | None = None  # the step in flight (or the last one)
        self.group = group or Group()
        self._texts = [p for p, _ in prompts]
        dataset = Dataset.from_dict({"prompt": self._texts, "ground_truth": [t for _, t in prompts]})
        self.trainer = trainer_class(correct_lag=job.max_async_steps > 0)(
            model=model,
            reward_funcs=self._reward,
            args=grpo_args(job, total_steps, job.job_dir / TRL_DIR, use_cpu, self.group.world),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=self._rollout,
        )
        self.trainer.remove_callback(PrinterCallback)  # our own one line per step replaces its dicts
        self.trainer.add_callback(make_callback(self))
        bind = getattr(generator, "bind", None)
        if bind is not None:  # in-process generators sample from the very model TRL trains
            bind(self.trainer.accelerator.unwrap_model(self.trainer.model))
        self.prefetch: Prefetcher | None = None
        if job.max_async_steps:
            if not hasattr(generator, "generate_newest"):
                raise ValueError(f"advanced.max_async_steps: {job.max_async_steps} needs the vLLM (rollout server) "
                                 "backend; this job's generator has no asynchronous generation")
            self.prefetch = Prefetcher(self.ctx, job.max_async_steps, total_steps, self.prompts_for)

    def prompts_for(self, number: int) -> list[str] | None:
        """Step `number`'s prompts as TRL's sampler will give them (each group_size times), or None
        before its sampler exists. Step n is batch (n - 1) % S of epoch (n - 1) // S, S batches per
        epoch: transformers' loop over the epochs, a resumed one included (it skips batches)."""
        sampler = getattr(self.trainer, "epoch_sampler", None)
        size = self.ctx.job.batch_size
        if sampler is None or len(sampler) < size:
            return None
        per_epoch = len(sampler) // size
        epoch, batch = divmod(number - 1, per_epoch)
        order = sampler.peek(epoch)
        return [self._texts[i] for i in order[batch * size:(batch + 1) * size]]

    @property
    def model(self) -> Any:
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    @property
    def current(self) -> Step:
        """The step in flight."""
        if self.step is None:
            raise RuntimeError("no step in flight: TRL called a step seam before on_step_begin")
        return self.step

    @property
    def adapter_step(self) -> int:
        """The last step whose adapter is saved (0 = none)."""
        return self.ctx.adapter_step

    def run(self, resume_from: Path | None = None) -> None:
        """Trains to the end; from the TRL checkpoint `resume_from` on (`resume_checkpoint`), after
        `restore` of our state saved with it, when given."""
        try:
            self.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
        finally:
            if self.prefetch is not None:
                self.prefetch.close()

    def save_resume_state(self, checkpoint: Path, step: int) -> None:
        """Our part of a checkpoint, beside TRL's (which holds the adapter, optimizer, scheduler, RNG
        states and the sampler's position): the policy the next rollouts come from, and dynamic
        sampling's draw."""
        from rlvr.services.trainer import artifacts

        state: dict[str, Any] = {"step": step, "adapter_step": self.ctx.adapter_step}
        if self.ctx.draw is not None:
            # Asynchronous steps draw ahead: the draw as it was when this step's rollout ended.
            ahead = self.step.draw_state if self.prefetch is not None and self.step is not None else None
            state["draw"] = ahead if ahead is not None else self.ctx.draw.state()
        job = self.ctx.job
        own = artifacts.checkpoint_dir(job.artifact_root, job.job_id, self.ctx.adapter_step)
        if self.ctx.adapter_step and not own.is_dir():
            # The published adapter of the step (init + trained for a stacked job), which a resume
            # pushes to the rollout server again; not in TRL's folder, whose every adapter folder
            # TRL would load as another adapter of the policy on resume.
            artifacts.copy_adapter(artifacts.adapter_dir(job.artifact_root, job.job_id), own)
        artifacts.write_json_atomic(checkpoint / RESUME_FILE, state)

    def restore(self, state: dict[str, Any], live: AdapterTag) -> None:
        """Our state of a checkpoint (`save_resume_state`), before `run(resume_from=...)`; `live` is
        the policy the generator serves now (the checkpoint's adapter, pushed again)."""
        self.ctx.adapter_step = int(state["adapter_step"])
        self.ctx.live = live
        if self.ctx.draw is not None and "draw" in state:
            self.ctx.draw.restore(state["draw"])

    def _rollout(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func; with asynchronous steps the prefetched rollout when it can be trained
        on, and then the next steps' rollouts queued (prefetch.py)."""
        step = self.current
        if self.prefetch is None:
            return step.rollout(prompts)
        taken = self.prefetch.take(step, prompts)
        if taken is None:
            rows = step.rollout(prompts)
        else:
            self.step, rows = taken
        if rows.get("logprobs") is None:
            raise RuntimeError(f"advanced.max_async_steps: the rollout service returned no sampling logprobs at step "
                               f"{step.number}; the policy-lag correction needs them")
        self.prefetch.schedule(step.number)
        return rows

    def _reward(self, completions: list[str], ground_truth: list[str], score: list[Score] | None = None,
                **_: Any) -> list[float]:
        """TRL's reward function; `score` is the rollout's per-row field (absent when it could not score)."""
        return self.current.rewards(score, completions, ground_truth)
