"""A whole job through the real rollout service: generation there, the adapter pushed after every
step as version = step, every completion's version checked by the trainer.

The transformers backend of the rollout server runs in the default suite; the real vLLM engine
(CPU build here, about 30 s to start) under the `vllm` marker.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest

from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.skipif(importlib.util.find_spec("services.rollout.server") is None,
                                reason="the rollout server is not built yet")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the "test" model is tiny: a second thread only adds overhead
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model() -> str:
    from rlvr.tiny.build import build_tiny_model, default_model_dir

    return build_tiny_model(default_model_dir("trainer-tests-tiny-test"), size="test").path


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
async def test_job_through_the_rollout_service(tmp_path: Path, tiny_model: str, backend: str) -> None:
    from clients.sdk import RolloutClient
    from rlvr.common.server import ServiceRunner
    from services.rollout.server import build_service
    from services.rollout.settings import RolloutSettings
    from services.trainer.config import JobConfig
    from services.trainer.rollouts import ServiceGenerator
    from services.trainer.runner import JobDeps, run_job
    from services.trainer.scorers import LocalScorer, Score, ScoreSettings

    class ShapedScorer(LocalScorer):  # a length term, so that rewards differ within groups
        def score(self, completions: Any, ground_truths: Any) -> list[Score]:
            return [Score(s.reward + len(c) / 100, s.accuracy, s.format)
                    for s, c in zip(super().score(completions, ground_truths), completions, strict=True)]

    settings = RolloutSettings(port=0, model=tiny_model, backend=backend, adapter_root=tmp_path / "rollout",
                               max_model_len=512, memory_fraction=0.1)
    async with ServiceRunner(build_service(settings), settings) as runner:
        job = JobConfig(job_id=f"ro-{backend}", base_model=tiny_model, artifact_root=tmp_path / "artifacts",
                        group_size=4, batch_size=8, max_completion_tokens=32, lora_rank=4, lora_alpha=64,
                        learning_rate=1e-3, max_steps=3, loss_type="dapo", generation_backend="vllm",
                        synthetic_prompts=16)
        events: list[C.MetricEvent] = []
        generator = ServiceGenerator(runner.address)
        deps = JobDeps(scorer=ShapedScorer(ScoreSettings("math_pairs")), publish=events.append, generator=generator)
        result = await asyncio.to_thread(run_job, job, deps)
        generator.close()
        assert result.status == "completed", result.error
        assert [e.adapter_version for e in events] == [0, 1, 2] and all(e.sync_seconds > 0 for e in events)
        with RolloutClient(runner.address) as client:
            live = {a.name: a.version for a in (await asyncio.to_thread(client.list_adapters)).adapters}
        assert live.get(job.adapter_name) == 3  # the final adapter stays live for benchmarks

        # The same job id again starts over at version 1 (its stale versions are unloaded first).
        cancel = threading.Event()
        again = await asyncio.to_thread(run_job, job, JobDeps(
            scorer=ShapedScorer(ScoreSettings("math_pairs")), publish=lambda e: None,
            generator=ServiceGenerator(runner.address), cancel=cancel, on_step=lambda s, t: cancel.set()))
        assert again.status == "cancelled" and again.steps_done == 1, again.error

