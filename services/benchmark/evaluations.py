"""The evaluation manager: checks and stores a run, runs it in the background, answers queries.

Lifecycle of an evaluation: RunEvaluation checks everything (services/benchmark/planning.py) and
stores it QUEUED; a background task waits for one of `max_concurrent` slots, marks it RUNNING,
runs the batches (services/benchmark/runner.py) and ends COMPLETED with its score breakdown, or
FAILED with the cause in one line, or CANCELLED by CancelEvaluation. Every change is written to
the store first and then published, so the store is the truth and events are the live view of it.

The task is the one writer of an evaluation's status: a cancel only sets the evaluation's event and
waits for its task to store CANCELLED, so a cancel and the task's own end can never both land.

An evaluation never hangs: every peer call has a deadline, and one left QUEUED or RUNNING by a
service that stopped is marked FAILED when the service stops or starts again (this assumes one
benchmark service per store, as `rlvr up` runs it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, check_page, out_of_range
from rlvr.infra.schema import EvaluationRow
from rlvr.infra.store import Store
from rlvr.rewards.registry import Catalog
from rlvr.services.benchmark import records
from rlvr.services.benchmark.catalog import SCORE_COLUMNS, Benchmark, benchmarks_of, get_benchmark
from rlvr.services.benchmark.episodes import EpisodeTotals, load_tokenizer, run_episode_questions
from rlvr.services.benchmark.events import Events, msg_id
from rlvr.services.benchmark.leaderboard import leaderboard as rank_by_question_set
from rlvr.services.benchmark.planning import Peers, Plan, prepare
from rlvr.services.benchmark.runner import Cancelled, Progress, RunResult, run_questions, unless_cancelled
from rlvr.v1 import benchmark_pb2

log = logging.getLogger("rlvr.benchmark")

INTERRUPTED = "interrupted: the benchmark service stopped before the evaluation finished; run it again"
CANCEL_WAIT_SECONDS = 10.0  # how long CancelEvaluation waits for the task to store CANCELLED


@dataclass
class _Run:
    """An evaluation's task as a cancel sees it: set `cancel` to stop it, `ended` once its end is stored."""

    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


def _extras(plan: Plan, generate_seconds: float = 0.0, score_seconds: float = 0.0,
            totals: EpisodeTotals | None = None) -> str:
    """What the row keeps of the plan beyond its columns (records.extras_json): with an environment,
    the environment as it ran (its version) and the episodes' counters."""
    episodes = None
    if plan.environment is not None:
        t = totals or EpisodeTotals()
        episodes = benchmark_pb2.EpisodeCounters(
            episodes=t.episodes, turns_mean=t.turns_mean, tool_calls=t.tool_calls, tool_errors=t.tool_errors,
            failed_episodes=t.failed, truncated_episodes=t.truncated)
    return records.extras_json(plan.sampling_proto, plan.label, generate_seconds, score_seconds,
                               question_set=plan.question_set, dataset=plan.dataset,
                               dataset_split=plan.dataset_split, environment=plan.environment_proto,
                               episodes=episodes)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if text else type(e).__name__


