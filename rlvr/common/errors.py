"""The error mapping of the contract, in one place.

Core code raises plain exceptions; the servicers never build status codes themselves. The
`grpc_errors` decorator wraps every RPC handler (unary or streaming) and maps:

- `InvalidArgument` and any other `ValueError` -> INVALID_ARGUMENT (bad input: the message names
  the field, the value and the allowed range),
- `NotFound` / `KeyError`-free lookups -> NOT_FOUND (unknown ids),
- `FailedPrecondition` -> FAILED_PRECONDITION (a state that forbids the call),
- anything else -> INTERNAL with a short reference; the cause and stack trace go to the log,
  never to the client.
"""

from __future__ import annotations

import functools
import inspect
import logging
import uuid
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger("rlvr.errors")


class RlvrServiceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(RlvrServiceError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RlvrServiceError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RlvrServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(RlvrServiceError):
    code = grpc.StatusCode.UNAVAILABLE


def out_of_range(field: str, value: object, allowed: str) -> InvalidArgument:
    """The standard bad-input message: field, value, and the allowed range or values."""
    return InvalidArgument(f"{field}: {value!r} is out of range; allowed: {allowed}")


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message for an exception raised by core code."""
    if isinstance(exc, RlvrServiceError):
        return exc.code, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    ref = uuid.uuid4().hex[:8]
    log.error("internal error ref=%s: %s: %s", ref, type(exc).__name__, exc, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); the server log has the cause"


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    code, message = status_for(exc)
    if code != grpc.StatusCode.INTERNAL:
        log.info("rpc error %s: %s", code.name, message)
    await context.abort(code, message)


def grpc_errors(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps an async servicer method (coroutine or async generator) with the error mapping."""
    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for item in handler(self, request, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # mapped, never leaked
                await _abort(context, exc)

        return stream_wrapper

    @functools.wraps(handler)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # mapped, never leaked
            await _abort(context, exc)

    return unary_wrapper


def map_errors(cls: type) -> type:
    """Class decorator: applies `grpc_errors` to every async RPC method of a servicer (RPC names
    are CamelCase by the proto style guide; helpers such as start/stop are left alone)."""
    for name, member in list(vars(cls).items()):
        if not name[:1].isupper():
            continue
        if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member):
            setattr(cls, name, grpc_errors(member))
    return cls
