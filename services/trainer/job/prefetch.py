"""Asynchronous steps (advanced.max_async_steps = k >= 1): the next steps' rollouts generated and
scored on a background thread while the current step trains.

At the end of step n's rollout the `Prefetcher` queues steps n+1 .. n+k, each with the prompts the
synchronous run would give it (TRL's own sampler, peeked: grpo_trainer.py, `EpochSampler.peek`). One
worker thread runs them in order, each a whole `Step.rollout` (generation rounds and scoring) from
the newest adapter version the rollout server serves when its request lands, so the push of step
n's adapter overlaps with generation that does not need it, and the next step's generation starts
before the current update ends (tests/test_trainer_async.py records both).

When TRL asks for step m's rows, `take` hands over the prefetched step if it was given the same
prompts and its completions are within the bound: sampled with version >= m - 1 - k, a policy lag
of at most k (a step queued at the end of step m - k's rollout starts no earlier, when version
m - k - 1 at least is live, so the bound holds by construction; the check makes it a guarantee).
Rows outside the bound, or a prefetch of other prompts, are dropped with a warning and the step is
generated again synchronously from the live policy.

The lag is corrected with importance weights (the engine turns on TRL's own correction for k >= 1:
grpo_trainer.py, `trainer_class`): the loss is weighted by exp(logp_policy - logp_rollout), per token,
truncated at 3, logp_policy from the training forward itself (grpo_trainer.py `lag_ratio`; TRL's own
extra no-grad pass computes the same numbers) (`vllm_importance_sampling_mode="token_truncate"`,
`vllm_importance_sampling_clip_max=3.0`: GRPOTrainer._generate_and_score_completions / _compute_loss in trl 1.16; the truncated importance
sampling of Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", which verl's rollout correction and prime-rl's async trainer also use). The rollout
logprobs are the rollout server's own, of the tempered distribution each token was drawn from.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlvr.services.trainer.job.step import Step, StepContext

log = logging.getLogger("rlvr.trainer.prefetch")

__all__ = ["Prefetcher"]


class Prefetcher:
    """Steps' rollouts ahead of training, at most `depth` steps ahead, on one worker thread."""

    def __init__(self, ctx: StepContext, depth: int, total_steps: int,
                 prompts_for: Callable[[int], list[str] | None]) -> None:
        self.ctx = ctx
        self.depth = depth
        self.total_steps = total_steps
        self.prompts_for = prompts_for  # a step's prompts as TRL will give them (None: unknown)
        self.pending: dict[int, Future[tuple[Step, dict[str, Any]]]] = {}
        self.dropped: list[tuple[int, str]] = []  # (step, why) of every prefetch not trained on
        # The worker's own tokenizer: TRL decodes with the trainer's on the main thread meanwhile.
        self._tokenizer = copy.deepcopy(ctx.tokenizer)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-prefetch")

    def schedule(self, after: int) -> None:
        """Queues the rollouts of steps after + 1 .. after + depth not queued yet (step `after`'s
        rollout is done)."""
        for number in range(after + 1, min(after + self.depth, self.total_steps) + 1):
            if number in self.pending:
                continue
            prompts = self.prompts_for(number)
            if prompts is None:
                break
            self.pending[number] = self._worker.submit(self._rollout, number, prompts)

    def _rollout(self, number: int, prompts: list[str]) -> tuple[Step, dict[str, Any]]:
        step = Step(self.ctx, number, tokenizer=self._tokenizer)
        return step, step.rollout(prompts)

    def take(self, step: Step, prompts: list[str]) -> tuple[Step, dict[str, Any]] | None:
        """Step `step.number`'s prefetched rollout (its Step and rows) if it can be trained on;
        None when there is none or it was dropped (the caller generates the step again)."""
        future = self.pending.pop(step.number, None)
        if future is None:
            return None
        ready, rows = future.result()  # a failed generation fails the step, as a synchronous one would
        why = ""
        if ready.prompts != prompts:
            why = "TRL's sampler gave it other prompts than the prefetch expected"
        elif ready.record.policy_lag > self.depth:
            why = (f"its completions come from adapter version {ready.record.adapter_version}, a policy lag of "
                   f"{ready.record.policy_lag} > advanced.max_async_steps {self.depth}")
        if why:
            log.warning("step %d: dropped the prefetched rollout (%s); generating it again", step.number, why)
            self.dropped.append((step.number, why))
            return None
        ready.record.started = step.record.started  # the step's own time starts when TRL starts it
        if ready.record.scored_at is not None:
            ready.record.scored_at = time.perf_counter()  # its training phase starts now
        return ready, rows

    def close(self) -> None:
        """Drops what is queued and waits for the rollout in flight (at most one)."""
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()
        self._worker.shutdown(wait=True, cancel_futures=True)
