"""The scheduler's job core over a real store and a real NATS: create, dispatch to a worker (every
outcome of StartJob), metric events stored exactly once and never behind the status that ends
their job, status transitions, cancel, watch; and the gRPC adapter's reading of status codes."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import time
import uuid
from pathlib import Path

import grpc
import pytest
from fixtures_infra import connected_bus

from rlvr.common.errors import FailedPrecondition, NotFound, Unavailable
from rlvr.infra.events import Event
from rlvr.infra.store import Store
from rlvr.infra.subjects import job_metrics_subject, job_status_subject, metric_msg_id
from rlvr.services.scheduler import dispatch as dispatch_module
from rlvr.services.scheduler import jobs as jobs_module
from rlvr.services.scheduler.jobs import MAX_RESUMES, JobManager
from rlvr.services.scheduler.workers import (
    GrpcWorkers,
    JobNotOnWorker,
    MergeOutputExists,
    WorkerBusy,
    WorkerFailed,
    WorkerRejected,
    WorkerState,
    WorkerUnavailable,
)
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T
from rlvr.v1 import trainer_pb2_grpc


class FakeWorkers:
    """Trainer workers (one by default) that accept jobs and report them running until told
    otherwise. StartJob is idempotent by job id and refuses another job while one runs, as a real
    trainer does. `fail_next[address] = (error, started, down)` scripts the next StartJob there: it
    raises `error`, after starting the job when `started`, and leaves the worker unreachable (its
    status None) when `down`; `down` holds the unreachable addresses. `capabilities[address]` is
    what that worker reports it can run (none reported: it fits every job)."""

    def __init__(self, n: int = 1) -> None:
        self.addresses = [f"w{i}:1" for i in range(n)]
        self.running: dict[str, str] = {}
        self.started: list[tuple[str, str, int]] = []  # the jobs really started
        self.calls: list[tuple[str, str]] = []  # every StartJob
        self.cancelled: list[str] = []
        self.last: dict[str, tuple[str, str]] = {}
        self.down: set[str] = set()
        self.fail_next: dict[str, tuple[Exception, bool, bool]] = {}
        self.lost: set[str] = set()  # addresses whose last job's process died without a result
        self.adapters: dict[str, C.AdapterRef] = {}  # the adapter of each address's last job
        self.resumes: list[tuple[str, bool, int]] = []  # (job, resume, stored_steps) of each job really started
        self.capabilities: dict[str, T.WorkerCapabilities] = {}
        self.sources: dict[str, dict[str, str]] = {}  # each job's last StartJob: the workers holding its folders

    def finish(self, job_id: str, status: str) -> None:
        """The job ends on its worker, which then reports it as its last job (like a real trainer)."""
        for address, job in list(self.running.items()):
            if job == job_id:
                del self.running[address]
                self.last[address] = (job_id, status)

    def lose(self, job_id: str, error: str, step: int = 0) -> None:
        """The job's process dies without a result (kill -9, out of memory) after `step` steps, as a
        trainer reports it: with the adapter of that step."""
        for address, job in list(self.running.items()):
            if job == job_id:
                del self.running[address]
                self.last[address] = (job_id, f"FAILED:{error}")
                self.lost.add(address)
                self.adapters[address] = C.AdapterRef(name=f"job-{job_id}", version=step, path=f"/a/{job_id}")

    async def status(self, address: str) -> WorkerState | None:
        if address in self.down:
            return None
        job = self.running.get(address, "")
        last_job, last_status = self.last.get(address, ("", ""))
        last_status, _, last_error = last_status.partition(":")
        return WorkerState(address=address, name=address, busy=bool(job), job_id=job, last_job_id=last_job,
                           last_status=last_status, last_error=last_error, last_lost=address in self.lost,
                           last_adapter=self.adapters.get(address), capabilities=self.capabilities.get(address))

    async def start(self, address: str, job_id: str, spec: C.JobSpec, total_steps: int, resume: bool = False,
                    stored_steps: int = 0, **sources: str) -> str:
        assert spec.grpo.batch_size % spec.grpo.group_size == 0  # the resolved spec is sent
        self.calls.append((address, job_id))
        self.sources[job_id] = {k: v for k, v in sources.items() if v}  # StartJobRequest's init_adapter_source, resume_source
        error, started, down = self.fail_next.pop(address, (None, False, False))
        if down:
            self.down.add(address)
        if error is not None and not started:
            raise error
        if self.running.get(address) == job_id:
            return address  # already running this job: OK, nothing started
        if address in self.running:
            raise WorkerBusy(f"worker {address} is busy with job {self.running[address]}")
        self.running[address] = job_id
        self.lost.discard(address)
        self.started.append((address, job_id, total_steps))
        self.resumes.append((job_id, resume, stored_steps))
        if error is not None:
            raise error  # started, but the answer is lost
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
                return (await jobs.get(first.id)).status == C.JOB_STATUS_COMPLETED
            await _until(first_done)
            # One consumer, in stream order: the steps published before COMPLETED are stored.
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


async def test_a_job_its_worker_lost_resumes_until_its_resumes_are_spent(sqlite_store: Store) -> None:
    """Resumed at most MAX_RESUMES times, counted in the job's row: a scheduler restarted halfway
    (a new JobManager on the same store) goes on with the count rather than starting it again."""
    workers = FakeWorkers(2)
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    assert (await jobs.get(job.id)).status == C.JOB_STATUS_RUNNING
    assert workers.resumes == [(job.id, False, 0)]
    sqlite_store.update_job(job.id, current_step=4)  # 4 steps stored
    started = sqlite_store.get_job(job.id).started_at
    for n in range(1, MAX_RESUMES + 1):
        if n == 2:
            jobs = JobManager(sqlite_store, None, workers)  # the scheduler restarted
        if n % 2:
            workers.running.clear()  # the worker restarted and forgot it
            workers.last.clear()
        else:
            workers.lose(job.id, "the job process killed by signal 9 without a result")
        await jobs.dispatch_once()  # queued again, and started again in the same round
        row = await jobs.get(job.id)
        assert row.status == C.JOB_STATUS_RUNNING, row.error
        assert workers.resumes[-1] == (job.id, True, 4) and len(workers.resumes) == n + 1
        assert sqlite_store.get_job(job.id).started_at == started  # the job's start, not the resume's
        assert sqlite_store.get_job(job.id).resumes == n
    workers.lose(job.id, "the job process killed by signal 9 without a result", step=5)
    await jobs.dispatch_once()
    failed = await jobs.get(job.id)
    assert failed.status == C.JOB_STATUS_FAILED
    assert failed.error == f"the job process killed by signal 9 without a result; not resumed again after " \
                           f"{MAX_RESUMES} resumes"
    assert len(workers.resumes) == MAX_RESUMES + 1
    # The adapter of its last finished step is kept: recorded, so it can be downloaded and merged.
    assert (failed.adapter.name, failed.adapter.version, failed.adapter.path) == (f"job-{job.id}", 5, f"/a/{job.id}")


async def test_a_late_running_event_of_a_lost_run_leaves_the_requeued_job_queued(sqlite_store: Store) -> None:
    """The consumer may read a run's RUNNING after dispatch queued the job again (lagging, or
    replaying the stream after a restart): the job stays QUEUED and is dispatched, not left
    RUNNING on no worker for ever."""
    workers = FakeWorkers(1)
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    workers.lose(job.id, "killed by signal 9")
    sqlite_store.update_job(job.id, status="QUEUED", worker="", resumes=1)  # what dispatch's _lost stores
    late = C.JobStatusEvent(job_id=job.id, status=C.JOB_STATUS_RUNNING, message="started on w0:1")
    await jobs._on_event(Event(subject=f"rlvr.jobs.{job.id}.status", data=late.SerializeToString(), seq=7))
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker) == ("QUEUED", "")
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1") and workers.resumes[-1][:2] == (job.id, True)


async def test_cancelling_a_job_on_a_worker_no_longer_configured_says_so(sqlite_store: Store) -> None:
    """A scheduler restarted with other trainer_addresses: cancelling a job still running on a
    worker it no longer knows is refused with the reason (it was a KeyError, an INTERNAL error)."""
    _, job = await JobManager(sqlite_store, None, FakeWorkers()).create(C.JobSpec(), dry_run=False)
    sqlite_store.update_job(job.id, status="RUNNING", worker="gone:1")
    jobs = JobManager(sqlite_store, None, FakeWorkers())
    with pytest.raises(Unavailable, match="trainer gone:1, which is not one of this scheduler's trainer_addresses"):
        await jobs.cancel(job.id)
    assert sqlite_store.get_job(job.id).status == "RUNNING"


async def test_a_start_names_the_workers_that_hold_its_folders(sqlite_store: Store) -> None:
    """No shared disk: a job resumed on another worker is told which one ran it (resume_source), a
    job whose init_adapter is another job's adapter which worker holds that (init_adapter_source);
    the worker fetches the folders from there (TrainerService.FetchFolder)."""
    workers = FakeWorkers(2)
    jobs = JobManager(sqlite_store, None, workers)
    _, first = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    assert workers.calls[-1] == ("w0:1", first.id) and workers.sources[first.id] == {}
    workers.lose(first.id, "the job process killed by signal 9 without a result", step=2)
    workers.running["w0:1"] = "another"  # w0 is busy: the resume goes to w1
    await jobs.dispatch_once()
    assert workers.calls[-1] == ("w1:1", first.id) and workers.sources[first.id] == {"resume_source": "w0:1"}
    workers.finish(first.id, "COMPLETED")
    sqlite_store.update_job(first.id, status="COMPLETED", adapter_name=f"job-{first.id}", adapter_version=2,
                            adapter_path=f"/b/jobs/{first.id}/adapter")
    spec = C.JobSpec()
    spec.init_adapter.name = f"job-{first.id}"
    _, second = await jobs.create(spec, dry_run=False)
    workers.finish("another", "COMPLETED")
    workers.running["w1:1"] = "a third"  # w1 is busy: the job goes to w0, which lacks the adapter
    await jobs.dispatch_once()
    assert workers.calls[-1] == ("w0:1", second.id)
    assert workers.sources[second.id] == {"init_adapter_source": "w1:1"}


async def test_a_job_that_failed_in_its_process_is_not_resumed(sqlite_store: Store) -> None:
    workers = FakeWorkers()
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    workers.finish(job.id, "FAILED")  # the job's own failure (a result written): final
    await jobs.dispatch_once()
    assert (await jobs.get(job.id)).status == C.JOB_STATUS_FAILED and len(workers.resumes) == 1


# ---------------------------------------------------------------- dispatch: every outcome of StartJob


async def _one_queued(sqlite_store: Store, n: int = 1) -> tuple[JobManager, FakeWorkers, str]:
    workers = FakeWorkers(n)
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(C.JobSpec(), dry_run=False)
    return jobs, workers, job.id


async def test_dispatch_success(sqlite_store: Store) -> None:
    jobs, workers, job_id = await _one_queued(sqlite_store)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1") and row.started_at is not None
    assert workers.calls == [("w0:1", job_id)]
    await jobs.dispatch_once()  # the worker reports it running: nothing changes, nothing is sent
    assert sqlite_store.get_job(job_id).status == "RUNNING" and workers.calls == [("w0:1", job_id)]


async def test_dispatch_unavailable_waits_for_that_worker(sqlite_store: Store) -> None:
    """No answer and the worker cannot be asked: the job may run there, so it is given to no other
    worker until that one answers; then, not running there, it is dispatched again."""
    jobs, workers, job_id = await _one_queued(sqlite_store, n=2)
    workers.fail_next["w0:1"] = (WorkerUnavailable("trainer w0:1 did not answer StartJob: UNAVAILABLE"), False, True)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("QUEUED", "w0:1")  # in doubt on w0
    await jobs.dispatch_once()
    await jobs.dispatch_once()
    assert workers.calls == [("w0:1", job_id)], "w1 is idle but must not get a job that may run on w0"
    assert sqlite_store.get_job(job_id).status == "QUEUED"

    workers.down.clear()  # w0 answers again, without the job
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert row.status == "RUNNING" and len(workers.started) == 1 and workers.started[0][1] == job_id
    assert row.worker == workers.started[0][0]


async def test_dispatch_deadline_but_started(sqlite_store: Store) -> None:
    """StartJob started the job but its answer was lost: the worker says it runs it, so it is
    RUNNING there and StartJob is not sent again."""
    jobs, workers, job_id = await _one_queued(sqlite_store, n=2)
    workers.fail_next["w0:1"] = (WorkerUnavailable("DEADLINE_EXCEEDED"), True, False)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1")
    await jobs.dispatch_once()
    assert workers.calls == [("w0:1", job_id)] and workers.started == [("w0:1", job_id, row.total_steps)]


async def test_dispatch_deadline_started_then_unreachable(sqlite_store: Store) -> None:
    """Started, the answer lost, and the worker unreachable for a while: in doubt, then RUNNING as
    soon as the worker says it runs the job (no second StartJob)."""
    jobs, workers, job_id = await _one_queued(sqlite_store, n=2)
    workers.fail_next["w0:1"] = (WorkerUnavailable("DEADLINE_EXCEEDED"), True, True)
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job_id).status == "QUEUED"
    workers.down.clear()
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1") and workers.calls == [("w0:1", job_id)]


async def test_dispatch_deadline_not_started(sqlite_store: Store) -> None:
    """No answer, and the worker (asked at once) does not have the job: it stays queued and the
    next round starts it, once."""
    jobs, workers, job_id = await _one_queued(sqlite_store)
    workers.fail_next["w0:1"] = (WorkerUnavailable("DEADLINE_EXCEEDED"), False, False)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("QUEUED", "") and workers.started == []
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job_id).status == "RUNNING"
    assert workers.calls == [("w0:1", job_id)] * 2 and len(workers.started) == 1


async def test_dispatch_busy_with_another_job(sqlite_store: Store) -> None:
    """WorkerBusy (RESOURCE_EXHAUSTED): the job waits in the queue, and is not failed."""
    jobs, workers, job_id = await _one_queued(sqlite_store)
    workers.fail_next["w0:1"] = (WorkerBusy("worker w0 is busy with job other"), False, False)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker, row.error) == ("QUEUED", "", "")
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job_id).status == "RUNNING"


async def test_dispatch_already_running_this_job(sqlite_store: Store) -> None:
    """The worker runs the job already (its first start was lost to the scheduler): StartJob
    answers OK without starting anything, and the job is RUNNING there."""
    jobs, workers, job_id = await _one_queued(sqlite_store)
    workers.running["w0:1"] = job_id

    async def idle_status(address: str) -> WorkerState:  # reported idle a moment before
        return WorkerState(address=address, name=address, busy=False, job_id="")

    real_status, workers.status = workers.status, idle_status  # type: ignore[method-assign]
    await jobs.dispatch_once()
    workers.status = real_status  # type: ignore[method-assign]
    row = sqlite_store.get_job(job_id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1") and workers.started == []


async def test_dispatch_invalid_argument_fails_the_job(nats_server, sqlite_store: Store) -> None:
    """A refusal (INVALID_ARGUMENT, FAILED_PRECONDITION) fails the job with the trainer's message,
    and the FAILED status is published: a watch ends."""
    workers = FakeWorkers()
    message = "spec.grpo.lora_rank: 0 is out of range; allowed: 1-256"
    workers.fail_next["w0:1"] = (WorkerRejected(message), False, False)
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(C.JobSpec(), dry_run=False)
        watched = asyncio.create_task(_watch_all(jobs, job.id))
        await asyncio.sleep(0.3)
        await jobs.dispatch_once()
        row = sqlite_store.get_job(job.id)
        assert (row.status, row.error) == ("FAILED", message) and row.finished_at is not None
        events = await asyncio.wait_for(watched, 10)
    assert events[-1].status.status == C.JOB_STATUS_FAILED and events[-1].status.message == message


async def _watch_all(jobs: JobManager, job_id: str) -> list[C.JobEvent]:
    return [e async for e in jobs.watch(job_id, from_start=True)]


async def test_cancel_reaches_a_job_in_doubt(sqlite_store: Store) -> None:
    """A job in doubt on a worker is cancelled there too (it may run there)."""
    jobs, workers, job_id = await _one_queued(sqlite_store)
    workers.fail_next["w0:1"] = (WorkerUnavailable("DEADLINE_EXCEEDED"), True, True)
    await jobs.dispatch_once()
    workers.down.clear()
    cancelled = await jobs.cancel(job_id)
    assert cancelled.status == C.JOB_STATUS_CANCELLED and workers.cancelled == [job_id]

    # A worker that no longer has the job: cancelled all the same.
    jobs, workers, other = await _one_queued(sqlite_store)
    await jobs.dispatch_once()
    workers.running.clear()

    async def not_there(address: str, job_id: str) -> C.AdapterRef:
        raise JobNotOnWorker(f"job_id: {job_id!r} is not running on worker {address}")

    workers.cancel = not_there  # type: ignore[method-assign]
    assert (await jobs.cancel(other)).status == C.JOB_STATUS_CANCELLED


def test_the_job_core_imports_no_grpc() -> None:
    root = Path(__file__).resolve().parents[1] / "services" / "scheduler"
    for name in ("jobs.py", "actions.py"):
        tree = ast.parse((root / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m == "grpc" or m.startswith("grpc.")}, name


# ---------------------------------------------------------------- the gRPC adapter reads codes, not text


class ScriptedTrainer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.delay = 0.0

    async def StartJob(self, request, context):  # noqa: N802
        await asyncio.sleep(self.delay)
        if self.code is not None:
            await context.abort(self.code, self.details)
        return T.StartJobResponse(job_id=request.job_id, worker="scripted")

    async def CancelJob(self, request, context):  # noqa: N802
        await context.abort(self.code or grpc.StatusCode.NOT_FOUND, self.details)

    async def MergeAdapter(self, request, context):  # noqa: N802
        yield T.MergeProgress(stage="loading", fraction=0.1)
        await context.abort(self.code or grpc.StatusCode.ALREADY_EXISTS, self.details)


async def test_grpc_workers_turn_status_codes_into_domain_errors() -> None:
    trainer = ScriptedTrainer()
    server = grpc.aio.server()
    trainer_pb2_grpc.add_TrainerServiceServicer_to_server(trainer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        workers = GrpcWorkers([address], start_timeout_s=0.5)

        async def start() -> str:
            return await workers.start(address, "j1", C.JobSpec(), 3)

        assert await start() == "scripted"
        cases: list[tuple[grpc.StatusCode, str, type[Exception]]] = [
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "worker w is busy with job j0", WorkerBusy),
            # The word "busy" in a refusal is not read: the code decides.
            (grpc.StatusCode.FAILED_PRECONDITION, "quantization busy-wait unsupported", WorkerRejected),
            (grpc.StatusCode.INVALID_ARGUMENT, "spec.grpo.lora_rank: 0 is out of range", WorkerRejected),
            (grpc.StatusCode.INTERNAL, "internal error (ref 1)", WorkerFailed),
            (grpc.StatusCode.UNAVAILABLE, "gone", WorkerUnavailable),
        ]
        for code, details, error in cases:
            trainer.code, trainer.details = code, details
            with pytest.raises(error) as raised:
                await start()
            assert type(raised.value) is error and details in str(raised.value), code
        trainer.code, trainer.delay = None, 2.0
        with pytest.raises(WorkerUnavailable, match="DEADLINE_EXCEEDED"):
            await start()
        trainer.delay = 0.0

        trainer.code, trainer.details = grpc.StatusCode.NOT_FOUND, "job_id: 'j1' is not running"
        with pytest.raises(JobNotOnWorker, match="not running"):
            await workers.cancel(address, "j1")
        trainer.code, trainer.details = grpc.StatusCode.ALREADY_EXISTS, "output_name: 'm' already exists"
        with pytest.raises(MergeOutputExists):
            [p async for p in workers.merge(address, T.MergeAdapterRequest(output_name="m"))]
    finally:
        await server.stop(None)
    with pytest.raises(WorkerUnavailable):
        await start()
    assert await workers.status(address) is None


async def test_an_unreachable_worker_is_logged_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Dispatch asks every worker its status each round: an outage is said once when it begins and
    once when the worker answers again, not on every round."""

    class FlakyStub:
        up = False

        async def GetWorkerStatus(self, request: T.GetWorkerStatusRequest, timeout: float) -> T.WorkerStatus:  # noqa: N802
            if not self.up:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
            return T.WorkerStatus(worker="w")

    workers = GrpcWorkers(["127.0.0.1:1"])
    stub = FlakyStub()
    workers._stubs["127.0.0.1:1"] = stub  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="rlvr.scheduler.workers"):
        for up in (False, False, False, True, True, False, False):
            stub.up = up
            assert (await workers.status("127.0.0.1:1") is not None) == up
    said = [r.getMessage() for r in caplog.records if r.name == "rlvr.scheduler.workers"]
    assert len(said) == 3, said
    assert said[0] == said[2] == "worker 127.0.0.1:1 unreachable: UNAVAILABLE (said once until it answers again)"
    assert said[1].startswith("worker 127.0.0.1:1 answers again, after 0 s unreachable")


