"""One GRPO step, in the order it runs: generate -> score -> update -> push -> publish.

TRL's `GRPOTrainer` runs the steps (engine.py builds it and wires its seams); each seam calls one
method of the step's `Step`, which alone builds the step's `StepRecord`:

1. generate  `Step.rollout` (TRL's rollout_func): `group_size` completions of each of the step's
             prompts from the live policy; with dynamic sampling (dynamic.py) further prompts'
             groups until enough carry a reward spread.
2. score     also in `Step.rollout`, once per generated completion, right after its generation
             round (dynamic sampling needs the scores to choose the groups). The rows TRL trains
             on go back to it with their scores (the per-row "score" field).
3. update    TRL: its reward function (`Step.rewards`) returns those scores' rewards, scoring
             nothing again; TRL computes the advantages, the loss and the optimizer step
             (`Step.updated` marks its end).
4. push      `Step.push` (on_step_end): the adapter saved as version = step number and made the
             live policy of the generator.
5. publish   `Step.publish` (on_log): the record plus TRL's log line for the step, as one
             `MetricEvent`.

The adapter is pushed before the metrics are published: the event reports the push's time
(sync_seconds), and TRL's log line (the loss) comes only after on_step_end.

With advanced.max_async_steps = k >= 1 the stages are the same, but the next steps' stages 1 and 2
(generate, score) run on a background thread while this step trains (prefetch.py): the next step's
`Step` is made there, from the newest adapter version when its generation starts, and TRL's
rollout_func hands it over; its record carries the policy lag it trained with.

One exception to "scored in the rollout": the rollout function sees prompts, not dataset rows, so
when the training set asks one question with different answers (possible only without dynamic
sampling, which refuses such a set) it cannot tell which answer a row has. Such a job's rows are
scored in step 3 instead, against TRL's rows' own answers; still once each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlvr.peers.types import AdapterTag, Sampling, Score, ScoreInput
from rlvr.services.trainer.job.artifacts import DiskSpace
from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.dynamic import MAX_DRAW_FACTOR, Group, PromptDraw, select_groups, split_groups
from rlvr.services.trainer.job.rollouts import PolicyGenerator, RolloutBatch
from rlvr.services.trainer.job.scorers import Scorer
from rlvr.services.trainer.job.step_record import StepRecord, completion_samples, keep_samples, metric_event
from rlvr.tasks.base import Problem
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.trainer.step")


class RewardFailure(RuntimeError):
    """Every completion of a step errored in the reward: the job fails with the reward's message."""


@dataclass
class StepHooks:
    """What a step calls out to; the runner provides them (artifacts, events, progress)."""

    save_adapter: Callable[[Any, int], Path]  # (peft model, step) -> the directory holding the step's adapter
    publish: Callable[[common_pb2.MetricEvent], None]
    cancel: threading.Event
    # a few of the step's completions (metrics.completion_samples), published just before its metrics
    publish_samples: Callable[[common_pb2.CompletionSamples], None] = lambda _e: None
    # the job's writes to its artifact root, which wait for space when it is full (the checkpoints')
    space: DiskSpace | None = None


def step_seed(job_seed: int, step: int) -> int:
    """The sampling seed of a step's own rollouts."""
    return (job_seed * 1_000_003 + step) % 2**63


def round_seed(job_seed: int, step: int, extra_round: int) -> int:
    """The sampling seed of dynamic sampling's extra round of a step: mixed so that it meets no
    other step's or round's seed (see `step_seed`)."""
    mixed = (job_seed * 1_000_003 + step) * 0x9E3779B97F4A7C15 + extra_round * 0xBF58476D1CE4E5B9
    return (mixed ^ (mixed >> 31)) % 2**63


def answers(prompts: Sequence[tuple[str, str]]) -> dict[str, str] | None:
    """Each training question's answer, or None when some question is asked with different answers."""
    truth = dict(prompts)
    return truth if all(truth[p] == a for p, a in prompts) else None


