"""Publishing a job's events to NATS from the (synchronous) training loop.

The training loop must not wait on the network, and must not lose an event either: `EventPublisher`
runs an asyncio loop with an `EventBus` in a background thread, and `publish` only enqueues. The
thread publishes in order; while NATS is away (restarting, a network cut) the events wait in the
queue and the first is tried again with the same Nats-Msg-Id (so the stream stores it once) until
NATS takes it. An outage has a bound, `outage_s` (the trainer's nats_outage_seconds): once NATS
has taken nothing for that long the publisher fails, and the job with it at its next event (or at
its end), with a message that names NATS and the setting. Subjects and message ids follow docs/design.md (Events): metrics on
`rlvr.jobs.<id>.metrics` as "<job>:<step>", status on `rlvr.jobs.<id>.status` as
"<job>:status:<STATUS>" (RUNNING, COMPLETED, ...: the scheduler's spelling, so when both publish
the same transition the stream keeps one; each status is entered at most once per job run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from pathlib import Path

from rlvr.infra.events import EventBus, EventBusError, redact_url
from rlvr.infra.subjects import (
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
    """A NATS connection of its own in a background thread; `publish` never blocks (it raises
    `error` once the publisher has failed)."""

    def __init__(self, nats_url: str, name: str = "rlvr-trainer-job", ca_file: Path | None = None,
                 outage_s: float = 300.0, setting: str = "nats_outage_seconds") -> None:
        """`outage_s`: how long NATS may take none of the events (or be unreachable at the start)
        before the publisher fails; `setting` names where that bound is set, for the message."""
        self.nats_url = nats_url
        self.ca_file = ca_file  # NATS over TLS: the CA its certificate chains to
        self.name = name
        self.outage_s = outage_s
        self.setting = setting
        self._queue: deque[tuple[str, bytes, str]] = deque()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self.published = 0
        self.error: EventBusError | None = None  # set when an outage outlasted outage_s

    def start(self) -> None:
        """Connects and starts the thread. NATS away at the start is waited for, up to `outage_s`;
        EventBusError (one line) when it cannot be reached in that time."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            # asyncio.run: what a connection closed on a dead socket leaves running is cancelled
            # before the loop closes.
            asyncio.run(self._run(ready, failure))

        self._thread = threading.Thread(target=main, name="nats-publisher", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    async def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        try:
            bus = await EventBus.connect(self.nats_url, name=self.name, connect_timeout_s=self.outage_s,
                                         tls_ca_file=self.ca_file)
        except EventBusError as e:
            failure.append(EventBusError(f"{e} ({self.setting} = {self.outage_s:g} s)"))
            ready.set()
            return
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
        down_since: float | None = None  # when NATS first failed to take the event at the head
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            subject, payload, msg_id = self._queue[0]
            now = time.monotonic()
            left = self.outage_s - (now - down_since) if down_since is not None else self.outage_s
            try:
                await bus.publish(subject, payload, msg_id, within_s=max(left, 0.0))
            except EventBusError as e:
                if down_since is None:
                    down_since = now
                    log.warning("NATS does not take events (%s); holding them and trying again for up to %g s",
                                e, self.outage_s)
                if time.monotonic() - down_since >= self.outage_s:
                    self.error = EventBusError(
                        f"NATS at {redact_url(self.nats_url)} took none of this job's events for {self.outage_s:g} s "
                        f"({self.setting}); {len(self._queue)} events unpublished, the first {msg_id}: {e}")
                    log.error("%s", self.error)
                    return
                await asyncio.sleep(min(1.0, max(0.0, self.outage_s - (time.monotonic() - down_since))))
                continue
            if down_since is not None:
                log.info("NATS takes events again after %.1f s; %d events to publish", time.monotonic() - down_since,
                         len(self._queue))
                down_since = None
            self._queue.popleft()
            self.published += 1

    def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        """Queues the event; raises `error` (EventBusError) once the publisher has failed."""
        if self.error is not None:
            raise self.error
        self._queue.append((subject, payload, msg_id))
        self._nudge()

    def _nudge(self) -> None:
        """Wakes the thread (if it still runs: after a failure its loop is closed)."""
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):
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

    def close(self) -> bool:
        """Publishes what is queued, waiting out an outage up to `outage_s`, then disconnects. True
        when nothing was left unpublished (else `error` says why)."""
        if self._thread is None:
            return not self._queue
        self._closing = True
        self._nudge()
        self._thread.join(self.outage_s + 30.0)
        return not self._queue
