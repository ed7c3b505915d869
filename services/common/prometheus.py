"""Prometheus metrics for operators: every service's RPCs, and each service's own gauges (docs/metrics.md).

Each running service owns one `Metrics`: a `CollectorRegistry` of its own (never the process-wide
default, so that services run side by side in one process, as the tests do, keep their series
apart), the per-RPC series that `MetricsInterceptor` fills, and whatever series the service's core
adds through `counter`/`gauge`/`histogram`. `ServiceRunner` serves it at http://HOST:PORT/metrics
when the service's `metrics_port` is set (prometheus_client's own HTTP server, on a thread), and
serves nothing otherwise: the series still count, for nobody.

Names follow Prometheus' conventions: an `rlvr_` prefix, `_total` on counters, base units
(`_seconds`), and labels for what varies (method, status code, job status).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

log = logging.getLogger("rlvr.metrics")
# No `_created` series beside each counter and histogram: a start time per series is noise on a dashboard.
disable_created_metrics()

# RPC latency buckets: a health check (sub-millisecond) to a long Score batch or Generate call.
RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RPC_LABELS = ("grpc_service", "grpc_method", "grpc_code")


class Metrics:
    """One service's registry and its per-RPC series; `counter`/`gauge`/`histogram` add the service's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.handled = self.counter("rlvr_grpc_server_handled_total",
                                    "RPCs completed, by service, method and status code", RPC_LABELS)
        self.handling = self.histogram("rlvr_grpc_server_handling_seconds",
                                       "Time from an RPC's start to its status, by service, method and status code",
                                       RPC_LABELS, buckets=RPC_BUCKETS)
        self._http: Any = None  # prometheus_client's WSGI server, once serving
        self.port = 0

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS) -> Histogram:
        return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

    def register(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Adds series computed at each scrape (FunctionCollector)."""
        self.registry.register(FunctionCollector(collect))

    def observe_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        service, _, name = method.lstrip("/").rpartition("/")
        labels = (service, name, code.name)
        self.handled.labels(*labels).inc()
        self.handling.labels(*labels).observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Serves /metrics on host:port (0 = a free port); returns the port."""
        self._http, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = int(self._http.server_port)
        return self.port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class FunctionCollector:
    """Series computed when scraped (a count in the store, a state in memory): `collect` returns
    them; registered on a service's registry with `Metrics.register`."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._collect())
        except Exception as e:  # a scrape must answer even when the store is away: the series go missing
            log.warning("metrics not collected: %s", e)
            return []


def status_gauge(name: str, doc: str, statuses: Iterable[str], counts: dict[str, int]) -> GaugeMetricFamily:
    """One gauge labelled by status, every status present (0 when none is in it)."""
    family = GaugeMetricFamily(name, doc, labels=["status"])
    for status in statuses:
        family.add_metric([status], float(counts.get(status, 0)))
    return family


def _code(context: Any, error: BaseException | None) -> grpc.StatusCode:
    """The status the call ends with: what the handler set (or aborted with), else OK, or UNKNOWN
    for an exception grpc turns into one, CANCELLED for a call the client gave up on."""
    import asyncio

    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # grpc.aio keeps the numeric value once a handler aborted
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    return grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN


def _timed(behaviour: Callable[..., Any], observe: Callable[[grpc.StatusCode, float], None]) -> Callable[..., Any]:
    """The behaviour, timed to its end; all four shapes (coroutine, async generator, function,
    generator), as a handler may be any of them."""
    if inspect.isasyncgenfunction(behaviour):
        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            t0, error = time.perf_counter(), None
            try:
                async for item in behaviour(request, context):
                    yield item
            except BaseException as e:
                error = e
                raise
            finally:
                observe(_code(context, error), time.perf_counter() - t0)

        return stream
    if inspect.iscoroutinefunction(behaviour):
        async def unary(request: Any, context: Any) -> Any:
            t0, error = time.perf_counter(), None
            try:
                return await behaviour(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                observe(_code(context, error), time.perf_counter() - t0)

        return unary
    if inspect.isgeneratorfunction(behaviour):
        def sync_stream(request: Any, context: Any) -> Iterator[Any]:
            t0, error = time.perf_counter(), None
            try:
                yield from behaviour(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                observe(_code(context, error), time.perf_counter() - t0)

        return sync_stream

    def sync_unary(request: Any, context: Any) -> Any:
        t0, error = time.perf_counter(), None
        try:
            return behaviour(request, context)
        except BaseException as e:
            error = e
            raise
        finally:
            observe(_code(context, error), time.perf_counter() - t0)

    return sync_unary


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every RPC by method and final status code (rlvr_grpc_server_handled_total,
    rlvr_grpc_server_handling_seconds). It runs first, so calls the auth check refuses count too."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED itself
            return handler
        method = handler_call_details.method

        def observe(code: grpc.StatusCode, seconds: float) -> None:
            self.metrics.observe_rpc(method, code, seconds)

        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        return handler._replace(**{kind: _timed(getattr(handler, kind), observe)})
