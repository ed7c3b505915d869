"""How the trainer scores completions: a small `Scorer` interface with two implementations.

`ServiceScorer` calls the reward service (RewardService.Score), the deployment path of DESIGN.md;
`LocalScorer` calls the same pure scoring functions in-process (tests, single-process benchmarks,
and a worker configured without a reward service). Both keep the components apart: the GRPO
advantage uses `reward`, the metrics report `accuracy` and `format` separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from rlvr.common.client import make_channel
from rlvr.jobspec import REWARD_FUNCTIONS
from rlvr.v1 import reward_pb2, reward_pb2_grpc


@dataclass(frozen=True)
class Score:
    """One completion's score; reward = accuracy + format_bonus_weight * format (bonus on)."""

    reward: float
    accuracy: float
    format: float


@dataclass(frozen=True)
class ScoreSettings:
    function: str  # "math_pairs" | "gsm8k" | "boxed"
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
            r = self._score(s.function, completion, truth, s.format_bonus, s.format_bonus_weight)  # type: ignore[arg-type]
            out.append(Score(reward=r.reward, accuracy=r.accuracy, format=r.format))
        return out

    def close(self) -> None:
        pass


class ScoreError(RuntimeError):
    """The reward service failed; the message is one line with its status and details."""


class ServiceScorer:
    """Scores through RewardService.Score (one call per step; Score is idempotent and retried by
    the channel on UNAVAILABLE)."""

    def __init__(self, address: str, settings: ScoreSettings, timeout_s: float = 300.0) -> None:
        self.settings = settings
        self._channel = make_channel(address)
        self._stub = reward_pb2_grpc.RewardServiceStub(self._channel)
        self._timeout_s = timeout_s
        self.address = address

    def score(self, completions: Sequence[str], ground_truths: Sequence[str]) -> list[Score]:
        s = self.settings
        request = reward_pb2.ScoreRequest(
            function=REWARD_FUNCTIONS[s.function],
            items=[reward_pb2.ScoreItem(completion=c, ground_truth=t)
                   for c, t in zip(completions, ground_truths, strict=True)],
            format_bonus=s.format_bonus,
            format_bonus_weight=s.format_bonus_weight,
        )
        try:
            response = self._stub.Score(request, timeout=self._timeout_s)
        except grpc.RpcError as e:
            raise ScoreError(f"reward service at {self.address}: Score failed: {e.code().name}: {e.details()}") from None
        if len(response.results) != len(completions):
            raise ScoreError(f"reward service at {self.address} returned {len(response.results)} scores "
                             f"for {len(completions)} completions")
        return [Score(reward=r.reward, accuracy=r.accuracy, format=r.format) for r in response.results]

    def close(self) -> None:
        self._channel.close()
