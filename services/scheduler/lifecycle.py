"""A job's lifecycle as one state machine: the transitions the scheduler may make, each with its
guard, and `JobLifecycle.transition`, the one place a job's status is written.

The states are the store's statuses, with QUEUED split in two: a queued job with `worker` set is
IN_DOUBT, its StartJob there unanswered (see dispatch.py): it is given to no other worker until
that one says whether it runs the job.

    QUEUED   --start-->   RUNNING | FAILED | IN_DOUBT   StartJob answered, refused, or unanswered
    QUEUED   --wait--->   QUEUED                        a new reason it waits (a QUEUED event)
    IN_DOUBT --settle->   RUNNING | QUEUED              the worker runs it, or does not have it
    RUNNING  --resume->   QUEUED                        its trainer was lost: to be started again
    QUEUED   --give_up->  FAILED                        it lost a node and found no workers to resume on in time
    any open --cancel->   CANCELLED
    --report->  what the trainer says (a status event, or a worker's last job): RUNNING -> an end;
                IN_DOUBT -> RUNNING or an end; QUEUED -> an end

An ended job (COMPLETED, FAILED, CANCELLED) never moves again. A report of RUNNING for a job
QUEUED on no worker is refused: it comes late from a run that was lost and queued again, and
taking it would leave the job RUNNING nowhere, never dispatched again.

Every transition is made under one lock from a fresh read of the row: `transition` re-reads the
job, checks the move against the table and its guard, runs the caller's action when it has one
(StartJob, CancelJob: their answer picks the target), stores the row, then, out of the lock,
notifies the watchers, publishes the status event and wakes the dispatcher. The row is the record:
a status event is published only after the store holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rlvr.common.errors import NotFound
from rlvr.infra.events import EventBus
from rlvr.infra.schema import JobRow, RoundRow
from rlvr.infra.store import Store
from rlvr.infra.subjects import job_status_subject, status_msg_id
from rlvr.jobspec import ResolvedJob, job_status_value
from rlvr.services.scheduler.convert import TERMINAL, now_ts, spec_to_json
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.scheduler.jobs")

QUEUED, IN_DOUBT, RUNNING = "QUEUED", "IN_DOUBT", "RUNNING"
COMPLETED, FAILED, CANCELLED = "COMPLETED", "FAILED", "CANCELLED"
OPEN = (QUEUED, IN_DOUBT, RUNNING)
ENDS = (COMPLETED, FAILED, CANCELLED)
assert frozenset(ENDS) == TERMINAL


def state_of(row: JobRow) -> str:
    """The row's state: its status, or IN_DOUBT for one queued with a worker recorded."""
    return IN_DOUBT if row.status == QUEUED and row.worker else row.status


def status_of(state: str) -> str:
    """The status the store spells a state with (IN_DOUBT is stored QUEUED, with its worker)."""
    return QUEUED if state == IN_DOUBT else state


@dataclass
class Move:
    """A transition asked for. `worker`: the worker the job starts on (to RUNNING or IN_DOUBT from
    start), or the one the caller saw it on (settle, resume: it must still be there). `message`:
    the status event's text (`to.lower()` when empty); a FAILED job's error; a wait's reason."""

    cause: str
    to: str
    message: str = ""
    worker: str = ""
    adapter: common_pb2.AdapterRef | None = None
    fields: dict[str, object] = field(default_factory=dict)  # more to store with it
    publish: bool = True  # False: the status came off the stream, or the move is the scheduler's own
    again: str = ""  # a status the job had before (a resume's QUEUED and RUNNING): part of the event id


def _same_worker(row: JobRow, move: Move) -> bool:
    return row.worker == move.worker


def _new_reason(row: JobRow, move: Move) -> bool:
    return row.queue_reason != move.message


def _on_worker(row: JobRow, move: Move) -> dict[str, object]:
    return {"worker": move.worker or row.worker, "queue_reason": ""}


def _in_doubt(row: JobRow, move: Move) -> dict[str, object]:
    return {"worker": move.worker}


def _off_worker(row: JobRow, move: Move) -> dict[str, object]:
    return {"worker": ""}


def _requeued(row: JobRow, move: Move) -> dict[str, object]:
    return {"worker": "", "resumes": row.resumes + 1}


def _reason(row: JobRow, move: Move) -> dict[str, object]:
    return {"queue_reason": move.message}


