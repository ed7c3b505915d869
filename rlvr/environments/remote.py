"""Remote environments: an environment served by a service of the user's own, over the contract.

The operator maps a key to an address (rlvr.common.settings.RemoteEnvironmentSettings, the setting
``remote_environments`` / RLVR_REMOTE_ENVIRONMENTS); `remote_definition` asks that server's
``Describe`` and makes the key's `EnvironmentDefinition`, whose episodes are `RemoteEnvironment`s:
each of its methods is one call of rlvr.v1.EnvironmentService (protos/rlvr/v1/environment.proto)
under the episode's id, with a deadline.

Its answers are not trusted. A call that fails (an error status, a deadline passed, the server
gone) or answers garbage (a reward that is not a number in range, a tool schema or a state that is
not the JSON asked for, a text over `MAX_TEXT_CHARS`) raises `RemoteEnvironmentError`, one line
naming the key, the address, the call and the status or what was wrong: the episode ends with it
as its reason, as an episode whose reward fails. The failure sticks: every later call of the
episode raises it again (so a tool runner that turns exceptions into observations cannot hide a
dead server), except `close`, which always tries. A tool's own failure (CallToolResponse.error) and
a tool call past its time limit are the policy's to read instead (`RemoteToolError`,
TimeoutError), and the episode goes on.

Only Describe (at start) and Reset (an episode's first call) ride over an unreachable server, for
``wait_seconds``; a call inside an episode is never repeated, as it may have been applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf import struct_pb2
from google.protobuf.message import Message

from rlvr.common.auth import ChannelAuth
from rlvr.common.client import make_channel
from rlvr.common.settings import SettingsError, read_secret_file
from rlvr.environments.base import (
    KEY_RE,
    KEY_RULE,
    MAX_TURNS_DEFAULT,
    TOOL_TIMEOUT_DEFAULT,
    Environment,
    EnvironmentDefinition,
    EnvironmentFailure,
    EpisodeRow,
    Reply,
)
from rlvr.v1 import common_pb2
from rlvr.v1 import environment_pb2 as env_pb2

if TYPE_CHECKING:
    from rlvr.environments.settings import RemoteEnvironmentSettings

log = logging.getLogger("rlvr.environments.remote")

SERVICE = "rlvr.v1.EnvironmentService"
MAX_TEXT_CHARS = 1_000_000
"""The longest text an answer may carry (a prompt addition, a reply, a tool's result, a state)."""
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CLOSE_TIMEOUT_S = 5.0
_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
_GONE = (grpc.StatusCode.UNAVAILABLE,)

_RPCS: dict[str, tuple[type[Message], type[Message]]] = {
    "Describe": (env_pb2.DescribeEnvironmentRequest, env_pb2.DescribeEnvironmentResponse),
    "Reset": (env_pb2.ResetEpisodeRequest, env_pb2.ResetEpisodeResponse),
    "CallTool": (env_pb2.CallToolRequest, env_pb2.CallToolResponse),
    "Step": (env_pb2.StepEpisodeRequest, env_pb2.StepEpisodeResponse),
    "Finish": (env_pb2.FinishEpisodeRequest, env_pb2.FinishEpisodeResponse),
    "Close": (env_pb2.CloseEpisodeRequest, env_pb2.CloseEpisodeResponse),
}

__all__ = ["RemoteEnvironment", "RemoteEnvironmentError", "RemoteToolError", "remote_definition",
           "remote_definition_async", "remote_definitions"]


class RemoteEnvironmentError(EnvironmentFailure):
    """A remote environment's call failed or answered garbage: one line naming the key, the
    address, the call and the status (``code``; None for a garbage answer) or the reason."""

    def __init__(self, key: str, address: str, call: str, reason: str,
                 code: grpc.StatusCode | None = None) -> None:
        reason = " ".join(reason.split())
        reason = reason if len(reason) <= 300 else reason[:299] + "…"
        status = f"{code.name}: " if code is not None else "answered garbage: "
        super().__init__(f"remote environment {key!r} at {address}: {call} failed: {status}{reason}")
        self.key, self.address, self.call, self.code, self.reason = key, address, call, code, reason


class RemoteToolError(Exception):
    """A remote tool's own failure (CallToolResponse.error): what the policy reads instead of a
    result. The episode goes on."""


class _Garbage(ValueError):
    """An answer rlvr refuses (turned into RemoteEnvironmentError with the call's name)."""


# ---------------------------------------------------------------------------------- the connection

def _status(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """A failed call's code and message (rlvr.peers' RlvrError reads the same two)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return code, details or "(no message)"


class RemoteConnection:
    """One remote environment server: its address, how to reach it, the deadlines, and an asyncio
    channel per event loop (grpc.aio binds a channel to the loop it was made in), shared by the
    episodes of that loop."""

    def __init__(self, key: str, address: str, *, auth: ChannelAuth | None = None, timeout_seconds: float = 30.0,
                 tool_timeout_seconds: float = TOOL_TIMEOUT_DEFAULT, wait_seconds: float = 0.0) -> None:
        if not KEY_RE.match(key):
            raise ValueError(f"remote environment key {key!r} is not allowed ({KEY_RULE})")
        self.key, self.address, self.auth = key, address, auth or ChannelAuth()
        self.timeout_seconds, self.tool_timeout_seconds, self.wait_seconds = \
            timeout_seconds, tool_timeout_seconds, wait_seconds
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def error(self, call: str, reason: str, code: grpc.StatusCode | None = None) -> RemoteEnvironmentError:
        return RemoteEnvironmentError(self.key, self.address, call, reason, code)

    def _aio(self) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            # No channel retries: nothing inside an episode may run twice; Reset/Describe wait themselves.
            self._channel = make_channel(self.address, aio=True, auth=self.auth, retries=False)
            self._loop = loop
        return self._channel

    async def call(self, rpc: str, request: Message, *, timeout: float | None = None, wait: bool = False) -> Any:
        """The response of `rpc`; RemoteEnvironmentError naming it when the call fails. `wait`: ride
        over UNAVAILABLE for wait_seconds (only for calls that are safe to repeat)."""
        request_type, response_type = _RPCS[rpc]
        stub = self._aio().unary_unary(f"/{SERVICE}/{rpc}", request_serializer=request_type.SerializeToString,
                                       response_deserializer=response_type.FromString)
        loop = asyncio.get_running_loop()
        until = loop.time() + (self.wait_seconds if wait else 0.0)
        attempt = 0
        while True:
            try:
                return await stub(request, timeout=timeout or self.timeout_seconds)
            except grpc.RpcError as e:
                failed = _status(e)
                if failed[0] in _GONE and loop.time() < until:
                    if attempt == 0:
                        log.warning("remote environment %r at %s is unreachable; retrying %s for up to %g s",
                                    self.key, self.address, rpc, self.wait_seconds)
                    await asyncio.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)],
                                            max(0.0, until - loop.time())))
                    attempt += 1
                    continue
                raise self._failed(rpc, failed, waited=wait and attempt > 0) from None

    def call_sync(self, rpc: str, request: Message, *, wait: bool = False) -> Any:
        """`call` on a synchronous channel of its own (Describe from code without an event loop)."""
        request_type, response_type = _RPCS[rpc]
        channel = make_channel(self.address, auth=self.auth, retries=False)
        try:
            stub = channel.unary_unary(f"/{SERVICE}/{rpc}", request_serializer=request_type.SerializeToString,
                                       response_deserializer=response_type.FromString)
            until = time.monotonic() + (self.wait_seconds if wait else 0.0)
            attempt = 0
            while True:
                try:
                    return stub(request, timeout=self.timeout_seconds)
                except grpc.RpcError as e:
                    failed = _status(e)
                    if failed[0] in _GONE and time.monotonic() < until:
                        time.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)],
                                       max(0.0, until - time.monotonic())))
                        attempt += 1
                        continue
                    raise self._failed(rpc, failed, waited=wait and attempt > 0) from None
        finally:
            channel.close()

    def _failed(self, rpc: str, failed: tuple[grpc.StatusCode, str], waited: bool) -> RemoteEnvironmentError:
        code, details = failed
        if waited:
            details = f"unreachable after {self.wait_seconds:g} s: {details}"
        return self.error(rpc, details, code)

    async def aclose(self) -> None:
        """Closes the channel of the running loop, if it made one."""
        if self._channel is not None and self._loop is asyncio.get_running_loop():
            await self._channel.close()
        self._channel = self._loop = None


# ---------------------------------------------------------------------------------- Describe

@dataclass(frozen=True)
class RemoteDescription:
    """A Describe's answer, checked."""

    display_name: str
    description: str
    version: str
    tool_schemas: tuple[Mapping[str, Any], ...]
    max_turns: int
    columns: tuple[str, ...]
    instruction: str
    tool_timeout_seconds: float

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(s["function"]["name"] for s in self.tool_schemas)


def tool_schema(text: str, index: int = 0) -> dict[str, Any]:
    """One tool's schema (a JSON object, OpenAI function style, wrapped or bare) in the form a chat
    template takes: {"type": "function", "function": {"name", "description", "parameters"}}.
    _Garbage saying what is wrong."""
    what = f"tool {index + 1}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Garbage(f"{what} is not JSON ({e.msg} at {e.pos}): {text[:60]!r}") from None
    if not isinstance(data, dict):
        raise _Garbage(f"{what} is JSON {type(data).__name__}, not an object")
    fn = data.get("function") if data.get("type") == "function" else data
    if not isinstance(fn, dict):
        raise _Garbage(f"{what}: 'function' is not an object")
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
        raise _Garbage(f"{what}: name {name!r} is not 1-64 letters, digits, _ or -")
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise _Garbage(f"tool {name!r}: description is not a string")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise _Garbage(f"tool {name!r}: parameters is not a JSON Schema of type object")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise _Garbage(f"tool {name!r}: parameters.properties is not an object")
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {**parameters, "type": "object"}}}


