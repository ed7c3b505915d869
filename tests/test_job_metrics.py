"""The RL Metrics card (GetJobMetrics) and the history export from known metric points.

The pure functions of services/scheduler/metrics_card.py against hand-computed trends and tiles
(rising, falling, flat, a 1-step and a 5-step run, KL and entropy present or not, no step yet),
then once through a real scheduler over gRPC with real NATS and SQLite: the points arrive as
metric events on the bus, exactly as a trainer publishes them.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from pathlib import Path

import pytest
from google.protobuf import json_format

from rlvr.infra.schema import JobRow, MetricPointRow
from rlvr.services.scheduler.metrics_card import (
    EXPORT_COLUMNS,
    FLAT_THRESHOLD,
    compute_trend,
    export_history,
    job_metrics,
    trend_window,
)
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

RISING, FALLING, FLAT = S.TREND_DIRECTION_RISING, S.TREND_DIRECTION_FALLING, S.TREND_DIRECTION_FLAT


def _job(status: str = "COMPLETED", total: int = 0) -> JobRow:
    return JobRow(id=uuid.uuid4().hex[:12], status=status, total_steps=total)


def _points(job: JobRow, rewards: list[float], accuracies: list[float] | None = None,
            kl: bool = False, entropy: bool = False) -> list[MetricPointRow]:
    accuracies = accuracies if accuracies is not None else [r / 2 for r in rewards]
    return [MetricPointRow(job_id=job.id, step=i + 1, total_steps=len(rewards), reward_mean=r,
                           accuracy=a, format=0.5, loss=1.0 / (i + 1), completion_length_mean=10.0 + i,
                           kl=0.01 * i if kl else None, entropy=2.0 - 0.1 * i if entropy else None)
            for i, (r, a) in enumerate(zip(rewards, accuracies, strict=True))]


def test_windows_follow_the_contract() -> None:
    assert [trend_window(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 100)] == [1, 1, 1, 1, 1, 1, 2, 2, 25]
    assert FLAT_THRESHOLD == 0.01


def test_rising_run() -> None:
    job = _job()
    acc = [0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # n = 8: w = 2
    m = job_metrics(job, _points(job, [2 * a for a in acc], acc))
    t = m.accuracy_trend
    assert m.has_steps and t.window == 2
    assert (t.early, t.late) == pytest.approx((0.1, 0.65))
    assert t.delta == pytest.approx(0.55) and t.direction == RISING
    assert (t.peak, t.peak_step) == (0.7, 8)
    assert m.reward_trend.direction == RISING and m.reward_trend.late == pytest.approx(1.3)
    assert m.tiles == S.StatTiles(steps=8, final_reward=1.4, best_reward=1.4, best_accuracy=0.7, final_loss=1 / 8)
    assert [p.step for p in m.series] == list(range(1, 9))
    assert m.series[2].reward == 0.4 and m.series[2].accuracy == 0.2 and m.series[2].completion_length == 12.0
    assert m.series[2].format == 0.5 and m.series[2].loss == pytest.approx(1 / 3)


def test_falling_run_peaks_early() -> None:
    job = _job()
    rewards = [0.9, 0.8, 0.85, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]  # n = 9: w = 2
    m = job_metrics(job, _points(job, rewards))
    t = m.reward_trend
    assert t.window == 2 and t.early == pytest.approx(0.85) and t.late == pytest.approx(0.15)
    assert t.direction == FALLING and t.delta == pytest.approx(-0.7)
    assert (t.peak, t.peak_step) == (0.9, 1)
    assert m.tiles.final_reward == 0.1 and m.tiles.best_reward == 0.9 and m.tiles.steps == 9


def test_flat_within_one_point_either_way() -> None:
    job = _job()
    assert job_metrics(job, _points(job, [0.5, 0.52, 0.48, 0.509])).reward_trend.direction == FLAT
    assert job_metrics(job, _points(job, [0.5, 0.52, 0.48, 0.491])).reward_trend.direction == FLAT
    assert job_metrics(job, _points(job, [0.5, 0.5, 0.5, 0.52])).reward_trend.direction == RISING
    assert job_metrics(job, _points(job, [0.5, 0.5, 0.5, 0.48])).reward_trend.direction == FALLING
    # Peak ties go to the earliest step.
    assert compute_trend([1, 2, 3], [0.3, 0.3, 0.1]).peak_step == 1


def test_one_step_run_compares_the_step_with_itself() -> None:
    job = _job()
    m = job_metrics(job, _points(job, [0.4], [0.25]))
    for t, value in ((m.reward_trend, 0.4), (m.accuracy_trend, 0.25)):
        assert (t.window, t.early, t.late, t.delta, t.direction) == (1, value, value, 0.0, FLAT)
        assert (t.peak, t.peak_step) == (value, 1)
    assert m.tiles == S.StatTiles(steps=1, final_reward=0.4, best_reward=0.4, best_accuracy=0.25, final_loss=1.0)


def test_five_step_run_compares_step_one_with_step_five() -> None:
    job = _job()
    m = job_metrics(job, _points(job, [0.2, 0.9, 0.1, 0.3, 0.35]))
    t = m.reward_trend
    assert (t.window, t.early, t.late) == (1, 0.2, 0.35)
    assert t.direction == RISING and t.delta == pytest.approx(0.15) and (t.peak, t.peak_step) == (0.9, 2)


def test_kl_and_entropy_only_where_logged() -> None:
    job = _job()
    plain = job_metrics(job, _points(job, [0.1, 0.2]))
    assert not plain.has_kl and not plain.has_entropy
    assert not any(p.HasField("kl") or p.HasField("entropy") for p in plain.series)
    logged = job_metrics(job, _points(job, [0.1, 0.2], kl=True, entropy=True))
    assert logged.has_kl and logged.has_entropy
    assert [p.kl for p in logged.series] == [0.0, 0.01] and all(p.HasField("kl") for p in logged.series)
    assert [p.entropy for p in logged.series] == [2.0, 1.9]


def test_max_policy_lag_is_a_tile_of_jobs_with_asynchronous_steps_only() -> None:
    job = _job()
    points = _points(job, [0.1, 0.2, 0.3])
    for point, lag in zip(points, (0, 1, 1), strict=True):
        point.policy_lag = lag
    plain = job_metrics(job, points)
    assert not plain.tiles.HasField("max_policy_lag") and [p.policy_lag for p in plain.series] == [0, 1, 1]
    spec = C.JobSpec()
    spec.advanced.max_async_steps = 1
    job.spec_json = json_format.MessageToJson(spec)
    overlapped = job_metrics(job, points)
    assert overlapped.tiles.HasField("max_policy_lag") and overlapped.tiles.max_policy_lag == 1


def test_episode_metrics_are_series_of_a_job_with_an_environment_only() -> None:
    job = _job()
    points = _points(job, [0.1, 0.2, 0.3])
    plain = job_metrics(job, points)
    assert not plain.has_episodes and not any(p.HasField("turns_mean") for p in plain.series)
    for i, point in enumerate(points[1:]):  # step 1 reported none (a trainer from before episodes)
        point.turns_mean, point.tool_calls, point.tool_errors = 2.5 + i, 8 * (i + 1), i
    spec = C.JobSpec()
    spec.environment.key = "calculator"
    job.spec_json = json_format.MessageToJson(spec)
    agent = job_metrics(job, points)
    assert agent.has_episodes and not agent.series[0].HasField("turns_mean")
    assert [(p.turns_mean, p.tool_calls, p.tool_errors) for p in agent.series[1:]] == [(2.5, 8, 0), (3.5, 16, 1)]


def test_no_steps_yet_says_so() -> None:
    queued = job_metrics(_job("QUEUED"), [])
    assert not queued.has_steps and "queued" in queued.message and queued.status == C.JOB_STATUS_QUEUED
    assert not queued.HasField("reward_trend") and not queued.HasField("tiles") and not queued.series
    running = job_metrics(_job("RUNNING"), [])
    assert "first step has not finished" in running.message
    failed = job_metrics(_job("FAILED"), [])
    assert "ended (FAILED) before its first step" in failed.message


def test_partial_run_counts_so_far() -> None:
    job = _job("RUNNING", total=10)
    m = job_metrics(job, list(reversed(_points(job, [0.1, 0.2, 0.3]))))  # any order in, step order out
    assert m.has_steps and m.message == "3 steps so far of 10" and [p.step for p in m.series] == [1, 2, 3]
    assert job_metrics(_job("COMPLETED"), _points(job, [0.1])).message == "1 step"
    assert job_metrics(_job("COMPLETED"), _points(job, [0.1, 0.2])).message == "2 steps"


def test_export_columns_are_the_metric_event_fields() -> None:
    job = _job()
    points = _points(job, [0.1, 0.2], kl=True)
    points[0].kl = None
    csv_out = export_history(job, points, S.EXPORT_FORMAT_UNSPECIFIED)
    assert (csv_out.content_type, csv_out.rows, csv_out.filename) == ("text/csv", 2, f"job-{job.id}-history.csv")
    rows = list(csv.DictReader(io.StringIO(csv_out.content.decode())))
    assert tuple(rows[0]) == EXPORT_COLUMNS == tuple(f.name for f in C.MetricEvent.DESCRIPTOR.fields)
    assert rows[0]["kl"] == "" and float(rows[1]["kl"]) == points[1].kl and rows[1]["job_id"] == job.id
    jsonl = export_history(job, points, S.EXPORT_FORMAT_JSONL)
    assert jsonl.content_type == "application/x-ndjson" and jsonl.filename.endswith(".jsonl")
    lines = [json.loads(line) for line in jsonl.content.decode().splitlines()]
    assert lines[0]["kl"] is None and lines[1]["reward_mean"] == 0.2 and lines[1]["time"].endswith("Z")
    with pytest.raises(ValueError, match="format: 7"):
        export_history(job, points, 7)


def test_the_export_carries_the_episode_metrics_empty_where_a_step_has_none() -> None:
    job = _job()
    points = _points(job, [0.1, 0.2])
    points[1].turns_mean, points[1].turns_max, points[1].truncated_episodes = 2.25, 4, 1
    rows = list(csv.DictReader(io.StringIO(export_history(job, points, S.EXPORT_FORMAT_CSV).content.decode())))
    assert (rows[0]["turns_mean"], rows[0]["failed_episodes"]) == ("", "")
    assert (float(rows[1]["turns_mean"]), rows[1]["turns_max"], rows[1]["truncated_episodes"]) == (2.25, "4", "1")


# ---------------------------------------------------------------- through the real service


async def test_get_job_metrics_over_grpc(nats_server, tmp_path: Path) -> None:
    from fixtures_infra import connected_bus

    from rlvr.clients.sdk import RlvrError, SchedulerClient
    from rlvr.infra.subjects import job_metrics_subject, metric_msg_id
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                 nats_url=nats_server.url, artifact_root=tmp_path / "artifacts",
                                 trainer_addresses=["127.0.0.1:1"])
    async with ServiceRunner(build_service(settings), settings) as runner, connected_bus(nats_server.url) as bus:
        client = SchedulerClient(runner.address)
        spec = C.JobSpec(name="metrics-grpc")
        spec.grpo.max_steps = 4
        spec.advanced.max_async_steps = 1
        job = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=spec))).job

        def metrics() -> S.JobMetrics:
            return client.get_job_metrics(S.GetJobMetricsRequest(job_id=job.id))

        empty = await asyncio.to_thread(metrics)
        assert not empty.has_steps and "queued" in empty.message and empty.status == C.JOB_STATUS_QUEUED

        accuracy = [0.0, 0.1, 0.2, 0.4]
        for step, acc in enumerate(accuracy, start=1):
            event = C.MetricEvent(job_id=job.id, step=step, total_steps=4, reward_mean=acc + 0.1, accuracy=acc,
                                  loss=0.5, completion_length_mean=20.0, policy_lag=min(step - 1, 1))
            if step > 2:
                event.entropy = 1.5
            await bus.publish(job_metrics_subject(job.id), event.SerializeToString(), metric_msg_id(job.id, step))
        for _ in range(200):
            m = await asyncio.to_thread(metrics)
            if len(m.series) == 4:
                break
            await asyncio.sleep(0.05)
        assert m.has_steps and m.accuracy_trend.direction == RISING and m.accuracy_trend.window == 1
        assert m.accuracy_trend.delta == pytest.approx(0.4) and m.accuracy_trend.peak_step == 4
        assert m.tiles.steps == 4 and m.tiles.final_reward == pytest.approx(0.5) and m.tiles.best_accuracy == 0.4
        assert m.has_entropy and not m.has_kl and not m.series[0].HasField("entropy")
        assert m.series[3].entropy == 1.5
        # Asynchronous steps' staleness: stored per step from the events, the largest as a tile.
        assert [p.policy_lag for p in m.series] == [0, 1, 1, 1] and m.tiles.max_policy_lag == 1

        with pytest.raises(RlvrError) as missing:
            await asyncio.to_thread(client.get_job_metrics, S.GetJobMetricsRequest(job_id="nosuchjob"))
        assert missing.value.code.name == "NOT_FOUND" and "nosuchjob" in missing.value.details
        client.close()


def test_an_sft_jobs_card_is_its_own() -> None:
    """A Supervised (SFT) job: the accuracy is the token accuracy, the card is SFT Metrics (one trend,
    three tiles, the token accuracy and loss charts with the held-out loss), in the terminal as on the page."""
    from rlvr.clients.views import jobs as view
    from rlvr.jobspec import resolve_spec
    from rlvr.services.scheduler.convert import spec_to_json

    job = _job()
    job.spec_json = spec_to_json(resolve_spec(C.JobSpec(method=C.TRAINING_METHOD_SFT,
                                                        sft=C.SftConfig(dataset="d.jsonl"))).spec)
    points = [MetricPointRow(job_id=job.id, step=i + 1, total_steps=4, loss=2.0 - 0.4 * i, token_accuracy=0.2 * (i + 1),
                             tokens_per_second=100.0, heldout_loss=1.9 - 0.4 * i if i % 2 else None) for i in range(4)]
    card = job_metrics(job, points)
    assert card.supervised and card.tiles.best_accuracy == pytest.approx(0.8)
    assert (card.accuracy_trend.early, card.accuracy_trend.late, card.accuracy_trend.direction) == (
        pytest.approx(0.2), pytest.approx(0.8), RISING)
    assert [p.heldout_loss for p in card.series if p.HasField("heldout_loss")] == [pytest.approx(1.5),
                                                                                  pytest.approx(0.7)]
    assert [(c.key, [s.key for s in c.series]) for c in view.charts_of(card)] == [
        ("token_accuracy", ["token_accuracy"]), ("loss", ["loss", "heldout_loss"])]
    text = view.render(card, unicode=False)
    assert text.startswith(f"SFT Metrics - job {job.id} (completed)")
    assert "Token Accuracy Trend" in text and "Reward Trend" not in text and "Best Reward" not in text
    assert [label for label, _ in view.tile_values(card.tiles, card.supervised)] == ["Steps", "Best Accuracy",
                                                                                     "Final Loss"]
    rl = job_metrics(_job(), _points(_job(), [0.1, 0.2]))
    assert not rl.supervised and view.render(rl, unicode=False).startswith("RL Metrics")
    # the jobs list's sparkline: the token accuracy alone (no reward line)
    from rlvr.clients.web.views import sparkline

    svg = str(sparkline(card))
    assert svg.count("<polyline") == 1 and "token accuracy 0.200 to 0.800 over 4 steps" in svg
    assert str(sparkline(rl)).count("<polyline") == 2
    # `rlvr events`: an SFT step in its own words
    from rlvr.clients.commands.events import line_of

    event = C.MetricEvent(job_id=job.id, step=2, total_steps=4, loss=1.25, token_accuracy=0.5, heldout_loss=1.5)
    assert line_of("rlvr.jobs.x.metrics", 7, event, b"") == (
        f"#7 job {job.id} step 2/4: loss 1.25 token accuracy 0.500 heldout_loss 1.5")
