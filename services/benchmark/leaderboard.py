"""GetLeaderboard: completed evaluations ranked only against evaluations over the same questions.

A 50-question evaluation at 22.0% is not better than a 32-question one at 21.9%: each score sits
within a standard error of its model's accuracy on the whole task, and those are 5.9 and 7.3 points
here. So entries are grouped by question set (`Evaluation.question_set`, a fingerprint of the
questions asked), the sets with the most questions first, and ranked best first within each;
every entry carries its n and the standard error of its score column (rlvr.scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rlvr.infra.schema import EvaluationRow
from rlvr.scores import standard_error
from rlvr.services.benchmark import records
from rlvr.services.benchmark.catalog import Benchmark
from rlvr.v1 import benchmark_pb2


def question_set_of(evaluation: benchmark_pb2.Evaluation) -> str:
    """The set an evaluation ranks in: its recorded question set, else "n<N>" (stored before the
    question set was recorded: grouped by its question count alone)."""
    return evaluation.question_set or f"n{evaluation.questions_done}"


def describe(evaluation: benchmark_pb2.Evaluation, benchmark: Benchmark | None, size: int) -> str:
    """Which questions, in words: "all 500 questions", "the first 50 of 500 questions", ..."""
    n = evaluation.questions_done
    if not evaluation.question_set:
        return f"{n} questions (which ones was not recorded)"
    if evaluation.dataset:
        return f"{evaluation.dataset} ({evaluation.dataset_split or 'test'}), {n} questions"
    if size and n == size:
        return f"all {n} questions"
    if size:
        return f"the first {n} of {size} questions"
    return f"{n} questions" + (f" of {benchmark.display_name}" if benchmark is not None else "")


def leaderboard(rows: Sequence[EvaluationRow], benchmark: str, info: Benchmark | None, size: int,
                score_column: str, limit: int, question_set: str = "") -> benchmark_pb2.GetLeaderboardResponse:
    """The response for `rows` (completed evaluations, best first by `score_column`): grouped by
    question set, at most `limit` entries per set, ranks counted within each set; only
    `question_set` when given."""
    groups: dict[str, list[benchmark_pb2.Evaluation]] = {}
    for row in rows:
        evaluation = records.evaluation_of(row)
        key = question_set_of(evaluation)
        if not question_set or key == question_set:
            groups.setdefault(key, []).append(evaluation)

    def newest(evaluations: list[benchmark_pb2.Evaluation]) -> datetime:
        return max(e.finished_at.ToDatetime() for e in evaluations)

    order = sorted(groups, key=lambda k: (-groups[k][0].questions_done, -newest(groups[k]).timestamp(), k))
    out = benchmark_pb2.GetLeaderboardResponse(benchmark=benchmark, score_column=score_column)
    for key in order:
        shown = groups[key][:limit]
        out.question_sets.add(id=key, questions=shown[0].questions_done, entries=len(shown),
                              description=describe(shown[0], info, size))
        for rank, evaluation in enumerate(shown, start=1):
            n = evaluation.questions_done
            out.entries.add(
                rank=rank, evaluation_id=evaluation.id, model=evaluation.model, adapter_name=evaluation.adapter_name,
                adapter_version=evaluation.adapter_version, scores=evaluation.scores, label=evaluation.label,
                finished_at=evaluation.finished_at, question_set=key, questions=n,
                standard_error=standard_error(getattr(evaluation.scores, score_column), n))
    return out
