"""The call machinery under the SDK's typed clients: deadlines, readable errors, streams.

`clients.sdk` declares one method per RPC; every one of them goes through `ServiceClient`'s
three call shapes here, so the rules (a deadline on every call, `RlvrError` instead of a grpc
traceback, a stream cancelled when its reader stops) hold in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Self

import grpc

from rlvr.common.client import SERVICE_NAMES, deadline_for, make_channel, method_kind


class RlvrError(Exception):
    """A failed call: the gRPC status code and the server's message (which, by the contract,
    names the field, value and allowed range for INVALID_ARGUMENT)."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.method = method

    @classmethod
    def from_rpc(cls, error: grpc.RpcError, method: str = "") -> RlvrError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code, details or "", method)


def default_timeout(method: str, unary_timeout: float | None = None) -> float:
    """The deadline of a call to `method` ("rlvr.v1.RewardService/Score") when the caller gives
    none: `unary_timeout` (ClientSettings.timeout) for unary calls and uploads if set, else the
    method's default from `deadline_for`. Streams always keep their own, longer defaults."""
    if unary_timeout is not None and method_kind(method) in ("unary", "client_stream"):
        return unary_timeout
    return deadline_for(method)


def _stream(call: Any, method: str) -> Iterator[Any]:
    try:
        yield from call
    except grpc.RpcError as e:
        raise RlvrError.from_rpc(e, method) from None
    finally:
        # A consumer that stops early (break, exception) frees the server's stream at once.
        call.cancel()


class ServiceClient:
    """Channel, stub and the three call shapes every service client shares."""

    service: ClassVar[str]  # short name, a key of SERVICE_NAMES
    _stub_class: ClassVar[type]

    def __init__(self, target: str | grpc.Channel, *, timeout: float | None = None) -> None:
        """`target` is an address ("HOST:PORT"; the client owns and closes the channel) or a
        channel from `make_channel` (the caller owns it). `timeout` overrides the default
        deadline of unary calls and uploads."""
        self._owns_channel = isinstance(target, str)
        self.channel: grpc.Channel = make_channel(target) if isinstance(target, str) else target
        self._stub = self._stub_class(self.channel)
        self._timeout = timeout

    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _method(self, rpc: str) -> str:
        return f"{SERVICE_NAMES[self.service]}/{rpc}"

    def timeout_for(self, rpc: str, timeout: float | None = None) -> float:
        """The deadline a call to `rpc` gets: the explicit one, else the client's, else the
        method's default."""
        return timeout if timeout is not None else default_timeout(self._method(rpc), self._timeout)

    def _unary(self, rpc: str, request: Any, timeout: float | None) -> Any:
        try:
            return getattr(self._stub, rpc)(request, timeout=self.timeout_for(rpc, timeout))
        except grpc.RpcError as e:
            raise RlvrError.from_rpc(e, self._method(rpc)) from None

    def _server_stream(self, rpc: str, request: Any, timeout: float | None) -> Iterator[Any]:
        call = getattr(self._stub, rpc)(request, timeout=self.timeout_for(rpc, timeout))
        return _stream(call, self._method(rpc))

    def _client_stream(self, rpc: str, requests: Iterable[Any], timeout: float | None) -> Any:
        return self._unary(rpc, iter(requests), timeout)


def check_health(address: str, timeout: float = 2.0) -> str:
    """The overall health status name of a server ("SERVING", ...), or "UNREACHABLE"."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout)
        except grpc.RpcError as e:
            return "UNREACHABLE" if e.code() in (grpc.StatusCode.UNAVAILABLE,
                                                 grpc.StatusCode.DEADLINE_EXCEEDED) else e.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
