"""The error mapping of the contract, in one place.

Core code raises plain exceptions; the servicers never build status codes themselves. The
`grpc_errors` decorator wraps every RPC handler (unary or streaming) and maps:

- `InvalidArgument` and any other `ValueError` -> INVALID_ARGUMENT (bad input: the message names
  the field, the value and the allowed range). A request with several bad fields is refused once
  with every one of them (`Violations` collects them): the message has one line per field, and the
  status carries them as `google.rpc.BadRequest` field violations (grpcio-status's rich status), so
  a client can show each next to its field without parsing the text,
- `NotFound` / `KeyError`-free lookups -> NOT_FOUND (unknown ids),
- `FailedPrecondition` -> FAILED_PRECONDITION (a state that forbids the call),
- anything else -> INTERNAL with a short reference; the cause and stack trace go to the log,
  never to the client.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc

log = logging.getLogger("rlvr.errors")


class RlvrServiceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.*)$", re.DOTALL)


class InvalidArgument(RlvrServiceError, ValueError):
    """Bad input. `violations`: the (field path, description) of every bad field; by default the
    field the message starts with (`grpo.lora_rank: 99 is out of range; ...`), none if it names none."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str = "", violations: Sequence[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        if violations is None:
            m = _FIELD.match(message)
            violations = [(m.group(1), m.group(2))] if m else []
        self.violations: list[tuple[str, str]] = list(violations)

    def prefixed(self, prefix: str) -> InvalidArgument:
        """The same error with every field under `prefix` ("job." for a loop's job spec)."""
        lines = "\n".join(prefix + line for line in str(self).split("\n"))
        return InvalidArgument(lines, [(prefix + f, d) for f, d in self.violations])


class Violations:
    """Every bad field of one request, so that one INVALID_ARGUMENT names them all:

        v = Violations()
        with v.check():
            check_rank(spec)       # raises InvalidArgument
        with v.check():
            check_rate(spec)
        v.raise_any()              # one error: every field's message, one per line

    Each field keeps the message it has alone. A check that reads fields found bad already asks
    `v.bad(path, ...)` first and is skipped, so a bad value is not reported again as a mismatch."""

    def __init__(self) -> None:
        self.errors: list[InvalidArgument] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except InvalidArgument as e:
            self.errors.append(e)

    def add(self, error: InvalidArgument) -> None:
        self.errors.append(error)

    def bad(self, *paths: str) -> bool:
        """Whether any field at or under one of `paths` was found bad."""
        fields = [f for e in self.errors for f, _ in e.violations]
        return any(f == p or f.startswith((p + ".", p + "[")) for p in paths for f in fields)

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise InvalidArgument("\n".join(str(e) for e in self.errors),
                                  [v for e in self.errors for v in e.violations])


