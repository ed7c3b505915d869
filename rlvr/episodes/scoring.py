"""How an episode is scored and shown, the same for every service that runs episodes.

The trainer (services/trainer/job/episodes.py) and the benchmark service (services/benchmark/episodes.py)
both score an episode this way:

- a failed episode (its environment raised in reset, step, reward or state) scores 0, with its reason;
- an environment that scores the episode itself (``Environment.reward()`` not None) gives the score,
  its per-turn rewards (`Reply.reward`) added, capped at 1;
- otherwise the caller's reward scores `episode_score_input`: the final answer, the whole
  conversation (tool calls included, as their text), the row's columns and the environment's column
  ``"environment"`` (key, version, final state, counters); per-turn rewards are added to its reward.

`EpisodeScores` splits a batch of episodes into those two kinds, so the caller makes one reward call
(sync or async, its own) for the episodes that need one, and `transcript` / `episode_record` are an
episode turn by turn, as text (a step's completion samples, an evaluation row's completion) and as
JSON (an evaluation row's turns, what the console shows).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.environments.base import EnvironmentInfo
from rlvr.episodes.types import Episode
from rlvr.peers.types import Score, ScoreInput
from rlvr.tasks.base import Problem

__all__ = ["EpisodeScores", "environment_column", "episode_record", "episode_score_input", "own_score",
           "score_input_of", "transcript", "with_turn_rewards"]


def environment_column(episode: Episode, definition: EnvironmentInfo) -> dict[str, Any]:
    """The ``"environment"`` column a reward reads: the environment, its final state, the counters."""
    return {"key": definition.key, "version": definition.version, "state": dict(episode.env_state),
            "turns": len(episode.turns), "tool_calls": episode.tool_calls, "tool_errors": episode.tool_errors}


def episode_score_input(episode: Episode, problem: Problem | None, truth: str, prompt: str,
                        definition: EnvironmentInfo) -> ScoreInput:
    """What a reward reads of an episode of `problem` (None: of the prompt `prompt`)."""
    if problem is None:
        return score_input_of(episode, prompt, truth, {}, definition)
    return score_input_of(episode, problem.question, truth, problem.columns, definition)


def score_input_of(episode: Episode, question: str, truth: str, columns: Mapping[str, Any],
                   definition: EnvironmentInfo) -> ScoreInput:
    """What a reward reads of an episode: its final answer, the whole conversation (tool calls
    included, as their text), the row's columns and the environment's column."""
    messages = tuple((str(m.get("role", "")), _content(m)) for m in episode.messages)
    columns = {**columns, "environment": environment_column(episode, definition)}
    return ScoreInput(episode.final_answer, truth, question, messages, columns)


def _content(message: Mapping[str, Any]) -> str:
    content = str(message.get("content") or "")
    calls = message.get("tool_calls") or []
    if calls:
        shown = [{"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
                 for c in calls]
        content = f"{content}\n{json.dumps(shown)}".strip()
    return content


def with_turn_rewards(score: Score, episode: Episode) -> Score:
    """A reward's score of the episode with its per-turn rewards added to the reward."""
    bonus = sum(episode.turn_rewards)
    if not bonus:
        return score
    return Score(score.reward + bonus, score.accuracy, score.format, score.strict, score.extracted_answer,
                 score.components, score.error, score.note)


def own_score(episode: Episode) -> Score | None:
    """The episode's score when no reward call is needed: a failed episode's 0 with its reason, or
    the environment's own (its per-turn rewards added, capped at 1); None when a reward scores it."""
    from rlvr.rewards.combine import normalize

    if episode.error:
        return Score(0.0, 0.0, 0.0, error=episode.error)
    if episode.env_reward is None:
        return None
    try:
        out = normalize(episode.env_reward)
    except (TypeError, ValueError) as exc:  # the environment's fault: a failed episode, counted as one
        episode.error = f"environment reward: {exc}"
        return Score(0.0, 0.0, 0.0, error=episode.error)
    bonus = sum(episode.turn_rewards)
    return Score(min(1.0, out.score + bonus), out.score, 0.0,
                 bool(out.strict if out.strict is not None else out.score == 1),
                 out.extracted_answer or "", dict(out.components), note=out.note)


@dataclass
class EpisodeScores:
    """A batch of episodes' scores in the making: those known without a reward call, and the inputs
    of those a reward scores (`pending`, by episode index). The caller scores `inputs()` with its
    reward, in one call, and `complete`s with the results."""

    episodes: Sequence[Episode]
    scores: list[Score | None] = field(default_factory=list)
    pending: list[tuple[int, ScoreInput]] = field(default_factory=list)

    @classmethod
    def split(cls, episodes: Sequence[Episode], score_input: Callable[[int, Episode], ScoreInput]) -> EpisodeScores:
        """`score_input(k, episode)`: what the reward reads of episode k (asked only for those it scores)."""
        scores = [own_score(e) for e in episodes]
        pending = [(k, score_input(k, e)) for k, (e, s) in enumerate(zip(episodes, scores, strict=True)) if s is None]
        return cls(episodes, scores, pending)

    def inputs(self) -> list[ScoreInput]:
        return [item for _, item in self.pending]

    def complete(self, results: Sequence[Score]) -> list[Score]:
        """Every episode's score, in order, given the reward's `results` for `inputs()`."""
        if len(results) != len(self.pending):
            raise ValueError(f"the reward scored {len(results)} of {len(self.pending)} episodes")
        scores = list(self.scores)
        for (k, _), score in zip(self.pending, results, strict=True):
            scores[k] = with_turn_rewards(score, self.episodes[k])
        return [s for s in scores if s is not None]


def transcript(episode: Episode) -> str:
    """An episode turn by turn, as text: each assistant turn, its tool calls' results (or errors),
    the environment's replies, and why it failed."""
    lines = []
    for number, turn in enumerate(episode.turns, 1):
        lines.append(f"[turn {number}] {turn.assistant}")
        for call in turn.tool_calls:
            outcome = f"error: {call['error']}" if call["error"] else call["result"]
            lines.append(f"[tool {call['name'] or '?'}] {outcome}")
        if turn.reply is not None:
            lines.append(f"[environment] {turn.reply}")
    if episode.error:
        lines.append(f"[failed] {episode.error}")
    return "\n".join(lines)


def episode_record(episode: Episode) -> dict[str, Any]:
    """An episode turn by turn, as JSON-able values: each turn (its text, tool calls with their
    arguments, results, errors and seconds, the environment's reply, a per-turn reward, tokens,
    finish reason), how it ended, why it failed, the counters and the environment's final state."""
    return {
        "turns": [{"assistant": t.assistant, "tool_calls": [dict(c) for c in t.tool_calls], "reply": t.reply,
                   "reward": t.reward, "adapter_version": t.adapter_version, "sampled_tokens": t.sampled_tokens,
                   "observation_tokens": t.observation_tokens, "finish_reason": t.finish_reason}
                  for t in episode.turns],
        "ended_by": episode.ended_by, "error": episode.error, "truncated": episode.truncated,
        "tool_calls": episode.tool_calls, "tool_errors": episode.tool_errors,
        "state": _jsonable(dict(episode.env_state)), "seconds": round(episode.seconds, 4),
    }


def _jsonable(value: Any) -> Any:
    """`value` as JSON would read it back (anything JSON cannot hold as its str)."""
    return json.loads(json.dumps(value, default=str))
