"""TRL's `GRPOTrainer` set up for a job, its seams calling into the step (services/trainer/job/step.py).

docs/design.md names TRL as the engine, and it gives the per-step control this worker needs through
documented seams, so nothing of TRL is patched. Each seam is one call into the step's `Step`,
which reads there in order (generate -> score -> update -> push -> publish):

- `rollout_func` (trl 1.16): `Step.rollout` generates the step's completions with our
  `PolicyGenerator` (the rollout service for the vllm backend, the job's own vLLM engine for
  vllm_colocate, the policy itself in-process for transformers) and scores each once.
- the reward function: `Step.rewards`, the rollout's scores of the rows TRL trains on.
- a `TrainerCallback`: a new `Step` at on_step_begin; `Step.updated` after the optimizer step;
  `Step.push` at on_step_end (save the adapter, push it as version = step number), then the cancel
  check; `Step.publish` with TRL's log line for the step (on_log); our resume state beside TRL's
  checkpoint (on_save), which marks it whole.

TRL keeps what it does well: the grpo/dapo/dr_grpo losses, group-relative advantages, the KL term,
entropy, clipping and the optimizer. The KL reference is the policy the job started from. The
adapter TRL trains is always fresh (B = 0): a job's init_adapter is merged into the base weights
before (`policy.load_policy`), so the reference (TRL's frozen copy of the fresh adapter, or the
adapters disabled) is the base model, or base + init_adapter for a stacked job. One step = `batch_size`
completions = `batch_size / group_size` prompts x `group_size` samples, on-policy (by default one
optimizer step per generation, so the importance ratio is 1; the loss may train it in micro-batches
whose gradients accumulate into that step, `micro_batch_size`; advanced.num_iterations and
mini_batches make several optimizer steps of one generation, `grpo_args`) unless the sampler is not the policy trained
(quantization.sampler_corrections): advanced.max_async_steps > 0 (the next steps are generated while
this one trains, prefetch.py), a rollout engine of another dtype than advanced.precision, a
quantized base sampled unquantized by vLLM, or a vLLM sampler reshaped by the job's top_p, top_k,
min_p or repetition_penalty (the loss scores the whole tempered policy: docs/jobs.md). Then TRL's
truncated importance sampling against the rollout's logprobs corrects the loss (grpo_trainer.py: `trainer_class(correct_lag=True)`, its ratio
taken from the training forward rather than from TRL's extra no-grad pass), and each step's
MetricEvent names the reasons (sampler_correction). Every step measures the sampler/trainer logprob
gap (MetricEvent.logprob_gap) whether or not it corrects.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.jobspec import CHECKPOINTING_PARAMETERS
from rlvr.peers.types import AdapterTag, Score
from rlvr.services.trainer.job.artifacts import DiskSpace
from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.distributed import Group, gather_adapter, merge_records, shareable
from rlvr.services.trainer.job.dynamic import PromptDraw
from rlvr.services.trainer.job.grpo_trainer import LAG_CORRECTION, trainer_class
from rlvr.services.trainer.job.prefetch import Prefetcher
from rlvr.services.trainer.job.quantization import effective_precision
from rlvr.services.trainer.job.rollouts import PolicyGenerator
from rlvr.services.trainer.job.scorers import Scorer
from rlvr.services.trainer.job.step import Step, StepContext, StepHooks, answers
from rlvr.tasks.base import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16

__all__ = ["GrpoEngine", "StepHooks", "grpo_args", "micro_batch_budget", "micro_batch_size", "token_bytes"]

log = logging.getLogger("rlvr.trainer.engine")

# TRL's output_dir: its checkpoints (`checkpoint-N`: the adapter, optimizer, LR scheduler, RNG
# states and trainer state, written every `checkpoint_every` steps) are what a resume starts from;
# the job's adapters go through `StepHooks`.
TRL_DIR = "trl"
# Written into a TRL checkpoint once the checkpoint is whole (TRL writes its files in place, so a
# kill mid-save leaves a checkpoint without it): our own part of the state, read back on resume.
RESUME_FILE = "rlvr-resume.json"


def checkpointing_on(job: JobConfig, parameters: int, use_cpu: bool) -> bool:
    """advanced.gradient_checkpointing for this job: "on"/"off" as asked; "auto" on for a model of
    CHECKPOINTING_PARAMETERS or more on an accelerator, off on a CPU (recomputing the forward costs
    about a third more compute, and a CPU host's memory holds the activations of the models it trains)."""
    if job.gradient_checkpointing in ("on", "off"):
        return job.gradient_checkpointing == "on"
    return not use_cpu and parameters >= CHECKPOINTING_PARAMETERS


def grpo_args(job: JobConfig, total_steps: int, output_dir: Path, use_cpu: bool,
              processes: int = 1, correct: bool | None = None, micro_batch: int = 0,
              parameters: int = 0) -> Any:  # -> GRPOConfig
    """TRL's config for a job. CPU facts (docs/design.md): no gradient checkpointing, and fp32 unless the
    job asks for mixed precision (advanced.precision); TRL's defaults (bf16, checkpointing on) make
    steps 8-13x slower here. With `processes` > 1 (advanced.num_processes) each process takes its
    share of the step's batch, whole groups each (rlvr/jobspec/ checks that they divide).
    `correct`: TRL's truncated importance sampling against the rollout's logprobs (None: with
    asynchronous steps; the runner passes whether `sampler_corrections` found any reason).

    `parameters`: the policy's, for advanced.gradient_checkpointing "auto" (`checkpointing_on`).

    `micro_batch`: completions per forward/backward of the loss (`micro_batch_size`; 0 = the process's
    whole share of a mini-batch, one micro-batch). A step generates once (steps_per_generation = the
    share / micro_batch micro-batches) and makes `JobConfig.updates_per_step` optimizer steps on it:
    job.mini_batches per pass (gradient_accumulation_steps = the micro-batches of one mini-batch, whose
    gradients accumulate; TRL's losses divide each micro-batch so that the accumulated gradient is the
    mini-batch's), job.num_iterations passes. TRL's steps are then optimizer steps: max_steps, the
    logging and the checkpoints count them `updates_per_step` to a step (`_StepCallback`)."""
    from trl import GRPOConfig

    if correct is None:
        correct = job.max_async_steps > 0
    lag: dict[str, Any] = LAG_CORRECTION if correct else {}
    share = job.batch_size // processes
    mini = share // job.mini_batches
    micro = micro_batch or mini
    if share % job.mini_batches or mini % micro:
        raise ValueError(f"micro-batch of {micro} completions does not divide the process's mini-batch of {mini} "
                         f"({share} completions in {job.mini_batches} mini-batches)")
    updates = job.updates_per_step
    precision = effective_precision(job.precision, "cpu" if use_cpu else "cuda")  # "auto" as on that device
    return GRPOConfig(
        **lag,
        **(fsdp_args(job) if job.sharding == "fsdp" and processes > 1 else {}),
        output_dir=str(output_dir),
        per_device_train_batch_size=micro,
        # One generation per step, trained in share / micro micro-batches: mini / micro of them to an
        # optimizer step, num_iterations passes.
        gradient_accumulation_steps=mini // micro,
        steps_per_generation=share // micro,
        num_iterations=job.num_iterations,
        num_generations=job.group_size,
        # an episode's row holds all its turns and observations (dr_grpo normalizes by this length)
        max_completion_length=job.max_episode_tokens if job.environment else job.max_completion_tokens,
        learning_rate=job.learning_rate,
        # The spec's Learning Rate is the rate: held constant rather than decayed to zero.
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=total_steps * updates,
        num_train_epochs=job.epochs,
        **LOSS_ARGS.get(job.loss_type, {"loss_type": job.loss_type, "epsilon_high": job.epsilon_high}),
        # Dr. GRPO drops the per-group std normalisation (its length/difficulty bias fix).
        scale_rewards="none" if job.loss_type == "dr_grpo" else "group",
        mask_truncated_completions=job.mask_truncated_completions,
        beta=job.kl_beta,
        temperature=job.temperature,
        # TRL's own sampler is not used (rollout_func generates), but its config states how the
        # rollouts were sampled; its loss scores log_softmax(logits / temperature) whatever these are.
        top_p=job.top_p,
        top_k=job.top_k,
        min_p=job.min_p or None,
        repetition_penalty=job.repetition_penalty,
        seed=job.seed,
        data_seed=job.seed,
        logging_steps=updates,  # one log line a step, of its updates (TRL averages them)
        report_to=[],
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        gradient_checkpointing=checkpointing_on(job, parameters, use_cpu),
        use_cpu=use_cpu,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
        # Checkpoints for crash recovery (`resume_checkpoint`): TRL/transformers' own, so a resume
        # is `train(resume_from_checkpoint=...)`. Two are kept: the older one is whole while the
        # newer one is being written.
        save_strategy="steps" if job.checkpoint_every > 0 else "no",
        save_steps=max(job.checkpoint_every, 1) * updates,
        save_total_limit=2,
        save_only_model=False,
    )


# The loss families that are more than TRL's loss_type and the job's epsilon_high (rlvr/jobspec/,
# OWN_BOUNDS, says the same to users). The others pass loss_type as named, with the clip-higher.
LOSS_ARGS: dict[str, dict[str, Any]] = {
    # GSPO: GRPO's loss over a sequence-level ratio, clipped at the paper's 3e-4 / 4e-4 (v2, section 5.1;
    # TRL's paper index gives the same configuration).
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    # CISPO: TRL reads epsilon_high as the weight's upper clip, ScaleRL's epsilon_max (TRL recommends 5.0).
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
    "sapo": {"loss_type": "sapo"},  # TRL's temperatures (1.0 positive, 1.05 negative advantages)
}


def fsdp_args(job: JobConfig) -> dict[str, Any]:
    """TrainingArguments' FSDP settings for advanced.sharding "fsdp": FSDP2 (torch's fully_shard,
    through accelerate's plugin), one shard unit per decoder layer (transformers' own
    `_no_split_modules`), resharded after each forward."""
    return {"fsdp": True,
            "fsdp_config": {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                            "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT",
                            "cpu_ram_efficient_loading": False}}


# The loss's memory per micro-batch the trainer aims at (`micro_batch_size`), in bytes, on a CPU: with
# SmolLM2-135M's ~1.5 GiB of weights, optimizer and generation, a job process within 3 GiB (issue 43);
# and the bundled tiny models' batches fit, up to 32 rows of 2,048 + 64 tokens for the test size and of
# 256 + 64 (an environment job's default episode) for the default size. On an accelerator, a quarter
# of the device's memory (`micro_batch_budget`).
MICRO_BATCH_BUDGET = 2 << 30
# The training memory of one token of a micro-batch, in 4-byte words per decoder layer and unit of
# (hidden_size + intermediate_size): the activations autograd keeps for the backward (LoRA's inputs
# included) and the backward's own. Measured on SmolLM2-135M in fp32 on a CPU, ~3.5 MiB a token
# (docs/measurements/trainer-memory.md), rounded up.
ACTIVATION_WORDS = 14


def token_bytes(config: Any) -> int:
    """The estimated training memory of one token of a micro-batch for a model of `config` (a
    transformers PretrainedConfig): its activations through every decoder layer
    (`ACTIVATION_WORDS`), and one fp32 row of the vocabulary's logits (TRL's fused LM head computes
    them in tiles, so that row is a bound, not what it keeps)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers, hidden = int(text.num_hidden_layers), int(text.hidden_size)
    inner = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    return 4 * (ACTIVATION_WORDS * layers * (hidden + inner) + int(text.vocab_size))


def micro_batch_budget(use_cpu: bool) -> int:
    """`MICRO_BATCH_BUDGET` on a CPU; on a CUDA device a quarter of its memory, if more."""
    if use_cpu:
        return MICRO_BATCH_BUDGET
    import torch

    if not torch.cuda.is_available():
        return MICRO_BATCH_BUDGET
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return max(MICRO_BATCH_BUDGET, total // 4)


def micro_batch_size(job: JobConfig, config: Any, row_tokens: int, processes: int = 1,
                     budget: int = MICRO_BATCH_BUDGET) -> int:
    """Completions per forward/backward of the loss: job.micro_batch_size when set, else the largest
    divisor of the process's share of a mini-batch (batch_size / processes / mini_batches) whose rows of `row_tokens`
    tokens (the longest prompt + the completion cap) fit `budget` at `token_bytes` each; one row at
    least. A share that fits trains at once (one micro-batch), as the trainer did before it split
    batches; so do the bundled tiny models at the sizes their measurements use."""
    share = job.batch_size // processes // job.mini_batches  # an optimizer step's completions
    if job.micro_batch_size:
        return job.micro_batch_size
    return fitting_divisor(share, token_bytes(config) * row_tokens, budget)


def fitting_divisor(total: int, row_bytes: int, budget: int) -> int:
    """The largest divisor of `total` rows whose rows of `row_bytes` each fit `budget`; one at least
    (an RLVR step's micro-batch, an SFT step's: sft.py)."""
    fit = max(1, budget // max(1, row_bytes))
    return max(d for d in range(1, total + 1) if total % d == 0 and d <= fit)


def shard_sizes(model: Any) -> tuple[int, int]:
    """(parameters this process holds, parameters of the model): the two differ once FSDP2 shards it."""
    from torch.distributed.tensor import DTensor

    held = total = 0
    for p in model.parameters():
        total += p.numel()
        held += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return held, total


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


def prompt_tokens(tokenizer: Any, texts: Sequence[str], longest: int = 16) -> int:
    """The token count of the longest rendered prompt, among the `longest` longest in characters."""
    picked = sorted(texts, key=len, reverse=True)[:longest]
    return max((len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in picked), default=0)


class _StepCallback:
    """The step's seams in TRL's loop (a transformers TrainerCallback; built in `make_callback` so
    that this module imports transformers lazily). TRL's global_step counts optimizer steps, `updates`
    (JobConfig.updates_per_step) to one of our steps: a step begins with the first of its updates and
    ends (pushed, published, checkpointed) with the last."""

    def __init__(self, engine: GrpoEngine) -> None:
        self.engine = engine
        self.updates = engine.ctx.job.updates_per_step

    def number(self, state: Any) -> int:
        """Our step of TRL's last finished optimizer step (0 before the first)."""
        return -(-state.global_step // self.updates)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.engine.sharded:  # the policy is sharded by now (accelerate's prepare, in train())
            held, total = shard_sizes(self.engine.model)
            log.info("policy sharded with FSDP2 across %d processes: this one holds %d of its %d parameters",
                     self.engine.group.world, held, total)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.updates == 0:  # the step's first update: TRL generates for it
            self.engine.step = Step(self.engine.ctx, state.global_step // self.updates + 1)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.current.updated()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine, group = self.engine, self.engine.group
        if state.global_step % self.updates:
            return  # an update before the step's last
        step = engine.current
        if group.world == 1:
            step.push(engine.model)  # unwrapped: the PeftModel itself
            heldout, ctx = engine.ctx.heldout, engine.ctx
            if heldout is not None and heldout.due(step.number, ctx.total_steps) and not ctx.hooks.cancel.is_set():
                step.record.heldout_accuracy = heldout.accuracy(ctx.generator, ctx.tokenizer, ctx.scorer, ctx.live,
                                                                chunk=ctx.job.batch_size)
        else:
            # Rank 0 publishes the step with every rank's completions, saves and pushes the adapter
            # once; the others wait for the push (and fail with it) before they generate again, and
            # adopt it: a rollout server restarted without it gets it again from whichever rank finds
            # it gone (rank 0 may have generated its part before the server went away).
            parts = group.gather(shareable(step.record))
            if group.is_main:
                merge_records(step.record, parts)
            # Sharded (advanced.sharding fsdp): every rank takes part in gathering the adapter whole,
            # and rank 0 saves and pushes that; DDP's rank 0 holds the whole adapter itself.
            policy = gather_adapter(engine.model, group) if engine.sharded else engine.model
            pushed = group.on_main(lambda: step.push(policy))
            live = AdapterTag(engine.ctx.job.adapter_name, step.number)
            if not group.is_main:
                engine.ctx.generator.adopt_adapter(pushed, live)
            engine.ctx.adapter_step = step.number
            engine.ctx.live = live
        # A cancel seen by any process stops them all after this step.
        if group.any(engine.ctx.hooks.cancel.is_set()):
            control.should_training_stop = True
        every = self.engine.ctx.job.checkpoint_every
        if control.should_save and (not every or step.number % every):
            control.should_save = False  # transformers' save at the last step: a finished job resumes nothing

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        step = self.engine.step
        if not self.engine.group.is_main:
            return  # rank 0 publishes the step (with every rank's completions: on_step_end)
        if not logs or "loss" not in logs or step is None or step.number * self.updates != state.global_step:
            return  # the end-of-training summary, or a log line of no step of ours
        step.publish(logs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """TRL's checkpoint is written: ours goes beside it, last, marking it whole (on each node of
        a job of several nodes: each writes the checkpoint into its own artifact root)."""
        if not self.engine.group.is_node_main:
            return
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"  # TRL's folder: its steps
        number = self.number(state)
        self.engine.space.write(f"step {number}'s checkpoint",
                                lambda: self.engine.save_resume_state(checkpoint, number))


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
        problems: Sequence[tuple[str, Problem]],  # (rendered prompt, the problem)
        generator: PolicyGenerator,
        scorer: Scorer,
        hooks: StepHooks,
        total_steps: int,
        initial: AdapterTag,
        use_cpu: bool,
        group: Group | None = None,  # a job of several processes: this one's rank (distributed.py)
        corrections: Sequence[str] | None = None,  # quantization.sampler_corrections (None: the lag alone)
        episodes: Any = None,  # an episodes.EpisodeRollout: the job names an environment
        heldout: Any = None,  # a heldout.HeldoutEval: the job evaluates while it trains (advanced.eval_every)
    ) -> None:
        from datasets import Dataset
        from transformers import PrinterCallback

        prompts = [(text, p.ground_truth) for text, p in problems]
        truth = answers(prompts)
        if job.dynamic_sampling and truth is None:
            # The rollout function sees prompts, not dataset rows: one question, one answer.
            clash = next(p for p, a in prompts if dict(prompts)[p] != a)
            raise ValueError(f"advanced.dynamic_sampling: the training set asks {clash[-80:]!r} with different "
                             "answers; dynamic sampling needs one answer per question")
        self.ctx = StepContext(
            job=job, tokenizer=tokenizer, generator=generator, scorer=scorer, hooks=hooks, total_steps=total_steps,
            truth=truth, draw=PromptDraw(prompts, job.seed) if job.dynamic_sampling else None, live=initial,
            newest=job.max_async_steps > 0, problems={(text, p.ground_truth): p for text, p in problems},
            episodes=episodes, heldout=heldout,
        )
        if corrections is None:
            corrections = ("policy_lag",) if job.max_async_steps else ()
        self.corrections = tuple(corrections)
        self.ctx.correction = ",".join(self.corrections)
        self.step: Step | None = None  # the step in flight (or the last one)
        self.group = group or Group()
        # advanced.sharding fsdp: the policy's weights sharded across the job's processes (`fsdp_args`)
        self.sharded = job.sharding == "fsdp" and self.group.world > 1
        self._texts = [p for p, _ in prompts]
        dataset = Dataset.from_dict({"prompt": self._texts, "ground_truth": [t for _, t in prompts]})
        row_tokens = prompt_tokens(tokenizer, self._texts) + (
            job.max_episode_tokens if job.environment else job.max_completion_tokens)
        self.micro_batch = micro_batch_size(job, model.config, row_tokens, self.group.world,
                                            budget=micro_batch_budget(use_cpu))
        args = grpo_args(job, total_steps, job.job_dir / TRL_DIR, use_cpu, self.group.world,
                         correct=bool(self.corrections), micro_batch=self.micro_batch,
                         parameters=sum(p.numel() for p in model.parameters()))
        if args.gradient_checkpointing:
            log.info("gradient checkpointing on (advanced.gradient_checkpointing %s)", job.gradient_checkpointing)
        share = job.batch_size // self.group.world
        if self.micro_batch < share:
            log.info("the loss trains each step's %d completions per process in %d micro-batches of %d "
                     "(rows of up to %d tokens)", share, share // self.micro_batch, self.micro_batch, row_tokens)
        # Several nodes, an artifact root each: every node's first process writes the checkpoint
        # (transformers' own rule; its global rank 0 need not be on node 0: distributed.py).
        args.save_on_each_node = job.num_nodes > 1
        # A full artifact root: the checkpoint's writes wait for space (artifacts.DiskSpace). TRL's
        # part of a checkpoint is written by every process of a job of several (FSDP gathers the
        # optimizer state for it), so one process cannot write it again alone: it fails at once.
        self.space = hooks.space or DiskSpace(job.artifact_root, cancel=hooks.cancel)
        trl_space = self.space if self.group.world == 1 else replace(self.space, wait_s=0.0)
        self.trainer = trainer_class(correct_lag=bool(self.corrections), space=trl_space)(
            model=model,
            reward_funcs=self._reward,
            args=args,
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
        epoch: transformers' loop over the epochs, a resumed one included (it skips batches). TRL's
        sampler yields each step's batch num_iterations x steps_per_generation times over (its
        repeat_count: one dataloader batch per micro-batch of every pass, the first of which is
        generated for)."""
        sampler = getattr(self.trainer, "epoch_sampler", None)
        size = self.ctx.job.batch_size
        stride = size * int(getattr(sampler.inner, "repeat_count", 1)) if sampler is not None else size
        if sampler is None or len(sampler) < stride:
            return None
        per_epoch = len(sampler) // stride
        epoch, batch = divmod(number - 1, per_epoch)
        order = sampler.peek(epoch)
        return [self._texts[i] for i in order[batch * stride:batch * stride + size]]

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
        from rlvr.services.trainer.job import artifacts

        state: dict[str, Any] = {"step": step, "adapter_step": self.ctx.adapter_step}
        if self.ctx.draw is not None:
            # Asynchronous steps draw ahead: the draw as it was when this step's rollout ended.
            ahead = self.step.draw_state if self.prefetch is not None and self.step is not None else None
            state["draw"] = ahead if ahead is not None else self.ctx.draw.state()
        job = self.ctx.job
        own = artifacts.checkpoint_dir(job.artifact_root, job.job_id, self.ctx.adapter_step)
        if self.ctx.adapter_step and self.group.is_main and not own.is_dir():
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
            rows = step.rollout(prompts)
            if self.corrections and rows.get("logprobs") is None:
                raise RuntimeError(f"the generator returned no sampling logprobs at step {step.number}; the "
                                   f"importance-sampling correction ({self.ctx.correction}) needs them")
            return rows
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
                prompts: list[str] | None = None, **_: Any) -> list[float]:
        """TRL's reward function (TRL passes every argument by name); `score` is the rollout's per-row
        field (absent when it could not score), `prompts` the rows' rendered prompts."""
        return self.current.rewards(score, completions, ground_truth, prompts or [""] * len(completions))
