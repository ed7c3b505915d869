"""The typed Python SDK: one client per service over the v1 contract, `connect()` and `connect_async()`.

    from rlvr.clients.sdk import connect
    from rlvr.v1 import scheduler_pb2

    with connect() as rlvr:
        job = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=...)).job
        for event in rlvr.scheduler.watch(job.id):
            print(event)

    async with connect_async() as rlvr:  # asyncio: the same methods, awaited
        job = (await rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=...))).job
        async for event in rlvr.scheduler.watch(job.id):
            print(event)

Every RPC is a method named after it in snake_case: request message in, response message out;
a server stream returns an iterator (async: an `AsyncStream`), a client stream takes an iterable
of requests. Each call carries a deadline (`timeout`, default from
`rlvr.common.client.deadline_for`), idempotent calls retry on UNAVAILABLE (the channel's service
config), and a failed call raises `RlvrError` with the server's code and message rather than a grpc
traceback. The sync and the async client of a service are built from one table of its RPCs
(`rlvr.peers.base`), so they cannot differ in any of this.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from rlvr.clients.connection import (
    ClientSettings,
    dialable,
    read_stack_file,
    stack_addresses,
    stack_home,
    stack_user_token,
)
from rlvr.clients.sdk_files import export_format, merged_result, save_chunks, write_file, write_loop
from rlvr.peers.base import (
    AsyncServiceClient,
    AsyncStream,
    RlvrError,
    ServerStream,
    ServiceClient,
    Unary,
    default_timeout,
)
from rlvr.peers.clients import (
    AsyncBenchmarkClient,
    AsyncRewardClient,
    AsyncRolloutClient,
    AsyncTrainerClient,
    BenchmarkClient,
    RewardClient,
    RolloutClient,
    TrainerClient,
)
from rlvr.transfer import adapter_upload, save_file_chunks
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import reward_pb2 as rw
from rlvr.v1 import scheduler_pb2 as sc

__all__ = [
    "ASYNC_CLIENT_CLASSES",
    "AsyncBenchmarkClient",
    "AsyncRewardClient",
    "AsyncRlvr",
    "AsyncRolloutClient",
    "AsyncSchedulerClient",
    "AsyncServiceClient",
    "AsyncStream",
    "AsyncTrainerClient",
    "BenchmarkClient",
    "ClientSettings",
    "RewardClient",
    "Rlvr",
    "RlvrError",
    "RolloutClient",
    "SchedulerClient",
    "CLIENT_CLASSES",
    "ServiceClient",
    "TrainerClient",
    "adapter_upload",
    "connect",
    "connect_async",
    "default_timeout",
    "dialable",
    "export_format",
    "read_stack_file",
    "save_file_chunks",
    "stack_addresses",
    "stack_home",
    "stack_user_token",
]


class SchedulerRpcs:
    """rlvr.v1.SchedulerService: jobs, metrics, artifacts and automated loops."""

    service = "scheduler"
    create_job = Unary("CreateJob", sc.CreateJobRequest, sc.CreateJobResponse)
    get_job = Unary("GetJob", sc.GetJobRequest, cm.Job)
    list_jobs = Unary("ListJobs", sc.ListJobsRequest, sc.ListJobsResponse)
    cancel_job = Unary("CancelJob", sc.CancelJobRequest, cm.Job)
    delete_job = Unary("DeleteJob", sc.DeleteJobRequest, sc.DeleteJobResponse)
    watch_job = ServerStream("WatchJob", sc.WatchJobRequest, cm.JobEvent)
    get_job_metrics = Unary("GetJobMetrics", sc.GetJobMetricsRequest, sc.JobMetrics)
    get_job_samples = Unary("GetJobSamples", sc.GetJobSamplesRequest, sc.GetJobSamplesResponse)
    download_adapter = ServerStream("DownloadAdapter", sc.DownloadAdapterRequest, cm.FileChunk)
    merge_model = ServerStream("MergeModel", sc.MergeModelRequest, sc.MergeModelProgress)
    download_merged_model = ServerStream("DownloadMergedModel", sc.DownloadMergedModelRequest, cm.FileChunk)
    export_history = Unary("ExportHistory", sc.ExportHistoryRequest, sc.ExportHistoryResponse)
    create_loop = Unary("CreateLoop", sc.CreateLoopRequest, sc.CreateLoopResponse)
    get_loop = Unary("GetLoop", sc.GetLoopRequest, sc.Loop)
    list_loops = Unary("ListLoops", sc.ListLoopsRequest, sc.ListLoopsResponse)
    stop_loop = Unary("StopLoop", sc.StopLoopRequest, sc.Loop)
    watch_loop = ServerStream("WatchLoop", sc.WatchLoopRequest, sc.Loop)
    list_reward_functions = Unary("ListRewardFunctions", rw.ListRewardFunctionsRequest,
                                  rw.ListRewardFunctionsResponse)
    list_environments = Unary("ListEnvironments", sc.ListEnvironmentsRequest, sc.ListEnvironmentsResponse)
    list_models = Unary("ListModels", sc.ListModelsRequest, sc.ListModelsResponse)
    track_job = Unary("TrackJob", sc.TrackJobRequest, sc.TrackJobResponse)


class SchedulerClient(SchedulerRpcs, ServiceClient):
    """rlvr.v1.SchedulerService, synchronous, with conveniences over its RPCs."""

    # ------------------------------------------------------------ conveniences

    def rewards(self, *, timeout: float | None = None) -> list[rw.RewardFunctionInfo]:
        """The rewards a job may name (RewardConfig.key), as the reward service lists them."""
        return list(self.list_reward_functions(rw.ListRewardFunctionsRequest(), timeout=timeout).functions)

    def environments(self, *, timeout: float | None = None) -> list[sc.EnvironmentInfo]:
        """The environments an agent job's episodes may run in, as the scheduler lists them (those
        that failed to load: `list_environments(...).unavailable`)."""
        return list(self.list_environments(sc.ListEnvironmentsRequest(), timeout=timeout).environments)

    def models(self, *, timeout: float | None = None) -> list[sc.ModelInfo]:
        """The base models a job may name by their bare name: the bundled ones and those under the
        scheduler's model roots (`rlvr models import`)."""
        return list(self.list_models(sc.ListModelsRequest(), timeout=timeout).models)

    def samples(
        self, job_id: str, *, step: int = 0, limit: int = 0, timeout: float | None = None
    ) -> list[cm.CompletionSamples]:
        """The job's samples of completions (a few per step, as the trainer published them), newest
        step first: the latest `limit` stored steps (0: 5), or `step` alone. For a job with an
        environment each `completion` is the episode's transcript turn by turn."""
        request = sc.GetJobSamplesRequest(job_id=job_id, step=step, limit=limit)
        return list(self.get_job_samples(request, timeout=timeout).steps)

    def watch(
        self, job_id: str, *, from_start: bool = True, timeout: float | None = None
    ) -> Iterator[cm.JobEvent]:
        """The job's status and metric events (the stored steps first when `from_start`) until it
        ends."""
        return self.watch_job(sc.WatchJobRequest(id=job_id, from_start=from_start), timeout=timeout)

    def save_adapter(
        self, job_id: str, directory: str | os.PathLike[str], *, timeout: float | None = None
    ) -> list[Path]:
        """Downloads the job's adapter (PEFT files) into `directory`; returns the files written."""
        return save_file_chunks(
            self.download_adapter(sc.DownloadAdapterRequest(job_id=job_id), timeout=timeout), directory
        )

    def merge(
        self,
        job_id: str,
        *,
        dtype: str = "",
        on_progress: Callable[[sc.MergeModelProgress], None] | None = None,
        timeout: float | None = None,
    ) -> sc.MergeModelProgress:
        """Merges the job's adapter into its base model (a full Hugging Face checkpoint on the
        server, see `save_merged_model`) and waits for it; `on_progress` sees every progress
        message. Returns the last one (`done`, with the server-side `path` and `size_bytes`); a job
        merged before in the same `dtype` answers at once. `dtype`: "" or "auto" (the base model's),
        "fp32", "bf16" or "fp16"."""
        last: sc.MergeModelProgress | None = None
        for progress in self.merge_model(sc.MergeModelRequest(job_id=job_id, dtype=dtype), timeout=timeout):
            if on_progress is not None:
                on_progress(progress)
            last = progress
        return merged_result(last, job_id, self._method("MergeModel"), self.address)

    def save_merged_model(
        self, job_id: str, directory: str | os.PathLike[str], *, dtype: str = "", timeout: float | None = None
    ) -> list[Path]:
        """Downloads the job's merged model (run `merge` first) into `directory`, a Hugging Face
        checkpoint that `AutoModelForCausalLM.from_pretrained` loads; returns the files written.
        `dtype` "": the merge in the base model's dtype (else the newest); else the current adapter's
        merge in that dtype."""
        return save_file_chunks(
            self.download_merged_model(sc.DownloadMergedModelRequest(job_id=job_id, dtype=dtype), timeout=timeout),
            directory,
        )

    def export(
        self,
        job_id: str,
        fmt: str | int = "csv",
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> Path:
        """Export History to a file: `fmt` "csv" or "jsonl" (or an ExportFormat value); `path` a
        file, or a folder to write the server's file name into (default: the current folder).
        Returns the file written."""
        request = sc.ExportHistoryRequest(job_id=job_id, format=export_format(fmt))
        response = self.export_history(request, timeout=timeout)
        return write_file(path, response.filename, response.content)

    def watch_loop_updates(self, loop_id: str, *, timeout: float | None = None) -> Iterator[sc.Loop]:
        """The loop now, then again at every change (status, a round's progress or score); the
        iterator ends after the first Loop with a final status (Target reached, Rounds spent,
        Plateaued, Failed, Stopped: `rlvr.clients.views.loops.is_final`). Breaking out early frees the
        server's stream."""
        from rlvr.clients.views.loops import is_final

        for loop in self.watch_loop(sc.WatchLoopRequest(id=loop_id), timeout=timeout):
            yield loop
            if is_final(loop.status):
                return

    def export_loop(
        self,
        loop_id: str,
        fmt: str | int = "csv",
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> Path:
        """The loop's rounds to a file, one row per round (the columns are
        `rlvr.clients.views.loops.EXPORT_COLUMNS`, documented there): `fmt` "csv" (a header line) or
        "jsonl" (one object per line), or an ExportFormat value; `path` a file, or a folder to write
        `loop-<id>-rounds.<csv|jsonl>` into (default: the current folder). Written here from
        GetLoop; returns the file written."""
        loop = self.get_loop(sc.GetLoopRequest(id=loop_id), timeout=timeout)
        return write_loop(loop, loop_id, fmt, path)


class AsyncSchedulerClient(SchedulerRpcs, AsyncServiceClient):
    """rlvr.v1.SchedulerService, asyncio: the RPCs and the conveniences of `SchedulerClient`,
    awaited (files are written in a worker thread)."""

    async def rewards(self, *, timeout: float | None = None) -> list[rw.RewardFunctionInfo]:
        """`SchedulerClient.rewards`."""
        response = await self.list_reward_functions(rw.ListRewardFunctionsRequest(), timeout=timeout)
        return list(response.functions)

    async def environments(self, *, timeout: float | None = None) -> list[sc.EnvironmentInfo]:
        """`SchedulerClient.environments`."""
        response = await self.list_environments(sc.ListEnvironmentsRequest(), timeout=timeout)
        return list(response.environments)

    async def models(self, *, timeout: float | None = None) -> list[sc.ModelInfo]:
        """`SchedulerClient.models`."""
        return list((await self.list_models(sc.ListModelsRequest(), timeout=timeout)).models)

    async def samples(
        self, job_id: str, *, step: int = 0, limit: int = 0, timeout: float | None = None
    ) -> list[cm.CompletionSamples]:
        """`SchedulerClient.samples`."""
        request = sc.GetJobSamplesRequest(job_id=job_id, step=step, limit=limit)
        return list((await self.get_job_samples(request, timeout=timeout)).steps)

    def watch(
        self, job_id: str, *, from_start: bool = True, timeout: float | None = None
    ) -> AsyncStream[cm.JobEvent]:
        """`SchedulerClient.watch`: read it with `async for`."""
        return self.watch_job(sc.WatchJobRequest(id=job_id, from_start=from_start), timeout=timeout)

    async def save_adapter(
        self, job_id: str, directory: str | os.PathLike[str], *, timeout: float | None = None
    ) -> list[Path]:
        """`SchedulerClient.save_adapter`."""
        return await save_chunks(self.download_adapter(sc.DownloadAdapterRequest(job_id=job_id), timeout=timeout),
                                  directory)

    async def merge(
        self,
        job_id: str,
        *,
        dtype: str = "",
        on_progress: Callable[[sc.MergeModelProgress], Awaitable[None] | None] | None = None,
        timeout: float | None = None,
    ) -> sc.MergeModelProgress:
        """`SchedulerClient.merge`; `on_progress` may be a coroutine function."""
        last: sc.MergeModelProgress | None = None
        async with self.merge_model(sc.MergeModelRequest(job_id=job_id, dtype=dtype), timeout=timeout) as stream:
            async for progress in stream:
                if on_progress is not None:
                    seen = on_progress(progress)
                    if seen is not None:
                        await seen
                last = progress
        return merged_result(last, job_id, self._method("MergeModel"), self.address)

    async def save_merged_model(
        self, job_id: str, directory: str | os.PathLike[str], *, dtype: str = "", timeout: float | None = None
    ) -> list[Path]:
        """`SchedulerClient.save_merged_model`."""
        request = sc.DownloadMergedModelRequest(job_id=job_id, dtype=dtype)
        return await save_chunks(self.download_merged_model(request, timeout=timeout), directory)

    async def export(
        self,
        job_id: str,
        fmt: str | int = "csv",
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> Path:
        """`SchedulerClient.export`."""
        request = sc.ExportHistoryRequest(job_id=job_id, format=export_format(fmt))
        response = await self.export_history(request, timeout=timeout)
        return await asyncio.to_thread(write_file, path, response.filename, response.content)

    async def watch_loop_updates(self, loop_id: str, *, timeout: float | None = None) -> AsyncIterator[sc.Loop]:
        """`SchedulerClient.watch_loop_updates`: ends after the first Loop with a final status."""
        from rlvr.clients.views.loops import is_final

        async with self.watch_loop(sc.WatchLoopRequest(id=loop_id), timeout=timeout) as stream:
            async for loop in stream:
                yield loop
                if is_final(loop.status):
                    return

    async def export_loop(
        self,
        loop_id: str,
        fmt: str | int = "csv",
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> Path:
        """`SchedulerClient.export_loop`."""
        loop = await self.get_loop(sc.GetLoopRequest(id=loop_id), timeout=timeout)
        return await asyncio.to_thread(write_loop, loop, loop_id, fmt, path)


CLIENT_CLASSES: dict[str, type[ServiceClient]] = {
    cls.service: cls for cls in (SchedulerClient, TrainerClient, RewardClient, RolloutClient, BenchmarkClient)
}
"""The synchronous client of each service, by short name."""

ASYNC_CLIENT_CLASSES: dict[str, type[AsyncServiceClient]] = {
    cls.service: cls
    for cls in (AsyncSchedulerClient, AsyncTrainerClient, AsyncRewardClient, AsyncRolloutClient, AsyncBenchmarkClient)
}
"""The asyncio client of each service, by short name: the same RPC table as its sync twin."""


class Rlvr:
    """A client for each service, from one ClientSettings. Close it (or use `with`)."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.scheduler = settings.client(SchedulerClient)
        self.trainer = settings.client(TrainerClient)
        self.reward = settings.client(RewardClient)
        self.rollout = settings.client(RolloutClient)
        self.benchmark = settings.client(BenchmarkClient)

    def close(self) -> None:
        for client in (self.scheduler, self.trainer, self.reward, self.rollout, self.benchmark):
            client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def connect(settings: ClientSettings | None = None) -> Rlvr:
    """Clients for the whole stack; addresses from `settings`, else from the environment
    (RLVR_SCHEDULER_ADDRESS, ...), else the local stack's defaults. Connects lazily: nothing
    is dialled until the first call."""
    return Rlvr(settings if settings is not None else ClientSettings())


class AsyncRlvr:
    """`Rlvr` for asyncio: an async client for each service, from one ClientSettings. Close it
    (`await rlvr.close()`, or use `async with`)."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.scheduler = settings.client(AsyncSchedulerClient)
        self.trainer = settings.client(AsyncTrainerClient)
        self.reward = settings.client(AsyncRewardClient)
        self.rollout = settings.client(AsyncRolloutClient)
        self.benchmark = settings.client(AsyncBenchmarkClient)

    async def close(self) -> None:
        for client in (self.scheduler, self.trainer, self.reward, self.rollout, self.benchmark):
            await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def connect_async(settings: ClientSettings | None = None) -> AsyncRlvr:
    """`connect` for asyncio, used as `async with connect_async() as rlvr:`; every method is then
    awaited (a server stream read with `async for`). Call it inside a coroutine: grpc.aio binds its
    channels to the running event loop. Connects lazily, like `connect`."""
    return AsyncRlvr(settings if settings is not None else ClientSettings())