# ---------------------------------------------------------------- one ordered stream of job events


async def test_completed_never_overtakes_a_metric(private_nats, sqlite_store: Store) -> None:
    """Steps published before COMPLETED are stored before the row reads COMPLETED, however slow
    storing a step is; and a watch ends only once the store holds the end. On a NATS of its own: on
    the shared one it failed once in a loaded full run (never read COMPLETED in 20 s), most likely
    while its scheduler's durable consumer replayed the earlier tests' events ahead of this job's."""
    nats_server = private_nats
    workers = FakeWorkers()
    steps = 5
    add_point = sqlite_store.add_metric_point

    def slow_add(point):  # type: ignore[no-untyped-def]
        time.sleep(0.15)
        return add_point(point)

    sqlite_store.add_metric_point = slow_add  # type: ignore[method-assign]
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers, poll_seconds=0.1)
        await jobs.start()
        try:
            _, job = await jobs.create(C.JobSpec(), dry_run=False)
            await _until(lambda: _status_is(jobs, job.id, C.JOB_STATUS_RUNNING))
            watched = asyncio.create_task(_watch_all(jobs, job.id))
            for step in range(1, steps + 1):
                ev = C.MetricEvent(job_id=job.id, step=step, total_steps=steps, reward_mean=0.1, loss=1.0)
                await bus.publish(job_metrics_subject(job.id), ev.SerializeToString(), metric_msg_id(job.id, step))
            done = C.JobStatusEvent(job_id=job.id, status=C.JOB_STATUS_COMPLETED,
                                    adapter=C.AdapterRef(name=f"job-{job.id}", version=steps, path="/x"))
            await bus.publish(job_status_subject(job.id), done.SerializeToString(), f"{job.id}:status:COMPLETED")

            seen_completed = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                row = sqlite_store.get_job(job.id)
                stored = [p.step for p in sqlite_store.metric_points(job.id)]
                if row.status == "COMPLETED":
                    assert stored == list(range(1, steps + 1)), f"COMPLETED with only steps {stored} stored"
                    assert row.current_step == steps
                    seen_completed += 1
                    if seen_completed > 3:
                        break
                await asyncio.sleep(0.01)
            assert seen_completed > 3, "the job never read COMPLETED"

            events = await asyncio.wait_for(watched, 10)
            assert [e.metric.step for e in events if e.HasField("metric")] == list(range(1, steps + 1))
            assert events[-1].status.status == C.JOB_STATUS_COMPLETED
        finally:
            await jobs.stop()


