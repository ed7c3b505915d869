"""The reward service over real gRPC: components kept apart, extracted answers, task data, errors."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import grpc
import pytest

from rlvr.services.common.server import ServiceRunner
from rlvr.services.reward.server import build_service
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import reward_pb2 as R
from rlvr.v1 import reward_pb2_grpc


@pytest.fixture
async def reward(tmp_path: Path):
    settings = RewardSettings(port=0, data_roots=[tmp_path])
    async with ServiceRunner(build_service(settings), settings) as runner, \
            grpc.aio.insecure_channel(runner.address) as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel), runner.address


async def test_score_components_and_answers(reward) -> None:
    stub, _ = reward
    items = [
        R.ScoreItem(completion="<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>", ground_truth="77"),
        R.ScoreItem(completion="<think>x</think><answer>76</answer>", ground_truth="77"),
        R.ScoreItem(completion="the answer is 77", ground_truth="77"),
        R.ScoreItem(completion="<think></think><answer></answer>", ground_truth="77"),
    ]
    resp = await stub.Score(R.ScoreRequest(function=C.REWARD_FUNCTION_MATH_PAIRS, items=items), timeout=30)
    got = [(r.accuracy, r.format, r.strict, r.extracted_answer) for r in resp.results]
    assert got == [(1.0, 1.0, True, "77"), (0.0, 1.0, False, "76"), (1.0, 0.0, False, "77"), (0.0, 0.0, False, "")]
    assert [round(r.reward, 6) for r in resp.results] == [1.1, 0.1, 1.0, 0.0]
    off = await stub.Score(R.ScoreRequest(function=C.REWARD_FUNCTION_MATH_PAIRS, items=items[:1], format_bonus=False),
                           timeout=30)
    assert off.results[0].reward == 1.0 and off.results[0].format == 1.0


async def test_batch_of_thousands_in_one_call(reward) -> None:
    stub, _ = reward
    items = [R.ScoreItem(completion=f"<think>t</think><answer>{i}</answer>", ground_truth=str(i % 7)) for i in range(3000)]
    resp = await stub.Score(R.ScoreRequest(function=C.REWARD_FUNCTION_GSM8K, items=items), timeout=120)
    assert len(resp.results) == 3000
    assert sum(r.accuracy for r in resp.results) == sum(1 for i in range(3000) if i == i % 7)


async def test_bad_requests_name_the_field(reward) -> None:
    stub, _ = reward
    cases = [
        (R.ScoreRequest(function=9), "function"),
        (R.ScoreRequest(format_bonus_weight=2.0), "format_bonus_weight"),
        (R.ScoreRequest(timeout_seconds=0.0), "timeout_seconds"),
    ]
    for request, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Score(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(field)


async def test_a_non_finite_column_is_named_with_every_other(reward) -> None:
    # A column is JSON, which has no NaN or infinity; a Value can carry one (ParseDict lets NaN through).
    from google.protobuf import struct_pb2

    stub, _ = reward
    listed = struct_pb2.Value()
    listed.list_value.values.add().number_value = 1.0
    listed.list_value.values.add().number_value = float("-inf")
    items = [
        R.ScoreItem(completion="77", ground_truth="77", columns={"ok": struct_pb2.Value(number_value=1.0),
                                                                 "bad": struct_pb2.Value(number_value=float("nan"))}),
        R.ScoreItem(completion="77", ground_truth="77"),
        R.ScoreItem(completion="77", ground_truth="77", columns={"weights": listed}),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Score(R.ScoreRequest(key="math_pairs", items=items), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().split("\n") == [
        "items[0].columns.bad: nan is out of range; allowed: a finite number (a column is JSON, which has no NaN "
        "or infinity)",
        "items[2].columns.weights: -inf is out of range; allowed: a finite number (a column is JSON, which has "
        "no NaN or infinity)",
    ]


async def test_a_remote_reward_down_is_answered_after_one_wait_not_one_per_retry(tmp_path: Path) -> None:
    # The reward service waits `wait_seconds` for a remote reward that is down, then answers UNAVAILABLE:
    # the SDK's channel retries UNAVAILABLE (4 times), and each retry waited again (6x the wait in all).
    from rlvr.clients.stack import free_port
    from rlvr.peers.base import RlvrError
    from rlvr.peers.clients import AsyncRewardClient

    wait_s, down = 1.0, f"127.0.0.1:{free_port()}"
    settings = RewardSettings(port=0, data_roots=[tmp_path],
                              remote_rewards={"remote_down": {"address": down, "wait_seconds": wait_s}})
    async with ServiceRunner(build_service(settings), settings) as runner:
        client = AsyncRewardClient(runner.address)  # as the SDK's: the channel retries UNAVAILABLE
        try:
            started = time.monotonic()
            with pytest.raises(RlvrError) as err:
                await client.score(R.ScoreRequest(key="remote_down", items=[R.ScoreItem(completion="1",
                                                                                       ground_truth="1")]),
                                   timeout=60)
            took = time.monotonic() - started
        finally:
            await client.close()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert wait_s <= took < 2 * wait_s + 0.5, f"{took:.1f} s for a remote reward waited for {wait_s:g} s"
    assert f"remote reward 'remote_down' at {down} is unreachable after 1 s" in err.value.details, err.value.details


async def test_problems_and_dataset_errors(reward, tmp_path: Path) -> None:
    stub, _ = reward
    train = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_MATH_PAIRS, limit=16, seed=3),
                                   timeout=30)
    held = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_MATH_PAIRS,
                                                       split=R.PROBLEM_SPLIT_HELDOUT, limit=50), timeout=30)
    assert len(train.problems) == 16 and len(held.problems) == 50 and "<answer>" in train.instruction
    assert not {p.question for p in train.problems} & {p.question for p in held.problems}
    gsm = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_GSM8K, split=R.PROBLEM_SPLIT_HELDOUT,
                                                      limit=5, dataset="ignored/data"), timeout=30)
    assert gsm.problems[0].ground_truth == "18" and "ignored" in gsm.warnings[0]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "1+1?", "ground_truth": "2"}) + "\n")
    ok = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_BOXED, dataset=str(good)), timeout=30)
    assert ok.problems[0].ground_truth == "2"
    for dataset, needle in ((str(bad), "question"), ("/etc/passwd", "outside"), ("", "dataset")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_BOXED, dataset=dataset), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details(), err.value.details()


async def test_problems_honour_the_dataset_split(reward, tmp_path: Path) -> None:
    stub, _ = reward
    folder = tmp_path / "set"
    folder.mkdir()
    for split, n in (("train", 3), ("test", 2), ("dev", 1)):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"prompt": f"{split} {i}?", "ground_truth": str(i)}) + "\n" for i in range(n)))
    boxed = C.REWARD_FUNCTION_BOXED

    async def questions(**fields: object) -> list[str]:
        resp = await stub.GetProblems(R.GetProblemsRequest(function=boxed, dataset=str(folder), **fields), timeout=30)
        return [p.question for p in resp.problems]

    assert sorted(await questions()) == ["train 0?", "train 1?", "train 2?"]  # TRAIN: "train" by default
    assert await questions(split=R.PROBLEM_SPLIT_HELDOUT) == ["test 0?", "test 1?"]  # HELDOUT: "test", in order
    assert await questions(split=R.PROBLEM_SPLIT_HELDOUT, dataset_split="dev") == ["dev 0?"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await questions(dataset_split="validation")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("dataset_split: 'validation' is not a split of") and \
        err.value.details().endswith("it has: dev, test, train")
    gsm_test = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_GSM8K, dataset_split="test",
                                                           limit=1), timeout=30)
    gsm_held = await stub.GetProblems(R.GetProblemsRequest(function=C.REWARD_FUNCTION_GSM8K, limit=1,
                                                           split=R.PROBLEM_SPLIT_HELDOUT), timeout=30)
    assert gsm_test.problems[0].id.startswith("gsm8k/test/") and gsm_held.problems[0].id == "gsm8k/test/0"


async def test_cli_scores_a_batch(reward) -> None:
    _, address = reward
    request = {"function": "REWARD_FUNCTION_MATH_PAIRS",
               "items": [{"completion": "<think>a</think><answer>12</answer>", "ground_truth": "12"}]}
    # The server runs on this test's event loop: the CLI must run without blocking it.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlvr.clients.cli", "call", "reward", "Score", json.dumps(request), "--address", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, stderr.decode()
    result = json.loads(stdout)["results"][0]
    assert result["accuracy"] == 1.0 and result["extracted_answer"] == "12" and result["format"] == 1.0
