"""Store rows <-> contract messages for the scheduler. The store keeps specs as protobuf JSON and
statuses as enum names without their prefix, so conversion is mechanical and lives here once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.infra.schema import LOOP_FINAL_STATUSES, JobRow, LoopRow, MetricPointRow, RoundRow
from rlvr.jobspec import job_status_value
from rlvr.v1 import common_pb2, scheduler_pb2

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def ts(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    t = Timestamp()
    t.FromDatetime(value.astimezone(UTC))
    return t


def now_ts() -> Timestamp:
    t = Timestamp()
    t.GetCurrentTime()
    return t


def spec_to_json(spec: common_pb2.JobSpec) -> str:
    return json_format.MessageToJson(spec, preserving_proto_field_name=True, indent=None)


def spec_from_json(text: str) -> common_pb2.JobSpec:
    return json_format.Parse(text, common_pb2.JobSpec())


def job_to_proto(row: JobRow) -> common_pb2.Job:
    from rlvr.jobspec import summary

    spec = spec_from_json(row.spec_json)
    job = common_pb2.Job(
        id=row.id, spec=spec, status=job_status_value(row.status), error=row.error,
        warnings=json.loads(row.warnings_json or "[]"), current_step=row.current_step,
        total_steps=row.total_steps, worker=row.worker,
        queue_reason=row.queue_reason if row.status == "QUEUED" else "",
        summary=summary(spec, row.total_steps),
    )
    for field in ("created_at", "started_at", "finished_at"):
        value = ts(getattr(row, field))
        if value is not None:
            getattr(job, field).CopyFrom(value)
    if row.adapter_name:
        job.adapter.CopyFrom(common_pb2.AdapterRef(name=row.adapter_name, version=row.adapter_version,
                                                   path=row.adapter_path))
    return job


def metric_event_from_row(row: MetricPointRow, job_id: str) -> common_pb2.MetricEvent:
    values = {k: v for k, v in row.model_dump().items() if k not in ("job_id", "created_at") and v is not None}
    values["reward_components"] = row.components()  # stored as JSON (metric_point_from_event)
    values["class_f1"] = row.class_scores()
    event = common_pb2.MetricEvent(job_id=job_id, **values)
    stamp = ts(row.created_at)
    if stamp is not None:
        event.time.CopyFrom(stamp)
    return event


# ---------------------------------------------------------------- loops

LOOP_TERMINAL = LOOP_FINAL_STATUSES


def loop_status_name(value: int) -> str:
    return scheduler_pb2.LoopStatus.Name(value).removeprefix("LOOP_STATUS_")


def loop_status_value(name: str) -> scheduler_pb2.LoopStatus:
    return scheduler_pb2.LoopStatus.Value(f"LOOP_STATUS_{name}")


def loop_spec_to_json(spec: scheduler_pb2.LoopSpec) -> str:
    return json_format.MessageToJson(spec, preserving_proto_field_name=True, indent=None)


def loop_spec_from_json(text: str) -> scheduler_pb2.LoopSpec:
    return json_format.Parse(text, scheduler_pb2.LoopSpec())


def _seconds(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def loop_to_proto(loop: LoopRow, rounds: Sequence[RoundRow], jobs: Mapping[str, JobRow],
                  now: datetime | None = None) -> scheduler_pb2.Loop:
    """The contract's Loop from its stored rows: best round, deltas, gain over round 1 and the
    times are derived here (services/scheduler/loop_rules.py), never stored twice."""
    from rlvr.jobspec import summary, total_steps
    from rlvr.services.scheduler import loop_rules

    now = now or datetime.now(UTC)
    spec = loop_spec_from_json(loop.spec_json)
    best = loop_rules.best_round(rounds)
    deltas = loop_rules.deltas(rounds)
    out = scheduler_pb2.Loop(
        id=loop.id, spec=spec, status=loop_status_value(loop.status), error=loop.error, message=loop.message,
        best_round=best.index if best is not None else 0, baseline_evaluation_id=loop.baseline_evaluation_id,
        warnings=json.loads(loop.warnings_json or "[]"),
    )
    if loop.baseline_score is not None:
        out.baseline_score = loop.baseline_score
    for r in sorted(rounds, key=lambda r: r.index):
        job = jobs.get(r.job_id or "")
        item = out.rounds.add(
            index=r.index, job_id=r.job_id or "", evaluation_id=r.evaluation_id,
            status=scheduler_pb2.RoundStatus.Value(f"ROUND_STATUS_{r.status}"), best=best is r,
            duration_seconds=_seconds(r.started_at, r.finished_at or (now if r.status in ("TRAINING", "BENCHMARKING")
                                                                     else None)),
            training_seconds=r.training_seconds, benchmarking_seconds=r.benchmarking_seconds,
            reclaimed_bytes=r.reclaimed_bytes, error=r.error, real_gain=r.real_gain,
            gain_threshold=r.gain_threshold, base_round=r.base_round,
        )
        if r.score is not None:
            item.score = r.score
        if r.index in deltas:
            item.delta = deltas[r.index]
        for field in ("started_at", "finished_at"):
            value = ts(getattr(r, field))
            if value is not None:
                getattr(item, field).CopyFrom(value)
        if job is not None:
            item.current_step, item.total_steps = job.current_step, job.total_steps
            if job.status == "RUNNING" and job.started_at is not None and not r.training_seconds:
                item.training_seconds = _seconds(job.started_at, now)
            if job.adapter_name:  # LoopSpec.best_step: the chosen step's checkpoint
                item.adapter.CopyFrom(common_pb2.AdapterRef(
                    name=job.adapter_name, version=r.adapter_step or job.adapter_version,
                    path=r.adapter_path or job.adapter_path))
                item.adapter_step = r.adapter_step
    if best is not None and best.score is not None:
        out.best_score = best.score
        first = next((r for r in out.rounds if r.index == 1 and r.HasField("score")), None)
        if first is not None:
            out.gain_over_first = round(best.score - first.score, 6)
    out.elapsed_seconds = _seconds(loop.started_at or loop.created_at, loop.finished_at or now)
    out.training_seconds = sum(r.training_seconds for r in out.rounds)
    out.benchmarking_seconds = loop.baseline_seconds + sum(r.benchmarking_seconds for r in out.rounds)
    for field in ("created_at", "started_at", "finished_at"):
        value = ts(getattr(loop, field))
        if value is not None:
            getattr(out, field).CopyFrom(value)
    if spec.HasField("job"):
        out.summary.CopyFrom(summary(spec.job, total_steps(spec.job)))
    return out
