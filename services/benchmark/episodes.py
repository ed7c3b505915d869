"""Evaluations with an environment: each question one episode, turn by turn, scored as a whole.

When RunEvaluationRequest names an environment (planning.py checks it into an `EnvironmentPlan`),
the runner hands the questions here instead of generating one answer each:

1. each question becomes one episode (a group of 1) with a fresh environment and the question's
   own seed, `prompt_seed(evaluation seed, question index)`; its turn t samples from
   `turn_seed(that seed, t)` (rlvr/episodes/loop.py), so the same evaluation twice sends the
   rollout service identical requests, whatever the batch size;
2. the episodes of a batch run concurrently (rlvr/episodes/loop.py's `run_episode`), every turn one
   Generate call of one token-id prompt with n=1 and the evaluation's sampling (`RolloutSampler`),
   pinned to the evaluation's adapter version: a turn stamped with another policy fails the
   evaluation, as `check_answers` does for single answers;
3. the chat template is the model's: its tokenizer is loaded from the rollout service's model path
   (GetInfo.model) once per path (`load_tokenizer`); a path this host cannot read fails the
   evaluation naming it;
4. each episode is scored as the trainer scores one (rlvr/episodes/scoring.py): the environment's
   own reward when it gives one, else the evaluation's reward on the final answer, the whole
   conversation and the columns with ``"environment"``; a failed episode (its environment raised)
   scores 0 with its reason, and the evaluation goes on, unless every episode of its first batch
   failed (then nothing suggests the rest would go otherwise: it fails with the first reason);
5. a question's row keeps the episode as its completion (the transcript, turn by turn: what
   `rlvr eval show` and the console print) and as JSON in its `episode` column (every turn, tool
   call, argument, result and error); the evaluation counts turns, tool calls and tool errors.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rlvr.environments.base import EnvironmentDefinition, EpisodeRow
from rlvr.episodes.chat import ChatCodecs
from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, TurnOutput, run_episode
from rlvr.episodes.scoring import EpisodeScores, episode_record, score_input_of, transcript
from rlvr.episodes.types import Episode, EpisodeSample
from rlvr.infra.schema import QuestionResultRow
from rlvr.infra.store import Store
from rlvr.models import bare_to_folder, is_local_path, is_tiny
from rlvr.peers.types import AdapterTag, Sampling, Score, ScoreInput
from rlvr.seeds import prompt_seed
from rlvr.services.benchmark.catalog import RewardName
from rlvr.services.benchmark.runner import (
    Cancelled,
    EvaluationError,
    FinishReason,
    Progress,
    Question,
    RunResult,
    Scorer,
    unless_cancelled,
)
from rlvr.tiny import default_model_dir

MIN_TURN_TOKENS = 32  # the rollout service's smallest max_tokens (the spec's Max Completion low end)


@dataclass(frozen=True)
class TokenAnswer:
    """One completion of a token-id prompt, as the rollout service answered it."""

    token_ids: list[int]
    finish_reason: FinishReason
    adapter: AdapterTag  # as stamped by the engine
    logprobs: list[float] | None = None


class TokenGenerator(Protocol):
    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: Sampling, adapter: AdapterTag,
                              request_id: str) -> TokenAnswer:
        """One completion (n=1) of `prompt_ids`, sampled with `sampling` (its seed the turn's) by
        exactly `adapter`."""
        ...


@dataclass(frozen=True)
class EnvironmentPlan:
    """The environment an evaluation runs its questions in, checked (planning.py)."""

    definition: EnvironmentDefinition
    settings: Mapping[str, str] = field(default_factory=dict)
    max_turns: int = 0  # resolved: the request's, else the environment's declared max_turns
    max_episode_tokens: int = 0  # resolved: the request's, else EPISODE_TOKENS_PER_TURN x max_tokens
    max_context_tokens: int = 0  # the rollout service's max_model_len: a later turn gets the room left

    @property
    def key(self) -> str:
        return self.definition.key

    @property
    def version(self) -> str:
        return self.definition.version

    def limits(self, max_tokens: int) -> EpisodeLimits:
        return EpisodeLimits(max_turns=self.max_turns, max_tokens_per_turn=max_tokens,
                             max_episode_tokens=self.max_episode_tokens,
                             tool_timeout_seconds=self.definition.tool_timeout_seconds,
                             min_turn_tokens=min(MIN_TURN_TOKENS, max_tokens),
                             max_context_tokens=self.max_context_tokens)


@dataclass
class EpisodeTotals:
    """An evaluation's episode counters (Evaluation.episodes)."""

    episodes: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    failed: int = 0
    truncated: int = 0

    def add(self, episode: Episode) -> None:
        self.episodes += 1
        self.turns += len(episode.turns)
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors
        self.failed += bool(episode.error)
        self.truncated += episode.truncated

    @property
    def turns_mean(self) -> float:
        return self.turns / self.episodes if self.episodes else 0.0


# ---------------------------------------------------------------------- the tokenizer

_tokenizers: dict[str, Any] = {}
_tokenizers_lock = threading.Lock()


def model_path(model: str) -> str:
    """Where the rollout service's model (GetInfo.model) is read from here: a tiny model's folder
    under $RLVR_HOME/models, a local path expanded, a bare name the folder of that name under the
    model roots (rlvr.models.bare_to_folder, as the rollout engine resolves it), a hub id as it is."""
    if is_tiny(model):
        return str(default_model_dir(model))
    return str(Path(model).expanduser()) if is_local_path(model) else bare_to_folder(model)


def load_tokenizer(model: str) -> Any:
    """The tokenizer of the rollout service's model, loaded once per path for this process;
    `EvaluationError` naming the path when this host cannot read it (the benchmark needs the
    model's chat template to run episodes token in, token out)."""
    path = model_path(model)
    with _tokenizers_lock:
        if path in _tokenizers:
            return _tokenizers[path]
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as e:  # noqa: BLE001 (any cause: the path is not readable here)
            cause = " ".join(str(e).split())[:300] or type(e).__name__
            raise EvaluationError(
                f"the rollout service's model {path!r} is not readable on the benchmark's host ({cause}); an "
                "evaluation with an environment needs the model's tokenizer: run the benchmark where that path "
                "is, or the same model at the same path") from None
        _tokenizers[path] = tokenizer
        return tokenizer


# ---------------------------------------------------------------------- one episode's turns


class RolloutSampler:
    """A `TurnSampler` for one episode: each turn one Generate call of a token-id prompt with the
    evaluation's sampling and the turn's seed, from exactly the evaluation's adapter version."""

    def __init__(self, generator: TokenGenerator, sampling: Sampling, adapter: AdapterTag, question: int) -> None:
        self.generator = generator
        self.sampling = sampling
        self.adapter = adapter
        self.question = question
        self.turns = 0
        self.seconds = 0.0

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
        turn, self.turns = self.turns, self.turns + 1
        sampling = replace(self.sampling, max_tokens=max_tokens, seed=seed, group_size=1)
        t0 = time.perf_counter()
        answer = await self.generator.generate_tokens(prompt_ids, sampling, self.adapter,
                                                      f"benchmark-q{self.question}-t{turn}")
        self.seconds += time.perf_counter() - t0
        if answer.adapter != self.adapter:
            raise EvaluationError(f"question {self.question} turn {turn + 1} was answered by {answer.adapter}, "
                                  f"expected {self.adapter}; refusing to score another policy")
        return TurnOutput(list(answer.token_ids), answer.logprobs,
                          "length" if answer.finish_reason == "LENGTH" else "stop",
                          answer.adapter.name, answer.adapter.version)


def episode_seed(seed: int, index: int) -> int:
    """Question `index`'s episode seed: its turns sample from `turn_seed(episode_seed, turn)`."""
    return prompt_seed(seed, index)


def _task(question: Question, plan: EnvironmentPlan, seed: int) -> EpisodeTask:
    row = EpisodeRow(prompt=question.question or question.prompt_text, ground_truth=question.ground_truth,
                     columns=question.columns, messages=question.turns, seed=seed)
    messages = [{"role": role, "content": content} for role, content in question.messages]
    return EpisodeTask(plan.definition.make(plan.settings), row, messages, seed)


def _not_made(question: Question, error: BaseException) -> Episode:
    """The episode of a question whose environment could not even be made (its settings refused)."""
    messages = [{"role": role, "content": content} for role, content in question.messages]
    text = f"environment make failed: {type(error).__name__}: {error}"[:500]
    return Episode(messages=messages, samples=[EpisodeSample(prompt_ids=[])], ended_by="error", error=text)


class EpisodeRunner:
    """Runs a batch of questions as episodes: one per question, concurrently (the tokenizer and the
    chat codecs made once per evaluation)."""

    def __init__(self, plan: EnvironmentPlan, tokenizer: Any, generator: TokenGenerator, sampling: Sampling,
                 adapter: AdapterTag) -> None:
        self.plan = plan
        self.tokenizer = tokenizer
        self.generator = generator
        self.sampling = sampling
        self.adapter = adapter
        self.limits = plan.limits(sampling.max_tokens)
        self.codecs = ChatCodecs(tokenizer)  # codec_for and decode of run_episode

    async def run(self, batch: Sequence[Question]) -> list[Episode]:
        """The batch's episodes in question order; the first sampler failure (the rollout service
        gone, another policy's stamp) cancels the others and is raised."""
        seed = self.sampling.seed or 0
        episodes: list[Episode | None] = [None] * len(batch)
        running: dict[int, asyncio.Task[Episode]] = {}
        for k, question in enumerate(batch):
            s = episode_seed(seed, question.index)
            try:
                task = _task(question, self.plan, s)
            except Exception as e:  # noqa: BLE001 (this question's failure: scored 0 with it)
                episodes[k] = _not_made(question, e)
                continue
            sampler = RolloutSampler(self.generator, self.sampling, self.adapter, question.index)
            running[k] = asyncio.ensure_future(run_episode(task, sampler, self.codecs, self.limits, self.codecs.decode))
        try:
            if running:
                await asyncio.wait(running.values(), return_when=asyncio.FIRST_EXCEPTION)
        finally:  # a failure (or this coroutine cancelled) stops every other episode of the batch
            for t in running.values():
                t.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)
        failed = [t.exception() for t in running.values() if not t.cancelled() and t.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]
        for k, t in running.items():
            episodes[k] = t.result()
        return [e for e in episodes if e is not None]


