"""The service bootstrap every rlvr service shares.

A service is a small object (see `Service`) that registers its servicers on a grpc.aio server and
starts/stops its core. `run_service` does the rest, the same way for all five services:

1. settings from flags, environment and config file; a bad one exits 2 with one line;
2. the gRPC port is bound first (with SO_REUSEPORT off, so a port in use is an error, not a
   silent second listener) so that a clash fails in milliseconds, not after a model load;
3. the server starts with the standard health service (NOT_SERVING) and server reflection, then
   the core starts (heavy imports happen here, never before flags are parsed), then health turns
   SERVING;
4. on SIGTERM/SIGINT health turns NOT_SERVING, in-flight calls get `grace_seconds` to finish, the
   core stops, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rlvr.common.auth import (
    HOW_TO_SEND,
    OPEN_SERVICES,
    SERVICE_ONLY,
    TokenTable,
    bearer,
    check_exposure,
    server_tls,
    token_table,
)
from rlvr.common.errors import InvalidArgument, abort_with
from rlvr.common.logs import configure_logging
from rlvr.common.settings import ServiceSettings, SettingsError, load_settings, setting_label
from rlvr.services.common.prometheus import Metrics, MetricsInterceptor

log = logging.getLogger("rlvr.server")

SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
]


class StartupError(RuntimeError):
    """The core could not start; the message is one readable line naming the setting."""


class Service(Protocol):
    """What a service provides to the bootstrap."""

    service_names: Sequence[str]
    """Full names of the gRPC services it serves, e.g. "rlvr.v1.RewardService"."""

    def register(self, server: grpc.aio.Server) -> None:
        """Adds the servicers to the server (cheap: no model loads here)."""

    async def start(self) -> None:
        """Starts the core (model loads, connections). Raise StartupError or SettingsError."""

    async def stop(self) -> None:
        """Releases the core after the server has stopped taking calls."""


def _port_error(settings: ServiceSettings) -> str:
    return (f"{setting_label(settings, 'port')} = {settings.port}: cannot listen on {settings.address} "
            "(in use by another process, or the host is not an address of this machine)")


def _check_port_free(settings: ServiceSettings) -> None:
    """Binds a plain socket first, so a clash is one clear line rather than gRPC core's log."""
    if settings.port == 0:
        return
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((settings.host, settings.port))
        except OSError:
            raise SettingsError(_port_error(settings)) from None


class _Undecodable:
    """What a request deserializer returns in place of bytes that do not parse: the handler answers
    INVALID_ARGUMENT naming the field (grpc's default is UNKNOWN "Unexpected <class DecodeError>")."""

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _checked_deserializer(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            from rlvr.common.wire import undecodable_field

            message_class = getattr(deserializer, "__self__", None)
            descriptor = getattr(message_class, "DESCRIPTOR", None)
            if descriptor is None:
                return _Undecodable(InvalidArgument(f"request: {len(data)} bytes that do not parse"))
            field, why = undecodable_field(data, descriptor)
            return _Undecodable(InvalidArgument(f"{field}: {why} (the request's {len(data)} bytes do not parse "
                                                f"as {descriptor.full_name})"))

    return deserialize


async def _checked_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Undecodable):
            await abort_with(context, request.error)
        yield request


def _unary_in(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A unary-request behaviour (coroutine, or async generator for server streaming)."""
    import inspect

    if inspect.isasyncgenfunction(behaviour):
        async def stream_out(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await abort_with(context, request.error)
            async for item in behaviour(request, context):
                yield item

        return stream_out

    async def unary_out(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await abort_with(context, request.error)
        return await behaviour(request, context)

    return unary_out


def _sync_unary_in(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A unary-request behaviour that is a plain function (or a generator, for server streaming)."""
    import inspect

    def refuse(request: Any, context: Any) -> None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request.error))  # raises

    if inspect.isgeneratorfunction(behaviour):
        def stream_out(request: Any, context: Any) -> Any:
            if isinstance(request, _Undecodable):
                refuse(request, context)
                return
            yield from behaviour(request, context)

        return stream_out

    def unary_out(request: Any, context: Any) -> Any:
        if isinstance(request, _Undecodable):
            return refuse(request, context)
        return behaviour(request, context)

    return unary_out