Guard = Callable[[JobRow, Move], bool]
Effect = Callable[[JobRow, Move], dict[str, object]]


@dataclass(frozen=True)
class Edge:
    cause: str
    source: str
    target: str
    guard: Guard | None = None  # beyond the source state
    effect: Effect | None = None  # the fields this edge stores besides the status


TABLE: tuple[Edge, ...] = (
    Edge("start", QUEUED, RUNNING, effect=_on_worker),
    Edge("start", QUEUED, FAILED),
    Edge("start", QUEUED, IN_DOUBT, effect=_in_doubt),
    Edge("wait", QUEUED, QUEUED, guard=_new_reason, effect=_reason),
    Edge("settle", IN_DOUBT, RUNNING, guard=_same_worker, effect=_on_worker),
    Edge("settle", IN_DOUBT, QUEUED, guard=_same_worker, effect=_off_worker),
    Edge("resume", RUNNING, QUEUED, guard=_same_worker, effect=_requeued),
    Edge("give_up", QUEUED, FAILED),
    *(Edge("cancel", source, CANCELLED) for source in OPEN),
    Edge("report", IN_DOUBT, RUNNING),
    *(Edge("report", source, end) for source in OPEN for end in ENDS),
)


def edge(row: JobRow, move: Move) -> Edge | None:
    """The table's edge that takes `row` where `move` asks, its guard holding; None: refused."""
    for e in TABLE:
        if e.cause == move.cause and e.source == state_of(row) and e.target == move.to:
            return e if e.guard is None or e.guard(row, move) else None
    return None


def fields_of(row: JobRow, move: Move, e: Edge, now: datetime) -> dict[str, object]:
    """What the store gets for `move` over edge `e`: the status, the edge's own fields, the start
    time on a first RUNNING, the end time on an end, a FAILED job's error, the adapter."""
    fields: dict[str, object] = {"status": status_of(move.to)}
    if e.effect is not None:
        fields.update(e.effect(row, move))
    if move.to == RUNNING and row.started_at is None:
        fields["started_at"] = now
    if move.to in ENDS:
        fields["finished_at"] = now
        if move.to == FAILED:
            fields["error"] = move.message or "failed without a message"
    if move.adapter is not None:
        fields.update(adapter_name=move.adapter.name, adapter_version=move.adapter.version,
                      adapter_path=move.adapter.path)
    fields.update(move.fields)
    return fields


@dataclass
class Outcome:
    """What `transition` did: `row` is the stored row (or the row as re-read when refused; None
    when there is no such job); `move` the transition stored, None when none was."""

    row: JobRow | None
    move: Move | None = None

    @property
    def done(self) -> bool:
        return self.move is not None


Act = Callable[[JobRow], Awaitable[Move | None]]