# ---------------------------------------------------------------------- the evaluation


def score_input(question: Question, episode: Episode, plan: EnvironmentPlan) -> ScoreInput:
    return score_input_of(episode, question.question or question.prompt_text, question.ground_truth,
                          question.columns, plan.definition)


def _score_input_at(batch: Sequence[Question], plan: EnvironmentPlan, k: int, episode: Episode) -> ScoreInput:
    return score_input(batch[k], episode, plan)


def finish_reason(episode: Episode) -> FinishReason:
    """LENGTH when the episode was cut (at the per-turn limit or the episode's token cap), else STOP."""
    return "LENGTH" if episode.truncated else "STOP"


def episode_row(evaluation_id: str, question: Question, episode: Episode, score: Score) -> QuestionResultRow:
    record = episode_record(episode)
    if score.error and not episode.error:  # the environment's reward refused: the row says why
        record["error"] = score.error
    return QuestionResultRow(
        evaluation_id=evaluation_id, index=question.index, prompt=question.prompt_text,
        ground_truth=question.ground_truth, completion=transcript(episode) or episode.final_answer,
        extracted_answer=score.extracted_answer, reward=score.reward, accuracy=score.accuracy,
        format=score.format, strict=score.strict, finish_reason=finish_reason(episode),
        episode=json.dumps(record, default=str),
    )


