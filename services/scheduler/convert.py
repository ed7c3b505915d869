"""Store rows <-> contract messages for the scheduler. The store keeps specs as protobuf JSON and
statuses as enum names without their prefix, so conversion is mechanical and lives here once."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.infra.schema import JobRow, MetricPointRow
from rlvr.v1 import common_pb2

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


def job_status_name(value: int) -> str:
    return common_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_")


def job_status_value(name: str) -> int:
    return common_pb2.JobStatus.Value(f"JOB_STATUS_{name}")


def spec_to_json(spec: common_pb2.JobSpec) -> str:
    return json_format.MessageToJson(spec, preserving_proto_field_name=True, indent=None)


def spec_from_json(text: str) -> common_pb2.JobSpec:
    return json_format.Parse(text, common_pb2.JobSpec())


def job_to_proto(row: JobRow) -> common_pb2.Job:
    from services.scheduler.jobspec import summary

    spec = spec_from_json(row.spec_json)
    job = common_pb2.Job(
        id=row.id, spec=spec, status=job_status_value(row.status), error=row.error,
        warnings=json.loads(row.warnings_json or "[]"), current_step=row.current_step,
        total_steps=row.total_steps, worker=row.worker,
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
    event = common_pb2.MetricEvent(job_id=job_id, **values)
    stamp = ts(row.created_at)
    if stamp is not None:
        event.time.CopyFrom(stamp)
    return event
