"""The call machinery under the typed clients: one definition of a service's RPCs, two clients.

A service's methods are declared once, as a table of `Unary`, `ServerStream` and `ClientStream`
descriptors on a small class (`rlvr.peers.clients.RewardRpcs`, ...):

    class RewardRpcs:
        service = "reward"
        score = Unary("Score", reward_pb2.ScoreRequest, reward_pb2.ScoreResponse)

    class RewardClient(RewardRpcs, ServiceClient): ...            # sync: returns the response
    class AsyncRewardClient(RewardRpcs, AsyncServiceClient): ...  # asyncio: a coroutine

Each descriptor checks itself against the generated contract when its class is created (the RPC
exists, has that call shape and those message types), and on an instance it becomes a method of
the same name whatever the client: `client.score(request, timeout=...)`. The sync client answers
with the response (a server stream: an iterator), the async one with a coroutine (a server stream:
an `AsyncStream`, read with `async for`). Both go through the same three call shapes, so the rules
hold in one place for both: a deadline on every call (`timeout_for`: the caller's, else the
client's, else `deadline_for`), retries on UNAVAILABLE for the idempotent methods (the channel from
`make_channel`, sync or aio), `RlvrError` instead of a grpc traceback, a stream cancelled when its
reader stops.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar, cast, overload

import grpc
import grpc.aio
from google.protobuf import descriptor_pool
from google.protobuf.message import Message

from rlvr.common.auth import ChannelAuth
from rlvr.common.client import SERVICE_NAMES, channel_credentials, deadline_for, make_channel, method_kind

_SHORT_NAMES = {full: short for short, full in SERVICE_NAMES.items()}


class RlvrError(Exception):
    """A failed call: the gRPC status code and the server's message (which, by the contract,
    names the field, value and allowed range for INVALID_ARGUMENT), the method called
    ("rlvr.v1.RewardService/Score") and, when the client was given one, the address it called.
    `violations`: for INVALID_ARGUMENT, every bad field as (field path, description), from the
    status's google.rpc.BadRequest details (one per line of `details` too)."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "", address: str = "",
                 violations: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.method = method
        self.address = address
        self.violations: list[tuple[str, str]] = list(violations)

    @classmethod
    def from_rpc(cls, error: grpc.RpcError, method: str = "", address: str = "") -> RlvrError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code, details or "", method, address, field_violations(error))

    @property
    def service(self) -> str:
        """The service called, by short name ("reward"), or its full name if it has none."""
        full = self.method.partition("/")[0]
        return _SHORT_NAMES.get(full, full)

    @property
    def call(self) -> str:
        """The RPC called ("Score")."""
        return self.method.rpartition("/")[2]

    def describe(self) -> str:
        """One line for a peer's caller to fail with: the service, its address and the call, then
        the status: "reward service at 127.0.0.1:50053: Score failed: UNAVAILABLE: ..."."""
        where = f"{self.service or 'the'} service" + (f" at {self.address}" if self.address else "")
        details = " ".join(self.details.split())
        return f"{where}: {self.call or 'a call'} failed: {self.code.name}: {details}"


def field_violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    """The (field, description) pairs of a failed call's google.rpc.BadRequest details; [] when it
    carries none (or they do not decode)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    if not hasattr(error, "trailing_metadata"):
        return []
    try:
        status = rpc_status.from_call(error)
    except (ValueError, TypeError, AttributeError):
        return []
    out: list[tuple[str, str]] = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out += [(v.field, v.description) for v in bad.field_violations]
    return out


def default_timeout(method: str, unary_timeout: float | None = None) -> float:
    """The deadline of a call to `method` ("rlvr.v1.RewardService/Score") when the caller gives
    none: `unary_timeout` (ClientSettings.timeout) for unary calls and uploads if set, else the
    method's default from `deadline_for`. Streams always keep their own, longer defaults."""
    if unary_timeout is not None and method_kind(method) in ("unary", "client_stream"):
        return unary_timeout
    return deadline_for(method)


# ---------------------------------------------------------------------------------- one RPC

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
_In = TypeVar("_In", contravariant=True)
_Out = TypeVar("_Out", covariant=True)
_T = TypeVar("_T")
_Item = TypeVar("_Item", covariant=True)

CallShape = Literal["unary", "server_stream", "client_stream"]
_CHANNEL_METHODS: dict[CallShape, str] = {
    "unary": "unary_unary",
    "server_stream": "unary_stream",
    "client_stream": "stream_unary",
}


