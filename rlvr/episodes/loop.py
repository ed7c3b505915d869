"""The episode loop: one episode's turns between a policy and an environment, token in, token out.

`run_episode` drives one `Environment` (rlvr/environments/base.py) with a `TurnSampler` (anything
that samples a turn's tokens from a prompt's ids: the rollout service, an in-process model, a script
of ids in the tests) and a `ChatCodec` (chat.py: the model's template as token operations):

    reset -> prompt ids -> [sample a turn -> tool calls? run them : environment's step] ... -> score

The sampled ids are kept as sampled; what follows them (the rest of the turn's closing, tool results,
the environment's reply, the next turn's header) is tokenized once and appended with mask 0. Nothing
already in the sample is ever rendered again. Limits: `EpisodeLimits.max_turns` assistant turns, the
job's per-turn completion limit (max_completion_tokens applies PER TURN), and a cap on the tokens of
the whole episode (sampled + observations): an observation that would pass it is rolled back (not
appended; counted in `observations_cut`) and the episode ends there, as does a turn cut at its limit.

Failures: a tool's failure is an error observation the policy sees (tools.py); the environment
raising in reset/step/reward, or a remote environment failing, ends that episode with `error` set
(scored 0 by the caller); the sampler raising (the rollout service gone) propagates: that is the
job's failure, as for single-answer rollouts.

`run_episodes` runs many episodes concurrently: each awaits only its own turns and tools, so an
episode waiting on a slow tool holds up no other (no per-turn barrier across the batch).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rlvr.environments.base import Environment, EnvironmentFailure, EpisodeRow, Reply
from rlvr.episodes.types import Episode, EpisodeSample, TurnRecord
from rlvr.seeds import prompt_seed

log = logging.getLogger("rlvr.episodes")

__all__ = ["EpisodeLimits", "EpisodeTask", "TurnOutput", "TurnSampler", "run_episode", "run_episodes",
           "turn_seed"]


@dataclass(frozen=True)
class TurnOutput:
    """One sampled turn: its ids (the stop token included when it stopped), their sampling logprobs
    (None when the sampler does not report them), why it ended, and the policy that sampled it."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" or "length"
    adapter_name: str = ""
    adapter_version: int = 0


class TurnSampler(Protocol):
    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
        """One completion of `prompt_ids`, at most `max_tokens` long, from the random stream `seed`."""
        ...


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_episode_tokens: int  # sampled + observation tokens of the whole episode
    tool_timeout_seconds: float = 10.0
    min_turn_tokens: int = 1  # a turn with less room than this is not sampled (the sampler's floor)
    max_context_tokens: int = 0  # the engine's context (prompt + completion) limit; 0: none


