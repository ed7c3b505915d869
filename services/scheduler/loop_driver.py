"""The loop driver: one task per unfinished loop advances it one step at a time from what the
store says (the steps are drawn in loops.py's docstring): score the base model, queue a round's
job and follow it, benchmark the round's adapter, then stop or start the next round on top of the
best one (loop_rules.py decides). `LoopManager` (loops.py) is the driver with the loop API and the
loop's store and events on top; the steps here reach those through the hooks declared below.

Every step can be run again from the store alone, so a driver that stops anywhere resumes where
the loop stood; an unreachable benchmark service (`Unavailable`) is waited out, bounded by
`peer_wait_seconds`, instead of failing the loop.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlvr import paired
from rlvr.common.errors import RlvrServiceError, Unavailable
from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.infra.store import ConflictError, Store
from rlvr.jobspec import resolve_spec
from rlvr.services.scheduler import loop_rules
from rlvr.services.scheduler.benchmarks import Benchmarks, interrupted
from rlvr.services.scheduler.convert import LOOP_TERMINAL, TERMINAL, loop_spec_from_json
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loopspec import start_words
from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

log = logging.getLogger("rlvr.scheduler.loops")


Explain = Callable[[], Awaitable[tuple[str, int]]]
"""What a loop that has just moved says of it: the message and round to store and publish."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def evaluation_seconds(evaluation: benchmark_pb2.Evaluation) -> float:
    if not evaluation.started_at.seconds or not evaluation.finished_at.seconds:
        return 0.0
    return max(0.0, evaluation.finished_at.ToDatetime().timestamp() - evaluation.started_at.ToDatetime().timestamp())


def not_completed(evaluation: benchmark_pb2.Evaluation) -> str:
    """How an evaluation that did not complete ended, as a loop's error says it."""
    if evaluation.status == benchmark_pb2.EVALUATION_STATUS_CANCELLED:
        return "was cancelled"
    return f"failed: {evaluation.error}".replace("  ", " ")


