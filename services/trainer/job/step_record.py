"""One step's measurements and the `MetricEvent` built from them.

The step (services/trainer/job/step.py) fills its `StepRecord` as it runs (generation, scoring, the
optimizer step, the adapter sync, each timed where it happens) and finishes it with what TRL logged
for the step (loss, KL, entropy, learning rate). Reward mean/std come from the scores themselves,
not from TRL's log, whose `reward_std` is the mean of per-group standard deviations.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.peers.types import Score
from rlvr.v1 import common_pb2


@dataclass
class StepRecord:
    step: int
    heldout_accuracy: float | None = None  # evaluation while training, at the steps it runs (heldout.py)
    started: float = field(default_factory=time.perf_counter)
    adapter_version: int = 0  # the oldest version among the rows trained on
    policy_lag: int = 0  # step - 1 - adapter_version: versions between the sampler and the policy trained
    completion_lengths: list[int] = field(default_factory=list)
    clipped: list[bool] = field(default_factory=list)
    # Every completion generated this step (the policy's performance): with dynamic sampling also
    # those of groups not trained on; the reward/accuracy/format metrics describe these.
    scores: list[Score] = field(default_factory=list)
    groups_with_signal: int = 0
    groups_drawn: int = 0
    generate_seconds: float = 0.0
    score_seconds: float = 0.0
    generate_started_at: float | None = None  # the first generation round's start (perf_counter)
    generate_ended_at: float | None = None  # the last round's end
    scored_at: float | None = None  # end of scoring: the training phase starts here
    optimizer_done_at: float | None = None
    sync_seconds: float = 0.0
    step_seconds: float = 0.0
    # (prompt, completion, score) of the first completion of each of the first SAMPLES_PER_STEP
    # groups: the experiment trackers' completions table (`completion_samples`).
    samples: list[tuple[str, str, Score]] = field(default_factory=list)
    # A job with an environment: the step's episode counters (episodes.EpisodeStats), else None.
    episodes: Any = None

    @property
    def train_seconds(self) -> float:
        """From the scores to the end of the optimizer step (advantages, forward, backward, step)."""
        if self.scored_at is None or self.optimizer_done_at is None:
            return 0.0
        return max(0.0, self.optimizer_done_at - self.scored_at)

    def finish(self) -> None:
        self.step_seconds = time.perf_counter() - self.started


SAMPLES_PER_STEP = 4
MAX_SAMPLE_PROMPT_CHARS = 2000
MAX_SAMPLE_COMPLETION_CHARS = 4000


def keep_samples(record: StepRecord, prompts: Sequence[str], completions: Sequence[str], scores: Sequence[Score],
                 group_size: int) -> None:
    """Keeps the first completion of each of the first groups as the step's sample (once a step)."""
    if record.samples:
        return
    for i in range(0, min(len(completions), len(scores), len(prompts)), max(1, group_size)):
        if len(record.samples) == SAMPLES_PER_STEP:
            break
        record.samples.append((prompts[i][:MAX_SAMPLE_PROMPT_CHARS], completions[i][:MAX_SAMPLE_COMPLETION_CHARS],
                               scores[i]))


def completion_samples(job_id: str, record: StepRecord) -> common_pb2.CompletionSamples:
    event = common_pb2.CompletionSamples(job_id=job_id, step=record.step)
    for prompt, completion, score in record.samples:
        event.samples.add(prompt=prompt, completion=completion, reward=score.reward, accuracy=score.accuracy)
    return event


def _finite(value: Any) -> float | None:  # a log value of any type: None unless a finite number
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def reward_components(scores: Sequence[Score]) -> dict[str, float]:
    """The step's mean of each reward component over its completions (an errored completion, which
    has none, counts 0 for each: it was scored 0)."""
    keys = dict.fromkeys(k for s in scores for k in s.components)
    return {k: statistics.fmean(s.components.get(k, 0.0) for s in scores) for k in keys}


# Rewards closer than this within a group count as equal: GRPO's advantage is (r - mean) / (std + 1e-4)
# (TRL), so a spread this small moves nothing.
SIGNAL_SPREAD = 1e-6


def groups_with_signal(rewards: Sequence[float], group_size: int) -> int:
    """How many of the consecutive groups of `group_size` rewards are not all equal (the groups that
    move the adapter; TRL's rows hold each prompt's completions together, every process's share too)."""
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), max(group_size, 1))]
    return sum(1 for g in groups if g and max(g) - min(g) > SIGNAL_SPREAD)


def metric_event(
    job_id: str, total_steps: int, record: StepRecord, logs: Mapping[str, object], kl_computed: bool,
    correction: str = "", group_size: int = 0,
) -> common_pb2.MetricEvent:
    """The step's MetricEvent. `logs` is TRL's log dict for the step (keys loss, learning_rate,
    entropy, kl, the sampler/trainer logprob gap); `kl` is set only when the KL term is computed (kl_beta > 0);
    `correction` is why the step's loss is importance-corrected ("" = it is not); `group_size` (the
    job's) counts the groups with a reward spread (unset when 0)."""
    scores = record.scores
    rewards = [s.reward for s in scores]
    lengths: Sequence[int] = record.completion_lengths or [0]
    event = common_pb2.MetricEvent(
        job_id=job_id,
        step=record.step,
        total_steps=total_steps,
        reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        accuracy=statistics.fmean(s.accuracy for s in scores) if scores else 0.0,
        format=statistics.fmean(s.format for s in scores) if scores else 0.0,
        loss=_finite(logs.get("loss")) or 0.0,
        completion_length_mean=statistics.fmean(lengths),
        completion_length_max=max(lengths),
        clipped_ratio=statistics.fmean(record.clipped) if record.clipped else 0.0,
        learning_rate=_finite(logs.get("learning_rate")) or 0.0,
        adapter_version=record.adapter_version,
        policy_lag=record.policy_lag,
        generate_seconds=record.generate_seconds,
        score_seconds=record.score_seconds,
        train_seconds=record.train_seconds,
        sync_seconds=record.sync_seconds,
        step_seconds=record.step_seconds,
        sampler_correction=correction,
    )
    for key, value in reward_components(scores).items():
        event.reward_components[key] = value
    event.reward_errors = sum(1 for s in scores if s.error)
    entropy = _finite(logs.get("entropy"))
    if entropy is not None:
        event.entropy = entropy
    kl = _finite(logs.get("kl"))
    if kl_computed and kl is not None:
        event.kl = kl
    # TRL's keys for the sampler/trainer gap (grpo_trainer.lag_ratio / logprob_gap write them too)
    gap = _finite(logs.get("sampling/sampling_logp_difference/mean"))
    if gap is not None:
        event.logprob_gap = gap
        event.logprob_gap_max = _finite(logs.get("sampling/sampling_logp_difference/max")) or gap
    # TRL's share of tokens whose ratio its loss clipped (the grpo family's, or cispo's weights); none for sapo
    clipped = _finite(logs.get("clip_ratio/region_mean", logs.get("cispo_clip_ratio")))
    if clipped is not None:
        event.clip_fraction = clipped
    if group_size and rewards:
        event.groups_with_signal = groups_with_signal(rewards, group_size)
    if record.heldout_accuracy is not None:
        event.heldout_accuracy = record.heldout_accuracy
    if record.episodes is not None:  # a job with an environment: its episodes' counters
        record.episodes.fill(event)
    stamp = Timestamp()
    stamp.GetCurrentTime()
    event.time.CopyFrom(stamp)
    return event
