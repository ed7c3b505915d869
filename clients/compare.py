"""Two evaluations of the same questions, compared question by question (rlvr/paired.py): the
gain with its standard error and the paired test's verdict. Used by `rlvr eval compare`, `rlvr
demo` and the web console's evaluation and loop pages; works on any two completed evaluations of
one question set, whatever their models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from rlvr.paired import Comparison, compare, compare_columns
from rlvr.v1 import benchmark_pb2 as B


class Evaluations(Protocol):
    """What this reads of a benchmark client (the SDK's BenchmarkClient fits)."""

    def get_evaluation(self, request: B.GetEvaluationRequest) -> B.Evaluation: ...

    def get_evaluation_results(self, request: B.GetEvaluationResultsRequest) -> B.GetEvaluationResultsResponse: ...


class NotComparable(ValueError):
    """The two evaluations did not ask the same questions, or one has not completed."""


def results(client: Evaluations, evaluation_id: str, only_wrong: bool = False,
            page: int = 1000) -> Iterator[B.QuestionResult]:
    """Every per-question result of an evaluation (only the wrong ones on request), in question
    order, a page at a time."""
    offset = 0
    while True:
        resp = client.get_evaluation_results(B.GetEvaluationResultsRequest(
            id=evaluation_id, only_wrong=only_wrong, offset=offset, limit=page))
        yield from resp.results
        offset += len(resp.results)
        if not resp.results or offset >= resp.total:
            return


def comparable(before: B.Evaluation, after: B.Evaluation) -> str:
    """Why the two cannot be paired ("" when they can)."""
    for ev in (before, after):
        if ev.status != B.EVALUATION_STATUS_COMPLETED:
            return f"evaluation {ev.id} is {B.EvaluationStatus.Name(ev.status).removeprefix('EVALUATION_STATUS_')}"
    if before.benchmark != after.benchmark:
        return f"evaluation {before.id} is of {before.benchmark}, {after.id} of {after.benchmark}"
    if before.question_set != after.question_set or not before.question_set:
        return (f"evaluations {before.id} and {after.id} asked different questions (question sets "
                f"{before.question_set or '?'} and {after.question_set or '?'}): run both with the same "
                "--limit (and --dataset, --split)")
    return ""


def compare_results(before: list[B.QuestionResult], after: list[B.QuestionResult]) -> Comparison:
    """Pairs the results by question index (accuracy: 1 right, 0 wrong, a share for partial rewards)."""
    comparison = compare_columns("accuracy", before, after) if before or after else compare([], [])
    if comparison is None:
        raise NotComparable(f"the results cover different questions ({len(before)} and {len(after)})")
    return comparison


def compare_evaluations(client: Evaluations, before_id: str, after_id: str) -> tuple[B.Evaluation, B.Evaluation,
                                                                                      Comparison]:
    """Fetches both evaluations and their results; NotComparable says why they cannot be paired."""
    before = client.get_evaluation(B.GetEvaluationRequest(id=before_id))
    after = client.get_evaluation(B.GetEvaluationRequest(id=after_id))
    reason = comparable(before, after)
    if reason:
        raise NotComparable(reason)
    return before, after, compare_results(list(results(client, before_id)), list(results(client, after_id)))


def summary_lines(before: B.Evaluation, after: B.Evaluation, c: Comparison) -> list[str]:
    """Before, after, the changed questions and the verdict, for a terminal."""
    def label(ev: B.Evaluation) -> str:
        policy = f"{ev.adapter_name} v{ev.adapter_version}" if ev.adapter_name else f"base {ev.model}"
        return f"{policy}, {ev.label}" if ev.label else policy

    return [f"{before.benchmark}, {c.n} questions ({before.question_set})",
            f"  before  {c.before:7.1%}  {label(before)} ({before.id})",
            f"  after   {c.after:7.1%}  {label(after)} ({after.id})",
            *([f"  changed {c.gained} wrong -> right, {c.lost} right -> wrong"] if c.test == "McNemar exact" else []),
            f"  gain    {c.verdict()}"]
