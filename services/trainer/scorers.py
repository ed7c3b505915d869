"""How the trainer scores completions: a small `Scorer` interface with two implementations.

`ServiceScorer` calls the reward service (RewardService.Score), the deployment path of DESIGN.md;
`LocalScorer` calls the same pure scoring functions in-process (tests, single-process benchmarks,
and a worker configured without a reward service). Both keep the components apart: the GRPO
advantage uses `reward`, the metrics report `accuracy` and `format` separately. `Score` is the peer
type every caller of the reward service shares (`rlvr.peers.types`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rlvr.common.auth import ChannelAuth
from rlvr.jobspec import RewardName
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import RewardClient
from rlvr.peers.types import Score, score_request

__all__ = ["LocalScorer", "ScoreError", "ScoreSettings", "Scorer", "ServiceScorer"]


@dataclass(frozen=True)
class ScoreSettings:
    function: RewardName
    format_bonus: bool = True
    format_bonus_weight: float = 0.1


class Scorer(Protocol):
    def score(self, completions: Sequence[str], ground_truths: Sequence[str]) -> list[Score]:
        """Scores in input order; raises on a transport failure (the job then fails with the cause)."""
        ...

    def close(self) -> None: ...


class LocalScorer:
    """Scores in this process with rlvr.rewards.scoring (no time limit per completion: the
    scoring functions are linear in the input, see rlvr/rewards/answers.py)."""

    def __init__(self, settings: ScoreSettings) -> None:
        from rlvr.rewards.scoring import score  # the reward service's own pure functions

        self._score = score
        self.settings = settings

    def score(self, completions: Sequence[str], ground_truths: Sequence[str]) -> list[Score]:
        s = self.settings
        out = []
        for completion, truth in zip(completions, ground_truths, strict=True):
            r = self._score(s.function, completion, truth, s.format_bonus, s.format_bonus_weight)
            out.append(Score(reward=r.reward, accuracy=r.accuracy, format=r.format))
        return out

    def close(self) -> None:
        pass


class ScoreError(RuntimeError):
    """The reward service failed; the message is one line with its status and details."""


class ServiceScorer:
    """Scores through RewardService.Score over the typed sync client (one call per step; Score is
    idempotent and retried by the channel on UNAVAILABLE); a failed call is a `ScoreError`."""

    def __init__(self, address: str, settings: ScoreSettings, timeout_s: float = 300.0,
                 auth: ChannelAuth | None = None) -> None:
        self.settings = settings
        self.client = RewardClient(address, auth=auth)
        self._timeout_s = timeout_s
        self.address = address

    def score(self, completions: Sequence[str], ground_truths: Sequence[str]) -> list[Score]:
        s = self.settings
        request = score_request(s.function, zip(completions, ground_truths, strict=True),
                                format_bonus=s.format_bonus, format_bonus_weight=s.format_bonus_weight)
        try:
            response = self.client.score(request, timeout=self._timeout_s)
        except RlvrError as e:
            raise ScoreError(e.describe()) from None
        if len(response.results) != len(completions):
            raise ScoreError(f"reward service at {self.address} returned {len(response.results)} scores "
                             f"for {len(completions)} completions")
        # The components the trainer uses, as LocalScorer gives them.
        return [Score(reward=r.reward, accuracy=r.accuracy, format=r.format) for r in response.results]

    def close(self) -> None:
        self.client.close()
