"""The RL Metrics card and the history export, computed from stored metric points.

Pure functions of a job row and its `MetricPointRow`s (no gRPC, no store): the servicer reads the
rows and calls these, and tests call them with hand-made points.

Trends (scheduler.proto, "RL Metrics"): with n stored steps the window is w = max(1, n // 4); the
early window is the first w steps, the late window the last w steps; delta = mean(late) -
mean(early); FLAT when |delta| < FLAT_THRESHOLD, else RISING or FALLING; the peak is the maximum
over all steps (the earliest step reaching it). A 1-step run compares the step with itself (FLAT),
a 5-step run step 1 with step 5. Everything is computed over what is stored now, so a running job
gets partial figures and a job with no step yet gets `has_steps = false` and a message.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from datetime import UTC

from rlvr.infra.schema import JobRow, MetricPointRow
from rlvr.jobspec import is_head, is_sft, job_status_value
from rlvr.services.scheduler.convert import TERMINAL, spec_from_json
from rlvr.v1 import common_pb2, scheduler_pb2

FLAT_THRESHOLD = 0.01
"""|delta| below this is FLAT: one point on the 0-1 scale of reward and accuracy."""


def trend_window(n: int) -> int:
    """w = max(1, floor(n / 4)) for n stored steps."""
    return max(1, n // 4)


def compute_trend(steps: Sequence[int], values: Sequence[float]) -> scheduler_pb2.Trend:
    """The trend of one series (`values[i]` at `steps[i]`, in step order; at least one value)."""
    if not values or len(steps) != len(values):
        raise ValueError(f"a trend needs one value per step and at least one: {len(steps)} steps, {len(values)} values")
    w = trend_window(len(values))
    early = sum(values[:w]) / w
    late = sum(values[-w:]) / w
    delta = late - early
    if abs(delta) < FLAT_THRESHOLD:
        direction = scheduler_pb2.TREND_DIRECTION_FLAT
    elif delta > 0:
        direction = scheduler_pb2.TREND_DIRECTION_RISING
    else:
        direction = scheduler_pb2.TREND_DIRECTION_FALLING
    peak_index = max(range(len(values)), key=lambda i: (values[i], -i))  # ties: the earliest step
    return scheduler_pb2.Trend(early=early, late=late, delta=delta, direction=direction,
                               peak=values[peak_index], peak_step=steps[peak_index], window=w)


EPISODE_SERIES = ("turns_mean", "tool_calls", "tool_errors")
"""The episode metrics the RL Metrics card charts (SeriesPoint's fields of the same names)."""


def series_point(point: MetricPointRow) -> scheduler_pb2.SeriesPoint:
    s = scheduler_pb2.SeriesPoint(step=point.step, reward=point.reward_mean, accuracy=point.accuracy,
                                  loss=point.loss, completion_length=point.completion_length_mean,
                                  format=point.format, policy_lag=point.policy_lag,
                                  reward_components=point.components(), reward_errors=point.reward_errors)
    # The series only some steps log (kl with kl_beta, evaluation steps, an SFT job's, a job with an
    # environment's episodes): unset where a step has none.
    for name in ("kl", "entropy", "heldout_accuracy", "token_accuracy", "heldout_loss", "heldout_f1",
                 *EPISODE_SERIES):
        value = getattr(point, name)
        if value is not None:
            setattr(s, name, value)
    return s


def no_steps_message(job: JobRow) -> str:
    if job.status == "QUEUED":
        return f"no steps yet: job {job.id} is queued and has not started training"
    if job.status == "RUNNING":
        return f"no steps yet: job {job.id} is running and its first step has not finished"
    if job.status in TERMINAL:
        return f"no steps: job {job.id} ended ({job.status}) before its first step finished"
    return f"no steps yet: job {job.id} is {job.status}"


def job_metrics(job: JobRow, points: Sequence[MetricPointRow]) -> scheduler_pb2.JobMetrics:
    """The RL Metrics card of `job` from its stored points (any order; one per step)."""
    out = scheduler_pb2.JobMetrics(job_id=job.id, status=job_status_value(job.status))
    points = sorted(points, key=lambda p: p.step)
    if not points:
        out.has_steps = False
        out.message = no_steps_message(job)
        return out
    steps = [p.step for p in points]
    rewards = [p.reward_mean for p in points]
    spec = spec_from_json(job.spec_json)
    # A Supervised (SFT) job has no reward: its accuracy is the token accuracy; a Head job's is its
    # held-out accuracy at the steps that evaluated (a regression head's trend: its held-out loss).
    accuracies = [p.token_accuracy or 0.0 for p in points] if is_sft(spec) else [p.accuracy for p in points]
    trend_steps, trend = steps, accuracies
    if is_head(spec):
        evaluated = [p for p in points if p.heldout_accuracy is not None]
        accuracies = [p.heldout_accuracy or 0.0 for p in evaluated] or [0.0]
        if not evaluated:  # regression, or no evaluation yet: the held-out loss where there is one
            evaluated = [p for p in points if p.heldout_loss is not None]
            trend = [p.heldout_loss or 0.0 for p in evaluated] or [0.0]
        else:
            trend = accuracies
        trend_steps = [p.step for p in evaluated] or [steps[-1]]
    out.has_steps = True
    last = points[-1]
    running = job.status not in TERMINAL
    stored = f"{len(points)} step{'' if len(points) == 1 else 's'}"
    out.message = f"{stored} so far of {job.total_steps or last.total_steps}" if running else stored
    out.accuracy_trend.CopyFrom(compute_trend(trend_steps, trend))
    out.reward_trend.CopyFrom(compute_trend(steps, rewards))
    out.tiles.CopyFrom(scheduler_pb2.StatTiles(steps=last.step, final_reward=last.reward_mean,
                                               best_reward=max(rewards), best_accuracy=max(accuracies),
                                               final_loss=last.loss))
    if spec.advanced.max_async_steps:
        out.tiles.max_policy_lag = max(p.policy_lag for p in points)
    out.has_episodes = bool(spec.environment.key)
    out.supervised = is_sft(spec)
    out.head = is_head(spec)
    out.series.extend(series_point(p) for p in points)
    out.has_kl = any(p.kl is not None for p in points)
    out.has_entropy = any(p.entropy is not None for p in points)
    return out


# ---------------------------------------------------------------------------- export

EXPORT_COLUMNS: tuple[str, ...] = tuple(f.name for f in common_pb2.MetricEvent.DESCRIPTOR.fields)
"""The export's columns: the MetricEvent fields, in the contract's order (`time` as RFC 3339 UTC)."""
MAP_COLUMNS = frozenset(f.name for f in common_pb2.MetricEvent.DESCRIPTOR.fields
                        if f.message_type is not None and f.message_type.GetOptions().map_entry)

_FORMATS: dict[int, tuple[str, str]] = {
    scheduler_pb2.EXPORT_FORMAT_UNSPECIFIED: ("csv", "text/csv"),
    scheduler_pb2.EXPORT_FORMAT_CSV: ("csv", "text/csv"),
    scheduler_pb2.EXPORT_FORMAT_JSONL: ("jsonl", "application/x-ndjson"),
}


def _export_value(point: MetricPointRow, job_id: str, column: str) -> object:
    if column == "job_id":
        return job_id
    if column == "time":
        created = point.created_at
        return created.astimezone(UTC).isoformat().replace("+00:00", "Z") if created is not None else None
    return getattr(point, column)


def export_rows(job_id: str, points: Sequence[MetricPointRow]) -> list[dict[str, object]]:
    """One dict per step (step order), keys = EXPORT_COLUMNS; an unlogged kl/entropy is None."""
    return [{c: _export_value(p, job_id, c) for c in EXPORT_COLUMNS} for p in sorted(points, key=lambda p: p.step)]


def _csv(rows: list[dict[str, object]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)  # floats as repr: they read back exactly; None as an empty cell
    return buf.getvalue()


def _jsonl(rows: list[dict[str, object]]) -> str:
    # a map column (reward_components) is stored as JSON text: an object in JSONL, the text in CSV
    return "".join(json.dumps({k: json.loads(str(v)) if k in MAP_COLUMNS else v for k, v in row.items()}) + "\n"
                   for row in rows)


_WRITERS: dict[str, Callable[[list[dict[str, object]]], str]] = {"csv": _csv, "jsonl": _jsonl}


def export_history(job: JobRow, points: Sequence[MetricPointRow], fmt: int) -> scheduler_pb2.ExportHistoryResponse:
    """Export History: the per-step metrics as CSV (the default) or JSONL, one row per step."""
    if fmt not in _FORMATS:
        allowed = ", ".join(scheduler_pb2.ExportFormat.Name(v) for v in _FORMATS)
        raise ValueError(f"format: {fmt!r} is not an ExportFormat; allowed: {allowed}")
    ext, content_type = _FORMATS[fmt]
    rows = export_rows(job.id, points)
    return scheduler_pb2.ExportHistoryResponse(content=_WRITERS[ext](rows).encode(), content_type=content_type,
                                               rows=len(rows), filename=f"job-{job.id}-history.{ext}")
