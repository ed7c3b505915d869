"""Scoring batches under a hard per-item time limit, without signals.

The scorers are linear-time by design, but "a pathological string cannot hang the service" should not
rest on that alone: a future scorer (or a regex in a dataset's normaliser) may be slower than
expected. So batches are scored in persistent worker processes. Before each item a worker writes the
item's index and start time into shared memory; the parent polls that and, when one item has run
longer than ``timeout_s``, kills the worker, marks that item ``timed_out`` (all-zero score), starts a
fresh worker and hands it the rest of the shard. Results travel back in chunks, so the normal path
costs one pipe message per few hundred items. Workers are started with ``spawn`` (forking a process
that runs gRPC threads is unsafe) and reused across calls; calls on one pool are serialised.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import cast

from rlvr.rewards.scoring import (
    DEFAULT_FORMAT_WEIGHT,
    TIMED_OUT,
    ScoreResult,
    ScoringFunction,
    check_arguments,
    score,
)

ScoreFn = Callable[[ScoringFunction, str, str, bool, float], ScoreResult]
DEFAULT_TIMEOUT_S = 2.0
_CHUNK = 256  # results per message
_MIN_ITEMS_PER_WORKER = 256  # smaller batches are not worth splitting


@dataclass(frozen=True)
class ScoreItem:
    function: ScoringFunction
    completion: str
    ground_truth: str
    format_bonus: bool = True
    format_weight: float = DEFAULT_FORMAT_WEIGHT

    def args(self) -> tuple[ScoringFunction, str, str, bool, float]:
        return (self.function, self.completion, self.ground_truth, self.format_bonus, self.format_weight)


def score_many(items: Sequence[ScoreItem]) -> list[ScoreResult]:
    """In-process scoring, no time limit: for callers that trust their inputs (and benchmarks)."""
    return [score(*item.args()) for item in items]


def _worker_main(conn: Connection, state, score_fn: ScoreFn) -> None:  # state: mp.Array("d", 2)
    while True:
        job = conn.recv()
        if job is None:
            return
        chunk: list[tuple[str, object]] = []
        start_index = 0
        for index, args in job:
            state[0] = time.monotonic()  # start time first, then index: the parent reads index first
            state[1] = index
            try:
                chunk.append(("ok", score_fn(*args)))
            except Exception as exc:  # reported, not fatal: the parent decides what it means
                chunk.append(("error", f"{type(exc).__name__}: {exc}"))
            if len(chunk) >= _CHUNK:
                conn.send((start_index, chunk))
                start_index += len(chunk)
                chunk = []
        state[1] = -1  # idle
        conn.send((start_index, chunk))
        conn.send("done")


class _Worker:
    def __init__(self, ctx: mp.context.SpawnContext, score_fn: ScoreFn) -> None:
        self.state = ctx.Array("d", [0.0, -1.0], lock=False)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, self.state, score_fn), daemon=True)
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


class ScoringPool:
    """Persistent scoring workers enforcing ``timeout_s`` per item. Thread-safe (calls serialise)."""

    def __init__(self, workers: int = 1, score_fn: ScoreFn = score) -> None:
        if workers < 1:
            raise ValueError(f"workers {workers} is out of range; at least 1")
        self._ctx = mp.get_context("spawn")
        self._score_fn = score_fn
        self._size = workers
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _worker(self, slot: int) -> _Worker:
        while len(self._workers) <= slot:
            self._workers.append(_Worker(self._ctx, self._score_fn))
        return self._workers[slot]

    def close(self) -> None:
        with self._lock:
            for worker in self._workers:
                worker.stop()
            self._workers = []

    def score_batch(
        self, items: Sequence[ScoreItem], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[ScoreResult]:
        """Scores in input order. Bad arguments raise ValueError (naming the item) before any work."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s {timeout_s} is out of range; must be > 0")
        for i, item in enumerate(items):
            try:
                check_arguments(item.function, item.format_weight)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        if not items:
            return []
        results: list[ScoreResult | None] = [None] * len(items)
        shards = max(1, min(self._size, len(items) // _MIN_ITEMS_PER_WORKER))
        bounds = [len(items) * s // shards for s in range(shards + 1)]
        with self._lock:
            self._run(
                items, results, [list(range(bounds[s], bounds[s + 1])) for s in range(shards)], timeout_s
            )
        return results  # type: ignore[return-value]  # every slot is filled by _run

    def _run(
        self,
        items: Sequence[ScoreItem],
        results: list[ScoreResult | None],
        shards: list[list[int]],
        timeout_s: float,
    ) -> None:
        pending: dict[int, list[int]] = {}  # slot -> item indices sent and not yet answered

        def dispatch(slot: int, indices: list[int]) -> None:
            if not indices:
                return
            worker = self._worker(slot)
            worker.state[1] = -1.0
            worker.conn.send([(i, items[i].args()) for i in indices])
            pending[slot] = indices

        for slot, indices in enumerate(shards):
            dispatch(slot, indices)
        poll_s = min(0.05, timeout_s / 4)
        while pending:
            by_conn = {self._workers[slot].conn: slot for slot in pending}
            for conn in cast(list[Connection], wait(list(by_conn), timeout=poll_s)):  # a subset of by_conn
                slot = by_conn[conn]
                try:
                    message = conn.recv()
                except EOFError:  # the worker died (killed by the OS?): restart, keep the rest
                    self._replace(slot)
                    self._fail_current(slot, pending, results, dispatch)
                    continue
                if message == "done":
                    del pending[slot]
                    continue
                start, chunk = message
                sent = pending[slot]
                for offset, (kind, value) in enumerate(chunk):
                    index = sent[start + offset]
                    if kind == "error":
                        raise RuntimeError(f"scoring item {index} failed: {value}")
                    results[index] = value
            now = time.monotonic()
            for slot in list(pending):
                state = self._workers[slot].state
                current, started = int(state[1]), state[0]
                if current >= 0 and results[current] is None and now - started > timeout_s:
                    self._replace(slot)
                    self._fail_current(slot, pending, results, dispatch, current)

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self._ctx, self._score_fn)

    @staticmethod
    def _fail_current(
        slot: int,
        pending: dict[int, list[int]],
        results: list[ScoreResult | None],
        dispatch: Callable[[int, list[int]], None],
        current: int | None = None,
    ) -> None:
        """Mark the stuck item timed out and send the shard's unanswered items to the new worker."""
        indices = pending.pop(slot)
        if current is None:  # died without telling us where: blame the first unanswered item
            current = next((i for i in indices if results[i] is None), -1)
        if current >= 0:
            results[current] = TIMED_OUT
        dispatch(slot, [i for i in indices if results[i] is None])


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
