"""The scheduler's dispatcher: each round reconciles the running jobs with their trainer workers,
settles the starts in doubt, and gives each queued job to an idle worker that fits it. Every
change of a job's status goes through the lifecycle (lifecycle.py); the workers are reached
through the `Workers` interface (workers.py).

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
the job stays QUEUED with that worker recorded in `worker` ("in doubt": lifecycle.IN_DOUBT): it is
given to no other worker until that one answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rlvr.infra.schema import JobRow
from rlvr.services.scheduler.convert import TERMINAL, spec_from_json
from rlvr.services.scheduler.fit import fit, queue_reason
from rlvr.services.scheduler.lifecycle import FAILED, IN_DOUBT, QUEUED, RUNNING, JobLifecycle, Move
from rlvr.services.scheduler.workers import WorkerBusy, WorkerError, Workers, WorkerState, WorkerUnavailable
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.scheduler.jobs")

MAX_RESUMES = 3
"""How many times a job whose trainer was lost is resumed before it fails (see the module's doc)."""


class Dispatcher:
    def __init__(self, lifecycle: JobLifecycle, workers: Workers, poll_seconds: float = 1.0) -> None:
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.workers = workers
        self.poll_seconds = poll_seconds
        # queued job id -> (the live workers' names and capabilities, why each cannot run it), fit.py's
        self.fits: dict[str, tuple[tuple[object, ...], dict[str, str | None]]] = {}
        # job id -> the worker it ran on when it was lost and queued again (the queued row records
        # none): a resume elsewhere fetches the job's folder from there (StartJobRequest.resume_source).
        # In memory: after a scheduler restart the resume goes on from what its new worker holds.
        self.ran_on: dict[str, str] = {}

    async def run(self) -> None:
        """A round now, then again on every wake (a job queued or ended) or every poll_seconds."""
        wake = self.lifecycle.wake
        while True:
            try:
                await self.dispatch_once()
            except Exception:
                log.exception("dispatch round failed")
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.poll_seconds)

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
                await self.lifecycle.report(row.id, state.last_status, state.last_error, state.last_adapter, publish=True)
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
        self.fits = {row.id: self.fits[row.id] for row in free if row.id in self.fits}
        for row in free:
            seen, reasons = self.fits.get(row.id, (None, {}))
            if seen != workers_seen:
                spec = spec_from_json(row.spec_json)
                reasons = {a: fit(spec, s.capabilities, s.name or a) for a, s in live.items()}
                self.fits[row.id] = (workers_seen, reasons)
            address = next((a for a in idle if reasons[a] is None), None)
            if address is not None:
                idle.remove(address)  # taken, even if StartJob is refused: next round
                await self._start_on(row, address)
            else:
                await self._set_queue_reason(row, queue_reason(reasons, len(self.workers.addresses)))

    async def _set_queue_reason(self, row: JobRow, reason: str) -> None:
        """Stores why a queued job waits, and publishes it as a QUEUED status message, only when it
        changed (a dispatch round runs every poll_seconds). Each change its own event id (a reason
        can come back within the stream's duplicate window: a worker restarting and answering
        again); the store's reason keeps a restart from repeating it."""
        if reason == row.queue_reason:
            return
        move = Move("wait", QUEUED, reason, again=f"waits-{time.time_ns()}")
        if (await self.lifecycle.transition(row.id, move)).done:
            log.info("job %s waits: %s", row.id, reason)

    async def _lost(self, row: JobRow, state: WorkerState) -> None:
        """A running job its worker no longer runs, though it did not end there: queued again to
        be resumed, or failed once its resumes are spent (see the module's doc)."""
        reported = state.last_job_id == row.id
        why = state.last_error if reported and state.last_error else \
            f"trainer {row.worker} no longer runs this job (worker restarted?)"
        done = row.resumes
        if done >= MAX_RESUMES:
            message = f"{why}; not resumed again after {done} resumes" if done else why
            await self.lifecycle.report(row.id, FAILED, message, state.last_adapter if reported else None, publish=True)
            return

        async def requeue(current: JobRow) -> Move:
            n = current.resumes + 1
            return Move("resume", QUEUED, f"resuming from the last checkpoint after the trainer was lost at step "
                        f"{current.current_step} ({why}); resume {n} of {MAX_RESUMES}", worker=row.worker,
                        again=f"resume-{n}")

        outcome = await self.lifecycle.transition(row.id, Move("resume", QUEUED, worker=row.worker), requeue)
        if outcome.move is not None:  # else ended or moved meanwhile
            self.ran_on[row.id] = row.worker
            log.warning("job %s: %s", row.id, outcome.move.message)

    async def _settle_doubt(self, row: JobRow, state: WorkerState | None) -> bool:
        """A queued job whose StartJob on `row.worker` had no answer: True when it runs there (now
        RUNNING) or that worker still cannot say; False when the worker does not have it (the job
        is free to be dispatched again)."""
        if state is None and row.worker in self.workers.addresses:
            return True  # still unreachable: try no other worker

        async def settle(current: JobRow) -> Move:
            if state is not None and state.has_job(row.id):
                return Move("settle", RUNNING, f"started on {row.worker}", worker=row.worker)
            log.info("job %s did not start on %s; it is queued again", row.id, row.worker)
            return Move("settle", QUEUED, worker=row.worker, publish=False)

        outcome = await self.lifecycle.transition(row.id, Move("settle", RUNNING, worker=row.worker), settle)
        if outcome.move is None:  # not in doubt there any more
            return outcome.row is not None and outcome.row.status == RUNNING
        if outcome.move.to == RUNNING:
            log.info("dispatched job %s to %s", row.id, row.worker)
            return True
        return False

    async def _sources(self, row: JobRow, spec: common_pb2.JobSpec, address: str, resume: bool) -> dict[str, str]:
        """The other workers whose artifact roots hold what the job needs (StartJobRequest
        init_adapter_source and resume_source): the worker that ran the job before (a resume), and
        the one that ran the job whose adapter is its init_adapter ("job-<id>"). Only those other
        than `address` and known to this scheduler; the worker fetches from them (no shared disk)."""
        known = set(self.workers.addresses) - {address}
        sources: dict[str, str] = {}
        if resume and self.ran_on.get(row.id) in known:
            sources["resume_source"] = self.ran_on[row.id]
        name = spec.init_adapter.name if spec.HasField("init_adapter") else ""
        if name.startswith("job-") and spec.init_adapter.path:
            holder = await asyncio.to_thread(self.store.get_job, name.removeprefix("job-"))
            if holder is not None and holder.worker in known and holder.adapter_path == spec.init_adapter.path:
                sources["init_adapter_source"] = holder.worker
        return sources

    async def _start_on(self, row: JobRow, address: str) -> None:
        """StartJob on `address`; every outcome is handled here (see the module docstring)."""

        async def start(current: JobRow) -> Move | None:
            # A job that ran before (queued again after its trainer was lost) goes on from its checkpoint.
            resume = current.started_at is not None or current.resumes > 0
            spec = spec_from_json(row.spec_json)
            try:
                await self.workers.start(address, row.id, spec, row.total_steps, resume=resume,
                                         stored_steps=current.current_step,
                                         **await self._sources(current, spec, address, resume))
            except WorkerBusy:
                return None  # another job holds the worker: next round
            except WorkerUnavailable as e:
                state = await self.workers.status(address)
                if state is None:
                    log.warning("StartJob of %s on %s has no answer (%s) and the worker cannot be asked: "
                                "the job waits for it", row.id, address, e)
                    return Move("start", IN_DOUBT, worker=address, publish=False)
                if not state.has_job(row.id):
                    log.warning("job %s did not start on %s (%s); next round tries again", row.id, address, e)
                    return None
                log.info("job %s runs on %s although StartJob had no answer (%s)", row.id, address, e)
            except WorkerError as e:
                return Move("start", FAILED, str(e) or type(e).__name__)
            if resume:
                return Move("start", RUNNING, f"resumed on {address}", worker=address,
                            again=f"resume-{current.resumes}")
            return Move("start", RUNNING, f"started on {address}", worker=address)

        outcome = await self.lifecycle.transition(row.id, Move("start", RUNNING, worker=address), start)
        if outcome.move is not None and outcome.move.to == RUNNING:
            self.ran_on.pop(row.id, None)  # its folder is on `address` now
            log.info("dispatched job %s to %s%s", row.id, address, " to resume" if outcome.move.again else "")