@dataclass
class EpisodeTask:
    """One episode to run: a fresh environment, its row, the prompt's messages before `reset`, and
    the episode's seed (turn t samples from `turn_seed(seed, t)`)."""

    environment: Environment
    row: EpisodeRow
    messages: list[dict[str, Any]]
    seed: int


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn `turn` of the episode seeded `seed` (rlvr/seeds.py's mixing)."""
    return prompt_seed(seed, turn)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """An environment method, awaited when `async def`, else run in a worker thread: a slow plain
    method holds up its own episode only."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    return await result if inspect.isawaitable(result) else result


def _schemas(env: Environment) -> list[dict[str, Any]]:
    """The tools' JSON schemas as the chat template takes them (a remote environment has its own)."""
    own = getattr(env, "tool_schemas", None)
    if callable(own):
        return list(own())
    from rlvr.environments.tools import tool_schemas

    return tool_schemas(env)


def _tools_by_name(env: Environment) -> dict[str, Callable[..., Any]]:
    return {getattr(fn, "__name__", str(i)): fn for i, fn in enumerate(env.tools())}


async def run_episode(task: EpisodeTask, sampler: TurnSampler, codec_for: Callable[[list[dict[str, Any]]], Any],
                      limits: EpisodeLimits, decode: Callable[[list[int]], str]) -> Episode:
    """Runs one episode to its end; `codec_for(tool schemas)` gives the ChatCodec to render with,
    `decode(ids)` a turn's text (special tokens skipped)."""
    own = getattr(task.environment, "run_episode", None)
    if own is not None:  # an agent program drives its own episode (rlvr/agents)
        return await own(task, sampler, codec_for, limits, decode)
    started = time.perf_counter()
    env, messages = task.environment, [dict(m) for m in task.messages]
    episode = Episode(messages=messages, samples=[])
    try:
        try:
            addition = await _call(env.reset, task.row)
            if addition:
                _add_to_prompt(messages, str(addition))
            tools = _tools_by_name(env)
            codec = codec_for(_schemas(env) if tools else [])
        except Exception as exc:  # noqa: BLE001 - the environment's failure ends this episode only
            return _failed(episode, "reset", exc, started)
        try:
            sample = EpisodeSample(prompt_ids=list(codec.prompt_ids(messages)))
        except Exception as exc:  # noqa: BLE001 - the chat template refuses the row's conversation
            return _failed(episode, "template", exc, started)
        episode.samples.append(sample)
        used = 0  # sampled + observation tokens of the episode so far
        floor = max(1, limits.min_turn_tokens)
        for turn in range(limits.max_turns):
            room = min(limits.max_tokens_per_turn, limits.max_episode_tokens - used)
            if limits.max_context_tokens:
                room = min(room, limits.max_context_tokens - len(sample.prompt_ids) - len(sample.completion_ids))
            if room < floor:
                episode.truncated, episode.ended_by = True, "token_cap"
                break
            out = await sampler.sample(sample.prompt_ids + sample.completion_ids, room, turn_seed(task.seed, turn))
            sample.append_sampled(list(out.token_ids), out.logprobs, out.adapter_name, out.adapter_version)
            used += len(out.token_ids)
            text = decode(list(out.token_ids))
            calls, malformed = codec.parse_tool_calls(text)
            messages.append(codec.assistant_message(text, calls))
            record = TurnRecord(assistant=text, adapter_version=out.adapter_version,
                                sampled_tokens=len(out.token_ids), finish_reason=out.finish_reason)
            episode.turns.append(record)
            episode.final_answer = text
            if out.finish_reason == "length":
                episode.truncated, episode.ended_by = True, "length"
                break
            if out.token_ids and out.token_ids[-1] not in getattr(codec, "turn_enders", [out.token_ids[-1]]):
                # Stopped on an end-of-text the template never puts after a turn: nothing can be
                # appended that the template would render, so the episode ends at this answer.
                episode.ended_by = "other_stop"
                break
            if calls or malformed:
                try:
                    new = await _run_calls(episode, record, codec, tools, calls, malformed, limits)
                except EnvironmentFailure as exc:
                    return _failed(episode, "tool", exc, started)
            else:
                try:
                    reply = await _call(env.step, text)
                except Exception as exc:  # noqa: BLE001
                    return _failed(episode, "step", exc, started)
                reply = reply if isinstance(reply, Reply) else Reply(done=True)
                if reply.reward is not None:
                    record.reward = float(reply.reward)
                    episode.turn_rewards.append(float(reply.reward))
                if reply.done or reply.text is None:
                    episode.ended_by = "done" if reply.done else "answer"
                    break
                record.reply = reply.text
                new = [{"role": "user", "content": reply.text}]
            if turn + 1 == limits.max_turns:
                messages.extend(new)  # the conversation shows them; no turn follows to train on
                episode.ended_by = "max_turns"
                break
            try:
                ids = codec.after_turn(messages, new)
                if ids is None:  # the template re-renders earlier turns: a new sample, rendered afresh
                    messages.extend(new)
                    sample = EpisodeSample(prompt_ids=list(codec.prompt_ids(messages)))
                    episode.samples.append(sample)
                    continue
            except Exception as exc:  # noqa: BLE001 - the template refuses what the turn made (Llama 3's one call)
                return _failed(episode, "template", exc, started)
            if used + len(ids) + floor > limits.max_episode_tokens:
                # No room left for a turn after it: the observation is rolled back (not appended,
                # not in the conversation) and the episode ends at the answer before it.
                episode.observations_cut += 1
                episode.truncated, episode.ended_by = True, "token_cap"
                break
            messages.extend(new)
            sample.append_observation(list(ids))
            used += len(ids)
            record.observation_tokens = len(ids)
            episode.observation_tokens += len(ids)
        else:
            episode.ended_by = episode.ended_by or "max_turns"
        try:
            episode.env_reward = await _call(env.reward)
            episode.env_state = dict(await _call(env.state) or {})
        except Exception as exc:  # noqa: BLE001
            return _failed(episode, "reward", exc, started)
        episode.seconds = time.perf_counter() - started
        return episode
    finally:
        try:
            await _call(env.close)
        except Exception:  # noqa: BLE001 - a failing close changes nothing the episode recorded
            log.warning("environment close failed", exc_info=True)


async def _run_calls(episode: Episode, record: TurnRecord, codec: Any, tools: Mapping[str, Callable[..., Any]],
                     calls: Sequence[Any], malformed: Sequence[str], limits: EpisodeLimits) -> list[dict[str, Any]]:
    """The turn's tool calls run (concurrently, results in call order) and malformed ones answered
    with an error; the tool messages to append."""
    from rlvr.environments.tools import run_tool

    results = await asyncio.gather(*(run_tool(tools, call, limits.tool_timeout_seconds) for call in calls))
    new = []
    for call, result in zip(calls, results, strict=True):
        episode.tool_calls += 1
        episode.tool_seconds += result.seconds
        episode.tool_errors += bool(result.error)
        record.tool_calls.append({"name": call.name, "arguments": dict(call.arguments), "result": result.content,
                                  "error": result.error, "seconds": round(result.seconds, 4)})
        new.append(codec.tool_message(call, result.content))
    for error in malformed:
        episode.tool_calls += 1
        episode.tool_errors += 1
        record.tool_calls.append({"name": "", "arguments": {}, "result": "", "error": error, "seconds": 0.0})
        new.append({"role": "tool", "content": f"error: {error}"})
    return new


def _add_to_prompt(messages: list[dict[str, Any]], text: str) -> None:
    """`reset`'s text added to the last user message (a user message of its own when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            message["content"] = f"{message.get('content', '')}\n\n{text}".strip()
            return
    messages.append({"role": "user", "content": text})


def _failed(episode: Episode, stage: str, exc: BaseException, started: float) -> Episode:
    episode.error = f"environment {stage} failed: {type(exc).__name__}: {exc}"[:500]
    episode.ended_by = "error"
    episode.seconds = time.perf_counter() - started
    if not episode.samples:
        episode.samples.append(EpisodeSample(prompt_ids=[]))
    return episode


async def run_episodes(tasks: Sequence[EpisodeTask], sampler: TurnSampler,
                       codec_for: Callable[[list[dict[str, Any]]], Any], limits: EpisodeLimits,
                       decode: Callable[[list[int]], str]) -> list[Episode]:
    """Every task's episode, run concurrently, in the tasks' order. A sampler failure (the rollout
    service gone) cancels the other episodes and is raised: no turn generates for a step that failed."""
    try:
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(run_episode(t, sampler, codec_for, limits, decode)) for t in tasks]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in running]


def episode_json(episode: Episode) -> str:
    """An episode's turns as JSON (what an evaluation row and the console show)."""
    return json.dumps({"turns": [t.__dict__ for t in episode.turns], "ended_by": episode.ended_by,
                       "error": episode.error, "tool_calls": episode.tool_calls, "tool_errors": episode.tool_errors},
                      default=str)
