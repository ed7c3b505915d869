"""The typed Python SDK: one client per service over the v1 contract, and `connect()`.

    from clients.sdk import connect
    from rlvr.v1 import scheduler_pb2

    with connect() as rlvr:
        job = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=...)).job
        for event in rlvr.scheduler.watch(job.id):
            print(event)

Every RPC is a method named after it in snake_case: request message in, response message out;
a server stream returns an iterator, a client stream takes an iterable of requests. Each call
carries a deadline (`timeout`, default from `rlvr.common.client.deadline_for`), idempotent calls
retry on UNAVAILABLE (the channel's service config), and a failed call raises `RlvrError` with
the server's code and message rather than a grpc traceback. Channels are synchronous: the
simplest thing for scripts and notebooks; services use `make_channel(..., aio=True)` instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlvr.common.client import DEFAULT_ADDRESSES
from rlvr.peers.base import RlvrError, ServiceClient, default_timeout
from rlvr.peers.clients import (
    BenchmarkClient,
    RewardClient,
    RolloutClient,
    TrainerClient,
)
from rlvr.transfer import adapter_upload, save_file_chunks
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import scheduler_pb2 as sc
from rlvr.v1 import scheduler_pb2_grpc

__all__ = [
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
    "default_timeout",
    "export_format",
    "save_file_chunks",
]


class ClientSettings(BaseSettings):
    """Where the services are, read from the environment (`RLVR_SCHEDULER_ADDRESS`, ...)."""

    model_config = SettingsConfigDict(env_prefix="RLVR_", extra="ignore", use_attribute_docstrings=True)

    scheduler_address: str = DEFAULT_ADDRESSES["scheduler"]
    """The scheduler service (HOST:PORT): jobs, loops, metrics; the public API."""
    trainer_address: str = DEFAULT_ADDRESSES["trainer"]
    """A trainer worker (HOST:PORT); normally only the scheduler calls it."""
    reward_address: str = DEFAULT_ADDRESSES["reward"]
    """The reward service (HOST:PORT)."""
    rollout_address: str = DEFAULT_ADDRESSES["rollout"]
    """The rollout service (HOST:PORT)."""
    benchmark_address: str = DEFAULT_ADDRESSES["benchmark"]
    """The benchmark service (HOST:PORT)."""
    timeout: float | None = Field(default=None, gt=0)
    """Deadline in seconds for unary calls and uploads; unset = the per-method defaults of
    rlvr.common.client (30 s for most calls). Streams (Watch*, Generate, downloads) keep their own
    longer defaults; pass `timeout=` to a call to change one."""

    def address(self, service: str) -> str:
        """The address of a service by short name ("reward")."""
        return str(getattr(self, f"{service}_address"))


class SchedulerClient(ServiceClient):
    """rlvr.v1.SchedulerService: jobs, metrics, artifacts and automated loops."""

    service = "scheduler"
    _stub_class = scheduler_pb2_grpc.SchedulerServiceStub

    def create_job(
        self, request: sc.CreateJobRequest, *, timeout: float | None = None
    ) -> sc.CreateJobResponse:
        return self._unary("CreateJob", request, timeout)

    def get_job(self, request: sc.GetJobRequest, *, timeout: float | None = None) -> cm.Job:
        return self._unary("GetJob", request, timeout)

    def list_jobs(
        self, request: sc.ListJobsRequest | None = None, *, timeout: float | None = None
    ) -> sc.ListJobsResponse:
        return self._unary("ListJobs", request if request is not None else sc.ListJobsRequest(), timeout)

    def cancel_job(self, request: sc.CancelJobRequest, *, timeout: float | None = None) -> cm.Job:
        return self._unary("CancelJob", request, timeout)

    def watch_job(
        self, request: sc.WatchJobRequest, *, timeout: float | None = None
    ) -> Iterator[cm.JobEvent]:
        return self._server_stream("WatchJob", request, timeout)

    def get_job_metrics(
        self, request: sc.GetJobMetricsRequest, *, timeout: float | None = None
    ) -> sc.JobMetrics:
        return self._unary("GetJobMetrics", request, timeout)

    def download_adapter(
        self, request: sc.DownloadAdapterRequest, *, timeout: float | None = None
    ) -> Iterator[cm.FileChunk]:
        return self._server_stream("DownloadAdapter", request, timeout)

    def merge_model(
        self, request: sc.MergeModelRequest, *, timeout: float | None = None
    ) -> Iterator[sc.MergeModelProgress]:
        return self._server_stream("MergeModel", request, timeout)

    def download_merged_model(
        self, request: sc.DownloadMergedModelRequest, *, timeout: float | None = None
    ) -> Iterator[cm.FileChunk]:
        return self._server_stream("DownloadMergedModel", request, timeout)

    def export_history(
        self, request: sc.ExportHistoryRequest, *, timeout: float | None = None
    ) -> sc.ExportHistoryResponse:
        return self._unary("ExportHistory", request, timeout)

    def create_loop(
        self, request: sc.CreateLoopRequest, *, timeout: float | None = None
    ) -> sc.CreateLoopResponse:
        return self._unary("CreateLoop", request, timeout)

    def get_loop(self, request: sc.GetLoopRequest, *, timeout: float | None = None) -> sc.Loop:
        return self._unary("GetLoop", request, timeout)

    def list_loops(
        self, request: sc.ListLoopsRequest | None = None, *, timeout: float | None = None
    ) -> sc.ListLoopsResponse:
        return self._unary("ListLoops", request if request is not None else sc.ListLoopsRequest(), timeout)

    def stop_loop(self, request: sc.StopLoopRequest, *, timeout: float | None = None) -> sc.Loop:
        return self._unary("StopLoop", request, timeout)

    def watch_loop(self, request: sc.WatchLoopRequest, *, timeout: float | None = None) -> Iterator[sc.Loop]:
        return self._server_stream("WatchLoop", request, timeout)

    # ------------------------------------------------------------ conveniences

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
        on_progress: Callable[[sc.MergeModelProgress], None] | None = None,
        timeout: float | None = None,
    ) -> sc.MergeModelProgress:
        """Merges the job's adapter into its base model (a full Hugging Face checkpoint on the
        server, see `save_merged_model`) and waits for it; `on_progress` sees every progress
        message. Returns the last one (`done`, with the server-side `path` and `size_bytes`); a job
        merged before answers at once."""
        last: sc.MergeModelProgress | None = None
        for progress in self.merge_model(sc.MergeModelRequest(job_id=job_id), timeout=timeout):
            if on_progress is not None:
                on_progress(progress)
            last = progress
        if last is None or not last.done:
            raise RlvrError(grpc.StatusCode.INTERNAL, f"the merge of job {job_id} ended without a result",
                            self._method("MergeModel"))
        return last

    def save_merged_model(
        self, job_id: str, directory: str | os.PathLike[str], *, timeout: float | None = None
    ) -> list[Path]:
        """Downloads the job's merged model (run `merge` first) into `directory`, a Hugging Face
        checkpoint that `AutoModelForCausalLM.from_pretrained` loads; returns the files written."""
        return save_file_chunks(
            self.download_merged_model(sc.DownloadMergedModelRequest(job_id=job_id), timeout=timeout),
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
        target = Path(path) if path is not None else Path.cwd()
        if target.is_dir():
            target = target / response.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(response.content)
        return target

    def watch_loop_updates(self, loop_id: str, *, timeout: float | None = None) -> Iterator[sc.Loop]:
        """The loop now, then again at every change (status, a round's progress or score); the
        iterator ends after the first Loop with a final status (Target reached, Rounds spent,
        Plateaued, Failed, Stopped: `clients.loops_view.is_final`). Breaking out early frees the
        server's stream."""
        from clients.loops_view import is_final

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
        `clients.loops_view.EXPORT_COLUMNS`, documented there): `fmt` "csv" (a header line) or
        "jsonl" (one object per line), or an ExportFormat value; `path` a file, or a folder to write
        `loop-<id>-rounds.<csv|jsonl>` into (default: the current folder). Written here from
        GetLoop; returns the file written."""
        from clients.loops_view import export_text

        ext = "jsonl" if export_format(fmt) == sc.EXPORT_FORMAT_JSONL else "csv"
        loop = self.get_loop(sc.GetLoopRequest(id=loop_id), timeout=timeout)
        target = Path(path) if path is not None else Path.cwd()
        if target.is_dir():
            target = target / f"loop-{loop.id or loop_id}-rounds.{ext}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(export_text(loop, ext), encoding="utf-8")
        return target


def export_format(fmt: str | int) -> int:
    """An ExportFormat value from "csv" / "jsonl" (any case) or the value itself."""
    if isinstance(fmt, int):
        if fmt not in sc.ExportFormat.values():
            raise ValueError(f"fmt: {fmt!r} is not an ExportFormat; allowed: {list(sc.ExportFormat.values())}")
        return fmt
    name = f"EXPORT_FORMAT_{fmt.strip().upper().removeprefix('EXPORT_FORMAT_')}"
    if name not in sc.ExportFormat.DESCRIPTOR.values_by_name or name == "EXPORT_FORMAT_UNSPECIFIED":
        raise ValueError(f"fmt: {fmt!r} is not an export format; allowed: csv, jsonl")
    return sc.ExportFormat.Value(name)


CLIENT_CLASSES: dict[str, type[ServiceClient]] = {
    cls.service: cls for cls in (SchedulerClient, TrainerClient, RewardClient, RolloutClient, BenchmarkClient)
}


class Rlvr:
    """A client for each service, from one ClientSettings. Close it (or use `with`)."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.scheduler = SchedulerClient(settings.scheduler_address, timeout=settings.timeout)
        self.trainer = TrainerClient(settings.trainer_address, timeout=settings.timeout)
        self.reward = RewardClient(settings.reward_address, timeout=settings.timeout)
        self.rollout = RolloutClient(settings.rollout_address, timeout=settings.timeout)
        self.benchmark = BenchmarkClient(settings.benchmark_address, timeout=settings.timeout)

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
