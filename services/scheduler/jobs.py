"""The scheduler's job core: create, list, cancel, dispatch to trainer workers, and fold the
events of running jobs into the store.

State flows one way: a job row is the record. Transitions the scheduler makes itself (queued,
dispatched, cancelled, a worker found dead) are written to the store first and then published as
status events; transitions the trainer's job process makes (running, completed, failed) arrive
as status events on NATS and are written by the durable consumer. Status event ids are
`<job>:status:<STATUS>`, so the two publishers of the same transition are deduplicated by the
stream, and a terminal status is never overwritten by a late non-terminal one.

The trainer workers are reached through the small `Workers` interface; `GrpcWorkers` is the real
one, tests may pass their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import grpc

from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound
from rlvr.infra.events import (
    ALL_JOB_METRICS,
    EventBus,
    cancel_and_wait,
    job_events_subject,
    job_status_subject,
)
from rlvr.infra.schema import JobRow, MetricPointRow, RoundRow, metric_point_from_event
from rlvr.infra.store import Store
from rlvr.jobspec import ResolvedJob, resolve_spec
from rlvr.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc
from services.scheduler.convert import (
    TERMINAL,
    job_status_name,
    job_status_value,
    job_to_proto,
    metric_event_from_row,
    now_ts,
    spec_to_json,
)
from services.scheduler.datasets import check_dataset

log = logging.getLogger("rlvr.scheduler.jobs")

ALL_JOB_STATUS = "rlvr.jobs.*.status"


@dataclass
class WorkerState:
    address: str
    name: str
    busy: bool
    job_id: str
    last_job_id: str = ""
    last_status: str = ""
    last_error: str = ""
    last_adapter: common_pb2.AdapterRef | None = None


class Workers(Protocol):
    addresses: Sequence[str]

    async def status(self, address: str) -> WorkerState | None: ...
    async def start(self, address: str, job_id: str, spec: common_pb2.JobSpec, total_steps: int) -> str: ...
    async def cancel(self, address: str, job_id: str) -> common_pb2.AdapterRef | None: ...


class GrpcWorkers:
    """Trainer workers over gRPC (deadlines and retries from rlvr.common.client)."""

    def __init__(self, addresses: Sequence[str]) -> None:
        from rlvr.common.client import make_channel

        self.addresses = list(addresses)
        self._stubs = {a: trainer_pb2_grpc.TrainerServiceStub(make_channel(a, aio=True)) for a in addresses}

    async def status(self, address: str) -> WorkerState | None:
        try:
            s = await self._stubs[address].GetWorkerStatus(trainer_pb2.GetWorkerStatusRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            log.warning("worker %s unreachable: %s", address, e.code().name)
            return None
        last = job_status_name(s.last_job_status) if s.last_job_status else ""
        return WorkerState(address=address, name=s.worker, busy=s.busy, job_id=s.job_id,
                           last_job_id=s.last_job_id, last_status=last, last_error=s.last_job_error,
                           last_adapter=s.last_job_adapter if s.last_job_adapter.name else None)

    async def start(self, address: str, job_id: str, spec: common_pb2.JobSpec, total_steps: int) -> str:
        resp = await self._stubs[address].StartJob(
            trainer_pb2.StartJobRequest(job_id=job_id, spec=spec, total_steps=total_steps), timeout=60)
        return resp.worker

    async def cancel(self, address: str, job_id: str) -> common_pb2.AdapterRef | None:
        resp = await self._stubs[address].CancelJob(trainer_pb2.TrainerCancelJobRequest(job_id=job_id),
                                                    timeout=60)
        return resp.adapter if resp.adapter.name else None

    def merge(self, address: str, request: trainer_pb2.MergeAdapterRequest
              ) -> AsyncIterator[trainer_pb2.MergeProgress]:
        """MergeAdapter on one worker: its progress stream (the call's deadline is the method's
        default, an hour; cancelling the iteration cancels the merge there)."""
        from rlvr.common.client import deadline_for

        return self._stubs[address].MergeAdapter(
            request, timeout=deadline_for("rlvr.v1.TrainerService/MergeAdapter"))


class JobManager:
    def __init__(self, store: Store, bus: EventBus | None, workers: Workers, poll_seconds: float = 1.0,
                 data_roots: Sequence[Path] = ()) -> None:
        self.store = store
        self.data_roots = tuple(data_roots)  # where a Boxed-answer job's local data may be read at submit
        self.bus = bus
        self.workers = workers
        self.poll_seconds = poll_seconds
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[object] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        # Every stored change of a job (status, step, adapter) bumps `generation` and notifies
        # `changed`: `wait_job` and the loop watchers sleep on it (the loop manager bumps it too).
        self.changed = asyncio.Condition()
        self.generation = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.bus is not None:
            self._subs.append(await self.bus.subscribe_durable(ALL_JOB_METRICS, "scheduler-metrics",
                                                               self._on_metric))
            self._subs.append(await self.bus.subscribe_durable(ALL_JOB_STATUS, "scheduler-job-status",
                                                               self._on_status))
        self._tasks.append(asyncio.create_task(self._dispatch_loop(), name="dispatch"))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.stop()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ API

    async def create(self, spec: common_pb2.JobSpec, dry_run: bool) -> tuple[ResolvedJob, common_pb2.Job | None]:
        resolved = resolve_spec(spec)
        await self.check_data(resolved.spec)
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

    async def check_data(self, spec: common_pb2.JobSpec) -> None:
        """INVALID_ARGUMENT now for a dataset the trainer could not read (services/scheduler/datasets.py)."""
        await asyncio.to_thread(check_dataset, spec.reward, self.data_roots)

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
            raise InvalidArgument(f"init_adapter.name: {ref.name!r} is not the adapter of a job; use a job's "
                                  "adapter name, job-<id>, as `rlvr jobs show` prints it")
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
            if row.status == "RUNNING" and row.worker:
                adapter = await self.workers.cancel(row.worker, job_id)
                if adapter is not None:
                    fields.update(adapter_name=adapter.name, adapter_version=adapter.version,
                                  adapter_path=adapter.path)
            row = await asyncio.to_thread(self.store.update_job, job_id, **fields)
        await self._publish_status(job_id, "CANCELLED", "cancelled by request")
        await self.notify()
        self._wake.set()
        return job_to_proto(row)

    async def watch(self, job_id: str, from_start: bool) -> AsyncIterator[common_pb2.JobEvent]:
        """Status and metric events until the job ends. A finished job replays from the store."""
        row = await self._row(job_id)
        if row.status in TERMINAL or self.bus is None:
            if from_start:
                for point in await asyncio.to_thread(self.store.metric_points, job_id):
                    yield common_pb2.JobEvent(metric=metric_event_from_row(point, job_id))
            yield common_pb2.JobEvent(status=self._status_event(row))
            return
        yield common_pb2.JobEvent(status=self._status_event(row))
        async for event in self.bus.watch(job_events_subject(job_id), from_start=from_start):
            if event.subject.endswith(".metrics"):
                yield common_pb2.JobEvent(metric=common_pb2.MetricEvent.FromString(event.data))
            elif event.subject.endswith(".status"):
                status = common_pb2.JobStatusEvent.FromString(event.data)
                yield common_pb2.JobEvent(status=status)
                if job_status_name(status.status) in TERMINAL:
                    return

    async def job_row(self, job_id: str) -> JobRow:
        """The stored row of a job; NotFound naming the id when there is none."""
        return await self._row(job_id)

    async def metric_points(self, job_id: str) -> list[MetricPointRow]:
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

    async def _publish_status(self, job_id: str, status: str, message: str) -> None:
        if self.bus is None:
            return
        event = common_pb2.JobStatusEvent(job_id=job_id, status=job_status_value(status), message=message,
                                          time=now_ts())
        try:
            await self.bus.publish(job_status_subject(job_id), event.SerializeToString(),
                                   f"{job_id}:status:{status}")
        except Exception as e:  # the store already has it; a watcher falls back on polling
            log.warning("could not publish status of %s: %s", job_id, e)

    async def _on_metric(self, event: object) -> None:
        metric = common_pb2.MetricEvent.FromString(event.data)  # type: ignore[attr-defined]
        stored = await asyncio.to_thread(self.store.add_metric_point, metric_point_from_event(metric))
        if stored:
            row = await asyncio.to_thread(self.store.get_job, metric.job_id)
            if row is not None and metric.step > row.current_step:
                await asyncio.to_thread(self.store.update_job, metric.job_id, current_step=metric.step)
                await self.notify()

    async def _on_status(self, event: object) -> None:
        status = common_pb2.JobStatusEvent.FromString(event.data)  # type: ignore[attr-defined]
        await self._apply_status(status.job_id, job_status_name(status.status), status.message,
                                 status.adapter if status.adapter.name else None)

    async def _apply_status(self, job_id: str, status: str, message: str,
                            adapter: common_pb2.AdapterRef | None) -> None:
        async with self._lock:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            if row is None or row.status in TERMINAL or status in ("QUEUED", row.status):
                if row is not None and adapter is not None and row.status in TERMINAL and not row.adapter_name:
                    await asyncio.to_thread(self.store.update_job, job_id, adapter_name=adapter.name,
                                            adapter_version=adapter.version, adapter_path=adapter.path)
                return
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
        """Reconciles running jobs with their workers, then gives queued jobs to idle workers."""
        running = await asyncio.to_thread(self.store.list_jobs, "RUNNING", 1000, 0)
        busy_workers = {r.worker for r in running}
        states = {a: await self.workers.status(a) for a in self.workers.addresses}
        for row in running:
            state = states.get(row.worker)
            if state is None or state.job_id == row.id:
                continue  # unreachable (keep waiting) or still at work
            if state.last_job_id == row.id and state.last_status in TERMINAL:
                await self._apply_status(row.id, state.last_status, state.last_error, state.last_adapter)
            else:
                await self._apply_status(row.id, "FAILED",
                                         f"trainer {row.worker} no longer runs this job (worker restarted?)", None)
            busy_workers.discard(row.worker)
        idle = [a for a, s in states.items() if s is not None and not s.busy and a not in busy_workers]
        if not idle:
            return
        # The store lists newest first; the queue is served oldest first.
        queued = await asyncio.to_thread(self.store.list_jobs, "QUEUED", 10_000, 0)
        for row, address in zip(sorted(queued, key=lambda r: r.created_at), idle, strict=False):
            await self._start_on(row, address)

    async def _start_on(self, row: JobRow, address: str) -> None:
        from services.scheduler.convert import spec_from_json

        async with self._lock:
            current = await asyncio.to_thread(self.store.get_job, row.id)
            if current is None or current.status != "QUEUED":
                return  # cancelled meanwhile
            try:
                await self.workers.start(address, row.id, spec_from_json(row.spec_json), row.total_steps)
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return  # try again next round
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "busy" in (e.details() or ""):
                    return
                error = e.details() or e.code().name
                await asyncio.to_thread(self.store.update_job, row.id, status="FAILED", error=error,
                                        finished_at=datetime.now(UTC))
            else:
                error = ""
                await asyncio.to_thread(self.store.update_job, row.id, status="RUNNING", worker=address,
                                        started_at=datetime.now(UTC))
        await self.notify()
        if error:
            await self._publish_status(row.id, "FAILED", error)
        else:
            log.info("dispatched job %s to %s", row.id, address)
            await self._publish_status(row.id, "RUNNING", f"started on {address}")
