"""The scheduler's reading of job events: the one ordered consumer that stores every job's metrics
and status events, and `watch`, a job's events for a client until the job ends.

All of a job's events (`rlvr.jobs.<id>.metrics` and `.status`) are stored by one durable consumer
that handles them one at a time in stream order. The trainer publishes a step's metrics before the
status that ends the job, so when a row reads COMPLETED every step is already stored; and a watch
(`watch`) ends only once the store holds the job's end. The consumer is named after the store's own id
(`events_consumer`): a scheduler restarted on the same database resumes it, and two deployments
sharing one NATS each read every event (skipping the other's jobs) instead of splitting them.

Status event ids are `<job>:status:<STATUS>` (the store's spelling, QUEUED, RUNNING, ...:
`rlvr.infra.subjects.status_msg_id`, which the trainer uses too), so the scheduler's and the
trainer's publishes of the same transition are deduplicated by the stream; a status read here
moves the job only along the lifecycle's `report` edges (lifecycle.py), so a terminal status is
never overwritten by a late non-terminal one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import DecodeError

from rlvr.common.errors import NotFound
from rlvr.infra.events import DurableSubscription, Event, cancel_and_wait
from rlvr.infra.schema import JobRow, MetricPointRow, metric_point_from_event
from rlvr.infra.subjects import ALL_JOB_EVENTS, job_events_subject
from rlvr.jobspec import job_status_name
from rlvr.services.scheduler.convert import TERMINAL, metric_event_from_row
from rlvr.services.scheduler.lifecycle import JobLifecycle, status_event
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.scheduler.jobs")

EVENTS_CONSUMER = "scheduler-job-events"
"""The durable consumer of every job event, `events_consumer` adds the store's id to it."""
OLD_CONSUMERS = ("scheduler-job-events", "scheduler-metrics", "scheduler-job-status")
"""The consumers of earlier layouts (one name for every store; before that metrics and status apart):
taken over and deleted at start."""
STREAM_GRACE_S = 5.0
"""How long a watch whose job the store has ended waits for that end to come off the stream."""
STORE_GRACE_S = 30.0
"""How long a watch that read a job's end off the stream waits for the store to hold it."""
NO_SIGNAL_STEPS = 4
"""Steps in a row without a group whose rewards differ, after which a running job is warned that it
cannot learn (`no_signal_warning`)."""
NO_SIGNAL = "no group had a reward spread"


def no_signal_warning(points: list[MetricPointRow], step: int) -> str | None:
    """The warning for a job whose steps up to `step` had no group with a reward spread for the last
    NO_SIGNAL_STEPS steps (`points`: its stored series), else None."""
    recent = [p for p in points if step - NO_SIGNAL_STEPS < p.step <= step]
    if len(recent) < NO_SIGNAL_STEPS or any(p.groups_with_signal != 0 for p in recent):
        return None
    rewards = sorted({round(p.reward_mean, 4) for p in recent})
    return (f"{NO_SIGNAL} in steps {step - NO_SIGNAL_STEPS + 1}-{step}: every completion of each prompt scored "
            f"the same (mean reward {', '.join(f'{r:g}' for r in rewards)}), so GRPO's advantages are zero and the "
            "adapter does not move. The task is too hard or too easy for this model at this length; try a model "
            "with headroom on it (`rlvr models show NAME --eval`), a larger grpo.max_completion_tokens or "
            "grpo.group_size, a higher advanced.temperature, or a reward with partial credit")


def events_consumer(store_id: str) -> str:
    """The durable consumer of a store's job events: one per database, whichever scheduler or URL."""
    return f"{EVENTS_CONSUMER}-{store_id[:16]}"


