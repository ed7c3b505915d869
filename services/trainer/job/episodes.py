"""A step's rollout as episodes, for a job that names an environment (spec: environment.key).

`Step.rollout` (step.py) hands its prompts here instead of generating one answer each:

1. each of the step's prompts becomes `group_size` episodes, each with a fresh environment
   (`EnvironmentDefinition.make`) and a seed of its own (the step's seed, the prompt's index in the
   step's whole batch, the episode's index in its group: exact resume samples the same turns);
2. the episodes run concurrently (rlvr/episodes/loop.py), every turn one request to the job's
   generator (`GeneratorSampler`: the rollout service, or the job's own model under a lock);
3. each episode is scored: by the environment when it scores itself, else by the job's rewards,
   which read the final answer, the whole conversation and the environment's state (the column
   ``"environment"``); a failed episode scores 0 with its reason, and the step fails only when every
   episode failed (`EpisodeFailure`);
4. TRL gets one row per episode: the episode's prompt ids, its completion (sampled ids with the
   observations between them), the sampling logprobs, and ``env_mask`` (1 on sampled ids): TRL's
   rollout_func contract, so the loss sees sampled tokens only.

An episode the chat template split into several samples (episodes/types.py) trains on its last
sample here (TRL's batch is one row per episode); the earlier ones are counted in
`EpisodeStats.samples_dropped`.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from rlvr.environments.base import EnvironmentDefinition, EpisodeRow
from rlvr.episodes.chat import ChatCodecs
from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, TurnOutput, run_episodes
from rlvr.episodes.scoring import EpisodeScores, episode_score_input, transcript
from rlvr.episodes.types import Episode
from rlvr.peers.types import AdapterTag, Sampling, Score
from rlvr.seeds import offset_seed, prompt_seed
from rlvr.tasks.base import Problem

log = logging.getLogger("rlvr.trainer.episodes")

__all__ = ["EpisodeFailure", "EpisodeRollout", "EpisodeStats", "GeneratorSampler", "episode_score_input",
           "transcript"]

MIN_TURN_TOKENS = 32  # the rollout service's smallest max_tokens (the spec's Max Completion low end)


class EpisodeFailure(RuntimeError):
    """Every episode of a step failed in its environment: the job fails with the first reason."""


class GeneratorSampler:
    """A `TurnSampler` over the job's `PolicyGenerator`: one generate call per turn, with one
    prompt and one completion, from `expected` (or the newest version, asynchronous steps). The
    rollout service's client is thread-safe and serves turns concurrently; an in-process generator
    (the job's own model) serves one turn at a time."""

    def __init__(self, generator: Any, sampling: Sampling, expected: AdapterTag, newest: bool,
                 workers: int) -> None:
        from rlvr.services.trainer.job.rollouts import ServiceGenerator

        self.generator = generator
        self.sampling = sampling  # the job's temperature and sampling controls; each turn sets the rest
        self.expected = expected
        self.newest = newest
        concurrent = isinstance(generator, ServiceGenerator) or hasattr(generator, "replicas")
        self._lock = None if concurrent else threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="episode-turn")
        self.generate_seconds = 0.0
        self.logprobs = True  # every turn came with its sampling logprobs (an in-process model gives none)

    def _one(self, prompt_ids: list[int], sampling: Sampling) -> Any:
        if self._lock is not None:
            with self._lock:
                return self._call(prompt_ids, sampling)
        return self._call(prompt_ids, sampling)

    def _call(self, prompt_ids: list[int], sampling: Sampling) -> Any:
        if self.newest:
            return self.generator.generate_newest([prompt_ids], sampling, self.expected)
        return self.generator.generate([prompt_ids], sampling, self.expected)

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
        # The generator seeds its first prompt as prompt `prompt_offset` of the step (rlvr/seeds.py):
        # a turn's seed already names its episode's place in the whole step, so the offset is taken
        # back out, and a job split over processes samples the turns one process would.
        seed = offset_seed(seed, -getattr(self.generator, "prompt_offset", 0))
        sampling = replace(self.sampling, max_tokens=max_tokens, seed=seed, group_size=1)
        batch = await asyncio.get_running_loop().run_in_executor(self._pool, self._one, prompt_ids, sampling)
        self.generate_seconds += batch.seconds
        logprobs = batch.logprobs[0] if batch.logprobs and batch.logprobs[0] else None
        if logprobs is None:
            self.logprobs = False
        return TurnOutput(list(batch.completion_ids[0]), list(logprobs) if logprobs else None,
                          "length" if batch.clipped[0] else "stop", batch.adapter.name, batch.adapter.version)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class EpisodeStats:
    """A step's episode counters: what its MetricEvent reports."""

    turns: list[int] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    observation_tokens: list[int] = field(default_factory=list)
    episode_tokens: list[int] = field(default_factory=list)
    truncated: int = 0
    failed: int = 0
    samples_dropped: int = 0

    def add(self, episode: Episode) -> None:
        self.turns.append(len(episode.turns))
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors
        self.tool_seconds += episode.tool_seconds
        self.observation_tokens.append(episode.observation_tokens)
        self.episode_tokens.append(episode.episode_tokens)
        self.truncated += episode.truncated
        self.failed += bool(episode.error)
        self.samples_dropped += max(0, len(episode.samples) - 1)

    def fill(self, event: Any) -> None:
        """The step's MetricEvent episode fields."""
        if not self.turns:
            return
        event.turns_mean = statistics.fmean(self.turns)
        event.turns_max = max(self.turns)
        event.tool_calls = self.tool_calls
        event.tool_errors = self.tool_errors
        event.tool_seconds = self.tool_seconds
        event.observation_tokens_mean = statistics.fmean(self.observation_tokens)
        event.episode_tokens_mean = statistics.fmean(self.episode_tokens)
        event.truncated_episodes = self.truncated
        event.failed_episodes = self.failed
        event.episode_splits = self.samples_dropped