class UnaryCall(Protocol[_In, _Out]):
    def __call__(self, request: _In | None = None, *, timeout: float | None = None) -> _Out: ...


class AsyncUnaryCall(Protocol[_In, _Out]):
    def __call__(self, request: _In | None = None, *, timeout: float | None = None) -> Awaitable[_Out]: ...


class ServerStreamCall(Protocol[_In, _Out]):
    def __call__(self, request: _In | None = None, *, timeout: float | None = None) -> Iterator[_Out]: ...


class AsyncServerStreamCall(Protocol[_In, _Out]):
    def __call__(self, request: _In | None = None, *, timeout: float | None = None) -> AsyncStream[_Out]: ...


class ClientStreamCall(Protocol[_In, _Out]):
    def __call__(self, requests: Iterable[_In], *, timeout: float | None = None) -> _Out: ...


class AsyncClientStreamCall(Protocol[_In, _Out]):
    def __call__(
        self, requests: Iterable[_In] | AsyncIterable[_In], *, timeout: float | None = None
    ) -> Awaitable[_Out]: ...


class Rpc(Generic[Req, Resp]):
    """One RPC of a service: its name in the contract, its call shape and its message types. Set
    as a class attribute named after the RPC in snake_case (a client stream: with "_stream"), it
    is a method of every client that has it."""

    shape: ClassVar[CallShape]

    def __init__(self, rpc: str, request: type[Req], response: type[Resp], doc: str = "") -> None:
        self.rpc = rpc
        self.request = request
        self.response = response
        self.doc = doc
        self.attr = ""
        self.method = ""  # "rlvr.v1.RewardService/Score", set with the owner

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name
        service = SERVICE_NAMES[owner.service]  # type: ignore[attr-defined]
        self.method = f"{service}/{self.rpc}"
        self._check(service)

    def _check(self, service: str) -> None:
        """The declaration must be the contract's: a wrong shape or message type fails at import."""
        try:
            desc = descriptor_pool.Default().FindServiceByName(service).methods_by_name[self.rpc]
        except KeyError:
            raise TypeError(f"{self.attr}: {self.method} is not in the contract") from None
        shape = ("client_stream" if desc.client_streaming else "server_stream" if desc.server_streaming
                 else "unary")
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", self.rpc).lower() + ("_stream" if desc.client_streaming else "")
        if self.attr != name:
            raise TypeError(f"{self.attr}: {self.method} is the method {name}")
        if desc.client_streaming and desc.server_streaming:
            raise TypeError(f"{self.attr}: {self.method} streams both ways, which no client declares")
        if shape != self.shape:
            raise TypeError(f"{self.attr}: {self.method} is a {shape} call, declared {self.shape}")
        for what, declared, actual in (("request", self.request, desc.input_type),
                                       ("response", self.response, desc.output_type)):
            if declared.DESCRIPTOR.full_name != actual.full_name:
                raise TypeError(f"{self.attr}: the {what} of {self.method} is {actual.full_name}, "
                                f"declared {declared.DESCRIPTOR.full_name}")

    def __repr__(self) -> str:
        return (f"<{self.shape} {self.method or self.rpc}({self.request.__name__}) -> "
                f"{self.response.__name__}>")

    def __call__(self, client: Any, *args: Any, **kwargs: Any) -> Any:
        """Called on the class, like a plain method: `RewardClient.score(client, request)`."""
        return getattr(client, self.attr)(*args, **kwargs)

    def multicallable(self, channel: grpc.Channel | grpc.aio.Channel) -> Any:
        """The call object on `channel`, sync or aio alike (both channels have the same factory)."""
        return getattr(channel, _CHANNEL_METHODS[self.shape])(
            f"/{self.method}",
            request_serializer=self.request.SerializeToString,
            response_deserializer=self.response.FromString,
        )

    def bind(self, client: _Client) -> Callable[..., Any]:
        """The method on `client`: its `_unary`, `_server_stream` or `_client_stream` (sync or
        async, whichever the client is) applied to this RPC."""
        shape = getattr(client, f"_{self.shape}")

        def streaming(requests: Any, *, timeout: float | None = None) -> Any:
            return shape(self, requests, timeout)

        def single(request: Any = None, *, timeout: float | None = None) -> Any:
            return shape(self, request if request is not None else self.request(), timeout)

        method = streaming if self.shape == "client_stream" else single
        method.__name__ = self.attr
        method.__qualname__ = f"{type(client).__name__}.{self.attr}"
        method.__doc__ = self.doc or f"{self.method}: {self.request.__name__} -> {self.response.__name__}."
        return method


