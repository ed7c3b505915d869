"""Evaluation progress on NATS: `EvaluationEvent`s on `rlvr.evals.<id>.status`.

A small interface (`Events`) so that the evaluation core does not import NATS; `BusEvents` is the
JetStream implementation and `MemoryEvents` its in-process twin for tests. Publishing never fails an
evaluation: the store holds the truth, and a watcher falls back on reading it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Protocol

from rlvr.infra.events import EventBus
from rlvr.infra.subjects import eval_status_subject
from rlvr.v1 import benchmark_pb2

log = logging.getLogger("rlvr.benchmark")


class Events(Protocol):
    async def publish(self, event: benchmark_pb2.EvaluationEvent, msg_id: str) -> None: ...

    def follow(self, evaluation_id: str) -> AsyncIterator[benchmark_pb2.EvaluationEvent]:
        """The evaluation's events from its first one on (history, then live)."""
        ...


def msg_id(event: benchmark_pb2.EvaluationEvent) -> str:
    """The dedup id: one per (evaluation, status, progress), so a retried publish is stored once."""
    status = benchmark_pb2.EvaluationStatus.Name(event.status).removeprefix("EVALUATION_STATUS_")
    return f"{event.evaluation_id}:status:{status}:{event.questions_done}"


class BusEvents:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus

    async def publish(self, event: benchmark_pb2.EvaluationEvent, msg_id: str) -> None:
        try:
            await self.bus.publish(eval_status_subject(event.evaluation_id), event.SerializeToString(), msg_id)
        except Exception as e:  # noqa: BLE001 (the store already has it; watchers poll it too)
            log.warning("could not publish event %s: %s", msg_id, e)

    async def follow(self, evaluation_id: str) -> AsyncIterator[benchmark_pb2.EvaluationEvent]:
        async for event in self.bus.watch(eval_status_subject(evaluation_id), from_start=True):
            yield benchmark_pb2.EvaluationEvent.FromString(event.data)


class MemoryEvents:
    """In-process twin: keeps every event, replays history to a new follower."""

    def __init__(self) -> None:
        self.history: dict[str, list[benchmark_pb2.EvaluationEvent]] = defaultdict(list)
        self._seen: set[str] = set()
        self._changed = asyncio.Condition()

    async def publish(self, event: benchmark_pb2.EvaluationEvent, msg_id: str) -> None:
        if msg_id in self._seen:
            return
        self._seen.add(msg_id)
        async with self._changed:
            self.history[event.evaluation_id].append(event)
            self._changed.notify_all()

    async def follow(self, evaluation_id: str) -> AsyncIterator[benchmark_pb2.EvaluationEvent]:
        history = self.history[evaluation_id]
        sent = 0
        while True:
            async with self._changed:
                while len(history) <= sent:
                    await self._changed.wait()
                events = history[sent:]
            sent += len(events)
            for event in events:
                yield event
