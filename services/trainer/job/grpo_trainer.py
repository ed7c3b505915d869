"""TRL's `GRPOTrainer` as a job runs it: the subclass `trainer_class` builds, and what it needs.

- `EpochSampler`: TRL's RepeatSampler made resumable across epochs, and able to show a later epoch's
  order (`peek`), from which the prefetch of asynchronous steps (prefetch.py) takes their prompts.
- The policy-lag correction of asynchronous steps (advanced.max_async_steps > 0): TRL's truncated
  importance sampling against the rollout's own logprobs (`LAG_CORRECTION`), switched on after TRL's
  set-up, its ratio taken from the training forward (`lag_ratio`) rather than from TRL's extra
  no-grad pass whenever that is exact (`can_defer_ratio`).
- A checkpoint's trained adapter loaded exactly, also beside TRL's frozen reference adapter.
- A checkpoint that finds the artifact root full: its partial folder removed and the checkpoint
  written again once space is back (artifacts.DiskSpace), so a resume never meets half of one.

engine.py builds the trainer from this and wires the step's seams into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.services.trainer.job.artifacts import DiskSpace

__all__ = ["CHECKED_AGAINST", "LAG_CORRECTION", "TRL_BATCH_KEYS", "TRL_PRIVATE_ATTRIBUTES", "TRL_PRIVATE_METHODS",
           "EpochSampler", "can_defer_ratio", "fsdp_on_cpu", "lag_ratio", "logprob_gap",
           "step_tokens", "trainer_class"]

# What of TRL's (and transformers') private side this module relies on, in one place: the methods
# `trainer_class` overrides or calls, with the parameters they had in the versions checked, the
# attributes it reads or sets, and the keys of TRL's batch dict it reads. TRL offers no public seam for
# these (its callbacks see no batch and no loss inputs; `rollout_func` is used for generation,
# engine.py). tests/test_trl_seams.py fails, naming the seam and this table, when an installed TRL
# or transformers changes one: re-check the override against the new source, then the versions here
# and the pin in pyproject.toml (trl 1.16.0 was the newest on PyPI when last checked).
CHECKED_AGAINST = {"trl": "1.16.0", "transformers": "5.19.0"}
TRL_PRIVATE_METHODS: dict[str, tuple[str, ...]] = {  # name: its first parameters
    "_generate_and_score_completions": ("self", "inputs"),  # the lag ratio deferred; the gap from the old pass
    "_compute_loss": ("self", "model", "inputs"),  # the loss's inputs kept for its own forward
    "_get_per_token_logps_and_entropies": ("self", "model", "input_ids", "attention_mask", "logits_to_keep"),
    "_save_checkpoint": ("self", "model", "trial"),  # written through the job's DiskSpace
    "_get_train_sampler": ("self", "dataset"),  # EpochSampler around TRL's RepeatSampler
    "_load_from_checkpoint": ("self", "resume_from_checkpoint", "model"),  # transformers': the trained adapter
    "_get_output_dir": ("self", "trial"),  # transformers': a checkpoint's folder
}
TRL_PRIVATE_ATTRIBUTES = ("_metrics", "_last_loaded_step", "vllm_generation", "use_vllm", "vllm_mode",
                          "vllm_importance_sampling_correction", "vllm_importance_sampling_clip_min",
                          "vllm_importance_sampling_clip_max")
TRL_BATCH_KEYS = ("sampling_per_token_logps", "old_per_token_logps", "importance_sampling_ratio", "completion_mask",
                  "tool_mask")

# The policy-lag correction of asynchronous steps (prefetch.py): TRL's truncated importance sampling.
LAG_CORRECTION = {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate",
                  "vllm_importance_sampling_clip_max": 3.0}


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


def can_defer_ratio(args: Any) -> bool:
    """Whether the lag ratio can come from the training forward (`trainer_class`): TRL's token_truncate
    correction, and each generation trained on before any optimizer step changes the policy (TRL's
    own condition for skipping its old-logprob pass). Else TRL's own pass runs."""
    return bool(args.vllm_importance_sampling_mode == "token_truncate" and trained_at_once(args))


