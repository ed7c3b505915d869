"""The scheduler's job core: create, list, cancel, dispatch to trainer workers, and fold the
events of running jobs into the store. No gRPC here: the trainer workers are reached through the
`Workers` interface (services/scheduler/workers.py, whose `GrpcWorkers` turns status codes into
the domain exceptions handled below); tests may pass their own.

State flows one way: a job row is the record. Transitions the scheduler makes itself (queued,
dispatched, cancelled, a worker found dead or done) are written to the store first and then
published as status events; transitions the trainer's job process makes (running, completed,
failed) arrive as status events on NATS. Status event ids are `<job>:status:<STATUS>` (the
store's spelling, QUEUED, RUNNING, ...: `rlvr.infra.events.status_msg_id`, which the trainer
uses too), so the two publishers of the same transition are deduplicated by the stream, and a
terminal status is never overwritten by a late non-terminal one.

All of a job's events (`rlvr.jobs.<id>.metrics` and `.status`) are stored by one durable consumer
that handles them one at a time in stream order. The trainer publishes a step's metrics before the
status that ends the job, so when a row reads COMPLETED every step is already stored; and a watch
(`watch`) ends only once the store holds the job's end. The consumer is named after the store's own id
(`events_consumer`): a scheduler restarted on the same database resumes it, and two deployments
sharing one NATS each read every event (skipping the other's jobs) instead of splitting them.

A job whose trainer was lost resumes. When the worker that runs a job answers that it no longer
does (its job process died without a result: `last_lost`; or the trainer service was restarted and
knows nothing of it), the job goes back to the queue and is started again, on an idle worker that fits,
as a resume (StartJobRequest.resume): the trainer goes on from the job's last checkpoint, or from
step 0 when it has none (with the same seed, the same run again). A job is resumed at most
`MAX_RESUMES` times, counted in its row (`JobRow.resumes`, so a restarted scheduler goes on with the
count); then it fails with the cause and the adapter the worker reports. While the worker cannot be
reached at all the job stays RUNNING there: its job process may still be training.

Dispatch cannot start a job twice. StartJob is idempotent by job id on the trainer; when its
outcome is unknown (no answer in time, or the worker unreachable) the scheduler asks the worker
whether it runs the job before anything else may be tried, and while the worker cannot be asked
the job stays QUEUED with that worker recorded in `worker` ("in doubt"): it is given to no other
worker until that one answers.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, check_page, shown
from rlvr.common.settings import rlvr_home
from rlvr.infra.events import (
    ALL_JOB_EVENTS,
    DurableSubscription,
    Event,
    EventBus,
    cancel_and_wait,
    job_events_subject,
    job_status_subject,
    status_msg_id,
)
from rlvr.infra.schema import LOOP_FINAL_STATUSES, JobRow, MetricPointRow, RoundRow, metric_point_from_event
from rlvr.infra.store import Store
from rlvr.jobspec import ResolvedJob, job_status_name, job_status_value, resolve_spec
from rlvr.models import check_base_model
from rlvr.rewards.registry import Catalog
from rlvr.services.scheduler.convert import (
    TERMINAL,
    job_to_proto,
    metric_event_from_row,
    now_ts,
    spec_from_json,
    spec_to_json,
)
from rlvr.services.scheduler.datasets import check_dataset
from rlvr.services.scheduler.fit import fit, queue_reason
from rlvr.services.scheduler.rewards import LocalRewards, RewardCatalogs
from rlvr.services.scheduler.workers import (
    JobNotOnWorker,
    WorkerBusy,
    WorkerError,
    Workers,
    WorkerState,
    WorkerUnavailable,
)
from rlvr.v1 import common_pb2

__all__ = ["JobManager", "WorkerState", "Workers"]

log = logging.getLogger("rlvr.scheduler.jobs")

EVENTS_CONSUMER = "scheduler-job-events"
"""The durable consumer of every job event, `events_consumer` adds the store's id to it."""
OLD_CONSUMERS = ("scheduler-job-events", "scheduler-metrics", "scheduler-job-status")
"""The consumers of earlier layouts (one name for every store; before that metrics and status apart):
taken over and deleted at start."""


