"""Asynchronous steps (advanced.max_async_steps, services/trainer/job/prefetch.py) through the real
rollout service (its transformers backend): the next step's generation starts before the current
step's update ends, every trained completion is within the bound, the step's policy lag is
published, and the prompts are the synchronous run's. With 0 nothing changes (the other trainer
tests run that way)."""

from __future__ import annotations

import asyncio
import importlib.util
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from test_trainer_rollout import ShapedScorer, rollout_service

from rlvr.v1 import common_pb2 as C

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/fixtures_trainer.py
    pytest.mark.skipif(importlib.util.find_spec("rlvr.services.rollout.server") is None,
                       reason="the rollout server is not built yet"),
]


def _job(tmp_path: Path, model: str, k: int, **fields: Any) -> Any:
    from rlvr.services.trainer.job.config import job_config

    values: dict[str, Any] = dict(group_size=4, batch_size=8, max_completion_tokens=32, lora_rank=4, lora_alpha=64,
                                  learning_rate=1e-3, max_steps=4, loss_type="dapo", generation_backend="vllm",
                                  synthetic_prompts=16, max_async_steps=k)
    values.update(fields)
    return job_config(job_id=f"async-{k}", base_model=model, artifact_root=tmp_path / f"artifacts-{k}", **values)


class Recorded:
    """Every published step's record and prompts, and every TRL batch's importance-sampling use."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rlvr.services.trainer.job.step import Step

        self.records: list[Any] = []
        self.prompts: dict[int, list[str]] = {}
        self.pushes: list[tuple[int, float, float]] = []  # (version, start, end)
        self.logs: list[dict[str, Any]] = []  # TRL's log line of each step
        publish, push = Step.publish, Step.push
        recorded = self

        def on_publish(step: Step, logs: dict[str, Any]) -> None:
            recorded.records.append(step.record)
            recorded.prompts[step.number] = list(step.prompts)
            recorded.logs.append(dict(logs))
            publish(step, logs)

        def on_push(step: Step, model: Any) -> None:
            import time

            started = time.perf_counter()
            push(step, model)
            recorded.pushes.append((step.number, started, time.perf_counter()))

        monkeypatch.setattr(Step, "publish", on_publish)
        monkeypatch.setattr(Step, "push", on_push)


async def _sync_then_async(tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch, **fields: Any
                           ) -> list[tuple[list[C.MetricEvent], Recorded]]:
    """The job (`_job` with `fields`) trained twice through one rollout server, synchronously
    (max_async_steps 0) then one step ahead (1): each run's MetricEvents and what it recorded."""
    runs: list[tuple[list[C.MetricEvent], Recorded]] = []
    async with rollout_service(tmp_path, tiny_model, "transformers") as address:
        for k in (0, 1):
            with monkeypatch.context() as patch:
                recorded = Recorded(patch)
                events: list[C.MetricEvent] = []
                result = await _train(_job(tmp_path, tiny_model, k, **fields), address, events)
                assert result.status == "completed", result.error
                runs.append((events, recorded))
    return runs


async def _train(job: Any, address: str, events: list[C.MetricEvent]) -> Any:
    from rlvr.services.trainer.job.rollouts import ServiceGenerator
    from rlvr.services.trainer.job.runner import JobDeps, run_job

    generator = ServiceGenerator(address)
    try:
        return await asyncio.to_thread(run_job, job, JobDeps(scorer=ShapedScorer(), generator=generator,
                                                             publish=events.append))
    finally:
        generator.close()


@pytest.mark.parametrize("dynamic", [False, True], ids=["plain", "dynamic-sampling"])
async def test_one_async_step_overlaps_generation_with_the_update_within_the_bound(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch, dynamic: bool
) -> None:
    (sync_events, sync), (async_events, overlapped) = await _sync_then_async(
        tmp_path, tiny_model, monkeypatch, dynamic_sampling=dynamic)
    # Synchronous: each step generates from the adapter the step before pushed, after that push.
    assert [e.adapter_version for e in sync_events] == [0, 1, 2, 3]
    assert [e.policy_lag for e in sync_events] == [0, 0, 0, 0]
    for before, after in pairwise(sync.records):
        assert after.generate_started_at > before.optimizer_done_at
    # One step ahead: step n+1's generation starts before step n's update ends, from version n-1
    # (or newer); no trained completion is older than the bound.
    assert [e.step for e in async_events] == [1, 2, 3, 4]
    for before, after in pairwise(overlapped.records):
        assert after.generate_started_at < before.optimizer_done_at, (before, after)
    assert all(e.step - 1 - e.adapter_version == e.policy_lag <= 1 for e in async_events), async_events
    assert [e.policy_lag for e in async_events][:2] == [0, 1]
    assert sum(e.policy_lag for e in async_events) >= 2  # the overlap is real: most steps train on lagged data
    # The lag is corrected: TRL's importance-sampling ratio against the rollout's own logprobs, on
    # every step of the asynchronous run and none of the synchronous one.
    ratio = "sampling/importance_sampling_ratio/mean"
    assert all(ratio in logs and 0 < logs[ratio] <= 3.0 for logs in overlapped.logs), overlapped.logs
    assert not any(ratio in logs for logs in sync.logs)
    # The prompts each step trains on are the synchronous run's (TRL's sampler, peeked).
    if not dynamic:
        assert overlapped.prompts == sync.prompts
    # Step n+1's generation never waits for the push of version n: it starts before that push.
    for (version, start, _), after in zip(overlapped.pushes[:-1], overlapped.records[1:], strict=True):
        assert after.step == version + 1 and after.generate_started_at < start


