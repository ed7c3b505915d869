"""A whole job through the real rollout service: generation there, the adapter pushed after every
step as version = step, every completion's version checked by the trainer.

The transformers backend of the rollout server runs in the default suite; the real vLLM engine
(CPU build here, about 30 s to start) under the `vllm` and `slow` markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rlvr.v1 import common_pb2 as C

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/fixtures_trainer.py
    pytest.mark.skipif(importlib.util.find_spec("rlvr.services.rollout.server") is None,
                       reason="the rollout server is not built yet"),
]




BACKENDS = ["transformers", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]


class ShapedScorer:
    """Math Pairs scores plus a length term, so that rewards differ within groups of the "test" model."""

    def __init__(self) -> None:
        from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

        self.local = LocalScorer(ScoreSettings("math_pairs"))

    def score(self, items: Any) -> list[Any]:
        from rlvr.peers.types import Score

        return [Score(s.reward + len(i.completion) / 100, s.accuracy, s.format)
                for s, i in zip(self.local.score(items), items, strict=True)]

    def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def rollout_service(tmp_path: Path, model: str, backend: str) -> AsyncIterator[str]:
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.rollout.server import build_service
    from rlvr.services.rollout.settings import RolloutSettings

    settings = RolloutSettings(port=0, model=model, backend=backend, adapter_root=tmp_path / "rollout",
                               max_model_len=512, memory_fraction=0.1)
    async with ServiceRunner(build_service(settings), settings) as runner:
        yield runner.address


def _job(tmp_path: Path, model: str, backend: str, max_steps: int) -> Any:
    from rlvr.services.trainer.job.config import job_config

    return job_config(job_id=f"ro-{backend}", base_model=model, artifact_root=tmp_path / "artifacts",
                     group_size=4, batch_size=8, max_completion_tokens=32, lora_rank=4, lora_alpha=64,
                     learning_rate=1e-3, max_steps=max_steps, loss_type="dapo", generation_backend="vllm",
                     synthetic_prompts=16)


async def _run(job: Any, address: str, **deps: Any) -> Any:
    from rlvr.services.trainer.job.rollouts import ServiceGenerator
    from rlvr.services.trainer.job.runner import JobDeps, run_job

    generator = ServiceGenerator(address)
    try:
        return await asyncio.to_thread(run_job, job, JobDeps(scorer=ShapedScorer(), generator=generator, **deps))
    finally:
        generator.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_job_through_the_rollout_service(tmp_path: Path, tiny_model: str, backend: str) -> None:
    from rlvr.clients.sdk import RolloutClient

    async with rollout_service(tmp_path, tiny_model, backend) as address:
        job = _job(tmp_path, tiny_model, backend, max_steps=3)
        events: list[C.MetricEvent] = []
        result = await _run(job, address, publish=events.append)
        assert result.status == "completed", result.error
        assert [e.adapter_version for e in events] == [0, 1, 2] and all(e.sync_seconds > 0 for e in events)
        with RolloutClient(address) as client:
            live = {a.name: a.version for a in (await asyncio.to_thread(client.list_adapters)).adapters}
        assert live.get(job.adapter_name) == 3  # the final adapter stays live for benchmarks


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_rerun_of_a_job_id_starts_again_at_version_1(tmp_path: Path, tiny_model: str, backend: str) -> None:
    async with rollout_service(tmp_path, tiny_model, backend) as address:
        job = _job(tmp_path, tiny_model, backend, max_steps=2)
        first = await _run(job, address, publish=lambda e: None)
        assert first.status == "completed", first.error
        # The rerun unloads the stale versions first, then step 1 samples from the base again.
        cancel = threading.Event()
        events: list[C.MetricEvent] = []
        again = await _run(job, address, publish=events.append, cancel=cancel, on_step=lambda s, t: cancel.set())
        assert again.status == "cancelled" and again.steps_done == 1, again.error
        assert [e.adapter_version for e in events] == [0]