class EpisodeRollout:
    """The episodes of a job's steps: made once per job (its environment, chat codecs, limits)."""

    def __init__(self, job: Any, tokenizer: Any, instruction: str | None) -> None:
        from rlvr.environments.registry import get_environment
        from rlvr.tasks.render import prompt_style

        self.job = job
        self.tokenizer = tokenizer
        if job.dynamic_sampling:
            raise ValueError("advanced.dynamic_sampling does not run with an environment yet (environment.key)")
        self.definition: EnvironmentDefinition = get_environment(job.environment)
        self.instruction = self.definition.instruction or instruction
        self.style = prompt_style(tokenizer)
        max_turns = job.max_turns or self.definition.max_turns
        self.limits = EpisodeLimits(
            max_turns=max_turns, max_tokens_per_turn=job.max_completion_tokens,
            max_episode_tokens=job.max_episode_tokens or 4 * job.max_completion_tokens,
            tool_timeout_seconds=self.definition.tool_timeout_seconds, min_turn_tokens=MIN_TURN_TOKENS)
        self.codecs = ChatCodecs(tokenizer)  # codec_for and decode of run_episode
        self._context: int | None = None  # the generator's context limit, asked once

    def messages(self, problem: Problem) -> list[dict[str, Any]]:
        from rlvr.tasks.render import prompt_messages

        return prompt_messages(problem, self.style, self.instruction)

    def context_tokens(self, generator: Any) -> int:
        """The generator's prompt + completion limit (the rollout service's max_model_len, a
        colocated engine's), 0 when it has none to say: a later turn gets at most the room left."""
        if self._context is None:
            limit = getattr(generator, "max_model_len", 0)
            info = getattr(generator, "info", None)
            if not limit and callable(info):
                try:
                    limit = int(info().max_model_len)
                except Exception as e:  # noqa: BLE001 - a server that cannot say: the turns' own limits
                    log.warning("the rollout service's max_model_len is unknown (%s): episodes are not held to it", e)
            self._context = int(limit or 0)
        return self._context

    def run(self, problems: Sequence[Problem], seed: int, first_index: int, group_size: int,
            sampler: GeneratorSampler) -> list[Episode]:
        """`group_size` episodes of each problem, in problem order; problem i is prompt
        `first_index + i` of the step's whole batch (its episodes' seeds)."""
        tasks = []
        for i, problem in enumerate(problems):
            row = EpisodeRow(prompt=problem.question, ground_truth=problem.ground_truth, columns=problem.columns,
                             messages=tuple((m.role, m.content) for m in problem.messages or ()))
            for j in range(group_size):
                episode_seed = prompt_seed(prompt_seed(seed, first_index + i), j)
                env = self.definition.make(self.job.environment_settings)
                tasks.append(EpisodeTask(env, EpisodeRow(**{**row.__dict__, "seed": episode_seed}),
                                         self.messages(problem), episode_seed))
        limits = replace(self.limits, max_context_tokens=self.context_tokens(sampler.generator))
        return asyncio.run(run_episodes(tasks, sampler, self.codecs, limits, self.codecs.decode))

    def score(self, episodes: Sequence[Episode], problems: Sequence[Problem], prompts: Sequence[str],
              scorer: Any, group_size: int) -> list[Score]:
        """Each episode's score: the environment's own, or the job's rewards' (one scorer call for
        those), a failed episode's 0 with its reason."""
        split = EpisodeScores.split(episodes, lambda k, _: episode_score_input(
            episodes[k], problems[k // group_size], problems[k // group_size].ground_truth,
            prompts[k // group_size], self.definition))
        scores = split.complete(scorer.score(split.inputs()) if split.pending else [])
        if episodes and all(e.error for e in episodes):
            raise EpisodeFailure(f"every episode of the step failed; the first: {episodes[0].error}")
        return scores

    def rows(self, episodes: Sequence[Episode], eos_id: int, with_logprobs: bool = True) -> dict[str, Any]:
        """TRL's rollout_func rows, one per episode (its last sample: see the module's doc)."""
        prompt_ids, completion_ids, logprobs, mask = [], [], [], []
        for episode in episodes:
            sample = episode.samples[-1]
            completion = list(sample.completion_ids) or [eos_id]
            prompt_ids.append(list(sample.prompt_ids) or [eos_id])
            completion_ids.append(completion)
            logprobs.append(list(sample.logprobs) if sample.completion_ids else [0.0])
            # A failed episode (its environment's fault, scored 0) is not trained on: no token of it
            # reaches the loss, so its policy tokens take no blame for the environment's failure.
            mask.append([0] * len(completion) if episode.error or not sample.completion_ids else list(sample.mask))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": logprobs if with_logprobs else None, "env_mask": mask}
