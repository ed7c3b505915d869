"""An agent program as the policy: a function written against the `openai` client, declared once.

::

    from rlvr.agents import AgentResult, agent

    @agent("my_agent", display_name="My agent", version="1")
    async def my_agent(client: openai.AsyncOpenAI, row: AgentRow) -> float | AgentResult | None:
        reply = await client.chat.completions.create(model="policy", messages=row.messages, tools=TOOLS)
        ...

`agent` makes an `EnvironmentDefinition` (so an agent is found through the entry-point group
``rlvr.environments``, listed by ``rlvr environments``, named by a job's ``environment.key`` and used
by evaluations and loops exactly as an environment is). Its episodes run differently: instead of
rlvr's episode loop calling the policy and the environment in turn, the agent's own code runs, and
every chat completion it asks for goes to the process's OpenAI-compatible endpoint (gateway.py),
which samples from the job's policy and records the tokens (recorder.py).

What the agent returns scores the episode: a number (the reward, in [0, 1]), named components, a
`AgentResult` (the reward with its components and the final answer), or None, when the job's own
reward scores the last answer (or the `AgentResult`'s ``answer``) as it scores an environment's.
An agent that raises or whose own time (its waits for the policy not counted) passes
``timeout_seconds`` ends its episode with the reason, scored 0
and not trained on; the job fails only when every episode of a step failed.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlvr.environments.base import MAX_TURNS_DEFAULT, Environment, EnvironmentDefinition
from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, TurnSampler
from rlvr.episodes.types import Episode, EpisodeSample
from rlvr.rewards.registry import RewardOutput

__all__ = ["AgentEnvironment", "AgentResult", "AgentRow", "agent"]

TIMEOUT_DEFAULT = 300.0
MAX_TIMEOUT = 3600.0
CALL_TIMEOUT_SECONDS = 3600.0  # one model call's HTTP time limit (the gateway's own wait)


@dataclass(frozen=True)
class AgentRow:
    """The dataset row an agent episode runs on."""

    prompt: str  # the question as the dataset states it
    ground_truth: str = ""
    columns: Mapping[str, Any] = field(default_factory=dict)
    # The job's prompt as chat messages (its system prompt and the instruction included): where the
    # agent's conversation starts, so its first call renders as an environment episode's first turn.
    messages: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 0  # the episode's own seed


@dataclass(frozen=True)
class AgentResult:
    """What an agent may return: its reward (None: the job's reward scores ``answer``), named
    components, and the final answer (default: the last answer the policy gave)."""

    reward: float | None = None
    components: Mapping[str, float] = field(default_factory=dict)
    answer: str | None = None


class AgentTimeout(TimeoutError):
    """The agent's own time in its episode passed its ``timeout_seconds``."""


AgentFunction = Callable[..., Any]  # (openai client, row) -> result, or an awaitable of one
MAX_PLAIN_AGENTS = 1024  # plain (not async) agents running at once in a process, a thread each
_plain_pool: ThreadPoolExecutor | None = None
_plain_lock = threading.Lock()


def _plain_agents() -> ThreadPoolExecutor:
    """The process's threads for plain agents (started as episodes need them, kept for the next)."""
    global _plain_pool
    with _plain_lock:
        if _plain_pool is None:
            _plain_pool = ThreadPoolExecutor(MAX_PLAIN_AGENTS, thread_name_prefix="rlvr-agent")
        return _plain_pool
F = TypeVar("F", bound=AgentFunction)


class AgentEnvironment(Environment):
    """One agent episode: `run_episode` runs the agent's function in place of rlvr's episode loop
    (rlvr/episodes/loop.py hands an environment with a ``run_episode`` its episode)."""

    def __init__(self, fn: AgentFunction, timeout_seconds: float = TIMEOUT_DEFAULT) -> None:
        self.fn = fn
        self.timeout_seconds = timeout_seconds

    async def run_episode(self, task: EpisodeTask, sampler: TurnSampler,
                          codec_for: Callable[[list[dict[str, Any]]], Any], limits: EpisodeLimits,
                          decode: Callable[[list[int]], str]) -> Episode:
        from rlvr.agents.gateway import Gateway
        from rlvr.agents.recorder import EpisodeRecorder

        started = time.perf_counter()
        recorder = EpisodeRecorder(sampler, codec_for, limits, decode, task.seed)
        episode = recorder.episode
        episode.messages = [dict(m) for m in task.messages]
        row = AgentRow(prompt=task.row.prompt, ground_truth=task.row.ground_truth, columns=dict(task.row.columns),
                       messages=[dict(m) for m in task.messages], seed=task.row.seed)
        gateway = Gateway.shared()
        key = gateway.open(recorder, asyncio.get_running_loop())
        try:
            result: Any = await self._run(gateway.base_url(key), key, row, recorder.policy_seconds)
        except Exception as exc:  # noqa: BLE001 - the agent's failure ends this episode only
            result = exc
        finally:
            gateway.close(key)
        if recorder.sampler_error is not None:  # the policy's server failed: the step fails, as for an environment
            raise recorder.sampler_error
        episode.seconds = time.perf_counter() - started
        episode.env_state = {"model_calls": len(episode.turns), "splits": recorder.splits,
                             "history_rewrites": recorder.rewrites, "calls_past_limits": recorder.refused}
        if not episode.samples:
            episode.samples.append(EpisodeSample(prompt_ids=[]))
        if isinstance(result, BaseException):
            episode.error = (f"the agent took longer than its time limit of {self.timeout_seconds:g} s "
                             "(its own time, waits for the policy not counted)"
                             if isinstance(result, AgentTimeout) else
                             f"the agent raised {type(result).__name__}: {result}")[:500]
            episode.ended_by = "error"
            return episode
        try:
            self._score(episode, result)
        except (TypeError, ValueError) as exc:
            episode.error = f"the agent's result: {exc}"[:500]
            episode.ended_by = "error"
            return episode
        if not episode.ended_by:
            last = episode.turns[-1].finish_reason if episode.turns else ""
            episode.ended_by = "length" if last == "length" else ("answer" if episode.turns else "no_calls")
        return episode

    async def _limited(self, work: Awaitable[Any], waiting: Callable[[], float]) -> Any:
        """``work``'s result, cancelled with TimeoutError once the agent's own time (the episode's
        time less its waits for the policy, `waiting()`) passes ``timeout_seconds``: a policy
        server busy with a whole step's episodes does not time the agents out."""
        task = asyncio.ensure_future(work)
        started = time.perf_counter()
        try:
            while True:
                left = self.timeout_seconds - (time.perf_counter() - started - waiting())
                if left <= 0:
                    raise AgentTimeout(f"the agent's own time passed {self.timeout_seconds:g} s")
                # at least 50 ms a wait: while a call waits for the policy `left` stays put
                done, _ = await asyncio.wait({task}, timeout=max(left, 0.05))
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _run(self, base_url: str, key: str, row: AgentRow, waiting: Callable[[], float]) -> Any:
        import openai

        timeout = CALL_TIMEOUT_SECONDS  # each HTTP call: the policy may be busy with the whole step
        # The endpoint is plain HTTP on this host's loopback: no proxy the environment names may carry
        # the calls (HTTP_PROXY without 127.0.0.1 in NO_PROXY failed every call), and no TLS, so no
        # certificate store is loaded (50-120 ms a client, on the episode's event loop, where every
        # episode of the step or batch makes its own).
        if inspect.iscoroutinefunction(self.fn):
            client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout,
                                        http_client=openai.DefaultAsyncHttpxClient(trust_env=False, verify=False))
            try:
                return await self._limited(self.fn(client, row), waiting)
            finally:
                await client.close()
        sync_client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout,
                                    http_client=openai.DefaultHttpxClient(trust_env=False, verify=False))
        try:
            # A plain function runs in a thread of its own (a late one's calls are refused once its key
            # expires): not the loop's default pool, whose few threads (cpu count + 4, at most 32) made
            # the step's other plain agents wait.
            running = asyncio.get_running_loop().run_in_executor(_plain_agents(), self.fn, sync_client, row)
            value = await self._limited(running, waiting)
            return await value if inspect.isawaitable(value) else value
        finally:
            sync_client.close()

    @staticmethod
    def _score(episode: Episode, result: Any) -> None:
        """The agent's return as the episode's reward (None: the job's reward scores the answer)."""
        if result is None:
            return
        if isinstance(result, AgentResult):
            if result.answer is not None:
                episode.final_answer = str(result.answer)
            if result.reward is None:
                if result.components:
                    raise ValueError("components were given without a reward")
                return
            episode.env_reward = RewardOutput(float(result.reward), dict(result.components),
                                              extracted_answer=result.answer)
            return
        if isinstance(result, bool) or not isinstance(result, (int, float, Mapping, RewardOutput)):
            raise TypeError(f"the agent returned a {type(result).__name__}; expected a number, a mapping of named "
                            "components, an AgentResult or None")
        episode.env_reward = result


