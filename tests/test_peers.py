"""The asyncio typed clients of rlvr.peers against real in-process services, and the benchmark's
ServicePeers over them: the real reward service (services/reward) and the scripted rollout servicer
of tests/test_trainer_clients.py, both on the shared server runtime on a loopback port.

The sync twins of these clients are covered by tests/test_sdk.py and tests/test_trainer_clients.py;
both are built from one RPC table (rlvr/peers/base.py), which test_sdk checks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_trainer_clients import ScriptedRollout, _adapter, _Service

from rlvr.common.errors import InvalidArgument, NotFound, Unavailable
from rlvr.common.settings import ServiceSettings
from rlvr.peers.base import AsyncStream, RlvrError
from rlvr.peers.clients import AsyncRewardClient, AsyncRolloutClient
from rlvr.peers.types import AdapterTag, Sampling, Score, generate_request, score_request, token_prompt
from rlvr.services.benchmark.peers import ServicePeers, failure
from rlvr.services.benchmark.runner import EvaluationError, Question
from rlvr.services.common.server import ServiceRunner
from rlvr.services.reward.server import build_service
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import reward_pb2 as R

RIGHT = "<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>"


@pytest.fixture
async def reward_address(tmp_path: Path) -> AsyncIterator[str]:
    settings = RewardSettings(port=0, data_roots=[tmp_path])
    async with ServiceRunner(build_service(settings), settings) as runner:
        yield runner.address


@pytest.fixture
async def rollout() -> AsyncIterator[tuple[ScriptedRollout, str]]:
    servicer = ScriptedRollout()
    async with ServiceRunner(_Service(servicer), ServiceSettings(port=0)) as runner:
        yield servicer, runner.address


async def test_async_reward_client_against_the_reward_service(reward_address: str) -> None:
    async with AsyncRewardClient(reward_address) as reward:
        response = await reward.score(score_request("math_pairs", [(RIGHT, "77"), ("76", "77")]))
        assert [Score.of(r) for r in response.results] == [
            Score(pytest.approx(1.1), 1.0, 1.0, True, "77", {"math_pairs": 1.0}),
            Score(0.0, 0.0, 0.0, False, "76", {"math_pairs": 0.0})]
        names = [f.display_name for f in (await reward.list_reward_functions()).functions]
        assert "Math Pairs (synthetic)" in names  # no request: the empty message

        with pytest.raises(RlvrError) as caught:  # a refusal: the server's code and message
            await reward.score(R.ScoreRequest(function=C.REWARD_FUNCTION_MATH_PAIRS, format_bonus_weight=2.0))
        error = caught.value
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.details.startswith("format_bonus_weight")
        assert (error.method, error.address) == ("rlvr.v1.RewardService/Score", reward_address)
        assert error.describe().startswith(f"reward service at {reward_address}: Score failed: INVALID_ARGUMENT: ")
        assert error.__cause__ is None and error.__suppress_context__

        big = score_request("gsm8k", [(f"<answer>{i}</answer>", str(i)) for i in range(20_000)])
        with pytest.raises(RlvrError) as caught:  # the deadline given is the deadline kept
            await reward.score(big, timeout=0.001)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_async_rollout_client_streams_with_a_deadline(rollout: tuple[ScriptedRollout, str]) -> None:
    servicer, address = rollout
    request = generate_request([token_prompt([1, 2]), token_prompt([3])], Sampling(group_size=2, seed=5),
                               AdapterTag())
    async with AsyncRolloutClient(address, timeout=7) as client:
        stream = client.generate(request)
        assert isinstance(stream, AsyncStream)
        completions = [c async for response in stream for c in response.completions]
        assert sorted((c.prompt_index, c.sample_index) for c in completions) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        # A stream keeps its own default (the client's timeout is for unary calls and uploads) ...
        assert 590 < servicer.deadlines["Generate"] <= 601
        async for _ in client.generate(request, timeout=3):  # ... unless the call gives one
            break
        assert 0 < servicer.deadlines["Generate"] <= 3.05

        with pytest.raises(RlvrError) as caught:  # a failed stream raises while it is read
            async for _ in client.generate(generate_request([token_prompt([1])], Sampling(), AdapterTag("x", 4))):
                pass
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert caught.value.describe() == f"rollout service at {address}: Generate failed: NOT_FOUND: x v4 is not live"


async def test_service_peers_over_the_async_clients(rollout: tuple[ScriptedRollout, str], reward_address: str,
                                                    tmp_path: Path) -> None:
    servicer, address = rollout
    peers = ServicePeers(address, reward_address, generate_timeout_s=9)
    try:
        model = await peers.rollout_model()
        assert (model.model, model.max_model_len, model.address) == ("some/model", 512, address)
        assert await peers.upload_adapter("eval-a", 1, _adapter(tmp_path)) == 1
        assert await peers.live_adapters() == {"eval-a": 1}
        problems = await peers.problems("math_pairs", 3, "", "")
        assert len(problems) == 3 and all(p.ground_truth for p in problems)

        questions = [Question(7, (("user", "q7"),), "77"), Question(8, (("user", "q8"),), "1")]
        sampling = Sampling(temperature=0.5, top_p=0.9, seed=3, top_k=7, min_p=0.05, repetition_penalty=1.2)
        answers = await peers.generate(questions, sampling, AdapterTag("eval-a", 1))
        sent = servicer.requests[-1]
        assert (sent.n, sent.sampling.top_p, sent.sampling.seed) == (1, pytest.approx(0.9), 3)
        assert (sent.sampling.top_k, sent.sampling.min_p, sent.sampling.repetition_penalty) == \
            (7, pytest.approx(0.05), pytest.approx(1.2))
        assert sent.request_id == "benchmark-q7" and sent.prompts[0].messages.messages[0].content == "q7"
        assert 0 < servicer.deadlines["Generate"] <= 9.05
        assert sorted(a.index for a in answers) == [7, 8] and {a.adapter for a in answers} == {AdapterTag("eval-a", 1)}
        assert {a.finish_reason for a in answers} == {"LENGTH"}  # sample 0 is cut off in the script

        scores = await peers.score("math_pairs", [(RIGHT, "77"), ("no", "77")])
        assert [(s.accuracy, s.strict, s.extracted_answer) for s in scores] == [(1.0, True, "77"), (0.0, False, "")]

        # While a request is checked, a refusal keeps its meaning ...
        with pytest.raises(InvalidArgument, match="dataset: required"):
            await peers.problems("boxed", 3, "", "")
        # ... while an evaluation runs, it is the evaluation's one-line cause.
        with pytest.raises(EvaluationError) as caught:
            await peers.generate(questions, Sampling(), AdapterTag("eval-a", 2))
        assert str(caught.value) == f"rollout service at {address}: Generate failed: NOT_FOUND: eval-a v2 is not live"
    finally:
        await peers.close()


async def test_an_evaluation_waits_for_a_rollout_service_that_comes_back(reward_address: str) -> None:
    """A rollout server killed mid-evaluation (every replica down) is waited for, bounded, and the
    batch generated again once it serves; one that stays away fails the batch naming it."""
    import asyncio

    from rlvr.clients.stack.ports import free_port

    port = free_port()
    address = f"127.0.0.1:{port}"
    peers = ServicePeers(address, reward_address, rollout_wait_s=60)
    questions = [Question(7, (("user", "q7"),), "77"), Question(8, (("user", "q8"),), "1")]
    try:
        waiting = asyncio.create_task(peers.generate(questions, Sampling(), AdapterTag()))
        await asyncio.sleep(2.5)
        assert not waiting.done()  # down: waited for, not failed
        async with ServiceRunner(_Service(ScriptedRollout()), ServiceSettings(port=port)):
            answers = await asyncio.wait_for(waiting, 30)
        assert sorted(a.index for a in answers) == [7, 8]

        peers.rollout_wait_s = 1.0
        with pytest.raises(EvaluationError, match=rf"^the rollout service at {address} is down and did not come "
                                                   r"back within 1 s: rollout service at .*UNAVAILABLE"):
            await peers.generate(questions, Sampling(), AdapterTag())
    finally:
        await peers.close()

    # A peer whose health says SERVING while its calls fail UNAVAILABLE (a remote reward down behind
    # the reward service, say) is asked once more on a fresh connection, then its answer stands.
    import time

    async def serving(address: str) -> str:
        return "SERVING"

    up = ServicePeers("127.0.0.1:9", reward_address, rollout_wait_s=60, health=serving)
    started = time.monotonic()
    try:
        with pytest.raises(EvaluationError, match=r"^rollout service at 127.0.0.1:9: Generate failed: UNAVAILABLE"):
            await up.generate(questions, Sampling(), AdapterTag())
        assert time.monotonic() - started < 10 and len(up._replaced) == 1  # one fresh connection, no more
    finally:
        await up.close()


async def test_service_peers_name_an_unreachable_peer(reward_address: str) -> None:
    peers = ServicePeers("127.0.0.1:9", reward_address)
    try:
        with pytest.raises(Unavailable, match=r"^the rollout service at 127.0.0.1:9 is unreachable \(UNAVAILABLE: "):
            await peers.rollout_model()  # GetInfo: retried, then given up
    finally:
        await peers.close()


def test_one_translation_of_peer_errors() -> None:
    def error(code: grpc.StatusCode) -> RlvrError:
        return RlvrError(code, "adapter x\n v2  gone", "rlvr.v1.RolloutService/Generate", "h:1")

    assert isinstance(failure(error(grpc.StatusCode.NOT_FOUND), running=False), NotFound)
    assert isinstance(failure(error(grpc.StatusCode.INVALID_ARGUMENT), running=False), InvalidArgument)
    assert isinstance(failure(error(grpc.StatusCode.DEADLINE_EXCEEDED), running=False), Unavailable)
    other = failure(error(grpc.StatusCode.INTERNAL), running=False)
    assert type(other) is RuntimeError and str(other) == "the rollout service at h:1: INTERNAL: adapter x\n v2  gone"
    running = failure(error(grpc.StatusCode.NOT_FOUND), running=True)
    assert isinstance(running, EvaluationError)
    assert str(running) == "rollout service at h:1: Generate failed: NOT_FOUND: adapter x v2 gone"  # one line


async def test_the_reward_catalog_is_asked_again_for_a_name_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark the cached catalog lacks (a Head job's head_<id>, completed a moment ago) is looked
    up again after CATALOG_RECHECK_S rather than the cache's CATALOG_TTL_S (a name no reward has is
    asked about no more often); names it has, by key or by benchmark, are answered from the cache."""
    from rlvr.rewards.registry import Catalog, RewardInfo
    from rlvr.services.benchmark import peers as module

    listed = [("math_pairs",), ("math_pairs", "head_abc")]
    calls: list[int] = []

    async def list_rewards(request: R.ListRewardFunctionsRequest, timeout: float) -> tuple[str, ...]:
        calls.append(1)
        return listed[min(len(calls), len(listed)) - 1]

    def catalog_of(keys: tuple[str, ...]) -> Catalog:
        return Catalog({k: RewardInfo(key=k, display_name=k, default_benchmark=f"{k}-heldout") for k in keys})

    peers = ServicePeers("127.0.0.1:1", "127.0.0.1:1")
    now = [100.0]
    peers.clock = lambda: now[0]
    monkeypatch.setattr(peers.reward, "list_reward_functions", list_rewards)
    monkeypatch.setattr(module, "catalog_of", catalog_of)
    try:
        assert set((await peers.rewards()).rewards) == {"math_pairs"}
        assert set((await peers.rewards(["math_pairs", "math_pairs-heldout"])).rewards) == {"math_pairs"}
        assert set((await peers.rewards(["head_abc"])).rewards) == {"math_pairs"}  # within the recheck floor
        assert len(calls) == 1  # the cache answered each
        now[0] += module.CATALOG_RECHECK_S
        assert module.CATALOG_RECHECK_S < module.CATALOG_TTL_S
        assert set((await peers.rewards(["head_abc"])).rewards) == {"math_pairs", "head_abc"}
        assert len(calls) == 2  # asked again, well inside the cache's ttl
        await peers.rewards(["head_abc-heldout"])
        assert len(calls) == 2
    finally:
        await peers.close()
