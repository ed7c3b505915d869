"""The trainer workers as the scheduler's cores see them, and the gRPC adapter that reaches them.

`Workers` is a small interface of plain Python (tests pass their own); `GrpcWorkers` is the real
one. The adapter is the only place where the scheduler reads the trainers' status codes: it turns
a failed call into one of the domain exceptions below, so dispatch.py, jobs.py and actions.py never
import grpc. The codes, by trainer.proto:

- UNAVAILABLE, DEADLINE_EXCEEDED -> `WorkerUnavailable`: not reached, or no answer in time. The
  call may still have taken effect (a StartJob whose answer was lost started the job).
- RESOURCE_EXHAUSTED on StartJob -> `WorkerBusy`: the worker runs another job. (StartJob is
  idempotent by job id: asked again for the job it runs, the worker answers OK.)
- NOT_FOUND on CancelJob -> `JobNotOnWorker`: the worker does not run that job.
- ALREADY_EXISTS on MergeAdapter -> `MergeOutputExists`: the output folder is there already.
- NOT_FOUND on FetchFolder -> `FolderNotOnWorker`: no such folder under its artifact root.
- INVALID_ARGUMENT, FAILED_PRECONDITION -> `WorkerRejected`: the request cannot succeed there as
  it is; asking again will not help.
- any other code (INTERNAL, ...) -> `WorkerFailed`: the worker failed the call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from rlvr.common.auth import ChannelAuth
from rlvr.jobspec import job_status_name
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncTrainerClient
from rlvr.peers.folders import relay_folder
from rlvr.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc

log = logging.getLogger("rlvr.scheduler.workers")


# ---------------------------------------------------------------------------- domain


class WorkerError(Exception):
    """A call to a trainer worker failed; the message is one readable line (the trainer's own
    words where it gave any)."""


class WorkerUnavailable(WorkerError):
    """The worker was not reached or did not answer in time: the call's outcome is unknown."""


class WorkerBusy(WorkerError):
    """StartJob refused because the worker runs another job."""


class JobNotOnWorker(WorkerError):
    """The worker does not run (and did not last run) that job."""


class MergeOutputExists(WorkerError):
    """MergeAdapter refused: its output folder exists already."""


class FolderNotOnWorker(WorkerError):
    """FetchFolder: the worker has no such folder (or file of it) under its artifact root."""


class WorkerRejected(WorkerError):
    """The worker refused the request: a bad argument or an unmet precondition."""


class WorkerFailed(WorkerError):
    """The worker failed the call (INTERNAL or another code it does not answer on purpose)."""


@dataclass
class WorkerState:
    address: str
    name: str
    busy: bool
    job_id: str
    last_job_id: str = ""
    last_status: str = ""
    last_error: str = ""
    last_adapter: common_pb2.AdapterRef | None = None
    # The last job's process ended without a result (killed, out of memory) and not on a cancel:
    # resumable (dispatch.py); its last_status reads FAILED.
    last_lost: bool = False
    # What it can run (trainer.proto WorkerCapabilities); None from a trainer that does not say,
    # which is then taken to fit any job (fit.py).
    capabilities: trainer_pb2.WorkerCapabilities | None = None

    def has_job(self, job_id: str) -> bool:
        """The worker runs the job, or ran it last (it may have ended already)."""
        return bool(job_id) and job_id in (self.job_id, self.last_job_id)


class Workers(Protocol):
    """What the job core needs of the trainer workers."""

    @property
    def addresses(self) -> Sequence[str]: ...

    async def status(self, address: str) -> WorkerState | None:
        """The worker's state; None when it cannot be reached."""
        ...

    async def start(self, address: str, job_id: str, spec: common_pb2.JobSpec, total_steps: int,
                    resume: bool = False, stored_steps: int = 0, init_adapter_source: str = "",
                    resume_source: str = "", node_rank: int = 0, rendezvous_endpoint: str = "") -> str:
        """Starts the job there (OK again for the job it already runs); returns the worker's name.
        `resume`: from the job's last checkpoint there (StartJobRequest.resume), not publishing the
        `stored_steps` again; the `..._source` workers hold the init_adapter and the resumed job's
        folder (StartJobRequest, the worker fetches them); `node_rank`, `rendezvous_endpoint`: its
        node of a job of several (advanced.num_nodes). Raises WorkerBusy, WorkerUnavailable (outcome unknown), WorkerRejected
        or WorkerFailed."""
        ...

    async def cancel(self, address: str, job_id: str) -> common_pb2.AdapterRef | None:
        """Stops the job there; its partial adapter, if a step finished. Raises JobNotOnWorker,
        WorkerUnavailable, WorkerRejected or WorkerFailed."""
        ...


# ---------------------------------------------------------------------------- gRPC