async def run_episode_questions(
    evaluation_id: str,
    questions: Sequence[Question],
    function: RewardName,
    sampling: Sampling,
    adapter: AdapterTag,
    plan: EnvironmentPlan,
    tokenizer: Any,
    generator: TokenGenerator,
    scorer: Scorer,
    store: Store,
    batch_size: int,
    on_progress: Callable[[Progress], Awaitable[None]] | None = None,
    cancelled: asyncio.Event | None = None,
    totals: EpisodeTotals | None = None,
) -> RunResult:
    """Runs, scores and stores every question as an episode; returns the totals (`totals`, when
    given, is kept up to date batch by batch: the evaluation's episode counters). Raises on the
    first failure of the rollout or reward service, when every episode of the first batch failed,
    and `Cancelled` once `cancelled` is set."""
    runner = EpisodeRunner(plan, tokenizer, generator, sampling, adapter)
    totals = totals if totals is not None else EpisodeTotals()
    result = RunResult()
    for start in range(0, len(questions), batch_size):
        batch = questions[start:start + batch_size]
        if cancelled is not None and cancelled.is_set():
            raise Cancelled
        t0 = time.perf_counter()
        episodes = await unless_cancelled(runner.run(batch), cancelled)
        result.generate_seconds += time.perf_counter() - t0
        split = EpisodeScores.split(episodes, functools.partial(_score_input_at, batch, plan))
        t0 = time.perf_counter()
        scored = await unless_cancelled(scorer.score(function, split.inputs()), cancelled) if split.pending else []
        result.score_seconds += time.perf_counter() - t0
        if len(scored) != len(split.pending):
            raise EvaluationError(f"the reward service scored {len(scored)} of {len(split.pending)} episodes")
        scores = split.complete(scored)
        rows = [episode_row(evaluation_id, q, e, s) for q, e, s in zip(batch, episodes, scores, strict=True)]
        await asyncio.to_thread(store.add_question_results, rows)
        for e, s in zip(episodes, scores, strict=True):
            totals.add(e)
            result.tally = result.tally.add(s.accuracy, s.strict, s.format, finish_reason(e) == "STOP")
        if totals.failed == totals.episodes:
            first = next(e for e in episodes if e.error)
            raise EvaluationError(f"every episode failed in the environment {plan.key!r} (v{plan.version}); "
                                  f"the first, question {batch[0].index}: {first.error}")
        if on_progress is not None:
            await on_progress(Progress(result.tally.n, len(questions), result.tally, result.generate_seconds,
                                       result.score_seconds))
    return result
