"""Guess the Number: the prompts of the ``guess_number`` environment, and its reward on a final answer.

A problem is a secret whole number from 1 to 100 (``ground_truth`` and the ``secret`` column). The
game itself, several turns of guesses answered "higher" or "lower", is the ``guess_number``
environment (rlvr/environments/builtin/guess_number.py), which scores the episode; this reward is
what a job names for its prompts (``reward: guess_number`` with ``environment: guess_number``), and
it scores a lone answer (without the environment: one guess) as right or wrong.

Training secrets are drawn from the seed; the ``test`` split is every secret once, in a seeded order
(a game has no held-out class: what is learnt is the strategy, not the secrets).
"""

from __future__ import annotations

import hashlib

from rlvr.rewards.registry import RewardDefinition
from rlvr.rewards.scoring import answer_reward, extract_answer
from rlvr.tasks.base import DEFAULT_SYNTHETIC_PROMPTS, Problem, Split, TaskError, check_count

LOW, HIGH = 1, 100
QUESTION = f"I am thinking of a whole number from {LOW} to {HIGH}. Find it."
INSTRUCTION = "Think step by step inside <think></think>, then give only your guess, one whole number, " \
              "inside <answer></answer>."
HELDOUT_N = HIGH - LOW + 1


def _hash_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def secret_of(seed: int) -> int:
    """The secret an episode of ``seed`` plays for when its row names none."""
    return LOW + _hash_int(f"rlvr.guess_number.secret:{seed}") % (HIGH - LOW + 1)


def parse_guess(text: str) -> int | None:
    """The guess in an answer: the number of its last ``<answer>`` block, else its last number, as the
    number rewards read it; None when that is not a whole number.

    >>> parse_guess("<think>half of 100</think><answer>50</answer>"), parse_guess("I say 37."), parse_guess("?")
    (50, 37, None)
    """
    candidate = extract_answer("math_pairs", text)
    if candidate is None:
        return None
    candidate = candidate.strip().replace(",", "")
    try:
        value = float(candidate)
    except ValueError:
        return None
    return int(value) if value.is_integer() and abs(value) < 10**9 else None


def make_problem(secret: int, problem_id: str) -> Problem:
    return Problem(id=problem_id, task="guess_number", question=QUESTION, ground_truth=str(secret),
                   compact=f"guess {LOW}-{HIGH}", columns={"secret": secret})


class GuessNumberTask:
    """Secrets drawn from a seed for training; every secret once as the ``test`` split."""

    name = "guess_number"
    reward_function = "guess_number"

    def splits(self) -> tuple[Split, ...]:
        return ("train", "test")

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        if split == "test":
            n = HELDOUT_N if n is None else check_count(n, "held-out problems", low=1, high=HELDOUT_N)
            order = sorted(range(LOW, HIGH + 1), key=lambda s: _hash_int(f"rlvr.guess_number.pick:{seed}:{s}"))
            return [make_problem(s, f"guess_number/test/{s}") for s in order[:n]]
        if split != "train":
            raise TaskError(f"Guess the Number has no {split!r} split; its splits: train, test")
        n = check_count(DEFAULT_SYNTHETIC_PROMPTS if n is None else n, "synthetic_prompts")
        return [make_problem(secret_of(_hash_int(f"rlvr.guess_number.train:{seed}:{i}")),
                             f"guess_number/train/{seed}/{i}") for i in range(n)]


REWARD = RewardDefinition(
    key="guess_number",
    display_name="Guess the Number (game)",
    description="Prompts for the guess_number environment: find a secret number from 1 to 100 with higher/lower "
                "hints over several turns (the environment scores the game); alone, one right guess scores 1.",
    needs_dataset=False,
    default_benchmark="guess-number",
    benchmark_display_name="Guess the Number (every secret once)",
    instruction=INSTRUCTION,
    heldout_size=HELDOUT_N,
    score=answer_reward("math_pairs"),
    problems=lambda dataset, data_roots: GuessNumberTask(),
    order=4,
)
