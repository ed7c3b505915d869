"""One completion's score from a job's rewards: each reward's score, combined with its weight, plus
the format bonus; every fault of a reward turned into a score of 0 with a reason.

``reward = sum(weight_i x score_i) + format_bonus_weight x format`` (bonus on), ``accuracy`` = the
score of the accuracy term (the first unless named), ``strict`` and ``extracted_answer`` that
term's. A reward that raises, or returns something that is not a number in [0, 1] (NaN, 1.5, a
string, a component out of range), scores the whole completion 0 with ``error`` naming the reward
and the fault: the GRPO advantage then treats it as a wrong answer, and the step counts it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.format import MAX_COMPLETION_CHARS, ScoreResult, answer_block, format_ok
from rlvr.rewards.registry import RewardDefinition, RewardOutput, Sample

MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class TermError:
    """A reward could not score a completion: why, in one line."""

    reason: str
    timed_out: bool = False


TermResult = RewardOutput | TermError


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} is {type(value).__name__} {str(value)[:40]!r}, not a number in [0, 1]")
    number = float(value)
    if math.isnan(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"{what} {number!r} is not in [0, 1]")
    return number


def normalize(value: Any) -> RewardOutput:
    """A reward's return value as a RewardOutput; TypeError/ValueError saying what is wrong."""
    if isinstance(value, RewardOutput):
        components = {str(k): _number(v, f"component {k!r}") for k, v in value.components.items()}
        return RewardOutput(_number(value.score, "score"), components, value.strict, value.extracted_answer,
                            str(value.note)[:MAX_ERROR_CHARS])
    if isinstance(value, Mapping):
        if not value:
            raise ValueError("no components returned")
        components = {str(k): _number(v, f"component {k!r}") for k, v in value.items()}
        score = components.get("score", sum(components.values()) / len(components))
        return RewardOutput(score, components)
    return RewardOutput(_number(value, "score"))


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _run(value: Any) -> Any:
    return asyncio.run(value) if asyncio.iscoroutine(value) else value


def evaluate(definition: RewardDefinition, samples: Sequence[Sample]) -> list[TermResult]:
    """One reward's results for samples, in order, in this process (faults become TermErrors).

    A batch reward is called once for all of them; a wrong number of results fails them all."""
    if definition.score_batch is not None:
        try:
            values = list(_run(definition.score_batch(list(samples))))
            if len(values) != len(samples):
                raise ValueError(f"returned {len(values)} scores for {len(samples)} completions")
        except Exception as exc:
            return [TermError(f"{definition.key}: {error_text(exc)}")] * len(samples)
        return [_one(definition, lambda v=v: v) for v in values]
    assert definition.score is not None
    score = definition.score
    return [_one(definition, lambda s=s: _run(score(s))) for s in samples]


def _one(definition: RewardDefinition, call: Any) -> TermResult:
    try:
        return normalize(call())
    except Exception as exc:
        return TermError(f"{definition.key}: {error_text(exc)}")


def zero(error: str, timed_out: bool = False) -> ScoreResult:
    return ScoreResult(0.0, 0.0, 0.0, None, strict=False, has_answer_tag=False, timed_out=timed_out,
                       error=error)


def combine(
    terms: Sequence[tuple[str, float]],
    results: Mapping[str, TermResult],
    completion: str,
    format_bonus: bool = True,
    format_weight: float = 0.1,
    accuracy_key: str | None = None,
) -> ScoreResult:
    """The completion's score from each term's result (``terms``: (key, weight), in the job's order)."""
    for key, _ in terms:
        result = results[key]
        if isinstance(result, TermError):
            return zero(result.reason, result.timed_out)
    outputs: dict[str, RewardOutput] = {key: results[key] for key, _ in terms}  # type: ignore[misc]
    accuracy_term = outputs[accuracy_key or terms[0][0]]
    too_long = len(completion) > MAX_COMPLETION_CHARS
    if too_long:
        completion = completion[-MAX_COMPLETION_CHARS:]
    fmt = 0.0 if too_long or not format_ok(completion) else 1.0
    total = sum(weight * outputs[key].score for key, weight in terms)
    components: dict[str, float] = {}
    for key, _ in terms:
        components[key] = outputs[key].score
        components.update({f"{key}.{name}": value for name, value in outputs[key].components.items()})
    strict = accuracy_term.strict if accuracy_term.strict is not None else accuracy_term.score == 1.0
    return ScoreResult(
        reward=round(total + (format_weight * fmt if format_bonus else 0.0), 10),
        accuracy=accuracy_term.score,
        format=fmt,
        extracted_answer=accuracy_term.extracted_answer,
        strict=bool(strict) and accuracy_term.score > 0,
        has_answer_tag=answer_block(completion) is not None,
        components=components,
        note="; ".join(f"{key}: {outputs[key].note}" for key, _ in terms if outputs[key].note),
    )


def score_samples(
    terms: Sequence[tuple[RewardDefinition, float]],
    samples: Sequence[Sample],
    format_bonus: bool = True,
    format_weight: float = 0.1,
    accuracy_key: str | None = None,
) -> list[ScoreResult]:
    """Scores samples with a job's rewards in this process (no time limit: the reward service's pool
    adds one, rlvr/services/reward/pool.py)."""
    per_term = {d.key: evaluate(d, samples) for d, _ in terms}
    weights = [(d.key, w) for d, w in terms]
    return [combine(weights, {k: v[i] for k, v in per_term.items()}, s.completion, format_bonus, format_weight,
                    accuracy_key) for i, s in enumerate(samples)]
