"""gRPC glue of the trainer service: requests in, validation, the worker core, responses out.

The servicer holds no training logic: `JobSupervisor` (worker.py) runs each job in its own process,
and MergeAdapter runs `rlvr.services.trainer.job.merge` in a child process whose JSON progress lines are
streamed back. Errors follow rlvr.common.errors (`@map_errors`): a quantization the host cannot
run is FAILED_PRECONDITION, an unknown job NOT_FOUND, a bad field INVALID_ARGUMENT. Two answers
have codes of their own, so that the scheduler reads them by code and never by text: StartJob of
another job while one runs is RESOURCE_EXHAUSTED (StartJob of the job that runs is OK: it is
idempotent by job id), and MergeAdapter onto an existing output folder is ALREADY_EXISTS.
FetchFolder streams a folder under the artifact root (rlvr.transfer.folder_chunks) to a host that
does not share the disk; a path outside the root is INVALID_ARGUMENT, a folder not there NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from rlvr.common.errors import InvalidArgument, NotFound, RlvrServiceError, bounded, map_errors, shown
from rlvr.jobspec import MAX_PATH_CHARS, merge_dtype
from rlvr.objectstore import StoreError, store_key
from rlvr.peers.base import in_thread
from rlvr.services.common.prometheus import Metrics
from rlvr.services.common.server import GrpcService
from rlvr.services.trainer.capabilities import worker_capabilities
from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.process.worker import JobSupervisor, WorkerBusy
from rlvr.services.trainer.settings import TrainerSettings
from rlvr.transfer import folder_chunks, list_files
from rlvr.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc

log = logging.getLogger("rlvr.trainer.server")


class Busy(RlvrServiceError):
    """This worker runs another job."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class AlreadyExists(RlvrServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