def describe(key: str, response: env_pb2.DescribeEnvironmentResponse,
             default_tool_timeout: float = TOOL_TIMEOUT_DEFAULT) -> RemoteDescription:
    """Checks a Describe answer for `key`; _Garbage saying what is wrong."""
    if response.key and response.key != key:
        raise _Garbage(f"it answers for key {response.key!r}")
    schemas = [tool_schema(text, i) for i, text in enumerate(response.tools)]
    names = [s["function"]["name"] for s in schemas]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _Garbage(f"tool {', '.join(twice)} declared twice")
    max_turns = response.max_turns or MAX_TURNS_DEFAULT
    if not 1 <= max_turns <= 64:
        raise _Garbage(f"max_turns {response.max_turns} is out of range 1-64")
    timeout = response.tool_timeout_seconds or default_tool_timeout
    if not (math.isfinite(timeout) and 0 < timeout <= 600):
        raise _Garbage(f"tool_timeout_seconds {response.tool_timeout_seconds!r} is out of range (0-600]")
    return RemoteDescription(
        display_name=response.display_name.strip() or key, description=response.description,
        version=response.version or "1", tool_schemas=tuple(schemas), max_turns=max_turns,
        columns=tuple(response.columns), instruction=response.instruction, tool_timeout_seconds=timeout)


