"""The scheduler's loop core: automated training loops that train a round, benchmark it and retrain
the winner until a target score, a round limit or a plateau (scheduler.proto, the loops section).

One driver task per unfinished loop advances it one step at a time from what the store says:

    baseline (score the base model)  ->  round k: job queued/running  ->  round k: benchmarking
        ->  scored: stop (target, rounds spent, plateau) or round k + 1 on top of the best round

Every step writes the store first and then acts, and every step can be run again from the store
alone: a round and its job are inserted in one transaction, an evaluation is found again by its
id or its label before a new one is started. So a driver that stops anywhere (the scheduler
killed, restarted) resumes on the next start exactly where the loop stood, adopting the round's
job or evaluation, and never creates one twice. Status changes are stored, then published on
rlvr.loops.<id>.status (Nats-Msg-Id "<loop>:<round>:<STATUS>": a republish is dropped).

No gRPC here: jobs go through the JobManager (in process), evaluations through the `Benchmarks`
interface, whose gRPC implementation turns an unreachable benchmark service into `Unavailable`,
which a driver waits out (bounded by `peer_wait_seconds`) instead of failing the loop.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlvr.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RlvrServiceError,
    Unavailable,
    check_page,
)
from rlvr.infra.events import EventBus, cancel_and_wait, loop_status_subject
from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.infra.store import ConflictError, Store, StoreError
from rlvr.jobspec import resolve_spec
from rlvr.services.scheduler import loop_rules
from rlvr.services.scheduler.benchmarks import Benchmarks, interrupted
from rlvr.services.scheduler.convert import (
    LOOP_TERMINAL,
    TERMINAL,
    loop_spec_from_json,
    loop_spec_to_json,
    loop_status_name,
    loop_status_value,
    loop_to_proto,
    now_ts,
)
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loopspec import ResolvedLoop, check_own_fields, resolve_loop_spec
from rlvr.services.scheduler.reclaim import reclaim_job
from rlvr.services.scheduler.workers import WorkerError
from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

log = logging.getLogger("rlvr.scheduler.loops")


def _now() -> datetime:
    return datetime.now(UTC)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _evaluation_seconds(evaluation: benchmark_pb2.Evaluation) -> float:
    if not evaluation.started_at.seconds or not evaluation.finished_at.seconds:
        return 0.0
    return max(0.0, evaluation.finished_at.ToDatetime().timestamp() - evaluation.started_at.ToDatetime().timestamp())


class LoopManager:
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
        catalog = await self.jobs.rewards.catalog()
        own = check_own_fields(spec, self.max_lora_rank, catalog)
        try:
            await self.jobs.check_data(own.spec.job, catalog)
        except InvalidArgument as e:
            raise e.prefixed("job.") from None
        resolved = resolve_loop_spec(spec, await self.benchmarks.list(), self.max_lora_rank, catalog)
        if dry_run:
            return resolved, None
        now = _now()
        row = LoopRow(name=resolved.spec.name, spec_json=loop_spec_to_json(resolved.spec), status="QUEUED",
                      message="queued: scoring the base model first", created_at=now, started_at=now,
                      warnings_json=json.dumps(resolved.warnings))
        # Shielded: gRPC cancels this handler when its caller goes away, and the insert's thread
        # runs on regardless; a stored loop must get its driver now, not at the next restart.
        row = await asyncio.shield(self._enqueue(row))
        log.info("loop %s created: %s on %s to %g%%", row.id, row.name, resolved.spec.benchmark, resolved.spec.target)
        return resolved, await self.get(row.id)

    async def _enqueue(self, row: LoopRow) -> LoopRow:
        """Stores the loop QUEUED and starts its driver; both or neither."""
        row = await asyncio.to_thread(self.store.add_loop, row)
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
        # Ended first: a round the cancelled driver was still inserting (its thread outlives the
        # cancel) is then either visible below or refused by the store (add_round_with_job).
        await asyncio.to_thread(self.store.update_loop, loop_id, status="STOPPED", finished_at=_now(),
                                message="stopped by request")
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
            await self._update_round(last, status="STOPPED", finished_at=_now(), error="stopped by request" + left)
        elif last is not None:
            where = f"after round {last.index}"
        await self._finish(loop_id, "STOPPED", f"stopped by request {where}{left}", last.index if last else 0)

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

    # ------------------------------------------------------------------ the driver

    async def _drive(self, loop_id: str) -> None:
        waiting_since: float | None = None
        delay = 1.0
        while True:
            try:
                if await self._advance(loop_id):
                    return
                waiting_since, delay = None, 1.0
            except asyncio.CancelledError:
                raise
            except Unavailable as e:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since > self.peer_wait_seconds:
                    await self._fail(loop_id, f"{e}, for more than {self.peer_wait_seconds:.0f} s")
                    return
                log.warning("loop %s waits: %s", loop_id, e)
                await self._set_message(loop_id, f"waiting: {e}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            except Exception as e:  # noqa: BLE001 (a loop must end with its cause, never hang)
                log.exception("loop %s: the driver failed", loop_id)
                await self._fail(loop_id, f"internal error while driving the loop: {_one_line(e)}")
                return

    async def _advance(self, loop_id: str) -> bool:
        """One step from what the store says; True once the loop has ended."""
        loop = await self._loop_row(loop_id)
        if loop.status in LOOP_TERMINAL:
            return True
        spec = loop_spec_from_json(loop.spec_json)
        if loop.baseline_score is None:
            await self._baseline(loop, spec)
            return False
        rounds = await asyncio.to_thread(self.store.rounds, loop_id)
        last = rounds[-1] if rounds else None
        if last is None or last.status == "SCORED":
            if last is not None:
                verdict = loop_rules.verdict(rounds, target=spec.target, max_rounds=spec.max_rounds,
                                             give_up_after=spec.give_up_after)
                if verdict is not None:
                    await self._finish(loop_id, verdict.status, verdict.message, last.index)
                    return True
            await self._start_round(loop, spec, rounds)
            return False
        if last.status == "TRAINING":
            await self._train(loop, last)
            return False
        if last.status == "BENCHMARKING":
            await self._benchmark(loop, spec, last, rounds)
            return False
        # A FAILED or STOPPED round under a loop that did not end with it (a stop cut short).
        status = "FAILED" if last.status == "FAILED" else "STOPPED"
        await self._finish(loop_id, status, f"round {last.index} {last.status.lower()}", last.index,
                           error=last.error if status == "FAILED" else "")
        return True

    # ------------------------------------------------------------------ baseline

    async def _baseline(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec) -> None:
        if loop.status != "BENCHMARKING":
            await self._set_status(loop.id, "BENCHMARKING", 0, f"scoring the base model {spec.job.base_model} on "
                                                               f"{spec.benchmark} (baseline)")
        request = self._evaluation_request(spec, f"{loop.name} baseline (loop {loop.id})")

        async def remember(evaluation_id: str) -> None:
            await asyncio.to_thread(self.store.update_loop, loop.id, baseline_evaluation_id=evaluation_id)

        evaluation = await self._evaluate(loop, loop.baseline_evaluation_id, request, remember, "the baseline")
        if evaluation is None:
            return  # interrupted: run again on the next step
        if evaluation.status != benchmark_pb2.EVALUATION_STATUS_COMPLETED:
            error = f"the baseline evaluation {evaluation.id} failed: {evaluation.error}".replace("  ", " ")
            await self._fail(loop.id, error)
            return
        score = loop_rules.percent(getattr(evaluation.scores, spec.score_column))
        await asyncio.to_thread(self.store.update_loop, loop.id, baseline_score=score,
                                baseline_questions=evaluation.questions_total,
                                baseline_seconds=_evaluation_seconds(evaluation), evaluation_attempts=0)
        log.info("loop %s: baseline %s %.1f%%", loop.id, spec.score_column, score)

    # ------------------------------------------------------------------ a round

    async def _start_round(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec, rounds: builtins.list[RoundRow]) -> None:
        index = len(rounds) + 1
        best = loop_rules.best_round(rounds)
        job_spec = common_pb2.JobSpec()
        job_spec.CopyFrom(spec.job)
        job_spec.name = loop_rules.round_job_name(loop.name, index)
        job_spec.advanced.seed = loop_rules.round_seed(spec.job.advanced.seed, index)
        on_top = "on the base model"
        if best is not None:
            best_job = await self.jobs.job_row(best.job_id or "")
            job_spec.init_adapter.CopyFrom(common_pb2.AdapterRef(
                name=best_job.adapter_name, version=best_job.adapter_version, path=best_job.adapter_path))
            on_top = f"on top of R{best.index} ({best.score:.1f}%)"
        resolved = resolve_spec(job_spec)
        round_row = RoundRow(loop_id=loop.id, index=index, status="TRAINING",
                             base_round=best.index if best is not None else 0, started_at=_now())
        try:
            job = await self.jobs.create_for_round(resolved, round_row)
        except ConflictError:  # the loop ended meanwhile (stopped): nothing was created
            return
        await self._set_status(loop.id, "QUEUED", index,
                               f"round {index} of {spec.max_rounds}: job {job.id} queued, training {on_top}")

    async def _train(self, loop: LoopRow, round_: RoundRow) -> None:
        """Follows the round's job until it ends: the loop reads QUEUED while the job waits for a
        worker, TRAINING while it runs; a completed job's round goes on to BENCHMARKING."""
        job_id = round_.job_id or ""
        status = loop.status
        job = await self.jobs.job_row(job_id)
        while True:
            if job.status == "QUEUED" and status != "QUEUED":
                status = "QUEUED"
                await self._set_status(loop.id, status, round_.index,
                                       f"round {round_.index}: job {job_id} waits for a trainer worker")
            elif job.status == "RUNNING" and status != "TRAINING":
                status = "TRAINING"
                await self._set_status(loop.id, status, round_.index,
                                       f"round {round_.index}: training job {job_id} on {job.worker or 'a worker'}")
            elif job.status in TERMINAL:
                break

            def changed(row: JobRow, seen: str = job.status) -> bool:
                return row.status != seen

            job = await self.jobs.wait_job(job_id, changed)
        training = (job.finished_at - job.started_at).total_seconds() if job.started_at and job.finished_at else 0.0
        if job.status == "COMPLETED" and job.adapter_path:
            await self._update_round(round_, status="BENCHMARKING", training_seconds=training)
            return
        why = (job.error or "failed" if job.status == "FAILED" else
               "was cancelled" if job.status == "CANCELLED" else "completed without an adapter")
        error = f"round {round_.index}'s job {job_id} {'failed: ' if job.status == 'FAILED' else ''}{why}"
        await self._update_round(round_, status="FAILED", training_seconds=training, finished_at=_now(), error=error)
        await self._fail(loop.id, error, round_.index)

    async def _benchmark(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec, round_: RoundRow,
                         rounds: builtins.list[RoundRow]) -> None:
        job = await self.jobs.job_row(round_.job_id or "")
        if loop.status != "BENCHMARKING":
            await self._set_status(loop.id, "BENCHMARKING", round_.index,
                                   f"round {round_.index}: scoring {job.adapter_name} on {spec.benchmark}")
        request = self._evaluation_request(spec, f"{loop.name} R{round_.index} (loop {loop.id})", job)

        async def remember(evaluation_id: str) -> None:
            await self._update_round(round_, evaluation_id=evaluation_id)

        evaluation = await self._evaluate(loop, round_.evaluation_id, request, remember, f"round {round_.index}")
        if evaluation is None:
            return
        seconds = _evaluation_seconds(evaluation)
        if evaluation.status != benchmark_pb2.EVALUATION_STATUS_COMPLETED:
            error = f"round {round_.index}'s evaluation {evaluation.id} failed: {evaluation.error}".replace("  ", " ")
            await self._update_round(round_, status="FAILED", benchmarking_seconds=seconds, finished_at=_now(),
                                     error=error)
            await self._fail(loop.id, error, round_.index)
            return
        assert loop.baseline_score is not None
        score = loop_rules.percent(getattr(evaluation.scores, spec.score_column))
        before = loop_rules.best_before(loop.baseline_score, rounds, round_.index)
        threshold = loop_rules.gain_threshold(spec.min_gain if spec.HasField("min_gain") else None, before,
                                              evaluation.questions_total)
        real = loop_rules.is_real_gain(score, before, threshold)
        await self._update_round(round_, status="SCORED", score=score, questions=evaluation.questions_total,
                                 gain_threshold=round(threshold, 6), real_gain=real, benchmarking_seconds=seconds,
                                 finished_at=_now())
        await asyncio.to_thread(self.store.update_loop, loop.id, evaluation_attempts=0)
        gain = f"{score - before:+.1f} points over the best before ({before:.1f}%)"
        await self._publish(loop.id, "BENCHMARKING", round_.index,
                             f"round {round_.index} scored {score:.1f}%: {gain}, "
                             f"{'a real gain' if real else f'no real gain (threshold {threshold:.2f})'}",
                             score=score, event="SCORED")
        if spec.reclaim_storage:
            await self._reclaim(loop.id)

    # ------------------------------------------------------------------ evaluations

    @staticmethod
    def _evaluation_request(spec: scheduler_pb2.LoopSpec, label: str, job: JobRow | None = None
                            ) -> benchmark_pb2.RunEvaluationRequest:
        request = benchmark_pb2.RunEvaluationRequest(
            model=spec.job.base_model, benchmark=spec.benchmark, limit=spec.benchmark_limit, label=label[:200],
            dataset=spec.benchmark_dataset, dataset_split=spec.benchmark_dataset_split)
        if job is not None:
            # The round's published adapter (stacked on the best round's), uploaded as the next
            # version of its name: the rollout service holds it whichever backend trained it.
            request.adapter.name = job.adapter_name
            request.adapter_path = job.adapter_path
        return request

    async def _evaluate(self, loop: LoopRow, stored_id: str, request: benchmark_pb2.RunEvaluationRequest,
                        remember: Callable[[str], Coroutine[Any, Any, None]], what: str
                        ) -> benchmark_pb2.Evaluation | None:
        """The evaluation of `what`, ended: the stored one if the benchmark service still knows it,
        else one with the same label (started before a restart could store its id), else a new
        one. None when it was interrupted by a benchmark service restart and is to be run again
        (at most `max_evaluation_attempts` times)."""
        evaluation = await self.benchmarks.get(stored_id) if stored_id else None
        if evaluation is None:
            evaluation = await self.benchmarks.find(request.benchmark, request.label)
            if evaluation is None or interrupted(evaluation):
                try:
                    evaluation = await self.benchmarks.run(request)
                except Unavailable:
                    raise
                except RlvrServiceError as e:  # refused: a bad model or adapter, not a passing outage
                    return benchmark_pb2.Evaluation(status=benchmark_pb2.EVALUATION_STATUS_FAILED,
                                                    error=f"the benchmark service refused it: {e}")
            await remember(evaluation.id)
        final = await self.benchmarks.wait(evaluation.id)
        if final is None or interrupted(final):
            if loop.evaluation_attempts + 1 >= self.max_evaluation_attempts:
                return final or benchmark_pb2.Evaluation(
                    id=evaluation.id, status=benchmark_pb2.EVALUATION_STATUS_FAILED,
                    error="the benchmark service no longer knows it")
            log.warning("loop %s: the evaluation of %s (%s) was interrupted; running it again", loop.id, what,
                        evaluation.id)
            await asyncio.to_thread(self.store.update_loop, loop.id, evaluation_attempts=loop.evaluation_attempts + 1)
            await remember("")
            return None
        return final

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
                freed = await asyncio.to_thread(reclaim_job, self.store, self.artifact_root, r.job_id)
            except (OSError, StoreError) as e:
                log.warning("loop %s: could not reclaim round %d's files (job %s), tried again later: %s",
                            loop_id, r.index, r.job_id, _one_line(e))
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

    async def _set_status(self, loop_id: str, status: str, round_index: int, message: str) -> None:
        await asyncio.to_thread(self.store.update_loop, loop_id, status=status, message=message)
        await self._publish(loop_id, status, round_index, message)
        await self.jobs.notify()

    async def _set_message(self, loop_id: str, message: str) -> None:
        await asyncio.to_thread(self.store.update_loop, loop_id, message=message)
        await self.jobs.notify()

    async def _finish(self, loop_id: str, status: str, message: str, round_index: int, error: str = "") -> None:
        fields: dict[str, object] = {"status": status, "message": message, "finished_at": _now()}
        if error:
            fields["error"] = error
        await asyncio.to_thread(self.store.update_loop, loop_id, **fields)
        spec = loop_spec_from_json((await self._loop_row(loop_id)).spec_json)
        if spec.reclaim_storage:
            await self._reclaim(loop_id)
        log.info("loop %s ended %s: %s", loop_id, status, message)
        await self._publish(loop_id, status, round_index, message)
        await self.jobs.notify()

    async def _fail(self, loop_id: str, error: str, round_index: int | None = None) -> None:
        """FAILED with `error`, unless the loop has ended meanwhile (a failure after its end, such as
        in the clean-up that follows it, does not turn a reached target into a failure)."""
        row = await asyncio.to_thread(self.store.get_loop, loop_id)
        if row is not None and row.status in LOOP_TERMINAL:
            log.error("loop %s had already ended %s when it failed: %s", loop_id, row.status, error)
            return
        if round_index is None:
            rounds = await asyncio.to_thread(self.store.rounds, loop_id)
            round_index = rounds[-1].index if rounds else 0
        await self._finish(loop_id, "FAILED", f"failed: {error}", round_index, error=error)

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
