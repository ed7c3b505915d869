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
from typing import Self, TypeVar

import grpc
from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlvr.common.auth import ChannelAuth
from rlvr.common.client import DEFAULT_ADDRESSES
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

ClientT = TypeVar("ClientT", bound=ServiceClient | AsyncServiceClient)

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
    "export_format",
    "save_file_chunks",
]


def stack_home() -> Path:
    """Where `rlvr up` keeps a stack's state by default: $RLVR_HOME/stack."""
    from rlvr.common.settings import rlvr_home

    return rlvr_home() / "stack"


def read_stack_file(home: Path | None = None) -> dict[str, object] | None:
    """The state a running `rlvr up` keeps in `<home>/stack.json` (default $RLVR_HOME/stack): its
    addresses, its tokens file and its NATS file; None when no stack runs there (no file, or one
    left by a stack whose process is gone)."""
    import json

    path = (home if home is not None else stack_home()) / "stack.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and pid > 0:  # `rlvr up` itself: its stack.json outlives a kill -9
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return state


def dialable(address: str) -> str:
    """A listening address as a client dials it: a service bound to every interface (0.0.0.0, ::)
    is reached on loopback."""
    host, _, port = address.rpartition(":")
    if host == "0.0.0.0":
        return f"127.0.0.1:{port}"
    if host in ("[::]", "::"):
        return f"[::1]:{port}"
    return address


def stack_addresses(state: dict[str, object] | None) -> dict[str, str]:
    """The five services' addresses of a stack's state (`read_stack_file`), as clients dial them."""
    addresses = state.get("addresses") if state else None
    if not isinstance(addresses, dict):
        return {}
    return {name: dialable(str(a)) for name, a in addresses.items() if name in DEFAULT_ADDRESSES}


def stack_user_token(state: dict[str, object]) -> str | None:
    """The user token of a local stack (its tokens file, 0600, readable by whoever started it)."""
    from rlvr.common.auth import read_tokens_file
    from rlvr.common.settings import SettingsError

    tokens_file = state.get("tokens_file")
    if not isinstance(tokens_file, str):
        return None
    try:
        tokens = read_tokens_file(Path(tokens_file))
    except SettingsError:
        return None
    return next((token for token, role in tokens.items() if role == "user"), None)


