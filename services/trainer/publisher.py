"""Publishing a job's events to NATS from the (synchronous) training loop.

The training loop must not wait on the network, and must not lose an event either: `EventPublisher`
runs an asyncio loop with an `EventBus` in a background thread, and `publish` only enqueues. The
thread publishes in order; a publish that still fails after `rlvr.infra.events.publish`'s own
retries is tried again (with the same Nats-Msg-Id, so the stream stores it once) until `close`
runs out of its flush time. Subjects and message ids follow docs/design.md (Events): metrics on
`rlvr.jobs.<id>.metrics` as "<job>:<step>", status on `rlvr.jobs.<id>.status` as
"<job>:status:<STATUS>" (RUNNING, COMPLETED, ...: the scheduler's spelling, so when both publish
the same transition the stream keeps one; each status is entered at most once per job run).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from pathlib import Path

from rlvr.infra.events import (
    EventBus,
    EventBusError,
    job_metrics_subject,
    job_samples_subject,
    job_status_subject,
    metric_msg_id,
    samples_msg_id,
    status_msg_id,
)
from rlvr.jobspec import job_status_name
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.trainer.publisher")


class EventPublisher:
    """A NATS connection of its own in a background thread; `publish` never blocks."""

    def __init__(self, nats_url: str, name: str = "rlvr-trainer-job", ca_file: Path | None = None) -> None:
        self.nats_url = nats_url
        self.ca_file = ca_file  # NATS over TLS: the CA its certificate chains to
        self.name = name
        self._queue: deque[tuple[str, bytes, str]] = deque()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._deadline = float("inf")
        self.published = 0

    def start(self, connect_timeout_s: float = 10.0) -> None:
        """Connects (raises EventBusError, one line, when NATS cannot be reached) and starts the thread."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._run(ready, failure, connect_timeout_s))
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, name="nats-publisher", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    async def _run(self, ready: threading.Event, failure: list[BaseException], timeout_s: float) -> None:
        self._wake = asyncio.Event()
        try:
            bus = await EventBus.connect(self.nats_url, name=self.name, connect_timeout_s=timeout_s,
                                         tls_ca_file=self.ca_file)
        except BaseException as e:
            failure.append(e)
            ready.set()
            return
        ready.set()
        try:
            await self._drain_forever(bus)
        finally:
            await bus.close()

    async def _drain_forever(self, bus: EventBus) -> None:
        assert self._wake is not None
        backoff = 0.5
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            subject, payload, msg_id = self._queue[0]
            try:
                await bus.publish(subject, payload, msg_id)
            except EventBusError as e:
                if self._closing and time.monotonic() > self._deadline:
                    log.error("giving up on %d unpublished events (first: %s): %s", len(self._queue), msg_id, e)
                    return
                log.warning("publish of %s failed (%s); retrying in %.1f s", msg_id, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            self._queue.popleft()
            self.published += 1

    def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self._queue.append((subject, payload, msg_id))
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def publish_metric(self, event: common_pb2.MetricEvent) -> None:
        self.publish(job_metrics_subject(event.job_id), event.SerializeToString(),
                     metric_msg_id(event.job_id, event.step))

    def publish_samples(self, event: common_pb2.CompletionSamples) -> None:
        self.publish(job_samples_subject(event.job_id, event.step), event.SerializeToString(),
                     samples_msg_id(event.job_id, event.step))

    def publish_status(self, event: common_pb2.JobStatusEvent) -> None:
        self.publish(job_status_subject(event.job_id), event.SerializeToString(),
                     status_msg_id(event.job_id, job_status_name(event.status)))

    def publish_again(self, event: common_pb2.JobStatusEvent, key: str) -> None:
        """A status the job had already, with news (the wait for a peer, a resume): an id of its own
        (`key`, unique per job), so the stream does not drop it as the first one's duplicate and
        WatchJob shows each."""
        self.publish(job_status_subject(event.job_id), event.SerializeToString(),
                     status_msg_id(event.job_id, job_status_name(event.status), again=key))

    def close(self, flush_timeout_s: float = 30.0) -> bool:
        """Publishes what is queued (for at most `flush_timeout_s`), then disconnects. True when
        nothing was left unpublished."""
        if self._thread is None:
            return not self._queue
        self._deadline = time.monotonic() + flush_timeout_s
        self._closing = True
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(flush_timeout_s + 15.0)
        return not self._queue
