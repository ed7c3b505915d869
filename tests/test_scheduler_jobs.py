"""The scheduler's job core over a real store and a real NATS: create, dispatch to a worker,
metric events stored exactly once, status transitions, cancel, watch."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from fixtures_infra import connected_bus

from rlvr.common.errors import FailedPrecondition, NotFound
from rlvr.infra.events import job_metrics_subject, job_status_subject, metric_msg_id
from rlvr.infra.store import Store
from rlvr.v1 import common_pb2 as C
from services.scheduler.jobs import JobManager, WorkerState


class FakeWorkers:
    """Two trainer workers that accept jobs and report them running until told otherwise."""

    def __init__(self, n: int = 1) -> None:
        self.addresses = [f"w{i}:1" for i in range(n)]
        self.running: dict[str, str] = {}
        self.started: list[tuple[str, str, int]] = []
        self.cancelled: list[str] = []
        self.last: dict[str, tuple[str, str]] = {}

    def finish(self, job_id: str, status: str) -> None:
        """The job ends on its worker, which then reports it as its last job (like a real trainer)."""
        for address, job in list(self.running.items()):
            if job == job_id:
                del self.running[address]
                self.last[address] = (job_id, status)

    async def status(self, address: str) -> WorkerState:
        job = self.running.get(address, "")
        last_job, last_status = self.last.get(address, ("", ""))
        return WorkerState(address=address, name=address, busy=bool(job), job_id=job, last_job_id=last_job,
                           last_status=last_status)

    async def start(self, address: str, job_id: str, spec: C.JobSpec, total_steps: int) -> str:
        assert spec.grpo.batch_size % spec.grpo.group_size == 0  # the resolved spec is sent
        self.running[address] = job_id
        self.started.append((address, job_id, total_steps))
        return address

    async def cancel(self, address: str, job_id: str) -> C.AdapterRef:
        self.cancelled.append(job_id)
        self.running.pop(address, None)
        return C.AdapterRef(name=f"job-{job_id}", version=3, path="/a")


async def _until(pred, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    s.create_all()
    yield s
    s.close()


async def test_queue_dispatch_metrics_once_and_complete(nats_server, sqlite_store: Store) -> None:
    workers = FakeWorkers(n=1)
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers, poll_seconds=0.1)
        await jobs.start()
        try:
            spec = C.JobSpec()
            spec.grpo.max_steps = 3
            _, first = await jobs.create(spec, dry_run=False)
            _, second = await jobs.create(spec, dry_run=False)
            assert first.status == C.JOB_STATUS_QUEUED and first.spec.grpo.batch_size == 8

            async def first_running() -> bool:
                return (await jobs.get(first.id)).status == C.JOB_STATUS_RUNNING
            await _until(first_running)
            # One worker: the second job waits in the queue.
            await asyncio.sleep(0.3)
            assert (await jobs.get(second.id)).status == C.JOB_STATUS_QUEUED
            assert workers.started == [("w0:1", first.id, 3)]

            # The trainer publishes its steps, step 2 twice (a retry): stored exactly once.
            for step in (1, 2, 2, 3):
                ev = C.MetricEvent(job_id=first.id, step=step, total_steps=3, reward_mean=0.1 * step, loss=1.0)
                await bus.publish(job_metrics_subject(first.id), ev.SerializeToString(),
                                  metric_msg_id(first.id, step))
            done = C.JobStatusEvent(job_id=first.id, status=C.JOB_STATUS_COMPLETED,
                                    adapter=C.AdapterRef(name=f"job-{first.id}", version=3, path="/x"))
            await bus.publish(job_status_subject(first.id), done.SerializeToString(), f"{first.id}:status:COMPLETED")
            workers.finish(first.id, "COMPLETED")

            async def first_done() -> bool:
                # Status and metrics arrive on two consumers: wait for both.
                job = await jobs.get(first.id)
                return job.status == C.JOB_STATUS_COMPLETED and job.current_step == 3
            await _until(first_done)
            points = sqlite_store.metric_points(first.id)
            assert [p.step for p in points] == [1, 2, 3]
            job = await jobs.get(first.id)
            assert job.adapter.version == 3 and job.current_step == 3 and job.HasField("finished_at")

            async def second_running() -> bool:
                return (await jobs.get(second.id)).status == C.JOB_STATUS_RUNNING
            await _until(second_running)

            # Watch a finished job: stored steps, then the final status.
            events = [e async for e in jobs.watch(first.id, from_start=True)]
            assert [e.metric.step for e in events if e.HasField("metric")] == [1, 2, 3]
            assert events[-1].status.status == C.JOB_STATUS_COMPLETED
        finally:
            await jobs.stop()


async def test_cancel_queued_and_running(nats_server, sqlite_store: Store) -> None:
    workers = FakeWorkers(n=1)
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers, poll_seconds=0.1)
        await jobs.start()
        try:
            _, running = await jobs.create(C.JobSpec(), dry_run=False)
            _, queued = await jobs.create(C.JobSpec(), dry_run=False)

            async def is_running() -> bool:
                return (await jobs.get(running.id)).status == C.JOB_STATUS_RUNNING
            await _until(is_running)

            live: list[C.JobEvent] = []

            async def watch() -> None:
                async for e in jobs.watch(running.id, from_start=True):
                    live.append(e)
            watcher = asyncio.create_task(watch())
            cancelled = await jobs.cancel(running.id)
            assert cancelled.status == C.JOB_STATUS_CANCELLED and workers.cancelled == [running.id]
            assert cancelled.adapter.version == 3  # the partial adapter is kept
            await asyncio.wait_for(watcher, timeout=10)
            assert live[-1].status.status == C.JOB_STATUS_CANCELLED
            # The queued one is cancelled without a worker; then the worker is free again.
            assert (await jobs.cancel(queued.id)).status == C.JOB_STATUS_CANCELLED
            with pytest.raises(FailedPrecondition, match="already ended"):
                await jobs.cancel(queued.id)
            with pytest.raises(NotFound):
                await jobs.get(uuid.uuid4().hex[:12])
            jobs_list, total = await jobs.list(C.JOB_STATUS_CANCELLED, 0, 0)
            assert total == 2 and {j.id for j in jobs_list} == {running.id, queued.id}
        finally:
            await jobs.stop()


async def test_dry_run_starts_nothing(sqlite_store: Store) -> None:
    jobs = JobManager(sqlite_store, None, FakeWorkers())
    resolved, job = await jobs.create(C.JobSpec(), dry_run=True)
    assert job is None and resolved.summary.method == "RLVR (GRPO)"
    assert sqlite_store.count_jobs() == 0


async def test_worker_that_lost_its_job_fails_it(sqlite_store: Store) -> None:
    workers = FakeWorkers()
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    assert (await jobs.get(job.id)).status == C.JOB_STATUS_RUNNING
    workers.running.clear()  # the worker restarted and forgot it
    await jobs.dispatch_once()
    failed = await jobs.get(job.id)
    assert failed.status == C.JOB_STATUS_FAILED and "no longer runs" in failed.error
