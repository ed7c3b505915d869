"""Several rollout replicas as one rollout service: the rules, once, for the trainer and the benchmark.

`Replicas` holds the replicas of one base model (any handle with an `address`: the trainer's
`ServiceGenerator`, the benchmark's `AsyncRolloutClient`) and decides, without doing any I/O:

- which replicas are up (`usable`): a replica that failed because it is not there is left out,
  for `retry_down_s` seconds (the benchmark: 30 s, then tried again) or for good (`None`: the
  trainer's job drops it); when every replica is left out for a while, all are tried again;
- how a call's items are split (`parts`): contiguous parts as even as possible, one per replica
  up (fewer when there are fewer items), the first part to the replica whose turn it is; the turn
  moves on with every call, so calls with fewer items than replicas still spread the load. A part
  is always a run of consecutive items (items going again after a failure may be several runs:
  one part each), so a caller seeds it from its first item and it samples what one server would;
- what a failed part means (`fate`, the caller's): "gone" (the replica is not there: left out,
  announced), "refused" (it cannot answer this call, e.g. it lacks the adapter version: the others
  answer, it stays up) or "fatal" (the call's failure, raised once every part has ended). With a
  single replica every failure is the call's own: one server behaves as one server;
- when a part failed "gone" or "refused", it goes again, split across the replicas that remain,
  until every item is answered or no replica can answer: `NoReplicaLeft`, with every failure.

The rules run as generators that yield the calls to make and are sent their outcomes (a result,
or the exception it raised), so the sync driver (`spread_sync`, `each_sync`: a thread pool) and
the asyncio one (`spread`, `each`: gather) share every decision and differ only in how the calls
run at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

log = logging.getLogger("rlvr.peers.replicas")

Fate = Literal["gone", "refused", "fatal"]
_A = TypeVar("_A")
_R = TypeVar("_R")

__all__ = ["Fate", "NoReplicaLeft", "Replica", "Replicas", "split_bounds"]


class _Addressed(Protocol):
    @property
    def address(self) -> str: ...


H = TypeVar("H", bound=_Addressed)


@dataclass(eq=False)
class Replica(Generic[H]):
    handle: H
    down_until: float = 0.0  # the clock's time until which it is left out (inf: for good)

    @property
    def address(self) -> str:
        return self.handle.address


class NoReplicaLeft(RuntimeError):
    """No replica can answer (what is still pending): `failures`, (address, error) of this call in
    the order they came; `dropped`, every replica left out for good, "ADDRESS (what: why)"."""

    def __init__(self, failures: Sequence[tuple[str, BaseException]], dropped: Sequence[str], pending: Sequence[int]):
        self.failures = list(failures)
        self.dropped = list(dropped)
        self.pending = list(pending)
        super().__init__("no rollout replica can answer: " + "; ".join(f"{a}: {e}" for a, e in self.failures))


def split_bounds(count: int, parts: int) -> list[int]:
    """The bounds of `count` items in `parts` contiguous parts as even as possible."""
    return [round(j * count / parts) for j in range(parts + 1)]


def _runs(indices: Sequence[int]) -> list[list[int]]:
    """Ascending `indices` cut into runs of consecutive items."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


Plan = Generator[list[tuple[Replica[H], _A]], list[Any], _R]