def _stream_in(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    import inspect

    if inspect.isasyncgenfunction(behaviour):
        async def stream_out(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behaviour(_checked_stream(requests, context), context):
                yield item

        return stream_out

    async def unary_out(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(_checked_stream(requests, context), context)

    return unary_out


class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers INVALID_ARGUMENT, through the project's error mapping, for request bytes that do not
    parse as the method's request message, naming the field where it can (a string that is not
    UTF-8, bytes that break off inside a field)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        kind = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        behaviours = {k: getattr(handler, k) for k in kind if getattr(handler, k) is not None}
        if len(behaviours) != 1:
            return handler
        (name, behaviour), = behaviours.items()
        import inspect

        if not (inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)):
            # A sync behaviour (the standard health servicer's List, say) runs on a thread pool;
            # unary requests are checked before it runs.
            if not name.startswith("unary"):
                return handler
            wrapped = _sync_unary_in(behaviour)
        else:
            wrapped = _unary_in(behaviour) if name.startswith("unary") else _stream_in(behaviour)
        return handler._replace(request_deserializer=_checked_deserializer(handler.request_deserializer),
                                **{name: wrapped})


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour replaced by one that answers `code` at once, reading nothing:
    the request's bytes are not even parsed. Logged (the message names no token)."""
    log.warning("call refused (%s): %s", code.name, message)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(code, message)
        yield  # pragma: no cover (abort raises)

    kinds = {"unary_unary": unary, "stream_unary": unary, "unary_stream": stream, "stream_stream": stream}
    name = next(k for k in kinds if getattr(handler, k) is not None)
    return handler._replace(request_deserializer=None, **{name: kinds[name]})


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token auth on every RPC but health and reflection (rlvr.common.auth): no token or an
    unknown one answers UNAUTHENTICATED, a user token on an internal RPC (SERVICE_ONLY)
    PERMISSION_DENIED. Never echoes a token."""

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method.lstrip("/")
        if handler is None or method.partition("/")[0] in OPEN_SERVICES:
            return handler
        token = bearer(handler_call_details.invocation_metadata)
        if token is None:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"{method} needs a token: {HOW_TO_SEND}")
        if not token:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"{method}: the authorization metadata must read `Bearer <token>`")
        role = self.tokens.role_of(token)
        if role is None:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"{method}: the token given is not valid for this service; {HOW_TO_SEND}")
        if method in SERVICE_ONLY and role != "service":
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                            f"{method} is internal: it needs role service, and this token has role {role} "
                            f"({SERVICE_ONLY[method]})")
        return handler


class HealthServicer(health.aio.HealthServicer):
    """The standard health service, with `List` (which grpcio's asyncio servicer leaves
    unimplemented): every service name this server reports, with its status."""

    async def List(  # noqa: N802 (gRPC method name)
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()})


class ServiceRunner:
    """Runs one Service on a grpc.aio server; usable in-process by tests as an async context."""

    def __init__(self, service: Service, settings: ServiceSettings) -> None:
        self.service = service
        self.settings = settings
        # The server and health servicer bind to the running event loop: made in start().
        self.server: grpc.aio.Server | None = None
        self.health: HealthServicer | None = None
        self.port = 0
        # The plaintext health-only server (settings.health_port), for probes that cannot speak TLS.
        self.health_server: grpc.aio.Server | None = None
        self.health_port = 0
        # The service's own metrics (GrpcService.metrics), else a registry for the RPC series alone.
        self.metrics: Metrics = getattr(service, "metrics", None) or Metrics()

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    async def start(self) -> None:
        tokens = token_table(self.settings)
        check_exposure(self.settings, tokens)
        tls = server_tls(self.settings)
        interceptors: list[grpc.aio.ServerInterceptor] = [DecodeErrorInterceptor()]
        if tokens.enabled:
            interceptors.insert(0, AuthInterceptor(tokens))  # first: a refused call is not even parsed
        interceptors.insert(0, MetricsInterceptor(self.metrics))  # outermost: every call counts, refused ones too
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service.register(self.server)
        names = [*self.service.service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        _check_port_free(self.settings)
        if tls is None:
            self.port = self.server.add_insecure_port(self.settings.address)
        else:
            credentials = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.client_ca,
                                                      require_client_auth=tls.client_ca is not None)
            self.port = self.server.add_secure_port(self.settings.address, credentials)
        if self.port == 0:
            raise SettingsError(_port_error(self.settings))
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.settings.metrics_port is not None:
            try:
                port = self.metrics.serve(self.settings.host, self.settings.metrics_port)
            except OSError as e:
                raise SettingsError(f"{setting_label(self.settings, 'metrics_port')} = {self.settings.metrics_port}: "
                                    f"cannot serve on {self.settings.host}: {e.strerror or e}") from None
            url = f"http://{self.settings.host}:{port}/metrics"
            log.info("metrics at %s", url, extra={"url": url})
        await self.server.start()
        if self.settings.health_port is not None:
            await self._serve_health(self.health)
        log.info("listening", extra={"address": self.address, "status": "starting",
                                     "auth": "tokens" if tokens.enabled else "off",
                                     "tls": "off" if tls is None else "mutual" if tls.client_ca else "on"})
        await self.service.start()
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"address": self.address, "services": ",".join(self.service.service_names)})

    async def _serve_health(self, health: HealthServicer) -> None:
        """The same health servicer on a second, plaintext server that serves nothing else: a
        Kubernetes `grpc:` probe speaks no TLS, and no other RPC may be reached without it."""
        self.health_server = grpc.aio.server(options=SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(health, self.health_server)
        address = f"{self.settings.host}:{self.settings.health_port}"
        try:
            self.health_port = self.health_server.add_insecure_port(address)
        except RuntimeError:
            self.health_port = 0
        if self.health_port == 0:
            raise SettingsError(f"{setting_label(self.settings, 'health_port')} = {self.settings.health_port}: "
                                f"cannot listen on {address} (in use by another process, or the host is not an "
                                "address of this machine)")
        await self.health_server.start()
        log.info("health at %s:%d (plaintext, grpc.health.v1 only)", self.settings.host, self.health_port,
                 extra={"health_port": self.health_port})

    async def _stop_health_server(self) -> None:
        if self.health_server is not None:
            await self.health_server.stop(0)
            self.health_server = None

    async def _set_all(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        assert self.health is not None
        await self.health.set("", status)
        for name in self.service.service_names:
            await self.health.set(name, status)

    async def stop(self, grace: float | None = None) -> None:
        if self.server is None or self.health is None:
            return
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_seconds if grace is None else grace)
        await self._stop_health_server()  # after the grace: a probe sees NOT_SERVING meanwhile
        await self.service.stop()
        self.metrics.close()
        log.info("stopped", extra={"address": self.address})

    async def __aenter__(self) -> ServiceRunner:
        try:
            await self.start()
        except BaseException:
            if self.server is not None:
                await self.server.stop(0)
            await self._stop_health_server()
            self.metrics.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace=1.0)


async def _serve_until_signal(runner: ServiceRunner) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(runner.start())
    # A signal during a slow start (a model load) must still stop the process promptly.
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if start in done:
        try:
            start.result()  # re-raises a startup failure
        except BaseException:
            waiter.cancel()
            if runner.server is not None:
                await runner.server.stop(0)
            await runner._stop_health_server()
            runner.metrics.close()
            raise
        await waiter
    else:
        start.cancel()
    log.info("shutting down", extra={"grace_seconds": runner.settings.grace_seconds})
    await runner.stop()


def run_service(
    settings_cls: type[ServiceSettings],
    build: Callable[[ServiceSettings], Service],
    argv: list[str] | None = None,
    description: str = "",
) -> int:
    """The body of every service's console script."""
    prog = f"rlvr-{settings_cls.service_name}"
    try:
        settings = load_settings(settings_cls, argv, prog=prog, description=description)
    except SettingsError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings_cls.service_name, settings.log_level, settings.log_format)
    try:
        _check_port_free(settings)  # before any import of a model stack: a clash fails at once
        runner = ServiceRunner(build(settings), settings)
        asyncio.run(_serve_until_signal(runner))
    except (SettingsError, StartupError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # an unexpected start failure: the log has the trace, the user one line
        log.error("cannot start", exc_info=e)
        print(f"{prog}: error: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


class GrpcService:
    """A Service made of generated servicers plus optional start/stop hooks of a core."""

    def __init__(
        self,
        servicers: Sequence[tuple[Callable[[object, grpc.aio.Server], None], object, str]],
        on_start: Callable[[], object] | None = None,
        on_stop: Callable[[], object] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._servicers = servicers
        self.metrics = metrics or Metrics()  # the service's own series live in it (docs/metrics.md)
        self.service_names = [name for _, _, name in servicers]
        self._on_start = on_start
        self._on_stop = on_stop

    def register(self, server: grpc.aio.Server) -> None:
        for add, servicer, _ in self._servicers:
            add(servicer, server)

    async def start(self) -> None:
        if self._on_start is not None:
            result = self._on_start()
            if asyncio.iscoroutine(result):
                await result

    async def stop(self) -> None:
        if self._on_stop is not None:
            result = self._on_stop()
            if asyncio.iscoroutine(result):
                await result


def service_main(settings_cls: type[ServiceSettings], builder: str, argv: list[str] | None, description: str) -> int:
    """A console script's whole body. `builder` is "module:function"; the module (which may
    import torch or vLLM) is imported only after the flags parsed, so `--help` answers at once."""

    def build(settings: ServiceSettings) -> Service:
        import importlib

        module_name, func = builder.split(":")
        return getattr(importlib.import_module(module_name), func)(settings)

    return run_service(settings_cls, build, argv, description)
