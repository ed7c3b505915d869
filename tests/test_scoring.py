"""Scoring: a table of the cases that break peer scorers, each with the reason it is here,
plus the format rule, argument errors, throughput and the per-item time limit."""

from __future__ import annotations

import doctest
import time
import types

import pytest

from rlvr.rewards import answers, scoring
from rlvr.rewards.answers import answers_match, last_boxed, last_number, numeric_value
from rlvr.rewards.scoring import MAX_COMPLETION_CHARS, ScoreResult, format_ok, score
from rlvr.services.reward.pool import ScoreItem, ScoringPool, score_batch, score_many

GOOD = "<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>"

# (function, completion, ground_truth, accuracy, format, strict, reason)
CASES: list[tuple[str, str, str, float, float, bool, str]] = [
    # --- Math Pairs / GSM8K: the final number ---
    ("math_pairs", GOOD, "77", 1, 1, True, "the canonical worked answer"),
    ("math_pairs", GOOD, "76", 0, 1, False, "well formatted but wrong earns only the format bonus"),
    (
        "math_pairs",
        "<think>7*11</think><answer>7*11=77</answer>",
        "77",
        1,
        1,
        False,
        "an equation in the answer: the final number (after '=') wins; not strict: not written exactly as the ground truth",
    ),
    (
        "math_pairs",
        "<think>x</think><answer>77</answer><|im_end|>",
        "77",
        1,
        1,
        True,
        "an end-of-turn token left by the rollout is not 'text after the answer'",
    ),
    (
        "math_pairs",
        "  \n<think>x</think>\n\n<answer> 77 </answer>\n",
        "77",
        1,
        1,
        True,
        "whitespace around and between blocks is allowed",
    ),
    ("math_pairs", "77", "77", 1, 0, True, "a bare number is correct; strict: its last line is exactly the answer"),
    (
        "math_pairs",
        "3+4=7, 5+6=11, so 7*11=77",
        "77",
        1,
        0,
        False,
        "no tags: the last number of the text is the answer",
    ),
    (
        "math_pairs",
        "<think>7*11=77</think><answer>seventy-seven</answer>",
        "77",
        0,
        1,
        False,
        "a number in the reasoning cannot stand in for the answer block's content",
    ),
    (
        "math_pairs",
        "<think>7*11=77</think><answer>78</answer> actually 77",
        "77",
        0,
        0,
        False,
        "text after the answer block: no format bonus, and the block still decides",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>76</answer><answer>77</answer>",
        "77",
        1,
        0,
        True,
        "repeated answer blocks: the last one counts, but the format bonus is lost",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>77</answer><answer>76</answer>",
        "77",
        0,
        0,
        False,
        "repeated answer blocks: the last one is final even if an earlier one was right",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>77",
        "77",
        1,
        0,
        False,
        "answer cut off by max tokens: unclosed tag, found in the text but not strict",
    ),
    (
        "math_pairs",
        "<think>a</think><answer></answer>",
        "77",
        0,
        0,
        False,
        "an empty answer block earns nothing",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>   </answer>",
        "77",
        0,
        0,
        False,
        "a whitespace-only answer block is empty",
    ),
    (
        "math_pairs",
        "<think></think><answer>77</answer>",
        "77",
        1,
        0,
        True,
        "an empty think block earns no format bonus",
    ),
    ("math_pairs", "<answer>77</answer>", "77", 1, 0, True, "no think block: correct, no format bonus"),
    (
        "math_pairs",
        "<think>a</think><think>b</think><answer>77</answer>",
        "77",
        1,
        0,
        True,
        "repeated think blocks earn no bonus",
    ),
    (
        "math_pairs",
        "<answer>77</answer><think>a</think>",
        "77",
        1,
        0,
        True,
        "blocks in the wrong order earn no bonus",
    ),
    (
        "math_pairs",
        "<think>a<answer>77</answer></think>",
        "77",
        1,
        0,
        True,
        "answer nested inside think earns no bonus",
    ),
    (
        "math_pairs",
        "Sure! <think>a</think><answer>77</answer>",
        "77",
        1,
        0,
        True,
        "chatter before the think block earns no bonus",
    ),
    (
        "math_pairs",
        "<think>a</think> so <answer>77</answer>",
        "77",
        1,
        0,
        True,
        "text between the blocks earns no bonus",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>0077</answer>",
        "77",
        1,
        1,
        False,
        "leading zeros compare numerically; not strict: not written exactly as the ground truth",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>77.</answer>",
        "77",
        1,
        1,
        False,
        "a sentence-ending period is not a decimal point; not strict: not written exactly as the ground truth",
    ),
    (
        "math_pairs",
        "<think>a</think><answer>1 2 3 4</answer>",
        "21",
        0,
        1,
        False,
        "echoing the problem's numbers is not an answer (last number is 4)",
    ),
    (
        "math_pairs",
        "<think>a</think><answer><think>77</answer>",
        "77",
        1,
        0,
        False,
        "a stray think tag inside the answer breaks the format; not strict: not written exactly as the ground truth",
    ),
    ("gsm8k", "<think>a</think><answer>8,000</answer>", "8000", 1, 1, False, "thousands separators; not strict: not written exactly as the ground truth"),
    (
        "gsm8k",
        "<think>a</think><answer>1,450,000</answer>",
        "1450000",
        1,
        1,
        False,
        "several separator groups; not strict: not written exactly as the ground truth",
    ),
    (
        "gsm8k",
        "<think>a</think><answer>8000</answer>",
        "8,000",
        1,
        1,
        False,
        "separators in the ground truth too; not strict: not written exactly as the ground truth",
    ),
    ("gsm8k", "<think>a</think><answer>$18.00</answer>", "18", 1, 1, False, "dollar sign and cents; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>18.0</answer>", "18", 1, 1, False, "18.0 equals 18; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>18.5</answer>", "18", 0, 1, False, "18.5 does not equal 18"),
    (
        "gsm8k",
        "<think>a</think><answer>The answer is 18 dollars.</answer>",
        "18",
        1,
        1,
        False,
        "units and words around the number; not strict: not written exactly as the ground truth",
    ),
    ("gsm8k", "<think>a</think><answer>-5</answer>", "-5", 1, 1, True, "negative answers"),
    ("gsm8k", "<think>a</think><answer>5</answer>", "-5", 0, 1, False, "a dropped sign is wrong"),
    ("gsm8k", "<think>a</think><answer>\u22125</answer>", "-5", 1, 1, False, "a unicode minus sign; not strict: not written exactly as the ground truth"),
    (
        "gsm8k",
        "<think>a</think><answer>10-5</answer>",
        "-5",
        0,
        1,
        False,
        "a minus between digits is subtraction, not a sign",
    ),
    ("gsm8k", "<think>a</think><answer>x = -5</answer>", "-5", 1, 1, False, "a sign after '='; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>+5</answer>", "5", 1, 1, False, "an explicit plus sign; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>25%</answer>", "25", 1, 1, False, "a percent sign; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>0.5</answer>", "0.50", 1, 1, False, "trailing zeros in decimals; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>.5</answer>", "0.5", 1, 1, False, "a decimal without leading zero; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>3/4</answer>", "0.75", 1, 1, False, "a plain fraction; not strict: not written exactly as the ground truth"),
    (
        "gsm8k",
        "<think>a</think><answer>\\boxed{72}</answer>",
        "72",
        1,
        1,
        False,
        "a boxed number inside the tag; not strict: not written exactly as the ground truth",
    ),
    (
        "gsm8k",
        "He pays 5 + 7 = 12 dollars, so \\boxed{12}. Check: 3 more.",
        "12",
        1,
        0,
        False,
        "a box outranks later numbers in the text",
    ),
    (
        "gsm8k",
        "<think>a</think><answer>He had 3 apples, now 10</answer>",
        "10",
        1,
        1,
        False,
        "several candidates: the final number wins; not strict: not written exactly as the ground truth",
    ),
    (
        "gsm8k",
        "<think>a</think><answer>10 apples, 3 eaten</answer>",
        "10",
        0,
        1,
        False,
        "several candidates: the final number wins even when an earlier one was right",
    ),
    ("gsm8k", "<think>a</think><answer>8\\,000</answer>", "8000", 1, 1, False, "a LaTeX thin space separator; not strict: not written exactly as the ground truth"),
    ("gsm8k", "<think>a</think><answer>8{,}000</answer>", "8000", 1, 1, False, "a LaTeX {,} separator; not strict: not written exactly as the ground truth"),
    (
        "gsm8k",
        "<think>a</think><answer>1,2,3</answer>",
        "3",
        1,
        1,
        False,
        "a comma list is not a thousands number; not strict: not written exactly as the ground truth",
    ),
    ("gsm8k", "<think>a</think><answer>no idea</answer>", "18", 0, 1, False, "no number at all"),
    ("gsm8k", "", "18", 0, 0, False, "an empty completion"),
    ("gsm8k", "<think>a</think><answer>18</answer>", "18.000", 1, 1, False, "a decimal ground truth; not strict: not written exactly as the ground truth"),
    (
        "gsm8k",
        "<think>a</think><answer>1e3</answer>",
        "1000",
        0,
        1,
        False,
        "scientific notation is read as written in prose (last number 3)",
    ),
    # --- Boxed-answer datasets ---
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\frac{1}{2}}</answer>",
        "\\frac{1}{2}",
        1,
        1,
        True,
        "nested braces inside the box",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\frac{1}{2}}</answer>",
        "0.5",
        1,
        1,
        False,
        "a LaTeX fraction equals its decimal; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\dfrac{2}{4}}</answer>",
        "1/2",
        1,
        1,
        False,
        "\\dfrac and unreduced fractions; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\tfrac12}</answer>",
        "0.5",
        1,
        1,
        False,
        "\\tfrac12 shorthand; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{-\\frac{3}{4}}</answer>",
        "-0.75",
        1,
        1,
        False,
        "a signed fraction; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\frac{-3}{4}}</answer>",
        "-3/4",
        1,
        1,
        False,
        "a sign inside the numerator; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{2\\sqrt{2}}</answer>",
        "\\sqrt{8}",
        1,
        1,
        False,
        "square roots compare numerically; not strict: not written exactly as the ground truth",
    ),
    ("boxed", "<think>a</think><answer>\\boxed{90^\\circ}</answer>", "90", 1, 1, False, "degrees; not strict: not written exactly as the ground truth"),
    ("boxed", "<think>a</think><answer>\\boxed{50\\%}</answer>", "50", 1, 1, False, "a LaTeX percent; not strict: not written exactly as the ground truth"),
    ("boxed", "<think>a</think><answer>\\boxed{18 \\text{ cm}}</answer>", "18", 1, 1, False, "\\text{} units; not strict: not written exactly as the ground truth"),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\$1{,}000}</answer>",
        "1000",
        1,
        1,
        False,
        "an escaped dollar and a braced separator; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\left( 1, 2 \\right)}</answer>",
        "(1,2)",
        1,
        1,
        False,
        "\\left/\\right and spacing in a tuple; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\text{Yes}}</answer>",
        "yes",
        1,
        1,
        False,
        "text answers compare after normalisation; not strict: not written exactly as the ground truth",
    ),
    ("boxed", "<think>a</think><answer>\\boxed{x = 5}</answer>", "5", 1, 1, False, "a variable assignment; not strict: not written exactly as the ground truth"),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{1} then \\boxed{2}</answer>",
        "2",
        1,
        1,
        True,
        "several boxes: the last one wins",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{1} then \\boxed{2}</answer>",
        "1",
        0,
        1,
        False,
        "several boxes: an earlier right box does not count",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\frac{1}{2}</answer>",
        "\\frac{1}{2}",
        0,
        1,
        False,
        "an unbalanced box is not read past its end",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\frac{1}{2}</answer>",
        "0.5",
        0,
        1,
        False,
        "the answer block does not stand in for a forgotten box: a boxed reward needs a closed box",
    ),
    ("boxed", "The answer is $\\boxed{\\frac{1}{2}}$.", "1/2", 1, 0, False, "a box outside any answer tag"),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{2}</answer>",
        "\\frac{4}{2}",
        1,
        1,
        False,
        "a LaTeX ground truth against a plain answer; not strict: not written exactly as the ground truth",
    ),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{3}</answer>",
        "\\text{three}",
        0,
        1,
        False,
        "a number never matches a non-number",
    ),
    ("boxed", "<think>a</think><answer>\\boxed 5</answer>", "5", 1, 1, True, "\\boxed without braces"),
    ("boxed", "<think>a</think><answer>\\fbox{5}</answer>", "5", 1, 1, True, "\\fbox counts like \\boxed"),
    ("boxed", "<think>a</think><answer>\\boxed{}</answer>", "5", 0, 1, False, "an empty box is no answer"),
    (
        "boxed",
        "<think>a</think><answer>\\boxed{\\frac{1}{0}}</answer>",
        "1",
        0,
        1,
        False,
        "division by zero is not a number and does not crash",
    ),
]