class Unary(Rpc[Req, Resp]):
    """A unary RPC: request in (None = the empty message), response out."""

    shape = "unary"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: AsyncServiceClient, owner: type | None = None) -> AsyncUnaryCall[Req, Resp]: ...
    @overload
    def __get__(self, obj: ServiceClient, owner: type | None = None) -> UnaryCall[Req, Resp]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._bound(self)


class ServerStream(Rpc[Req, Resp]):
    """A server stream: request in, an iterator of responses out (`AsyncStream` on async clients)."""

    shape = "server_stream"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: AsyncServiceClient, owner: type | None = None) -> AsyncServerStreamCall[Req, Resp]: ...
    @overload
    def __get__(self, obj: ServiceClient, owner: type | None = None) -> ServerStreamCall[Req, Resp]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._bound(self)


class ClientStream(Rpc[Req, Resp]):
    """A client stream: an iterable of requests in (async clients also take an async one), one
    response out."""

    shape = "client_stream"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: AsyncServiceClient, owner: type | None = None) -> AsyncClientStreamCall[Req, Resp]: ...
    @overload
    def __get__(self, obj: ServiceClient, owner: type | None = None) -> ClientStreamCall[Req, Resp]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._bound(self)


def rpcs_of(client: type) -> dict[str, Rpc[Any, Any]]:
    """The RPCs a client class declares, by method name."""
    return {name: value for klass in reversed(client.__mro__) for name, value in vars(klass).items()
            if isinstance(value, Rpc)}


# ---------------------------------------------------------------------------------- the clients

class _Client:
    """What both clients share: the service, the address, the deadline rule, the error mapping."""

    service: ClassVar[str]  # short name, a key of SERVICE_NAMES
    address: str
    _timeout: float | None
    channel: Any

    def _method(self, rpc: str) -> str:
        return f"{SERVICE_NAMES[self.service]}/{rpc}"

    def timeout_for(self, rpc: str, timeout: float | None = None) -> float:
        """The deadline a call to `rpc` ("Score") gets: the explicit one, else the client's, else
        the method's default."""
        return timeout if timeout is not None else default_timeout(self._method(rpc), self._timeout)

    def _error(self, error: grpc.RpcError, rpc: Rpc[Any, Any]) -> RlvrError:
        return RlvrError.from_rpc(error, rpc.method, self.address)

    def _bound(self, rpc: Rpc[Any, Any]) -> Callable[..., Any]:
        # Cached on the instance: the descriptor only answers the first lookup.
        method = rpc.bind(self)
        self.__dict__[rpc.attr] = method
        return method

    def _call(self, rpc: Rpc[Any, Any]) -> Any:
        calls: dict[str, Any] = self.__dict__.setdefault("_calls", {})
        if rpc.rpc not in calls:
            calls[rpc.rpc] = rpc.multicallable(self.channel)
        return calls[rpc.rpc]


def _stream(call: Any, method: str, address: str) -> Iterator[Any]:
    try:
        yield from call
    except grpc.RpcError as e:
        raise RlvrError.from_rpc(e, method, address) from None
    finally:
        # A consumer that stops early (break, exception) frees the server's stream at once.
        call.cancel()


class ServiceClient(_Client):
    """The synchronous client: the channel and the three call shapes, blocking."""

    def __init__(self, target: str | grpc.Channel, *, timeout: float | None = None,
                 auth: ChannelAuth | None = None, own_connection: bool = False) -> None:
        """`target` is an address ("HOST:PORT"; the client owns and closes the channel) or a
        channel from `make_channel` (the caller owns it). `timeout` overrides the default
        deadline of unary calls and uploads; `auth` (a token, a CA for TLS) and `own_connection`
        (make_channel's) are how the client's own channel reaches the service."""
        self._owns_channel = isinstance(target, str)
        self.address = target if isinstance(target, str) else ""
        self.channel: grpc.Channel = (make_channel(target, auth=auth, own_connection=own_connection)
                                      if isinstance(target, str) else target)
        self._timeout = timeout

    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, rpc: Rpc[Any, Any], request: Any, timeout: float | None) -> Any:
        try:
            return self._call(rpc)(request, timeout=self.timeout_for(rpc.rpc, timeout))
        except grpc.RpcError as e:
            raise self._error(e, rpc) from None

    def _server_stream(self, rpc: Rpc[Any, Any], request: Any, timeout: float | None) -> Iterator[Any]:
        call = self._call(rpc)(request, timeout=self.timeout_for(rpc.rpc, timeout))
        return _stream(call, rpc.method, self.address)

    def _client_stream(self, rpc: Rpc[Any, Any], requests: Iterable[Any], timeout: float | None) -> Any:
        return self._unary(rpc, iter(requests), timeout)