def agent(
    key: str,
    *,
    display_name: str | None = None,
    description: str = "",
    version: str = "1",
    columns: Sequence[str] = (),
    instruction: str = "",
    default_benchmark: str = "",
    max_turns: int = MAX_TURNS_DEFAULT,
    timeout_seconds: float = TIMEOUT_DEFAULT,
) -> Callable[[F], F]:
    """Declares an agent function ``(client, row) -> result`` (see the module's doc). ``max_turns``
    caps its model calls per episode (a call past it is answered empty with finish_reason
    "length"); ``timeout_seconds`` the agent's own time in an episode (its waits for the policy's
    answers not counted). ValueError naming what is wrong.

    The function is returned as it is, still callable with any OpenAI client outside rlvr; its
    declaration (an `EnvironmentDefinition`) is its ``__rlvr_environment__``, which the entry-point
    registry reads."""

    def make(fn: F) -> F:
        problems = []
        try:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        if len(params) < 2:
            problems.append("the agent must take two arguments: (client, row)")
        if not 0 < timeout_seconds <= MAX_TIMEOUT:
            problems.append(f"timeout_seconds {timeout_seconds} is out of range (0-{MAX_TIMEOUT:g}]")
        if problems:
            raise ValueError(f"agent {key!r}: " + "; ".join(problems))

        def factory(settings: Mapping[str, str]) -> Environment:
            if settings:
                raise ValueError(f"agent {key!r} takes no settings (got {', '.join(sorted(settings))})")
            return AgentEnvironment(fn, timeout_seconds)

        doc = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
        fn.__rlvr_environment__ = EnvironmentDefinition(  # type: ignore[attr-defined]
            key=key, display_name=display_name or key.replace("_", " ").capitalize(),
            description=description or doc, version=version, columns=tuple(columns), instruction=instruction,
            default_benchmark=default_benchmark, tools=(), max_turns=max_turns, factory=factory, settings=(),
        )
        return fn

    return make