# Found by an outside suite of answer-checking cases (Math-Verify, TRL, open-r1, verl, lm-eval's GSM8K):
# each failed before the rule it names.
ZAIUS = ("First CD: $0.04 \\cdot 10,000 \\cdot \\frac{1}{2} = \\boxed{200}$ So, after six months, Dr. Zaius has $10,000 + $200 = $10,200. Second CD: $0.05 \\cdot 10,200 \\cdot \\frac{1}{2} = \\boxed{255}$ So he has $10,200 + $255 = $10,455. Final Answer: The final answer is $10,455$. I hope it is correct.")  # Math-Verify's tests/test_all.py: boxed intermediate steps, then the stated answer
CASES += [
    ("boxed", "\\boxed{x + y - z + 2 = 0}", "5x - 7y + 11z + 4 = 0", 0, 0, False,
     "two equations ending in = 0 are not equal: an equation matches as an equation, not by its right side"),
    ("boxed", "\\boxed{0}", "a + 3z = 0", 0, 0, False, "a bare 0 is not the equation a + 3z = 0"),
    ("gsm8k", "0", "a + 3z = 0", 0, 0, False, "a bare final number is not an equation either"),
    ("boxed", "so $$\\boxed{x-2y+z-1=0}.$$", "x-2y+z-1=0", 1, 0, True, "the same equation matches (strict: as written)"),
    ("boxed", "\\boxed{0 = x - 2y + z - 1}", "x-2y+z-1=0", 1, 0, False, "the same equation with its sides swapped"),
    ("gsm8k", ZAIUS, "10455", 1, 0, False,
     "a stated final answer after boxed intermediate steps wins (Math-Verify: the later of the two)"),
    ("math_pairs", "\\boxed{7} was a guess. The final answer is 12.", "12", 1, 0, False,
     "Math Pairs reads the final answer the same way"),
    ("gsm8k", "The final answer is 12, so \\boxed{13}", "13", 1, 0, False, "a box after the statement is the later one"),
    ("boxed", "\\boxed{\\cfrac{1}{2}}", "0.5", 1, 0, False, "\\cfrac is a fraction"),
    ("boxed", "\\boxed{\\cfrac{3}{4}}", "\\frac{3}{4}", 1, 0, False, "\\cfrac against \\frac"),
    ("boxed", "\\boxed{5\\textnormal{ cm}}", "5", 1, 0, False, "\\textnormal{} units are stripped"),
    ("gsm8k", "so she has 55", "####: 55", 1, 0, False, "a ground truth written ####: 55 is 55"),
    ("gsm8k", "so she has 55", "#### 55", 1, 0, False, "a ground truth written #### 55 is 55"),
]
# A stated final answer written with its working (a real model wrote "the final answer is 6 + 12 + 24 =
# 48" in 7 of 16 held-out rows): what it states is the result, never the first number of the working.
CASES += [
    ("gsm8k", "Each pays 6, 12 and 24. So the final answer is 6 + 12 + 24 = 48", "48", 1, 0, False,
     "a stated answer with its working states the number after the last ="),
    ("gsm8k", "So the final answer is 6 + 12 + 24 = 48", "6", 0, 0, False, "... not the working's first number"),
    ("gsm8k", "So the final answer is 6+12+24 = 48.", "48", 1, 0, False, "the working unspaced, a full stop after"),
    ("gsm8k", "The final answer is 2*3=6", "6", 1, 0, False, "a product with its result"),
    ("gsm8k", "The final answer is $6 \\times 7 = 42$.", "42", 1, 0, False, "LaTeX operators, in $...$"),
    ("gsm8k", "The final answer is $1,200 + 34 = 1,234$.", "1234", 1, 0, False, "thousands separators in the working"),
    ("gsm8k", "The final answer is (6 + 12) * 2 = 36 apples.", "36", 1, 0, False, "brackets in the working"),
    ("gsm8k", "So the final answer is 6 + 12 + 24.", "42", 1, 0, False, "working without its result: what it comes to"),
    ("gsm8k", "The final answer is 3 - the other two are wrong.", "3", 1, 0, False,
     "a dash after the number is prose, not a subtraction"),
    ("gsm8k", "The final answer is: 48", "48", 1, 0, False, "a colon after is"),
    ("gsm8k", "The final answer is $48", "48", 1, 0, False, "a dollar sign before the number"),
    ("gsm8k", "The final answer is \\$48. Then 2 + 2 = 4", "48", 1, 0, False,
     "an escaped dollar sign, and arithmetic after the statement's sentence is not its answer"),
]