async def test_async_steps_in_micro_batches_take_their_prefetched_prompts(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A step trained in micro-batches (engine.py `micro_batch_size`), in two passes of two mini-batches
    (advanced.num_iterations, mini_batches: four optimizer steps): TRL's sampler yields each step's
    batch once per micro-batch of every pass, and the prefetch still queues the prompts the step will
    be given (none is dropped and generated again); each step publishes one MetricEvent with its lag
    ratio, which TRL's own old-logprob pass then gives (the updates change the policy mid-step)."""
    import logging

    caplog.set_level(logging.WARNING, logger="rlvr.trainer.prefetch")
    (sync_events, sync), (async_events, overlapped) = await _sync_then_async(
        tmp_path, tiny_model, monkeypatch, micro_batch_size=2, num_iterations=2, mini_batches=2)
    assert [e.step for e in sync_events] == [e.step for e in async_events] == [1, 2, 3, 4]
    assert overlapped.prompts == sync.prompts
    # every prefetch taken (a dropped one is generated again, synchronously)
    assert "dropped the prefetched rollout" not in caplog.text
    assert [e.policy_lag for e in async_events][:2] == [0, 1]
    ratio = "sampling/importance_sampling_ratio/mean"
    assert all(0 < logs[ratio] <= 3.0 for logs in overlapped.logs), overlapped.logs


def test_the_bound_refuses_a_prefetch_older_than_max_async_steps(tmp_path: Path) -> None:
    """A prefetched rollout whose completions lag more than the bound is dropped, with the reason."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from rlvr.peers.types import BASE_MODEL
    from rlvr.services.trainer.job.prefetch import Prefetcher
    from rlvr.services.trainer.job.step import Step, StepContext, StepHooks

    job = _job(tmp_path, "rlvr-tiny-test", 1)
    ctx = StepContext(job=job, tokenizer=SimpleNamespace(), generator=SimpleNamespace(),  # type: ignore[arg-type]
                      scorer=SimpleNamespace(), hooks=StepHooks(lambda m, s: tmp_path, lambda e: None,  # type: ignore[arg-type]
                                                                SimpleNamespace()),  # type: ignore[arg-type]
                      total_steps=8, truth=None, draw=None, live=BASE_MODEL, newest=True)
    prefetch = Prefetcher(ctx, 1, 8, lambda n: None)
    try:
        stale = Step(ctx, 4)
        stale.prompts = ["p"] * 8
        stale._trained_versions([1])  # step 4 from version 1: a lag of 2
        done: Future[Any] = Future()
        done.set_result((stale, {"rows": 1}))
        prefetch.pending[4] = done
        assert prefetch.take(Step(ctx, 4), ["p"] * 8) is None
        assert prefetch.dropped == [(4, "its completions come from adapter version 1, a policy lag of 2 > "
                                        "advanced.max_async_steps 1")]
        fresh = Step(ctx, 4)
        fresh.prompts = ["p"] * 8
        fresh._trained_versions([2])
        done = Future()
        done.set_result((fresh, {"rows": 1}))
        prefetch.pending[4] = done
        taken = prefetch.take(Step(ctx, 4), ["p"] * 8)
        assert taken is not None and taken[0] is fresh and fresh.record.policy_lag == 1
        other = Step(ctx, 5)
        other.prompts = ["q"] * 8
        other._trained_versions([4])
        done = Future()
        done.set_result((other, {"rows": 1}))
        prefetch.pending[5] = done
        assert prefetch.take(Step(ctx, 5), ["p"] * 8) is None and "other prompts" in prefetch.dropped[-1][1]
    finally:
        prefetch.close()


def test_the_sampler_peeks_every_epoch_as_it_will_yield_it() -> None:
    """`EpochSampler.peek` (what the prefetch takes a later step's prompts from) gives each epoch's
    order before TRL's loop draws it, across epoch boundaries and for a resumed sampler."""
    import torch
    from trl.trainer.utils import RepeatSampler

    from rlvr.services.trainer.job.grpo_trainer import EpochSampler

    def sampler() -> EpochSampler:
        return EpochSampler(RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, seed=7))

    peeking, plain = sampler(), sampler()
    ahead = [peeking.peek(epoch) for epoch in range(4)]  # before any is drawn
    for epoch in range(4):
        if epoch < 3:
            assert peeking.peek(epoch + 1) == ahead[epoch + 1]  # peeking draws nothing
        peeking.set_epoch(epoch)
        plain.set_epoch(epoch)
        got = list(peeking)
        assert got == list(plain) == ahead[epoch] and len(got) == 18  # 3 batches of 3 prompts x 2
        assert peeking.peek(epoch) == got  # the epoch being yielded
    assert len({tuple(order) for order in ahead}) == 4  # shuffled anew every epoch
    resumed = sampler()  # a resume in epoch 3 draws the epochs before it first
    resumed.set_epoch(3)
    assert resumed.peek(3) == list(resumed) == got
    assert torch.equal(resumed.inner.generator.get_state(), peeking.inner.generator.get_state())
