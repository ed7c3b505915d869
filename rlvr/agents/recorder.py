"""One agent episode's chat completions, answered from the policy and recorded token in, token out.

`EpisodeRecorder.complete(body)` answers one OpenAI ``POST /v1/chat/completions`` body (already
parsed from JSON) for its episode, and keeps what the issue "Agents" keeps for an environment's
episode (rlvr/episodes/types.py): the exact prompt ids, the sampled ids with their logprobs and
adapter version, the ids of everything else as observation (mask 0).

How a call's prompt is checked against the episode's history: the recorder holds the conversation as
the template rendered it (``conversation``: the messages of the last call plus the assistant message
it answered with). A call whose messages start with that conversation (compared as messages: role,
text, tool calls by name and arguments, so an agent that echoes the assistant message back in
OpenAI's form matches) continues the sample: only the new messages are rendered, by the chat
codec's ``after_turn`` (the ids that follow the sampled stop token), and appended as observation;
nothing sampled is ever re-tokenized. A call whose messages do not (the agent rewrote, cut or
summarised its history), or whose new messages the template would render by changing earlier text,
starts a new sample from the whole conversation rendered afresh: the episode is split, and counted.

Sampling follows the job, not the request, so that every turn is on-policy and an episode replays
exactly on a resume: the job's temperature, the episode's seed (call k samples from
``turn_seed(seed, k)``), the job's per-turn and per-episode token limits (a request's ``max_tokens``
can only lower them). A call past the episode's turn or token limit is answered without sampling: an
empty assistant message with ``finish_reason="length"``, which ends an ordinary agent loop.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlvr.environments.base import ToolCall
from rlvr.episodes.loop import EpisodeLimits, TurnSampler, turn_seed
from rlvr.episodes.types import Episode, EpisodeSample, TurnRecord

__all__ = ["ChatRequest", "EpisodeRecorder", "RequestError", "parse_request"]

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
MAX_STOP = 4  # OpenAI's limit on stop sequences


class RequestError(ValueError):
    """A request the endpoint refuses, in OpenAI's error form (``status``, ``type``, ``param``, ``code``)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat completion request that the endpoint reads (others are accepted and ignored)."""

    messages: list[dict[str, Any]]  # as the chat template takes them (see `template_message`)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    model: str = ""


def _text(content: Any, where: str, problems: list[str]) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                problems.append(f"{where}.content[{i}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                "are supported")
        return "".join(parts)
    problems.append(f"{where}.content: must be a string, null or a list of text parts, got {type(content).__name__}")
    return ""


def _arguments(raw: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg})")
            return {}
        if isinstance(value, Mapping):
            return dict(value)
    problems.append(f"{where}: must be a JSON object (or a string of one)")
    return {}


def _message(raw: Any, i: int, problems: list[str]) -> dict[str, Any]:
    """One request message in the chat template's form: assistant ``tool_calls`` with their
    arguments as objects, text content as a string."""
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: must be an object with a role and content")
        return {}
    role = raw.get("role")
    if role not in ROLES:
        problems.append(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        return {}
    message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text(raw.get("content"), where, problems)}
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        if not isinstance(calls, list):
            problems.append(f"{where}.tool_calls: must be a list")
            calls = []
        message["tool_calls"] = []
        for k, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                problems.append(f"{where}.tool_calls[{k}]: must be {{\"type\": \"function\", \"function\": "
                                "{\"name\": ..., \"arguments\": ...}}")
                continue
            entry = {"type": "function", "function": {
                "name": fn["name"], "arguments": _arguments(fn.get("arguments", {}), f"{where}.tool_calls[{k}]"
                                                            ".function.arguments", problems)}}
            if isinstance(call.get("id"), str) and call["id"]:
                entry["id"] = call["id"]
            message["tool_calls"].append(entry)
    if role == "tool":
        if isinstance(raw.get("tool_call_id"), str):
            message["tool_call_id"] = raw["tool_call_id"]
        if isinstance(raw.get("name"), str):
            message["name"] = raw["name"]
    return message


