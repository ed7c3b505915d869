"""The code reward through the real reward service: its bundled tasks from GetProblems (with each
row's tests), and completions scored in the sandbox, hostile ones to 0 with their reason, the
service healthy after them."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlvr.peers.types import columns_of
from rlvr.services.common.server import ServiceRunner
from rlvr.services.reward.server import build_service
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import reward_pb2 as R
from rlvr.v1 import reward_pb2_grpc


def block(code: str) -> str:
    return f"<think>write it</think><answer>```python\n{code}\n```</answer>"


async def test_code_tasks_and_their_scores_through_the_reward_service(tmp_path: Path) -> None:
    settings = RewardSettings(port=0, data_roots=[tmp_path])
    async with ServiceRunner(build_service(settings), settings) as runner, \
            grpc.aio.insecure_channel(runner.address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        problems = (await stub.GetProblems(R.GetProblemsRequest(key="code", split=R.PROBLEM_SPLIT_HELDOUT, limit=3),
                                           timeout=60)).problems
        assert len(problems) == 3 and all(columns_of(p.columns)["tests"] for p in problems)
        task = problems[0]
        tests = columns_of(task.columns)["tests"]
        name = task.ground_truth.split("(")[0].removeprefix("def ").strip()
        items = [block(task.ground_truth),                                  # the reference: all pass
                 block(f"def {name}(*args):\n    return None"),             # wrong on every test
                 block("while True:\n    pass"),                            # an infinite loop
                 block("import os\nwhile True:\n    os.fork()"),            # a fork bomb
                 "no code here"]
        request = R.ScoreRequest(key="code", items=[R.ScoreItem(completion=c, ground_truth=task.ground_truth,
                                                                prompt=task.question, columns=task.columns)
                                                    for c in items])
        results = (await stub.Score(request, timeout=120)).results
        assert [r.accuracy for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0]
        assert results[0].strict and results[0].components["code.all_passed"] == 1.0
        assert results[0].note == f"code: {len(tests)} of {len(tests)} tests passed"
        assert results[1].note == f"code: 0 of {len(tests)} tests passed" and not results[1].strict
        assert results[2].note in ("code: cpu-time limit 2 s", "code: wall-time limit 5 s")
        assert results[3].note.startswith("code: blocked:"), results[3].note
        assert results[4].note == "code: no code block"
        assert not any(r.error for r in results)  # the code's fault is its score, not a reward error
        health = health_pb2_grpc.HealthStub(channel)
        status = (await health.Check(health_pb2.HealthCheckRequest(), timeout=10)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        bad = R.ScoreRequest(key="code", items=[R.ScoreItem(completion=block("x = 1"))])  # a row with no tests
        no_tests = (await stub.Score(bad, timeout=60)).results[0]
        assert no_tests.error.startswith("code: ValueError:") and no_tests.reward == 0.0


@pytest.mark.parametrize("key", ["code"])
def test_the_code_reward_is_declared_with_its_dataset_rules(key: str) -> None:
    from rlvr.rewards.registry import load_registry

    code = load_registry().get(key)
    assert (code.needs_dataset, code.accepts_dataset, code.columns, code.benchmark) == \
        (False, True, ("tests",), "code-heldout")
    assert code.score_batch is not None and code.timeout_seconds == 10.0
