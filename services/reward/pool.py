"""Scoring batches under a hard time limit, in worker processes, whatever the rewards do.

A reward is code the service does not control (a plugin, or a future built-in slower than
expected), so "a pathological completion cannot hang the service" must not rest on its being well
behaved. Batches are scored in persistent worker processes. Before each item a worker writes the
item's index and start time into shared memory; the parent polls that and, when one item has run
longer than ``timeout_s``, kills the worker, marks that item timed out (score 0, with the reason),
starts a fresh worker and hands it the rest of the shard. A batch reward (one call for all the
items) and an async one (its items awaited together, each under the limit) run as one unit under
the limit times the item count. Results travel back in chunks, so the normal path costs one pipe
message per few hundred items. Workers are started with ``spawn`` (forking a process that runs gRPC
threads is unsafe) and reused across calls; calls on one pool are serialised. A reward that raises
or returns garbage scores the item 0 with a reason (rlvr/rewards/combine.py); nothing a reward does
reaches the caller as an exception.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from rlvr.rewards.combine import TermError, TermResult, combine, error_text, evaluate, normalize
from rlvr.rewards.registry import Registry, RewardDefinition, Sample, load_registry
from rlvr.rewards.scoring import DEFAULT_FORMAT_WEIGHT, ScoreResult, check_arguments

DEFAULT_TIMEOUT_S = 2.0
_CHUNK = 256  # results per message
_MIN_ITEMS_PER_WORKER = 256  # smaller batches are not worth splitting
_MAX_UNIT_TIMEOUT_S = 600.0  # a batch or async reward's limit for a whole call


@dataclass(frozen=True)
class ScoreItem:
    """One completion to score: with the reward `function` (a key) alone, or with `terms`
    ((key, weight), the first is the job's reward) and the sample's prompt and row columns."""

    function: str
    completion: str
    ground_truth: str
    format_bonus: bool = True
    format_weight: float = DEFAULT_FORMAT_WEIGHT
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)
    terms: tuple[tuple[str, float], ...] = ()
    accuracy_key: str = ""

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        return self.terms or ((self.function, 1.0),)

    def sample(self) -> Sample:
        return Sample(self.completion, self.ground_truth, self.prompt, self.messages, self.columns)


def score_many(items: Sequence[ScoreItem], allowed: Collection[str] | None = None) -> list[ScoreResult]:
    """In-process scoring, no time limit: for callers that trust their rewards (and benchmarks)."""
    registry = load_registry(allowed)
    keys = {key for item in items for key, _ in item.weights}
    results = {key: evaluate(registry.get(key), [item.sample() for item in items]) for key in keys}
    return [_combine(item, {key: results[key][i] for key, _ in item.weights}) for i, item in enumerate(items)]


def _combine(item: ScoreItem, results: Mapping[str, TermResult]) -> ScoreResult:
    return combine(item.weights, results, item.completion, item.format_bonus, item.format_weight,
                   item.accuracy_key or None)


# ---------------------------------------------------------------------- worker side

# A job for a worker: ("items", key, [(index, sample), ...]) scores one at a time under the watchdog;
# ("unit", key, [(index, sample), ...]) calls a batch reward once, or awaits an async one's items together.
Job = tuple[str, str, list[tuple[int, Sample]]]


def _unit(definition: RewardDefinition, samples: list[Sample], timeout_s: float) -> list[TermResult]:
    if definition.score_batch is not None or not definition.is_async:
        return evaluate(definition, samples)
    assert definition.score is not None
    score = definition.score

    async def one(sample: Sample) -> TermResult:
        try:
            return normalize(await asyncio.wait_for(score(sample), timeout_s))
        except TimeoutError:
            return TermError(f"{definition.key}: timed out after {timeout_s:g} s", timed_out=True)
        except Exception as exc:
            return TermError(f"{definition.key}: {error_text(exc)}")

    async def every() -> list[TermResult]:
        return list(await asyncio.gather(*(one(s) for s in samples)))

    return asyncio.run(every())


def _worker_main(conn: Connection, state, allowed: Collection[str] | None) -> None:  # state: mp.Array("d", 2)
    try:
        _serve(conn, state, load_registry(allowed))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        # The service that started this worker is gone (killed: the pipe's other end closed). Quietly:
        # a traceback here would be the last lines of the service's log, where its crash report
        # (`rlvr up`'s) must show the service's own.
        return


def _serve(conn: Connection, state, registry: Registry) -> None:  # state: mp.Array("d", 2)
    warm: set[str] = set()
    while True:
        message = conn.recv()
        if message is None:
            return
        (kind, key, entries), timeout_s = message
        chunk: list[tuple[int, TermResult]] = []
        try:
            definition = registry.get(key)
            if key not in warm and definition.warm_up is not None:
                definition.warm_up()  # idle (state[1] == -1): no completion's time limit runs
            warm.add(key)
        except Exception as exc:  # noqa: BLE001 (an unknown key, or a warm-up that failed: each item says why)
            conn.send([(i, TermError(f"{key}: {exc}")) for i, _ in entries])
            conn.send("done")
            continue
        if kind == "unit":
            state[0] = time.monotonic()
            state[1] = entries[0][0] if entries else -1
            values = _unit(definition, [s for _, s in entries], timeout_s)
            chunk = [(i, v) for (i, _), v in zip(entries, values, strict=True)]
        else:
            for index, sample in entries:
                state[0] = time.monotonic()  # start time first, then index: the parent reads index first
                state[1] = index
                chunk.append((index, evaluate(definition, [sample])[0]))
                if len(chunk) >= _CHUNK:
                    conn.send(chunk)
                    chunk = []
        state[1] = -1  # idle
        conn.send(chunk)
        conn.send("done")


class _Worker:
    def __init__(self, ctx: mp.context.SpawnContext, allowed: Collection[str] | None) -> None:
        self.state = ctx.Array("d", [0.0, -1.0], lock=False)
        self.conn, child = ctx.Pipe()
        allowed_list = None if allowed is None else sorted(allowed)
        self.process = ctx.Process(target=_worker_main, args=(child, self.state, allowed_list), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.kill()


# ---------------------------------------------------------------------- parent side


@dataclass
class _Pending:
    job: Job
    limit_s: float  # the time limit of the item in progress (or of the whole unit)
    answered: set[int] = field(default_factory=set)


class ScoringPool:
    """Persistent scoring workers enforcing ``timeout_s`` per item. Thread-safe (calls serialise).

    ``allowed``: the plugin keys the workers load (None = every installed one; see
    rlvr.rewards.registry.discover)."""

    def __init__(self, workers: int = 1, allowed: Collection[str] | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers {workers} is out of range; at least 1")
        self._ctx = mp.get_context("spawn")
        self._allowed = allowed
        self._size = workers
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _worker(self, slot: int) -> _Worker:
        while len(self._workers) <= slot:
            self._workers.append(_Worker(self._ctx, self._allowed))
        return self._workers[slot]

    def close(self) -> None:
        with self._lock:
            for worker in self._workers:
                worker.stop()
            self._workers = []

    def score_batch(self, items: Sequence[ScoreItem], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ScoreResult]:
        """Scores in input order. Bad arguments raise ValueError (naming the item) before any work."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s {timeout_s} is out of range; must be > 0")
        registry = load_registry(self._allowed)
        for i, item in enumerate(items):
            try:
                for key, _ in item.weights:
                    check_arguments(key, item.format_weight)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        if not items:
            return []
        results = self.evaluate([(registry.get(key), [(i, item.sample()) for i, item in enumerate(items)
                                                      if key in dict(item.weights)])
                                 for key in dict.fromkeys(k for item in items for k, _ in item.weights)], timeout_s)
        return [_combine(item, {key: results[key][i] for key, _ in item.weights}) for i, item in enumerate(items)]

    def evaluate(self, work: Sequence[tuple[RewardDefinition, list[tuple[int, Sample]]]], timeout_s: float
                 ) -> dict[str, dict[int, TermResult]]:
        """Each reward's results for its (index, sample)s, under the time limits (see the module doc)."""
        jobs: list[Job] = []
        for definition, entries in work:
            if definition.score_batch is not None or definition.is_async:
                jobs.append(("unit", definition.key, entries))
                continue
            shards = max(1, min(self._size, len(entries) // _MIN_ITEMS_PER_WORKER))
            bounds = [len(entries) * s // shards for s in range(shards + 1)]
            jobs += [("items", definition.key, entries[bounds[s]:bounds[s + 1]]) for s in range(shards)]
        limits = {d.key: d.timeout_seconds or timeout_s for d, _ in work}
        results: dict[str, dict[int, TermResult]] = {d.key: {} for d, _ in work}
        with self._lock:
            for start in range(0, len(jobs), self._size):  # at most one job per worker at a time
                self._run(jobs[start:start + self._size], results, limits)
        return results

    def _run(self, jobs: list[Job], results: dict[str, dict[int, TermResult]], limits: dict[str, float]) -> None:
        pending: dict[int, _Pending] = {}  # slot -> the job sent and not yet done

        def dispatch(slot: int, job: Job) -> None:
            kind, key, entries = job
            if not entries:
                return
            limit = limits[key]
            unit_limit = min(_MAX_UNIT_TIMEOUT_S, limit * len(entries) + 1.0) if kind == "unit" else limit
            worker = self._worker(slot)
            worker.state[1] = -1.0
            worker.conn.send((job, limit))
            pending[slot] = _Pending(job, unit_limit)

        for slot, job in enumerate(jobs):
            dispatch(slot, job)
        poll_s = min(0.05, min(limits.values()) / 4)
        while pending:
            by_conn = {self._workers[slot].conn: slot for slot in pending}
            for conn in cast(list[Connection], wait(list(by_conn), timeout=poll_s)):  # a subset of by_conn
                slot = by_conn[conn]
                try:
                    message = conn.recv()
                except EOFError:  # the worker died (killed by the OS, or a reward ended it): restart
                    self._replace(slot)
                    self._fail_current(slot, pending, results, dispatch, "the scoring process died")
                    continue
                if message == "done":
                    del pending[slot]
                    continue
                key = pending[slot].job[1]
                for index, value in message:
                    results[key][index] = value
                    pending[slot].answered.add(index)
            now = time.monotonic()
            for slot in list(pending):
                state, item = self._workers[slot].state, pending[slot]
                current, started = int(state[1]), state[0]
                key = item.job[1]
                if current >= 0 and current not in results[key] and now - started > item.limit_s:
                    self._replace(slot)
                    self._fail_current(slot, pending, results, dispatch,
                                       f"timed out after {item.limit_s:g} s", current, timed_out=True)

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self._ctx, self._allowed)

    @staticmethod
    def _fail_current(
        slot: int,
        pending: dict[int, _Pending],
        results: dict[str, dict[int, TermResult]],
        dispatch: Callable[[int, Job], None],
        reason: str,
        current: int | None = None,
        timed_out: bool = False,
    ) -> None:
        """Fail the stuck item (a unit: all of its items) and send the rest to the new worker."""
        kind, key, entries = pending.pop(slot).job
        left = [(i, s) for i, s in entries if i not in results[key]]
        if kind == "unit":
            failed, rest = left, []
        else:
            if current is None:  # died without telling us where: blame the first unanswered item
                current = left[0][0] if left else -1
            failed = [(i, s) for i, s in left if i == current]
            rest = [(i, s) for i, s in left if i != current]
        for index, _ in failed:
            results[key][index] = TermError(f"{key}: {reason}", timed_out=timed_out)
        dispatch(slot, (kind, key, rest))


_default_pool: ScoringPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ScoringPool:
    """A process-wide pool (one worker per core, at most 4), closed at exit."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ScoringPool(workers=max(1, min(4, mp.cpu_count())))
            atexit.register(_default_pool.close)
        return _default_pool


def score_batch(
    items: Sequence[ScoreItem], timeout_s: float = DEFAULT_TIMEOUT_S, pool: ScoringPool | None = None
) -> list[ScoreResult]:
    """Score a batch with a hard limit of ``timeout_s`` per completion (see the module docstring)."""
    return (pool or default_pool()).score_batch(items, timeout_s)
