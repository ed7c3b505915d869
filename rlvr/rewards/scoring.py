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

from dataclasses import dataclass
from typing import Literal, get_args

from rlvr.rewards.answers import MAX_ANSWER_CHARS, answers_match, final_answer, last_boxed

ScoringFunction = Literal["math_pairs", "gsm8k", "boxed"]
SCORING_FUNCTIONS: tuple[str, ...] = get_args(ScoringFunction)

# Longer completions are scored on their last MAX_COMPLETION_CHARS characters (the final answer is
# at the end) and get no format bonus. 2,048 tokens of an English BPE tokenizer are ~10k characters.
MAX_COMPLETION_CHARS = 32_000
MAX_GROUND_TRUTH_CHARS = MAX_ANSWER_CHARS
DEFAULT_FORMAT_WEIGHT = 0.1

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
# End-of-turn markers a rollout may leave in a completion decoded with its special tokens.
_EOS_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<eos>", "<|end|>")


@dataclass(frozen=True)
class ScoreResult:
    """One completion's score. ``reward = accuracy + format_weight * format`` (bonus on)."""

    reward: float
    accuracy: float
    format: float
    extracted_answer: str | None
    strict: bool  # correct, and its canonical place holds exactly the ground truth (see the module docstring)
    has_answer_tag: bool  # a closed <answer>…</answer> block exists
    timed_out: bool = False  # set by score_batch when the item hit its time limit (all zeros then)

    @property
    def answered(self) -> bool:
        """The model produced an answer at all (the benchmark's "answered")."""
        return self.extracted_answer is not None


TIMED_OUT = ScoreResult(0.0, 0.0, 0.0, None, strict=False, has_answer_tag=False, timed_out=True)


def _strip_eos(text: str) -> str:
    text = text.rstrip()
    stripped = True
    while stripped:  # at most a few markers; each pass shortens the text
        stripped = False
        for marker in _EOS_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                stripped = True
    return text


def format_ok(completion: str) -> bool:
    """The format rule above, checked with counts and positions (no regex backtracking).

    >>> format_ok("<think>a</think>\\n<answer>1</answer>"), format_ok("<think></think><answer>1</answer>")
    (True, False)
    """
    text = _strip_eos(completion).lstrip()
    if not text.startswith(THINK_OPEN) or any(text.count(tag) != 1 for tag in _TAGS):
        return False
    think_close, answer_open, answer_close = (text.index(t) for t in _TAGS[1:])
    if not think_close < answer_open < answer_close:
        return False
    think = text[len(THINK_OPEN) : think_close]
    between = text[think_close + len(THINK_CLOSE) : answer_open]
    answer = text[answer_open + len(ANSWER_OPEN) : answer_close]
    after = text[answer_close + len(ANSWER_CLOSE) :]
    return bool(think.strip()) and not between.strip() and bool(answer.strip()) and not after.strip()


def answer_block(completion: str) -> str | None:
    """Content of the last closed ``<answer>…</answer>`` block, or None.

    >>> answer_block("<answer>1</answer> <answer> 2 </answer>")
    ' 2 '
    """
    close = completion.rfind(ANSWER_CLOSE)
    if close < 0:
        return None
    open_ = completion.rfind(ANSWER_OPEN, 0, close)
    return None if open_ < 0 else completion[open_ + len(ANSWER_OPEN) : close]


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
    if function not in SCORING_FUNCTIONS:
        raise ValueError(
            f"function {function!r} is not a reward function; choose one of {list(SCORING_FUNCTIONS)}"
        )
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight {format_weight!r} is out of range; allowed 0.0 to 1.0")


def score(
    function: ScoringFunction,
    completion: str,
    ground_truth: str,
    format_bonus: bool = True,
    format_weight: float = DEFAULT_FORMAT_WEIGHT,
) -> ScoreResult:
    """Score one completion against its ground truth (see the module docstring for the rules)."""
    check_arguments(function, format_weight)
    too_long = len(completion) > MAX_COMPLETION_CHARS
    if too_long:
        completion = completion[-MAX_COMPLETION_CHARS:]
    candidate = extract_answer(function, completion)
    truth = ground_truth[:MAX_GROUND_TRUTH_CHARS]
    correct = answers_match(candidate, truth)
    accuracy = 1.0 if correct else 0.0
    fmt = 0.0 if too_long or not format_ok(completion) else 1.0
    reward = accuracy + (format_weight * fmt if format_bonus else 0.0)
    return ScoreResult(
        reward=round(reward, 10),  # 1.1, not 1.1000000000000001, in logs and metrics
        accuracy=accuracy,
        format=fmt,
        extracted_answer=candidate,
        strict=correct and canonical_answer(function, completion) == truth.strip(),
        has_answer_tag=answer_block(completion) is not None,
    )