def _definition(connection: RemoteConnection, described: RemoteDescription) -> EnvironmentDefinition:
    def factory(settings: Mapping[str, str]) -> Environment:
        return RemoteEnvironment(connection, described, settings)

    return EnvironmentDefinition(
        key=connection.key, display_name=described.display_name, description=described.description,
        version=described.version, columns=described.columns, instruction=described.instruction,
        tools=described.tool_names, max_turns=described.max_turns,
        tool_timeout_seconds=described.tool_timeout_seconds, source=f"remote {connection.address}",
        factory=factory)


def _checked(connection: RemoteConnection, response: env_pb2.DescribeEnvironmentResponse) -> EnvironmentDefinition:
    try:
        return _definition(connection, describe(connection.key, response, connection.tool_timeout_seconds))
    except (_Garbage, ValueError) as e:
        raise connection.error("Describe", str(e)) from None


def remote_definition(key: str, address: str, *, auth: ChannelAuth | None = None, timeout_seconds: float = 30.0,
                      tool_timeout_seconds: float = TOOL_TIMEOUT_DEFAULT,
                      wait_seconds: float = 0.0) -> EnvironmentDefinition:
    """The definition of the environment `key` served at `address`, from its Describe (waiting up
    to `wait_seconds` for it to answer). RemoteEnvironmentError naming the key and the address when
    it is down or answers garbage. Synchronous: from a coroutine, use `remote_definition_async`."""
    connection = RemoteConnection(key, address, auth=auth, timeout_seconds=timeout_seconds,
                                  tool_timeout_seconds=tool_timeout_seconds, wait_seconds=wait_seconds)
    return _checked(connection, connection.call_sync("Describe", env_pb2.DescribeEnvironmentRequest(key=key),
                                                     wait=True))


async def remote_definition_async(key: str, address: str, *, auth: ChannelAuth | None = None,
                                  timeout_seconds: float = 30.0, tool_timeout_seconds: float = TOOL_TIMEOUT_DEFAULT,
                                  wait_seconds: float = 0.0) -> EnvironmentDefinition:
    """`remote_definition` for asyncio code."""
    connection = RemoteConnection(key, address, auth=auth, timeout_seconds=timeout_seconds,
                                  tool_timeout_seconds=tool_timeout_seconds, wait_seconds=wait_seconds)
    response = await connection.call("Describe", env_pb2.DescribeEnvironmentRequest(key=key), wait=True)
    return _checked(connection, response)