@pytest.mark.parametrize(
    ("function", "completion", "ground_truth", "accuracy", "fmt", "strict", "reason"),
    CASES,
    ids=[f"{i:02d}-{c[6][:40]}" for i, c in enumerate(CASES)],
)
def test_scoring_table(
    function: str, completion: str, ground_truth: str, accuracy: float, fmt: float, strict: bool, reason: str
) -> None:
    result = score(function, completion, ground_truth)  # type: ignore[arg-type]
    assert (result.accuracy, result.format, result.strict) == (accuracy, fmt, strict), reason
    assert result.reward == pytest.approx(accuracy + 0.1 * fmt), reason


# Strict is about how the answer is given, never about the <think>/<answer> wrapper.
STRICT_CASES = [
    ("gsm8k", "48 + 22 = 70\n70", "70", True, "no tags: the last line is exactly the answer"),
    ("gsm8k", "48 + 22 = 70\n70\n\n<|im_end|>", "70", True, "trailing blank lines and end-of-turn are not a line"),
    ("gsm8k", "48 + 22 = 70\nThe answer is 70", "70", False, "the last line is a sentence, not the answer"),
    ("gsm8k", "70\nlet me check", "70", False, "the answer is not on the last line"),
    ("gsm8k", "<answer>70</answer>", "70", True, "an answer block without a think block: strict, format 0"),
    ("gsm8k", "<answer> 70 </answer> done", "70", True, "the block, whitespace trimmed; text after costs format only"),
    ("gsm8k", "<answer>70.0</answer>", "70", False, "18.0 is not 18 as written"),
    ("gsm8k", "<answer>1,000</answer>", "1000", False, "no thousands separators"),
    ("gsm8k", "<answer>1,000</answer>", "1,000", True, "exactly as the ground truth writes it"),
    ("boxed", "so \\boxed{12}", "12", True, "the box is a boxed dataset's canonical place, tags or not"),
    ("boxed", "<answer>\\boxed{12}</answer>", "12", True, "a box inside the answer block"),
    ("boxed", "<answer>12</answer>", "12", False, "no box: not even correct for a boxed reward"),
]