class EvaluationManager:
    def __init__(
        self,
        store: Store,
        peers: Peers,
        events: Events | None = None,
        *,
        batch_size: int = 128,
        max_concurrent: int = 2,
        prompt_style: str = "auto",
        adapter_roots: Sequence[Path] = (),
        poll_seconds: float = 1.0,
        tokenizer_loader: Callable[[str], Any] = load_tokenizer,
    ) -> None:
        self.store = store
        self.peers = peers
        self.events = events
        self.batch_size = batch_size
        self.prompt_style = prompt_style
        self.adapter_roots = tuple(adapter_roots)
        self.poll_seconds = poll_seconds
        self.tokenizer_loader = tokenizer_loader  # an environment evaluation's: the rollout model's tokenizer
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: dict[str, _Run] = {}  # by id: every evaluation stored QUEUED until its end is stored

    async def start(self) -> None:
        """Fails what a previous process left unfinished: nothing will ever finish it."""
        stale = await asyncio.to_thread(self.store.list_evaluations, ["QUEUED", "RUNNING"], 100_000)
        for row in stale:
            await self._finish(row.id, "FAILED", error=INTERRUPTED)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_idle(self) -> None:
        """Until every evaluation started so far has ended (tests, benchmarks)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ RPCs

    @staticmethod
    def benchmarks(catalog: Catalog | None = None) -> list[benchmark_pb2.BenchmarkInfo]:
        """Every reward's benchmark (`catalog`: the reward service's; default this process's)."""
        return [
            benchmark_pb2.BenchmarkInfo(
                name=b.name, display_name=b.display_name, description=b.description, size=b.size,
                score_columns=list(SCORE_COLUMNS), default_score_column=b.default_score_column,
                needs_dataset=b.needs_dataset, reward_key=b.reward_function,
            )
            for b in benchmarks_of(catalog).values()
        ]

    async def list_benchmarks(self) -> list[benchmark_pb2.BenchmarkInfo]:
        return self.benchmarks(await self.peers.rewards())

    async def _benchmark(self, name: str) -> Benchmark:
        return get_benchmark(name, benchmarks_of(await self.peers.rewards([name])))

    async def run(self, request: benchmark_pb2.RunEvaluationRequest) -> benchmark_pb2.Evaluation:
        plan = await prepare(request, self.peers, self.prompt_style, self.adapter_roots)
        row = EvaluationRow(
            model=plan.model, adapter_name=plan.adapter.name, adapter_version=plan.adapter.version,
            benchmark=plan.benchmark.name, limit=plan.limit or None, seed=plan.sampling.seed,
            sampling_json=_extras(plan), status="QUEUED",
            n_questions=len(plan.questions), score_column=plan.benchmark.default_score_column,
        )
        # Shielded: gRPC cancels this handler when its caller goes away (a scheduler killed mid-call),
        # and the insert's thread runs on regardless. Without the shield a stored row could be left
        # QUEUED with no task to run it, and a caller that finds it again by its label would wait on
        # it forever. With it, a stored evaluation always runs to its end.
        row = await asyncio.shield(self._enqueue(row, plan))
        return records.evaluation_of(row)

    async def _enqueue(self, row: EvaluationRow, plan: Plan) -> EvaluationRow:
        """Stores the evaluation QUEUED and starts its task; both or neither."""
        # Cancellable before it is stored (its id is set on creation): no caller ever sees it without.
        run = self._runs[row.id] = _Run()
        try:
            row = await asyncio.to_thread(self.store.add_evaluation, row)
        except BaseException:
            del self._runs[row.id]
            raise
        try:
            await self._publish(row, "queued")
        finally:
            task = asyncio.create_task(self._execute(row.id, plan, run), name=f"evaluation-{row.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        log.info("evaluation %s queued: %s on %s, %d questions%s", row.id, plan.adapter, plan.benchmark.name,
                 len(plan.questions), f" in the environment {plan.environment.key} v{plan.environment.version}"
                 if plan.environment else "")
        return row

    async def get(self, evaluation_id: str) -> benchmark_pb2.Evaluation:
        return records.evaluation_of(await self._row(evaluation_id))

    async def list(self, benchmark: str, limit: int, offset: int = 0) -> benchmark_pb2.ListEvaluationsResponse:
        if benchmark:
            await self._benchmark(benchmark)
        check_page(limit, offset)
        rows, total = await asyncio.to_thread(records.list_evaluations, self.store, benchmark, limit or 100, offset)
        return benchmark_pb2.ListEvaluationsResponse(evaluations=[records.evaluation_of(r) for r in rows], total=total)

    async def cancel(self, evaluation_id: str) -> benchmark_pb2.Evaluation:
        """Stops a queued or running evaluation: CANCELLED once its task has stored it (a queued one
        never starts; a running one keeps the results stored so far). Answers an evaluation
        already CANCELLED as it is; one that COMPLETED or FAILED is refused."""
        if not evaluation_id:
            raise InvalidArgument("id: required (the id RunEvaluation returned)")
        run = self._runs.get(evaluation_id)
        if run is None:  # its task has stored its end (or this service never ran it)
            row = await self._row(evaluation_id)
            if row.status == "CANCELLED":
                return records.evaluation_of(row)
            if row.status in records.TERMINAL:
                raise FailedPrecondition(f"evaluation {evaluation_id} has already ended ({row.status}); only a "
                                         "QUEUED or RUNNING evaluation can be cancelled")
            # QUEUED or RUNNING with no task here: left by another process on this store, which
            # nothing will ever run on (start() fails such rows): it ends here.
            await self._finish(evaluation_id, "CANCELLED")
            return await self.get(evaluation_id)
        run.cancel.set()
        try:  # shielded: a caller that goes away does not cut the cancel short (it is set anyway)
            await asyncio.wait_for(asyncio.shield(run.ended.wait()), CANCEL_WAIT_SECONDS)
        except TimeoutError:
            log.warning("evaluation %s: its end was not stored within %.0f s of the cancel", evaluation_id,
                        CANCEL_WAIT_SECONDS)
        return await self.get(evaluation_id)

    async def delete(self, evaluation_id: str) -> benchmark_pb2.DeleteEvaluationResponse:
        """Removes a finished evaluation and its per-question results; one still queued or running
        is refused (cancel it first, or let it end)."""
        if not evaluation_id:
            raise InvalidArgument("id: required (the id RunEvaluation returned)")
        row = await self._row(evaluation_id)
        if row.status not in records.TERMINAL:
            raise FailedPrecondition(f"evaluation {evaluation_id} is {row.status}; cancel it first "
                                     f"(rlvr eval cancel {evaluation_id}), then delete it")
        results = await asyncio.to_thread(self.store.delete_evaluation, evaluation_id)
        if results is None:  # deleted meanwhile by another call
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        log.info("evaluation %s deleted with %d question results", evaluation_id, results)
        return benchmark_pb2.DeleteEvaluationResponse(id=evaluation_id, results_deleted=results)

    async def results(
        self, evaluation_id: str, only_wrong: bool, offset: int, limit: int
    ) -> benchmark_pb2.GetEvaluationResultsResponse:
        if offset < 0:
            raise out_of_range("offset", offset, ">= 0")
        if limit < 0:
            raise out_of_range("limit", limit, ">= 0 (0 = all)")
        await self._row(evaluation_id)
        rows, total = await asyncio.to_thread(
            records.question_results, self.store, evaluation_id, only_wrong, offset, limit
        )
        return benchmark_pb2.GetEvaluationResultsResponse(results=[records.result_of(r) for r in rows], total=total)

    async def leaderboard(self, benchmark: str, score_column: str, limit: int,
                          question_set: str = "") -> benchmark_pb2.GetLeaderboardResponse:
        info = await self._benchmark(benchmark)
        column = score_column or info.default_score_column
        if limit < 0:
            raise ValueError(f"limit: {limit} is out of range; allowed: >= 0 (0 = 50 per question set)")
        if len(question_set) > 64:
            raise ValueError(f"question_set: {len(question_set)} characters; allowed: at most 64 (a QuestionSet.id)")
        rows = await asyncio.to_thread(records.leaderboard, self.store, benchmark, column)
        return rank_by_question_set(rows, benchmark, info, info.size, column, limit or 50, question_set)

    async def watch(self, evaluation_id: str) -> AsyncIterator[benchmark_pb2.EvaluationEvent]:
        """The current state, then each change until a final status.

        Events come from the bus; the store is read every `poll_seconds` as well, so a lost event or
        an unreachable NATS delays a watcher by at most that, and never leaves it waiting forever.
        History replayed by the bus that is older than what was already sent is skipped.
        """
        row = await self._row(evaluation_id)
        yield records.event_of(row)
        if row.status in records.TERMINAL:
            return
        last = (records.STATUS_RANK[row.status], row.n_done)
        queue: asyncio.Queue[benchmark_pb2.EvaluationEvent] = asyncio.Queue()

        async def pump() -> None:
            assert self.events is not None
            async for event in self.events.follow(evaluation_id):
                await queue.put(event)

        feed = asyncio.create_task(pump()) if self.events is not None else None
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), self.poll_seconds)
                except TimeoutError:
                    row = await self._row(evaluation_id)
                    event = records.event_of(row)
                status = records.status_name(event.status)
                final = status in records.TERMINAL
                current = (records.STATUS_RANK[status], event.questions_done)
                if not final and current <= last:
                    continue
                last = current
                yield event
                if final:
                    return
        finally:
            if feed is not None:
                feed.cancel()
                await asyncio.gather(feed, return_exceptions=True)

    # ------------------------------------------------------------------ the run

    async def _execute(self, evaluation_id: str, plan: Plan, run: _Run) -> None:
        try:
            await unless_cancelled(self._slots.acquire(), run.cancel)  # a queued one cancelled never starts
            try:
                if run.cancel.is_set():  # the slot came at the very moment of the cancel
                    raise Cancelled
                await self._update(evaluation_id, "RUNNING", started_at=datetime.now(UTC))
                totals = EpisodeTotals() if plan.environment is not None else None
                result = await self._run_plan(evaluation_id, plan, run, totals)
            finally:
                self._slots.release()
        except Cancelled:
            log.info("evaluation %s cancelled", evaluation_id)
            await self._finish(evaluation_id, "CANCELLED")
        except asyncio.CancelledError:  # the service stops (a cancel asked for just before still counts)
            if run.cancel.is_set():
                await self._finish(evaluation_id, "CANCELLED")
            else:
                await self._finish(evaluation_id, "FAILED", error=INTERRUPTED)
            raise
        except Exception as e:  # noqa: BLE001 (any cause fails the evaluation, with that cause)
            log.warning("evaluation %s failed: %s", evaluation_id, one_line(e))
            await self._finish(evaluation_id, "FAILED", error=one_line(e))
        else:
            await self._finish(evaluation_id, "COMPLETED", plan=plan, result=result, totals=totals)
        finally:
            self._runs.pop(evaluation_id, None)
            run.ended.set()

    async def _run_plan(self, evaluation_id: str, plan: Plan, run: _Run, totals: EpisodeTotals | None) -> RunResult:
        def progress(p: Progress) -> Awaitable[None]:
            return self._progress(evaluation_id, plan, p, totals)

        if plan.environment is None:
            return await run_questions(
                evaluation_id, plan.questions, plan.benchmark.reward_function, plan.sampling, plan.adapter,
                self.peers.generator, self.peers.scorer, self.store, self.batch_size,
                on_progress=progress, cancelled=run.cancel,
            )
        # Once per evaluation (cached per path): a model this host cannot read fails it, naming the path.
        tokenizer = await unless_cancelled(asyncio.to_thread(self.tokenizer_loader, plan.model), run.cancel)
        return await run_episode_questions(
            evaluation_id, plan.questions, plan.benchmark.reward_function, plan.sampling, plan.adapter,
            plan.environment, tokenizer, self.peers.token_generator, self.peers.scorer, self.store,
            self.batch_size, on_progress=progress, cancelled=run.cancel, totals=totals,
        )

    async def _progress(self, evaluation_id: str, plan: Plan, progress: Progress,
                        totals: EpisodeTotals | None = None) -> None:
        fields: dict[str, object] = {
            **records.tally_fields(progress.tally, plan.benchmark.default_score_column),
            "sampling_json": _extras(plan, progress.generate_seconds, progress.score_seconds, totals),
        }
        row = await asyncio.to_thread(self.store.update_evaluation, evaluation_id, **fields)
        await self._publish(row, f"{progress.done}/{progress.total} questions")

    async def _update(self, evaluation_id: str, status: str, **fields: object) -> EvaluationRow:
        row = await asyncio.to_thread(self.store.update_evaluation, evaluation_id, status=status, **fields)
        await self._publish(row, status.lower())
        return row

    async def _finish(self, evaluation_id: str, status: str, *, error: str = "", plan: Plan | None = None,
                      result: RunResult | None = None, totals: EpisodeTotals | None = None) -> None:
        fields: dict[str, object] = {"finished_at": datetime.now(UTC), "error": error}
        if plan is not None and result is not None:
            fields.update(records.tally_fields(result.tally, plan.benchmark.default_score_column))
            fields["sampling_json"] = _extras(plan, result.generate_seconds, result.score_seconds, totals)
        try:
            row = await asyncio.to_thread(self.store.update_evaluation, evaluation_id, status=status, **fields)
        except Exception as e:  # noqa: BLE001 (the database itself failed: the log is all that is left)
            log.error("evaluation %s: could not store its end (%s): %s", evaluation_id, status, e)
            return
        if status == "COMPLETED":
            message = f"completed: {row.score_column} {row.score or 0.0:.1%}"
        elif status == "CANCELLED":
            message = f"cancelled by request after {row.n_done} of {row.n_questions} questions"
        else:
            message = f"{status.lower()}: {error}"
        await self._publish(row, message)

    async def _publish(self, row: EvaluationRow, message: str) -> None:
        if self.events is None:
            return
        event = records.event_of(row, message)
        await self.events.publish(event, msg_id(event))

    async def _row(self, evaluation_id: str) -> EvaluationRow:
        row = await asyncio.to_thread(self.store.get_evaluation, evaluation_id)
        if row is None:
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        return row
