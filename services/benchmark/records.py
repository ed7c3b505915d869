"""Stored evaluations as contract messages, and the queries the Store has no method for.

The `evaluations` table (rlvr/infra/schema.py) keeps the score columns, counts and times. What it
has no column for (the sampling settings, the leaderboard label, the generate/score seconds) is
(and the question set, a boxed benchmark's dataset, the environment and its episodes' counters) is
kept in `sampling_json` as a partial `Evaluation` message in MessageToJson form, the store's
convention for JSON columns, and merged back on read. `answered` is stored as a count of finished
completions; its share is that count over the questions done.

The leaderboard, the per-benchmark listing and the only-wrong paging are queries over the store's
engine here rather than Store methods, because Store (shared, not this service's file) has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import Float, cast, func
from sqlmodel import Session, col, select

from rlvr.infra.schema import EvaluationRow, QuestionResultRow
from rlvr.infra.store import Store
from rlvr.services.benchmark.catalog import Tally, check_score_column
from rlvr.v1 import benchmark_pb2, common_pb2

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
STATUS_RANK = {"QUEUED": 1, "RUNNING": 2, "COMPLETED": 3, "FAILED": 3, "CANCELLED": 3}


def status_value(name: str) -> benchmark_pb2.EvaluationStatus:
    return benchmark_pb2.EvaluationStatus.Value(f"EVALUATION_STATUS_{name}")


def status_name(value: int) -> str:
    return benchmark_pb2.EvaluationStatus.Name(value).removeprefix("EVALUATION_STATUS_")


def timestamp(when: datetime | None) -> Timestamp | None:
    if when is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(when)
    return ts


def extras_json(sampling: common_pb2.SamplingParams, label: str, generate_seconds: float = 0.0,
                score_seconds: float = 0.0, *, question_set: str = "", dataset: str = "",
                dataset_split: str = "", environment: common_pb2.EnvironmentConfig | None = None,
                episodes: benchmark_pb2.EpisodeCounters | None = None) -> str:
    extras = benchmark_pb2.Evaluation(sampling=sampling, label=label, generate_seconds=generate_seconds,
                                      score_seconds=score_seconds, question_set=question_set, dataset=dataset,
                                      dataset_split=dataset_split, environment=environment, episodes=episodes)
    return json_format.MessageToJson(extras, indent=None)


def tally_fields(t: Tally, score_column: str) -> dict[str, float | int]:
    """The row's score columns for a tally (running or final)."""
    return {
        "score": t.share(score_column),
        "accuracy": t.share("accuracy"),
        "accuracy_strict": t.share("accuracy_strict"),
        "format": t.share("format"),
        "answered": t.answered,
        "n_done": t.n,
    }


def scores_of(row: EvaluationRow) -> benchmark_pb2.ScoreBreakdown:
    return benchmark_pb2.ScoreBreakdown(
        score=row.score or 0.0,
        accuracy=row.accuracy or 0.0,
        accuracy_strict=row.accuracy_strict or 0.0,
        format=row.format or 0.0,
        answered=row.answered / row.n_done if row.n_done else 0.0,
        score_column=row.score_column,
    )


def evaluation_of(row: EvaluationRow) -> benchmark_pb2.Evaluation:
    evaluation = benchmark_pb2.Evaluation()
    try:
        json_format.Parse(row.sampling_json or "{}", evaluation, ignore_unknown_fields=True)
    except json_format.ParseError:
        evaluation = benchmark_pb2.Evaluation()  # a row written by something else: its columns still tell
    evaluation.MergeFrom(benchmark_pb2.Evaluation(
        id=row.id, model=row.model, adapter_name=row.adapter_name, adapter_version=row.adapter_version,
        benchmark=row.benchmark, status=status_value(row.status), scores=scores_of(row),
        questions_total=row.n_questions, questions_done=row.n_done, created_at=timestamp(row.created_at),
        started_at=timestamp(row.started_at), finished_at=timestamp(row.finished_at), error=row.error,
        seed=row.seed or 0,
    ))
    return evaluation


def event_of(row: EvaluationRow, message: str = "") -> benchmark_pb2.EvaluationEvent:
    return benchmark_pb2.EvaluationEvent(
        evaluation_id=row.id, status=status_value(row.status), questions_done=row.n_done,
        questions_total=row.n_questions, scores=scores_of(row), message=message or row.error,
    )


def result_of(row: QuestionResultRow) -> benchmark_pb2.QuestionResult:
    reason = {"STOP": common_pb2.FINISH_REASON_STOP, "LENGTH": common_pb2.FINISH_REASON_LENGTH}
    return benchmark_pb2.QuestionResult(
        index=row.index, prompt=row.prompt, ground_truth=row.ground_truth, completion=row.completion,
        extracted_answer=row.extracted_answer, reward=row.reward, accuracy=row.accuracy, format=row.format,
        strict=row.strict, finish_reason=reason.get(row.finish_reason, common_pb2.FINISH_REASON_UNSPECIFIED),
        episode=row.episode,
    )


# ---------------------------------------------------------------------- queries


def list_evaluations(store: Store, benchmark: str, limit: int, offset: int = 0) -> tuple[list[EvaluationRow], int]:
    """A page, newest first, optionally of one benchmark; and how many there are in all."""
    where = [EvaluationRow.benchmark == benchmark] if benchmark else []
    stmt = (select(EvaluationRow).where(*where)
            .order_by(col(EvaluationRow.created_at).desc(), EvaluationRow.id).offset(offset).limit(limit))
    with Session(store.engine) as session:
        rows = list(session.exec(stmt).all())
        total = int(session.exec(select(func.count()).select_from(EvaluationRow).where(*where)).one())
    return rows, total


def _column(name: str) -> Any:  # a SQL expression (see rlvr/infra/store.py on Any)
    if name == "answered":
        # Stored as a count: rank by the share, so a short evaluation is not ranked by its size.
        return cast(EvaluationRow.answered, Float) / func.nullif(EvaluationRow.n_done, 0)
    return getattr(EvaluationRow, name)


def leaderboard(store: Store, benchmark: str, score_column: str) -> list[EvaluationRow]:
    """Completed evaluations of `benchmark`, best first by `score_column`; ties go to the one that
    finished first (it got there first), then by id so the order is total. All of them: the
    leaderboard groups them by question set (services/benchmark/leaderboard.py)."""
    column = _column(check_score_column(score_column))
    stmt = (
        select(EvaluationRow)
        .where(EvaluationRow.benchmark == benchmark, EvaluationRow.status == "COMPLETED")
        .order_by(column.desc().nulls_last(), col(EvaluationRow.finished_at).asc(), EvaluationRow.id)
    )
    with Session(store.engine) as session:
        return list(session.exec(stmt).all())


def question_results(
    store: Store, evaluation_id: str, only_wrong: bool, offset: int, limit: int
) -> tuple[Sequence[QuestionResultRow], int]:
    """A page of results in question order, and how many match in all. Wrong = not fully correct."""
    where = [QuestionResultRow.evaluation_id == evaluation_id]
    if only_wrong:
        where.append(QuestionResultRow.accuracy < 1.0)
    stmt = select(QuestionResultRow).where(*where).order_by(col(QuestionResultRow.index)).offset(offset)
    if limit:
        stmt = stmt.limit(limit)
    with Session(store.engine) as session:
        rows = list(session.exec(stmt).all())
        total = int(session.exec(select(func.count()).select_from(QuestionResultRow).where(*where)).one())
    return rows, total
