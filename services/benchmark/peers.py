"""The rollout and reward services as the evaluation core sees them (planning.Peers, runner's
Generator and Scorer), over the typed asyncio clients of rlvr.peers: every call has a deadline, the
idempotent ones (GetInfo, ListAdapters, GetProblems, Score) retry on UNAVAILABLE, and a failed call
is an `RlvrError` that `failure` translates, in one place:

- while a request is checked, a refusal keeps its meaning for our caller (a dataset the reward
  service refuses is INVALID_ARGUMENT, an unreachable peer UNAVAILABLE);
- while an evaluation runs, it becomes the evaluation's one-line cause, naming the service, its
  address and the call.

Several rollout replicas (the `rollout_addresses` setting) are one rollout service to the core: a
batch's questions are split into contiguous parts, one Generate call per replica at once (greedy,
the default, answers the same whatever the split; a seeded sample is the single server's on vLLM,
which seeds each prompt alike), an uploaded adapter goes to every replica, and a replica that
fails a part because it is down (UNAVAILABLE; it is then left out for RETRY_DOWN_S) or does not
hold the adapter version (NOT_FOUND) has that part answered by the others, with a warning. Only
when no replica can answer does the evaluation fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from rlvr.adapters import ADAPTER_FILES
from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, RlvrServiceError, Unavailable
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncRewardClient, AsyncRolloutClient, AsyncTrainerClient
from rlvr.peers.folders import fetch_folder
from rlvr.peers.types import (
    AdapterTag,
    Sampling,
    Score,
    ScoreInput,
    catalog_of,
    chat_prompt,
    generate_request,
    problem_of,
    score_request,
)
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.services.benchmark.catalog import RewardName
from rlvr.services.benchmark.planning import RolloutModel
from rlvr.services.benchmark.runner import Answer, EvaluationError, FinishReason, Generator, Question, Scorer
from rlvr.tasks import Problem
from rlvr.v1 import common_pb2, reward_pb2

log = logging.getLogger("rlvr.benchmark")
_R = TypeVar("_R")

CODES: dict[grpc.StatusCode, type[RlvrServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def failure(e: RlvrError, *, running: bool) -> Exception:
    """A peer's failed call as our own error: the evaluation's cause while `running`, else (while a
    request is checked) the same kind of error for our caller."""
    if running:
        return EvaluationError(e.describe())
    details = e.details or e.code.name
    if e.code in CODES:
        return CODES[e.code](details)
    if e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"the {e.service} service at {e.address} is unreachable ({e.code.name}: {details})")
    return RuntimeError(f"the {e.service} service at {e.address}: {e.code.name}: {details}")


@contextmanager
def translated(*, running: bool = False) -> Iterator[None]:
    try:
        yield
    except RlvrError as e:
        raise failure(e, running=running) from None


@dataclass
class _Replica:
    address: str
    client: AsyncRolloutClient
    down_until: float = 0.0  # time.monotonic() until which it is left out


RETRY_DOWN_S = 30.0  # a replica found down is left out this long, then tried again
CATALOG_TTL_S = 10.0  # how long the reward service's list of rewards is kept
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ServicePeers:
    """planning.Peers over gRPC; also the Generator and the Scorer of the runner. Create it inside
    the event loop that uses it (grpc.aio channels belong to one loop). `rollout_address`: one
    address, or several replicas of the rollout service (see the module doc)."""

    def __init__(self, rollout_address: str | Sequence[str], reward_address: str, *, generate_timeout_s: float = 600.0,
                 score_timeout_s: float = 300.0, upload_timeout_s: float = 300.0,
                 auth: ChannelAuth | None = None, trainer_addresses: Sequence[str] = ()) -> None:
        addresses = [rollout_address] if isinstance(rollout_address, str) else list(rollout_address)
        self.rollout_address = ", ".join(addresses)
        self.reward_address = reward_address
        self.generate_timeout_s = generate_timeout_s
        self.score_timeout_s = score_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.replicas = [_Replica(a, AsyncRolloutClient(a, auth=auth)) for a in addresses]
        self.reward = AsyncRewardClient(reward_address, auth=auth)
        self.trainers = [AsyncTrainerClient(a, auth=auth) for a in trainer_addresses]
        self.generator: Generator = self  # planning.Peers declares these as the protocols
        self.scorer: Scorer = self
        self._catalog: tuple[float, Catalog] | None = None

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.client.close()
        await self.reward.close()
        for trainer in self.trainers:
            await trainer.close()

    # ------------------------------------------------------------------ the replicas

    def _up(self) -> list[_Replica]:
        """The replicas not left out (all of them again when every one is)."""
        now = time.monotonic()
        return [r for r in self.replicas if r.down_until <= now] or list(self.replicas)

    def _down(self, replica: _Replica, error: RlvrError) -> None:
        replica.down_until = time.monotonic() + RETRY_DOWN_S
        log.warning("the rollout replica at %s is down (%s); the others answer, it is tried again in %.0f s",
                    replica.address, error.describe(), RETRY_DOWN_S)

    async def _on_each(self, call: Callable[[AsyncRolloutClient], Awaitable[_R]]) -> list[tuple[_Replica, _R]]:
        """`call` on every replica up, at once; the answers of those that answered. One found down
        is left out while another answers; any other failure is raised, translated."""
        replicas = self._up()
        results = await asyncio.gather(*(call(r.client) for r in replicas), return_exceptions=True)
        answered = [(r, res) for r, res in zip(replicas, results, strict=True) if not isinstance(res, BaseException)]
        for replica, res in zip(replicas, results, strict=True):
            if not isinstance(res, BaseException):
                continue
            if not (isinstance(res, RlvrError) and res.code in _GONE and answered):
                raise failure(res, running=False) if isinstance(res, RlvrError) else res
            self._down(replica, res)
        return answered

    # ------------------------------------------------------------------ checks (planning.Peers)

    async def rollout_model(self) -> RolloutModel:
        infos = await self._on_each(lambda client: client.get_info())
        models = {info.model for _, info in infos}
        if len(models) > 1:
            served = ", ".join(f"{r.address} serves {info.model!r}" for r, info in infos)
            raise FailedPrecondition(f"the rollout replicas serve different models ({served}); give the benchmark "
                                     "replicas of one model")
        return RolloutModel(model=infos[0][1].model, max_model_len=min(info.max_model_len for _, info in infos),
                            address=", ".join(r.address for r, _ in infos))

    async def live_adapters(self) -> dict[str, int]:
        """Each adapter's newest live version on any replica (one that lags refuses its parts with
        NOT_FOUND, and the others answer them)."""
        live: dict[str, int] = {}
        for _, response in await self._on_each(lambda client: client.list_adapters()):
            for a in response.adapters:
                live[a.name] = max(a.version, live.get(a.name, 0))
        return live

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        # The files are read in a worker thread, a chunk at a time: an adapter can be hundreds of
        # MB and the event loop serves calls meanwhile. Every replica up gets it.
        infos = await self._on_each(
            lambda client: client.load_adapter(name, version, directory, timeout=self.upload_timeout_s))
        return min(info.version for _, info in infos)

    async def fetch_adapter(self, path: str, directory: Path) -> str | None:
        # Each trainer in turn: a path outside one's artifact root (INVALID_ARGUMENT), not there
        # (NOT_FOUND) or a worker down is the next one's to send.
        for trainer in self.trainers:
            try:
                await fetch_folder(trainer, path, directory, ADAPTER_FILES)
            except RlvrError as e:
                log.info("adapter_path %s: not from trainer %s (%s)", path, trainer.address, e.code.name)
                continue
            except ValueError as e:  # a file whose digest did not match, twice over
                log.warning("adapter_path %s from trainer %s: %s", path, trainer.address, e)
                continue
            return trainer.address
        return None

    async def problems(self, function: RewardName, limit: int, dataset: str, split: str) -> list[Problem]:
        request = reward_pb2.GetProblemsRequest(key=function, split=reward_pb2.PROBLEM_SPLIT_HELDOUT,
                                                limit=limit, dataset=dataset, dataset_split=split)
        with translated():
            response = await self.reward.get_problems(request)
        return [problem_of(p, function) for p in response.problems]

    # ------------------------------------------------------------------ the run (Generator, Scorer)

    async def generate(self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag) -> list[Answer]:
        pending, answers = list(questions), []
        cannot: dict[str, RlvrError] = {}  # replicas that could not answer this batch, and why
        while pending:
            replicas = [r for r in self._up() if r.address not in cannot]
            if not replicas:
                why = "; ".join(e.describe() for e in cannot.values())
                raise EvaluationError(f"no rollout replica could answer questions {pending[0].index}-"
                                      f"{pending[-1].index}: {why}")
            k = min(len(replicas), len(pending))
            bounds = [round(j * len(pending) / k) for j in range(k + 1)]
            parts = [pending[bounds[j]:bounds[j + 1]] for j in range(k)]
            results = await asyncio.gather(*(self._generate(r, part, sampling, adapter)
                                             for r, part in zip(replicas, parts, strict=False)), return_exceptions=True)
            pending = []
            for replica, part, result in zip(replicas, parts, results, strict=False):
                if not isinstance(result, BaseException):
                    answers += result
                    continue
                if not (isinstance(result, RlvrError) and len(self.replicas) > 1
                        and result.code in (*_GONE, grpc.StatusCode.NOT_FOUND)):
                    raise failure(result, running=True) if isinstance(result, RlvrError) else result
                cannot[replica.address] = result
                if result.code in _GONE:
                    self._down(replica, result)
                else:
                    log.warning("the rollout replica at %s cannot answer with %s (%s); the others answer",
                                replica.address, adapter, result.describe())
                pending += part
            pending.sort(key=lambda q: q.index)
        return answers

    async def _generate(self, replica: _Replica, questions: Sequence[Question], sampling: Sampling,
                        adapter: AdapterTag) -> list[Answer]:
        # An explicit version: the rollout service refuses rather than answer with another one.
        request = generate_request([chat_prompt(q.messages) for q in questions], sampling, adapter,
                                   request_id=f"benchmark-q{questions[0].index}")
        answers: list[Answer] = []
        async with replica.client.generate(request, timeout=self.generate_timeout_s) as stream:
            async for response in stream:
                for c in response.completions:
                    if not 0 <= c.prompt_index < len(questions):
                        raise EvaluationError(f"rollout service at {replica.address} answered prompt "
                                              f"{c.prompt_index} of {len(questions)}")
                    reason: FinishReason = "LENGTH" if c.finish_reason == common_pb2.FINISH_REASON_LENGTH else "STOP"
                    answers.append(Answer(questions[c.prompt_index].index, c.text, reason, AdapterTag.of(c)))
        return answers

    async def score(self, function: RewardName, items: Sequence[ScoreInput]) -> list[Score]:
        with translated(running=True):
            response = await self.reward.score(score_request(function, items), timeout=self.score_timeout_s)
        return [Score.of(r) for r in response.results]

    async def rewards(self) -> Catalog:
        """The reward service's rewards (each makes a benchmark), cached a few seconds; when it cannot
        be reached, this process's built-ins (ListBenchmarks still answers; a run fails on scoring)."""
        now = time.monotonic()
        if self._catalog is not None and now - self._catalog[0] < CATALOG_TTL_S:
            return self._catalog[1]
        try:
            response = await self.reward.list_reward_functions(reward_pb2.ListRewardFunctionsRequest(), timeout=10.0)
        except RlvrError as e:
            log.warning("the reward service did not list its rewards: %s", e.describe())
            own = load_registry().catalog()
            catalog = Catalog({k: i for k, i in own.rewards.items() if i.source == "built-in"})
        else:
            catalog = catalog_of(response)
        self._catalog = (now, catalog)  # either way, for the ttl: a burst of calls waits once
        return catalog