def settings_auth(key: str, settings: RemoteEnvironmentSettings) -> ChannelAuth:
    """The token and CA of a key's settings, read from their files (SettingsError naming them)."""
    what = f"remote_environments.{key}"
    token = read_secret_file(settings.token_file, f"{what}.token_file") if settings.token_file is not None else None
    ca = None
    if settings.tls_ca_file is not None:
        try:
            ca = settings.tls_ca_file.read_bytes()
        except OSError as e:
            raise SettingsError(f"{what}.tls_ca_file: cannot read {settings.tls_ca_file}: {e.strerror}") from None
    return ChannelAuth(token=token, ca=ca)


def remote_definitions(
    entries: Mapping[str, RemoteEnvironmentSettings],
) -> tuple[list[EnvironmentDefinition], dict[str, str]]:
    """Every mapped key's definition, and for each key that could not be had (down, garbage, an
    unreadable token file) its one-line error: what the registry merges, and what a job naming a
    failed key fails with."""
    found: list[EnvironmentDefinition] = []
    errors: dict[str, str] = {}
    for key, entry in entries.items():
        try:
            found.append(remote_definition(
                key, entry.address, auth=settings_auth(key, entry), timeout_seconds=entry.timeout_seconds,
                tool_timeout_seconds=entry.tool_timeout_seconds, wait_seconds=entry.wait_seconds))
        except (RemoteEnvironmentError, SettingsError) as e:
            errors[key] = str(e)
    return found, errors


# ---------------------------------------------------------------------------------- one episode

def _value(value: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int | float):
        out.number_value = float(value)
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, Mapping):
        out.struct_value.update({str(k): _plain(v) for k, v in value.items()})
    elif isinstance(value, Sequence | set | frozenset):
        out.list_value.extend([_plain(v) for v in value])
    else:
        out.string_value = str(value)
    return out


