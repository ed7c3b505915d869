"""The rollout and reward services as the evaluation core sees them (planning.Peers, runner's
Generator and Scorer), over the typed asyncio clients of rlvr.peers: every call has a deadline, the
idempotent ones (GetInfo, ListAdapters, GetProblems, Score) retry on UNAVAILABLE, and a failed call
is an `RlvrError` that `failure` translates, in one place:

- while a request is checked, a refusal keeps its meaning for our caller (a dataset the reward
  service refuses is INVALID_ARGUMENT, an unreachable peer UNAVAILABLE);
- while an evaluation runs, it becomes the evaluation's one-line cause, naming the service, its
  address and the call.

Several rollout replicas (the `rollout_addresses` setting) are one rollout service to the core,
by the rules of `rlvr.peers.replicas.Replicas` (the trainer's too): a batch's questions are split
into contiguous parts, one Generate call per replica at once (greedy, the default, answers the same
whatever the split; a part's seed is the batch's moved to its first question, `rlvr.seeds.offset_seed`,
so a seeded sample is the single server's on vLLM, which seeds each prompt from its index),
an uploaded adapter goes to every replica, and a replica that fails a part because it is down
(UNAVAILABLE, DEADLINE_EXCEEDED; it is then left out for RETRY_DOWN_S) or does not hold the adapter
version (NOT_FOUND) has that part answered by the others, with a warning. When no replica can
answer because every one is down (killed, restarting: vLLM takes tens of seconds to start), the
evaluation waits up to `rollout_wait_s` for one to serve again and generates that batch again (greedy
or seeded, the same answers); a reward service that goes away is waited for the same way
(`reward_wait_s`), as a training job waits for both. Only then does the evaluation fail, naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import grpc

from rlvr.adapters import ADAPTER_FILES
from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, RlvrServiceError, Unavailable
from rlvr.peers.base import RlvrError, check_health
from rlvr.peers.clients import AsyncRewardClient, AsyncRolloutClient, AsyncTrainerClient
from rlvr.peers.folders import fetch_folder
from rlvr.peers.replicas import Fate, NoReplicaLeft, Replicas
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
    token_prompt,
)
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.services.benchmark.catalog import RewardName
from rlvr.services.benchmark.episodes import TokenAnswer, TokenGenerator
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


def _describe(error: BaseException) -> str:
    if isinstance(error, NoReplicaLeft):
        return "; ".join(_describe(e) for _, e in error.failures)
    return error.describe() if isinstance(error, RlvrError) else str(error)


RETRY_DOWN_S = 30.0  # a replica found down is left out this long, then tried again
CATALOG_TTL_S = 10.0  # how long the reward service's list of rewards is kept
CATALOG_RECHECK_S = 1.0  # a name the list lacks asks again at most this often (a typo is no flood)
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def known_names(catalog: Catalog) -> set[str]:
    """Every reward key and benchmark name the catalog answers to."""
    return set(catalog.rewards) | {info.benchmark for info in catalog.infos()}


def _gone(error: BaseException) -> bool:
    """A peer that is not there (UNAVAILABLE, DEADLINE_EXCEEDED): worth waiting for."""
    if isinstance(error, NoReplicaLeft):
        return all(isinstance(e, RlvrError) and e.code in _GONE for _, e in error.failures)
    return isinstance(error, RlvrError) and error.code in _GONE


def fate(error: BaseException) -> Fate:
    """Down (left out a while, the others answer), lacking the adapter version (the others answer
    that part), or the call's own failure."""
    if isinstance(error, RlvrError) and error.code in _GONE:
        return "gone"
    if isinstance(error, RlvrError) and error.code == grpc.StatusCode.NOT_FOUND:
        return "refused"
    return "fatal"


