"""The trainer's clients of the other services, over real gRPC.

- `ServiceGenerator` against a scripted RolloutService (the wire protocol: token-id prompts, n per
  prompt, the explicit adapter selector, LoadAdapter header + chunks, stamps checked, FINISH_REASON
  _LENGTH as clipped) and, once `services/rollout/server.py` exists, a whole job against the real
  rollout server (transformers backend here; vLLM under the `vllm` marker).
- `ServiceScorer` against the real reward service, when it exists.

Both go through the typed sync clients of rlvr.peers; a failed call is one line naming the service,
its address and the call. `ScriptedRollout` also serves tests/test_peers.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlvr.common.settings import ServiceSettings
from rlvr.peers.types import AdapterTag, Sampling
from rlvr.services.common.server import ServiceRunner
from rlvr.services.trainer.job.rollouts import AdapterVersionMismatch, RolloutError, ServiceGenerator
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import rollout_pb2 as R
from rlvr.v1 import rollout_pb2_grpc


class ScriptedRollout(rollout_pb2_grpc.RolloutServiceServicer):
    """Stamps completions with its live version; `ignore_upload` drops one upload silently."""

    def __init__(self, ignore_upload: int | None = None) -> None:
        self.live: dict[str, int] = {}
        self.uploads: list[tuple[str, int, dict[str, int]]] = []
        self.requests: list[R.GenerateRequest] = []
        self.deadlines: dict[str, float | None] = {}
        self.ignore_upload = ignore_upload

    async def Generate(self, request: R.GenerateRequest, context: Any) -> AsyncIterator[R.GenerateResponse]:
        self.requests.append(request)
        self.deadlines["Generate"] = context.time_remaining()
        name = request.adapter.name
        version = self.live.get(name, 0) if name else 0
        if request.adapter.version and request.adapter.version != version:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{name} v{request.adapter.version} is not live")
        for p, prompt in reversed(list(enumerate(request.prompts))):  # out of order, as streams may be
            yield R.GenerateResponse(completions=[
                R.Completion(prompt_index=p, sample_index=s, token_ids=[5 + s, 7], logprobs=[-0.5, -0.25],
                             finish_reason=C.FINISH_REASON_LENGTH if s == 0 else C.FINISH_REASON_STOP,
                             adapter_name=name, adapter_version=version,
                             prompt_token_ids=list(prompt.token_ids.ids))
                for s in range(request.n)])

    async def LoadAdapter(self, request_iterator: AsyncIterator[R.LoadAdapterRequest], context: Any) -> R.AdapterInfo:
        header, sizes = None, {}
        async for message in request_iterator:
            if message.HasField("header"):
                header = message.header
            else:
                sizes[message.chunk.path] = sizes.get(message.chunk.path, 0) + len(message.chunk.data)
        assert header is not None and sum(sizes.values()) == header.total_size
        self.uploads.append((header.name, header.version, sizes))
        if header.version != self.ignore_upload:
            self.live[header.name] = header.version
        return R.AdapterInfo(name=header.name, version=header.version)

    async def UnloadAdapter(self, request: R.UnloadAdapterRequest, context: Any) -> R.UnloadAdapterResponse:
        if request.name not in self.live:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown adapter {request.name}")
        return R.UnloadAdapterResponse(name=request.name, version=self.live.pop(request.name))

    async def GetInfo(self, request: R.GetInfoRequest, context: Any) -> R.RolloutInfo:
        return R.RolloutInfo(model="some/model", backend="scripted", max_model_len=512)

    async def ListAdapters(self, request: R.ListAdaptersRequest, context: Any) -> R.ListAdaptersResponse:
        return R.ListAdaptersResponse(adapters=[R.AdapterInfo(name=n, version=v) for n, v in self.live.items()])


class _Service:
    def __init__(self, servicer: ScriptedRollout) -> None:
        self.servicer = servicer
        self.service_names = ["rlvr.v1.RolloutService"]

    def register(self, server: grpc.aio.Server) -> None:
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def _adapter(tmp_path: Path) -> Path:
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x" * 3000)
    return tmp_path


async def test_service_generator_speaks_the_rollout_contract(tmp_path: Path) -> None:
    import asyncio

    servicer = ScriptedRollout(ignore_upload=2)
    async with ServiceRunner(_Service(servicer), ServiceSettings(port=0)) as runner:
        generator = ServiceGenerator(runner.address)

        def flow() -> None:
            assert generator.info().model == "some/model"
            generator.forget("job-a")  # NOT_FOUND is fine: nothing to clear
            sampling = Sampling(group_size=3, max_tokens=32, temperature=1.0, seed=7)
            batch = generator.generate([[1, 2], [3, 4, 5]], sampling, AdapterTag("", 0))
            assert batch.prompt_ids == [[1, 2]] * 3 + [[3, 4, 5]] * 3
            assert batch.completion_ids == [[5, 7], [6, 7], [7, 7]] * 2
            assert batch.clipped == [True, False, False] * 2 and batch.logprobs == [[-0.5, -0.25]] * 6
            request = servicer.requests[-1]
            assert request.n == 3 and request.sampling.seed == 7 and request.sampling.max_tokens == 32

            generator.publish_adapter(_adapter(tmp_path), AdapterTag("job-a", 1))
            assert servicer.uploads[-1] == ("job-a", 1, {"adapter_config.json": 2, "adapter_model.safetensors": 3000})
            generator.generate([[1]], sampling, AdapterTag("job-a", 1))
            generator.publish_adapter(tmp_path, AdapterTag("job-a", 2))  # the server drops it silently
            with pytest.raises(RolloutError) as caught:  # the explicit selector already refuses
                generator.generate([[1]], sampling, AdapterTag("job-a", 2))
            assert str(caught.value) == (f"rollout service at {runner.address}: Generate failed: NOT_FOUND: "
                                         "job-a v2 is not live")
            assert caught.value.code == grpc.StatusCode.NOT_FOUND
            generator.close()

        await asyncio.to_thread(flow)


async def test_stamps_are_checked_even_when_the_server_serves_latest(tmp_path: Path) -> None:
    """A server that ignored the requested version would still be caught by the stamps."""
    import asyncio

    class Lenient(ScriptedRollout):
        async def Generate(self, request: R.GenerateRequest, context: Any) -> AsyncIterator[R.GenerateResponse]:
            request.adapter.version = 0  # serve whatever is live
            async for response in super().Generate(request, context):
                yield response

    servicer = Lenient(ignore_upload=2)
    async with ServiceRunner(_Service(servicer), ServiceSettings(port=0)) as runner:
        generator = ServiceGenerator(runner.address)

        def flow() -> None:
            sampling = Sampling(group_size=2, max_tokens=32, temperature=1.0)
            generator.publish_adapter(_adapter(tmp_path), AdapterTag("job-a", 1))
            generator.publish_adapter(tmp_path, AdapterTag("job-a", 2))
            generator.step = 3
            with pytest.raises(AdapterVersionMismatch, match="step 3: completion 0 .* job-a v1, expected job-a v2"):
                generator.generate([[1]], sampling, AdapterTag("job-a", 2))
            generator.close()

        await asyncio.to_thread(flow)


@pytest.mark.skipif(importlib.util.find_spec("rlvr.services.reward.server") is None, reason="reward service not built yet")
async def test_service_scorer_against_the_reward_service() -> None:
    import asyncio

    from rlvr.peers.types import Score, ScoreInput
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.services.trainer.job.scorers import ScoreError, ScoreSettings, ServiceScorer

    settings = RewardSettings(port=0)
    async with ServiceRunner(build_service(settings), settings) as runner:
        scorer = ServiceScorer(runner.address, ScoreSettings("math_pairs", True, 0.2))
        scores = await asyncio.to_thread(
            scorer.score, [ScoreInput("<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>", "77"),
                           ScoreInput("76", "77")])
        scorer.close()
        refused = ServiceScorer(runner.address, ScoreSettings("math_pairs", True, 2.0))  # weight out of range
        with pytest.raises(ScoreError) as caught:
            await asyncio.to_thread(refused.score, [ScoreInput("76", "77")])
        refused.close()
    assert scores == [Score(pytest.approx(1.2), 1.0, 1.0, True, "77", {"math_pairs": 1.0}),
                      Score(0.0, 0.0, 0.0, False, "76", {"math_pairs": 0.0})]
    message = str(caught.value)
    assert message.startswith(f"reward service at {runner.address}: Score failed: INVALID_ARGUMENT: format_bonus_weight")
    assert "\n" not in message