class Ingest:
    def __init__(self, lifecycle: JobLifecycle, poll_seconds: float = 1.0) -> None:
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.poll_seconds = poll_seconds
        self._unknown_jobs: dict[str, None] = {}  # job ids whose events were skipped (insertion-ordered)

    async def subscribe(self) -> DurableSubscription | None:
        """The durable consumer of every job event (None without a bus)."""
        bus = self.lifecycle.bus
        if bus is None:
            return None
        store_id = await asyncio.to_thread(self.store.store_id)
        # A consumer made now (a new database, or NATS's consumer gone) replays the stream only when
        # a job of this store may still have events to store; a store with none starts at the next.
        unfinished = await asyncio.to_thread(lambda: self.store.count_jobs() - self.store.count_jobs(TERMINAL))
        return await bus.subscribe_durable(
            ALL_JOB_EVENTS, events_consumer(store_id), self.on_event, ordered=True, replaces=OLD_CONSUMERS,
            from_start=unfinished > 0)

    async def on_event(self, event: Event) -> None:
        """Every job event, in stream order (one durable consumer): a step's metrics are stored
        before a later status of the same job is. An event that cannot be decoded, or of a job
        this store does not know, is skipped: retrying it could never succeed, and it would hold
        back every later event."""
        kind = event.subject.rsplit(".", 1)[-1]
        try:
            if kind == "metrics":
                await self._on_metric(common_pb2.MetricEvent.FromString(event.data))
            elif kind == "status":
                status = common_pb2.JobStatusEvent.FromString(event.data)
                await self.lifecycle.report(status.job_id, job_status_name(status.status), status.message,
                                            status.adapter if status.adapter.name else None, publish=False)
        except DecodeError as e:
            log.error("skipping %s seq %d: not a %s event (%s)", event.subject, event.seq, kind, e)

    async def _on_metric(self, metric: common_pb2.MetricEvent) -> None:
        row = await asyncio.to_thread(self.store.get_job, metric.job_id)
        if row is None:
            # Another deployment's job on a shared NATS, or a deleted one: said once per job, not per step.
            first = metric.job_id not in self._unknown_jobs
            self._unknown_jobs[metric.job_id] = None
            if len(self._unknown_jobs) > 4096:
                del self._unknown_jobs[next(iter(self._unknown_jobs))]
            log.log(logging.WARNING if first else logging.DEBUG,
                    "skipping step %d of job %r: no such job in the store%s", metric.step, metric.job_id,
                    " (its later steps are skipped quietly)" if first else "")
            return
        stored = await asyncio.to_thread(self.store.add_metric_point, metric_point_from_event(metric))
        if stored and metric.step > row.current_step:
            await self.lifecycle.progress(metric.job_id, metric.step)
        if stored and metric.HasField("groups_with_signal") and metric.groups_with_signal == 0 \
                and metric.step >= NO_SIGNAL_STEPS:
            await self._warn_no_signal(row, metric.step)

    async def _warn_no_signal(self, row: JobRow, step: int) -> None:
        """Once per job: the warning that it cannot learn, on the job (Job.warnings: the job page and
        `rlvr jobs show`) and as a RUNNING status event with the warning as its message (watchers)."""
        warnings = json.loads(row.warnings_json or "[]")
        if row.status != "RUNNING" or any(w.startswith(NO_SIGNAL) for w in warnings):
            return
        points = await asyncio.to_thread(self.store.metric_points, row.id, step - NO_SIGNAL_STEPS)
        warning = no_signal_warning(points, step)
        if warning is None:
            return
        log.warning("job %s: %s", row.id, warning)
        await asyncio.to_thread(self.store.update_job, row.id, warnings_json=json.dumps([*warnings, warning]))
        await self.lifecycle.publish_status(row.id, "RUNNING", f"warning: {warning}", again="no-signal")
        await self.lifecycle.notify()

    async def watch(self, job_id: str, from_start: bool) -> AsyncIterator[common_pb2.JobEvent]:
        """Status and metric events until the job ends. A finished job replays from the store.

        Live events come off the stream, but the final status is given only once the store holds
        the job's end (so every step too: see the module docstring), bounded by STORE_GRACE_S: a
        client that reads the job when its watch ends sees it ended. The store is watched
        alongside, so a watch also ends when the job's end never reaches the stream (a status the
        scheduler stored but could not publish)."""
        row = await self.lifecycle.row(job_id)
        bus = self.lifecycle.bus
        if row.status in TERMINAL or bus is None:
            if from_start:
                for point in await asyncio.to_thread(self.store.metric_points, job_id):
                    yield common_pb2.JobEvent(metric=metric_event_from_row(point, job_id))
            yield common_pb2.JobEvent(status=status_event(row))
            return
        yield common_pb2.JobEvent(status=status_event(row))
        events = aiter(bus.watch(job_events_subject(job_id), from_start=from_start))
        stored_end = asyncio.create_task(self._ended_row(job_id))
        pending: asyncio.Future[Event] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(events))
                if not stored_end.done():
                    either: set[asyncio.Future[Any]] = {pending, stored_end}
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    if not pending.done():
                        continue  # the store has the end: the stream gets STREAM_GRACE_S to bring it
                else:
                    await asyncio.wait({pending}, timeout=STREAM_GRACE_S)
                    if not pending.done():
                        yield common_pb2.JobEvent(status=status_event(stored_end.result()))
                        return
                event, pending = pending.result(), None
                if event.subject.endswith(".metrics"):
                    yield common_pb2.JobEvent(metric=common_pb2.MetricEvent.FromString(event.data))
                elif event.subject.endswith(".status"):
                    status = common_pb2.JobStatusEvent.FromString(event.data)
                    if job_status_name(status.status) not in TERMINAL:
                        yield common_pb2.JobEvent(status=status)
                        continue
                    done, _ = await asyncio.wait({stored_end}, timeout=STORE_GRACE_S)
                    if done:
                        stored = stored_end.result()
                        if stored.status != job_status_name(status.status):  # the store's word is final
                            status = status_event(stored)
                    else:
                        log.warning("job %s ended on the stream but not in the store within %.0f s",
                                    job_id, STORE_GRACE_S)
                    yield common_pb2.JobEvent(status=status)
                    return
        finally:
            for task in (pending, stored_end):
                if task is not None:
                    await cancel_and_wait(task)  # type: ignore[arg-type]
            await events.aclose()  # type: ignore[attr-defined]

    async def _ended_row(self, job_id: str) -> JobRow:
        """The job's row once it has ended; a failed read of the store is tried again."""
        while True:
            try:
                return await self.lifecycle.wait_job(job_id, lambda r: r.status in TERMINAL)
            except NotFound:
                raise
            except Exception as e:  # a watch must not end on a store hiccup
                log.warning("watch of job %s: reading the store failed (%s); trying again", job_id, e)
                await asyncio.sleep(self.poll_seconds)
