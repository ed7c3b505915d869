"""Math Pairs (synthetic): add adjacent pairs, multiply the sums; the correct final number wins.

A problem is four numbers ``a b c d`` from 1 to 9 and its answer is ``(a + b) * (c + d)``. The
sums are easy, the product (a table of 17 x 17 facts) is what a tiny model has to learn, so a short
warm-up leaves it partially right: room for RL to show a gain.

Held-out by construction: the answer is unchanged by swapping the numbers within a pair or swapping
the pairs, so every problem has a *canonical key* (each pair sorted, then the two pairs sorted) that
identifies it up to those trivial rewrites. A fixed hash of the key puts one fifth of the keys in the
held-out class. The training generator rejects every problem whose key is held out, whatever the
seed, and the benchmark draws only from that class: no training prompt of any seed can equal, or be
a reordering of, a benchmark prompt. Hashing (rather than, say, ``a % 5``) keeps both classes with
the same mix of difficulties.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from functools import lru_cache
from typing import cast

from rlvr.rewards.registry import RewardDefinition
from rlvr.rewards.scoring import answer_reward
from rlvr.tasks.base import (
    DEFAULT_SYNTHETIC_PROMPTS,
    NUMBER_INSTRUCTION,
    Problem,
    Split,
    TaskError,
    check_count,
)

MIN_VALUE = 1
MAX_VALUE = 9
NUM_VALUES = 4
HELDOUT_MODULUS = 5  # 1 in 5 canonical keys is held out
DEFAULT_HELDOUT_N = 500

Numbers = tuple[int, int, int, int]
CanonicalKey = tuple[tuple[int, int], tuple[int, int]]

QUESTION_PREFIX = "Add each adjacent pair of numbers, then multiply the sums:"


def answer(numbers: Sequence[int]) -> int:
    """The ground truth of a problem.

    >>> answer((3, 4, 5, 6))
    77
    """
    a, b, c, d = numbers
    return (a + b) * (c + d)


def canonical_key(numbers: Sequence[int]) -> CanonicalKey:
    """The problem up to the rewrites that keep its answer: orders within and between pairs.

    >>> canonical_key((6, 5, 4, 3)) == canonical_key((3, 4, 5, 6))
    True
    """
    a, b, c, d = numbers
    first, second = sorted([(min(a, b), max(a, b)), (min(c, d), max(c, d))])
    return (first, second)


def _hash_int(text: str) -> int:
    # sha256, not hash(): stable across processes, Python versions and PYTHONHASHSEED
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def is_heldout(numbers: Sequence[int]) -> bool:
    """Whether a problem belongs to the held-out class (a property of its canonical key only)."""
    return _hash_int(f"rlvr.math_pairs.heldout:{canonical_key(numbers)}") % HELDOUT_MODULUS == 0


@lru_cache(maxsize=1)
def all_heldout() -> tuple[Numbers, ...]:
    """Every held-out problem, in lexicographic order."""
    values = range(MIN_VALUE, MAX_VALUE + 1)
    return tuple(cast(Numbers, n) for n in itertools.product(values, repeat=NUM_VALUES) if is_heldout(n))


def _draw(seed: int, index: int) -> Numbers:
    """The ``index``-th training problem of ``seed``: rejection-sample outside the held-out class.

    Counter-based (a hash of seed, index, attempt) instead of a stateful RNG, so that prompt i is the
    same whatever n was asked for, and no library's RNG algorithm change can alter the set.
    """
    span = MAX_VALUE - MIN_VALUE + 1
    for attempt in itertools.count():
        digest = hashlib.sha256(f"rlvr.math_pairs.train:{seed}:{index}:{attempt}".encode()).digest()
        numbers = tuple(
            MIN_VALUE + int.from_bytes(digest[4 * k : 4 * k + 4], "big") % span for k in range(NUM_VALUES)
        )
        if not is_heldout(numbers):
            return cast(Numbers, numbers)  # NUM_VALUES long
    raise AssertionError("unreachable")


def question(numbers: Sequence[int]) -> str:
    return f"{QUESTION_PREFIX} {compact_question(numbers)}"


def compact_question(numbers: Sequence[int]) -> str:
    return " ".join(str(n) for n in numbers)


def parse_numbers(text: str) -> Numbers:
    """The four numbers of a question in either form (inverse of :func:`question`)."""
    tail = text.removeprefix(QUESTION_PREFIX).split()
    if len(tail) != NUM_VALUES or not all(t.isdigit() for t in tail):
        raise TaskError(f"not a Math Pairs question: {text!r}")
    return cast(Numbers, tuple(int(t) for t in tail))  # NUM_VALUES long: checked above


def worked_solution(numbers: Sequence[int]) -> str:
    """The completion the warm-up teaches: the two sums and the product, then the answer.

    >>> worked_solution((3, 4, 5, 6))
    '<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>'
    """
    a, b, c, d = numbers
    left, right = a + b, c + d
    product = left * right
    return f"<think>{a}+{b}={left} {c}+{d}={right} {left}*{right}={product}</think><answer>{product}</answer>"


def make_problem(numbers: Numbers, problem_id: str) -> Problem:
    return Problem(
        id=problem_id,
        task="math_pairs",
        question=question(numbers),
        ground_truth=str(answer(numbers)),
        compact=compact_question(numbers),
    )


class MathPairsTask:
    """Training prompts generated from a seed; the held-out benchmark as the ``test`` split."""

    name = "math_pairs"
    reward_function = "math_pairs"

    def splits(self) -> tuple[Split, ...]:
        return ("train", "test")

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """Generated training problems, or the held-out ones (each already in a seeded order)."""
        if split == "test":
            return heldout_problems(DEFAULT_HELDOUT_N if n is None else n, seed)
        if split != "train":
            raise TaskError(f"Math Pairs has no {split!r} split; its splits: train, test")
        return training_problems(DEFAULT_SYNTHETIC_PROMPTS if n is None else n, seed)


def training_problems(n: int = DEFAULT_SYNTHETIC_PROMPTS, seed: int = 0) -> list[Problem]:
    """``n`` training problems (8-100,000, repeats possible), never from the held-out class."""
    check_count(n, "synthetic_prompts")
    return [make_problem(_draw(seed, i), f"math_pairs/train/{seed}/{i}") for i in range(n)]


def heldout_problems(n: int = DEFAULT_HELDOUT_N, seed: int = 0) -> list[Problem]:
    """``n`` distinct held-out problems; the seed picks which (the same seed, the same set)."""
    pool = all_heldout()
    check_count(n, "held-out problems", low=1, high=len(pool))
    ranked = sorted(pool, key=lambda nums: _hash_int(f"rlvr.math_pairs.pick:{seed}:{nums}"))
    return [make_problem(nums, "math_pairs/test/" + "-".join(map(str, nums))) for nums in ranked[:n]]


REWARD = RewardDefinition(
    key="math_pairs",
    display_name="Math Pairs (synthetic)",
    description="A self-generating arithmetic task: add adjacent pairs, multiply; the correct final number "
                "wins. No dataset needed.",
    needs_dataset=False,
    default_benchmark="rlvr-math-pairs-heldout",
    benchmark_display_name="RLVR Math Pairs held-out",
    instruction=NUMBER_INSTRUCTION,
    heldout_size=DEFAULT_HELDOUT_N,
    score=answer_reward("math_pairs"),
    problems=lambda dataset, data_roots: MathPairsTask(),
    order=0,
)
