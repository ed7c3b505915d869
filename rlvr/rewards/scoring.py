"""Scoring completions: reward = accuracy + a small format bonus, with the components kept apart.

Pure functions, no gRPC: the reward servicer is a thin shell over :func:`score` and
:func:`score_batch` (see :mod:`rlvr.services.reward.pool` for the per-item time limit).

Accuracy (1.0 or 0.0)
    ``math_pairs`` and ``gsm8k``: the final answer, the later of the last ``\\boxed{...}`` and the
    last "final answer is N" statement (as Math-Verify ranks them), else the last number: a box
    outranks numbers after it ("so \\boxed{12}. Check: 3 more" answers 12), and a boxed
    intermediate step followed by "The final answer is $10,455$" answers 10455. ``boxed``: the
    last closed ``\\boxed{...}``, nothing else (the spec rewards "a correct \\boxed{...} final
    answer": an unboxed number or an unclosed box earns nothing). Where the completion has an
    ``<answer>…</answer>`` block, the last such block is the answer and only its content counts (a
    number in the reasoning cannot stand in for a missing answer); without one, the whole
    completion is searched and the final candidate wins. Numbers compare as values (``18.0`` =
    ``18``, ``1,000`` = ``1000``); an equation with unknowns matches only the same equation.
Strict (True or False): how the answer is given, not whether it is wrapped in the format
    Correct *and* the answer read only from its canonical place equals the ground truth exactly as
    written, whitespace trimmed: the ``\\boxed{}`` content for ``boxed``; otherwise the closed
    ``<answer>`` block's content, or, without one, the completion's last non-empty line. No
    thousands separators, no ``18.0`` for ``18``, no searching elsewhere in the text. So strict never
    exceeds accuracy and does not depend on format: "a bare 70 on the last line" is correct and
    strict with format 0 (the spec's evaluation example: accuracy 70%, accuracy strict 70%, format
    0%).
Format (1.0 or 0.0)
    Exactly one non-empty ``<think>`` block, then exactly one non-empty ``<answer>`` block, with only
    whitespace around them (a trailing end-of-turn token such as ``<|im_end|>`` is tolerated).
    Repeated blocks, empty blocks or text after the answer earn nothing, so the bonus cannot be
    farmed.

>>> r = score("math_pairs", "<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>", "77")
>>> (r.reward, r.accuracy, r.format, r.strict, r.extracted_answer)
(1.1, 1.0, 1.0, True, '77')
>>> r = score("gsm8k", "She earns $8,000 a year.", "8000")
>>> (r.reward, r.accuracy, r.format, r.strict, r.has_answer_tag)
(1.0, 1.0, 0.0, False, False)
>>> r = score("gsm8k", "48 + 22 = 70\\n70", "70")
>>> (r.accuracy, r.strict, r.format)
(1.0, True, 0.0)
>>> score("boxed", r"<think>half</think><answer>\\boxed{\\dfrac{1}{2}}</answer>", "0.5").reward
1.1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rlvr.rewards.answers import MAX_ANSWER_CHARS, answers_match, final_answer, last_boxed
from rlvr.rewards.format import (
    DEFAULT_FORMAT_WEIGHT,
    MAX_COMPLETION_CHARS,
    MAX_GROUND_TRUTH_CHARS,
    TIMED_OUT,
    ScoreResult,
    _strip_eos,
    answer_block,
    format_ok,
)

if TYPE_CHECKING:
    from rlvr.rewards.registry import RewardOutput, Sample

# The answer checkers of the built-in rewards (each reward's declaration is beside its task in
# rlvr/tasks/, registered through the one registry, rlvr/rewards/registry.py).
ScoringFunction = Literal["math_pairs", "gsm8k", "boxed"]

__all__ = [
    "DEFAULT_FORMAT_WEIGHT", "MAX_COMPLETION_CHARS", "MAX_GROUND_TRUTH_CHARS", "TIMED_OUT", "ScoreResult",
    "ScoringFunction", "answer_block", "answer_output", "answer_reward", "canonical_answer", "check_arguments",
    "extract_answer", "format_ok", "score",
]


def extract_answer(function: ScoringFunction, completion: str) -> str | None:
    """The candidate final answer that accuracy compares (see the module docstring)."""
    block = answer_block(completion)
    region = completion if block is None else block
    candidate = last_boxed(region) if function == "boxed" else final_answer(region)
    if candidate is not None and len(candidate) > MAX_ANSWER_CHARS:
        candidate = candidate[:MAX_ANSWER_CHARS]
    return candidate


def canonical_answer(function: ScoringFunction, completion: str) -> str | None:
    """The answer as written in its canonical place, whitespace trimmed (strict reads only this):
    the last closed \\boxed{} for ``boxed`` (in the answer block when there is one); otherwise the
    closed answer block's content, or the completion's last non-empty line without one.

    >>> canonical_answer("gsm8k", "so 3+4 = 7\\n 7 \\n"), canonical_answer("gsm8k", "<answer> 7.0 </answer>")
    ('7', '7.0')
    """
    block = answer_block(completion)
    if function == "boxed":
        return last_boxed(completion if block is None else block)
    if block is not None:
        return block.strip()
    lines = [line for line in _strip_eos(completion).splitlines() if line.strip()]
    return lines[-1].strip() if lines else None


def check_arguments(function: str, format_weight: float) -> None:
    """Raise ValueError naming the field, the value and the allowed range (INVALID_ARGUMENT)."""
    from rlvr.rewards.registry import UnavailableReward, UnknownReward, load_registry

    try:
        load_registry().get(function)
    except (UnknownReward, UnavailableReward) as e:
        raise ValueError(f"function {function!r}: {e}") from None
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight {format_weight!r} is out of range; allowed 0.0 to 1.0")


def answer_output(function: ScoringFunction, completion: str, ground_truth: str) -> RewardOutput:
    """A built-in reward's score of one completion: accuracy (the final answer against the ground
    truth, see the module docstring), strict and the answer it read. The format bonus is the job's,
    added to every reward alike (rlvr/rewards/combine.py)."""
    from rlvr.rewards.registry import RewardOutput

    if len(completion) > MAX_COMPLETION_CHARS:
        completion = completion[-MAX_COMPLETION_CHARS:]
    candidate = extract_answer(function, completion)
    truth = ground_truth[:MAX_GROUND_TRUTH_CHARS]
    correct = answers_match(candidate, truth)
    return RewardOutput(
        score=1.0 if correct else 0.0,
        strict=correct and canonical_answer(function, completion) == truth.strip(),
        extracted_answer=candidate,
    )


def answer_reward(function: ScoringFunction):  # -> ScoreOne
    """The score function of the built-in reward `function`, as its declaration registers it."""

    def score_one(sample: Sample) -> RewardOutput:
        return answer_output(function, sample.completion, sample.ground_truth)

    score_one.__name__ = f"{function}_answer"
    return score_one


def score(
    function: str,
    completion: str,
    ground_truth: str,
    format_bonus: bool = True,
    format_weight: float = DEFAULT_FORMAT_WEIGHT,
) -> ScoreResult:
    """Score one completion against its ground truth with the reward `function` (a registry key;
    see the module docstring for the built-ins' rules)."""
    from rlvr.rewards.combine import score_samples
    from rlvr.rewards.registry import Sample, load_registry

    check_arguments(function, format_weight)
    definition = load_registry().get(function)
    return score_samples([(definition, 1.0)], [Sample(completion, ground_truth)], format_bonus, format_weight)[0]
