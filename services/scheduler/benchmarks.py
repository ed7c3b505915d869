"""The benchmark service as the loop manager sees it: list benchmarks, start an evaluation, find one
by label, wait for one to end, read its per-question results.

`Benchmarks` is the interface the loop core uses; `GrpcBenchmarks` is the real one, over the typed
client of rlvr.peers. It translates the client's failures into the project's errors here, once, so the loop core never sees gRPC: an
unreachable service (UNAVAILABLE, DEADLINE_EXCEEDED) is `Unavailable`, which the loop waits out;
an unknown evaluation is None; a refused request keeps its status (InvalidArgument, ...).
"""

from __future__ import annotations

import builtins
import logging
from typing import Protocol

from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import (
    MAX_PAGE,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RlvrServiceError,
    Unavailable,
)
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncBenchmarkClient
from rlvr.v1 import benchmark_pb2

log = logging.getLogger("rlvr.scheduler.benchmarks")

FINAL = frozenset({benchmark_pb2.EVALUATION_STATUS_COMPLETED, benchmark_pb2.EVALUATION_STATUS_FAILED,
                   benchmark_pb2.EVALUATION_STATUS_CANCELLED})
# benchmark's services/benchmark/evaluations.py INTERRUPTED: an evaluation its service stopped under.
INTERRUPTED_PREFIX = "interrupted"


class Benchmarks(Protocol):
    async def list(self) -> list[benchmark_pb2.BenchmarkInfo]: ...
    async def run(self, request: benchmark_pb2.RunEvaluationRequest) -> benchmark_pb2.Evaluation: ...
    async def get(self, evaluation_id: str) -> benchmark_pb2.Evaluation | None: ...
    async def find(self, benchmark: str, label: str) -> benchmark_pb2.Evaluation | None: ...
    async def wait(self, evaluation_id: str) -> benchmark_pb2.Evaluation | None: ...
    async def results(self, evaluation_id: str) -> builtins.list[benchmark_pb2.QuestionResult]: ...


_KINDS: dict[str, type[RlvrServiceError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "FAILED_PRECONDITION": FailedPrecondition,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": Unavailable,
}


class GrpcBenchmarks:
    """The benchmark service through its typed asyncio client (deadlines, retries and `RlvrError`
    from rlvr.peers); create it inside a coroutine."""

    def __init__(self, address: str, auth: ChannelAuth | None = None) -> None:
        self.address = address
        self._client = AsyncBenchmarkClient(address, auth=auth)

    def _error(self, e: RlvrError) -> RlvrServiceError:
        kind = _KINDS.get(e.code.name, RlvrServiceError)
        if kind is Unavailable:
            return Unavailable(f"the benchmark service at {self.address} is unreachable ({e.code.name}: "
                               f"{e.details or 'no details'})")
        return kind(f"benchmark service: {e.details or e.code.name}")

    async def list(self) -> list[benchmark_pb2.BenchmarkInfo]:
        try:
            resp = await self._client.list_benchmarks(timeout=15)
        except RlvrError as e:
            raise self._error(e) from None
        return list(resp.benchmarks)

    async def run(self, request: benchmark_pb2.RunEvaluationRequest) -> benchmark_pb2.Evaluation:
        try:
            return await self._client.run_evaluation(request, timeout=300)  # it may upload an adapter first
        except RlvrError as e:
            raise self._error(e) from None

    async def get(self, evaluation_id: str) -> benchmark_pb2.Evaluation | None:
        try:
            return await self._client.get_evaluation(benchmark_pb2.GetEvaluationRequest(id=evaluation_id), timeout=15)
        except RlvrError as e:
            if e.code.name == "NOT_FOUND":
                return None
            raise self._error(e) from None

    async def find(self, benchmark: str, label: str) -> benchmark_pb2.Evaluation | None:
        """The newest evaluation of `benchmark` with exactly this label that did not fail, else the
        newest one that failed, else None."""
        matches: list[benchmark_pb2.Evaluation] = []  # newest first
        offset = 0
        while True:  # page by page: a page holds at most MAX_PAGE
            try:
                resp = await self._client.list_evaluations(
                    benchmark_pb2.ListEvaluationsRequest(benchmark=benchmark, limit=MAX_PAGE, offset=offset), timeout=30)
            except RlvrError as e:
                raise self._error(e) from None
            matches += [e for e in resp.evaluations if e.label == label]
            offset += len(resp.evaluations)
            if not resp.evaluations or offset >= resp.total:
                break
        alive = [e for e in matches if e.status != benchmark_pb2.EVALUATION_STATUS_FAILED]
        return alive[0] if alive else (matches[0] if matches else None)

    async def results(self, evaluation_id: str) -> builtins.list[benchmark_pb2.QuestionResult]:
        """Every per-question result of an evaluation, a page at a time."""
        found: builtins.list[benchmark_pb2.QuestionResult] = []
        while True:
            try:
                resp = await self._client.get_evaluation_results(benchmark_pb2.GetEvaluationResultsRequest(
                    id=evaluation_id, offset=len(found), limit=MAX_PAGE), timeout=30)
            except RlvrError as e:
                raise self._error(e) from None
            found += resp.results
            if not resp.results or len(found) >= resp.total:
                return found

    async def wait(self, evaluation_id: str) -> benchmark_pb2.Evaluation | None:
        """The evaluation once it has a final status (None when the service does not know it).
        Follows WatchEvaluation; a stream that ends early is answered by GetEvaluation."""
        try:
            async with self._client.watch_evaluation(benchmark_pb2.WatchEvaluationRequest(id=evaluation_id)) as events:
                async for event in events:
                    if event.status in FINAL:
                        break
        except RlvrError as e:
            if e.code.name == "NOT_FOUND":
                return None
            raise self._error(e) from None
        evaluation = await self.get(evaluation_id)
        if evaluation is not None and evaluation.status not in FINAL:
            raise Unavailable(f"the benchmark service at {self.address} ended the watch of evaluation "
                              f"{evaluation_id} before it finished")
        return evaluation


def interrupted(evaluation: benchmark_pb2.Evaluation) -> bool:
    """Failed because its benchmark service stopped under it (nothing wrong with the model): worth
    running again."""
    return (evaluation.status == benchmark_pb2.EVALUATION_STATUS_FAILED
            and evaluation.error.startswith(INTERRUPTED_PREFIX))