class AsyncStream(Generic[_Item]):
    """A server stream of an async client, read with `async for`. A failure raises `RlvrError`;
    `aclose()` (or leaving `async with stream:`) cancels the call at once and ends the stream, and
    dropping the stream cancels it too (grpc cancels a call it collects)."""

    def __init__(self, call: Any, method: str, address: str) -> None:
        self._call = call
        self._iter: AsyncIterator[_Item] = call.__aiter__()
        self._cancelled = False
        self.method = method
        self.address = address

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> _Item:
        if self._cancelled:
            raise StopAsyncIteration
        try:
            return await self._iter.__anext__()
        except grpc.RpcError as e:
            self._call.cancel()
            raise RlvrError.from_rpc(e, self.method, self.address) from None
        except asyncio.CancelledError:
            if self._cancelled:  # our own cancel() while a read was pending: the stream ends
                raise StopAsyncIteration from None
            self._call.cancel()  # the reading task was cancelled: free the server's stream too
            raise

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()


class AsyncServiceClient(_Client):
    """The asyncio client (grpc.aio): the same methods as `ServiceClient`, as coroutines; a server
    stream is an `AsyncStream`. Create it inside a coroutine: grpc.aio binds a channel to the
    event loop running when it is made."""

    def __init__(self, target: str | grpc.aio.Channel, *, timeout: float | None = None,
                 auth: ChannelAuth | None = None, retries: bool = True, own_connection: bool = False) -> None:
        """`target` is an address ("HOST:PORT"; the client owns and closes the channel) or a
        channel from `make_channel(..., aio=True)` (the caller owns it). `timeout` overrides the
        default deadline of unary calls and uploads; `auth` and `own_connection` as for
        `ServiceClient`; `retries` (make_channel's) False for a caller that waits for an
        unavailable service itself."""
        self._owns_channel = isinstance(target, str)
        self.address = target if isinstance(target, str) else ""
        self.channel: grpc.aio.Channel = (
            make_channel(target, aio=True, auth=auth, retries=retries, own_connection=own_connection)
            if isinstance(target, str) else target)
        self._timeout = timeout

    async def close(self) -> None:
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _unary(self, rpc: Rpc[Any, Any], request: Any, timeout: float | None) -> Any:
        try:
            return await self._call(rpc)(request, timeout=self.timeout_for(rpc.rpc, timeout))
        except grpc.RpcError as e:
            raise self._error(e, rpc) from None

    def _server_stream(self, rpc: Rpc[Any, Any], request: Any, timeout: float | None) -> AsyncStream[Any]:
        call = self._call(rpc)(request, timeout=self.timeout_for(rpc.rpc, timeout))
        return AsyncStream(call, rpc.method, self.address)

    async def _client_stream(
        self, rpc: Rpc[Any, Any], requests: Iterable[Any] | AsyncIterable[Any], timeout: float | None
    ) -> Any:
        if not isinstance(requests, AsyncIterable):
            requests = iter(requests)
        return await self._unary(rpc, requests, timeout)


async def in_thread(items: Iterable[_T]) -> AsyncIterator[_T]:
    """`items` read one at a time in a worker thread: a file-backed request stream (an adapter
    upload, hundreds of MB) that never blocks the event loop nor sits in memory whole."""
    iterator = iter(items)
    done = object()
    while True:
        item = await asyncio.to_thread(next, iterator, done)
        if item is done:
            return
        yield cast(_T, item)


def check_health(address: str, timeout: float = 2.0, auth: ChannelAuth | None = None) -> str:
    """The overall health status name of a server ("SERVING", ...), or "UNREACHABLE". Health needs
    no token; `auth` with a CA reaches a TLS port."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    secure = auth is not None and auth.tls
    with (grpc.secure_channel(address, channel_credentials(auth)) if secure and auth is not None
          else grpc.insecure_channel(address)) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout)
        except grpc.RpcError as e:
            return "UNREACHABLE" if e.code() in (grpc.StatusCode.UNAVAILABLE,
                                                 grpc.StatusCode.DEADLINE_EXCEEDED) else e.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
