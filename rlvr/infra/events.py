"""Events on NATS JetStream: the `RLVR` stream, deduplicated publishing and consumers (the subjects and
message ids they carry: rlvr/infra/subjects.py).

docs/design.md, Events: the trainer publishes one metric event per optimizer step on
`rlvr.jobs.<id>.metrics`, services publish status changes on `rlvr.{jobs,loops,evals}.<id>.status`;
the scheduler reads every job event with one durable consumer, in stream order (a job's last
metrics before the status that ends it), and stores each one exactly once; the SDK and the CLI
watch a job live from the stream. Payloads are serialized protobuf messages of the contract:
this module only ever sees bytes.

Exactly once, end to end, is built from three at-least-once pieces:
- every publish carries `Nats-Msg-Id` (`<job>:<step>` for metrics), so a publisher's retry after a
  lost acknowledgement is dropped by the stream's duplicate window;
- the durable consumer acknowledges a message only after its handler returned (the store commit
  is done), so a crash in between redelivers rather than loses it;
- the store's insert is idempotent on (job_id, step), so that redelivery is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NamedTuple
from urllib.parse import unquote, urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    PubAck,
    StorageType,
    StreamConfig,
)

log = logging.getLogger(__name__)

STREAM_NAME = "RLVR"
STREAM_SUBJECTS = ["rlvr.>"]
# How long a publish keeps trying while NATS is away (restarting, a network cut) before it fails
# (`publish`). A job's publisher takes its own bound from the trainer's nats_outage_seconds (5
# minutes by default, at most MAX_OUTAGE_S); the services' own status events, which their store
# holds anyway, wait this long.
PUBLISH_WITHIN_S = 15.0
MAX_OUTAGE_S = 600.0
# A retried publish must find its first attempt, which NATS may have stored just before it went
# away, still in the duplicate window: the window outlasts the longest outage a publisher rides out.
DUPLICATE_WINDOW_S = 900.0
# The stream is the live feed and a replay buffer, not the record: the scheduler copies every
# event into the store within seconds. A week keeps a disconnected scheduler or a late `watch`
# whole without letting the files grow without bound.
MAX_AGE_S = 7 * 24 * 3600.0
MSG_ID_HEADER = "Nats-Msg-Id"
# How long a durable consumer's delivered event may go unacknowledged before the server delivers it
# again. A handler that runs longer keeps its event by telling the server it is still at work
# (every third of this). The wait is what an event pays when the process that held it went away
# without a word (killed, or stopped while the event was on its way to it); an ordered consumer
# holds back every later event meanwhile, so it is short.
ACK_WAIT_S = 5.0

def redact_url(url: str) -> str:
    """`url` (a comma list for a cluster) with any password or token in it replaced by ***, for
    logs and messages: credentials travel in NATS URLs (nats://USER:PASSWORD@HOST:4222)."""
    return re.sub(r"(://)([^/@,\s]*)@", lambda m: m.group(1) + (m.group(2).split(":", 1)[0] + ":***"
                                                             if ":" in m.group(2) else "***") + "@", url)


def _credentials_apart(url: str) -> tuple[list[str], str | None, str | None]:
    """The servers of `url` (a comma list) without credentials, and the user and password of the
    first that has them, percent-decoded: nats-py would send them still encoded, so a password with
    a ":" "/" "@" or a non-ASCII letter (written %3A, ...) would never match."""
    servers: list[str] = []
    user: str | None = None
    password: str | None = None
    for server in (u.strip() for u in url.split(",")):
        parts = urlsplit(server)
        if parts.username is not None and "@" in parts.netloc:
            if user is None:
                user, password = unquote(parts.username), unquote(parts.password or "")
            server = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
        servers.append(server)
    return servers, user, password


class EventBusError(RuntimeError):
    """NATS is unreachable or refused an operation; the message is one readable line."""


class Event(NamedTuple):
    """One message of the stream: a NamedTuple, so `async for subject, data, seq in bus.watch(...)`
    reads naturally while handlers can still use the names."""

    subject: str
    data: bytes  # a serialized protobuf message of the contract
    seq: int  # the stream sequence: unique and increasing, so a watch can resume after it


Handler = Callable[[Event], Awaitable[None]]


# ---------------------------------------------------------------------- tasks and messages


async def cancel_and_wait(task: asyncio.Task[object], poll_s: float = 1.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again while it runs.

    On Python 3.11, `asyncio.wait_for` (inside nats-py's `fetch`) can swallow a cancellation that
    lands as its timeout fires and raise TimeoutError instead; a loop that retries on timeouts
    then never ends, and a plain `task.cancel(); await task` waits forever (seen as a scheduler
    test hanging in `JobManager.stop` on a loaded machine)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=poll_s)
    if not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r while stopping", task.get_name(), task.exception())


async def _still_working(msg: Msg, every_s: float) -> None:
    """Tell the server every `every_s` that `msg` is still being handled, so it is not delivered
    again while its handler runs (a lost signal only costs a redelivery: handlers are idempotent)."""
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(nats.errors.Error):
            await msg.in_progress()


# ---------------------------------------------------------------------- stream and publishing


def stream_config(
    max_age_s: float = MAX_AGE_S, duplicate_window_s: float = DUPLICATE_WINDOW_S
) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        subjects=STREAM_SUBJECTS,
        storage=StorageType.FILE,  # events survive a NATS restart: the scheduler may be behind
        max_age=max_age_s,
        duplicate_window=duplicate_window_s,
        description="rlvr job, loop and evaluation events (protobuf payloads)",
    )


async def ensure_stream(
    js: JetStreamContext, max_age_s: float = MAX_AGE_S, duplicate_window_s: float = DUPLICATE_WINDOW_S
) -> None:
    """Create the `RLVR` stream, or bring an existing one to this configuration.

    Every service calls this at start, so creation must be idempotent and race-safe: the server
    accepts a create with an identical config, and a differing one is updated in place.
    """
    if duplicate_window_s > max_age_s:
        raise ValueError(
            f"duplicate window {duplicate_window_s:g} s exceeds the stream max age {max_age_s:g} s"
        )
    config = stream_config(max_age_s, duplicate_window_s)
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:
        # "stream name already in use with a different configuration" (err_code 10058).
        await js.update_stream(config)


async def publish(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    msg_id: str,
    *,
    within_s: float = PUBLISH_WITHIN_S,
    timeout_s: float = 2.0,
) -> PubAck:
    """Publish to the stream with `Nats-Msg-Id`, trying again for `within_s` seconds while NATS does
    not answer (a restart, a reconnect, JetStream not ready yet), then EventBusError.

    Trying again is safe only because of the id: a first attempt that was stored but whose ack was
    lost comes back from the retry as `PubAck(duplicate=True)` instead of a second copy, as long as
    the retry comes within the duplicate window (DUPLICATE_WINDOW_S > MAX_OUTAGE_S). While the
    client is disconnected it waits for the reconnect rather than sending again, so an outage does
    not fill the client's buffer with copies of one event.
    """
    if not msg_id:
        raise ValueError("msg_id is required: without Nats-Msg-Id a retried publish is stored twice")
    nc: NatsClient = js._nc  # the connection this context publishes on
    deadline = asyncio.get_running_loop().time() + within_s
    delay = 0.1
    while True:
        try:
            return await js.publish(
                subject, payload, timeout=timeout_s, stream=STREAM_NAME, headers={MSG_ID_HEADER: msg_id}
            )
        except (
            TimeoutError,  # nats-py raises both its own subclass and the builtin
            nats.js.errors.NoStreamResponseError,
            nats.errors.NoRespondersError,
            nats.errors.OutboundBufferLimitError,
            nats.js.errors.ServiceUnavailableError,  # JetStream still starting after a restart
        ) as e:
            # What a NATS restart or a reconnect looks like.
            failure: Exception = e
        except nats.js.errors.APIError as e:
            raise EventBusError(
                f"publish to {subject} (id {msg_id}) refused by JetStream: {e.description}"
            ) from None
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            raise EventBusError(
                f"publish to {subject} (id {msg_id}) not taken by NATS within {within_s:g} s: "
                f"{type(failure).__name__}"
            ) from None
        log.debug("publish to %s (id %s) failed (%r); trying again", subject, msg_id, failure)
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 2.0)
        while not nc.is_connected and not nc.is_closed and loop.time() < deadline:
            await asyncio.sleep(0.1)  # reconnecting: what is sent now would only wait in the buffer
        if nc.is_closed:
            raise EventBusError(f"publish to {subject} (id {msg_id}): the NATS connection is closed") from None


