"""gRPC glue of the benchmark service: request in, the evaluation manager, response out.

The core (evaluations.py, planning.py, runner.py) knows nothing of gRPC or NATS. This module
opens the store, the event bus and the channels to the rollout and reward services at start (a bad
URL stops the service with one line naming the setting) and maps calls onto the manager.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import grpc
from prometheus_client.core import GaugeMetricFamily, Metric

from rlvr.common.auth import peer_auth
from rlvr.common.errors import Unavailable, map_errors
from rlvr.services.benchmark.evaluations import EvaluationManager
from rlvr.services.benchmark.settings import BenchmarkSettings
from rlvr.services.common.prometheus import Metrics, status_gauge
from rlvr.services.common.server import GrpcService
from rlvr.v1 import benchmark_pb2, benchmark_pb2_grpc

if TYPE_CHECKING:  # imported by start()
    from rlvr.infra.events import EventBus
    from rlvr.infra.store import Store
    from rlvr.services.benchmark.peers import ServicePeers

log = logging.getLogger("rlvr.benchmark")


@map_errors
class BenchmarkServicer(benchmark_pb2_grpc.BenchmarkServiceServicer):
    def __init__(self) -> None:
        self.manager: EvaluationManager | None = None

    def _manager(self) -> EvaluationManager:
        if self.manager is None:
            raise Unavailable("the benchmark service is starting")
        return self.manager

    async def ListBenchmarks(self, request: benchmark_pb2.ListBenchmarksRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> benchmark_pb2.ListBenchmarksResponse:
        return benchmark_pb2.ListBenchmarksResponse(benchmarks=await self._manager().list_benchmarks())

    async def RunEvaluation(self, request: benchmark_pb2.RunEvaluationRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> benchmark_pb2.Evaluation:
        return await self._manager().run(request)

    async def GetEvaluation(self, request: benchmark_pb2.GetEvaluationRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> benchmark_pb2.Evaluation:
        return await self._manager().get(request.id)

    async def ListEvaluations(self, request: benchmark_pb2.ListEvaluationsRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> benchmark_pb2.ListEvaluationsResponse:
        return await self._manager().list(request.benchmark, request.limit, request.offset)

    async def CancelEvaluation(self, request: benchmark_pb2.CancelEvaluationRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext) -> benchmark_pb2.Evaluation:
        return await self._manager().cancel(request.id)

    async def DeleteEvaluation(self, request: benchmark_pb2.DeleteEvaluationRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext) -> benchmark_pb2.DeleteEvaluationResponse:
        return await self._manager().delete(request.id)

    async def GetEvaluationResults(self, request: benchmark_pb2.GetEvaluationResultsRequest,  # noqa: N802
                                   context: grpc.aio.ServicerContext) -> benchmark_pb2.GetEvaluationResultsResponse:
        return await self._manager().results(request.id, request.only_wrong, request.offset, request.limit)

    async def WatchEvaluation(self, request: benchmark_pb2.WatchEvaluationRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> AsyncIterator[benchmark_pb2.EvaluationEvent]:
        async for event in self._manager().watch(request.id):
            yield event

    async def GetLeaderboard(self, request: benchmark_pb2.GetLeaderboardRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> benchmark_pb2.GetLeaderboardResponse:
        return await self._manager().leaderboard(request.benchmark, request.score_column, request.limit,
                                                 request.question_set)


class BenchmarkCore:
    """Opens the store, the bus and the peer channels; runs the evaluation manager."""

    def __init__(self, settings: BenchmarkSettings, servicer: BenchmarkServicer) -> None:
        self.settings = settings
        self.servicer = servicer
        self.store: Store | None = None
        self.bus: EventBus | None = None
        self.peers: ServicePeers | None = None
        self.metrics = Metrics()
        self.metrics.register(self._gauges)

    def _gauges(self) -> Iterator[Metric]:
        """The store's evaluations by status, read at each scrape."""
        if self.store is None:
            return
        from rlvr.infra.schema import EvaluationRow

        counts = self.store.status_counts(EvaluationRow)
        running = GaugeMetricFamily("rlvr_benchmark_evaluations_running", "Evaluations RUNNING")
        running.add_metric([], float(counts.get("RUNNING", 0)))
        yield running
        statuses = [n.removeprefix("EVALUATION_STATUS_") for n in (v.name for v in benchmark_pb2.EvaluationStatus.DESCRIPTOR.values)
                    if not n.endswith("UNSPECIFIED")]
        yield status_gauge("rlvr_benchmark_evaluations", "Evaluations in the store, by status", statuses, counts)

    async def start(self) -> None:
        from rlvr.services.benchmark.events import BusEvents
        from rlvr.services.benchmark.peers import ServicePeers
        from rlvr.services.common.startup import open_bus, open_store

        s = self.settings
        self.store = await open_store(s)
        self.bus = await open_bus(s, "benchmark")
        # Channels connect lazily: a rollout service still loading its model is not a start failure.
        self.peers = ServicePeers(s.rollout_replicas(), s.reward_address, generate_timeout_s=s.generate_timeout_seconds,
                                  score_timeout_s=s.score_timeout_seconds, auth=peer_auth(s),
                                  trainer_addresses=s.trainer_addresses, rollout_wait_s=s.rollout_wait_seconds,
                                  reward_wait_s=s.reward_wait_seconds)
        manager = EvaluationManager(self.store, self.peers, BusEvents(self.bus), batch_size=s.batch_size,
                                    max_concurrent=s.max_concurrent, prompt_style=s.prompt_style,
                                    adapter_roots=s.adapter_roots)
        await manager.start()
        self.servicer.manager = manager

    async def stop(self) -> None:
        if self.servicer.manager is not None:
            await self.servicer.manager.stop()
        if self.peers is not None:
            await self.peers.close()
        if self.bus is not None:
            await self.bus.close()
        if self.store is not None:
            self.store.close()


def build_service(settings: BenchmarkSettings) -> GrpcService:
    servicer = BenchmarkServicer()
    core = BenchmarkCore(settings, servicer)
    name = benchmark_pb2.DESCRIPTOR.services_by_name["BenchmarkService"].full_name
    return GrpcService([(benchmark_pb2_grpc.add_BenchmarkServiceServicer_to_server, servicer, name)],
                       on_start=core.start, on_stop=core.stop, metrics=core.metrics)
