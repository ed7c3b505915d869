"""One typed client per rlvr service over the v1 contract, in two flavours from one definition.

Each service's RPCs are declared once, in a `...Rpcs` table (see `rlvr.peers.base`): a method per
RPC, named after it in snake_case, request message in, response message out (a server stream
returns an iterator, a client stream takes an iterable of requests). From each table come the
synchronous client (`RewardClient`: scripts, the CLI, the trainer's job process) and the asyncio
one (`AsyncRewardClient`: the asyncio services, `rlvr.clients.sdk.connect_async`), with the same method
names, deadlines, retries and `RlvrError`.

The services use these to call their peers (the trainer its rollout and reward servers, the
benchmark the same two) and the SDK (`rlvr.clients.sdk`) re-exports them for users.
"""

from __future__ import annotations

import asyncio
import os

from rlvr.peers.base import AsyncServiceClient, ClientStream, ServerStream, ServiceClient, Unary, in_thread
from rlvr.transfer import CHUNK_SIZE, adapter_upload
from rlvr.v1 import benchmark_pb2 as bm
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import reward_pb2 as rw
from rlvr.v1 import rollout_pb2 as ro
from rlvr.v1 import trainer_pb2 as tr


class TrainerRpcs:
    """rlvr.v1.TrainerService: one GRPO worker (normally driven by the scheduler)."""

    service = "trainer"
    start_job = Unary("StartJob", tr.StartJobRequest, tr.StartJobResponse)
    cancel_job = Unary("CancelJob", tr.TrainerCancelJobRequest, tr.TrainerCancelJobResponse)
    get_worker_status = Unary("GetWorkerStatus", tr.GetWorkerStatusRequest, tr.WorkerStatus)
    merge_adapter = ServerStream("MergeAdapter", tr.MergeAdapterRequest, tr.MergeProgress)
    fetch_folder = ServerStream("FetchFolder", tr.FetchFolderRequest, cm.FileChunk,
                                "A folder under the worker's artifact root; see rlvr.peers.folders.")


class RewardRpcs:
    """rlvr.v1.RewardService: stateless scoring and the task prompts."""

    service = "reward"
    score = Unary("Score", rw.ScoreRequest, rw.ScoreResponse)
    get_problems = Unary("GetProblems", rw.GetProblemsRequest, rw.GetProblemsResponse)
    list_reward_functions = Unary("ListRewardFunctions", rw.ListRewardFunctionsRequest,
                                  rw.ListRewardFunctionsResponse)


class RolloutRpcs:
    """rlvr.v1.RolloutService: generation and hot-loaded adapter versions."""

    service = "rollout"
    generate = ServerStream("Generate", ro.GenerateRequest, ro.GenerateResponse)
    load_adapter_stream = ClientStream(
        "LoadAdapter", ro.LoadAdapterRequest, ro.AdapterInfo,
        "The raw LoadAdapter call: a header message, then file chunks. See `load_adapter`.",
    )
    list_adapters = Unary("ListAdapters", ro.ListAdaptersRequest, ro.ListAdaptersResponse)
    unload_adapter = Unary("UnloadAdapter", ro.UnloadAdapterRequest, ro.UnloadAdapterResponse)
    get_info = Unary("GetInfo", ro.GetInfoRequest, ro.RolloutInfo)


class BenchmarkRpcs:
    """rlvr.v1.BenchmarkService: evaluations and leaderboards."""

    service = "benchmark"
    list_benchmarks = Unary("ListBenchmarks", bm.ListBenchmarksRequest, bm.ListBenchmarksResponse)
    run_evaluation = Unary("RunEvaluation", bm.RunEvaluationRequest, bm.Evaluation)
    get_evaluation = Unary("GetEvaluation", bm.GetEvaluationRequest, bm.Evaluation)
    list_evaluations = Unary("ListEvaluations", bm.ListEvaluationsRequest, bm.ListEvaluationsResponse)
    cancel_evaluation = Unary("CancelEvaluation", bm.CancelEvaluationRequest, bm.Evaluation)
    delete_evaluation = Unary("DeleteEvaluation", bm.DeleteEvaluationRequest, bm.DeleteEvaluationResponse)
    get_evaluation_results = Unary("GetEvaluationResults", bm.GetEvaluationResultsRequest,
                                   bm.GetEvaluationResultsResponse)
    watch_evaluation = ServerStream("WatchEvaluation", bm.WatchEvaluationRequest, bm.EvaluationEvent)
    get_leaderboard = Unary("GetLeaderboard", bm.GetLeaderboardRequest, bm.GetLeaderboardResponse)


class TrainerClient(TrainerRpcs, ServiceClient):
    """rlvr.v1.TrainerService, synchronous."""


class AsyncTrainerClient(TrainerRpcs, AsyncServiceClient):
    """rlvr.v1.TrainerService, asyncio."""


class RewardClient(RewardRpcs, ServiceClient):
    """rlvr.v1.RewardService, synchronous."""


class AsyncRewardClient(RewardRpcs, AsyncServiceClient):
    """rlvr.v1.RewardService, asyncio."""


class RolloutClient(RolloutRpcs, ServiceClient):
    """rlvr.v1.RolloutService, synchronous."""

    def load_adapter(
        self,
        name: str,
        version: int,
        directory: str | os.PathLike[str],
        *,
        chunk_size: int = CHUNK_SIZE,
        timeout: float | None = None,
    ) -> ro.AdapterInfo:
        """Uploads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) as
        version `version` of adapter `name`; it goes live once the server has checked it."""
        return self.load_adapter_stream(adapter_upload(name, version, directory, chunk_size), timeout=timeout)


class AsyncRolloutClient(RolloutRpcs, AsyncServiceClient):
    """rlvr.v1.RolloutService, asyncio."""

    async def load_adapter(
        self,
        name: str,
        version: int,
        directory: str | os.PathLike[str],
        *,
        chunk_size: int = CHUNK_SIZE,
        timeout: float | None = None,
    ) -> ro.AdapterInfo:
        """`RolloutClient.load_adapter`, reading the files in a worker thread a chunk at a time (an
        adapter can be hundreds of MB, and the event loop serves other calls meanwhile). A missing
        file raises FileNotFoundError before anything is sent."""
        messages = await asyncio.to_thread(adapter_upload, name, version, directory, chunk_size)
        return await self.load_adapter_stream(in_thread(messages), timeout=timeout)


class BenchmarkClient(BenchmarkRpcs, ServiceClient):
    """rlvr.v1.BenchmarkService, synchronous."""


class AsyncBenchmarkClient(BenchmarkRpcs, AsyncServiceClient):
    """rlvr.v1.BenchmarkService, asyncio."""