class LoopDriver(abc.ABC):
    """A loop's steps, driven from the store; what they read and write of the loop itself is the
    subclass's (LoopManager)."""

    store: Store
    jobs: JobManager
    benchmarks: Benchmarks
    artifact_root: Path
    peer_wait_seconds: float
    max_evaluation_attempts: int

    # ------------------------------------------------------------------ the loop's state (loops.py)

    @abc.abstractmethod
    async def _loop_row(self, loop_id: str) -> LoopRow: ...

    @abc.abstractmethod
    async def _update_round(self, round_: RoundRow, **fields: object) -> None: ...

    @abc.abstractmethod
    async def _transition(self, loop_id: str, to: str, round_index: int, message: str, *, error: str = "",
                          explain: Explain | None = None) -> LoopRow: ...

    @abc.abstractmethod
    async def _set_message(self, loop_id: str, message: str) -> None: ...

    @abc.abstractmethod
    async def _fail(self, loop_id: str, error: str, round_index: int | None = None) -> None: ...

    @abc.abstractmethod
    async def _publish(self, loop_id: str, status: str, round_index: int, message: str, *,
                       score: float | None = None, event: str | None = None) -> None: ...

    @abc.abstractmethod
    async def _reclaim(self, loop_id: str) -> None: ...

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
                await self._fail(loop_id, f"internal error while driving the loop: {one_line(e)}")
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
                    await self._transition(loop_id, verdict.status, last.index, verdict.message)
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
        await self._transition(loop_id, status, last.index, f"round {last.index} {last.status.lower()}",
                               error=last.error if status == "FAILED" else "")
        return True

    # ------------------------------------------------------------------ baseline

    async def _baseline(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec) -> None:
        if loop.status != "BENCHMARKING":
            await self._transition(loop.id, "BENCHMARKING", 0, f"scoring {start_words(spec)} on {spec.benchmark} "
                                                               "(baseline)")
        request = self._evaluation_request(spec, f"{loop.name} baseline (loop {loop.id})")

        async def remember(evaluation_id: str) -> None:
            await asyncio.to_thread(self.store.update_loop, loop.id, baseline_evaluation_id=evaluation_id)

        evaluation = await self._evaluate(loop, loop.baseline_evaluation_id, request, remember, "the baseline")
        if evaluation is None:
            return  # interrupted: run again on the next step
        if evaluation.status != benchmark_pb2.EVALUATION_STATUS_COMPLETED:
            error = f"the baseline evaluation {evaluation.id} {not_completed(evaluation)}"
            await self._fail(loop.id, error)
            return
        score = loop_rules.percent(getattr(evaluation.scores, spec.score_column))
        await asyncio.to_thread(self.store.update_loop, loop.id, baseline_score=score,
                                baseline_questions=evaluation.questions_total,
                                baseline_seconds=evaluation_seconds(evaluation), evaluation_attempts=0)
        log.info("loop %s: baseline %s %.1f%%", loop.id, spec.score_column, score)

    # ------------------------------------------------------------------ a round

    async def _start_round(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec, rounds: builtins.list[RoundRow]) -> None:
        index = len(rounds) + 1
        best = loop_rules.best_round(rounds)
        job_spec = common_pb2.JobSpec()
        job_spec.CopyFrom(spec.job)
        job_spec.name = loop_rules.round_job_name(loop.name, index)
        job_spec.advanced.seed = loop_rules.round_seed(spec.job.advanced.seed, index)
        on_top = f"on {start_words(spec)}"  # round 1, or while no round beat the start: job.init_adapter, or none
        if best is not None:
            best_job = await self.jobs.job_row(best.job_id or "")
            job_spec.init_adapter.CopyFrom(common_pb2.AdapterRef(  # its best step's, with LoopSpec.best_step
                name=best_job.adapter_name, version=best.adapter_step or best_job.adapter_version,
                path=best.adapter_path or best_job.adapter_path))
            on_top = f"on top of R{best.index} ({best.score:.1f}%)"
        resolved = await asyncio.to_thread(resolve_spec, job_spec)  # it may load the environment registry
        round_row = RoundRow(loop_id=loop.id, index=index, status="TRAINING",
                             base_round=best.index if best is not None else 0, started_at=utc_now())
        try:
            job = await self.jobs.create_for_round(resolved, round_row)
        except ConflictError:  # the loop ended meanwhile (stopped): nothing was created
            return
        await self._transition(loop.id, "QUEUED", index,
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
                await self._transition(loop.id, status, round_.index,
                                       f"round {round_.index}: job {job_id} waits for a trainer worker")
            elif job.status == "RUNNING" and status != "TRAINING":
                status = "TRAINING"
                await self._transition(loop.id, status, round_.index,
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
        await self._update_round(round_, status="FAILED", training_seconds=training, finished_at=utc_now(), error=error)
        await self._fail(loop.id, error, round_.index)

    async def _benchmark(self, loop: LoopRow, spec: scheduler_pb2.LoopSpec, round_: RoundRow,
                         rounds: builtins.list[RoundRow]) -> None:
        job = await self.jobs.job_row(round_.job_id or "")
        if spec.best_step and not round_.adapter_path and not round_.evaluation_id:
            round_ = await self._choose_step(spec, round_, job)
        if loop.status != "BENCHMARKING":
            at = f" at step {round_.adapter_step}" if round_.adapter_step else ""
            await self._transition(loop.id, "BENCHMARKING", round_.index,
                                   f"round {round_.index}: scoring {job.adapter_name}{at} on {spec.benchmark}")
        request = self._evaluation_request(spec, f"{loop.name} R{round_.index} (loop {loop.id})", job, round_)

        async def remember(evaluation_id: str) -> None:
            await self._update_round(round_, evaluation_id=evaluation_id)

        evaluation = await self._evaluate(loop, round_.evaluation_id, request, remember, f"round {round_.index}")
        if evaluation is None:
            return
        seconds = evaluation_seconds(evaluation)
        if evaluation.status != benchmark_pb2.EVALUATION_STATUS_COMPLETED:
            error = f"round {round_.index}'s evaluation {evaluation.id} {not_completed(evaluation)}"
            await self._update_round(round_, status="FAILED", benchmarking_seconds=seconds, finished_at=utc_now(),
                                     error=error)
            await self._fail(loop.id, error, round_.index)
            return
        assert loop.baseline_score is not None
        score = loop_rules.percent(getattr(evaluation.scores, spec.score_column))
        before = loop_rules.best_before(loop.baseline_score, rounds, round_.index)
        paired_se = None
        if not spec.HasField("min_gain"):  # one standard error of the gain, paired with the best before
            holder = loop_rules.best_before_round(rounds, round_.index, loop.baseline_score)
            paired_se = await self._paired_se(holder.evaluation_id if holder else loop.baseline_evaluation_id,
                                              evaluation.id, spec.score_column)
        threshold = loop_rules.gain_threshold(spec.min_gain if spec.HasField("min_gain") else None, before,
                                              evaluation.questions_total, paired_se)
        real = loop_rules.is_real_gain(score, before, threshold)
        await self._update_round(round_, status="SCORED", score=score, questions=evaluation.questions_total,
                                 gain_threshold=round(threshold, 6), real_gain=real, benchmarking_seconds=seconds,
                                 finished_at=utc_now())
        await asyncio.to_thread(self.store.update_loop, loop.id, evaluation_attempts=0)
        gain = f"{score - before:+.1f} points over the best before ({before:.1f}%)"
        await self._publish(loop.id, "BENCHMARKING", round_.index,
                             f"round {round_.index} scored {score:.1f}%: {gain}, "
                             f"{'a real gain' if real else f'no real gain (threshold {threshold:.2f})'}",
                             score=score, event="SCORED")
        if spec.reclaim_storage:
            await self._reclaim(loop.id)

    async def _choose_step(self, spec: scheduler_pb2.LoopSpec, round_: RoundRow, job: JobRow) -> RoundRow:
        """LoopSpec.best_step: the round's adapter is its job's best evaluated step's checkpoint
        (loop_rules.best_step), stored on the round before it is benchmarked; its final adapter when
        that is the best, or when the chosen checkpoint's folder is not there."""
        points = await asyncio.to_thread(self.store.metric_points, job.id)
        last = max((p.step for p in points), default=job.current_step)
        step = loop_rules.best_step([(p.step, p.heldout_accuracy) for p in points], last,
                                    spec.job.advanced.checkpoint_every)
        folder = Path(job.adapter_path).parent / "checkpoints" / f"step-{step}" if job.adapter_path else None
        if step == last or folder is None or not await asyncio.to_thread((folder / "adapter_config.json").is_file):
            if step != last:
                log.warning("loop %s round %d: step %d's checkpoint %s is not there; the final adapter instead",
                            round_.loop_id, round_.index, step, folder)
            return round_
        await self._update_round(round_, adapter_step=step, adapter_path=str(folder))
        round_.adapter_step, round_.adapter_path = step, str(folder)
        return round_

    async def _paired_se(self, before_id: str, after_id: str, column: str) -> float | None:
        """The standard error of the gain in points, question by question (rlvr/paired.py), or None
        when the two evaluations' results cannot be read or paired (then the unpaired rule holds)."""
        if not before_id:
            return None
        try:
            before, after = await self.benchmarks.results(before_id), await self.benchmarks.results(after_id)
        except RlvrServiceError as e:
            log.warning("loop: cannot pair evaluations %s and %s (%s); one unpaired standard error instead",
                        before_id, after_id, e)
            return None
        comparison = paired.compare_columns(column, before, after)
        return None if comparison is None else comparison.se_points

    # ------------------------------------------------------------------ evaluations

    @staticmethod
    def _evaluation_request(spec: scheduler_pb2.LoopSpec, label: str, job: JobRow | None = None,
                            round_: RoundRow | None = None) -> benchmark_pb2.RunEvaluationRequest:
        request = benchmark_pb2.RunEvaluationRequest(
            model=spec.job.base_model, benchmark=spec.benchmark, limit=spec.benchmark_limit, label=label[:200],
            dataset=spec.benchmark_dataset, dataset_split=spec.benchmark_dataset_split)
        if spec.job.environment.key:  # the rounds train episodes: the benchmark runs them in the same environment
            request.environment.CopyFrom(spec.job.environment)
            request.environment.ClearField("version")
        if job is not None:
            # The round's published adapter (stacked on the best round's), uploaded as the next
            # version of its name: the rollout service holds it whichever backend trained it.
            request.adapter.name = job.adapter_name
            request.adapter_path = round_.adapter_path if round_ is not None and round_.adapter_path else \
                job.adapter_path  # LoopSpec.best_step: the chosen step's checkpoint
        elif spec.job.init_adapter.name:  # the baseline of a loop that starts from an adapter: that adapter
            request.adapter.name = spec.job.init_adapter.name
            request.adapter_path = spec.job.init_adapter.path
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
