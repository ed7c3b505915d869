"""How the trainer scores completions, and where its training problems come from: each a small
interface with two implementations, one through the reward service and one in this process.

`ServiceScorer` calls the reward service (RewardService.Score), the deployment path of docs/design.md;
`LocalScorer` scores with this process's reward registry (tests, single-process benchmarks, and a
worker configured without a reward service). Both keep the components apart: the GRPO advantage
uses `reward`, the metrics report `accuracy`, `format` and every reward's `components`. A reward
that faulted on a completion scored it 0 with `error` set (rlvr/rewards/combine.py).

`ServiceProblems` asks the reward service for the job's training problems (GetProblems), so a
reward installed only there (a plugin, a remote reward) trains like a built-in; `LocalProblems`
reads them with this process's registry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from rlvr.common.auth import ChannelAuth
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import RewardClient
from rlvr.peers.types import Score, ScoreInput, problem_of, score_request
from rlvr.tasks.base import Problem
from rlvr.v1 import reward_pb2

__all__ = ["LocalProblems", "LocalScorer", "ProblemSource", "ScoreError", "ScoreSettings", "Scorer",
           "ServiceProblems", "ServiceScorer"]

log = logging.getLogger("rlvr.trainer.scorers")


@dataclass(frozen=True)
class ScoreSettings:
    function: str  # the job's reward (a key)
    format_bonus: bool = True
    format_bonus_weight: float = 0.1
    terms: tuple[tuple[str, float], ...] = ()  # several rewards (key, weight); () = `function` alone
    accuracy_key: str = ""

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        return self.terms or ((self.function, 1.0),)


class Scorer(Protocol):
    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        """Scores in input order; raises on a transport failure (the job then fails with the cause)."""
        ...

    def close(self) -> None: ...


class LocalScorer:
    """Scores in this process with the reward registry (no time limit per completion: the built-in
    scoring functions are linear in the input, see rlvr/rewards/answers.py)."""

    def __init__(self, settings: ScoreSettings) -> None:
        from rlvr.rewards.registry import load_registry

        registry = load_registry()
        self._terms = [(registry.get(key), weight) for key, weight in settings.weights]
        self.settings = settings

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        from rlvr.rewards.combine import score_samples
        from rlvr.rewards.registry import Sample

        s = self.settings
        samples = [Sample(i.completion, i.ground_truth, i.prompt, i.messages, i.columns) for i in items]
        results = score_samples(self._terms, samples, s.format_bonus, s.format_bonus_weight, s.accuracy_key or None)
        return [Score.of(r) for r in results]

    def close(self) -> None:
        pass


class ScoreError(RuntimeError):
    """The reward service failed; the message is one line with its status and details."""


_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


class ServiceScorer:
    """Scores through RewardService.Score over the typed sync client (one call per step; Score is
    idempotent and retried by the channel on UNAVAILABLE). A reward service that stays unavailable
    (it, or a remote reward it forwards to, restarting) is waited for up to `wait_s`, `on_wait`
    told why, then the call is a `ScoreError` naming it, as the rollout server's absence is."""

    def __init__(self, address: str, settings: ScoreSettings, timeout_s: float = 300.0,
                 auth: ChannelAuth | None = None, wait_s: float = 300.0,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.client = RewardClient(address, auth=auth)
        self._timeout_s = timeout_s
        self._wait_s = wait_s
        self._on_wait = on_wait
        self.address = address

    def _request(self, items: Sequence[ScoreInput]) -> reward_pb2.ScoreRequest:
        s = self.settings
        return score_request(s.function, items, format_bonus=s.format_bonus, format_bonus_weight=s.format_bonus_weight,
                             terms=s.weights, accuracy_key=s.accuracy_key)

    def _call(self, request: reward_pb2.ScoreRequest) -> reward_pb2.ScoreResponse:
        deadline = 0.0  # set at the first failure: the wait counts from when it is found unavailable
        for attempt in range(1_000_000):
            try:
                return self.client.score(request, timeout=self._timeout_s)
            except RlvrError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE:
                    raise ScoreError(e.describe()) from None
                if attempt == 0:
                    deadline = time.monotonic() + self._wait_s
                if attempt == 0 and self._wait_s > 0:  # said at once: one call may have retried for a while
                    message = (f"waiting up to {self._wait_s:g} s for scoring: {e.describe()}")
                    log.warning("%s", message)
                    if self._on_wait is not None:
                        self._on_wait(message)
                if time.monotonic() >= deadline:
                    raise ScoreError(e.describe()) from None
                time.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)], max(0.0, deadline - time.monotonic())))
        raise AssertionError("unreachable")

    def check(self) -> None:
        """The job's rewards can score now (an empty Score: a remote reward is reachable), or ScoreError."""
        self._call(self._request([]))

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        response = self._call(self._request(items))
        if len(response.results) != len(items):
            raise ScoreError(f"reward service at {self.address} returned {len(response.results)} scores "
                             f"for {len(items)} completions")
        return [Score.of(r) for r in response.results]

    def close(self) -> None:
        self.client.close()


