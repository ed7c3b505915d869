"""``guess_number``: a game of several turns and no tools. The environment thinks of a number from 1
to 100 (the row's ``secret`` column, else drawn from the episode's seed) and answers each guess with
"higher" or "lower" until the policy finds it or runs out of turns. Its prompts come from the
``guess_number`` reward (rlvr/tasks/guess_number.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlvr.environments.base import Environment, EpisodeRow, Reply, environment
from rlvr.rewards.registry import RewardOutput
from rlvr.tasks.guess_number import HIGH, LOW, parse_guess, secret_of

TURN_PENALTY = 0.05  # taken off a win for each guess after the first
MIN_WIN = 0.5  # a win never scores less

RULES = (f"Rules: the number is a whole number from {LOW} to {HIGH}. Each turn, give one guess inside "
         "<answer></answer>; I will answer whether the number is higher or lower, until you find it.")


@environment(
    "guess_number",
    display_name="Guess the Number",
    version="1",
    default_benchmark="guess-number",
    columns=("secret",),
    max_turns=8,
)
class GuessNumber(Environment):
    """Find a secret number from 1 to 100, told "higher" or "lower" after each guess.

    Reward: 0 unless the number is found; found in n guesses, ``max(0.5, 1 - 0.05 * (n - 1))``
    (1.0 at the first guess, 0.65 at the eighth), so fewer guesses win more; strict = found.
    An answer without a readable whole number counts as a guess and is told so."""

    def __init__(self) -> None:
        self.secret = 0
        self.guesses: list[int | None] = []
        self.solved = False

    def reset(self, row: EpisodeRow) -> str | None:
        given = row.columns.get("secret")
        self.secret = int(given) if given is not None and str(given).strip() else secret_of(row.seed)
        if not LOW <= self.secret <= HIGH:
            raise ValueError(f"the row's secret {self.secret} is outside {LOW}-{HIGH}")
        return RULES

    def step(self, text: str) -> Reply:
        guess = parse_guess(text)
        self.guesses.append(guess)
        if guess is None:
            return Reply(f"I could not read a guess: give one whole number from {LOW} to {HIGH} inside "
                         "<answer></answer>.")
        if guess == self.secret:
            self.solved = True
            return Reply(done=True)
        return Reply(f"Higher: the number is more than {guess}." if guess < self.secret
                     else f"Lower: the number is less than {guess}.")

    def reward(self) -> RewardOutput:
        n = len(self.guesses)
        score = max(MIN_WIN, 1.0 - TURN_PENALTY * (n - 1)) if self.solved else 0.0
        last = self.guesses[-1] if self.guesses else None
        return RewardOutput(score, {"solved": float(self.solved)}, strict=self.solved,
                            extracted_answer=None if last is None else str(last),
                            note=f"found in {n} guesses" if self.solved else f"not found in {n} guesses")

    def state(self) -> Mapping[str, Any]:
        return {"secret": self.secret, "guesses": list(self.guesses), "solved": self.solved}


ENVIRONMENT = GuessNumber