class NotFound(RlvrServiceError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RlvrServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(RlvrServiceError):
    """The service, or what it needs, cannot answer now. `retry=False`: the service has waited for
    it already (a remote reward's `wait_seconds`), so the answer tells the client's channel not to
    retry (`NO_RETRY`): its retries would only wait that long again, each."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str = "", *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


NO_RETRY = (("grpc-retry-pushback-ms", "-1"),)
"""Trailing metadata that stops a gRPC channel's retry policy from retrying the call: a negative
server push-back means "do not retry" (gRFC A6, honoured by grpcio's channels). A caller's own loop
(the trainer's wait for the reward service) still sees UNAVAILABLE and decides for itself."""


MAX_SHOWN_CHARS = 120
"""A value echoed in a message (and so in the log) is cut to this many characters of its repr."""
MAX_MESSAGE_BYTES = 4096
"""A status message is cut to this many UTF-8 bytes: gRPC sends it percent-encoded in a trailer,
and a trailer over the 16 KiB metadata limit turns the real error into RESOURCE_EXHAUSTED."""
MAX_LOG_LINE_CHARS = 2000


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """`repr(value)`, cut to `limit` characters with an ellipsis and the original length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters shown"
    return f"{text[:limit]}… ({size})"


def clip(text: str, max_bytes: int = MAX_MESSAGE_BYTES) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes, with an ellipsis and the original length."""
    if len(text.encode("utf-8", "surrogatepass")) <= max_bytes:
        return text
    keep = max_bytes // 4 if any(ord(c) > 0x7F for c in text) else max_bytes - 64
    return f"{text[:keep]}… (message cut; {len(text)} characters)"


def out_of_range(field: str, value: object, allowed: str) -> InvalidArgument:
    """The standard bad-input message: field, value, and the allowed range or values."""
    return InvalidArgument(f"{field}: {shown(value)} is out of range; allowed: {allowed}")


def too_long(field: str, value: str, limit: int) -> InvalidArgument:
    """The message for a string over its size limit: field, length and limit (not the value)."""
    return InvalidArgument(f"{field}: {len(value)} characters, over the limit of {limit}")


def bounded(field: str, value: str, limit: int) -> str:
    """`value`, or InvalidArgument naming `field` and `limit` when it is longer."""
    if len(value) > limit:
        raise too_long(field, value, limit)
    return value


MAX_PAGE = 500
"""The largest `limit` of a list call (ListJobs, ListLoops, ListEvaluations), so that a whole page
stays under the 64 MiB message limit. The largest Job the size limits allow (every bounded string
at its limit in 4-byte characters, the warnings that quote the dataset, a 2000-character error) is
~83 KB, so a page of 1000 could reach ~83 MB; 500 of them are ~42 MB, and the largest Evaluation
is far smaller. tests/test_bad_input.py builds those rows and checks the bound; real rows are a
few KB, so a full page is a few MB in practice."""


def check_page(limit: int, offset: int, default: int = 100) -> None:
    """A list call's paging: INVALID_ARGUMENT naming `limit` or `offset` when out of range."""
    if not 0 <= limit <= MAX_PAGE:
        raise out_of_range("limit", limit, f"0-{MAX_PAGE} (0 = {default})")
    if offset < 0:
        raise out_of_range("offset", offset, ">= 0")


def _clipped_trace(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS] + "… (line cut)\n"
                   for line in lines)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message for an exception raised by core code; values
    echoed in it are cut (see `clip`)."""
    if isinstance(exc, RlvrServiceError):
        return exc.code, clip(str(exc))
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, clip(str(exc))
    ref = uuid.uuid4().hex[:8]
    log.error("internal error ref=%s: %s: %s\n%s", ref, type(exc).__name__, clip(str(exc), MAX_LOG_LINE_CHARS),
              _clipped_trace(exc))
    return grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); the server log has the cause"


MAX_TRAILER_BYTES = 6144
"""The details travel in a trailer beside the message (grpc-status-details-bin: a google.rpc.Status
holding the message again and the violations, base64), and a client refuses trailers over its 8 KiB
soft metadata limit. Where message and details would pass this, the status goes without details:
the message alone still names every field, one per line."""


def bad_request_status(code: grpc.StatusCode, message: str, violations: Sequence[tuple[str, str]]) -> grpc.Status | None:
    """The rich status of an INVALID_ARGUMENT: `message` plus a google.rpc.BadRequest with one field
    violation per bad field (grpcio-status: clients read it with `rpc_status.from_call`); None when
    the two would not fit the trailer (MAX_TRAILER_BYTES)."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    bad = error_details_pb2.BadRequest()
    bad.field_violations.extend(error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                                for f, d in violations)
    detail = any_pb2.Any()
    detail.Pack(bad)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    if len(message.encode("utf-8", "surrogatepass")) + status.ByteSize() * 4 // 3 > MAX_TRAILER_BYTES:
        return None
    return rpc_status.to_status(status)


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """Ends the call with the mapped status of `exc` (raises grpc.aio.AbortError); bad fields also
    as BadRequest details."""
    code, message = status_for(exc)
    if code != grpc.StatusCode.INTERNAL:
        log.info("rpc error %s: %s", code.name, message)
    status = bad_request_status(code, message, exc.violations) if isinstance(exc, InvalidArgument) else None
    if status is not None:
        await context.abort(status.code, status.details, status.trailing_metadata)
    await context.abort(code, message, NO_RETRY if isinstance(exc, Unavailable) and not exc.retry else ())


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
                await abort_with(context, exc)

        return stream_wrapper

    @functools.wraps(handler)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # mapped, never leaked
            await abort_with(context, exc)

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