def _plain(value: Any) -> Any:
    """A value Struct.update takes: JSON's types, anything else as its string."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT_CHARS:
        raise _Garbage(f"{what} has {len(value)} characters, more than {MAX_TEXT_CHARS}")
    return value


@dataclass(frozen=True)
class _Finished:
    reward: Any
    state: Mapping[str, Any]


class RemoteEnvironment(Environment):
    """One episode on a remote environment server (its methods are coroutines). Made by the key's
    definition (`remote_definition`) with the job's environment settings."""

    def __init__(self, connection: RemoteConnection, described: RemoteDescription,
                 settings: Mapping[str, str] | None = None) -> None:
        self.connection = connection
        self.described = described
        self.settings = {str(k): str(v) for k, v in (settings or {}).items()}
        self.episode_id = uuid.uuid4().hex
        self._started = False
        self._closed = False
        self._failure: RemoteEnvironmentError | None = None
        self._finished: _Finished | None = None

    @property
    def key(self) -> str:
        return self.connection.key

    @property
    def failure(self) -> RemoteEnvironmentError | None:
        """The failure that ended this episode, if one did."""
        return self._failure

    def _check(self, call: str) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise self._fail(self.connection.error(call, "the episode is closed"))
        if not self._started and call != "Reset":
            raise self._fail(self.connection.error(call, "the episode was never reset"))

    def _fail(self, error: RemoteEnvironmentError) -> RemoteEnvironmentError:
        self._failure = error
        return error

    async def _call(self, rpc: str, request: Message, **kwargs: Any) -> Any:
        self._check(rpc)
        try:
            return await self.connection.call(rpc, request, **kwargs)
        except RemoteEnvironmentError as e:
            raise self._fail(e) from None

    async def reset(self, row: EpisodeRow) -> str | None:  # type: ignore[override]  # base: "any method may be async"
        request = env_pb2.ResetEpisodeRequest(
            key=self.key, episode_id=self.episode_id, prompt=row.prompt, ground_truth=row.ground_truth,
            messages=[common_pb2.ChatMessage(role=role, content=content) for role, content in row.messages],
            seed=row.seed % (1 << 64), settings=self.settings)
        for name, value in row.columns.items():
            request.columns[str(name)].CopyFrom(_value(value))
        response = await self._call("Reset", request, wait=True)
        self._started = True
        try:
            addition = _text(response.prompt_addition, "prompt_addition")
        except _Garbage as e:
            raise self._fail(self.connection.error("Reset", str(e))) from None
        return addition or None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' schemas as Describe declared them, in the chat template's form."""
        return [json.loads(json.dumps(s)) for s in self.described.tool_schemas]

    def tools(self) -> list[Callable[..., Any]]:
        """One coroutine function per declared tool, taking its arguments as keywords and answering
        the tool's result (a string); each has the attribute ``__rlvr_tool_schema__``."""
        return [self._tool(schema) for schema in self.described.tool_schemas]

    def _tool(self, schema: Mapping[str, Any]) -> Callable[..., Any]:
        name = schema["function"]["name"]

        async def call(**arguments: Any) -> str:
            return await self.call_tool(name, arguments)

        call.__name__ = call.__qualname__ = name
        call.__doc__ = schema["function"]["description"]
        call.__rlvr_tool__ = True  # type: ignore[attr-defined]
        call.__rlvr_tool_schema__ = schema  # type: ignore[attr-defined]
        return call

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """One tool call: its result; RemoteToolError for the tool's own error, TimeoutError past
        its time limit, RemoteEnvironmentError when the server fails."""
        try:
            arguments_json = json.dumps(dict(arguments), default=str)
        except (TypeError, ValueError) as e:
            raise RemoteToolError(f"arguments of {name} are not JSON: {e}") from None
        request = env_pb2.CallToolRequest(episode_id=self.episode_id, name=name, arguments_json=arguments_json)
        self._check("CallTool")
        timeout = self.described.tool_timeout_seconds
        try:
            response = await self.connection.call("CallTool", request, timeout=timeout)
        except RemoteEnvironmentError as e:
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:  # the tool was slow, not the server gone
                raise TimeoutError(f"tool {name} took more than {timeout:g} s") from None
            raise self._fail(e) from None
        try:
            if response.error:
                raise RemoteToolError(_text(response.error, "the tool's error"))
            return _text(response.content, "the tool's content")
        except _Garbage as e:
            raise self._fail(self.connection.error("CallTool", str(e))) from None

    async def step(self, text: str) -> Reply:  # type: ignore[override]
        response = await self._call("Step", env_pb2.StepEpisodeRequest(episode_id=self.episode_id, text=text))
        try:
            reply = response.text if response.HasField("text") else None
            if reply is not None:
                _text(reply, "text")
            reward = response.reward if response.HasField("reward") else None
            if reward is not None and not (math.isfinite(reward) and -1.0 <= reward <= 1.0):
                raise _Garbage(f"reward {reward!r} is not a finite number in [-1, 1]")
        except _Garbage as e:
            raise self._fail(self.connection.error("Step", str(e))) from None
        return Reply(text=reply, done=response.done, reward=reward)

    async def _finish(self) -> _Finished:
        if self._finished is not None:
            return self._finished
        response = await self._call("Finish", env_pb2.FinishEpisodeRequest(episode_id=self.episode_id))
        try:
            self._finished = _Finished(self._reward(response), self._state(response.state_json))
        except _Garbage as e:
            raise self._fail(self.connection.error("Finish", str(e))) from None
        return self._finished

    @staticmethod
    def _reward(response: env_pb2.FinishEpisodeResponse) -> Any:
        from rlvr.rewards.combine import normalize
        from rlvr.rewards.registry import RewardOutput

        if not response.HasField("reward"):
            if response.components:
                raise _Garbage("components without a reward")
            return None
        try:
            output = normalize(RewardOutput(response.reward, dict(response.components)))
        except (TypeError, ValueError) as e:
            raise _Garbage(str(e)) from None
        return output if output.components else output.score

    @staticmethod
    def _state(text: str) -> Mapping[str, Any]:
        if not text.strip():
            return {}
        _text(text, "state_json")
        try:
            state = json.loads(text)
        except json.JSONDecodeError as e:
            raise _Garbage(f"state_json is not JSON ({e.msg} at {e.pos}): {text[:60]!r}") from None
        if not isinstance(state, dict):
            raise _Garbage(f"state_json is JSON {type(state).__name__}, not an object")
        return state

    async def reward(self) -> Any:
        """Finish's reward: None (the job's reward scores), a number in [0, 1], or a RewardOutput
        with its components."""
        return (await self._finish()).reward

    async def state(self) -> Mapping[str, Any]:  # type: ignore[override]
        """Finish's state_json, as a dict."""
        return (await self._finish()).state

    async def close(self) -> None:  # type: ignore[override]
        """Close, once, whatever happened before (best effort: a failure is logged, not raised)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.connection.call("Close", env_pb2.CloseEpisodeRequest(episode_id=self.episode_id),
                                       timeout=min(CLOSE_TIMEOUT_S, self.connection.timeout_seconds))
        except RemoteEnvironmentError as e:
            log.info("%s", e)