@pytest.mark.parametrize(("function", "completion", "truth", "strict", "reason"), STRICT_CASES,
                         ids=[c[4][:40] for c in STRICT_CASES])
def test_strict_reads_only_the_canonical_place(function: str, completion: str, truth: str, strict: bool,
                                               reason: str) -> None:
    result = score(function, completion, truth)  # type: ignore[arg-type]
    assert result.strict == strict, reason
    assert result.format == 0.0  # none of these has the full format: strict does not need it
    assert result.strict <= result.accuracy


def test_the_specs_evaluation_example_is_reachable() -> None:
    """The spec's evaluation page: accuracy 70%, accuracy strict 70%, format 0%, on ten answers a
    model gives as a bare last line, seven of them right."""
    truths = [str(10 * i + 3) for i in range(10)]
    completions = [f"{t} is what the sums give\n{t if i < 7 else int(t) + 1}" for i, t in enumerate(truths)]
    results = [score("gsm8k", c, t) for c, t in zip(completions, truths, strict=True)]
    n = len(results)
    shares = (sum(r.accuracy for r in results) / n, sum(r.strict for r in results) / n,
              sum(r.format for r in results) / n)
    assert shares == (0.7, 0.7, 0.0)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({(c[0], c[1], c[2]) for c in CASES}) == len(CASES), "duplicate rows"


