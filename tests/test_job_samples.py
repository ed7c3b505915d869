"""A job's samples of completions over the public API: GetJobSamples through a real scheduler over
gRPC with real NATS and SQLite (the samples and the steps' metrics published on the bus as a
trainer publishes them), the SDK's `samples`, `rlvr jobs samples`, and the episode view the
console and the CLI share (clients/views/episodes.py) on transcripts and episode JSON.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from rlvr.clients.views.episodes import (
    Entry,
    ending,
    from_episode,
    from_transcript,
    is_transcript,
    text_lines,
)
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

TRANSCRIPT = ("[turn 1] Let me compute.\n<tool_call>{\"name\": \"calculate\"}</tool_call>\n"
              "[tool calculate] 77\n"
              "[tool calculate] error: division by zero\n"
              "[environment] Higher: try again\n"
              "[turn 2] The answer is 77.\n"
              "[failed] the environment died")

EPISODE = {"turns": [{"assistant": "Let me compute.", "tool_calls": [
    {"name": "calculate", "arguments": {"expression": "7*11"}, "result": "77", "error": "", "seconds": 0.01},
    {"name": "calculate", "arguments": {"expression": "1/0"}, "result": "", "error": "division by zero",
     "seconds": 0.0}], "reply": None, "reward": None, "adapter_version": 3, "sampled_tokens": 21,
    "observation_tokens": 5, "finish_reason": "stop"},
    {"assistant": "<answer>77</answer>", "tool_calls": [], "reply": "Correct!", "reward": 0.5,
     "adapter_version": 3, "sampled_tokens": 9, "observation_tokens": 0, "finish_reason": "length"}],
    "ended_by": "answer", "error": "", "truncated": True, "tool_calls": 2, "tool_errors": 1, "state": {},
    "seconds": 0.2}


# ---------------------------------------------------------------- the episode view


def test_a_transcript_reads_turn_by_turn() -> None:
    entries = from_transcript(TRANSCRIPT)
    assert [(e.kind, e.label) for e in entries] == [
        ("assistant", "Turn 1"), ("tool", "Tool calculate"), ("tool", "Tool calculate"),
        ("environment", "Environment"), ("assistant", "Turn 2"), ("failed", "Failed")]
    assert entries[0].text == 'Let me compute.\n<tool_call>{"name": "calculate"}</tool_call>'  # a turn over 2 lines
    assert entries[1] == Entry("tool", "Tool calculate", "77")
    assert entries[2].error and entries[2].text == "error: division by zero"
    assert entries[3].text == "Higher: try again" and not entries[3].error
    assert entries[5].error and entries[5].text == "the environment died"
    assert is_transcript(TRANSCRIPT) and not is_transcript("<answer>4</answer>")
    assert from_transcript("") == []
    assert from_transcript("plain\ntext") == [Entry("text", "", "plain\ntext")]
    assert text_lines(entries[:2]) == ["Turn 1: Let me compute.\n    <tool_call>{\"name\": \"calculate\"}</tool_call>",
                                       "Tool calculate: 77"]


def test_an_episode_json_reads_turn_by_turn_with_its_details() -> None:
    entries = from_episode(json.dumps(EPISODE))
    assert [(e.kind, e.label) for e in entries] == [
        ("assistant", "Turn 1"), ("tool", "Tool calculate"), ("tool", "Tool calculate"),
        ("assistant", "Turn 2"), ("environment", "Environment")]
    assert entries[0].detail == "21 tokens"
    assert entries[1].text == "77" and entries[1].detail == '{"expression": "7*11"}' and not entries[1].error
    assert entries[2].error and entries[2].text == "error: division by zero"
    assert entries[3].detail == "9 tokens · cut (length) · reward 0.5"
    assert entries[4].text == "Correct!"
    assert ending(json.dumps(EPISODE)) == "2 turns, ended by answer, 2 tool calls (1 failed), truncated"
    failed = from_episode({"turns": [], "error": "reset raised"})
    assert failed == [Entry("failed", "Failed", "reset raised", error=True)]
    assert from_episode("") == [] and from_episode("not json") == [] and from_episode('{"x": 1}') == []
    assert ending("") == ""


# ---------------------------------------------------------------- through the real service


def _samples(job_id: str, step: int, transcript: bool = False) -> C.CompletionSamples:
    event = C.CompletionSamples(job_id=job_id, step=step)
    for i in range(2):
        event.samples.add(prompt=f"<|user|>\nquestion {step}.{i}", completion=TRANSCRIPT if transcript else
                          f"<answer>{step}{i}</answer>", reward=0.25 * i + step / 10, accuracy=float(i))
    return event


async def test_get_job_samples_over_grpc_sdk_and_cli(nats_server, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures_infra import connected_bus

    from rlvr.clients import cli
    from rlvr.clients.sdk import RlvrError, SchedulerClient
    from rlvr.infra.subjects import job_metrics_subject, job_samples_subject, metric_msg_id, samples_msg_id
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.scheduler.samples import sample_rows, samples_by_step
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                 nats_url=nats_server.url, artifact_root=tmp_path / "artifacts",
                                 trainer_addresses=["127.0.0.1:1"])
    async with ServiceRunner(build_service(settings), settings) as runner, connected_bus(nats_server.url) as bus:
        client = SchedulerClient(runner.address)
        spec = C.JobSpec(name="samples-grpc")
        spec.grpo.max_steps = 8
        job = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=spec))).job

        def ask(**fields: int) -> S.GetJobSamplesResponse:
            return client.get_job_samples(S.GetJobSamplesRequest(job_id=job.id, **fields))

        empty = await asyncio.to_thread(ask)
        assert empty.job_id == job.id and not empty.steps and empty.environment == ""

        # Steps 1-7 published as the trainer does (samples, then the step's metrics); step 3's
        # samples never came (a step without samples is left out, not an error).
        for step in range(1, 8):
            if step != 3:
                await bus.publish(job_samples_subject(job.id, step), _samples(job.id, step).SerializeToString(),
                                  samples_msg_id(job.id, step))
            event = C.MetricEvent(job_id=job.id, step=step, total_steps=8, reward_mean=0.5, accuracy=0.5)
            await bus.publish(job_metrics_subject(job.id), event.SerializeToString(), metric_msg_id(job.id, step))
        for _ in range(200):
            if len((await asyncio.to_thread(client.get_job_metrics, S.GetJobMetricsRequest(job_id=job.id))).series) == 7:
                break
            await asyncio.sleep(0.05)

        latest = await asyncio.to_thread(ask)  # the latest 5 stored steps, newest first
        assert [e.step for e in latest.steps] == [7, 6, 5, 4]  # 3 has none
        assert latest.steps[0].samples[1] == C.CompletionSample(prompt="<|user|>\nquestion 7.1",
                                                                 completion="<answer>71</answer>",
                                                                 reward=0.25 + 0.7, accuracy=1.0)
        assert [e.step for e in (await asyncio.to_thread(ask, limit=2)).steps] == [7, 6]
        assert [e.step for e in (await asyncio.to_thread(ask, limit=100)).steps] == [7, 6, 5, 4, 2, 1]
        assert [e.step for e in (await asyncio.to_thread(ask, step=2)).steps] == [2]
        assert not (await asyncio.to_thread(ask, step=3)).steps
        assert [e.step for e in await asyncio.to_thread(client.samples, job.id, limit=1)] == [7]

        # The tracking bridge reads the same code: each step's table rows.
        by_step = await samples_by_step(bus, job.id, [1, 3, 9])
        assert sorted(by_step) == [1]
        assert sample_rows(1, by_step[1])[0] == {"step": 1, "prompt": "<|user|>\nquestion 1.0",
                                                 "completion": "<answer>10</answer>", "reward": 0.1, "accuracy": 0.0}

        for bad, word in (({"step": -1}, "step: -1"), ({"limit": 101}, "limit: 101")):
            with pytest.raises(RlvrError) as refused:
                await asyncio.to_thread(ask, **bad)
            assert refused.value.code.name == "INVALID_ARGUMENT" and word in refused.value.details
        with pytest.raises(RlvrError) as missing:
            await asyncio.to_thread(client.get_job_samples, S.GetJobSamplesRequest(job_id="nosuchjob"))
        assert missing.value.code.name == "NOT_FOUND" and "nosuchjob" in missing.value.details

        # A job with an environment: its samples' completions are transcripts, and the answer says so.
        agent = C.JobSpec(name="samples-agent")
        agent.environment.key = "calculator"
        agent_job = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=agent))).job
        await bus.publish(job_samples_subject(agent_job.id, 1),
                          _samples(agent_job.id, 1, transcript=True).SerializeToString(), samples_msg_id(agent_job.id, 1))
        episodes = await asyncio.to_thread(client.get_job_samples, S.GetJobSamplesRequest(job_id=agent_job.id, step=1))
        assert episodes.environment == "calculator" and episodes.steps[0].samples[0].completion == TRANSCRIPT

        # The CLI: the latest steps, then one step; a step without samples says why, exit 1.
        address = runner.address
        code = await asyncio.to_thread(cli.main, ["jobs", "samples", job.id, "--limit", "2", "--address", address])
        out = capsys.readouterr().out
        assert code == 0 and out.index("step 7: 2 sample(s)") < out.index("step 6: 2 sample(s)")
        assert "#2 reward 0.950, accuracy 1.000" in out and "prompt: … question 7.1" in out
        assert "completion: <answer>71</answer>" in out and "step 5" not in out
        code = await asyncio.to_thread(cli.main, ["jobs", "samples", job.id, "--step", "3", "--address", address])
        assert code == 1 and "no samples of completions for job" in capsys.readouterr().err
        code = await asyncio.to_thread(cli.main, ["jobs", "samples", "nosuchjob", "--address", address])
        assert code == 1 and "NOT_FOUND" in capsys.readouterr().err
        client.close()


def test_the_cli_shows_an_episode_turn_by_turn() -> None:
    from rlvr.clients.commands.jobs import print_samples

    resp = S.GetJobSamplesResponse(job_id="j1", environment="calculator", steps=[_samples("j1", 4, transcript=True)])
    out = io.StringIO()
    print_samples(resp, out)
    text = out.getvalue()
    assert "step 4: 2 sample(s)" in text
    assert "    Turn 1: Let me compute.\n        <tool_call>" in text
    assert "    Tool calculate: 77\n" in text and "    Tool calculate: error: division by zero\n" in text
    assert "    Environment: Higher: try again\n" in text and "    Failed: the environment died\n" in text
    assert "completion:" not in text
