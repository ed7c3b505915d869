"""The peer types: what the trainer, the benchmark and the SDK's users say to the rollout and reward
services, and what they get back, as plain values rather than messages.

- `AdapterTag`: which policy generates (or generated) a completion, an adapter version on the
  rollout service; `BASE_MODEL` is the bare model.
- `Sampling`: how to sample, and how many completions per prompt (the GRPO group).
- `Score`: the reward service's components of one completion.

With the request builders and readers that both callers share (`generate_request`, `score_request`,
`AdapterTag.of`, `Score.of`), so the two cannot drift in how they speak the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rlvr.jobspec import REWARD_FUNCTIONS, RewardName
from rlvr.v1 import common_pb2, reward_pb2, rollout_pb2


@dataclass(frozen=True)
class AdapterTag:
    """Which policy generated (or must generate) a completion: an adapter's name and version on the
    rollout service; ("", 0) is the bare base model."""

    name: str = ""
    version: int = 0

    def __str__(self) -> str:
        return f"{self.name} v{self.version}" if self.name else "the base model"

    def selector(self) -> common_pb2.AdapterSelector:
        """The explicit selector: the rollout service refuses (NOT_FOUND) a version that is not live
        rather than answer with another one."""
        return common_pb2.AdapterSelector(name=self.name, version=self.version)

    @classmethod
    def of(cls, completion: rollout_pb2.Completion) -> AdapterTag:
        """The stamp the engine put on a completion: the policy that really produced it."""
        return cls(completion.adapter_name, completion.adapter_version)


BASE_MODEL = AdapterTag("", 0)


@dataclass(frozen=True)
class Sampling:
    """How the rollout service samples (SamplingParams) and how many completions of each prompt it
    returns (GenerateRequest.n). The trainer sets group_size and leaves top_p at 1 (the tempered
    distribution its loss evaluates); the benchmark answers once per question, greedy by default."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None  # None: unseeded
    group_size: int = 1  # completions per prompt

    def to_proto(self) -> common_pb2.SamplingParams:
        return common_pb2.SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                         max_tokens=self.max_tokens)


class _Components(Protocol):
    reward: float
    accuracy: float
    format: float
    strict: bool
    extracted_answer: str | None


@dataclass(frozen=True)
class Score:
    """One completion's score, as the reward service computes it: reward = accuracy +
    format_bonus_weight * format (bonus on). The trainer's GRPO advantage uses `reward` and its
    metrics `accuracy` and `format`; the benchmark also stores `strict` (correct, and written
    exactly as the ground truth in its canonical place) and the answer it read."""

    reward: float
    accuracy: float
    format: float
    strict: bool = False
    extracted_answer: str = ""

    @classmethod
    def of(cls, components: _Components) -> Score:
        """From a RewardComponents message or a `rlvr.rewards.scoring` result."""
        return cls(components.reward, components.accuracy, components.format, components.strict,
                   components.extracted_answer or "")


def token_prompt(ids: Sequence[int]) -> rollout_pb2.Prompt:
    """A prompt already tokenized (the trainer's: the engine must see the ids the loss sees)."""
    return rollout_pb2.Prompt(token_ids=rollout_pb2.TokenIds(ids=ids))


def chat_prompt(messages: Iterable[tuple[str, str]]) -> rollout_pb2.Prompt:
    """A prompt as (role, content) chat turns, rendered by the rollout service's chat template."""
    return rollout_pb2.Prompt(messages=rollout_pb2.ChatMessages(
        messages=[common_pb2.ChatMessage(role=role, content=content) for role, content in messages]))


def generate_request(
    prompts: Sequence[rollout_pb2.Prompt], sampling: Sampling, adapter: AdapterTag, request_id: str = ""
) -> rollout_pb2.GenerateRequest:
    """`sampling.group_size` completions of each prompt from exactly `adapter` (its explicit version)."""
    return rollout_pb2.GenerateRequest(prompts=prompts, n=sampling.group_size, sampling=sampling.to_proto(),
                                       adapter=adapter.selector(), request_id=request_id)


def score_request(
    function: RewardName,
    items: Iterable[tuple[str, str]],
    *,
    format_bonus: bool | None = None,
    format_bonus_weight: float | None = None,
) -> reward_pb2.ScoreRequest:
    """A Score call for (completion, ground truth) pairs with reward function `function`
    ("math_pairs", ...); the format bonus and its weight are the service's defaults unless given."""
    return reward_pb2.ScoreRequest(
        function=REWARD_FUNCTIONS[function],
        items=[reward_pb2.ScoreItem(completion=c, ground_truth=t) for c, t in items],
        format_bonus=format_bonus,
        format_bonus_weight=format_bonus_weight,
    )
