"""The rules over several rollout replicas (rlvr/peers/replicas.py), which the trainer's
ReplicatedGenerator (sync, threads) and the benchmark's ServicePeers (asyncio) both run: each
scenario is driven through both drivers and must make the same calls and give the same answer, so
the two callers cannot drift apart. The replicas are scripted handles (the rules do no I/O); the
real servers are tests/test_rollout_replicas.py's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from rlvr.peers.base import RlvrError
from rlvr.peers.replicas import Fate, NoReplicaLeft, Replicas, split_bounds


class Gone(Exception):
    pass


class Refused(Exception):
    pass


def fate(error: BaseException) -> Fate:
    return "gone" if isinstance(error, Gone) else "refused" if isinstance(error, Refused) else "fatal"


@dataclass
class Script:
    """A replica: `fails[k]` is what its k-th call raises (missing: it answers)."""

    address: str
    fails: dict[int, Exception] = field(default_factory=dict)
    calls: list[tuple[int, ...]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, indices: list[int] | None) -> tuple[str, tuple[int, ...]]:
        with self.lock:
            k = len(self.calls)
            self.calls.append(tuple(indices or ()))
        if k in self.fails:
            raise self.fails[k]
        return self.address, tuple(indices or ())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def both_ways(scenario: Callable[[Callable[..., Any], Callable[..., Any]], Any]) -> Any:
    """Runs `scenario(spread, each)` once with the sync driver, once with the asyncio one, on fresh
    but identical replicas; returns what both gave (checked equal, with the calls each replica got)."""
    outcomes = []
    for flavour in ("sync", "async"):
        with ThreadPoolExecutor(4) as pool:
            outcomes.append(scenario(*_drivers(flavour, pool)))
    assert outcomes[0] == outcomes[1], "the sync and the asyncio driver disagree"
    return outcomes[0]


def _drivers(flavour: str, pool: ThreadPoolExecutor) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`spread(replicas, count)` and `each(replicas)` through the sync or the asyncio driver."""
    def spread(replicas: Replicas[Script], count: int, what: str = "generating") -> Any:
        if flavour == "sync":
            return replicas.spread_sync(count, lambda h, idx: h.answer(idx), what, pool)

        async def call(h: Script, idx: list[int]) -> Any:
            await asyncio.sleep(0)
            return h.answer(idx)
        return asyncio.run(replicas.spread(count, call, what))

    def each(replicas: Replicas[Script], what: str = "pushing") -> Any:
        if flavour == "sync":
            return replicas.each_sync(lambda h: h.answer(None), what, pool)

        async def call(h: Script) -> Any:
            return h.answer(None)
        return asyncio.run(replicas.each(call, what))

    return spread, each


