"""What every reward's score shares, whatever the reward: the result of one completion
(:class:`ScoreResult`, components kept apart) and the format bonus's rule (:func:`format_ok`).

Format (1.0 or 0.0)
    Exactly one non-empty ``<think>`` block, then exactly one non-empty ``<answer>`` block, with only
    whitespace around them (a trailing end-of-turn token such as ``<|im_end|>`` is tolerated).
    Repeated blocks, empty blocks or text after the answer earn nothing, so the bonus cannot be
    farmed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlvr.rewards.answers import MAX_ANSWER_CHARS

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
    # each reward's score by key, and its named components as "<key>.<name>" (rlvr/rewards/combine.py)
    components: Mapping[str, float] = field(default_factory=dict)
    error: str = ""  # why the completion scored 0 although it was scored (a reward's fault); "" = none
    note: str = ""  # what the rewards said of their score ("code: 2 of 3 tests passed"); not an error

    @property
    def answered(self) -> bool:
        """The model produced an answer at all (the benchmark's "answered")."""
        return self.extracted_answer is not None


TIMED_OUT = ScoreResult(0.0, 0.0, 0.0, None, strict=False, has_answer_tag=False, timed_out=True,
                        error="timed out")


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