@dataclass
class StepContext:
    """What every step of a job uses, and the job-wide state the steps advance (`live`, `adapter_step`)."""

    job: JobConfig
    tokenizer: Any
    generator: PolicyGenerator
    scorer: Scorer
    hooks: StepHooks
    total_steps: int
    truth: dict[str, str] | None  # `answers` of the training set
    draw: PromptDraw | None  # further prompts: with dynamic sampling only
    live: AdapterTag  # the policy the next rollouts must come from (at least, with `newest`)
    adapter_step: int = 0  # the last step whose adapter is saved
    # Asynchronous steps (prefetch.py): generate from the newest version of `live`'s name the
    # generator serves, whichever it is when the request lands (`generate_newest`).
    newest: bool = False
    # (rendered prompt, ground truth) -> its problem: what the rewards read besides the completion
    problems: dict[tuple[str, str], Problem] = field(default_factory=dict)
    # Why the loss is importance-corrected ("" = it is not): MetricEvent.sampler_correction.
    correction: str = ""
    # The job names an environment: each rollout is episodes (episodes.EpisodeRollout), not answers.
    episodes: Any = None
    # advanced.eval_every: the held-out problems answered after every N steps' push (heldout.HeldoutEval).
    heldout: Any = None
    _prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    _errors_seen: set[str] = field(default_factory=set)

    def score(self, completions: Sequence[str], prompts: Sequence[str], truths: Sequence[str]) -> list[Score]:
        """Each completion scored with the job's rewards, given its prompt's problem (its question
        and columns); a reward's faults logged once per distinct error. Every completion erring
        is the reward's failure, and the job's (RewardFailure)."""
        items = []
        for completion, prompt, truth in zip(completions, prompts, truths, strict=True):
            problem = self.problems.get((prompt, truth))
            items.append(ScoreInput.of(completion, problem) if problem is not None else ScoreInput(completion, truth))
        scores = self.scorer.score(items)
        errors = Counter(s.error for s in scores if s.error)
        for error, count in errors.items():
            if error not in self._errors_seen:
                self._errors_seen.add(error)
                log.warning("job %s: reward error on %d of %d completions (each scored 0): %s", self.job.job_id,
                            count, len(scores), error)
        if scores and sum(errors.values()) == len(scores):
            raise RewardFailure(f"the reward failed on every completion of the step: {errors.most_common(1)[0][0]}")
        return scores

    def ids(self, prompt: str) -> list[int]:
        ids = self._prompt_ids.get(prompt)
        if ids is None:
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            self._prompt_ids[prompt] = ids
        return ids