class ServicePeers:
    """planning.Peers over gRPC; also the Generator and the Scorer of the runner. Create it inside
    the event loop that uses it (grpc.aio channels belong to one loop). `rollout_address`: one
    address, or several replicas of the rollout service (see the module doc)."""

    def __init__(self, rollout_address: str | Sequence[str], reward_address: str, *, generate_timeout_s: float = 600.0,
                 score_timeout_s: float = 300.0, upload_timeout_s: float = 300.0,
                 auth: ChannelAuth | None = None, trainer_addresses: Sequence[str] = (),
                 rollout_wait_s: float = 300.0, reward_wait_s: float = 300.0,
                 health: Callable[[str], Awaitable[str]] | None = None) -> None:
        addresses = [rollout_address] if isinstance(rollout_address, str) else list(rollout_address)
        self.rollout_addresses = addresses
        self.rollout_wait_s = rollout_wait_s
        self.reward_wait_s = reward_wait_s
        self.health = health or (lambda address: asyncio.to_thread(check_health, address, timeout=1.0))
        self.rollout_address = ", ".join(addresses)
        self.reward_address = reward_address
        self.generate_timeout_s = generate_timeout_s
        self.score_timeout_s = score_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.auth = auth
        self._replaced: list[AsyncRolloutClient | AsyncRewardClient] = []  # closed later, or with the others
        self._closing: set[asyncio.Task[None]] = set()
        self.replicas = Replicas([AsyncRolloutClient(a, auth=auth) for a in addresses], fate,
                                 retry_down_s=RETRY_DOWN_S)
        self.reward = AsyncRewardClient(reward_address, auth=auth)
        self.trainers = [AsyncTrainerClient(a, auth=auth) for a in trainer_addresses]
        self.generator: Generator = self  # planning.Peers declares these as the protocols
        self.scorer: Scorer = self
        self.token_generator: TokenGenerator = self
        self._catalog: tuple[float, Catalog, bool] | None = None  # when, what, unreached
        self.clock: Callable[[], float] = time.monotonic  # the catalog cache's (a test's own clock)

    async def close(self) -> None:
        for replica in self.replicas.all:
            await replica.handle.close()
        await self.reward.close()
        for trainer in self.trainers:
            await trainer.close()
        for task in list(self._closing):
            task.cancel()
        for client in self._replaced:
            await client.close()

    # ------------------------------------------------------------------ the replicas

    async def _on_each(self, call: Callable[[AsyncRolloutClient], Awaitable[_R]], what: str) -> list[tuple[str, _R]]:
        """`call` on every replica up, at once; (address, answer) of those that answered. One found
        down is left out while another answers; any other failure is raised, translated."""
        try:
            answered = await self.replicas.each(call, what)
        except NoReplicaLeft as e:
            first = e.failures[0][1]  # none answered: the first one down, as a single server's failure
            raise (failure(first, running=False) if isinstance(first, RlvrError) else first) from None
        except RlvrError as e:
            raise failure(e, running=False) from None
        return [(client.address, answer) for client, answer in answered]

    # ------------------------------------------------------------------ checks (planning.Peers)

    async def rollout_model(self) -> RolloutModel:
        infos = await self._on_each(lambda client: client.get_info(), "GetInfo")
        models = {info.model for _, info in infos}
        if len(models) > 1:
            served = ", ".join(f"{address} serves {info.model!r}" for address, info in infos)
            raise FailedPrecondition(f"the rollout replicas serve different models ({served}); give the benchmark "
                                     "replicas of one model")
        return RolloutModel(model=infos[0][1].model, max_model_len=min(info.max_model_len for _, info in infos),
                            address=", ".join(address for address, _ in infos))

    async def live_adapters(self) -> dict[str, int]:
        """Each adapter's newest live version on any replica (one that lags refuses its parts with
        NOT_FOUND, and the others answer them)."""
        live: dict[str, int] = {}
        for _, response in await self._on_each(lambda client: client.list_adapters(), "ListAdapters"):
            for a in response.adapters:
                live[a.name] = max(a.version, live.get(a.name, 0))
        return live

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        # The files are read in a worker thread, a chunk at a time: an adapter can be hundreds of
        # MB and the event loop serves calls meanwhile. Every replica up gets it.
        infos = await self._on_each(
            lambda client: client.load_adapter(name, version, directory, timeout=self.upload_timeout_s),
            f"uploading {name} v{version}")
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

    async def _waiting(self, call: Callable[[], Awaitable[_R]], service: str, addresses: Sequence[str],
                       wait_s: float) -> _R:
        """`call()`, made again once a peer of `service` at `addresses` serves again when it failed
        because every one was down; at most `wait_s` seconds of waiting in all. A peer whose health
        says SERVING while the call still fails UNAVAILABLE is asked once more on a fresh connection
        (the old one may be backing off its reconnects), then its failure is the call's: it is up,
        and what it answers is about something else (a remote reward behind the reward service)."""
        deadline = time.monotonic() + wait_s
        fresh = False  # the last call went out on a fresh connection to a peer that said SERVING
        while True:
            try:
                return await call()
            except Exception as e:
                if not _gone(e):
                    raise
                if fresh:  # up, and still answering UNAVAILABLE: that answer is the call's failure
                    raise EvaluationError(_describe(e)) from None
                cause = e
            where = ", ".join(addresses)
            if time.monotonic() >= deadline:
                waited = f" and did not come back within {wait_s:.0f} s" if wait_s else ""
                raise EvaluationError(f"the {service} service at {where} is down{waited}: {_describe(cause)}") from None
            started, warned = time.monotonic(), False
            while time.monotonic() < deadline:
                if "SERVING" in [await self.health(a) for a in addresses]:
                    break
                if not warned:
                    log.warning("the %s service at %s is down (%s); waiting up to %.0f s for it", service, where,
                                _describe(cause), deadline - time.monotonic())
                    warned = True
                await asyncio.sleep(1.0)
            else:
                continue  # the deadline passed: the next failure says so
            fresh = not warned  # it said SERVING at once: one more try, then its answer stands
            self._reconnect(service)
            if warned:
                log.warning("the %s service at %s serves again after %.0f s; calling it again", service, where,
                            time.monotonic() - started)

    def _reconnect(self, service: str) -> None:
        """Fresh clients, each with a connection of its own, for a service that came back: the old
        channel may still be backing off its reconnects (gRPC's backoff grows with the outage) and
        fail every call at once, the server up. The old ones are closed once no call can still be
        on them (a call's deadline later), or at `close`."""
        old: list[AsyncRolloutClient | AsyncRewardClient] = []
        if service == "reward":
            old.append(self.reward)
            self.reward = AsyncRewardClient(self.reward_address, auth=self.auth, own_connection=True)
        else:
            for replica in self.replicas.all:  # back: none is left out for having been down
                old.append(replica.handle)
                replica.handle = AsyncRolloutClient(replica.address, auth=self.auth, own_connection=True)
                replica.down_until = 0.0
        self._replaced.extend(old)
        after_s = max(self.generate_timeout_s, self.score_timeout_s)
        task = asyncio.get_running_loop().create_task(self._close_later(old, after_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_later(self, clients: Sequence[AsyncRolloutClient | AsyncRewardClient], after_s: float) -> None:
        await asyncio.sleep(after_s)
        for client in clients:
            if client in self._replaced:
                self._replaced.remove(client)
                await client.close()

    async def generate(self, questions: Sequence[Question], sampling: Sampling, adapter: AdapterTag) -> list[Answer]:
        return await self._waiting(lambda: self._generate_all(questions, sampling, adapter), "rollout",
                                   self.rollout_addresses, self.rollout_wait_s)

    async def _generate_all(self, questions: Sequence[Question], sampling: Sampling,
                            adapter: AdapterTag) -> list[Answer]:
        async def part(client: AsyncRolloutClient, indices: list[int]) -> list[Answer]:
            # A part is contiguous (Replicas.parts): seeded from where it starts, it samples what one
            # server would.
            return await self._generate(client, [questions[i] for i in indices], sampling.from_prompt(indices[0]),
                                        adapter)

        try:
            parts = await self.replicas.spread(len(questions), part, f"generating with {adapter}")
        except NoReplicaLeft as e:
            if _gone(e):
                raise  # every replica down: `generate` waits for one
            why = "; ".join(error.describe() if isinstance(error, RlvrError) else str(error) for _, error in e.failures)
            raise EvaluationError(f"no rollout replica could answer questions {questions[e.pending[0]].index}-"
                                  f"{questions[e.pending[-1]].index}: {why}") from None
        except RlvrError as e:
            if _gone(e):
                raise
            raise failure(e, running=True) from None
        return [answer for _, answers in parts for answer in answers]

    async def _generate(self, client: AsyncRolloutClient, questions: Sequence[Question], sampling: Sampling,
                        adapter: AdapterTag) -> list[Answer]:
        # An explicit version: the rollout service refuses rather than answer with another one.
        request = generate_request([chat_prompt(q.messages) for q in questions], sampling, adapter,
                                   request_id=f"benchmark-q{questions[0].index}")
        answers: list[Answer] = []
        async with client.generate(request, timeout=self.generate_timeout_s) as stream:
            async for response in stream:
                for c in response.completions:
                    if not 0 <= c.prompt_index < len(questions):
                        raise EvaluationError(f"rollout service at {client.address} answered prompt "
                                              f"{c.prompt_index} of {len(questions)}")
                    reason: FinishReason = "LENGTH" if c.finish_reason == common_pb2.FINISH_REASON_LENGTH else "STOP"
                    answers.append(Answer(questions[c.prompt_index].index, c.text, reason, AdapterTag.of(c)))
        return answers

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: Sampling, adapter: AdapterTag,
                              request_id: str) -> TokenAnswer:
        """One turn of an episode: one token-id prompt, n=1, on a replica in turn (concurrent
        episodes spread over the replicas); waited for as `generate` waits when every one is down."""
        return await self._waiting(lambda: self._generate_tokens(prompt_ids, sampling, adapter, request_id),
                                   "rollout", self.rollout_addresses, self.rollout_wait_s)

    async def _generate_tokens(self, prompt_ids: Sequence[int], sampling: Sampling, adapter: AdapterTag,
                               request_id: str) -> TokenAnswer:
        request = generate_request([token_prompt(list(prompt_ids))], replace(sampling, group_size=1), adapter,
                                   request_id=request_id)

        async def part(client: AsyncRolloutClient, _indices: list[int]) -> TokenAnswer:
            answers: list[TokenAnswer] = []
            async with client.generate(request, timeout=self.generate_timeout_s) as stream:
                async for response in stream:
                    for c in response.completions:
                        reason: FinishReason = "LENGTH" if c.finish_reason == common_pb2.FINISH_REASON_LENGTH \
                            else "STOP"
                        answers.append(TokenAnswer(list(c.token_ids), reason, AdapterTag.of(c),
                                                   list(c.logprobs) or None))
            if len(answers) != 1:
                raise EvaluationError(f"rollout service at {client.address} answered {request_id} with "
                                      f"{len(answers)} completions, expected 1")
            return answers[0]

        try:
            parts = await self.replicas.spread(1, part, f"generating with {adapter}")
        except NoReplicaLeft as e:
            if _gone(e):
                raise  # every replica down: `generate_tokens` waits for one
            why = "; ".join(error.describe() if isinstance(error, RlvrError) else str(error) for _, error in e.failures)
            raise EvaluationError(f"no rollout replica could answer {request_id}: {why}") from None
        except RlvrError as e:
            if _gone(e):
                raise
            raise failure(e, running=True) from None
        return parts[0][1]

    async def score(self, function: RewardName, items: Sequence[ScoreInput]) -> list[Score]:
        async def call() -> reward_pb2.ScoreResponse:
            return await self.reward.score(score_request(function, items), timeout=self.score_timeout_s)

        with translated(running=True):
            response = await self._waiting(call, "reward", [self.reward_address], self.reward_wait_s)
        return [Score.of(r) for r in response.results]

    async def rewards(self, names: Collection[str] = ()) -> Catalog:
        """The reward service's rewards (each makes a benchmark), cached a few seconds, and asked again
        when the cached list lacks one of `names`, a reward's key or benchmark (a Head job's head_<id>,
        completed since), at most every CATALOG_RECHECK_S; when it cannot be reached, this process's
        built-ins (ListBenchmarks still answers; a run fails on scoring)."""
        now = self.clock()
        if self._catalog is not None and now - self._catalog[0] < CATALOG_TTL_S:
            when, catalog, unreached = self._catalog
            if unreached or now - when < CATALOG_RECHECK_S or set(names) <= known_names(catalog):
                return catalog
        try:
            response = await self.reward.list_reward_functions(reward_pb2.ListRewardFunctionsRequest(), timeout=10.0)
        except RlvrError as e:
            log.warning("the reward service did not list its rewards: %s", e.describe())
            own = load_registry().catalog()
            catalog, unreached = Catalog({k: i for k, i in own.rewards.items() if i.source == "built-in"}), True
        else:
            catalog, unreached = catalog_of(response), False
        self._catalog = (now, catalog, unreached)  # either way, for the ttl: a burst of calls waits once
        return catalog
