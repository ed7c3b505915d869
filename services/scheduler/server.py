"""gRPC glue of the scheduler: request in, validation and the job core, response out.

The cores (services/scheduler/jobs.py: jobs, with lifecycle.py, dispatch.py and ingest.py behind
it; actions.py: the RL Metrics card and the job actions; loops.py: automated training loops;
tracking.py: the experiment trackers' bridge) know nothing of gRPC: the trainers are reached
through workers.py's `GrpcWorkers`, and this module opens the store and the event bus at start (a
bad URL stops the service with one line naming the setting) and maps calls.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from prometheus_client.core import GaugeMetricFamily, Metric

from rlvr.common.auth import peer_auth
from rlvr.common.errors import Unavailable, map_errors
from rlvr.infra.events import EventBus
from rlvr.infra.store import Store
from rlvr.objectstore import object_store
from rlvr.peers.types import catalog_proto
from rlvr.services.common.prometheus import Metrics, status_gauge
from rlvr.services.common.server import GrpcService
from rlvr.services.scheduler.actions import JobActions
from rlvr.services.scheduler.benchmarks import GrpcBenchmarks
from rlvr.services.scheduler.environments import list_environments
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loops import LoopManager
from rlvr.services.scheduler.models import list_models_rpc
from rlvr.services.scheduler.rewards import GrpcRewards, Unreached
from rlvr.services.scheduler.samples import job_samples
from rlvr.services.scheduler.settings import SchedulerSettings
from rlvr.services.scheduler.tracking import TrackingBridge
from rlvr.services.scheduler.workers import GrpcWorkers
from rlvr.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("rlvr.scheduler")


@map_errors
class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self) -> None:
        self.jobs: JobManager | None = None
        self.actions: JobActions | None = None
        self.loops: LoopManager | None = None
        self.tracking: TrackingBridge | None = None

    def _loops(self) -> LoopManager:
        if self.loops is None:
            raise Unavailable("the scheduler is starting")
        return self.loops

    def _jobs(self) -> JobManager:
        if self.jobs is None:
            raise Unavailable("the scheduler is starting")
        return self.jobs

    def _tracking(self) -> TrackingBridge:
        if self.tracking is None:
            raise Unavailable("the scheduler is starting")
        return self.tracking

    def _actions(self) -> JobActions:
        if self.actions is None:
            raise Unavailable("the scheduler is starting")
        return self.actions

    async def CreateJob(self, request: scheduler_pb2.CreateJobRequest, context: grpc.aio.ServicerContext
                        ) -> scheduler_pb2.CreateJobResponse:  # noqa: N802
        self._tracking().check_targets(request.spec.tracking)
        resolved, job = await self._jobs().create(request.spec, request.dry_run)
        if job is not None:
            await self._tracking().job_created(job)
        resp = scheduler_pb2.CreateJobResponse(summary=resolved.summary, warnings=resolved.warnings,
                                               resolved_spec=resolved.spec)
        if job is not None:
            resp.job.CopyFrom(job)
        return resp

    async def GetJob(self, request, context):  # noqa: N802
        job = await self._jobs().get(request.id)
        job.tracking.extend(self._tracking().links(job))
        return job

    async def ListJobs(self, request, context):  # noqa: N802
        jobs, total = await self._jobs().list(request.status, request.limit, request.offset)
        return scheduler_pb2.ListJobsResponse(jobs=jobs, total=total)

    async def CancelJob(self, request, context):  # noqa: N802
        return await self._jobs().cancel(request.id)

    async def DeleteJob(self, request, context):  # noqa: N802
        return await self._actions().delete(request.id)

    async def WatchJob(self, request, context) -> AsyncIterator:  # noqa: N802
        async for event in self._jobs().watch(request.id, request.from_start):
            yield event

    async def GetJobMetrics(self, request, context):  # noqa: N802
        return await self._actions().metrics(request.job_id)

    async def GetJobSamples(self, request, context):  # noqa: N802
        return await job_samples(self._jobs(), request)

    async def DownloadAdapter(self, request, context) -> AsyncIterator:  # noqa: N802
        async for chunk in self._actions().adapter_chunks(request.job_id):
            yield chunk

    async def MergeModel(self, request, context) -> AsyncIterator:  # noqa: N802
        async for progress in self._actions().merge(request.job_id, request.dtype):
            yield progress

    async def DownloadMergedModel(self, request, context) -> AsyncIterator:  # noqa: N802
        async for chunk in self._actions().merged_chunks(request.job_id, request.dtype):
            yield chunk

    async def ExportHistory(self, request, context):  # noqa: N802
        return await self._actions().export(request.job_id, request.format)

    async def CreateLoop(self, request: scheduler_pb2.CreateLoopRequest, context: grpc.aio.ServicerContext
                         ) -> scheduler_pb2.CreateLoopResponse:  # noqa: N802
        self._tracking().check_targets(request.spec.job.tracking, "job.tracking")
        resolved, loop = await self._loops().create(request.spec, request.dry_run)
        resp = scheduler_pb2.CreateLoopResponse(resolved_spec=resolved.spec, summary=resolved.job.summary,
                                                warnings=resolved.warnings)
        if loop is not None:
            resp.loop.CopyFrom(loop)
        return resp

    async def GetLoop(self, request, context):  # noqa: N802
        return await self._loops().get(request.id)

    async def ListLoops(self, request, context):  # noqa: N802
        loops, total = await self._loops().list(request.status, request.limit, request.offset)
        return scheduler_pb2.ListLoopsResponse(loops=loops, total=total)

    async def StopLoop(self, request, context):  # noqa: N802
        return await self._loops().stop_loop(request.id)

    async def WatchLoop(self, request, context) -> AsyncIterator:  # noqa: N802
        async for loop in self._loops().watch(request.id):
            yield loop

    async def ListRewardFunctions(self, request, context):  # noqa: N802
        catalog = await self._jobs().rewards.catalog()
        if isinstance(catalog, Unreached):
            raise Unavailable(f"the reward service at {catalog.address} is unreachable ({catalog.why}); only the "
                              f"built-in rewards can be named now: {', '.join(catalog.rewards)}")
        return catalog_proto(catalog)

    async def ListEnvironments(self, request, context):  # noqa: N802
        return await list_environments()

    async def ListModels(self, request, context):  # noqa: N802
        return await list_models_rpc(self._jobs().model_roots)  # the roots CreateJob resolves bare names under

    async def TrackJob(self, request, context):  # noqa: N802
        links = await self._tracking().track(request.job_id, list(request.trackers))
        return scheduler_pb2.TrackJobResponse(links=links)


class SchedulerCore:
    """Opens the store and the bus, runs the job manager."""

    def __init__(self, settings: SchedulerSettings, servicer: SchedulerServicer) -> None:
        self.settings = settings
        self.servicer = servicer
        self.store: Store | None = None
        self.bus: EventBus | None = None
        self.metrics = Metrics()
        self.metrics.register(self._gauges)

    def _gauges(self) -> Iterator[Metric]:
        """The store's jobs and loops by status, read at each scrape (a query each: small)."""
        if self.store is None:
            return
        from rlvr.infra.schema import JobRow, LoopRow

        jobs = self.store.status_counts(JobRow)
        depth = GaugeMetricFamily("rlvr_scheduler_queue_depth", "Jobs QUEUED: waiting for a trainer worker")
        depth.add_metric([], float(jobs.get("QUEUED", 0)))
        yield depth
        yield status_gauge("rlvr_scheduler_jobs", "Jobs in the store, by status", JOB_STATUSES, jobs)
        yield status_gauge("rlvr_scheduler_loops", "Training loops in the store, by status", LOOP_STATUSES,
                           self.store.status_counts(LoopRow))

    async def start(self) -> None:
        from rlvr.services.common.startup import open_bus, open_store

        s = self.settings
        self.store = await open_store(s)
        self.bus = await open_bus(s, "scheduler")
        s.artifact_root.mkdir(parents=True, exist_ok=True)
        jobs = JobManager(self.store, self.bus, GrpcWorkers(s.trainer_addresses, auth=peer_auth(s)),
                          data_roots=s.data_roots, model_roots=s.model_roots,
                          rewards=GrpcRewards(s.reward_address, auth=peer_auth(s)),
                          rendezvous_port=s.rendezvous_port, node_lost_seconds=s.node_lost_seconds,
                          node_wait_seconds=s.node_wait_seconds)
        await jobs.start()
        loops = LoopManager(self.store, self.bus, jobs, GrpcBenchmarks(s.benchmark_address, auth=peer_auth(s)), s.artifact_root,
                            max_lora_rank=s.max_lora_rank, peer_wait_seconds=s.loop_peer_wait_seconds)
        await loops.start()
        tracking = TrackingBridge(jobs, self.bus, s.tracking_roots, s.artifact_root / "mlruns")
        await tracking.start()
        self.servicer.tracking = tracking
        self.servicer.jobs = jobs
        self.servicer.actions = JobActions(jobs, s.artifact_root,
                                           object_store(s.artifact_store, s.artifact_store_endpoint))
        self.servicer.loops = loops

    async def stop(self) -> None:
        if self.servicer.tracking is not None:
            await self.servicer.tracking.stop()
        if self.servicer.loops is not None:
            await self.servicer.loops.stop()
        if self.servicer.jobs is not None:
            await self.servicer.jobs.stop()
        if self.bus is not None:
            await self.bus.close()
        if self.store is not None:
            self.store.close()


def build_service(settings: SchedulerSettings) -> GrpcService:
    servicer = SchedulerServicer()
    core = SchedulerCore(settings, servicer)
    name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    return GrpcService([(scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, servicer, name)],
                       on_start=core.start, on_stop=core.stop, metrics=core.metrics)


def _names(enum: Any, prefix: str) -> tuple[str, ...]:
    return tuple(v.name.removeprefix(prefix) for v in enum.DESCRIPTOR.values if not v.name.endswith("UNSPECIFIED"))


JOB_STATUSES = _names(common_pb2.JobStatus, "JOB_STATUS_")
LOOP_STATUSES = _names(scheduler_pb2.LoopStatus, "LOOP_STATUS_")