class Replicas(Generic[H]):
    """The replicas of one rollout service and the rules over them (see the module doc).

    `fate(error)` sorts a failed call; `retry_down_s` is how long a gone replica is left out (None:
    for good); `notify(message)` hears each replica left out while others remain (the trainer's job
    status), beside the warning logged."""

    def __init__(self, handles: Sequence[H], fate: Callable[[BaseException], Fate], *,
                 retry_down_s: float | None = None, notify: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        addresses = [h.address for h in handles]
        if not addresses or len(set(addresses)) != len(addresses):
            raise ValueError(f"rollout replicas: want distinct addresses, got {addresses}")
        self.all = [Replica(h) for h in handles]
        self.fate = fate
        self.retry_down_s = retry_down_s
        self.notify = notify or (lambda _message: None)
        self.clock = clock
        self.dropped: list[str] = []  # "ADDRESS (what: why)" of those left out for good, in order
        self._turn = 0

    # ------------------------------------------------------------------------------ the state

    def usable(self) -> list[Replica[H]]:
        """The replicas up; when all are left out for a while only, all of them (tried again)."""
        now = self.clock()
        up = [r for r in self.all if r.down_until <= now]
        return up or [r for r in self.all if math.isfinite(r.down_until)]

    @property
    def address(self) -> str:
        return ", ".join(r.address for r in self.usable())

    def leave_out(self, replica: Replica[H], cause: BaseException | str, what: str) -> None:
        """`replica` failed `what` for its absence: left out (for good or a while), said unless it was
        the last one up (then the call fails naming them all instead)."""
        if replica.down_until > self.clock():
            return
        forever = self.retry_down_s is None
        replica.down_until = math.inf if forever else self.clock() + (self.retry_down_s or 0.0)
        if forever:
            self.dropped.append(f"{replica.address} ({what}: {cause})")
        left = [r for r in self.all if r.down_until <= self.clock()]
        if not left:
            return
        how = "dropped" if forever else f"left out for {self.retry_down_s:.0f} s"
        message = (f"{how} the rollout replica at {replica.address} ({what} failed: {cause}); "
                   f"going on with {len(left)} of {len(self.all)}: {', '.join(r.address for r in left)}")
        log.warning(message)
        self.notify(message)

    def parts(self, indices: Sequence[int], replicas: Sequence[Replica[H]], turn: int) -> list[tuple[Replica[H], list[int]]]:
        """`indices` (ascending) in parts as even as possible, one share per replica (fewer when
        there are fewer items), the first to the replica whose turn it is. A part is always a run of
        consecutive items, so a caller can seed it from its first (rlvr/seeds.py): a share that spans
        a gap (items answered already, when parts go again after a failure) is one part per run."""
        k = min(len(replicas), len(indices))
        bounds = split_bounds(len(indices), k)
        parts: list[tuple[Replica[H], list[int]]] = []
        for j in range(k):
            replica = replicas[(turn + j) % len(replicas)]
            for run in _runs(indices[bounds[j]:bounds[j + 1]]):
                parts.append((replica, run))
        return parts

    def _sort(self, error: BaseException) -> Fate:
        return self.fate(error) if len(self.all) > 1 else "fatal"

    # ------------------------------------------------------------------------------ the rules

    def spread_plan(self, count: int, what: str) -> Plan[H, list[int], list[tuple[list[int], Any]]]:
        """Items 0..count-1 split across the replicas up; yields the parts to call, is sent their
        outcomes; returns each part answered as (its indices, its result), by first index (a part
        answered again after a failure need not be contiguous with the others)."""
        done: list[tuple[list[int], Any]] = []
        pending = list(range(count))
        cannot: dict[str, BaseException] = {}  # replicas that could not answer this call, and why
        turn = self._turn
        self._turn += 1
        while pending:
            replicas = [r for r in self.usable() if r.address not in cannot]
            if not replicas:
                raise NoReplicaLeft(list(cannot.items()), self.dropped, pending)
            parts = self.parts(pending, replicas, turn)
            outcomes = yield parts
            pending, fatal = [], None
            for (replica, indices), outcome in zip(parts, outcomes, strict=True):
                if not isinstance(outcome, BaseException):
                    done.append((indices, outcome))
                    continue
                fate = self._sort(outcome)
                if fate == "fatal":
                    fatal = fatal or outcome
                    continue
                cannot[replica.address] = outcome
                if fate == "gone":
                    self.leave_out(replica, outcome, what)
                else:
                    log.warning("the rollout replica at %s cannot answer (%s failed: %s); the others answer",
                                replica.address, what, outcome)
                pending += indices
            if fatal is not None:
                raise fatal
            pending.sort()
        return sorted(done, key=lambda part: part[0][0])

    def each_plan(self, what: str) -> Plan[H, None, list[tuple[H, Any]]]:
        """One call on every replica up; returns (handle, result) of those that answered. A gone one
        is left out; any other failure is raised (once all ended), and none answering is
        `NoReplicaLeft`."""
        replicas = self.usable()
        outcomes = yield [(r, None) for r in replicas]
        answered: list[tuple[H, Any]] = []
        failures: list[tuple[str, BaseException]] = []
        fatal: BaseException | None = None
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                answered.append((replica.handle, outcome))
            elif self._sort(outcome) == "gone":
                failures.append((replica.address, outcome))
                self.leave_out(replica, outcome, what)
            else:
                fatal = fatal or outcome
        if fatal is not None:
            raise fatal
        if not answered:
            raise NoReplicaLeft(failures, self.dropped, [])
        return answered

    # ------------------------------------------------------------------------------ the drivers

    def spread_sync(self, count: int, call: Callable[[H, list[int]], _R], what: str,
                    pool: Executor) -> list[tuple[list[int], _R]]:
        return _drive_sync(self.spread_plan(count, what), call, pool)

    async def spread(self, count: int, call: Callable[[H, list[int]], Awaitable[_R]],
                     what: str) -> list[tuple[list[int], _R]]:
        return await _drive(self.spread_plan(count, what), call)

    def each_sync(self, call: Callable[[H], _R], what: str, pool: Executor) -> list[tuple[H, _R]]:
        return _drive_sync(self.each_plan(what), lambda handle, _: call(handle), pool)

    async def each(self, call: Callable[[H], Awaitable[_R]], what: str) -> list[tuple[H, _R]]:
        return await _drive(self.each_plan(what), lambda handle, _: call(handle))


def _drive_sync(plan: Plan[H, _A, Any], call: Callable[[H, _A], Any], pool: Executor) -> Any:
    """Runs a plan's calls at once on `pool`, each round ending when all of them have."""
    try:
        calls = next(plan)
        while True:
            futures = [pool.submit(call, replica.handle, arg) for replica, arg in calls]
            calls = plan.send([f.exception() or f.result() for f in futures])
    except StopIteration as finished:
        return finished.value


async def _drive(plan: Plan[H, _A, Any], call: Callable[[H, _A], Awaitable[Any]]) -> Any:
    """Runs a plan's calls at once on the event loop, each round ending when all of them have."""
    try:
        calls = next(plan)
        while True:
            results = await asyncio.gather(*(call(replica.handle, arg) for replica, arg in calls),
                                           return_exceptions=True)
            calls = plan.send(list(results))
    except StopIteration as finished:
        return finished.value