@map_errors
class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, settings: TrainerSettings, supervisor: JobSupervisor) -> None:
        self.settings = settings
        self.supervisor = supervisor

    async def StartJob(
        self, request: trainer_pb2.StartJobRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.StartJobResponse:
        try:
            started = await self.supervisor.start(request)
        except WorkerBusy as e:
            raise Busy(str(e)) from None
        if not started:
            log.info("StartJob of job %s again: already running it", request.job_id)
        return trainer_pb2.StartJobResponse(job_id=request.job_id, worker=self.settings.worker_name)

    async def CancelJob(
        self, request: trainer_pb2.TrainerCancelJobRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.TrainerCancelJobResponse:
        adapter = await self.supervisor.cancel(request.job_id)
        response = trainer_pb2.TrainerCancelJobResponse(job_id=request.job_id)
        if adapter is not None:
            response.adapter.CopyFrom(adapter)
        return response

    async def GetWorkerStatus(
        self, request: trainer_pb2.GetWorkerStatusRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.WorkerStatus:
        return self.supervisor.status()

    async def MergeAdapter(
        self, request: trainer_pb2.MergeAdapterRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[trainer_pb2.MergeProgress]:
        root = Path(self.settings.artifact_root)
        name = artifacts.check_name(request.output_name, "output_name")
        if not request.adapter_path:
            raise InvalidArgument("adapter_path: required (a PEFT adapter folder under the artifact root)")
        adapter = artifacts.under_root(root, request.adapter_path, "adapter_path")
        missing = [f for f in artifacts.ADAPTER_FILES if not (adapter / f).is_file()]
        if missing:
            raise InvalidArgument(f"adapter_path: {shown(_relative(adapter, root))} is not a PEFT adapter folder "
                                  f"(missing {', '.join(missing)})")
        base_model = request.base_model or _adapter_base(adapter)
        dtype = merge_dtype(request.dtype)
        output = root / "merged" / name
        if output.exists():
            raise AlreadyExists(f"output_name: {name!r} already exists among the merged models; pick another")
        output.parent.mkdir(parents=True, exist_ok=True)
        async for progress in _run_merge(base_model, adapter, output, dtype):
            store = self.supervisor.store
            if progress.done and store is not None:  # in the store before it is announced
                try:
                    await asyncio.to_thread(store.put_folder, output, store_key(root, output))
                except (StoreError, OSError, ImportError) as e:
                    log.error("could not put the merged model %s into %s: %s", output.name, store.url, e)
            yield progress

    async def FetchFolder(
        self, request: trainer_pb2.FetchFolderRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.FileChunk]:
        root = Path(self.settings.artifact_root)
        if not request.path:
            raise InvalidArgument("path: required (a folder under the artifact root, or a path relative to it)")
        for field, value in (("path", request.path), ("resume_path", request.resume_path),
                             *((f"files[{i}]", f) for i, f in enumerate(request.files)),
                             *((f"have[{i}].path", d.path) for i, d in enumerate(request.have))):
            bounded(field, value, MAX_PATH_CHARS)
        try:
            folder = artifacts.under_root(root, request.path, "path")
            for i, name in enumerate(request.files):
                artifacts.under_root(folder, name, f"files[{i}]")
            is_dir = folder.is_dir()
        except OSError as e:  # a name the file system refuses (too long, ...)
            raise InvalidArgument(f"path: not a usable path ({e.strerror})") from None
        if not is_dir:
            raise NotFound(f"path: {shown(_relative(folder, root))} is not a folder under the artifact root of "
                           f"worker {self.settings.worker_name}")
        have = {d.path: d.sha256 for d in request.have}
        try:
            files = list(request.files) or await asyncio.to_thread(_shareable_files, folder, root)
            chunks = await asyncio.to_thread(folder_chunks, folder, files, have, request.resume_path,
                                             request.resume_offset)
        except FileNotFoundError:
            raise NotFound(f"files: a file asked for is not in {shown(_relative(folder, root))}") from None
        async for chunk in in_thread(chunks):
            yield chunk


def _relative(path: Path, root: Path) -> str:
    """`path` as a client may see it: relative to the artifact root (no server folder in messages)."""
    return str(path.relative_to(root.resolve())) if path.is_relative_to(root.resolve()) else path.name


def _shareable_files(folder: Path, root: Path) -> list[str]:
    """The files of `folder` FetchFolder sends when not asked for some: all but a job's
    settings.json (the worker's settings, with the service token: worker.py writes it 0600)."""
    jobs = root.resolve() / "jobs"
    return [rel for rel, path in list_files(folder)
            if not (path.name == "settings.json" and path.resolve().parent.parent == jobs)]


def _adapter_base(adapter: Path) -> str:
    """The base model an adapter was trained on, from its adapter_config.json."""
    try:
        base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    except (OSError, ValueError):
        base = ""
    if not base:
        raise InvalidArgument("base_model: required (the adapter's config does not name its base model)")
    return str(base)


async def _run_merge(base_model: str, adapter: Path, output: Path, dtype: str = "auto"
                     ) -> AsyncIterator[trainer_pb2.MergeProgress]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlvr.services.trainer.job.merge", "--base-model", base_model,
        "--adapter", str(adapter), "--output", str(output), "--dtype", dtype,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=None,
    )
    assert process.stdout is not None
    error = ""
    try:
        async for raw in process.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a library printing to stdout
            if "error" in line:
                error = line["error"]
                continue
            done = "path" in line
            yield trainer_pb2.MergeProgress(
                stage=line["stage"], fraction=line["fraction"], done=done,
                path=line.get("path", ""), size_bytes=line.get("size_bytes", 0),
            )
        code = await process.wait()
    finally:
        if process.returncode is None:  # the client went away: stop the merge
            process.kill()
            await process.wait()
    if code != 0:
        raise RuntimeError(f"merge failed: {error or f'exit code {code}'}")


def build_service(settings: TrainerSettings) -> GrpcService:
    name = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name
    capabilities = worker_capabilities(settings.model_roots)
    log.info("worker %s: %s, %d GPU(s), %d core(s), precisions %s, quantizations %s, %d cached base model(s)",
             settings.worker_name, capabilities.device_kind, len(capabilities.gpus), capabilities.cpu_cores,
             ",".join(capabilities.precisions), ",".join(capabilities.quantizations),
             len(capabilities.cached_models))
    supervisor = JobSupervisor(settings, capabilities)
    servicer = TrainerServicer(settings, supervisor)
    metrics = Metrics()
    metrics.register(_WorkerCollector(supervisor).collect)
    return GrpcService(
        [(trainer_pb2_grpc.add_TrainerServiceServicer_to_server, servicer, name)],
        on_start=supervisor.warm,
        on_stop=supervisor.close,
        metrics=metrics,
    )


class _WorkerCollector:
    """The worker's gauges, read when scraped: busy or not, and the time of the steps it ran."""

    def __init__(self, supervisor: JobSupervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        busy = GaugeMetricFamily("rlvr_trainer_busy", "1 while this trainer worker runs (or starts) a job, else 0")
        busy.add_metric([], float(self.supervisor.status().busy))
        steps, seconds = self.supervisor.step_time()
        yield busy
        yield SummaryMetricFamily("rlvr_trainer_step_seconds", "Optimizer steps this worker ran and their wall time "
                                  "(generate, score, train, sync); rate(_sum)/rate(_count) is the step time",
                                  count_value=steps, sum_value=seconds)