class Step:
    """One optimizer step; its methods run in the order they are defined (see the module's doc)."""

    def __init__(self, ctx: StepContext, number: int, tokenizer: Any = None) -> None:
        self.ctx = ctx
        self.number = number
        self.record = StepRecord(step=number, adapter_version=ctx.live.version)
        # A prefetched step (prefetch.py) runs its rollout on another thread, with its own tokenizer.
        self.tokenizer = tokenizer if tokenizer is not None else ctx.tokenizer
        self.prompts: list[str] = []  # the prompts its rollout was given, each group_size times
        self.draw_state: dict[str, Any] | None = None  # dynamic sampling's draw when its rollout ended

    def version(self, tag: AdapterTag) -> int:
        """The job's adapter version of `tag` (0 = the base model or the init adapter: step 1's policy)."""
        return tag.version if tag.name == self.ctx.job.adapter_name else 0

    def _trained_versions(self, versions: Sequence[int]) -> None:
        """The record's adapter version (the oldest trained on) and the step's policy lag."""
        self.record.adapter_version = min(versions)
        self.record.policy_lag = max(0, self.number - 1 - self.record.adapter_version)

    # 1. generate, 2. score -----------------------------------------------------------------------

    def rollout(self, prompts: list[str]) -> dict[str, Any]:
        """TRL's rollout_func: `prompts` holds each prompt `group_size` times in a row. Returns the
        rows to train on, each with its score (in the same rows' order as TRL's `prompts` unless
        dynamic sampling replaced groups, when the rows also carry their own ground_truth)."""
        job, g = self.ctx.job, self.ctx.job.group_size
        self.prompts = list(prompts)
        unique = prompts[::g]
        if len(prompts) != len(unique) * g or any(prompts[i] != unique[i // g] for i in range(len(prompts))):
            raise RuntimeError(f"expected each prompt {g} times in a row from TRL's sampler, got {len(prompts)} rows")
        if hasattr(self.ctx.generator, "step"):
            self.ctx.generator.step = self.number  # for its error messages
        if self.ctx.episodes is not None:
            return self._episodes(unique)
        sampling = job.sampling(group_size=g, max_tokens=job.max_completion_tokens, seed=step_seed(job.seed, self.number))
        batch = self._generate([self._ids(p) for p in unique], sampling)
        self._trained_versions([self.version(batch.adapter)])
        if self.ctx.truth is None:  # scored in `rewards`, against each row's own answer
            self.record.completion_lengths = [len(c) for c in batch.completion_ids]
            self.record.clipped = list(batch.clipped)
            logprobs = batch.logprobs if batch.logprobs and all(batch.logprobs) else None
            return {"prompt_ids": batch.prompt_ids, "completion_ids": batch.completion_ids, "logprobs": logprobs}
        groups = self._score(unique, [self.ctx.truth[p] for p in unique], batch)
        if self.ctx.draw is not None:
            groups = self._with_signal(groups, len(unique), sampling)
        self.record.scored_at = time.perf_counter()  # the training phase starts here
        self._generated(groups)
        if self.ctx.draw is None:
            return _rows(groups)
        self.record.groups_with_signal = sum(grp.has_signal for grp in groups)
        self.record.groups_drawn = len(groups)
        chosen = select_groups(groups, len(unique))
        self._trained_versions([grp.version for grp in chosen])
        self.draw_state = self.ctx.draw.state()
        # per row: TRL hands it to the reward function in place of the dataset's column
        return _rows(chosen) | {"ground_truth": [grp.truth for grp in chosen for _ in range(g)]}

    def _episodes(self, prompts: list[str]) -> dict[str, Any]:
        """Generate and score as episodes with the job's environment (episodes.py): `group_size`
        episodes of each prompt, one TRL row each, with the mask of the tokens the policy sampled."""
        from rlvr.services.trainer.job.episodes import EpisodeStats, GeneratorSampler, transcript

        ctx, job, g, record = self.ctx, self.ctx.job, self.ctx.job.group_size, self.record
        problems = self._episode_problems(prompts)
        sampler = GeneratorSampler(ctx.generator, job.sampling(), ctx.live, ctx.newest, workers=len(prompts) * g)
        record.generate_started_at = time.perf_counter()
        try:
            episodes = ctx.episodes.run(problems, step_seed(job.seed, self.number),
                                        getattr(ctx.generator, "prompt_offset", 0), g, sampler)
        finally:
            sampler.close()
        record.generate_ended_at = time.perf_counter()
        record.generate_seconds += sampler.generate_seconds
        started = time.perf_counter()
        scores = ctx.episodes.score(episodes, problems, prompts, ctx.scorer, g)
        record.score_seconds += time.perf_counter() - started
        versions = [self.version(AdapterTag(ctx.job.adapter_name, v)) for e in episodes for v in e.adapter_versions]
        self._trained_versions(versions or [self.version(ctx.live)])
        record.completion_lengths = [e.sampled_tokens for e in episodes]
        record.clipped = [e.truncated for e in episodes]
        record.scores = scores
        record.episodes = EpisodeStats()
        for episode in episodes:
            record.episodes.add(episode)
        rows = [p for p in prompts for _ in range(g)]
        keep_samples(record, rows, [transcript(e) for e in episodes], scores, g)
        record.scored_at = time.perf_counter()
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        return ctx.episodes.rows(episodes, eos, with_logprobs=sampler.logprobs) | {"score": scores}

    def _episode_problems(self, prompts: list[str]) -> list[Problem]:
        """Each prompt's problem (the row its episodes reset on). TRL's rollout sees prompts, not
        rows: a prompt that several rows share (a game whose prompt hides its secret) takes those
        rows in turn, by its position in the job's steps, so a step's rows are the same on a resume."""
        ctx = self.ctx
        if ctx.truth is not None:
            return [ctx.problems[(p, ctx.truth[p])] for p in prompts]
        rows: dict[str, list[Problem]] = {}
        for (text, _), problem in sorted(ctx.problems.items(), key=lambda item: item[1].id):
            rows.setdefault(text, []).append(problem)
        # the prompt's place in the job's whole batch of the step (this process's share starts at the offset)
        start = (self.number - 1) * ctx.job.prompts_per_step + getattr(ctx.generator, "prompt_offset", 0)
        chosen = []
        for index, prompt in enumerate(prompts):
            same = rows[prompt]
            chosen.append(same[(start + index) % len(same)])
        return chosen

    def _ids(self, prompt: str) -> list[int]:
        if self.tokenizer is self.ctx.tokenizer:
            return self.ctx.ids(prompt)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def _generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> RolloutBatch:
        started = time.perf_counter()
        if self.record.generate_started_at is None:
            self.record.generate_started_at = started
        if self.ctx.newest:
            batch = self.ctx.generator.generate_newest(prompt_ids, sampling, self.ctx.live)  # type: ignore[attr-defined]
        else:
            batch = self.ctx.generator.generate(prompt_ids, sampling, self.ctx.live)
        self.record.generate_seconds += batch.seconds
        self.record.generate_ended_at = time.perf_counter()
        return batch

    def _score(self, prompts: list[str], truths: list[str], batch: RolloutBatch) -> list[Group]:
        """The batch's completions scored (one scorer call), as groups."""
        g = self.ctx.job.group_size
        started = time.perf_counter()
        texts = self.tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
        rows = [p for p in prompts for _ in range(g)]
        scores = self.ctx.score(texts, rows, [t for t in truths for _ in range(g)])
        self.record.score_seconds += time.perf_counter() - started
        keep_samples(self.record, rows, texts, scores, g)
        return split_groups(batch, prompts, truths, scores, g, self.version(batch.adapter))

    def _with_signal(self, groups: list[Group], need: int, sampling: Sampling) -> list[Group]:
        """Dynamic sampling (dynamic.py): further prompts' groups, generated and scored a round at
        a time, until `need` groups carry a reward spread or the draw limit is reached."""
        assert self.ctx.draw is not None
        for extra_round in range(1, MAX_DRAW_FACTOR):
            if sum(grp.has_signal for grp in groups) >= need:
                break
            drawn = self.ctx.draw.take(need)
            more = self._generate([self._ids(p) for p, _ in drawn],
                                  replace(sampling, seed=round_seed(self.ctx.job.seed, self.number, extra_round)))
            groups = groups + self._score([p for p, _ in drawn], [t for _, t in drawn], more)
        return groups

    def _generated(self, groups: Sequence[Group]) -> None:
        """Every completion generated this step goes into the step's metrics (with dynamic
        sampling: also those of groups not trained on, as the policy's performance)."""
        self.record.completion_lengths = [len(c) for grp in groups for c in grp.completion_ids]
        self.record.clipped = [c for grp in groups for c in grp.clipped]
        self.record.scores = [s for grp in groups for s in grp.scores]

    # 3. update (TRL) -----------------------------------------------------------------------------

    def rewards(self, scores: Sequence[Score] | None, completions: list[str], ground_truth: list[str],
                prompts: list[str]) -> list[float]:
        """TRL's reward function: the rows' total rewards, from the scores the rollout attached
        (`scores`); only rows that came unscored (see the module's doc) are scored here."""
        if scores is None:
            started = time.perf_counter()
            scores = self.ctx.score(completions, prompts, ground_truth)
            self.record.scores = scores
            keep_samples(self.record, prompts, completions, scores, self.ctx.job.group_size)
            self.record.score_seconds += time.perf_counter() - started
            self.record.scored_at = time.perf_counter()
        return [s.reward for s in scores]

    def updated(self) -> None:
        """TRL's optimizer step is done."""
        self.record.optimizer_done_at = time.perf_counter()

    # 4. push -------------------------------------------------------------------------------------

    def push(self, model: Any) -> Path:
        """Saves the adapter (PEFT files only) and makes it the generator's live version = step
        number; the folder it was pushed from."""
        ctx = self.ctx
        started = time.perf_counter()  # sync = saving the PEFT files + pushing them to the generator
        adapter_dir = ctx.hooks.save_adapter(model, self.number)
        ctx.adapter_step = self.number
        tag = AdapterTag(ctx.job.adapter_name, self.number)
        ctx.generator.publish_adapter(adapter_dir, tag)
        ctx.live = tag
        self.record.sync_seconds = time.perf_counter() - started
        self.record.finish()
        return adapter_dir

    # 5. publish ----------------------------------------------------------------------------------

    def publish(self, logs: dict[str, Any]) -> None:
        """The step's MetricEvent, from the record and TRL's log line for the step."""
        ctx, record = self.ctx, self.record
        event = metric_event(ctx.job.job_id, ctx.total_steps, record, logs, ctx.job.kl_beta > 0, ctx.correction,
                             group_size=ctx.job.group_size)
        log.info(
            "step %d/%d reward %.3f accuracy %.3f format %.3f loss %.4f length %.1f (%.2f s)%s%s",
            event.step, event.total_steps, event.reward_mean, event.accuracy, event.format, event.loss,
            event.completion_length_mean, event.step_seconds,
            f" groups with signal {record.groups_with_signal}/{record.groups_drawn}" if record.groups_drawn else "",
            f" policy lag {record.policy_lag}" if ctx.job.max_async_steps else "",
        )
        if event.HasField("logprob_gap"):
            log.info("step %d sampler/trainer logprob gap mean %.4f max %.4f%s", event.step, event.logprob_gap,
                     event.logprob_gap_max, f" (corrected: {ctx.correction})" if ctx.correction else "")
        if self.number <= ctx.job.stored_steps:
            # A step re-run after a resume that the scheduler stores already: its stored point stays
            # the first run's (see runner.py, "Resume"), so it is not published again.
            log.info("step %d is stored already (the run before the resume published it)", self.number)
            return
        if record.samples:
            ctx.hooks.publish_samples(completion_samples(ctx.job.job_id, record))
        ctx.hooks.publish(event)


def _rows(groups: Sequence[Group]) -> dict[str, Any]:
    """What TRL's rollout_func returns: the groups' rows, each with its score."""
    rows = lambda name: [row for grp in groups for row in getattr(grp, name)]  # noqa: E731
    logprobs = rows("logprobs") if all(grp.logprobs for grp in groups) else None
    return {
        "prompt_ids": rows("prompt_ids"), "completion_ids": rows("completion_ids"),
        "logprobs": logprobs if logprobs and all(logprobs) else None,
        "score": rows("scores"),
    }
