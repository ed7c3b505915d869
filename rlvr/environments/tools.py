"""An environment's tools: their JSON schemas for the chat template, and one call run safely.

``tool_schemas(env)`` is what the chat template's ``tools`` gets: the OpenAI function schema of each
tool, made by transformers' ``get_json_schema`` from its type hints and Google-style docstring.

``run_tool(tools, call, timeout)`` runs one call the policy made and never raises: an unknown tool,
arguments that do not fit its signature, an exception, a time-out or a result that is not JSON
become ``ToolResult.error`` and an error observation for the model (``"error: ..."``), so a bad call
is something the policy learns from, not a crashed episode. A sync tool runs in a daemon thread of
its own, an async one is awaited, each under the time limit. A sync tool past its limit cannot be
stopped (a thread cannot be killed): its thread runs on until it returns and its result is dropped
(nothing waits for it, the process's exit neither); a tool that may hang should be ``async`` or
bound its own work (as ``code_run`` does with the sandbox). The one exception it lets through is an
`EnvironmentFailure`: the environment itself cannot go on (a remote server gone), which ends the
episode rather than being shown to the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.environments.base import Environment, EnvironmentFailure, ToolCall

__all__ = ["MAX_RESULT_CHARS", "ToolResult", "run_tool", "tool_map", "tool_schemas"]

MAX_RESULT_CHARS = 16_000  # a longer result is cut (with a note) before it enters the conversation


@dataclass(frozen=True)
class ToolResult:
    """One tool call's outcome: ``content`` is what the model reads (the ``tool`` message), ``error``
    "" when the call went through, else why not (``content`` then says it too)."""

    content: str
    error: str = ""
    seconds: float = 0.0


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def tool_map(env: Environment) -> dict[str, Callable[..., Any]]:
    """The environment's tools by name (what `run_tool` takes)."""
    return {_name(fn): fn for fn in env.tools()}


def tool_schemas(env: Environment) -> list[dict[str, Any]]:
    """The JSON schema of each of the environment's tools (``{"type": "function", "function": {...}}``),
    for the chat template's ``tools``. ValueError naming the tool whose declaration cannot make one."""
    from transformers.utils import get_json_schema  # heavy: only where episodes run

    schemas = []
    for fn in env.tools():
        try:
            schemas.append(get_json_schema(fn))
        except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
            raise ValueError(f"tool {_name(fn)!r} of {type(env).__name__}: no JSON schema: {exc}") from exc
    return schemas


def _render(value: Any) -> str:
    """A tool's result as the text the model reads: a str as it is, another JSON value dumped."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"the result {value!r} is not a finite number")
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the result is a {type(value).__name__}, not a str, number, bool or JSON value "
                        f"({exc})") from None


def _in_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """``fn()`` in a daemon thread of its own: a tool that hangs past its limit holds only that thread,
    not a shared pool's worker, and neither the event loop's shutdown nor the process's exit waits for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():  # cancelled at the time limit: the result is dropped
            future.set_exception(error) if error is not None else future.set_result(value)

    def body() -> None:
        try:
            value, error = fn(), None
        except BaseException as exc:  # handed to the awaiting side, as run_in_executor does
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=body, name=f"rlvr-tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def _failed(error: str, started: float) -> ToolResult:
    return ToolResult(content=f"error: {error}", error=error, seconds=time.monotonic() - started)


async def run_tool(tools: Mapping[str, Callable[..., Any]], call: ToolCall, timeout: float) -> ToolResult:
    """Runs ``call`` with the tool of its name under ``timeout`` seconds; never raises (see the module
    docstring) except for the caller's own cancellation."""
    started = time.monotonic()
    fn = tools.get(call.name)
    if fn is None:
        return _failed(f"no tool named {call.name!r}; the tools: {', '.join(sorted(tools)) or 'none'}", started)
    arguments = call.arguments if isinstance(call.arguments, Mapping) else None
    if arguments is None:
        return _failed(f"the arguments of {call.name} must be an object of named arguments, "
                       f"got {type(call.arguments).__name__}", started)
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as exc:
        return _failed(f"bad arguments for {call.name}: {exc}", started)
    except ValueError:  # no signature to check (a builtin): the call itself will say
        pass
    try:
        if inspect.iscoroutinefunction(fn):
            value = await asyncio.wait_for(fn(**arguments), timeout)
        else:
            value = await asyncio.wait_for(_in_thread(functools.partial(fn, **arguments)), timeout)
            if inspect.isawaitable(value):  # a sync callable that returned a coroutine
                value = await asyncio.wait_for(value, max(0.0, timeout - (time.monotonic() - started)))
    except (asyncio.CancelledError, EnvironmentFailure):  # the environment's own end, not the policy's call
        raise
    except (Exception, SystemExit) as exc:  # wait_for's TimeoutError among them; a tool's sys.exit()
        if isinstance(exc, TimeoutError) and time.monotonic() - started >= timeout:
            return _failed(f"{call.name} took longer than its time limit of {timeout:g} s", started)
        return _failed(f"{call.name} failed: {type(exc).__name__}: {exc}", started)
    try:
        content = _render(value)
    except TypeError as exc:
        return _failed(f"{call.name} returned something that is not text: {exc}", started)
    if len(content) > MAX_RESULT_CHARS:
        content = content[:MAX_RESULT_CHARS] + f"\n[cut: the result has {len(content)} characters]"
    return ToolResult(content=content, seconds=time.monotonic() - started)