class JobLifecycle:
    """The job rows' one writer, and the watchers' clock: every stored change of a job (status,
    step, adapter) bumps `generation` and notifies `changed`; `wait_job` and the loop watchers
    sleep on it (the loop manager bumps it too)."""

    def __init__(self, store: Store, bus: EventBus | None) -> None:
        self.store = store
        self.bus = bus
        self.lock = asyncio.Lock()  # every read-check-write of a job row (and a job's delete)
        self.changed = asyncio.Condition()
        self.generation = 0
        self.wake = asyncio.Event()  # set: the dispatcher runs a round now (a job queued or ended)

    # ------------------------------------------------------------------ transitions

    async def transition(self, job_id: str, move: Move, act: Act | None = None) -> Outcome:
        """Makes `move` on the job if the table allows it from the row read now (under the lock).
        `act(row)`, when given, runs under the lock once `move` is allowed (a call to the worker)
        and returns the move to store instead (checked against the table too), or None to store
        nothing. Out of the lock: notify, publish (`move.publish`), wake the dispatcher on a job
        queued or ended."""
        async with self.lock:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            if row is None or edge(row, move) is None:
                return Outcome(row)
            if act is not None:
                asked = move
                acted = await act(row)
                if acted is None:
                    return Outcome(row)
                move = acted
                if edge(row, move) is None:
                    raise AssertionError(f"job {job_id}: {asked.cause} may not end in {move.to} from {state_of(row)}")
            e = edge(row, move)
            assert e is not None
            row = await asyncio.to_thread(self.store.update_job, job_id, **fields_of(row, move, e, datetime.now(UTC)))
        await self.notify()
        if move.publish:
            await self.publish_status(job_id, status_of(move.to), move.message or move.to.lower(), move.adapter,
                                      move.again)
        if move.to == QUEUED or move.to in ENDS:
            self.wake.set()
        return Outcome(row, move)

    async def report(self, job_id: str, status: str, message: str, adapter: common_pb2.AdapterRef | None, *,
                     publish: bool) -> bool:
        """What the trainer says of a job (a status event, or its worker's last job) over the
        `report` edges; False when it moved nothing (an ended job still gets a missing adapter
        filled in). `publish`: the scheduler publishes it (a worker's answer) rather than having
        read it off the stream."""
        outcome = await self.transition(job_id, Move("report", status, message, adapter=adapter, publish=publish))
        if not outcome.done and adapter is not None and outcome.row is not None and outcome.row.status in TERMINAL:
            await self.fill_adapter(job_id, adapter)
        return outcome.done

    async def create(self, resolved: ResolvedJob, round_row: RoundRow | None = None) -> JobRow:
        """A new job, QUEUED (with its loop round in the same transaction when given), published."""
        row = JobRow(name=resolved.spec.name, spec_json=spec_to_json(resolved.spec), status=QUEUED,
                     warnings_json=json.dumps(resolved.warnings),
                     total_steps=max(resolved.total_steps, 0))
        if round_row is None:
            row = await asyncio.to_thread(self.store.add_job, row)
        else:
            _, row = await asyncio.to_thread(self.store.add_round_with_job, round_row, row)
        await self.publish_status(row.id, QUEUED, "queued")
        await self.notify()
        self.wake.set()
        return row

    async def fill_adapter(self, job_id: str, adapter: common_pb2.AdapterRef) -> None:
        """An ended job's adapter, reported after its end, when the row has none yet."""
        async with self.lock:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            if row is not None and row.status in TERMINAL and not row.adapter_name:
                await asyncio.to_thread(self.store.update_job, job_id, adapter_name=adapter.name,
                                        adapter_version=adapter.version, adapter_path=adapter.path)

    async def progress(self, job_id: str, step: int) -> None:
        """The job's latest stored step. Not under the lock: one ordered consumer stores the
        steps, and a step only moves forward (the caller checked)."""
        await asyncio.to_thread(self.store.update_job, job_id, current_step=step)
        await self.notify()

    # ------------------------------------------------------------------ watchers

    async def notify(self) -> None:
        async with self.changed:
            self.generation += 1
            self.changed.notify_all()

    async def wait_change(self, seen: int, timeout: float) -> None:
        """Until `generation` moves past `seen`, or `timeout` seconds."""
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait_for(lambda: self.generation != seen), timeout)

    async def wait_job(self, job_id: str, until: Callable[[JobRow], bool], recheck_seconds: float = 5.0) -> JobRow:
        """The job's row once `until(row)` holds, woken by every stored change. The generation is
        read before the row, so a change stored in between is never slept through; the timed
        re-read covers a change another process stored."""
        while True:
            seen = self.generation
            row = await self.row(job_id)
            if until(row):
                return row
            await self.wait_change(seen, recheck_seconds)

    async def row(self, job_id: str) -> JobRow:
        """The stored row of a job; NotFound naming the id when there is none."""
        row = await asyncio.to_thread(self.store.get_job, job_id)
        if row is None:
            raise NotFound(f"job {job_id!r} not found")
        return row

    # ------------------------------------------------------------------ events

    async def publish_status(self, job_id: str, status: str, message: str,
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
        except Exception as e:  # the store has it already: a watch sees it there (see ingest.py)
            log.warning("could not publish status of %s: %s", job_id, e)


def status_event(row: JobRow) -> common_pb2.JobStatusEvent:
    """The job's stored status as an event (a watch's first and, from the store, last event)."""
    event = common_pb2.JobStatusEvent(job_id=row.id, status=job_status_value(row.status),
                                      message=row.error, current_step=row.current_step, time=now_ts())
    if row.adapter_name:
        event.adapter.CopyFrom(common_pb2.AdapterRef(name=row.adapter_name, version=row.adapter_version,
                                                     path=row.adapter_path))
    return event
