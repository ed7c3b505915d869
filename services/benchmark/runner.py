"""Running one evaluation: questions in batches through a generator and a scorer, every answer
stored, running scores after each batch.

This is the core of the benchmark service and knows nothing about gRPC or NATS: the generator, the
scorer and the progress callback are small interfaces (services/benchmark/peers.py implements them
over the rollout and reward services; tests use in-process twins). Why batches: each one is a
single Generate call (the engine batches it), a single Score call, one insert of its rows and one
progress event, so a 500-question run costs a handful of round trips and a watcher sees it move.

Cancel: the manager sets an event; the run stops at the next generate or score call it is waiting
on (that call abandoned: its task cancelled, which cancels the gRPC call) and raises `Cancelled`.
A batch's insert and its progress are never cut in two, so the rows stored always match the
questions_done stored with them.

Repeatability: a batch is always the same questions in the same order (question i of a benchmark
never depends on `limit`), and each batch gets a seed derived from the evaluation's seed and its
first question, so the same evaluation twice sends the rollout service identical requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from rlvr.infra.schema import QuestionResultRow
from rlvr.infra.store import Store
from rlvr.peers.types import AdapterTag, Sampling, Score, ScoreInput
from rlvr.services.benchmark.catalog import RewardName, Tally

FinishReason = Literal["STOP", "LENGTH"]
T = TypeVar("T")


@dataclass(frozen=True)
class Question:
    """One question as the model gets it: chat turns, plus the text shown in the results table."""

    index: int
    messages: tuple[tuple[str, str], ...]  # (role, content)
    ground_truth: str
    # What the reward reads besides the completion: the question as the task states it, the
    # conversation when its prompt is one, and the dataset row's other columns.
    question: str = ""
    turns: tuple[tuple[str, str], ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)

    def score_input(self, completion: str) -> ScoreInput:
        return ScoreInput(completion, self.ground_truth, self.question, self.turns, self.columns)

    @property
    def prompt_text(self) -> str:
        if len(self.messages) == 1:
            return self.messages[0][1]
        return "\n".join(f"{role}: {content}" for role, content in self.messages)


@dataclass(frozen=True)
class Answer:
    index: int
    text: str
    finish_reason: FinishReason
    adapter: AdapterTag  # as stamped by the engine


class Generator(Protocol):
    async def generate(
        self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag
    ) -> list[Answer]:
        """One greedy (or seeded) completion per question, in any order."""
        ...


class Scorer(Protocol):
    async def score(self, function: RewardName, items: Sequence[ScoreInput]) -> list[Score]:
        """Completions (with their ground truth, question and columns) -> their scores, in order."""
        ...


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    tally: Tally
    generate_seconds: float
    score_seconds: float


@dataclass
class RunResult:
    tally: Tally = field(default_factory=Tally)
    generate_seconds: float = 0.0
    score_seconds: float = 0.0


class EvaluationError(RuntimeError):
    """The evaluation cannot go on; the message is the one-line cause stored with it."""


class Cancelled(Exception):  # noqa: N818 (a state, like asyncio's CancelledError, not a fault)
    """The evaluation was cancelled by request; what was stored before stays."""


async def unless_cancelled(work: Awaitable[T], cancelled: asyncio.Event | None) -> T:
    """`work`'s result, or `Cancelled` as soon as `cancelled` is set, `work` then abandoned (its task
    cancelled and awaited: a gRPC call in flight is cancelled with it)."""
    task = asyncio.ensure_future(work)
    if cancelled is None:
        return await task
    stop = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this coroutine is itself cancelled (the service stopping)
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise Cancelled
    return task.result()


def batch_seed(seed: int, first_index: int) -> int:
    # Distinct per batch (so batches do not replay one random stream), stable across runs, and
    # inside the 63 bits every engine accepts.
    return (seed * 1_000_003 + first_index) % (1 << 63)


def check_answers(batch: Sequence[Question], answers: Sequence[Answer], expected: AdapterTag) -> list[Answer]:
    """The answers in question order; refuses a missing answer or one from another policy (a score
    of the wrong adapter would be silently wrong)."""
    by_index = {a.index: a for a in answers}
    missing = [q.index for q in batch if q.index not in by_index]
    if missing:
        raise EvaluationError(
            f"the rollout service returned {len(by_index)} of {len(batch)} answers (first missing: question {missing[0]})"
        )
    ordered = [by_index[q.index] for q in batch]
    for answer in ordered:
        if answer.adapter != expected:
            raise EvaluationError(
                f"question {answer.index} was answered by {answer.adapter}, expected {expected}; "
                "refusing to score another policy"
            )
    return ordered


async def run_questions(
    evaluation_id: str,
    questions: Sequence[Question],
    function: RewardName,
    sampling: Sampling,
    adapter: AdapterTag,
    generator: Generator,
    scorer: Scorer,
    store: Store,
    batch_size: int,
    on_progress: Callable[[Progress], Awaitable[None]] | None = None,
    cancelled: asyncio.Event | None = None,
) -> RunResult:
    """Generates, scores and stores every question; returns the totals. Raises on the first failure,
    and `Cancelled` once `cancelled` is set (at the next generate or score call).

    The next batch is generated while this one is scored and stored, so the rollout engine (the
    slow part) is never idle waiting for the reward service or the database.
    """
    batches = [questions[i : i + batch_size] for i in range(0, len(questions), batch_size)]
    result = RunResult()

    async def generate(batch: Sequence[Question]) -> tuple[list[Answer], float]:
        t0 = time.perf_counter()
        seeded = replace(sampling, seed=batch_seed(sampling.seed or 0, batch[0].index))
        answers = await generator.generate(batch, seeded, adapter)
        return answers, time.perf_counter() - t0

    pending: asyncio.Task[tuple[list[Answer], float]] | None = None
    try:
        if batches:
            pending = asyncio.create_task(generate(batches[0]))
        for k, batch in enumerate(batches):
            assert pending is not None
            if cancelled is not None and cancelled.is_set():
                raise Cancelled
            answers, seconds = await unless_cancelled(pending, cancelled)
            pending = asyncio.create_task(generate(batches[k + 1])) if k + 1 < len(batches) else None
            result.generate_seconds += seconds
            ordered = check_answers(batch, answers, adapter)
            t0 = time.perf_counter()
            items = [q.score_input(a.text) for a, q in zip(ordered, batch, strict=True)]
            scores = await unless_cancelled(scorer.score(function, items), cancelled)
            result.score_seconds += time.perf_counter() - t0
            if len(scores) != len(batch):
                raise EvaluationError(f"the reward service scored {len(scores)} of {len(batch)} answers")
            rows = [question_row(evaluation_id, q, a, s) for q, a, s in zip(batch, ordered, scores, strict=True)]
            await asyncio.to_thread(store.add_question_results, rows)
            for a, s in zip(ordered, scores, strict=True):
                result.tally = result.tally.add(s.accuracy, s.strict, s.format, a.finish_reason == "STOP")
            if on_progress is not None:
                await on_progress(Progress(result.tally.n, len(questions), result.tally,
                                           result.generate_seconds, result.score_seconds))
    finally:
        if pending is not None:  # a failed batch: do not leave the next one generating for nobody
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
    return result


def question_row(evaluation_id: str, question: Question, answer: Answer, score: Score) -> QuestionResultRow:
    return QuestionResultRow(
        evaluation_id=evaluation_id,
        index=question.index,
        prompt=question.prompt_text,
        ground_truth=question.ground_truth,
        completion=answer.text,
        extracted_answer=score.extracted_answer,
        reward=score.reward,
        accuracy=score.accuracy,
        format=score.format,
        strict=score.strict,  # the same strictness as the accuracy_strict tile
        finish_reason=answer.finish_reason,
    )
