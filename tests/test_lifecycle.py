"""The scheduler's job lifecycle (services/scheduler/lifecycle.py): the transition table on its own
(which moves it allows from which state, each guard), what a move stores, and `transition` over a
real SQLite store: the row re-read under the lock, the action's answer picking the target, a
refused move storing and publishing nothing. No stack, no NATS: the bus is a recorder."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from rlvr.infra.schema import JobRow
from rlvr.infra.store import Store
from rlvr.infra.subjects import status_msg_id
from rlvr.jobspec import job_status_name
from rlvr.services.scheduler import lifecycle as L
from rlvr.services.scheduler.lifecycle import Edge, JobLifecycle, Move, edge, fields_of, state_of
from rlvr.v1 import common_pb2 as C

STATES = (L.QUEUED, L.IN_DOUBT, L.RUNNING, L.COMPLETED, L.FAILED, L.CANCELLED)
CAUSES = ("start", "wait", "settle", "resume", "give_up", "cancel", "report")


def row_in(state: str, **fields: object) -> JobRow:
    """A job row in `state` (IN_DOUBT: QUEUED with a worker), on worker w0:1 when it has one."""
    worker = "w0:1" if state in (L.IN_DOUBT, L.RUNNING) else ""
    return JobRow(id="j1", name="j", status=L.status_of(state), worker=worker, **fields)  # type: ignore[arg-type]


def allowed(state: str, cause: str, to: str, **move: object) -> bool:
    row = row_in(state)
    return edge(row, Move(cause, to, worker=row.worker or "w0:1", **move)) is not None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- the table


def test_the_table_is_the_lifecycle_the_scheduler_runs() -> None:
    """Every allowed (cause, from, to), spelled out: a change here is a change of the lifecycle."""
    ends = {L.COMPLETED, L.FAILED, L.CANCELLED}
    want = {
        ("start", L.QUEUED, L.RUNNING), ("start", L.QUEUED, L.FAILED), ("start", L.QUEUED, L.IN_DOUBT),
        ("wait", L.QUEUED, L.QUEUED),
        ("settle", L.IN_DOUBT, L.RUNNING), ("settle", L.IN_DOUBT, L.QUEUED),
        ("resume", L.RUNNING, L.QUEUED), ("give_up", L.QUEUED, L.FAILED),
        *(("cancel", s, L.CANCELLED) for s in (L.QUEUED, L.IN_DOUBT, L.RUNNING)),
        ("report", L.IN_DOUBT, L.RUNNING),
        *(("report", s, e) for s in (L.QUEUED, L.IN_DOUBT, L.RUNNING) for e in ends),
    }
    assert {(e.cause, e.source, e.target) for e in L.TABLE} == want
    assert len(L.TABLE) == len(want)  # no edge twice


@pytest.mark.parametrize("end", [L.COMPLETED, L.FAILED, L.CANCELLED])
def test_an_ended_job_never_moves_again(end: str) -> None:
    for cause in CAUSES:
        for to in STATES:
            assert not allowed(end, cause, to, message="a new reason"), (cause, to)


def test_a_late_running_report_of_a_job_queued_on_no_worker_is_refused() -> None:
    """RUNNING is taken for a queued job only while its start is in doubt on a worker: one queued
    with no worker has no job process, so its RUNNING comes from a run that was lost."""
    assert not allowed(L.QUEUED, "report", L.RUNNING)
    assert allowed(L.IN_DOUBT, "report", L.RUNNING)
    assert not allowed(L.RUNNING, "report", L.RUNNING)  # the same status: nothing to store
    assert not allowed(L.RUNNING, "report", L.QUEUED)  # QUEUED is the scheduler's own word
    assert allowed(L.QUEUED, "report", L.COMPLETED)


def test_start_only_from_a_queued_job_on_no_worker() -> None:
    assert allowed(L.QUEUED, "start", L.RUNNING)
    assert not allowed(L.IN_DOUBT, "start", L.RUNNING)  # in doubt: given to no other worker
    assert not allowed(L.RUNNING, "start", L.RUNNING)
    assert not allowed(L.QUEUED, "start", L.COMPLETED)


def test_settle_and_resume_hold_only_while_the_job_is_where_the_caller_saw_it() -> None:
    doubt, running = row_in(L.IN_DOUBT), row_in(L.RUNNING)
    assert edge(doubt, Move("settle", L.RUNNING, worker="w0:1")) is not None
    assert edge(doubt, Move("settle", L.QUEUED, worker="w0:1")) is not None
    assert edge(doubt, Move("settle", L.RUNNING, worker="w9:1")) is None
    assert edge(running, Move("resume", L.QUEUED, worker="w0:1")) is not None
    assert edge(running, Move("resume", L.QUEUED, worker="w9:1")) is None  # moved meanwhile
    assert edge(row_in(L.QUEUED), Move("resume", L.QUEUED)) is None


def test_a_wait_is_stored_only_when_its_reason_changed() -> None:
    row = row_in(L.QUEUED, queue_reason="no worker answers")
    assert edge(row, Move("wait", L.QUEUED, "no worker answers")) is None
    assert edge(row, Move("wait", L.QUEUED, "all are busy")) is not None
    assert edge(row_in(L.IN_DOUBT), Move("wait", L.QUEUED, "all are busy")) is None


def test_in_doubt_is_queued_with_a_worker() -> None:
    assert state_of(JobRow(status="QUEUED", worker="")) == L.QUEUED
    assert state_of(JobRow(status="QUEUED", worker="w0:1")) == L.IN_DOUBT
    assert state_of(JobRow(status="RUNNING", worker="w0:1")) == L.RUNNING
    assert L.status_of(L.IN_DOUBT) == "QUEUED"


# ---------------------------------------------------------------------------------------- what is stored


NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def stored(row: JobRow, move: Move) -> dict[str, object]:
    e = edge(row, move)
    assert isinstance(e, Edge)
    return fields_of(row, move, e, NOW)


def test_what_each_move_stores() -> None:
    queued = row_in(L.QUEUED, queue_reason="busy")
    assert stored(queued, Move("start", L.RUNNING, worker="w1:1")) == {
        "status": "RUNNING", "worker": "w1:1", "queue_reason": "", "started_at": NOW}
    assert stored(queued, Move("start", L.IN_DOUBT, worker="w1:1")) == {"status": "QUEUED", "worker": "w1:1"}
    assert stored(queued, Move("start", L.FAILED, "refused: bad spec")) == {
        "status": "FAILED", "finished_at": NOW, "error": "refused: bad spec"}
    assert stored(queued, Move("wait", L.QUEUED, "none fits")) == {"status": "QUEUED", "queue_reason": "none fits"}
    running = row_in(L.RUNNING, resumes=1, started_at=NOW)
    assert stored(running, Move("resume", L.QUEUED, worker="w0:1")) == {"status": "QUEUED", "worker": "",
                                                                        "resumes": 2}
    assert stored(row_in(L.IN_DOUBT), Move("settle", L.QUEUED, worker="w0:1")) == {"status": "QUEUED", "worker": ""}
    adapter = C.AdapterRef(name="job-j1", version=4, path="/a/j1")
    assert stored(running, Move("report", L.FAILED, adapter=adapter)) == {
        "status": "FAILED", "finished_at": NOW, "error": "failed without a message",
        "adapter_name": "job-j1", "adapter_version": 4, "adapter_path": "/a/j1"}
    # A job that ran before keeps its first start time.
    assert "started_at" not in stored(running.model_copy(update={"status": "QUEUED", "worker": ""}),
                                      Move("start", L.RUNNING, worker="w1:1"))


# ---------------------------------------------------------------------------------------- transition()


class RecordingBus:
    """The event bus as `transition` uses it: publish only, recorded."""

    def __init__(self) -> None:
        self.published: list[tuple[str, C.JobStatusEvent, str]] = []

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        self.published.append((subject, C.JobStatusEvent.FromString(data), msg_id))


async def test_a_transition_stores_notifies_publishes_and_wakes(sqlite_store: Store) -> None:
    bus = RecordingBus()
    life = JobLifecycle(sqlite_store, bus)  # type: ignore[arg-type]
    job = sqlite_store.add_job(JobRow(name="j", status="QUEUED"))
    seen = life.generation
    outcome = await life.transition(job.id, Move("start", L.RUNNING, "started on w0:1", worker="w0:1"))
    assert outcome.done and outcome.row is not None and outcome.row.status == "RUNNING"
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker) == ("RUNNING", "w0:1") and row.started_at is not None
    assert life.generation == seen + 1
    assert not life.wake.is_set()  # running: nothing new for the dispatcher
    [(_, event, msg_id)] = bus.published
    assert (job_status_name(event.status), event.message, msg_id) == (
        "RUNNING", "started on w0:1", status_msg_id(job.id, "RUNNING", ""))
    await life.transition(job.id, Move("cancel", L.CANCELLED, "cancelled by request"))
    assert life.wake.is_set() and sqlite_store.get_job(job.id).status == "CANCELLED"


async def test_a_refused_move_stores_and_publishes_nothing(sqlite_store: Store) -> None:
    bus = RecordingBus()
    life = JobLifecycle(sqlite_store, bus)  # type: ignore[arg-type]
    job = sqlite_store.add_job(JobRow(name="j", status="COMPLETED"))
    seen = life.generation
    outcome = await life.transition(job.id, Move("cancel", L.CANCELLED))
    assert not outcome.done and outcome.row is not None and outcome.row.status == "COMPLETED"
    assert (await life.transition("no-such-job", Move("cancel", L.CANCELLED))).row is None
    assert bus.published == [] and life.generation == seen
    assert sqlite_store.get_job(job.id).status == "COMPLETED"


async def test_the_action_runs_only_once_the_move_is_allowed_and_picks_the_target(sqlite_store: Store) -> None:
    life = JobLifecycle(sqlite_store, None)
    job = sqlite_store.add_job(JobRow(name="j", status="QUEUED", worker="w0:1"))  # in doubt
    calls: list[str] = []

    async def start(row: JobRow) -> Move:
        calls.append(row.id)
        return Move("start", L.RUNNING, worker="w1:1")

    # In doubt on w0:1: a start elsewhere is refused before StartJob is ever sent.
    assert not (await life.transition(job.id, Move("start", L.RUNNING, worker="w1:1"), start)).done
    assert calls == []

    async def not_there(row: JobRow) -> Move:
        calls.append(row.id)
        return Move("settle", L.QUEUED, worker=row.worker, publish=False)

    outcome = await life.transition(job.id, Move("settle", L.RUNNING, worker="w0:1"), not_there)
    assert outcome.move is not None and outcome.move.to == L.QUEUED and calls == [job.id]
    assert (sqlite_store.get_job(job.id).status, sqlite_store.get_job(job.id).worker) == ("QUEUED", "")

    async def busy(row: JobRow) -> None:
        return None  # the worker runs another job: nothing stored

    assert not (await life.transition(job.id, Move("start", L.RUNNING, worker="w1:1"), busy)).done
    assert sqlite_store.get_job(job.id).status == "QUEUED"

    async def wrong(row: JobRow) -> Move:
        return Move("start", L.COMPLETED)

    with pytest.raises(AssertionError, match="start may not end in COMPLETED"):
        await life.transition(job.id, Move("start", L.RUNNING, worker="w1:1"), wrong)
    assert sqlite_store.get_job(job.id).status == "QUEUED"


async def test_transitions_of_one_job_are_made_one_at_a_time(sqlite_store: Store) -> None:
    """Two cancels at once: the second re-reads the row under the lock, sees it ended, and is refused
    (the worker is asked once)."""
    life = JobLifecycle(sqlite_store, None)
    job = sqlite_store.add_job(JobRow(name="j", status="RUNNING", worker="w0:1"))
    asked: list[str] = []

    async def stop_there(row: JobRow) -> Move:
        asked.append(row.worker)
        await asyncio.sleep(0.05)  # the worker's answer takes a moment: the other cancel waits for the lock
        return Move("cancel", L.CANCELLED, "cancelled by request")

    first, second = await asyncio.gather(*(life.transition(job.id, Move("cancel", L.CANCELLED), stop_there)
                                           for _ in range(2)))
    assert [first.done, second.done] == [True, False] and asked == ["w0:1"]


async def test_a_late_adapter_fills_an_ended_job_without_one(sqlite_store: Store) -> None:
    life = JobLifecycle(sqlite_store, None)
    job = sqlite_store.add_job(JobRow(name="j", status="CANCELLED"))
    adapter = C.AdapterRef(name=f"job-{job.id}", version=7, path="/a")
    assert not await life.report(job.id, "COMPLETED", "", adapter, publish=False)  # no move: it ended
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.adapter_name, row.adapter_version) == ("CANCELLED", f"job-{job.id}", 7)
    later = C.AdapterRef(name=f"job-{job.id}", version=9, path="/b")
    await life.report(job.id, "COMPLETED", "", later, publish=False)
    assert sqlite_store.get_job(job.id).adapter_version == 7  # the first one stays