def _failure(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        run()
    except Exception as e:  # noqa: BLE001 (compared by kind and message)
        return type(e).__name__, str(e)
    raise AssertionError("no failure")


def test_split_bounds_are_contiguous_and_even() -> None:
    assert split_bounds(5, 2) == [0, 2, 5]
    assert split_bounds(4, 4) == [0, 1, 2, 3, 4]
    assert split_bounds(7, 3) == [0, 2, 5, 7]


def test_parts_are_contiguous_and_the_first_turns_from_call_to_call() -> None:
    def scenario(spread: Callable[..., Any], _each: Callable[..., Any]) -> Any:
        a, b, c = Script("a"), Script("b"), Script("c")
        replicas = Replicas([a, b, c], fate)
        first = spread(replicas, 7)
        second = spread(replicas, 2)  # fewer items than replicas: the turn spreads the load
        third = spread(replicas, 1)
        return first, second, third, a.calls, b.calls, c.calls

    first, second, third, a, b, c = both_ways(scenario)
    assert first == [([0, 1], ("a", (0, 1))), ([2, 3, 4], ("b", (2, 3, 4))), ([5, 6], ("c", (5, 6)))]
    assert [r[0] for _, r in second] == ["b", "c"] and [r[0] for _, r in third] == ["c"]
    assert (a, b, c) == ([(0, 1)], [(2, 3, 4), (0,)], [(5, 6), (1,), (0,)])


def test_a_gone_replica_is_dropped_and_its_part_answered_by_the_others() -> None:
    def scenario(spread: Callable[..., Any], each: Callable[..., Any]) -> Any:
        told: list[str] = []
        a, b, c = Script("a", {0: Gone("UNAVAILABLE")}), Script("b"), Script("c", {0: Gone("down")})
        replicas = Replicas([a, b, c], fate, notify=told.append)  # retry_down_s None: dropped for good
        parts = spread(replicas, 6, "generating at step 3")
        # a's (0, 1) and c's (4, 5) went to b, the one left, as two parts (a part is a run of
        # consecutive items, seeded from its first): put back by index
        later = spread(replicas, 2)
        pushed = [h.address for h, _ in each(replicas)]
        b_calls = [*b.calls[:1], *sorted(b.calls[1:3]), *b.calls[3:]]  # the two parts of a round run at once
        return parts, later, a.calls, b_calls, c.calls, told, replicas.dropped, pushed

    parts, later, a, b, c, told, dropped, pushed = both_ways(scenario)
    assert parts == [([0, 1], ("b", (0, 1))), ([2, 3], ("b", (2, 3))), ([4, 5], ("b", (4, 5)))]
    assert later == [([0, 1], ("b", (0, 1)))] and pushed == ["b"]  # a dropped replica is not taken back
    assert (a, c) == ([(0, 1)], [(4, 5)]) and b == [(2, 3), (0, 1), (4, 5), (0, 1), ()]
    assert dropped == ["a (generating at step 3: UNAVAILABLE)", "c (generating at step 3: down)"]
    assert told == ["dropped the rollout replica at a (generating at step 3 failed: UNAVAILABLE); going on with 2 "
                    "of 3: b, c", "dropped the rollout replica at c (generating at step 3 failed: down); going on "
                    "with 1 of 3: b"]


def test_a_replica_left_out_a_while_is_tried_again_after() -> None:
    clock = Clock()

    def scenario(spread: Callable[..., Any], _each: Callable[..., Any]) -> Any:
        clock.now = 100.0
        a, b = Script("a", {0: Gone("down")}), Script("b")
        replicas = Replicas([a, b], fate, retry_down_s=30.0, clock=clock)
        first = spread(replicas, 4)
        clock.now += 10
        meanwhile = spread(replicas, 4)
        clock.now += 25
        after = spread(replicas, 4)
        return first, meanwhile, after, replicas.dropped, replicas.all[0].down_until

    first, meanwhile, after, dropped, down_until = both_ways(scenario)
    assert first == [([0, 1], ("b", (0, 1))), ([2, 3], ("b", (2, 3)))] and meanwhile == [([0, 1, 2, 3], ("b", (0, 1, 2, 3)))]
    assert {r[0] for _, r in after} == {"a", "b"} and dropped == [] and down_until == 130.0


def test_a_refusal_sends_the_part_elsewhere_and_the_replica_stays_up() -> None:
    def scenario(spread: Callable[..., Any], _each: Callable[..., Any]) -> Any:
        a, b = Script("a", {0: Refused("NOT_FOUND: x v2 is not live")}), Script("b")
        replicas = Replicas([a, b], fate, retry_down_s=30.0)
        return spread(replicas, 4), spread(replicas, 4), replicas.all[0].down_until

    first, second, down_until = both_ways(scenario)
    assert first == [([0, 1], ("b", (0, 1))), ([2, 3], ("b", (2, 3)))]
    assert {r[0] for _, r in second} == {"a", "b"} and down_until == 0.0


def test_a_fatal_failure_is_raised_once_every_part_ended() -> None:
    def scenario(spread: Callable[..., Any], _each: Callable[..., Any]) -> Any:
        a, b = Script("a", {0: ValueError("stale policy")}), Script("b", {0: Gone("down")})
        replicas = Replicas([a, b], fate)
        failed = _failure(lambda: spread(replicas, 4))
        return failed, a.calls, b.calls, replicas.dropped

    failed, a, b, dropped = both_ways(scenario)
    assert failed == ("ValueError", "stale policy") and (a, b) == ([(0, 1)], [(2, 3)])
    assert dropped == ["b (generating: down)"]  # the gone one is still dropped


def test_no_replica_left_names_every_failure_and_what_was_pending() -> None:
    def scenario(spread: Callable[..., Any], each: Callable[..., Any]) -> Any:
        told: list[str] = []
        a, b = Script("a", {0: Gone("a down")}), Script("b", {0: Refused("b lacks it")})
        replicas = Replicas([a, b], fate, retry_down_s=30.0, notify=told.append)
        try:
            spread(replicas, 3)
        except NoReplicaLeft as e:
            spread_failure = ([(address, str(error)) for address, error in e.failures], e.pending)
        gone = Replicas([Script("c", {0: Gone("c down")}), Script("d", {0: Gone("d down")})], fate)
        try:
            each(gone)
        except NoReplicaLeft as e:
            each_failure = ([(address, str(error)) for address, error in e.failures], e.dropped)
        return spread_failure, each_failure, told

    spread_failure, each_failure, told = both_ways(scenario)
    assert spread_failure == ([("a", "a down"), ("b", "b lacks it")], [0, 1, 2])
    assert each_failure == ([("c", "c down"), ("d", "d down")], ["c (pushing: c down)", "d (pushing: d down)"])
    assert len(told) == 1  # the last one going is the failure, not a notice


def test_one_replica_is_one_server_every_failure_its_own() -> None:
    def scenario(spread: Callable[..., Any], each: Callable[..., Any]) -> Any:
        replicas = Replicas([Script("a", {0: Gone("down"), 1: Gone("down")})], fate)
        return _failure(lambda: spread(replicas, 2)), _failure(lambda: each(replicas)), replicas.dropped

    assert both_ways(scenario) == (("Gone", "down"), ("Gone", "down"), [])


def test_the_trainer_and_the_benchmark_sort_failures_as_they_did_and_share_the_rules() -> None:
    from rlvr.services.benchmark import peers
    from rlvr.services.trainer.job import replicas
    from rlvr.services.trainer.job.rollouts import RolloutError, RolloutGone

    def error(code: grpc.StatusCode) -> RlvrError:
        return RlvrError(code, "x", "rlvr.v1.RolloutService/Generate", "h:1")

    # The trainer: a replica not there is dropped; a stale or missing version fails the job (each
    # replica first brings back its own adapter, rollouts.ServiceGenerator).
    assert replicas.fate(RolloutGone("gone", "h:1")) == "gone"
    assert replicas.fate(RolloutError(error(grpc.StatusCode.UNAVAILABLE))) == "gone"
    assert replicas.fate(RolloutError(error(grpc.StatusCode.NOT_FOUND))) == "fatal"
    assert replicas.fate(RolloutError(error(grpc.StatusCode.DEADLINE_EXCEEDED))) == "fatal"
    # The benchmark: down or too slow is left out a while, a missing version answered by the others.
    assert peers.fate(error(grpc.StatusCode.UNAVAILABLE)) == peers.fate(error(grpc.StatusCode.DEADLINE_EXCEEDED)) == "gone"
    assert peers.fate(error(grpc.StatusCode.NOT_FOUND)) == "refused"
    assert peers.fate(error(grpc.StatusCode.INVALID_ARGUMENT)) == "fatal"
    assert peers.RETRY_DOWN_S == 30.0

    generator = replicas.ReplicatedGenerator(["127.0.0.1:9", "127.0.0.1:10"])
    try:
        assert isinstance(generator.set, Replicas) and generator.set.retry_down_s is None
    finally:
        generator.close()

    async def benchmark() -> None:
        service = peers.ServicePeers(["127.0.0.1:9", "127.0.0.1:10"], "127.0.0.1:11")
        try:
            assert isinstance(service.replicas, Replicas) and service.replicas.retry_down_s == peers.RETRY_DOWN_S
        finally:
            await service.close()

    asyncio.run(benchmark())


def test_distinct_addresses_only() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Replicas([Script("a"), Script("a")], fate)