class ProblemSource(Protocol):
    def training(self, key: str, count: int | None, seed: int, dataset: str, split: str
                 ) -> tuple[list[Problem], str | None]:
        """The job's training problems (seeded order) and the instruction to render them with
        (None: the registry's for the reward)."""
        ...

    def heldout(self, key: str, count: int, dataset: str) -> list[Problem]:
        """The first `count` problems of the reward's held-out split (the benchmark's, in the data's
        own order): evaluation while training (heldout.py)."""
        ...


class LocalProblems:
    """Training problems read in this process (the reward must be in its registry)."""

    def __init__(self, data_roots: Sequence[object] = ()) -> None:
        self.data_roots = tuple(data_roots)

    def training(self, key: str, count: int | None, seed: int, dataset: str, split: str
                 ) -> tuple[list[Problem], str | None]:
        from rlvr.tasks import get_task

        task = get_task(key, dataset=dataset or None, data_roots=self.data_roots)  # type: ignore[arg-type]
        return task.prompts(count, seed=seed, split=split, shuffle=True), None

    def heldout(self, key: str, count: int, dataset: str) -> list[Problem]:
        from rlvr.tasks import get_task, heldout_split

        task = get_task(key, dataset=dataset or None, data_roots=self.data_roots)  # type: ignore[arg-type]
        return task.prompts(count, seed=0, split=heldout_split(task.splits(), dataset or key), shuffle=False)


class ServiceProblems:
    """Training problems from the reward service (GetProblems, the TRAIN split)."""

    def __init__(self, address: str, auth: ChannelAuth | None = None, timeout_s: float = 300.0) -> None:
        self.address = address
        self._auth = auth
        self._timeout_s = timeout_s

    def training(self, key: str, count: int | None, seed: int, dataset: str, split: str
                 ) -> tuple[list[Problem], str | None]:
        request = reward_pb2.GetProblemsRequest(key=key, split=reward_pb2.PROBLEM_SPLIT_TRAIN, limit=count or 0,
                                                seed=seed, dataset=dataset, dataset_split=split)
        with RewardClient(self.address, auth=self._auth) as client:
            try:
                response = client.get_problems(request, timeout=self._timeout_s)
            except RlvrError as e:
                if e.code == grpc.StatusCode.INVALID_ARGUMENT:  # the job's fields, as the service names them
                    raise ValueError(f"reward.{e.details}") from None
                raise ScoreError(e.describe()) from None
        return [problem_of(p, key) for p in response.problems], response.instruction

    def heldout(self, key: str, count: int, dataset: str) -> list[Problem]:
        request = reward_pb2.GetProblemsRequest(key=key, split=reward_pb2.PROBLEM_SPLIT_HELDOUT, limit=count,
                                                dataset=dataset)
        with RewardClient(self.address, auth=self._auth) as client:
            try:
                response = client.get_problems(request, timeout=self._timeout_s)
            except RlvrError as e:
                if e.code == grpc.StatusCode.INVALID_ARGUMENT:  # e.g. more than the held-out pool holds
                    raise ValueError(f"advanced.eval_size: {count} held-out problems of {key}: {e.details}") from None
                raise ScoreError(e.describe()) from None
        return [problem_of(p, key) for p in response.problems]