def _event(msg: Msg) -> Event:
    return Event(msg.subject, msg.data, msg.metadata.sequence.stream)


# ---------------------------------------------------------------------- the bus


class DurableSubscription:
    """A running durable pull consumer; `stop()` ends the fetch loop (the consumer stays on the
    server, so the next `subscribe_durable` with the same name resumes where this one acked)."""

    def __init__(self, name: str, psub: JetStreamContext.PullSubscription, task: asyncio.Task[None]) -> None:
        self.name = name
        self._psub = psub
        self._task = task

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        # Unsubscribing only drops this client's interest: the durable consumer stays.
        with contextlib.suppress(nats.errors.Error):
            await self._psub.unsubscribe()


class _ConnectionLog:
    """What a connection's callbacks say. A lost connection is one warning, its return one line
    with the count of failed attempts (each at debug: nats-py tries twice a second); a close of
    ours is no warning. Other errors warn as they come."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = redact_url(url)
        self.nc: NatsClient | None = None
        self.closing = False
        self.last_error: Exception | None = None
        self.lost_at: float | None = None  # monotonic time of the disconnect; None while connected
        self.failed = 0  # reconnect attempts that failed since then

    async def on_error(self, e: Exception) -> None:
        self.last_error = e
        if self.lost_at is not None or self.closing or (self.nc is not None and not self.nc.is_connected):
            self.failed += 1
            log.debug("nats %s: reconnect attempt %d failed: %s", self.name, self.failed, e)
        elif isinstance(e, nats.errors.UnexpectedEOF | nats.errors.StaleConnectionError | OSError):
            log.debug("nats %s: connection lost: %r", self.name, e)  # on_disconnected says it next
        else:
            log.warning("nats %s: %s", self.name, e)

    async def on_disconnected(self) -> None:
        if self.closing:
            log.debug("nats %s: connection to %s closed", self.name, self.url)
            return
        self.lost_at, self.failed = time.monotonic(), 0
        log.warning("nats %s: disconnected from %s; reconnecting", self.name, self.url)

    async def on_reconnected(self) -> None:
        nc = self.nc
        where = redact_url(nc.connected_url.geturl()) if nc is not None and nc.connected_url else self.url
        away = f" after {time.monotonic() - self.lost_at:.1f} s" if self.lost_at is not None else ""
        log.info("nats %s: reconnected to %s%s (%d failed attempts)", self.name, where, away, self.failed)
        self.lost_at, self.failed = None, 0


class EventBus:
    """A NATS connection that reconnects forever, with the stream ensured and the rlvr consumers.

    Create it with `await EventBus.connect(url)`; `close()` stops subscriptions and drains.
    """

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self._subscriptions: list[DurableSubscription] = []
        # Open watches: an abandoned watch's unread messages would hold `drain()` until it times out.
        self._watches: set[Subscription] = set()
        self._log: _ConnectionLog | None = None

    @classmethod
    async def connect(
        cls, url: str, *, name: str = "rlvr", connect_timeout_s: float = 5.0, ensure: bool = True,
        tls_ca_file: str | os.PathLike[str] | None = None,
    ) -> EventBus:
        """Connect to `url` (comma-separated for a cluster) and, by default, ensure the stream.
        With `tls_ca_file` the connection is TLS and the server's certificate must chain to that CA
        (a tls:// URL without it uses the system's CAs).

        Once connected the client reconnects forever: a NATS restart must not kill a service. The
        first connection, however, is bounded, so a wrong URL fails at start with one line.
        """

        watch = _ConnectionLog(name, url)
        tls = None
        if tls_ca_file is not None:
            try:
                tls = ssl.create_default_context(cafile=os.fspath(tls_ca_file))
            except (OSError, ssl.SSLError) as e:
                raise EventBusError(f"nats_ca_file {os.fspath(tls_ca_file)!r} is not a readable PEM CA: {e}") from None
        servers, user, password = _credentials_apart(url)
        nc = watch.nc = NatsClient()
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=servers,
                    user=user,
                    password=password,
                    tls=tls,
                    name=name,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,  # type: ignore[arg-type]  # nats-py says int, but sleeps on it: seconds
                    connect_timeout=2,
                    error_cb=watch.on_error,
                    disconnected_cb=watch.on_disconnected,
                    reconnected_cb=watch.on_reconnected,
                ),
                connect_timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.Error) as e:
            await nc.close()
            raise EventBusError(
                f"cannot reach NATS at nats url {redact_url(url)!r} within {connect_timeout_s:g} s: "
                f"{watch.last_error or type(e).__name__}"
            ) from None
        bus = cls(nc)
        bus._log = watch
        if ensure:
            try:
                await ensure_stream(bus.js)
            except nats.errors.Error as e:
                await nc.close()
                raise EventBusError(
                    f"NATS at {redact_url(url)!r} has no usable JetStream ({type(e).__name__}: {e})"
                ) from None
        return bus

    async def close(self) -> None:
        """Stops the subscriptions and closes the connection (drained when connected): a normal
        end, logged at debug only."""
        if self._log is not None:
            self._log.closing = True
        for sub in self._subscriptions:
            await sub.stop()
        self._subscriptions.clear()
        for watch in list(self._watches):
            with contextlib.suppress(nats.errors.Error):
                await watch.unsubscribe()
        self._watches.clear()
        if self.nc.is_connected:
            await self.nc.drain()
        elif not self.nc.is_closed:  # NATS away: nothing to drain to (and drain() refuses while reconnecting)
            with contextlib.suppress(OSError, nats.errors.Error):  # the dead socket's flush
                await self.nc.close()

    async def publish(self, subject: str, payload: bytes, msg_id: str, within_s: float = PUBLISH_WITHIN_S) -> PubAck:
        """`publish`: trying again for `within_s` while NATS is away, then EventBusError."""
        return await publish(self.js, subject, payload, msg_id, within_s=within_s)

    async def subscribe_durable(
        self,
        subject: str,
        durable_name: str,
        handler: Handler,
        *,
        batch: int = 64,
        ack_wait_s: float = ACK_WAIT_S,
        max_deliver: int = 20,
        ordered: bool = False,
        replaces: Sequence[str] = (),
        from_start: bool = True,
    ) -> DurableSubscription:
        """Feed every event on `subject` to `handler` once, acknowledging after it returns.

        A durable pull consumer keeps its position on the server, across reconnects and restarts
        of this process. A handler that raises gets the message again after a growing delay; after
        `max_deliver` deliveries the message is terminated and logged as an error, so one poison
        event cannot stall the consumer forever. Handlers must be idempotent (the store is).

        `ordered`: events are handled one at a time in stream order, with no overtaking even
        across a failure or a restart. The server holds at most one unacknowledged event for this
        consumer (max_ack_pending 1), so it delivers the next only once the handler's ack is in; a
        failing handler holds back every later event until its redelivery succeeds or is dropped.

        `replaces`: durable consumers of an earlier layout that this one takes over. When this
        consumer does not exist yet it starts right after the oldest position they acknowledged
        (not at the start of the stream); then they are deleted. Missing ones are ignored.

        `from_start`: where a consumer that does not exist yet (and replaces none) starts: at the
        stream's first event, or (False) at the next one published, for a reader that no earlier
        event can concern. An existing consumer always resumes where it acknowledged.

        A consumer nobody has pulled from for as long as the stream keeps events (its max age, a
        week by default) is deleted by the server. Nothing is lost with it: every event it had not
        read has aged out of the stream by then, and one made again later starts as `from_start`
        says. Without that, the consumer of a database that is gone would stay on a shared NATS,
        costing the server a little on every event, for ever.
        """
        config = ConsumerConfig(
            durable_name=durable_name,
            name=durable_name,
            filter_subject=subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_s,
            max_deliver=max_deliver,
        )
        if ordered:
            config.max_ack_pending = 1
            batch = 1  # a bigger fetch would wait out its timeout for events the server holds back
        try:
            stream = await self.js.stream_info(STREAM_NAME)
            if stream.config.max_age:  # 0: events never age out, and neither does the consumer
                config.inactive_threshold = stream.config.max_age
            existing = await self._consumer_info(durable_name)
            if existing is not None:  # how it started is fixed at creation: keep it
                config.deliver_policy = existing.config.deliver_policy
                config.opt_start_seq = existing.config.opt_start_seq
            elif replaces:
                resume = await self._resume_after(replaces)
                if resume is not None:
                    config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
                    config.opt_start_seq = resume + 1
            if existing is None and config.deliver_policy == DeliverPolicy.ALL and not from_start:
                config.deliver_policy = DeliverPolicy.NEW
            # Create or update: a restarted service with new settings brings the consumer along.
            await self.js.add_consumer(STREAM_NAME, config)
            psub = await self.js.pull_subscribe_bind(durable=durable_name, stream=STREAM_NAME)
            for old in replaces:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self.js.delete_consumer(STREAM_NAME, old)
                    log.info("durable consumer %s replaced by %s", old, durable_name)
        except nats.errors.Error as e:
            raise EventBusError(
                f"cannot create durable consumer {durable_name!r} on {subject}: {e}"
            ) from None
        task = asyncio.create_task(self._fetch_loop(psub, durable_name, handler, batch, max_deliver, ack_wait_s))
        sub = DurableSubscription(durable_name, psub, task)
        self._subscriptions.append(sub)
        return sub

    async def _consumer_info(self, name: str) -> ConsumerInfo | None:
        try:
            return await self.js.consumer_info(STREAM_NAME, name)
        except nats.js.errors.NotFoundError:
            return None

    async def _resume_after(self, names: Sequence[str]) -> int | None:
        """The oldest stream sequence up to which all of these consumers acknowledged everything;
        None when none of them exists."""
        floors = []
        for name in names:
            info = await self._consumer_info(name)
            if info is not None:
                floors.append(info.ack_floor.stream_seq if info.ack_floor is not None else 0)
        return min(floors) if floors else None

    async def _fetch_loop(
        self,
        psub: JetStreamContext.PullSubscription,
        name: str,
        handler: Handler,
        batch: int,
        max_deliver: int,
        ack_wait_s: float,
    ) -> None:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=1.0)
            except TimeoutError:
                # Nothing new. nats-py raises the builtin TimeoutError from one of fetch's paths
                # (not its own subclass): catching only nats.errors.TimeoutError let that one end
                # this loop silently after a quiet spell, and the consumer stopped for good.
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                return
            except Exception as e:  # a consumer must outlive any one bad fetch, never die silently
                # Mostly a reconnect in progress: the client comes back by itself (and says so once).
                level = logging.WARNING if self.nc.is_connected else logging.DEBUG
                log.log(level, "consumer %s: fetch failed (%s: %s); retrying", name, type(e).__name__, e)
                await asyncio.sleep(0.5)
                continue
            for i, msg in enumerate(msgs):
                try:
                    await self._handle(msg, name, handler, max_deliver, ack_wait_s)
                except asyncio.CancelledError:
                    # Stopping: what this fetch holds goes back now (the one being handled may be
                    # done already; handlers are idempotent), rather than after the ack wait, which
                    # would hold up the next consumer of an ordered stream.
                    for held in msgs[i:]:
                        with contextlib.suppress(Exception):
                            await held.nak()
                    raise

    async def _handle(self, msg: Msg, name: str, handler: Handler, max_deliver: int, ack_wait_s: float) -> None:
        event = _event(msg)
        working = asyncio.create_task(_still_working(msg, ack_wait_s / 3))
        try:
            await handler(event)
        except Exception as e:
            delivered = msg.metadata.num_delivered
            if delivered >= max_deliver:
                log.error(
                    "consumer %s: dropping %s seq %d after %d failed deliveries: %s",
                    name,
                    event.subject,
                    event.seq,
                    delivered,
                    e,
                )
                await msg.term()
            else:
                log.warning(
                    "consumer %s: handler failed on %s seq %d (%s); redelivering",
                    name,
                    event.subject,
                    event.seq,
                    e,
                )
                await msg.nak(delay=min(0.5 * 2**delivered, 30.0))
            return
        finally:
            working.cancel()  # only sleeps and signals: nothing to wait for (and no awaiting if the loop is gone)
        try:
            # Wait for the server to record the ack: a "done" that the server never saw would be
            # redelivered after a reconnect (harmless to the store, but wasted work).
            await msg.ack_sync(timeout=5.0)
        except nats.errors.Error as e:
            log.warning(
                "consumer %s: ack of seq %d not confirmed (%s); it may be redelivered", name, event.seq, e
            )

    async def last_message(self, subject: str) -> bytes | None:
        """The payload of the stream's last message on `subject` (no wildcards); None when it has none."""
        try:
            msg = await self.js.get_last_msg(STREAM_NAME, subject)
        except nats.js.errors.NotFoundError:
            return None
        return msg.data

    async def watch(
        self, subject: str, *, from_start: bool = True, start_seq: int | None = None
    ) -> AsyncIterator[Event]:
        """Yield events on `subject` as they arrive: the history first when `from_start`, else only
        new ones; `start_seq` resumes after a known stream sequence.

        An ordered consumer: ephemeral, in order, with no acks, recreated by the client after a
        gap or reconnect; ideal for a live view and nothing left on the server afterwards.
        """
        config: ConsumerConfig | None = None
        policy = DeliverPolicy.ALL if from_start else DeliverPolicy.NEW
        if start_seq is not None:
            policy = DeliverPolicy.BY_START_SEQUENCE
            config = ConsumerConfig(opt_start_seq=start_seq)
        sub = await self.js.subscribe(
            subject, stream=STREAM_NAME, ordered_consumer=True, deliver_policy=policy, config=config
        )
        self._watches.add(sub)
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                yield _event(msg)
        finally:
            self._watches.discard(sub)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
