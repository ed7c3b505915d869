"""gRPC glue of the reward service: a thin shell over the reward registry (rlvr/rewards/registry.py:
the built-ins and every plugin installed here), the remote rewards of its settings (remote.py), the
time-limited scoring pool (pool.py) and the tasks (rlvr/tasks).

Validation happens here, before any work; scoring runs in the pool's worker processes so a
pathological completion or a faulty plugin costs at most its time limit and never blocks the event
loop or brings the service down. A reward's faults score the completions 0 with a reason
(RewardComponents.error), logged once per distinct error (error_log.py), never an error of the call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

import grpc

from rlvr.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
    Violations,
    bounded,
    map_errors,
    out_of_range,
    shown,
)
from rlvr.heads import PREFIX as HEAD_PREFIX
from rlvr.jobspec import (
    MAX_DATASET_CHARS,
    MAX_SPLIT_CHARS,
    SYNTHETIC_PROMPTS,
    generates_prompts,
    reward_terms,
)
from rlvr.peers.types import catalog_proto, columns_of, problem_proto
from rlvr.rewards.registry import Catalog, RewardInfo, Sample, UnavailableReward, UnknownReward, load_registry
from rlvr.services.common.prometheus import Metrics
from rlvr.services.common.server import GrpcService
from rlvr.services.reward.error_log import ErrorLog
from rlvr.services.reward.heads import Heads
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import common_pb2, reward_pb2, reward_pb2_grpc

if TYPE_CHECKING:  # imported when first used
    from rlvr.rewards.combine import TermResult
    from rlvr.rewards.registry import Registry
    from rlvr.services.reward.pool import ScoringPool
    from rlvr.services.reward.remote import RemoteScorer

log = logging.getLogger("rlvr.reward")


@map_errors
class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, settings: RewardSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._items = self.metrics.counter("rlvr_reward_items_scored_total",
                                           "Completions scored (every reward of a request, once per item)")
        self._timeouts = self.metrics.counter("rlvr_reward_item_timeouts_total",
                                              "Completions whose reward ran past its per-item time limit (scored 0)")
        self._item_errors = self.metrics.counter("rlvr_reward_item_errors_total",
                                                 "Completions whose reward raised, hung or returned no number in 0-1")
        self._pool: ScoringPool | None = None
        self._registry: Registry | None = None
        self._remotes: dict[str, RemoteScorer] = {}
        self._static = self._catalog = Catalog({})
        self._heads = Heads(settings.head_roots)
        self._refreshing = threading.Lock()
        self._errors = ErrorLog(log)

    def start(self) -> None:
        import os

        from rlvr.services.reward.pool import ScoringPool
        from rlvr.services.reward.remote import RemoteScorer

        allowed = self.settings.allowed_plugins()
        registry = load_registry(allowed)  # logs each plugin that fails to load, once
        failed = dict(registry.failed)
        remotes = {}
        for key, remote in self.settings.remote_rewards.items():
            if key in registry.rewards:
                failed[key] = f"remote reward {key!r} at {remote.address}: the key is taken by {registry.rewards[key].source}"
                log.error("remote reward %r not offered: %s", key, failed[key])
                continue
            remotes[key] = RemoteScorer(key, remote)
        infos: dict[str, RewardInfo] = {i.key: i for i in registry.infos()}
        infos.update({key: r.info for key, r in sorted(remotes.items())})
        self._registry, self._remotes, self._static = registry, remotes, Catalog(infos, failed)
        self._refresh_heads()
        log.info("rewards: %s%s", ", ".join(f"{k} ({i.source})" for k, i in infos.items()),
                 "; not loaded: " + ", ".join(sorted(failed)) if failed else "")
        workers = self.settings.workers or max(1, min(4, os.cpu_count() or 1))
        self._pool = ScoringPool(workers=workers, allowed=allowed)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.close()

    # ------------------------------------------------------------------ which reward

    def _refresh_heads(self) -> Catalog:
        """The catalog with the Head jobs' adapters there now (services/reward/heads.py); a head never
        takes a key a reward of the registry or the settings has. One refresh at a time, so the
        catalog is always the newest scan's."""
        with self._refreshing:
            heads = {k: i for k, i in self._heads.scan().items() if k not in self._static.rewards}
            self._catalog = Catalog({**self._static.rewards, **heads}, self._static.failed)
            return self._catalog

    def _reward(self, key: str, field: str) -> RewardInfo:
        try:
            return self._catalog.get(key)
        except UnavailableReward as e:
            raise FailedPrecondition(f"{field}: {e}") from None
        except UnknownReward:
            raise InvalidArgument(f"{field}: {key!r} is not a reward of this service; known: "
                                  f"{', '.join(self._catalog.rewards)}") from None

    def _terms(self, request: reward_pb2.ScoreRequest) -> tuple[list[tuple[str, float]], str]:
        terms = [(t.key, t.weight) for t in reward_terms(request, prefix="")]
        for i, (key, _) in enumerate(terms):
            self._reward(key, f"terms[{i}].key" if request.terms else "key" if request.key else "function")
        accuracy = request.accuracy_key.strip() or terms[0][0]
        if accuracy not in dict(terms):
            raise InvalidArgument(f"accuracy_key: {shown(accuracy)} is not a key of the request's rewards "
                                  f"({', '.join(k for k, _ in terms)})")
        return terms, accuracy

    # ------------------------------------------------------------------ RPCs

    async def Score(self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext  # noqa: N802
                    ) -> reward_pb2.ScoreResponse:
        if self._pool is None:  # the port is open before start() has made the pool
            raise Unavailable("the reward service is starting; retry")
        if any(t.key.startswith(HEAD_PREFIX) and t.key not in self._catalog.rewards
               for t in reward_terms(request, prefix="")):
            await asyncio.to_thread(self._refresh_heads)  # a Head job has an adapter since the last look
        terms, accuracy = self._terms(request)
        if len(request.items) > self.settings.max_batch:
            raise out_of_range("items", f"{len(request.items)} items", f"at most {self.settings.max_batch} a call")
        weight = request.format_bonus_weight if request.HasField("format_bonus_weight") else 0.1
        if not 0.0 <= weight <= 1.0:
            raise out_of_range("format_bonus_weight", weight, "0.0-1.0 (default 0.1)")
        timeout = request.timeout_seconds if request.HasField("timeout_seconds") else self.settings.timeout_seconds
        if not 0.001 <= timeout <= 10:
            raise out_of_range("timeout_seconds", timeout, "0.001-10 (default 0.5)")
        bonus = request.format_bonus if request.HasField("format_bonus") else True
        t0 = time.perf_counter()
        if not request.items:  # a check that the rewards can score now (a remote one: reachable)
            await asyncio.gather(*(self._remotes[k].check() for k, _ in terms if k in self._remotes))
            return reward_pb2.ScoreResponse(seconds=time.perf_counter() - t0)
        samples: list[Sample] = []
        bad = Violations()
        for i, it in enumerate(request.items):
            with bad.check():  # every item's bad columns named at once
                samples.append(Sample(it.completion, it.ground_truth, it.prompt,
                                      tuple((m.role, m.content) for m in it.messages),
                                      columns_of(it.columns, f"items[{i}].columns")))
        bad.raise_any()
        results = await self._evaluate([k for k, _ in terms], samples, timeout)
        return self._response(terms, accuracy, samples, results, bonus, weight, time.perf_counter() - t0)

    async def _evaluate(self, keys: list[str], samples: list[Sample], timeout: float
                        ) -> dict[str, list[TermResult]]:
        assert self._pool is not None and self._registry is not None
        heads = [k for k in keys if k not in self._registry.rewards and k not in self._remotes]
        local = [(self._registry.get(k), list(enumerate(samples))) for k in keys
                 if k not in self._remotes and k not in heads]
        remote = [k for k in keys if k in self._remotes]
        pool = self._pool
        pooled, remote_results, head_results = await asyncio.gather(
            asyncio.to_thread(pool.evaluate, local, timeout),
            asyncio.gather(*(self._remotes[k].score(samples) for k in remote)),
            asyncio.gather(*(self._heads.score(k, samples) for k in heads)))
        results = {key: [by_index[i] for i in range(len(samples))] for key, by_index in pooled.items()}
        results.update(zip(remote, remote_results, strict=True))
        results.update(zip(heads, head_results, strict=True))
        return results

    def _response(self, terms: list[tuple[str, float]], accuracy: str, samples: list[Sample],
                  results: dict[str, list[TermResult]], bonus: bool, weight: float, seconds: float
                  ) -> reward_pb2.ScoreResponse:
        from rlvr.rewards.combine import combine

        scored = [combine(terms, {k: results[k][i] for k, _ in terms}, s.completion, bonus, weight, accuracy)
                  for i, s in enumerate(samples)]
        self._errors.note([r.error for r in scored if r.error], len(scored))
        self._items.inc(len(scored))
        self._timeouts.inc(sum(r.timed_out for r in scored))
        self._item_errors.inc(sum(bool(r.error) for r in scored))
        return reward_pb2.ScoreResponse(
            results=[common_pb2.RewardComponents(
                reward=r.reward, accuracy=r.accuracy, format=r.format, strict=r.strict,
                extracted_answer=r.extracted_answer or "", timed_out=r.timed_out, components=r.components,
                error=r.error, note=r.note) for r in scored],
            seconds=seconds,
        )

    async def GetProblems(self, request: reward_pb2.GetProblemsRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> reward_pb2.GetProblemsResponse:
        from rlvr.tasks import ignored_dataset_warning

        if self._registry is None:
            raise Unavailable("the reward service is starting; retry")
        key = reward_terms(request, prefix="")[0].key
        info = self._reward(key, "key" if request.key else "function")
        if request.split not in reward_pb2.ProblemSplit.values():
            raise out_of_range("split", request.split, ", ".join(f"{v} ({reward_pb2.ProblemSplit.Name(v)})"
                                                                 for v in reward_pb2.ProblemSplit.values()))
        bounded("dataset", request.dataset, MAX_DATASET_CHARS)
        bounded("dataset_split", request.dataset_split, MAX_SPLIT_CHARS)
        if request.limit < 0:
            raise out_of_range("limit", request.limit, ">= 0 (0 = all, or the task's default)")
        dataset = request.dataset.strip() if info.takes_dataset else ""
        heldout = request.split == reward_pb2.PROBLEM_SPLIT_HELDOUT
        if generates_prompts(info, dataset) and request.limit:
            # A reward that makes its training problems (as many as asked, within the spec's range)
            # has a fixed held-out pool: say which bound `limit` crossed, naming `limit`.
            low, high = (1, info.heldout_size) if heldout else (SYNTHETIC_PROMPTS.low, SYNTHETIC_PROMPTS.high)
            if not low <= request.limit <= high:
                what = "held-out problems" if heldout else "generated training problems"
                raise out_of_range("limit", request.limit, f"0 (the task's default) or {low}-{high} {what} "
                                                           f"for {info.display_name.split(' (')[0]}")
        if info.needs_dataset and not dataset:
            raise InvalidArgument(f"dataset: required for {info.display_name} (a Hugging Face dataset name or a local "
                                  "JSONL/Parquet/CSV file with prompt and ground_truth"
                                  + "".join(f", {c}" for c in info.columns) + " columns)")
        problems = await asyncio.to_thread(self._problems, info, dataset, request)
        warning = ignored_dataset_warning(key, request.dataset)
        return reward_pb2.GetProblemsResponse(problems=[problem_proto(p) for p in problems],
                                              warnings=[warning] if warning else [], instruction=info.instruction)

    def _problems(self, info: RewardInfo, dataset: str, request: reward_pb2.GetProblemsRequest) -> list:
        """The problems of the dataset split asked for: `dataset_split` (a reward's data with splits),
        by default "train" for the TRAIN split and, for HELDOUT, "test" (or a one-split dataset's
        only split, a single local file); a reward that generates its problems makes both itself.
        TRAIN comes in a seeded order, HELDOUT in the data's own order."""
        from rlvr.tasks import TaskError, heldout_split, task_of

        assert self._registry is not None
        heldout = request.split == reward_pb2.PROBLEM_SPLIT_HELDOUT
        reward = self._registry.rewards.get(info.key, info)  # a remote reward's prompts: its dataset's
        try:
            task = task_of(reward, dataset or None, self.settings.data_roots)
            if generates_prompts(info, dataset):
                split = "test" if heldout else "train"
            else:
                splits = task.splits()
                source = dataset or info.data_name or info.key
                split = request.dataset_split.strip() or (heldout_split(splits, source) if heldout else "train")
                if split not in splits:
                    raise InvalidArgument(f"dataset_split: {shown(split)} is not a split of {shown(source)}; it has: "
                                          f"{', '.join(splits)}")
            return task.prompts(n=request.limit or None, seed=request.seed, split=split, shuffle=not heldout)
        except TaskError as e:
            if not dataset:
                raise
            raise InvalidArgument(f"dataset: {e}") from None  # the data named by `dataset` cannot be read

    async def ListRewardFunctions(self, request, context):  # noqa: N802
        return catalog_proto(await asyncio.to_thread(self._refresh_heads))


def build_service(settings: RewardSettings) -> GrpcService:
    servicer = RewardServicer(settings)
    name = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name
    return GrpcService([(reward_pb2_grpc.add_RewardServiceServicer_to_server, servicer, name)],
                       on_start=servicer.start, on_stop=servicer.stop, metrics=servicer.metrics)
