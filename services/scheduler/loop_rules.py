"""The rules of an automated training loop, as pure functions of its stored rounds.

scheduler.proto's loops section is the contract these implement: the percent scale, the real-gain
threshold, the BEST round (ties to the earlier round), the delta against the previous scored round,
the round a new round stacks on, and when a loop stops (target, then rounds, then plateau). The
loop manager (services/scheduler/loops.py) calls them after every scored round and the Loop view
(services/scheduler/convert.py) calls them to draw badges and arrows, so both read one definition.
No store, no gRPC: rows in, decisions out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class ScoredRound(Protocol):
    """What the rules read of a round (a `RoundRow` fits)."""

    index: int
    status: str
    score: float | None
    real_gain: bool


R = TypeVar("R", bound=ScoredRound)  # a round type the rules hand back as it came (a RoundRow)


def percent(share: float) -> float:
    """A benchmark share (0-1, benchmark.proto's ScoreBreakdown) as the leaderboard's percent.

    The one conversion between the two scales: a loop's target, scores and deltas are percents.
    Rounded to 1e-6 points so that k/n * 100 compares exactly with a typed target (0.07 * 100 is
    7.000000000000001 in binary floating point)."""
    return round(100.0 * share, 6)


def standard_error_points(score_percent: float, questions: int) -> float:
    """One standard error of a score measured on `questions` questions, in points:
    100 * sqrt(p (1 - p) / n), p the score as a share."""
    if questions <= 0:
        return 0.0
    p = min(max(score_percent / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / questions)


def gain_threshold(min_gain: float | None, best_before: float, questions: int,
                   paired_se: float | None = None) -> float:
    """Points a round must gain over `best_before` (the best score before it, the baseline
    included) for the gain to be real: `min_gain` when set, else one standard error of the gain.
    That is `paired_se` (rlvr/paired.py: the standard error of the per-question differences
    between the round's evaluation and the best before it, the same questions asked of both)
    when the two evaluations' results could be paired, else one standard error of `best_before`
    at the round's question count."""
    if min_gain is not None:
        return min_gain
    if paired_se is not None:
        return paired_se
    return standard_error_points(best_before, questions)


def best_before_round(rounds: Sequence[R], index: int, baseline: float) -> R | None:
    """The round that holds the best score before round `index` (None: the baseline holds it;
    ties go to the baseline, then to the earlier round), whose evaluation a round is paired with."""
    best: R | None = None
    for r in sorted(scored(rounds), key=lambda r: r.index):
        assert r.score is not None
        if r.index < index and r.score > (baseline if best is None else (best.score or 0.0)):
            best = r
    return best


def is_real_gain(score: float, best_before: float, threshold: float) -> bool:
    return score - best_before > threshold


def scored(rounds: Sequence[R]) -> list[R]:
    return [r for r in rounds if r.status == "SCORED" and r.score is not None]


def best_round(rounds: Sequence[R]) -> R | None:
    """The round with the highest score; ties go to the earlier round. None before any score."""
    best: R | None = None
    for r in sorted(scored(rounds), key=lambda r: r.index):
        assert r.score is not None
        if best is None or r.score > (best.score or 0.0):
            best = r
    return best


def best_before(baseline: float, rounds: Sequence[ScoredRound], index: int) -> float:
    """The best score seen before round `index`: the baseline and every earlier scored round."""
    earlier = [r.score for r in scored(rounds) if r.index < index and r.score is not None]
    return max([baseline, *earlier])


def deltas(rounds: Sequence[ScoredRound]) -> dict[int, float]:
    """Round index -> its score minus the previous SCORED round's, in points (the first scored
    round has none)."""
    out: dict[int, float] = {}
    previous: float | None = None
    for r in sorted(scored(rounds), key=lambda r: r.index):
        assert r.score is not None
        if previous is not None:
            out[r.index] = round(r.score - previous, 6)
        previous = r.score
    return out


@dataclass(frozen=True)
class Verdict:
    """How a loop ends after its last scored round: a final LoopStatus name and why."""

    status: str  # "TARGET_REACHED", "ROUNDS_SPENT" or "PLATEAUED"
    message: str


def verdict(rounds: Sequence[ScoredRound], *, target: float, max_rounds: int, give_up_after: int) -> Verdict | None:
    """After a scored round: stop (TARGET_REACHED, then ROUNDS_SPENT, then PLATEAUED, the first
    that holds) or None to run the next round. `rounds` are all the loop's rounds so far, the
    last one scored."""
    ordered = sorted(rounds, key=lambda r: r.index)
    last = ordered[-1]
    assert last.status == "SCORED" and last.score is not None, "verdict after a scored round only"
    best = best_round(ordered)
    assert best is not None and best.score is not None
    best_text = f"best R{best.index} at {best.score:.1f}%"
    if last.score >= target:
        return Verdict("TARGET_REACHED", f"target {target:g}% reached in round {last.index} ({last.score:.1f}%)")
    if len(ordered) >= max_rounds:
        return Verdict("ROUNDS_SPENT",
                       f"all {max_rounds} round{'s' if max_rounds != 1 else ''} run; {best_text} (target {target:g}%)")
    tail = ordered[-give_up_after:]
    if len(tail) == give_up_after and not any(r.real_gain for r in tail):
        rounds_text = f"round {last.index}" if give_up_after == 1 else f"{give_up_after} rounds in a row"
        return Verdict("PLATEAUED", f"plateaued: no real gain in {rounds_text}; {best_text} (target {target:g}%)")
    return None


def round_seed(seed: int, index: int) -> int:
    """Round `index`'s training seed: the job spec's seed + index - 1, so rounds draw different
    prompts and samples and round 1 trains exactly as a plain job with that spec would."""
    return (seed + index - 1) % 2**64


def round_job_name(loop_name: str, index: int) -> str:
    """`<loop name> R<k>`: the round's training job as `rlvr jobs list` shows it (<= 128 chars)."""
    suffix = f" R{index}"
    return loop_name[: 128 - len(suffix)].rstrip() + suffix


def best_step(points: Sequence[tuple[int, float | None]], last: int, checkpoint_every: int) -> int:
    """LoopSpec.best_step: the step whose adapter a round is, from its job's (step, held-out accuracy)
    points: the highest held-out accuracy among the evaluated steps that have a checkpoint (every
    checkpoint_every-th) and the last (the final adapter), the later on a tie; `last` when none
    evaluated."""
    evaluated = [(accuracy, step) for step, accuracy in points if accuracy is not None
                 and (step == last or (checkpoint_every and step % checkpoint_every == 0))]
    return max(evaluated)[1] if evaluated else last