def parse_request(body: Any) -> ChatRequest:
    """The request's fields, checked; RequestError naming every bad field and what is allowed."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    problems: list[str] = []
    raw_messages = body.get("messages")
    messages: list[dict[str, Any]] = []
    if not isinstance(raw_messages, list) or not raw_messages:
        problems.append("messages: must be a non-empty list of messages")
    else:
        messages = [_message(m, i, problems) for i, m in enumerate(raw_messages)]
    tools = body.get("tools") or []
    if not isinstance(tools, list) or any(
            not isinstance(t, Mapping) or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), Mapping) or not isinstance(t["function"].get("name"), str)
            for t in tools):
        problems.append("tools: must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., "
                        "\"description\": ..., \"parameters\": {...}}}")
        tools = []
    choice = body.get("tool_choice", "auto")
    if choice is None:
        choice = "auto"
    if not (choice in TOOL_CHOICES or (isinstance(choice, Mapping) and choice.get("type") == "function")):
        problems.append(f"tool_choice: {choice!r} is not one of {', '.join(TOOL_CHOICES)} or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        problems.append(f"max_tokens: {max_tokens!r} must be a whole number of at least 1")
        max_tokens = None
    n = body.get("n", 1)
    if n not in (1, None):
        problems.append(f"n: {n!r}; a training episode continues one conversation, so n must be 1 "
                        "(run the agent again for another sample)")
    if body.get("stream"):
        problems.append("stream: streaming is not supported by the training endpoint; send stream=false")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 2):
        problems.append(f"temperature: {temperature!r} must be a number from 0 to 2")
    stop = body.get("stop")
    stops: tuple[str, ...] = ()
    if isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    elif stop is not None:
        problems.append(f"stop: must be a string or a list of at most {MAX_STOP} non-empty strings")
    if problems:
        raise RequestError("; ".join(problems), param=problems[0].split(":", 1)[0].split("[", 1)[0].split(".", 1)[0])
    return ChatRequest(messages=messages, tools=list(tools), tool_choice=choice,
                       max_tokens=max_tokens, stop=stops, model=str(body.get("model") or ""))


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two messages alike as the conversation holds them: role, text, tool calls by name and arguments."""
    def calls(m: Mapping[str, Any]) -> list[tuple[str, str]]:
        return [(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                for c in m.get("tool_calls") or []]
    return (a.get("role") == b.get("role") and (a.get("content") or "").strip() == (b.get("content") or "").strip()
            and calls(a) == calls(b))


@dataclass
class EpisodeRecorder:
    """The recording of one agent episode; `complete` answers its calls one at a time.

    ``codec_for(tool schemas)`` gives the ChatCodec of a call's tools, ``decode(ids)`` a turn's text
    (special tokens skipped): what `run_episode` gets, so an agent's turns render and decode as an
    environment's do."""

    sampler: TurnSampler
    codec_for: Callable[[list[dict[str, Any]]], Any]
    limits: EpisodeLimits
    decode: Callable[[list[int]], str]
    seed: int
    episode: Episode = field(default_factory=lambda: Episode(messages=[], samples=[]))
    conversation: list[dict[str, Any]] = field(default_factory=list)  # what the next call may extend
    rewrites: int = 0  # of those, the agent's history no longer extending the conversation
    refused: int = 0  # calls past the episode's limits, answered without sampling
    sampler_error: BaseException | None = None
    closed: bool = False  # the episode is over: a late call's result is not recorded
    _last_finish: str = "stop"
    _tools: str = ""  # the tools the conversation was rendered with (other tools re-render the prompt)
    _in_calls: int = 0
    _waiting_since: float = 0.0
    _policy_seconds: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def complete(self, body: Any) -> dict[str, Any]:
        """The OpenAI ChatCompletion answering ``body``; RequestError for a request it refuses."""
        request = parse_request(body)
        if self.closed:
            raise RequestError("the episode has ended", status=409, code="episode_ended")
        self._in_calls += 1
        if self._in_calls == 1:
            self._waiting_since = time.perf_counter()
        try:
            async with self._lock:
                return await self._complete(request)
        finally:
            self._in_calls -= 1
            if self._in_calls == 0:
                self._policy_seconds += time.perf_counter() - self._waiting_since

    @property
    def splits(self) -> int:
        """Samples started afresh after the first (a rewritten history, a re-rendering template)."""
        return max(0, len(self.episode.samples) - 1)

    def policy_seconds(self) -> float:
        """The episode's time so far with a call in the endpoint (waiting for the policy): what the
        agent's time limit does not count."""
        now = time.perf_counter()
        return self._policy_seconds + (now - self._waiting_since if self._in_calls else 0.0)

    async def _complete(self, request: ChatRequest) -> dict[str, Any]:
        codec = self.codec_for(request.tools)
        messages = [self._with_names(m) for m in request.messages]
        tools = json.dumps(request.tools, sort_keys=True)
        sample, observation, split = self._prompt(codec, messages, same_tools=tools == self._tools)
        episode, limits, floor = self.episode, self.limits, max(1, self.limits.min_turn_tokens)
        length = len(sample.prompt_ids) + len(sample.completion_ids) + len(observation)
        room = min(limits.max_tokens_per_turn, limits.max_episode_tokens - episode.episode_tokens - len(observation))
        if limits.max_context_tokens:
            room = min(room, limits.max_context_tokens - length)
        past_turns = len(episode.turns) >= limits.max_turns
        # The tool results this call brings go onto the last turn's calls even when nothing more is
        # sampled, as an environment's episode runs and records its last turn's calls.
        self._note_tool_results(messages)
        if past_turns or room < floor:
            # Nothing sampled: the call is answered empty and the episode is marked where it stopped.
            self.refused += 1
            episode.messages = list(messages)  # the conversation shows what the agent last sent
            episode.truncated = True
            episode.ended_by = "max_turns" if past_turns else "token_cap"
            return self._response("", [], "length", 0, length)
        self.rewrites += split == "rewrite"
        if sample is not (episode.samples[-1] if episode.samples else None):
            episode.samples.append(sample)
        if observation:
            sample.append_observation(observation)
            episode.observation_tokens += len(observation)
            if episode.turns:
                episode.turns[-1].observation_tokens = len(observation)
        # The engine samples at least `floor` tokens; a request asking fewer gets the first ones (the
        # rest are dropped, as an engine stopping there would not have sampled them).
        want = min(room, request.max_tokens) if request.max_tokens else room
        try:
            out = await self.sampler.sample(sample.prompt_ids + sample.completion_ids, max(want, floor),
                                            turn_seed(self.seed, len(episode.turns)))
        except Exception as exc:  # the policy's server failed, not the agent: the episode's runner raises it
            self.sampler_error = exc
            raise
        if self.closed:  # the agent returned (or was stopped) while this turn was sampled
            raise RequestError("the episode ended while this call was answered; its answer is not recorded",
                               status=409, code="episode_ended")
        ids, finish = list(out.token_ids), out.finish_reason
        logprobs: Sequence[float] | None = out.logprobs
        cut = len(ids) > want
        if cut:
            ids, logprobs, finish = ids[:want], (logprobs[:want] if logprobs is not None else None), "length"
        text = self.decode(ids)
        stopped = False
        if request.stop:
            ids, logprobs, text, stopped = self._cut_at_stop(ids, logprobs, text, request.stop)
            finish = "stop" if stopped else finish
        sample.append_sampled(ids, list(logprobs) if logprobs is not None else None, out.adapter_name,
                              out.adapter_version)
        calls, malformed = codec.parse_tool_calls(text) if request.tool_choice != "none" else ([], [])
        calls = [replace(c, id=c.id or f"call_{len(episode.turns) + 1}_{k}") for k, c in enumerate(calls)]
        assistant = codec.assistant_message(text, calls)
        record = TurnRecord(assistant=text, adapter_version=out.adapter_version, sampled_tokens=len(ids),
                            finish_reason=finish)
        record.tool_calls = [{"name": c.name, "arguments": dict(c.arguments), "result": "", "error": "",
                              "seconds": 0.0, "id": c.id} for c in calls]
        record.tool_calls += [{"name": "", "arguments": {}, "result": "", "error": e, "seconds": 0.0} for e in malformed]
        episode.tool_calls += len(calls) + len(malformed)
        episode.tool_errors += len(malformed)
        episode.turns.append(record)
        episode.final_answer = text
        self.conversation = [*messages, assistant]
        self._tools = tools
        episode.messages = list(self.conversation)
        # The next call appends to these ids only when the turn ended as sampled on a token the
        # template ends a turn with (a base model's end-of-text is not one: then the next call splits).
        ender = not ids or ids[-1] in getattr(codec, "turn_enders", ids[-1:])
        self._last_finish = "cut" if stopped or cut or not ender else finish
        if finish == "length":
            episode.truncated = True
        reason = "tool_calls" if calls else ("length" if finish == "length" else "stop")
        return self._response(assistant.get("content") or "", calls, reason, len(ids),
                              len(sample.prompt_ids) + len(sample.completion_ids) - len(ids))

    def _with_names(self, message: dict[str, Any]) -> dict[str, Any]:
        """A tool message as rlvr's environments write it (its tool's name, found by the call's id in
        the conversation), so an agent's tool results render as an environment's do."""
        if message.get("role") != "tool" or "name" in message:
            return message
        for earlier in self.conversation:
            for call in earlier.get("tool_calls") or []:
                if call.get("id") and call.get("id") == message.get("tool_call_id"):
                    return {"role": "tool", "name": call["function"]["name"], "content": message["content"],
                            "tool_call_id": message["tool_call_id"]}
        return message

    def _prompt(self, codec: Any, messages: list[dict[str, Any]],
                same_tools: bool) -> tuple[EpisodeSample, list[int], str | None]:
        """The sample this call continues and the observation ids to append to it, or a new sample
        and why the episode splits there ("rewrite": the agent's messages do not extend the
        conversation; "template": the template re-renders earlier text, the last turn was cut, or
        the call offers other tools, which the template renders into the prompt's start)."""
        history = self.conversation
        current = self.episode.samples[-1] if self.episode.samples else None
        extends = (current is not None and len(messages) > len(history)
                   and all(_same(a, b) for a, b in zip(history, messages, strict=False)))
        if extends and self._last_finish == "stop" and same_tools:
            ids = codec.after_turn(history, messages[len(history):])
            if ids is not None:
                return current, list(ids), None  # type: ignore[return-value]
        split = None if current is None else ("template" if extends else "rewrite")
        return EpisodeSample(prompt_ids=list(codec.prompt_ids(messages))), [], split

    def _note_tool_results(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """The tool results this call brings, onto the previous turn's calls (what the console shows)."""
        if not self.episode.turns:
            return
        by_id = {m.get("tool_call_id"): m.get("content", "") for m in messages if m.get("role") == "tool"}
        for call in self.episode.turns[-1].tool_calls:
            if call.get("id") in by_id:
                call["result"] = by_id[call["id"]]

    def _cut_at_stop(self, ids: list[int], logprobs: Sequence[float] | None, text: str,
                     stops: Sequence[str]) -> tuple[list[int], Sequence[float] | None, str, bool]:
        """A stop string's effect, as an engine stopping there: the text before the stop string that
        is completed first; the ids up to the token that completed it (those sampled after it are
        dropped: such an engine would not have sampled them). The token is found by bisection (the
        decoded prefix only grows), a few decodes whatever the turn's length."""
        hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
        if not hits:
            return ids, logprobs, text, False
        _, start, stop = min(hits)
        low, high = 1, len(ids)  # the first prefix whose text holds `stop`
        while low < high:
            mid = (low + high) // 2
            if stop in self.decode(ids[:mid]):
                high = mid
            else:
                low = mid + 1
        return ids[:low], (list(logprobs[:low]) if logprobs is not None else None), text[:start], True

    def _response(self, content: str, calls: Sequence[ToolCall], finish: str, completion_tokens: int,
                  prompt_tokens: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
                                     for c in calls]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": "rlvr-policy",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
