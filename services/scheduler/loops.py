"""The scheduler's loop core: automated training loops that train a round, benchmark it and retrain
the winner until a target score, a round limit or a plateau (scheduler.proto, the loops section).

One driver task per unfinished loop advances it one step at a time from what the store says:

    baseline (score the base model)  ->  round k: job queued/running  ->  round k: benchmarking
        ->  scored: stop (target, rounds spent, plateau) or round k + 1 on top of the best round

Every step writes the store first and then acts, and every step can be run again from the store
alone: a round and its job are inserted in one transaction, an evaluation is found again by its
id or its label before a new one is started. So a driver that stops anywhere (the scheduler
killed, restarted) resumes on the next start exactly where the loop stood, adopting the round's
job or evaluation, and never creates one twice. A loop's status is written in one place,
`LoopManager._transition`, which checks the move against loop_lifecycle.py's table, stores it and
then publishes it on rlvr.loops.<id>.status (Nats-Msg-Id "<loop>:<round>:<STATUS>": a republish is
dropped).

The driver's steps are in loop_driver.py (`LoopDriver`, which `LoopManager` extends); here are
the loop API (create, get, list, stop, watch) and the loop's store and events that the steps use.

No gRPC here: jobs go through the JobManager (in process), evaluations through the `Benchmarks`
interface, whose gRPC implementation turns an unreachable benchmark service into `Unavailable`,
which a driver waits out (bounded by `peer_wait_seconds`) instead of failing the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from rlvr.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    check_page,
)
from rlvr.infra.events import EventBus, cancel_and_wait
from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.infra.store import Store, StoreError
from rlvr.infra.subjects import loop_status_subject
from rlvr.services.scheduler import loop_lifecycle
from rlvr.services.scheduler.benchmarks import Benchmarks
from rlvr.services.scheduler.convert import (
    LOOP_TERMINAL,
    loop_spec_from_json,
    loop_spec_to_json,
    loop_status_name,
    loop_status_value,
    loop_to_proto,
    now_ts,
)
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loop_driver import Explain, LoopDriver, one_line, utc_now
from rlvr.services.scheduler.loop_lifecycle import LoopTransitionRefused
from rlvr.services.scheduler.loopspec import ResolvedLoop, check_own_fields, resolve_loop_spec, start_words
from rlvr.services.scheduler.reclaim import reclaim_job
from rlvr.services.scheduler.rewards import reward_keys
from rlvr.services.scheduler.workers import WorkerError
from rlvr.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("rlvr.scheduler.loops")


class LoopManager(LoopDriver):
    def __init__(
        self,
        store: Store,
        bus: EventBus | None,
        jobs: JobManager,
        benchmarks: Benchmarks,
        artifact_root: Path,
        *,
        max_lora_rank: int = 64,
        peer_wait_seconds: float = 600.0,
        max_evaluation_attempts: int = 3,
        recheck_seconds: float = 10.0,
    ) -> None:
        self.store = store
        self.bus = bus
        self.jobs = jobs
        self.benchmarks = benchmarks
        self.artifact_root = Path(artifact_root)
        self.max_lora_rank = max_lora_rank
        self.peer_wait_seconds = peer_wait_seconds
        self.max_evaluation_attempts = max_evaluation_attempts
        self.recheck_seconds = recheck_seconds
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._status_lock = asyncio.Lock()  # every read-check-write of a loop's status (`_transition`)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Picks up every loop a previous scheduler left unfinished, where it stood."""
        open_statuses = [loop_status_name(v) for v in scheduler_pb2.LoopStatus.values()
                         if v and loop_status_name(v) not in LOOP_TERMINAL]
        for row in await asyncio.to_thread(self.store.list_loops, open_statuses, 100_000, 0):
            log.info("resuming loop %s (%s)", row.id, row.status)
            self._spawn(row.id)

    async def stop(self) -> None:
        for task in list(self._drivers.values()):
            await cancel_and_wait(task)
        self._drivers.clear()

    def _spawn(self, loop_id: str) -> None:
        task = asyncio.create_task(self._drive(loop_id), name=f"loop-{loop_id}")
        self._drivers[loop_id] = task
        task.add_done_callback(lambda t: self._drivers.pop(loop_id, None) if self._drivers.get(loop_id) is t else None)

    # ------------------------------------------------------------------ API

    async def create(self, spec: scheduler_pb2.LoopSpec, dry_run: bool) -> tuple[ResolvedLoop, scheduler_pb2.Loop | None]:
        # What needs no peer first: a bad spec is refused at once, not after the benchmark service's
        # retries when that service is down.
        catalog = await self.jobs.rewards.catalog(reward_keys(spec.job))
        start, start_rank = await self._start_adapter(spec)
        # In threads: resolving the job spec loads the environment registry when it names one, which
        # waits for a remote environment's server that is down (JobManager.environments_for).
        own = await asyncio.to_thread(check_own_fields, spec, self.max_lora_rank, catalog, start_rank)
        try:
            await self.jobs.check_data(own.spec.job, catalog)
        except InvalidArgument as e:
            raise e.prefixed("job.") from None
        benchmarks = await self.benchmarks.list()
        resolved = await asyncio.to_thread(resolve_loop_spec, spec, benchmarks, self.max_lora_rank, catalog,
                                           start_rank)
        # a bare base-model name, resolved by check_data to its folder under the model roots
        resolved.spec.job.base_model = resolved.job.spec.base_model = own.spec.job.base_model
        if start is not None:  # the adapter it starts from, with the folder the trainer and the benchmark read
            resolved.spec.job.init_adapter.CopyFrom(start)
            resolved.job.spec.init_adapter.CopyFrom(start)
        if dry_run:
            return resolved, None
        now = utc_now()
        row = LoopRow(name=resolved.spec.name, spec_json=loop_spec_to_json(resolved.spec), status="QUEUED",
                      message=f"queued: scoring {start_words(resolved.spec)} first", created_at=now, started_at=now,
                      warnings_json=json.dumps(resolved.warnings))
        # Shielded: gRPC cancels this handler when its caller goes away, and the insert's thread
        # runs on regardless; a stored loop must get its driver now, not at the next restart.
        row = await asyncio.shield(self._enqueue(row))
        log.info("loop %s created: %s on %s to %g%%", row.id, row.name, resolved.spec.benchmark, resolved.spec.target)
        # The loop as stored (QUEUED): its driver, started already, may have moved it on by now, and
        # CreateLoop answers what it created (a read here raced the driver's first transition).
        return resolved, loop_to_proto(row, [], {})

    async def _start_adapter(self, spec: scheduler_pb2.LoopSpec) -> tuple[common_pb2.AdapterRef | None, int]:
        """The adapter a loop starts from (job.init_adapter.name, resolved to its job's folder) and its
        LoRA rank (what the rounds stack on); (None, 0) for a loop that starts from the base model."""
        if not spec.job.init_adapter.name:
            return None, 0
        try:
            ref = await self.jobs.resolve_adapter(spec.job.init_adapter)
        except InvalidArgument as e:
            raise e.prefixed("job.") from None
        except FailedPrecondition as e:
            raise FailedPrecondition(f"job.{e}") from None
        return ref, await self.jobs.adapter_rank(ref)

    async def _enqueue(self, row: LoopRow) -> LoopRow:
        """Stores the loop QUEUED and starts its driver; both or neither."""
        row = await asyncio.to_thread(self.store.add_loop, row)  # born QUEUED; `_transition` moves it on
        try:
            await self._publish(row.id, "QUEUED", 0, row.message)
        finally:
            self._spawn(row.id)
        return row

    async def get(self, loop_id: str) -> scheduler_pb2.Loop:
        row = await self._loop_row(loop_id)
        return await self._view(row)

    async def list(self, status: int, limit: int, offset: int) -> tuple[list[scheduler_pb2.Loop], int]:
        check_page(limit, offset)
        if status and status not in scheduler_pb2.LoopStatus.values():
            raise InvalidArgument(f"status: {status} is not a LoopStatus; allowed: "
                                  f"{', '.join(scheduler_pb2.LoopStatus.keys()[1:])} or unset for all")
        name = loop_status_name(status) if status else None
        rows = await asyncio.to_thread(self.store.list_loops, name, limit or 100, offset)
        total = await asyncio.to_thread(self.store.count_loops, name)
        return [await self._view(r) for r in rows], total

    async def stop_loop(self, loop_id: str) -> scheduler_pb2.Loop:
        """STOPPED within seconds: the driver ends, the running round's job is cancelled, finished
        rounds are kept. A job that cannot be cancelled now (its trainer unreachable, or refusing)
        does not keep the loop open: the loop and its round are stopped, and their message names
        the job left to cancel."""
        row = await self._loop_row(loop_id)
        if row.status in LOOP_TERMINAL:
            raise FailedPrecondition(f"loop {loop_id} has already ended ({row.status}); nothing to stop")
        # Shielded, as `create` shields its enqueue: a caller that goes away half way (a deadline,
        # a disconnect) must not leave the loop open with its driver gone.
        await asyncio.shield(self._stop(loop_id))
        return await self.get(loop_id)

    async def _stop(self, loop_id: str) -> None:
        task = self._drivers.pop(loop_id, None)
        if task is not None:
            await cancel_and_wait(task)
        # Ended first (`explain` runs once STOPPED is stored): a round the cancelled driver was still
        # inserting (its thread outlives the cancel) is then either visible to `explain` or refused by
        # the store (add_round_with_job).
        await self._transition(loop_id, "STOPPED", 0, "stopped by request", explain=lambda: self._stop_rounds(loop_id))

    async def _stop_rounds(self, loop_id: str) -> tuple[str, int]:
        """Stops the loop's running round and cancels its job; the stopped loop's message and round."""
        rounds = await asyncio.to_thread(self.store.rounds, loop_id)
        last = rounds[-1] if rounds else None
        where, left = "before round 1", ""
        if last is not None and last.status in ("TRAINING", "BENCHMARKING"):
            where = f"during round {last.index}"
            if last.status == "TRAINING" and last.job_id:
                try:
                    await self.jobs.cancel(last.job_id)
                except FailedPrecondition:
                    pass  # the job ended meanwhile
                except (Unavailable, WorkerError) as e:
                    left = (f"; its job {last.job_id} could not be cancelled ({str(e)[:300]}): "
                            f"cancel it with `rlvr jobs cancel {last.job_id}`")
                    log.warning("loop %s stopped, but %s", loop_id, left[2:])
            await self._update_round(last, status="STOPPED", finished_at=utc_now(), error="stopped by request" + left)
        elif last is not None:
            where = f"after round {last.index}"
        return f"stopped by request {where}{left}", last.index if last else 0

    async def watch(self, loop_id: str) -> AsyncIterator[scheduler_pb2.Loop]:
        """The loop now, then again whenever it changes (status, a round's step or score), until it
        ends. Woken by every stored change of a job or loop in this scheduler."""
        last: tuple[object, ...] | None = None
        while True:
            seen = self.jobs.generation
            loop = await self.get(loop_id)
            signature = _signature(loop)
            if signature != last:
                last = signature
                yield loop
            if loop_status_name(loop.status) in LOOP_TERMINAL:
                return
            await self.jobs.wait_change(seen, self.recheck_seconds)

    # ------------------------------------------------------------------ storage

    async def _reclaim(self, loop_id: str) -> None:
        """Deletes what the loop's finished rounds made beside their adapters; adds the bytes freed
        to each round's count. Best effort: a round whose files cannot be removed now (a file
        system or store error) is logged and tried again at the next reclaim; it never fails the
        loop, nor undoes its end."""
        for r in await asyncio.to_thread(self.store.rounds, loop_id):
            if not r.job_id or r.status in ("TRAINING", "BENCHMARKING"):
                continue
            try:
                freed = await asyncio.to_thread(reclaim_job, self.store, self.artifact_root, r.job_id,
                                                Path(r.adapter_path) if r.adapter_path else None)
            except (OSError, StoreError) as e:
                log.warning("loop %s: could not reclaim round %d's files (job %s), tried again later: %s",
                            loop_id, r.index, r.job_id, one_line(e))
                continue
            if freed:
                log.info("loop %s: reclaimed %d bytes from round %d (job %s)", loop_id, freed, r.index, r.job_id)
                await self._update_round(r, reclaimed_bytes=r.reclaimed_bytes + freed)

    # ------------------------------------------------------------------ state and events

    async def _loop_row(self, loop_id: str) -> LoopRow:
        row = await asyncio.to_thread(self.store.get_loop, loop_id) if loop_id else None
        if row is None:
            raise NotFound(f"loop {loop_id!r} not found")
        return row

    async def _view(self, row: LoopRow) -> scheduler_pb2.Loop:
        rounds = await asyncio.to_thread(self.store.rounds, row.id)
        jobs: dict[str, JobRow] = {}
        for r in rounds:
            if r.job_id:
                job = await asyncio.to_thread(self.store.get_job, r.job_id)
                if job is not None:
                    jobs[r.job_id] = job
        return loop_to_proto(row, rounds, jobs)

    async def _update_round(self, round_: RoundRow, **fields: object) -> None:
        await asyncio.to_thread(self.store.update_round, round_.loop_id, round_.index, **fields)
        await self.jobs.notify()

    async def _transition(self, loop_id: str, to: str, round_index: int, message: str, *, error: str = "",
                          explain: Explain | None = None) -> LoopRow:
        """The one writer of a loop's status. Under the lock, from the row read now: checks the move
        against the table (loop_lifecycle.py; LoopTransitionRefused, a FailedPrecondition, when it is
        not allowed), stores the status with `message` (an end with its time and `error`). Then
        `explain()`, when given, runs with the new status stored and returns the message and round to
        store and publish instead (a stop: what it cancelled). On an end, reclaims the finished
        rounds' files when the spec asks. Last, publishes the status event and wakes the watchers:
        the row is the record, an event follows it."""
        async with self._status_lock:
            row = await self._loop_row(loop_id)
            loop_lifecycle.check(loop_id, row.status, to)
            fields: dict[str, object] = {"status": to, "message": message}
            if to in LOOP_TERMINAL:
                fields["finished_at"] = utc_now()
                if error:
                    fields["error"] = error
            row = await asyncio.to_thread(self.store.update_loop, loop_id, **fields)
        if explain is not None:
            message, round_index = await explain()
            row = await asyncio.to_thread(self.store.update_loop, loop_id, message=message)
        if to in LOOP_TERMINAL:
            if loop_spec_from_json(row.spec_json).reclaim_storage:
                await self._reclaim(loop_id)
            log.info("loop %s ended %s: %s", loop_id, to, message)
        await self._publish(loop_id, to, round_index, message)
        await self.jobs.notify()
        return row

    async def _set_message(self, loop_id: str, message: str) -> None:
        await asyncio.to_thread(self.store.update_loop, loop_id, message=message)
        await self.jobs.notify()

    async def _fail(self, loop_id: str, error: str, round_index: int | None = None) -> None:
        """FAILED with `error`, unless the loop has ended meanwhile (a failure after its end, such as
        in the clean-up that follows it, does not turn a reached target into a failure)."""
        if round_index is None:
            rounds = await asyncio.to_thread(self.store.rounds, loop_id)
            round_index = rounds[-1].index if rounds else 0
        try:
            await self._transition(loop_id, "FAILED", round_index, f"failed: {error}", error=error)
        except LoopTransitionRefused as e:
            if e.status not in LOOP_TERMINAL:
                raise
            log.error("loop %s had already ended %s when it failed: %s", loop_id, e.status, error)

    async def _publish(self, loop_id: str, status: str, round_index: int, message: str, *,
                       score: float | None = None, event: str | None = None) -> None:
        """The change as a LoopStatusEvent, id "<loop>:<round>:<STATUS>" (or :SCORED for a score)."""
        if self.bus is None:
            return
        payload = scheduler_pb2.LoopStatusEvent(loop_id=loop_id, status=loop_status_value(status), round=round_index,
                                                message=message, time=now_ts())
        if score is not None:
            payload.score = score
        try:
            await self.bus.publish(loop_status_subject(loop_id), payload.SerializeToString(),
                                   f"{loop_id}:{round_index}:{event or status}")
        except Exception as e:  # noqa: BLE001 (the store has it; watchers read the store)
            log.warning("could not publish status of loop %s: %s", loop_id, e)


def _signature(loop: scheduler_pb2.Loop) -> tuple[object, ...]:
    """What a watcher is shown a new Loop for (not the clock: elapsed times change every second)."""
    return (loop.status, loop.message, loop.error, loop.baseline_score if loop.HasField("baseline_score") else None,
            tuple((r.index, r.status, r.score if r.HasField("score") else None, r.current_step, r.evaluation_id,
                   r.job_id) for r in loop.rounds))