class ClientSettings(BaseSettings):
    """Where the services are and how to reach them: each address given (an argument, or the
    environment's `RLVR_SCHEDULER_ADDRESS`, ...), else the running local stack's (`rlvr up`, its
    stack.json under $RLVR_HOME/stack), else the default ports on 127.0.0.1 (`origin(service)`
    says which). The token and TLS files from `RLVR_TOKEN`, `RLVR_CA_FILE`, ...

    With no token set, the token of the local stack is sent to each service whose address here is
    one of that stack's (`auth(service)`): it is never sent anywhere else."""

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

    token: str | None = Field(default=None, repr=False)
    """Bearer token sent on every call (RLVR_TOKEN); unset = the local stack's, else none."""
    ca_file: Path | None = None
    """TLS: the CA certificate (PEM) the services' certificates chain to (RLVR_CA_FILE); unset =
    plaintext."""
    cert_file: Path | None = None
    """Mutual TLS: this client's certificate (PEM, RLVR_CERT_FILE), for services that ask for one."""
    key_file: Path | None = None
    """Mutual TLS: the key of cert_file (RLVR_KEY_FILE)."""

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _local_stack(self) -> Self:
        stack = stack_addresses(read_stack_file())
        for name in DEFAULT_ADDRESSES:
            field = f"{name}_address"
            if field in self.model_fields_set:
                env = os.environ.get(f"RLVR_{name.upper()}_ADDRESS")
                self._origins[name] = "env" if env is not None and env.strip() == self.address(name) else "given"
            elif name in stack:
                setattr(self, field, stack[name])
                self._origins[name] = "stack"
            else:
                self._origins[name] = "default"
        if self.token is None:  # every service the stack's: the token for all of them
            self.token = self._stack_token(*(self.address(name) for name in DEFAULT_ADDRESSES))
        return self

    def origin(self, service: str) -> str:
        """Where `service`'s address came from: "given" (an argument, e.g. the CLI's --address),
        "env" (RLVR_<SERVICE>_ADDRESS), "stack" (the running local stack's stack.json) or
        "default" (127.0.0.1 and the default port: no local stack runs)."""
        return self._origins.get(service, "given")

    @staticmethod
    def _stack_token(*addresses: str) -> str | None:
        """The local stack's user token when each of `addresses` is one of its services' (a stack
        bound to 0.0.0.0 or :: is reached on loopback); else None. One read of its stack.json."""
        state = read_stack_file()
        theirs_by_name = state.get("addresses") if state else None
        if not state or not isinstance(theirs_by_name, dict):
            return None
        theirs = [str(a).rpartition(":") for a in theirs_by_name.values()]
        loopback = {"127.0.0.1", "localhost", "[::1]", "::1"}

        def reached(address: str) -> bool:
            host, _, port = address.rpartition(":")
            return any(their_port == port and (their_host == host or their_host in ("0.0.0.0", "[::]", "::")
                                               and host in loopback) for their_host, _, their_port in theirs)

        return stack_user_token(state) if all(reached(a) for a in addresses) else None

    @classmethod
    def for_stack(cls, home: Path | None = None, **overrides: object) -> ClientSettings:
        """Settings for the stack a `rlvr up` (or `rlvr.clients.stack.Stack`) runs at `home` (default
        $RLVR_HOME/stack): its addresses and its user token, from its stack.json."""
        state = read_stack_file(home)
        if state is None:
            where = home if home is not None else "$RLVR_HOME/stack"
            raise FileNotFoundError(f"no running stack at {where} (no stack.json)")
        values: dict[str, object] = {f"{name}_address": address for name, address in stack_addresses(state).items()}
        values["token"] = stack_user_token(state)
        return cls(**{**values, **overrides})  # type: ignore[arg-type]

    def address(self, service: str) -> str:
        """The address of a service by short name ("reward")."""
        return str(getattr(self, f"{service}_address"))

    def client(self, cls: type[ClientT]) -> ClientT:
        """A client of `cls`'s service (sync or async) at its address here, with its timeout and
        auth (`auth(cls.service)`)."""
        return cls(self.address(cls.service), timeout=self.timeout, auth=self.auth(cls.service))

    def auth(self, service: str | None = None) -> ChannelAuth:
        """The token and TLS material a client presents: to `service` ("scheduler", ...), the local
        stack's token when no token is set and that service's address here is the stack's, even
        if other addresses are not (`rlvr jobs list --address HOST:PORT` on a stack started with
        --base-port)."""
        token = self.token
        if token is None and service is not None:
            token = self._stack_token(self.address(service))
        return ChannelAuth.from_files(token, self.ca_file, self.cert_file, self.key_file)


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
        return _merged(last, job_id, self._method("MergeModel"), self.address)

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
        return _write(path, response.filename, response.content)

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
        return _write_loop(loop, loop_id, fmt, path)


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
        return await _save_chunks(self.download_adapter(sc.DownloadAdapterRequest(job_id=job_id), timeout=timeout),
                                  directory)

    async def merge(
        self,
        job_id: str,
        *,
        on_progress: Callable[[sc.MergeModelProgress], Awaitable[None] | None] | None = None,
        timeout: float | None = None,
    ) -> sc.MergeModelProgress:
        """`SchedulerClient.merge`; `on_progress` may be a coroutine function."""
        last: sc.MergeModelProgress | None = None
        async with self.merge_model(sc.MergeModelRequest(job_id=job_id), timeout=timeout) as stream:
            async for progress in stream:
                if on_progress is not None:
                    seen = on_progress(progress)
                    if seen is not None:
                        await seen
                last = progress
        return _merged(last, job_id, self._method("MergeModel"), self.address)

    async def save_merged_model(
        self, job_id: str, directory: str | os.PathLike[str], *, timeout: float | None = None
    ) -> list[Path]:
        """`SchedulerClient.save_merged_model`."""
        request = sc.DownloadMergedModelRequest(job_id=job_id)
        return await _save_chunks(self.download_merged_model(request, timeout=timeout), directory)

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
        return await asyncio.to_thread(_write, path, response.filename, response.content)

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
        return await asyncio.to_thread(_write_loop, loop, loop_id, fmt, path)


def _merged(last: sc.MergeModelProgress | None, job_id: str, method: str, address: str) -> sc.MergeModelProgress:
    if last is None or not last.done:
        raise RlvrError(grpc.StatusCode.INTERNAL, f"the merge of job {job_id} ended without a result", method,
                        address)
    return last


def _write(path: str | os.PathLike[str] | None, name: str, content: bytes | str) -> Path:
    """Writes `content` to `path`, or into it as `name` when it is a folder (default: the current
    folder); returns the file written."""
    target = Path(path) if path is not None else Path.cwd()
    if target.is_dir():
        target = target / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_text(content, encoding="utf-8")
    else:
        target.write_bytes(content)
    return target


def _write_loop(loop: sc.Loop, loop_id: str, fmt: str | int, path: str | os.PathLike[str] | None) -> Path:
    from rlvr.clients.views.loops import export_text

    ext = "jsonl" if export_format(fmt) == sc.EXPORT_FORMAT_JSONL else "csv"
    return _write(path, f"loop-{loop.id or loop_id}-rounds.{ext}", export_text(loop, ext))


async def _save_chunks(stream: AsyncStream[cm.FileChunk], directory: str | os.PathLike[str]) -> list[Path]:
    """`save_file_chunks` over an async stream: a worker thread writes the files, pulling each
    chunk from the event loop as it needs it (no chunk waits in memory, no write blocks the loop)."""
    loop = asyncio.get_running_loop()
    done = cm.FileChunk()

    async def pull() -> cm.FileChunk:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return done

    def chunks() -> Iterator[cm.FileChunk]:
        while (chunk := asyncio.run_coroutine_threadsafe(pull(), loop).result()) is not done:
            yield chunk

    try:
        return await asyncio.to_thread(save_file_chunks, chunks(), directory)
    finally:
        stream.cancel()


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