async def test_two_deployments_on_one_nats_each_store_every_event_of_their_own(private_nats, tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Two schedulers with two databases on one NATS (two deployments, or two RLVR_HOMEs on the
    machine's NATS): each stores every step of its own job. With one consumer name for both, the
    stream's events were split between them and each skipped the other's as unknown, losing steps.
    A scheduler started on a new database does not replay the stream's past; one restarted on its
    database resumes where it acknowledged."""
    steps = 6
    stores = [Store(f"sqlite:///{tmp_path / f'{name}.db'}") for name in ("a", "b")]
    for store in stores:
        store.create_all()
    async with connected_bus(private_nats.url) as bus:
        managers = [JobManager(store, bus, FakeWorkers(n=2), poll_seconds=0.1) for store in stores]
        try:
            await managers[0].start()
            _, old = await managers[0].create(C.JobSpec(), dry_run=False)
            await _until(lambda: _status_is(managers[0], old.id, C.JOB_STATUS_RUNNING))
            await bus.publish(job_metrics_subject(old.id), C.MetricEvent(job_id=old.id, step=1).SerializeToString(),
                              metric_msg_id(old.id, 1))
            await managers[1].start()  # a new database: the event above is none of its business
            consumer = await bus.js.consumer_info("RLVR", jobs_module.events_consumer(stores[1].store_id()))
            assert consumer.num_pending == 0 and consumer.delivered.consumer_seq == 0  # nothing of the past

            jobs = [(await manager.create(C.JobSpec(), dry_run=False))[1] for manager in managers]
            for manager, job in zip(managers, jobs, strict=True):
                await _until(lambda m=manager, j=job: _status_is(m, j.id, C.JOB_STATUS_RUNNING))
            for step in range(1, steps + 1):
                for job in jobs:
                    ev = C.MetricEvent(job_id=job.id, step=step, total_steps=steps, loss=1.0)
                    await bus.publish(job_metrics_subject(job.id), ev.SerializeToString(), metric_msg_id(job.id, step))
            for job in jobs:
                done = C.JobStatusEvent(job_id=job.id, status=C.JOB_STATUS_COMPLETED)
                await bus.publish(job_status_subject(job.id), done.SerializeToString(), f"{job.id}:status:COMPLETED")
            for manager, job in zip(managers, jobs, strict=True):
                await _until(lambda m=manager, j=job: _status_is(m, j.id, C.JOB_STATUS_COMPLETED))
            for store, job in zip(stores, jobs, strict=True):
                assert [p.step for p in store.metric_points(job.id)] == list(range(1, steps + 1))
            assert stores[1].get_job(old.id) is None and [p.step for p in stores[0].metric_points(old.id)] == [1]
            for job in jobs:  # the other scheduler skipped its steps, saying so once
                skipped = [r for r in caplog.records if r.levelname == "WARNING" and job.id in r.getMessage()]
                assert len(skipped) == 1 and "no such job" in skipped[0].getMessage(), skipped

            await managers[0].stop()  # restarted on its database: it picks up what came meanwhile
            await bus.publish(job_metrics_subject(old.id), C.MetricEvent(job_id=old.id, step=2).SerializeToString(),
                              metric_msg_id(old.id, 2))
            managers[0] = JobManager(stores[0], bus, FakeWorkers(), poll_seconds=0.1)
            await managers[0].start()
            await _until(lambda: _stored_steps(stores[0], old.id, [1, 2]))

            # Its consumer gone from NATS (a server rebuilt with the stream kept) while a job of its
            # database still runs: the new consumer replays the stream rather than start at its end.
            await managers[0].stop()
            await bus.js.delete_consumer("RLVR", jobs_module.events_consumer(stores[0].store_id()))
            await bus.publish(job_metrics_subject(old.id), C.MetricEvent(job_id=old.id, step=3).SerializeToString(),
                              metric_msg_id(old.id, 3))
            assert stores[0].get_job(old.id).status == "RUNNING"
            managers[0] = JobManager(stores[0], bus, FakeWorkers(n=2), poll_seconds=0.1)
            await managers[0].start()
            await _until(lambda: _stored_steps(stores[0], old.id, [1, 2, 3]))
        finally:
            for manager in managers:
                await manager.stop()
            for store in stores:
                store.close()


async def test_a_worker_that_reports_the_end_first_waits_for_the_steps_on_the_stream(
        private_nats, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that says its job ended at step 3 while the store holds none of its steps (a
    restarted scheduler still reading what was published while it was away) leaves the job RUNNING
    until the steps are stored, so a row that reads COMPLETED has every step; steps that never come
    hold it back only STREAM_CATCH_UP_S."""
    workers = FakeWorkers()
    address = workers.addresses[0]
    async with connected_bus(private_nats.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers, poll_seconds=0.05)
        await jobs.start()
        try:
            _, job = await jobs.create(C.JobSpec(), dry_run=False)
            await _until(lambda: _status_is(jobs, job.id, C.JOB_STATUS_RUNNING))
            workers.adapters[address] = C.AdapterRef(name=f"job-{job.id}", version=3, path="/a")
            workers.finish(job.id, "COMPLETED")
            await asyncio.sleep(1.0)  # twenty rounds: the worker's word alone does not end it
            assert (await jobs.get(job.id)).status == C.JOB_STATUS_RUNNING
            for step in (1, 2, 3):
                ev = C.MetricEvent(job_id=job.id, step=step, total_steps=3, reward_mean=0.1, loss=1.0)
                await bus.publish(job_metrics_subject(job.id), ev.SerializeToString(), metric_msg_id(job.id, step))
            await _until(lambda: _status_is(jobs, job.id, C.JOB_STATUS_COMPLETED))
            assert [p.step for p in sqlite_store.metric_points(job.id)] == [1, 2, 3]

            monkeypatch.setattr(dispatch_module, "STREAM_CATCH_UP_S", 0.5)
            _, silent = await jobs.create(C.JobSpec(), dry_run=False)
            await _until(lambda: _status_is(jobs, silent.id, C.JOB_STATUS_RUNNING))
            workers.adapters[address] = C.AdapterRef(name=f"job-{silent.id}", version=2, path="/a")
            workers.finish(silent.id, "COMPLETED")
            await _until(lambda: _status_is(jobs, silent.id, C.JOB_STATUS_COMPLETED))
            assert sqlite_store.metric_points(silent.id) == []
        finally:
            await jobs.stop()


async def _stored_steps(store: Store, job_id: str, steps: list[int]) -> bool:
    return [p.step for p in store.metric_points(job_id)] == steps


async def _status_is(jobs: JobManager, job_id: str, status: int) -> bool:
    return (await jobs.get(job_id)).status == status


async def test_reconcile_publishes_its_status_and_ends_the_watch(nats_server, sqlite_store: Store,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A status the scheduler finds itself (a worker that lost its job, with no resume left) is
    published like any other, so a watch of the job ends."""
    monkeypatch.setattr(dispatch_module, "MAX_RESUMES", 0)
    workers = FakeWorkers()
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(C.JobSpec(), dry_run=False)
        await jobs.dispatch_once()
        watched = asyncio.create_task(_watch_all(jobs, job.id))
        await asyncio.sleep(0.3)
        workers.running.clear()  # the worker restarted and forgot it
        await jobs.dispatch_once()
        events = await asyncio.wait_for(watched, 10)
        assert events[-1].status.status == C.JOB_STATUS_FAILED and "no longer runs" in events[-1].status.message
        stream = [e.status for e in await _statuses(bus, job.id, 3)]
        assert stream == [C.JOB_STATUS_QUEUED, C.JOB_STATUS_RUNNING, C.JOB_STATUS_FAILED]


async def test_a_watch_ends_when_the_store_does_though_the_stream_never_says(nats_server, sqlite_store: Store
                                                                          ) -> None:
    """A terminal status stored but never published (NATS refused it): the watch still ends."""
    import rlvr.services.scheduler.ingest as jobs_module

    workers = FakeWorkers()
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(C.JobSpec(), dry_run=False)
        await jobs.dispatch_once()
        watched = asyncio.create_task(_watch_all(jobs, job.id))
        await asyncio.sleep(0.3)
        jobs.bus = None  # publishing is lost from here on
        original, jobs_module.STREAM_GRACE_S = jobs_module.STREAM_GRACE_S, 0.5
        try:
            await jobs.cancel(job.id)
            events = await asyncio.wait_for(watched, 10)
        finally:
            jobs_module.STREAM_GRACE_S = original
    assert events[-1].status.status == C.JOB_STATUS_CANCELLED


async def _statuses(bus, job_id: str, n: int, timeout: float = 10.0) -> list[C.JobStatusEvent]:  # type: ignore[no-untyped-def]
    """The job's first `n` status events on the stream, or as many as came within `timeout`."""
    got: list[C.JobStatusEvent] = []

    async def read() -> None:
        async for event in bus.watch(job_status_subject(job_id)):
            got.append(C.JobStatusEvent.FromString(event.data))
            if len(got) == n:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), timeout)
    return got


async def test_a_resume_is_published_so_watchers_see_it(nats_server, sqlite_store: Store) -> None:
    workers = FakeWorkers()
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(C.JobSpec(), dry_run=False)
        await jobs.dispatch_once()
        workers.lose(job.id, "the job process killed by signal 9 without a result")
        await jobs.dispatch_once()
        stream = await _statuses(bus, job.id, 4)
    assert [e.status for e in stream] == [C.JOB_STATUS_QUEUED, C.JOB_STATUS_RUNNING, C.JOB_STATUS_QUEUED,
                                          C.JOB_STATUS_RUNNING]
    assert stream[2].message.startswith("resuming from the last checkpoint after the trainer was lost at step 0 "
                                        "(the job process killed by signal 9 without a result); resume 1 of ")
    assert stream[3].message == "resumed on w0:1"


async def test_a_resume_message_names_one_step_the_last_finished_one(nats_server, sqlite_store: Store) -> None:
    """The worker finished step 128 (its adapter's version), the store has 127 (step 128's event on
    its way): the message says 128, once (it said "lost at step 127 (... (at step 128))")."""
    workers = FakeWorkers()
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(C.JobSpec(), dry_run=False)
        await jobs.dispatch_once()
        sqlite_store.update_job(job.id, current_step=127)
        workers.lose(job.id, "the trainer service w0 was restarted while the job ran", step=128)
        await jobs.dispatch_once()
        stream = await _statuses(bus, job.id, 3)
    assert stream[2].message == ("resuming from the last checkpoint after the trainer was lost at step 128 (the "
                                 f"trainer service w0 was restarted while the job ran); resume 1 of {MAX_RESUMES}")


# ---------------------------------------------------------------- dispatch to a worker that can run the job


def _cpu(cores: int = 2) -> T.WorkerCapabilities:
    return T.WorkerCapabilities(device_kind="cpu", cpu_cores=cores, precisions=["fp32", "bf16"],
                                quantizations=["full"], max_num_processes=cores,
                                cached_models=["rlvr-tiny", "rlvr-tiny-test", "rlvr-tiny-small"])


def _gpus(n: int) -> T.WorkerCapabilities:
    caps = _cpu(16)
    caps.device_kind, caps.max_num_processes = "cuda", n
    caps.gpus.extend(T.GpuDevice(index=i, name="NVIDIA H200", memory_bytes=80 << 30, bf16=True) for i in range(n))
    return caps


def _two_gpu_spec() -> C.JobSpec:
    spec = C.JobSpec()
    spec.advanced.gpu_selection, spec.advanced.num_processes = "0,1", 2
    spec.grpo.group_size, spec.grpo.batch_size = 4, 8
    return spec


ONE_CPU = "no trainer worker can run it: needs 2 GPU(s) (gpu_selection 0,1), worker w0:1 has 0"
TWO_GPUS_ON_CPUS = ("no trainer worker can run it: needs 2 GPU(s) (gpu_selection 0,1), worker w0:1 has 0; "
                    "needs 2 GPU(s) (gpu_selection 0,1), worker w1:1 has 0")


async def test_a_job_no_worker_can_run_waits_with_its_reason_until_one_can(nats_server, sqlite_store: Store,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused by every worker: the job stays QUEUED with each worker's reason, stored, shown on the
    job and published once (not every round), and worked out once while the workers stay the same;
    a worker that can run it appears, and it starts there."""
    fits: list[str] = []
    real_fit = dispatch_module.fit
    monkeypatch.setattr(dispatch_module, "fit", lambda spec, caps, name: fits.append(name) or real_fit(spec, caps, name))
    workers = FakeWorkers(2)
    workers.capabilities = {"w0:1": _cpu(), "w1:1": _cpu()}
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers)
        _, job = await jobs.create(_two_gpu_spec(), dry_run=False)
        for _ in range(3):
            await jobs.dispatch_once()
        row = sqlite_store.get_job(job.id)
        assert (row.status, row.worker, row.queue_reason) == ("QUEUED", "", TWO_GPUS_ON_CPUS)
        assert (await jobs.get(job.id)).queue_reason == TWO_GPUS_ON_CPUS and workers.calls == []
        assert fits == ["w0:1", "w1:1"]  # three rounds, the same workers: one fit per worker

        workers.down.add("w1:1")  # w1 stops answering, then comes back as it was: the reason changes and
        await jobs.dispatch_once()  # changes back within the stream's duplicate window, published each time
        assert sqlite_store.get_job(job.id).queue_reason == ONE_CPU
        workers.down.clear()
        await jobs.dispatch_once()
        assert sqlite_store.get_job(job.id).queue_reason == TWO_GPUS_ON_CPUS

        workers.capabilities["w1:1"] = _gpus(2)  # w1 comes back with two GPUs
        await jobs.dispatch_once()
        assert fits == ["w0:1", "w1:1", "w0:1", "w0:1", "w1:1", "w0:1", "w1:1"]
        row = sqlite_store.get_job(job.id)
        assert (row.status, row.worker, row.queue_reason) == ("RUNNING", "w1:1", "")
        assert workers.calls == [("w1:1", job.id)] and (await jobs.get(job.id)).queue_reason == ""
        stream = await _statuses(bus, job.id, 5)
    assert [(e.status, e.message) for e in stream] == [
        (C.JOB_STATUS_QUEUED, "queued"), (C.JOB_STATUS_QUEUED, TWO_GPUS_ON_CPUS), (C.JOB_STATUS_QUEUED, ONE_CPU),
        (C.JOB_STATUS_QUEUED, TWO_GPUS_ON_CPUS), (C.JOB_STATUS_RUNNING, "started on w1:1")]


async def test_a_job_that_fits_passes_an_older_one_that_does_not(sqlite_store: Store) -> None:
    """No head-of-line blocking: the oldest job fits no worker, the next one fits the idle CPU
    worker and starts; the oldest keeps waiting with its reason."""
    workers = FakeWorkers(1)
    workers.capabilities = {"w0:1": _cpu()}
    jobs = JobManager(sqlite_store, None, workers)
    _, old = await jobs.create(_two_gpu_spec(), dry_run=False)
    _, young = await jobs.create(C.JobSpec(), dry_run=False)
    await jobs.dispatch_once()
    assert workers.calls == [("w0:1", young.id)]
    assert sqlite_store.get_job(young.id).status == "RUNNING"
    row = sqlite_store.get_job(old.id)
    assert (row.status, row.queue_reason) == (
        "QUEUED", "no trainer worker can run it: needs 2 GPU(s) (gpu_selection 0,1), worker w0:1 has 0")


async def test_a_job_a_busy_worker_could_run_waits_for_it(sqlite_store: Store) -> None:
    """The worker that can run it is busy (a GPU job needs the GPU worker; the CPU worker is idle):
    the reason says it waits for a free worker, and the job starts when that worker is free."""
    workers = FakeWorkers(2)
    workers.capabilities = {"w0:1": _gpus(2), "w1:1": _cpu()}
    jobs = JobManager(sqlite_store, None, workers)
    _, first = await jobs.create(_two_gpu_spec(), dry_run=False)
    _, second = await jobs.create(_two_gpu_spec(), dry_run=False)
    await jobs.dispatch_once()
    assert sqlite_store.get_job(first.id).worker == "w0:1"
    assert sqlite_store.get_job(second.id).queue_reason == \
        "waiting for a free worker: 1 of 2 reachable can run it, and all are busy"
    workers.finish(first.id, "COMPLETED")
    await jobs.dispatch_once()
    row = sqlite_store.get_job(second.id)
    assert (row.status, row.worker, row.queue_reason) == ("RUNNING", "w0:1", "")
    assert sqlite_store.get_job(first.id).status == "COMPLETED"


async def test_a_job_waits_with_a_reason_while_no_worker_answers(sqlite_store: Store) -> None:
    jobs, workers, job_id = await _one_queued(sqlite_store, n=2)
    workers.down = {"w0:1", "w1:1"}
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job_id).queue_reason == "no trainer worker answers (0 of 2 reachable)"
    workers.down.clear()
    await jobs.dispatch_once()
    assert (sqlite_store.get_job(job_id).status, sqlite_store.get_job(job_id).queue_reason) == ("RUNNING", "")


async def test_a_job_whose_groups_never_differ_is_warned_that_it_cannot_learn(nats_server, sqlite_store: Store
                                                                             ) -> None:
    """Four steps in a row without a group whose rewards differ (MetricEvent.groups_with_signal 0):
    the job gets the warning once (Job.warnings, which the job page and `rlvr jobs show` print) and
    watchers a RUNNING status event saying it; a step with signal in between resets the count."""
    from rlvr.services.scheduler.ingest import NO_SIGNAL, NO_SIGNAL_STEPS

    workers = FakeWorkers(n=2)
    async with connected_bus(nats_server.url) as bus:
        jobs = JobManager(sqlite_store, bus, workers, poll_seconds=0.1)
        await jobs.start()
        try:
            spec = C.JobSpec()
            spec.grpo.max_steps = 20
            _, flat = await jobs.create(spec, dry_run=False)
            _, mixed = await jobs.create(spec, dry_run=False)

            async def running() -> bool:
                return [(await jobs.get(j.id)).status for j in (flat, mixed)] == [C.JOB_STATUS_RUNNING] * 2
            await _until(running)
            signal = {flat.id: [0] * (NO_SIGNAL_STEPS + 2), mixed.id: [0, 0, 0, 1, 0, 0, 0]}
            for job_id, groups in signal.items():
                for step, n in enumerate(groups, start=1):
                    ev = C.MetricEvent(job_id=job_id, step=step, total_steps=20, reward_mean=0.0, loss=0.0,
                                       groups_with_signal=n)
                    await bus.publish(job_metrics_subject(job_id), ev.SerializeToString(), metric_msg_id(job_id, step))

            async def stored() -> bool:
                return all(len(sqlite_store.metric_points(j)) == len(g) for j, g in signal.items())
            await _until(stored)
            warned = [w for w in (await jobs.get(flat.id)).warnings if w.startswith(NO_SIGNAL)]
            assert warned == [f"{NO_SIGNAL} in steps 1-4: every completion of each prompt scored the same (mean "
                              "reward 0), so GRPO's advantages are zero and the adapter does not move. The task is "
                              "too hard or too easy for this model at this length; try a model with headroom on it "
                              "(`rlvr models show NAME --eval`), a larger grpo.max_completion_tokens or "
                              "grpo.group_size, a higher advanced.temperature, or a reward with partial credit"]
            assert not [w for w in (await jobs.get(mixed.id)).warnings if w.startswith(NO_SIGNAL)]
            events = await _statuses(bus, flat.id, 3)
            assert [e.status for e in events] == [C.JOB_STATUS_QUEUED, C.JOB_STATUS_RUNNING, C.JOB_STATUS_RUNNING]
            assert events[2].message == f"warning: {warned[0]}"
            assert (await jobs.get(flat.id)).status == C.JOB_STATUS_RUNNING
        finally:
            await jobs.stop()