def trained_at_once(args: Any) -> bool:
    """Whether each generation is trained on before any optimizer step changes the policy: then the
    loss's forward gives the policy's logprobs of the rows the sampler generated (`logprob_gap`)."""
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(args.num_iterations == 1 and args.gradient_accumulation_steps % generate_every == 0)


def step_tokens(trainer: Any, name: str, values: Any) -> Any:
    """`values` (this micro-batch's per-token values, 1-D) after those of the step's earlier micro-batches
    on this process: a step trained in several micro-batches (engine.py `micro_batch_size`) reports its
    metrics of the whole batch, as a step of one does. A step's first micro-batch finds `name`'s metric
    not yet written (TRL clears its metrics at each step's log line)."""
    import torch

    kept: dict[str, Any] = trainer.__dict__.setdefault("_step_tokens", {})
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    if f"sampling/{name}/mean" in metrics and name in kept:
        values = torch.cat([kept[name], values])
    kept[name] = values
    return values


def logprob_gap(trainer: Any, logps: Any, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """Records TRL's sampler/trainer gap metrics (sampling/sampling_logp_difference/mean and max: the
    mean and largest |logp - sampling logp| over the completion tokens, unscored ones left out) from
    the policy's per-token logprobs `logps` (B, T); returns (the sampling logprobs, the token mask).
    Over the step's micro-batches so far (`step_tokens`): the last one leaves the whole batch's."""
    import torch

    sampling = inputs["sampling_per_token_logps"]
    mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    gather = trainer.accelerator.gather
    zero = torch.tensor(0.0, device=logps.device)
    delta = torch.abs(logps - sampling)
    delta = step_tokens(trainer, "sampling_logp_difference", delta[mask.bool() & ~torch.isnan(delta)])
    metrics["sampling/sampling_logp_difference/mean"] = [
        gather(delta.mean() if delta.numel() else zero).mean().item()]
    metrics["sampling/sampling_logp_difference/max"] = [
        gather(delta.max() if delta.numel() else zero).max().item()]
    return sampling, mask


def lag_ratio(trainer: Any, logps: Any, inputs: dict[str, Any]) -> Any:
    """TRL's token_truncate importance ratio (trl 1.16, GRPOTrainer._generate_and_score_completions)
    from the policy's per-token logprobs `logps` (B, T) and the rollout's, with TRL's metrics of it
    (of the step's micro-batches so far, as `logprob_gap`'s)."""
    import torch
    from trl.trainer.utils import nanmax, nanmin

    sampling, mask = logprob_gap(trainer, logps, inputs)
    # NaN sampling logprobs (unscored tokens) give a ratio of 1, as in TRL.
    ratio = torch.exp(torch.nan_to_num((logps - sampling) * mask, nan=0.0))
    ratio = torch.clamp(ratio, min=trainer.vllm_importance_sampling_clip_min,
                        max=trainer.vllm_importance_sampling_clip_max)
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    gather = trainer.accelerator.gather
    zero = torch.tensor(0.0, device=logps.device)
    flat = step_tokens(trainer, "importance_sampling_ratio", ratio[mask.bool()])
    metrics["sampling/importance_sampling_ratio/min"] = [
        nanmin(gather(flat.min() if flat.numel() else zero)).item()]
    metrics["sampling/importance_sampling_ratio/mean"] = [
        gather(flat.mean() if flat.numel() else zero).nanmean().item()]
    metrics["sampling/importance_sampling_ratio/max"] = [
        nanmax(gather(flat.max() if flat.numel() else zero)).item()]
    return ratio


def fsdp_on_cpu(trainer: Any) -> None:
    """FSDP (advanced.sharding "fsdp") on a CPU: accelerate 1.16 turns its FSDP plugin on only for
    accelerator devices (AcceleratorState: DistributedType.FSDP is set in the branch of MULTI_GPU and
    its kin, never for MULTI_CPU), and a job of several CPU processes would then silently train as DDP.
    torch's FSDP2 (fully_shard) runs on a CPU over gloo, so the trainer's accelerator gets the plugin
    transformers built from the job's arguments, as accelerate would give it on a GPU: from here on
    `accelerator.prepare` shards the model with fully_shard, as on a GPU."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(f"advanced.sharding: fsdp was asked for, but accelerate set up {state.distributed_type} "
                           "without its FSDP plugin")
    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # As accelerate's AcceleratorState does on a GPU: the process-wide state names FSDP too, or the next
    # AcceleratorState() (accelerate's set_seed makes one) would read MULTI_CPU back from it.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


class _NoEngine:
    """TRL's vLLM handle for a trainer whose rollout_func generates: our Step pushes the adapters."""

    def sync_weights(self) -> None:
        pass


def trainer_class(correct_lag: bool = False, space: DiskSpace | None = None) -> Any:  # -> type[GRPOTrainer]
    """GRPOTrainer with `EpochSampler` around its train sampler, its checkpoints written through
    `space` (the job's artifact root, waiting for space when it is full); with `correct_lag` (asynchronous
    steps, prefetch.py) also with TRL's importance-sampling correction against the rollout's own
    logprobs, which TRL applies only to vLLM rollouts (`use_vllm`): it is turned on after TRL's
    setup, so TRL starts no vLLM engine of its own, and its weight sync is a no-op. The correction's
    ratio comes from the loss's own forward (`deferred_ratio`, below), not from a forward of its own.
    Without the correction the same forward still measures the sampler/trainer logprob gap
    (`logprob_gap`) whenever the rollout reported its logprobs: it costs no extra pass."""
    from trl import GRPOTrainer

    class Trainer(GRPOTrainer):
        deferred_ratio = False  # the lag ratio from the loss's own forward (`_compute_loss`)
        gap_from_old = False  # the sampler/trainer gap from TRL's old-logprob pass (several updates a step)
        _ratio_inputs: dict[str, Any] | None = None  # the loss's inputs, until its forward
        _gap_inputs: dict[str, Any] | None = None  # uncorrected: the loss's inputs, for `logprob_gap`

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.epoch_sampler: EpochSampler | None = getattr(self, "epoch_sampler", None)
            # The gap from the loss's forward is the policy's logprob of the rows trained when each
            # generation is trained on within one optimizer step (the same condition as the ratio's).
            self.measure_gap = not correct_lag and trained_at_once(self.args)
            # Else, uncorrected, TRL's old-logprob pass (it runs when a step makes several updates) gives it.
            self.gap_from_old = not correct_lag and not trained_at_once(self.args)
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
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            if self.args.fsdp_plugin_args is not None and not self.is_fsdp_enabled:
                fsdp_on_cpu(self)

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            if not self.deferred_ratio:
                output = super()._generate_and_score_completions(inputs)
                if self.gap_from_old and output.get("sampling_per_token_logps") is not None \
                        and output.get("old_per_token_logps") is not None:
                    # several updates a step: TRL's no-grad pass at generation is the generating policy
                    logprob_gap(self, output["old_per_token_logps"], output)
                return output
            self.vllm_importance_sampling_correction = False  # TRL's pass and ratio are skipped
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self.vllm_importance_sampling_correction = True

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            if self.measure_gap and inputs.get("sampling_per_token_logps") is not None:
                self._gap_inputs = inputs
                try:
                    return super()._compute_loss(model, inputs)
                finally:
                    self._gap_inputs = None
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
            gap, self._gap_inputs = self._gap_inputs, None
            if gap is not None:
                logprob_gap(self, result[0].detach(), gap)
            return result

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            if space is None:
                return super()._save_checkpoint(model, trial)
            step = self.state.global_step
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{step}"  # transformers' name
            ours = step // (self.args.num_iterations * (self.args.steps_per_generation
                                                        // self.args.gradient_accumulation_steps))
            space.write(f"step {ours}'s checkpoint", lambda: super(Trainer, self)._save_checkpoint(model, trial),
                        partial=folder)

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