def events_consumer(store_id: str) -> str:
    """The durable consumer of a store's job events: one per database, whichever scheduler or URL."""
    return f"{EVENTS_CONSUMER}-{store_id[:16]}"

STREAM_GRACE_S = 5.0
"""How long a watch whose job the store has ended waits for that end to come off the stream."""
STORE_GRACE_S = 30.0
"""How long a watch that read a job's end off the stream waits for the store to hold it."""
MAX_RESUMES = 3
"""How many times a job whose trainer was lost is resumed before it fails (see the module's doc)."""


class JobManager:
    def __init__(self, store: Store, bus: EventBus | None, workers: Workers, poll_seconds: float = 1.0,
                 data_roots: Sequence[Path] = (), model_roots: Sequence[Path] | None = None,
                 rewards: RewardCatalogs | None = None) -> None:
        self.store = store
        self.rewards = rewards or LocalRewards()  # what a job's reward is checked against (rewards.py)
        self.data_roots = tuple(data_roots)  # where a Boxed-answer job's local data may be read at submit
        # where a local base model may be named from (rlvr.models.check_base_model)
        self.model_roots = tuple(model_roots) if model_roots is not None else (rlvr_home() / "models",)
        self.bus = bus
        self.workers = workers
        self.poll_seconds = poll_seconds
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[DurableSubscription] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        # Every stored change of a job (status, step, adapter) bumps `generation` and notifies
        # `changed`: `wait_job` and the loop watchers sleep on it (the loop manager bumps it too).
        self.changed = asyncio.Condition()
        self.generation = 0
        self._unknown_jobs: dict[str, None] = {}  # job ids whose events were skipped (insertion-ordered)
        # queued job id -> (the live workers' names and capabilities, why each cannot run it), fit.py's
        self._fits: dict[str, tuple[tuple[object, ...], dict[str, str | None]]] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.bus is not None:
            store_id = await asyncio.to_thread(self.store.store_id)
            # A consumer made now (a new database, or NATS's consumer gone) replays the stream only when
            # a job of this store may still have events to store; a store with none starts at the next.
            unfinished = await asyncio.to_thread(lambda: self.store.count_jobs() - self.store.count_jobs(TERMINAL))
            self._subs.append(await self.bus.subscribe_durable(
                ALL_JOB_EVENTS, events_consumer(store_id), self._on_event, ordered=True, replaces=OLD_CONSUMERS,
                from_start=unfinished > 0))
        self._tasks.append(asyncio.create_task(self._dispatch_loop(), name="dispatch"))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.stop()

    # ------------------------------------------------------------------ API

    async def create(self, spec: common_pb2.JobSpec, dry_run: bool) -> tuple[ResolvedJob, common_pb2.Job | None]:
        catalog = await self.rewards.catalog()
        resolved = resolve_spec(spec, catalog=catalog)
        await self.check_data(resolved.spec, catalog)
        if resolved.spec.HasField("init_adapter") and (resolved.spec.init_adapter.name or resolved.spec.init_adapter.path):
            resolved.spec.init_adapter.CopyFrom(await self.resolve_adapter(resolved.spec.init_adapter))
        if dry_run:
            return resolved, None
        row = await asyncio.to_thread(self.store.add_job, self._new_row(resolved))
        await self._queued(row)
        return resolved, job_to_proto(row)

    async def create_for_round(self, resolved: ResolvedJob, round_row: RoundRow) -> JobRow:
        """Queues a loop round's job: the job and the round row are stored in one transaction."""
        round_row, row = await asyncio.to_thread(self.store.add_round_with_job, round_row, self._new_row(resolved))
        await self._queued(row)
        return row

    @staticmethod
    def _new_row(resolved: ResolvedJob) -> JobRow:
        return JobRow(name=resolved.spec.name, spec_json=spec_to_json(resolved.spec), status="QUEUED",
                      warnings_json=json.dumps(resolved.warnings), total_steps=max(resolved.total_steps, 0))

    async def _queued(self, row: JobRow) -> None:
        await self._publish_status(row.id, "QUEUED", "queued")
        await self.notify()
        self._wake.set()

    async def check_data(self, spec: common_pb2.JobSpec, catalog: Catalog | None = None) -> None:
        """INVALID_ARGUMENT now for a base model no worker may load (a malformed hub id, a path outside
        the model roots: rlvr.models.check_base_model), or a dataset the trainer could not read or that
        lacks a column the job's rewards read (services/scheduler/datasets.py)."""
        check_base_model(spec.base_model, self.model_roots)
        await asyncio.to_thread(check_dataset, spec.reward, self.data_roots, catalog)

    async def resolve_adapter(self, ref: common_pb2.AdapterRef) -> common_pb2.AdapterRef:
        """A job's adapter named in a spec (`init_adapter`), with the folder the trainer reads.

        A name must be a job's adapter name ("job-<id>"), of a job that has one; version 0 means
        its final version, any other version must be that one (older versions are not kept).
        A bare path is passed on as given: the trainer checks it is a PEFT folder under its
        artifact root."""
        if not ref.name:
            return ref
        job_id = ref.name.removeprefix("job-")
        row = await asyncio.to_thread(self.store.get_job, job_id) if ref.name.startswith("job-") else None
        if row is None or not row.adapter_name:
            raise InvalidArgument(f"init_adapter.name: {shown(ref.name)} is not the adapter of a job; use a job's "
                                  "adapter name, job-<id>, as `rlvr jobs show` prints it")
        if not row.adapter_path:
            raise FailedPrecondition(f"init_adapter.name: job {row.id}'s adapter {ref.name} has no stored folder "
                                     "(it was never saved, or a loop reclaimed it); train on another job's adapter")
        if ref.version not in (0, row.adapter_version):
            raise InvalidArgument(f"init_adapter.version: {ref.version} is not kept; job {row.id} keeps its "
                                  f"final version {row.adapter_version} (0 = that one)")
        return common_pb2.AdapterRef(name=row.adapter_name, version=row.adapter_version, path=row.adapter_path)

    async def wait_job(self, job_id: str, until: Callable[[JobRow], bool], recheck_seconds: float = 5.0) -> JobRow:
        """The job's row once `until(row)` holds, woken by every stored change. The generation is
        read before the row, so a change stored in between is never slept through; the timed
        re-read covers a change another process stored."""
        while True:
            seen = self.generation
            row = await self._row(job_id)
            if until(row):
                return row
            await self.wait_change(seen, recheck_seconds)

    async def wait_change(self, seen: int, timeout: float) -> None:
        """Until `generation` moves past `seen`, or `timeout` seconds."""
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait_for(lambda: self.generation != seen), timeout)

    async def notify(self) -> None:
        async with self.changed:
            self.generation += 1
            self.changed.notify_all()

    async def get(self, job_id: str) -> common_pb2.Job:
        return job_to_proto(await self._row(job_id))

    async def list(self, status: int, limit: int, offset: int) -> tuple[list[common_pb2.Job], int]:
        check_page(limit, offset)
        if status and status not in common_pb2.JobStatus.values():
            raise InvalidArgument(f"status: {status} is not a JobStatus; allowed: "
                                  f"{', '.join(common_pb2.JobStatus.keys()[1:])} or unset for all")
        name = job_status_name(status) if status else None
        rows = await asyncio.to_thread(self.store.list_jobs, name, limit or 100, offset)
        total = await asyncio.to_thread(self.store.count_jobs, name)
        return [job_to_proto(r) for r in rows], total

    async def cancel(self, job_id: str) -> common_pb2.Job:
        async with self._lock:
            row = await self._row(job_id)
            if row.status in TERMINAL:
                raise FailedPrecondition(f"job {job_id} has already ended ({row.status}); nothing to cancel")
            fields: dict[str, object] = {"status": "CANCELLED", "finished_at": datetime.now(UTC)}
            if row.worker:  # RUNNING there, or QUEUED with its start there in doubt
                if row.worker not in self.workers.addresses:
                    raise Unavailable(f"job {job_id} is not cancelled: it runs on trainer {row.worker}, which is not "
                                      "one of this scheduler's trainer_addresses; add it back to cancel the job there")
                try:
                    adapter = await self.workers.cancel(row.worker, job_id)
                except JobNotOnWorker:
                    adapter = None  # not there (never started, or the worker restarted): nothing to stop
                except WorkerUnavailable as e:
                    raise Unavailable(f"job {job_id} is not cancelled: {e}; try again") from None
                if adapter is not None:
                    fields.update(adapter_name=adapter.name, adapter_version=adapter.version,
                                  adapter_path=adapter.path)
            row = await asyncio.to_thread(self.store.update_job, job_id, **fields)
        await self._publish_status(job_id, "CANCELLED", "cancelled by request")
        await self.notify()
        self._wake.set()
        return job_to_proto(row)

    async def delete(self, job_id: str, remove_files: Callable[[JobRow], int]) -> int:
        """Deletes a finished job: `remove_files(row)` first (its files; returns the bytes freed),
        then its rows. Under the job lock, so no status lands in between. FailedPrecondition for a
        job that has not ended, that an open loop uses as a round, or whose adapter a job that has
        not ended starts from."""
        async with self._lock:
            row = await self._row(job_id)
            if row.status not in TERMINAL:
                raise FailedPrecondition(f"job {job_id} is {row.status}; cancel it first "
                                         f"(rlvr jobs cancel {job_id}), then delete it")
            await self._check_unused(row)
            freed = await asyncio.to_thread(remove_files, row)
            await asyncio.to_thread(self.store.delete_job, job_id)
        log.info("job %s deleted (%d bytes of files freed)", job_id, freed)
        await self.notify()
        return freed

    async def _check_unused(self, row: JobRow) -> None:
        for round_ in await asyncio.to_thread(self.store.rounds_of_job, row.id):
            loop = await asyncio.to_thread(self.store.get_loop, round_.loop_id)
            if loop is not None and loop.status not in LOOP_FINAL_STATUSES:
                raise FailedPrecondition(f"job {row.id} is round {round_.index} of loop {loop.id}, which is "
                                         f"{loop.status}; stop the loop first (rlvr loops stop {loop.id}) "
                                         "or delete the job once the loop has ended")
        if not row.adapter_name:
            return
        for other in await asyncio.to_thread(self.store.list_jobs, ["QUEUED", "RUNNING"], 100_000, 0):
            ref = spec_from_json(other.spec_json).init_adapter
            if ref.name == row.adapter_name or (row.adapter_path and ref.path == row.adapter_path):
                raise FailedPrecondition(f"job {other.id} ({other.status}) starts from the adapter of job "
                                         f"{row.id}; delete it once that job has ended")

    async def watch(self, job_id: str, from_start: bool) -> AsyncIterator[common_pb2.JobEvent]:
        """Status and metric events until the job ends. A finished job replays from the store.

        Live events come off the stream, but the final status is given only once the store holds
        the job's end (so every step too: see the module docstring), bounded by STORE_GRACE_S: a
        client that reads the job when its watch ends sees it ended. The store is watched
        alongside, so a watch also ends when the job's end never reaches the stream (a status the
        scheduler stored but could not publish)."""
        row = await self._row(job_id)
        if row.status in TERMINAL or self.bus is None:
            if from_start:
                for point in await asyncio.to_thread(self.store.metric_points, job_id):
                    yield common_pb2.JobEvent(metric=metric_event_from_row(point, job_id))
            yield common_pb2.JobEvent(status=self._status_event(row))
            return
        yield common_pb2.JobEvent(status=self._status_event(row))
        events = aiter(self.bus.watch(job_events_subject(job_id), from_start=from_start))
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
                        yield common_pb2.JobEvent(status=self._status_event(stored_end.result()))
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
                            status = self._status_event(stored)
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
                return await self.wait_job(job_id, lambda r: r.status in TERMINAL)
            except NotFound:
                raise
            except Exception as e:  # a watch must not end on a store hiccup
                log.warning("watch of job %s: reading the store failed (%s); trying again", job_id, e)
                await asyncio.sleep(self.poll_seconds)

    async def job_row(self, job_id: str) -> JobRow:
        """The stored row of a job; NotFound naming the id when there is none."""
        return await self._row(job_id)

    async def metric_points(self, job_id: str) -> builtins.list[MetricPointRow]:
        """The job's stored steps, in step order."""
        return await asyncio.to_thread(self.store.metric_points, job_id)

    # ------------------------------------------------------------------ internals

    async def _row(self, job_id: str) -> JobRow:
        row = await asyncio.to_thread(self.store.get_job, job_id)
        if row is None:
            raise NotFound(f"job {job_id!r} not found")
        return row

    @staticmethod
    def _status_event(row: JobRow) -> common_pb2.JobStatusEvent:
        event = common_pb2.JobStatusEvent(job_id=row.id, status=job_status_value(row.status),
                                          message=row.error, current_step=row.current_step, time=now_ts())
        if row.adapter_name:
            event.adapter.CopyFrom(common_pb2.AdapterRef(name=row.adapter_name, version=row.adapter_version,
                                                         path=row.adapter_path))
        return event

    async def _publish_status(self, job_id: str, status: str, message: str,
                              adapter: common_pb2.AdapterRef | None = None, again: str = "") -> None:
        """`again` names a repeat of a status the job had before (a resume's QUEUED and RUNNING): it
        goes into the message id, or the stream would drop the event as the first one's duplicate."""
        if self.bus is None:
            return
        event = common_pb2.JobStatusEvent(job_id=job_id, status=job_status_value(status), message=message,
                                          time=now_ts())
        if adapter is not None:
            event.adapter.CopyFrom(adapter)
        try:
            await self.bus.publish(job_status_subject(job_id), event.SerializeToString(),
                                   status_msg_id(job_id, status, again))
        except Exception as e:  # the store has it already: a watch sees it there (see `watch`)
            log.warning("could not publish status of %s: %s", job_id, e)

    async def _on_event(self, event: Event) -> None:
        """Every job event, in stream order (one durable consumer): a step's metrics are stored
        before a later status of the same job is. An event that cannot be decoded, or of a job
        this store does not know, is skipped: retrying it could never succeed, and it would hold
        back every later event."""
        kind = event.subject.rsplit(".", 1)[-1]
        try:
            if kind == "metrics":
                await self._on_metric(common_pb2.MetricEvent.FromString(event.data))
            elif kind == "status":
                await self._on_status(common_pb2.JobStatusEvent.FromString(event.data))
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
            await asyncio.to_thread(self.store.update_job, metric.job_id, current_step=metric.step)
            await self.notify()

    async def _on_status(self, status: common_pb2.JobStatusEvent) -> None:
        await self._apply_status(status.job_id, job_status_name(status.status), status.message,
                                 status.adapter if status.adapter.name else None)

    async def _apply_status(self, job_id: str, status: str, message: str,
                            adapter: common_pb2.AdapterRef | None) -> bool:
        """Stores a status transition; False when there was none to store (unknown job, the same
        status, QUEUED, or a job that has ended: only a missing adapter is still filled in).

        RUNNING is taken for a queued job only while its start is in doubt on a worker (`worker`
        set): one queued with no worker has no job process, so its RUNNING is a late event from a
        run that was lost and queued again (a lagging or replaying consumer), and storing it would
        leave the job RUNNING nowhere, never dispatched again."""
        async with self._lock:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            stale = row is not None and status == "RUNNING" and row.status == "QUEUED" and not row.worker
            if row is None or row.status in TERMINAL or status in ("QUEUED", row.status) or stale:
                if row is not None and adapter is not None and row.status in TERMINAL and not row.adapter_name:
                    await asyncio.to_thread(self.store.update_job, job_id, adapter_name=adapter.name,
                                            adapter_version=adapter.version, adapter_path=adapter.path)
                return False
            fields: dict[str, object] = {"status": status}
            if status == "RUNNING" and row.started_at is None:
                fields["started_at"] = datetime.now(UTC)
            if status in TERMINAL:
                fields["finished_at"] = datetime.now(UTC)
                if status == "FAILED":
                    fields["error"] = message or "failed without a message"
            if adapter is not None:
                fields.update(adapter_name=adapter.name, adapter_version=adapter.version, adapter_path=adapter.path)
            await asyncio.to_thread(self.store.update_job, job_id, **fields)
        await self.notify()
        if status in TERMINAL:
            self._wake.set()
        return True

    async def _dispatch_loop(self) -> None:
        while True:
            try:
                await self.dispatch_once()
            except Exception:
                log.exception("dispatch round failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)

    async def dispatch_once(self) -> None:
        """Reconciles running jobs with their workers, settles the starts in doubt, then gives each
        queued job (oldest first) to an idle worker that can run it (fit.py). A job that no idle
        worker fits stays queued with the reason stored (`queue_reason`), and does not hold back
        the younger jobs behind it."""
        running = await asyncio.to_thread(self.store.list_jobs, "RUNNING", 1000, 0)
        busy_workers = {r.worker for r in running}
        states = {a: await self.workers.status(a) for a in self.workers.addresses}
        for row in running:
            state = states.get(row.worker)
            if state is None or state.job_id == row.id:
                continue  # unreachable (keep waiting) or still at work
            if state.last_job_id == row.id and state.last_status in TERMINAL and not state.last_lost:
                status, message, adapter = state.last_status, state.last_error, state.last_adapter
                if await self._apply_status(row.id, status, message, adapter):
                    await self._publish_status(row.id, status, message or status.lower(), adapter)
            else:
                await self._lost(row, state)
            busy_workers.discard(row.worker)
        # The store lists newest first; the queue is served oldest first.
        queued = await asyncio.to_thread(self.store.list_jobs, "QUEUED", 10_000, 0)
        queued.sort(key=lambda r: r.created_at)
        free: list[JobRow] = []
        for row in queued:
            if not row.worker:
                free.append(row)
            elif await self._settle_doubt(row, states.get(row.worker)):
                busy_workers.add(row.worker)  # running there, or still in doubt: that worker is taken
            else:
                free.append(row)
        live = {a: s for a, s in states.items() if s is not None}
        idle = [a for a, s in live.items() if not s.busy and a not in busy_workers]
        # What each worker can run changes rarely: a job's fit is worked out again only when it does.
        workers_seen = tuple((a, s.name, s.capabilities.SerializeToString(deterministic=True)
                              if s.capabilities is not None else None) for a, s in sorted(live.items()))
        self._fits = {row.id: self._fits[row.id] for row in free if row.id in self._fits}
        for row in free:
            seen, reasons = self._fits.get(row.id, (None, {}))
            if seen != workers_seen:
                spec = spec_from_json(row.spec_json)
                reasons = {a: fit(spec, s.capabilities, s.name or a) for a, s in live.items()}
                self._fits[row.id] = (workers_seen, reasons)
            address = next((a for a in idle if reasons[a] is None), None)
            if address is not None:
                idle.remove(address)  # taken, even if StartJob is refused: next round
                await self._start_on(row, address)
            else:
                await self._set_queue_reason(row, queue_reason(reasons, len(self.workers.addresses)))

    async def _set_queue_reason(self, row: JobRow, reason: str) -> None:
        """Stores why a queued job waits, and publishes it as a QUEUED status message, only when it
        changed (a dispatch round runs every poll_seconds)."""
        if reason == row.queue_reason:
            return
        async with self._lock:
            current = await asyncio.to_thread(self.store.get_job, row.id)
            if current is None or current.status != "QUEUED" or current.worker or current.queue_reason == reason:
                return  # dispatched, cancelled or in doubt meanwhile, or already said
            await asyncio.to_thread(self.store.update_job, row.id, queue_reason=reason)
        log.info("job %s waits: %s", row.id, reason)
        await self.notify()
        # Each change its own id (a reason can come back within the stream's duplicate window: a
        # worker restarting and answering again); the store's reason keeps a restart from repeating it.
        await self._publish_status(row.id, "QUEUED", reason, again=f"waits-{time.time_ns()}")

    async def _lost(self, row: JobRow, state: WorkerState) -> None:
        """A running job its worker no longer runs, though it did not end there: queued again to
        be resumed, or failed once its resumes are spent (see the module's doc)."""
        reported = state.last_job_id == row.id
        why = state.last_error if reported and state.last_error else \
            f"trainer {row.worker} no longer runs this job (worker restarted?)"
        done = row.resumes
        if done >= MAX_RESUMES:
            message = f"{why}; not resumed again after {done} resumes" if done else why
            adapter = state.last_adapter if reported else None
            if await self._apply_status(row.id, "FAILED", message, adapter):
                await self._publish_status(row.id, "FAILED", message, adapter)
            return
        async with self._lock:
            current = await asyncio.to_thread(self.store.get_job, row.id)
            if current is None or current.status != "RUNNING" or current.worker != row.worker:
                return  # ended or moved meanwhile
            done = current.resumes
            await asyncio.to_thread(self.store.update_job, row.id, status="QUEUED", worker="", resumes=done + 1)
        message = (f"resuming from the last checkpoint after the trainer was lost at step {current.current_step} "
                   f"({why}); resume {done + 1} of {MAX_RESUMES}")
        log.warning("job %s: %s", row.id, message)
        await self.notify()
        await self._publish_status(row.id, "QUEUED", message, again=f"resume-{done + 1}")
        self._wake.set()

    async def _settle_doubt(self, row: JobRow, state: WorkerState | None) -> bool:
        """A queued job whose StartJob on `row.worker` had no answer: True when it runs there (now
        RUNNING) or that worker still cannot say; False when the worker does not have it (the job
        is free to be dispatched again)."""
        if state is None and row.worker in self.workers.addresses:
            return True  # still unreachable: try no other worker
        async with self._lock:
            current = await asyncio.to_thread(self.store.get_job, row.id)
            if current is None or current.status != "QUEUED" or current.worker != row.worker:
                return current is not None and current.status == "RUNNING"
            if state is not None and state.has_job(row.id):
                await self._mark_running(row.id, row.worker, first=current.started_at is None)
            else:
                log.info("job %s did not start on %s; it is queued again", row.id, row.worker)
                await asyncio.to_thread(self.store.update_job, row.id, worker="")
                return False
        await self._running(row.id, row.worker)
        return True

    async def _start_on(self, row: JobRow, address: str) -> None:
        """StartJob on `address`; every outcome is handled here (see the module docstring)."""
        async with self._lock:
            current = await asyncio.to_thread(self.store.get_job, row.id)
            if current is None or current.status != "QUEUED" or current.worker:
                return  # cancelled, dispatched or in doubt meanwhile
            error = ""
            # A job that ran before (queued again after its trainer was lost) goes on from its checkpoint.
            resume = current.started_at is not None or current.resumes > 0
            try:
                await self.workers.start(address, row.id, spec_from_json(row.spec_json), row.total_steps,
                                         resume=resume, stored_steps=current.current_step)
            except WorkerBusy:
                return  # another job holds the worker: next round
            except WorkerUnavailable as e:
                state = await self.workers.status(address)
                if state is None:
                    log.warning("StartJob of %s on %s has no answer (%s) and the worker cannot be asked: "
                                "the job waits for it", row.id, address, e)
                    await asyncio.to_thread(self.store.update_job, row.id, worker=address)
                    return
                if not state.has_job(row.id):
                    log.warning("job %s did not start on %s (%s); next round tries again", row.id, address, e)
                    return
                log.info("job %s runs on %s although StartJob had no answer (%s)", row.id, address, e)
            except WorkerError as e:
                error = str(e) or type(e).__name__
            if error:
                await asyncio.to_thread(self.store.update_job, row.id, status="FAILED", error=error,
                                        finished_at=datetime.now(UTC))
            else:
                await self._mark_running(row.id, address, first=not resume)
        if error:
            await self.notify()
            await self._publish_status(row.id, "FAILED", error)
            self._wake.set()
        else:
            await self._running(row.id, address, current.resumes if resume else None)

    async def _mark_running(self, job_id: str, address: str, first: bool = True) -> None:
        """Under the lock: the job is RUNNING on `address` (started now, unless it ran before a resume)."""
        fields: dict[str, object] = {"status": "RUNNING", "worker": address, "queue_reason": ""}
        if first:
            fields["started_at"] = datetime.now(UTC)
        await asyncio.to_thread(self.store.update_job, job_id, **fields)

    async def _running(self, job_id: str, address: str, resumes: int | None = None) -> None:
        """After `_mark_running`, out of the lock: tell the watchers. `resumes`: the job's count
        when this start is a resume (None: its first start)."""
        log.info("dispatched job %s to %s%s", job_id, address, "" if resumes is None else " to resume")
        await self.notify()
        if resumes is not None:
            await self._publish_status(job_id, "RUNNING", f"resumed on {address}", again=f"resume-{resumes}")
        else:
            await self._publish_status(job_id, "RUNNING", f"started on {address}")
