"""One typed client per rlvr service over the v1 contract: a method per RPC, named after it in
snake_case, request message in, response message out (a server stream returns an iterator, a client
stream takes an iterable of requests).

The services use these to call their peers (the trainer its rollout server, ...) and the SDK
(`clients.sdk`) re-exports them for users, so both see the same deadlines, retries and `RlvrError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from rlvr.peers.base import ServiceClient
from rlvr.transfer import adapter_upload
from rlvr.v1 import benchmark_pb2 as bm
from rlvr.v1 import (
    benchmark_pb2_grpc,
    reward_pb2_grpc,
    rollout_pb2_grpc,
    trainer_pb2_grpc,
)
from rlvr.v1 import reward_pb2 as rw
from rlvr.v1 import rollout_pb2 as ro
from rlvr.v1 import trainer_pb2 as tr


class TrainerClient(ServiceClient):
    """rlvr.v1.TrainerService: one GRPO worker (normally driven by the scheduler)."""

    service = "trainer"
    _stub_class = trainer_pb2_grpc.TrainerServiceStub

    def start_job(self, request: tr.StartJobRequest, *, timeout: float | None = None) -> tr.StartJobResponse:
        return self._unary("StartJob", request, timeout)

    def cancel_job(
        self, request: tr.TrainerCancelJobRequest, *, timeout: float | None = None
    ) -> tr.TrainerCancelJobResponse:
        return self._unary("CancelJob", request, timeout)

    def get_worker_status(
        self, request: tr.GetWorkerStatusRequest | None = None, *, timeout: float | None = None
    ) -> tr.WorkerStatus:
        return self._unary(
            "GetWorkerStatus", request if request is not None else tr.GetWorkerStatusRequest(), timeout
        )

    def merge_adapter(
        self, request: tr.MergeAdapterRequest, *, timeout: float | None = None
    ) -> Iterator[tr.MergeProgress]:
        return self._server_stream("MergeAdapter", request, timeout)


class RewardClient(ServiceClient):
    """rlvr.v1.RewardService: stateless scoring and the task prompts."""

    service = "reward"
    _stub_class = reward_pb2_grpc.RewardServiceStub

    def score(self, request: rw.ScoreRequest, *, timeout: float | None = None) -> rw.ScoreResponse:
        return self._unary("Score", request, timeout)

    def get_problems(
        self, request: rw.GetProblemsRequest, *, timeout: float | None = None
    ) -> rw.GetProblemsResponse:
        return self._unary("GetProblems", request, timeout)

    def list_reward_functions(
        self, request: rw.ListRewardFunctionsRequest | None = None, *, timeout: float | None = None
    ) -> rw.ListRewardFunctionsResponse:
        return self._unary(
            "ListRewardFunctions",
            request if request is not None else rw.ListRewardFunctionsRequest(),
            timeout,
        )


class RolloutClient(ServiceClient):
    """rlvr.v1.RolloutService: generation and hot-loaded adapter versions."""

    service = "rollout"
    _stub_class = rollout_pb2_grpc.RolloutServiceStub

    def generate(
        self, request: ro.GenerateRequest, *, timeout: float | None = None
    ) -> Iterator[ro.GenerateResponse]:
        return self._server_stream("Generate", request, timeout)

    def load_adapter_stream(
        self, requests: Iterable[ro.LoadAdapterRequest], *, timeout: float | None = None
    ) -> ro.AdapterInfo:
        """The raw LoadAdapter call: a header message, then file chunks. See `load_adapter`."""
        return self._client_stream("LoadAdapter", requests, timeout)

    def list_adapters(
        self, request: ro.ListAdaptersRequest | None = None, *, timeout: float | None = None
    ) -> ro.ListAdaptersResponse:
        return self._unary(
            "ListAdapters", request if request is not None else ro.ListAdaptersRequest(), timeout
        )

    def unload_adapter(
        self, request: ro.UnloadAdapterRequest, *, timeout: float | None = None
    ) -> ro.UnloadAdapterResponse:
        return self._unary("UnloadAdapter", request, timeout)

    def get_info(
        self, request: ro.GetInfoRequest | None = None, *, timeout: float | None = None
    ) -> ro.RolloutInfo:
        return self._unary("GetInfo", request if request is not None else ro.GetInfoRequest(), timeout)

    def load_adapter(
        self,
        name: str,
        version: int,
        directory: str | os.PathLike[str],
        *,
        chunk_size: int = 1024 * 1024,
        timeout: float | None = None,
    ) -> ro.AdapterInfo:
        """Uploads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) as
        version `version` of adapter `name`; it goes live once the server has checked it."""
        return self.load_adapter_stream(adapter_upload(name, version, directory, chunk_size), timeout=timeout)


class BenchmarkClient(ServiceClient):
    """rlvr.v1.BenchmarkService: evaluations and leaderboards."""

    service = "benchmark"
    _stub_class = benchmark_pb2_grpc.BenchmarkServiceStub

    def list_benchmarks(
        self, request: bm.ListBenchmarksRequest | None = None, *, timeout: float | None = None
    ) -> bm.ListBenchmarksResponse:
        return self._unary(
            "ListBenchmarks", request if request is not None else bm.ListBenchmarksRequest(), timeout
        )

    def run_evaluation(
        self, request: bm.RunEvaluationRequest, *, timeout: float | None = None
    ) -> bm.Evaluation:
        return self._unary("RunEvaluation", request, timeout)

    def get_evaluation(
        self, request: bm.GetEvaluationRequest, *, timeout: float | None = None
    ) -> bm.Evaluation:
        return self._unary("GetEvaluation", request, timeout)

    def list_evaluations(
        self, request: bm.ListEvaluationsRequest | None = None, *, timeout: float | None = None
    ) -> bm.ListEvaluationsResponse:
        return self._unary(
            "ListEvaluations", request if request is not None else bm.ListEvaluationsRequest(), timeout
        )

    def get_evaluation_results(
        self, request: bm.GetEvaluationResultsRequest, *, timeout: float | None = None
    ) -> bm.GetEvaluationResultsResponse:
        return self._unary("GetEvaluationResults", request, timeout)

    def watch_evaluation(
        self, request: bm.WatchEvaluationRequest, *, timeout: float | None = None
    ) -> Iterator[bm.EvaluationEvent]:
        return self._server_stream("WatchEvaluation", request, timeout)

    def get_leaderboard(
        self, request: bm.GetLeaderboardRequest, *, timeout: float | None = None
    ) -> bm.GetLeaderboardResponse:
        return self._unary("GetLeaderboard", request, timeout)
