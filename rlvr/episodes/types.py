"""An episode's record: its conversation, the training samples its tokens make, its counters.

Token in, token out: a sample's ``completion_ids`` are the exact ids the policy sampled, with the
ids of everything it did not sample (the rest of a turn's closing after its stop token, tool
results, the environment's replies, the next turn's header) appended between its turns. ``mask``
is 1 on a sampled id and 0 on every other; ``logprobs`` holds the sampling logprob of a sampled id
and 0.0 elsewhere. Each sampled segment keeps the adapter version that produced it.

One episode is one sample while the chat template only appends. A template that re-renders earlier
turns (Qwen3 drops the thinking of turns before the last user message) splits the episode: a new
sample starts whose prompt is the whole conversation rendered afresh, and every sample of the
episode gets the episode's reward (episodes/chat.py decides when).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Episode", "EpisodeSample", "Segment", "TurnRecord"]


@dataclass(frozen=True)
class Segment:
    """One sampled stretch of a sample's completion: ``completion_ids[start:end]`` came from
    ``adapter_version`` of ``adapter_name`` ("" and 0: the base model)."""

    start: int
    end: int
    adapter_name: str
    adapter_version: int


@dataclass
class EpisodeSample:
    """One training sample of an episode: a prompt and what followed it."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy (trained on)
    logprobs: list[float] = field(default_factory=list)  # sampling logprob where mask is 1, else 0.0
    segments: list[Segment] = field(default_factory=list)

    def append_sampled(self, ids: list[int], logprobs: list[float] | None, adapter_name: str,
                       adapter_version: int) -> None:
        start = len(self.completion_ids)
        self.completion_ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.segments.append(Segment(start, len(self.completion_ids), adapter_name, adapter_version))

    def append_observation(self, ids: list[int]) -> None:
        self.completion_ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    @property
    def sampled_tokens(self) -> int:
        return sum(self.mask)


@dataclass
class TurnRecord:
    """One assistant turn and what answered it (what evaluation rows and the console show)."""

    assistant: str  # the turn's text as sampled (special tokens skipped)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments", "result", "error", "seconds"}
    reply: str | None = None  # the environment's user message after the turn, if any
    reward: float | None = None  # a per-turn reward the environment gave
    adapter_version: int = 0
    sampled_tokens: int = 0
    observation_tokens: int = 0
    finish_reason: str = "stop"  # "stop" or "length"


@dataclass
class Episode:
    """A whole episode: its conversation, samples, turns and counters."""

    messages: list[dict[str, Any]]  # the conversation (OpenAI/chat-template form, tool calls included)
    samples: list[EpisodeSample]
    turns: list[TurnRecord] = field(default_factory=list)
    final_answer: str = ""  # the last assistant turn's text: what the job's reward scores
    env_state: Mapping[str, Any] = field(default_factory=dict)
    env_reward: Any = None  # what Environment.reward() returned (None: the job's reward scores)
    turn_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    observation_tokens: int = 0
    observations_cut: int = 0  # observations cut to fit the episode's token cap
    truncated: bool = False  # cut at the per-turn limit or the episode's token cap
    ended_by: str = ""  # "done", "answer", "max_turns", "token_cap", "length", "error"
    error: str = ""  # why the episode failed (reset raised, the environment died...): scored 0
    seconds: float = 0.0

    @property
    def sampled_tokens(self) -> int:
        return sum(s.sampled_tokens for s in self.samples)

    @property
    def episode_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.samples)

    @property
    def adapter_versions(self) -> list[int]:
        return [seg.adapter_version for s in self.samples for seg in s.segments]