def test_components_and_extracted_answer() -> None:
    result = score("gsm8k", "<think>a</think><answer>$8,000</answer>", "8000", format_weight=0.25)
    # correct as a value, not strict: the answer block holds "$8,000", not "8000" as written
    assert result == ScoreResult(1.25, 1.0, 1.0, "8,000", strict=False, has_answer_tag=True,
                                 components={"gsm8k": 1.0})  # the one reward's score, under its key
    assert result.answered
    assert score("gsm8k", GOOD, "77", format_bonus=False).reward == 1.0
    assert score("gsm8k", GOOD, "0", format_bonus=False).format == 1.0  # reported even when unpaid
    missing = score("gsm8k", "<think>a</think>", "7")
    assert missing.extracted_answer is None and not missing.answered and not missing.has_answer_tag


@pytest.mark.parametrize(
    ("function", "weight", "field"),
    [("nope", 0.1, "function"), ("gsm8k", -0.1, "format_weight"), ("gsm8k", 1.5, "format_weight")],
)
def test_bad_arguments_name_the_field(function: str, weight: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        score(function, "1", "1", format_weight=weight)  # type: ignore[arg-type]


@pytest.mark.parametrize("module", [answers, scoring])
def test_doctests(module: types.ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_helpers() -> None:
    assert last_boxed("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_number("x") is None
    assert last_number("(-3)") == "-3"
    assert numeric_value("abc") is None
    assert answers_match("\\frac{1}{3}", "0.3333333") is False  # exact fractions, no sloppy rounding
    assert format_ok("<think>a</think><answer>1</answer>")


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{" * 50_000,  # unbalanced boxes everywhere
        "{" * 100_000 + "\\boxed{1}",
        "1," * 100_000,
        "-" * 100_000 + "1",
        "<answer>" * 20_000 + "</answer>" * 20_000,
        "\\text{" * 30_000,
        "9" * 200_000,
        ("<think>" + "a" * 50) * 5_000,
    ],
    ids=["boxes", "braces", "commas", "minuses", "tags", "text", "digits", "thinks"],
)
def test_pathological_inputs_are_fast(completion: str) -> None:
    start = time.perf_counter()
    for function in ("math_pairs", "gsm8k", "boxed"):
        score(function, completion, "\\text{" * 300 + "1")  # type: ignore[arg-type]
    assert time.perf_counter() - start < 1.0


def test_overlong_completion_scores_its_tail_without_bonus() -> None:
    completion = "<think>" + "x" * MAX_COMPLETION_CHARS + "</think><answer>7</answer>"
    result = score("gsm8k", completion, "7")
    assert result.accuracy == 1.0 and result.format == 0.0


def test_a_large_batch_is_scored_in_process_item_by_item() -> None:
    """2,000 items in one call, each with its own answer (thousands separators included). The speed
    is bench/reward_throughput.py's to measure: a timed assertion here failed on a loaded host."""
    items = [ScoreItem("gsm8k", f"<think>{i}+1</think><answer>{i:,}</answer>", str(i)) for i in range(2000)]
    results = score_many(items)
    assert len(results) == 2000 and all(r.accuracy == 1.0 for r in results)
    assert score_many([ScoreItem("gsm8k", "<think>x</think><answer>1,234</answer>", "1235")])[0].accuracy == 0.0


def test_pool_enforces_per_item_time_limit(faulty_plugins) -> None:
    """A reward that hangs on some inputs (the test plugin `hangs`, standing in for a pathological
    string or a faulty plugin): each such item times out with its reason, the others are scored."""
    pool = ScoringPool(workers=1)
    try:
        items = [ScoreItem("hangs", text, "1") for text in ["1", "HANG", "2", "1", "HANG", "1"]]
        start = time.perf_counter()
        results = pool.score_batch(items, timeout_s=0.5)
        elapsed = time.perf_counter() - start
        assert [r.timed_out for r in results] == [False, True, False, False, True, False]
        assert [r.accuracy for r in results] == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert [r.error for r in results] == ["", "hangs: timed out after 0.5 s", "", "", "hangs: timed out after 0.5 s",
                                              ""]
        assert elapsed < 10  # two 0.5 s limits plus two worker restarts, not two 60 s sleeps
        # the pool stays usable after a timeout
        assert pool.score_batch([ScoreItem("gsm8k", "3", "3")])[0].accuracy == 1.0
    finally:
        pool.close()


def test_pool_matches_in_process_and_keeps_order() -> None:
    items = [
        ScoreItem("math_pairs", f"<think>a</think><answer>{i % 7}</answer>", str(i % 5)) for i in range(1500)
    ]
    pool = ScoringPool(workers=2)
    try:
        assert pool.score_batch(items) == score_many(items)
    finally:
        pool.close()


def test_batch_rejects_bad_item_before_work() -> None:
    with pytest.raises(ValueError, match="item 1: function"):
        score_batch([ScoreItem("gsm8k", "1", "1"), ScoreItem("bogus", "1", "1")])  # type: ignore[arg-type]
    assert score_batch([]) == []


def test_gsm8k_ground_truth_after_a_colon() -> None:
    """`####: 55` (a colon after GSM8K's marker) is the ground truth 55."""
    from rlvr.tasks.gsm8k import ground_truth

    assert ground_truth("5 * 11 = 55\n####: 55") == "55"
    assert ground_truth("#### 1,450,000") == "1450000"


def test_a_killed_service_leaves_its_own_last_lines_not_its_pool_workers_traceback() -> None:
    """kill -9 of a process with scoring workers (the reward service): its workers end quietly when
    the pipe to it closes, so the end of its log (`rlvr up`'s crash report) is its own, not a
    worker's EOFError traceback."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent("""
        import os, signal, sys
        from rlvr.services.reward.pool import ScoreItem, ScoringPool
        pool = ScoringPool(workers=1)
        pool.score_batch([ScoreItem("math_pairs", "The answer is 4", "4")])  # a worker runs now
        print("the service's own last line", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # The worker inherits stderr: reading it to its end waits for the worker too.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == -9, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "the service's own last line", done.stderr
    assert "EOFError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