_UNKNOWN_OUTCOME = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def worker_error(e: grpc.aio.AioRpcError | RlvrError, address: str, method: str) -> WorkerError:
    """The domain exception of a failed call to `method` on the worker at `address`."""
    if isinstance(e, RlvrError):
        code, details = e.code, e.details or e.code.name
    else:
        code, details = e.code(), e.details() or e.code().name
    if code in _UNKNOWN_OUTCOME:
        return WorkerUnavailable(f"trainer {address} did not answer {method}: {code.name}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and method == "StartJob":
        return WorkerBusy(details)
    if code == grpc.StatusCode.NOT_FOUND and method == "CancelJob":
        return JobNotOnWorker(details)
    if code == grpc.StatusCode.ALREADY_EXISTS and method == "MergeAdapter":
        return MergeOutputExists(details)
    if code == grpc.StatusCode.NOT_FOUND and method == "FetchFolder":
        return FolderNotOnWorker(details)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return WorkerRejected(details)
    return WorkerFailed(f"{code.name}: {details}")


class GrpcWorkers:
    """Trainer workers over gRPC (deadlines and retries from rlvr.common.client; StartJob and
    CancelJob are not retried by the channel, see IDEMPOTENT_METHODS)."""

    def __init__(self, addresses: Sequence[str], start_timeout_s: float = 60.0, auth: ChannelAuth | None = None
                 ) -> None:
        from rlvr.common.client import make_channel

        self.addresses = list(addresses)
        self.start_timeout_s = start_timeout_s
        channels = {a: make_channel(a, aio=True, auth=auth) for a in addresses}
        self._stubs = {a: trainer_pb2_grpc.TrainerServiceStub(c) for a, c in channels.items()}
        self._clients = {a: AsyncTrainerClient(c) for a, c in channels.items()}
        self._down_since: dict[str, float] = {}  # unreachable workers -> since (monotonic): one log line per outage

    async def status(self, address: str) -> WorkerState | None:
        try:
            s = await self._stubs[address].GetWorkerStatus(trainer_pb2.GetWorkerStatusRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            if address not in self._down_since:
                self._down_since[address] = time.monotonic()
                log.warning("worker %s unreachable: %s (said once until it answers again)", address, e.code().name)
            return None
        since = self._down_since.pop(address, None)
        if since is not None:
            log.warning("worker %s answers again, after %.0f s unreachable", address, time.monotonic() - since)
        last = job_status_name(s.last_job_status) if s.last_job_status else ""
        return WorkerState(address=address, name=s.worker, busy=s.busy, job_id=s.job_id,
                           last_job_id=s.last_job_id, last_status=last, last_error=s.last_job_error,
                           last_adapter=s.last_job_adapter if s.last_job_adapter.name else None,
                           last_lost=s.last_job_lost,
                           capabilities=s.capabilities if s.HasField("capabilities") else None)

    async def start(self, address: str, job_id: str, spec: common_pb2.JobSpec, total_steps: int,
                    resume: bool = False, stored_steps: int = 0, init_adapter_source: str = "",
                    resume_source: str = "", node_rank: int = 0, rendezvous_endpoint: str = "") -> str:
        try:
            resp = await self._stubs[address].StartJob(
                trainer_pb2.StartJobRequest(job_id=job_id, spec=spec, total_steps=total_steps, resume=resume,
                                            stored_steps=stored_steps, init_adapter_source=init_adapter_source,
                                            resume_source=resume_source, node_rank=node_rank,
                                            rendezvous_endpoint=rendezvous_endpoint),
                timeout=self.start_timeout_s)
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "StartJob") from None
        return resp.worker

    async def cancel(self, address: str, job_id: str) -> common_pb2.AdapterRef | None:
        try:
            resp = await self._stubs[address].CancelJob(trainer_pb2.TrainerCancelJobRequest(job_id=job_id),
                                                        timeout=60)
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "CancelJob") from None
        return resp.adapter if resp.adapter.name else None

    async def merge(self, address: str, request: trainer_pb2.MergeAdapterRequest
                    ) -> AsyncGenerator[trainer_pb2.MergeProgress, None]:
        """MergeAdapter on one worker: its progress stream (the call's deadline is the method's
        default, an hour). Closing the iteration (`contextlib.aclosing`) cancels the call, and the
        worker stops its merge process."""
        from rlvr.common.client import deadline_for

        call = self._stubs[address].MergeAdapter(
            request, timeout=deadline_for("rlvr.v1.TrainerService/MergeAdapter"))
        try:
            async for progress in call:
                yield progress
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "MergeAdapter") from None
        finally:
            call.cancel()

    async def fetch(self, address: str, path: str, files: Sequence[str] | None = None
                    ) -> AsyncGenerator[common_pb2.FileChunk, None]:
        """The folder `path` under that worker's artifact root as FetchFolder streams it, resumed
        where it broke off after UNAVAILABLE (rlvr.peers.folders.relay_folder). Raises
        FolderNotOnWorker, WorkerUnavailable, WorkerRejected or WorkerFailed."""
        client = self._clients[address]
        client.address = address
        try:
            async for chunk in relay_folder(client, path, files):
                yield chunk
        except RlvrError as e:
            raise worker_error(e, address, "FetchFolder") from None
