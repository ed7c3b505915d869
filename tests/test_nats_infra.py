"""The embedded NATS launcher and the event layer, against a real nats-server on a free port."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from fixtures_infra import connected_bus  # fixtures come through conftest.py
from nats.js.api import AckPolicy, ConsumerConfig, StorageType

from rlvr.infra.events import (
    ACK_WAIT_S,
    DUPLICATE_WINDOW_S,
    MAX_OUTAGE_S,
    STREAM_NAME,
    Event,
    EventBus,
    EventBusError,
    ensure_stream,
    publish,
)
from rlvr.infra.nats_server import EmbeddedNats, NatsStartError, find_nats_binary
from rlvr.infra.subjects import (
    ALL_JOB_METRICS,
    eval_status_subject,
    job_events_subject,
    job_metrics_subject,
    job_status_subject,
    loop_status_subject,
    metric_msg_id,
)

NATS_TAP = Path(__file__).resolve().parent / "tools" / "nats_tap.py"  # knows nothing of rlvr


def _job() -> str:
    return uuid.uuid4().hex[:12]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


async def _collect(n: int, box: list[Event], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(box) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------- launcher


def test_find_nats_binary_is_executable() -> None:
    path = find_nats_binary()
    assert os.access(path, os.X_OK)
    assert "nats-server" in subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout


async def test_start_stop_restart_keeps_port(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "n").start()
    try:
        url, pid = server.url, server.pid
        assert server.port > 0 and pid is not None
        nc = await nats.connect(url)
        await nc.close()
        server.stop()
        assert not server.running and not _alive(pid)
        server.start()  # same instance, same port: clients reconnect to the same URL
        assert server.url == url
    finally:
        server.stop()
    server.stop()  # idempotent


def test_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(NatsStartError) as err:
            EmbeddedNats(tmp_path / "n", port=port).start()
    assert err.value.setting == "port"
    assert str(port) in str(err.value) and "in use" in str(err.value) and "\n" not in str(err.value)


def test_missing_binary_and_unwritable_data_dir(tmp_path: Path) -> None:
    with pytest.raises(NatsStartError) as err:
        EmbeddedNats(tmp_path / "n", binary=str(tmp_path / "no-such-nats-server")).start()
    assert err.value.setting == "binary" and "no-such-nats-server" in str(err.value)
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a data dir below a regular file fails even for root
    with pytest.raises(NatsStartError) as err:
        EmbeddedNats(blocker / "data").start()
    assert err.value.setting == "data_dir" and "\n" not in str(err.value)


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from rlvr.infra.nats_server import EmbeddedNats
        server = EmbeddedNats({str(tmp_path / "n")!r}).start()
        print(server.pid, flush=True)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)  # no cleanup code runs: only the kernel can stop the child
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"nats-server {child} outlived its parent"


# ---------------------------------------------------------------------- subjects and stream


def test_subject_helpers() -> None:
    assert job_metrics_subject("ab12") == "rlvr.jobs.ab12.metrics"
    assert job_status_subject("ab12") == "rlvr.jobs.ab12.status"
    assert job_events_subject("ab12") == "rlvr.jobs.ab12.*"
    assert loop_status_subject("l1") == "rlvr.loops.l1.status"
    assert eval_status_subject("e1") == "rlvr.evals.e1.status"
    assert metric_msg_id("ab12", 7) == "ab12:7"
    for bad in ["a.b", "*", ">", "", "a b"]:
        with pytest.raises(ValueError, match="job_id"):
            job_metrics_subject(bad)


async def test_ensure_stream_is_idempotent_and_updates(private_nats: EmbeddedNats) -> None:
    nc = await nats.connect(private_nats.url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, max_age_s=3600)
        await ensure_stream(js, max_age_s=3600)
        await ensure_stream(js)  # a different config is updated in place
        info = await js.stream_info(STREAM_NAME)
        assert info.config.subjects == ["rlvr.>"]
        assert info.config.storage == StorageType.FILE
        assert info.config.duplicate_window == DUPLICATE_WINDOW_S > MAX_OUTAGE_S  # a retry after any outage finds its first try
        assert info.config.max_age == 7 * 24 * 3600
        with pytest.raises(ValueError, match="duplicate window"):
            await ensure_stream(js, max_age_s=60)
    finally:
        await nc.close()


async def test_publish_without_stream_fails_after_retries(private_nats: EmbeddedNats) -> None:
    nc = await nats.connect(private_nats.url)
    try:
        with pytest.raises(EventBusError, match="not taken by NATS within 1 s"):
            await publish(nc.jetstream(), "rlvr.jobs.x.metrics", b"", "x:1", within_s=1, timeout_s=0.5)
        with pytest.raises(ValueError, match="msg_id"):
            await publish(nc.jetstream(), "rlvr.jobs.x.metrics", b"", "")
    finally:
        await nc.close()


async def test_unreachable_url_is_one_clear_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(EventBusError, match=f"127.0.0.1:{port}") as err:
            await EventBus.connect(f"nats://127.0.0.1:{port}", connect_timeout_s=1.5)
    assert "\n" not in str(err.value)


async def test_nats_with_a_password(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A NATS server with credentials: the bus connects with them in the URL; without them, or with
    a wrong password, it fails at start with one line that never shows the password."""
    server = EmbeddedNats(tmp_path / "n", user="rlvr", password="s3cret-pw").start()
    try:
        assert "s3cret-pw" not in server.url and (tmp_path / "n" / "auth.conf").stat().st_mode & 0o077 == 0
        bus = await EventBus.connect(server.url_with_credentials, name="with-password")
        await bus.close()
        for url in (server.url, server.url.replace("nats://", "nats://rlvr:wrong-pw@")):
            with pytest.raises(EventBusError) as err:
                await EventBus.connect(url, connect_timeout_s=1.5)
            assert "wrong-pw" not in str(err.value) and "\n" not in str(err.value)
        assert "wrong-pw" not in caplog.text and "s3cret-pw" not in caplog.text
    finally:
        server.stop()


# ---------------------------------------------------------------------- events


async def test_same_msg_id_is_stored_once(nats_server: EmbeddedNats) -> None:
    job = _job()
    async with connected_bus(nats_server.url) as bus:
        first = await bus.publish(job_metrics_subject(job), b"step-1", metric_msg_id(job, 1))
        again = await bus.publish(job_metrics_subject(job), b"step-1", metric_msg_id(job, 1))
        await bus.publish(job_metrics_subject(job), b"step-2", metric_msg_id(job, 2))
        assert not first.duplicate and again.duplicate and again.seq == first.seq
        seen = [e async for e in _take(bus, job_events_subject(job), 2)]
        assert [e.data for e in seen] == [b"step-1", b"step-2"]
        info = await bus.js.stream_info(STREAM_NAME, subjects_filter=job_metrics_subject(job))
        assert info.state.subjects == {job_metrics_subject(job): 2}


async def _take(bus: EventBus, subject: str, n: int) -> AsyncIterator[Event]:
    async for event in bus.watch(subject):
        yield event
        n -= 1
        if n == 0:
            return


async def test_durable_consumer_resumes_without_redelivery(private_nats: EmbeddedNats) -> None:
    job, got = _job(), []

    async def handler(event: Event) -> None:
        got.append(event)

    async with connected_bus(private_nats.url) as bus:
        for step in (1, 2, 3):
            await bus.publish(job_metrics_subject(job), f"{step}".encode(), metric_msg_id(job, step))
        sub = await bus.subscribe_durable(ALL_JOB_METRICS, "store-test", handler)
        await _collect(3, got)
        await sub.stop()
        assert [e.data for e in got] == [b"1", b"2", b"3"]

        # The server restarts under a live connection: the client reconnects by itself, the
        # consumer and the acked position survive in the file store.
        private_nats.stop()
        private_nats.start()
        await bus.publish(job_metrics_subject(job), b"4", metric_msg_id(job, 4))
        sub = await bus.subscribe_durable(ALL_JOB_METRICS, "store-test", handler)
        await _collect(4, got)

    # A new connection (a restarted scheduler) resumes after the last ack, too.
    async with connected_bus(private_nats.url) as bus:
        await bus.publish(job_metrics_subject(job), b"5", metric_msg_id(job, 5))
        await bus.publish(job_metrics_subject(job), b"4", metric_msg_id(job, 4))  # a retry: dropped
        await bus.subscribe_durable(ALL_JOB_METRICS, "store-test", handler)
        await _collect(5, got)
        await asyncio.sleep(0.5)  # room for a wrong redelivery to show up
    assert [e.data for e in got] == [b"1", b"2", b"3", b"4", b"5"]
    assert [e.seq for e in got] == sorted({e.seq for e in got})


async def test_failed_handler_gets_the_event_again(nats_server: EmbeddedNats) -> None:
    job, calls, done = _job(), [], []

    async def flaky(event: Event) -> None:
        calls.append(event.seq)
        if len(calls) == 1:
            raise RuntimeError("store briefly down")
        done.append(event)

    async with connected_bus(nats_server.url) as bus:
        await bus.publish(job_status_subject(job), b"RUNNING", f"{job}:status:1")
        await bus.subscribe_durable(job_status_subject(job), f"flaky-{job}", flaky)
        await _collect(1, done)
    assert len(done) == 1 and len(calls) == 2 and calls[0] == calls[1]


async def test_ordered_consumer_never_lets_an_event_overtake(nats_server: EmbeddedNats) -> None:
    """One consumer over all of a job's subjects, `ordered`: a slow or failing handler holds back the
    events after it (the status that ends a job never overtakes its last metrics)."""
    job, calls, done = _job(), [], []

    async def handler(event: Event) -> None:
        calls.append(event.data)
        if event.data == b"m2" and calls.count(b"m2") == 1:
            raise RuntimeError("store briefly down")
        if event.subject.endswith(".metrics"):
            await asyncio.sleep(0.2)  # a slow store
        done.append(event.data)

    async with connected_bus(nats_server.url) as bus:
        await bus.publish(job_metrics_subject(job), b"m1", metric_msg_id(job, 1))
        await bus.publish(job_metrics_subject(job), b"m2", metric_msg_id(job, 2))
        await bus.publish(job_status_subject(job), b"COMPLETED", f"{job}:status:COMPLETED")
        sub = await bus.subscribe_durable(f"rlvr.jobs.{job}.>", f"ordered-{job}", handler, ordered=True)
        await _collect(3, done)
        await sub.stop()
        info = await bus.js.consumer_info(STREAM_NAME, f"ordered-{job}")
    assert done == [b"m1", b"m2", b"COMPLETED"]
    assert calls == [b"m1", b"m2", b"m2", b"COMPLETED"]  # the status waited for the retry
    assert info.config.max_ack_pending == 1


async def test_an_event_held_by_a_process_that_went_away_comes_again_within_the_ack_wait(
        nats_server: EmbeddedNats) -> None:
    """A scheduler killed (or stopped) while an event was delivered to it and not yet acknowledged:
    the next scheduler on the same consumer gets that event, and the ones an ordered consumer held
    back behind it, within ACK_WAIT_S (the server's redelivery), not a minute later."""
    job, got, held = _job(), [], asyncio.Event()

    async def stuck(event: Event) -> None:
        held.set()
        await asyncio.Event().wait()  # never returns: the process dies in the middle

    async def handler(event: Event) -> None:
        got.append(event.data)

    name = f"killed-{job}"
    gone = await EventBus.connect(nats_server.url, name="killed")
    await gone.publish(job_metrics_subject(job), b"m1", metric_msg_id(job, 1))
    killed = await gone.subscribe_durable(f"rlvr.jobs.{job}.>", name, stuck, ordered=True)
    try:
        await asyncio.wait_for(held.wait(), 10)
        await gone.nc.close()  # no nak, no unsubscribe: the connection just ends
        async with connected_bus(nats_server.url) as bus:
            await bus.publish(job_metrics_subject(job), b"m2", metric_msg_id(job, 2))
            started = time.monotonic()
            await bus.subscribe_durable(f"rlvr.jobs.{job}.>", name, handler, ordered=True)
            await _collect(2, got, timeout=ACK_WAIT_S + 10)
            waited = time.monotonic() - started
    finally:
        await killed.stop()  # the dead process's task, still in its handler here
    assert got == [b"m1", b"m2"]
    assert waited < ACK_WAIT_S + 3, waited


async def test_a_handler_slower_than_the_ack_wait_keeps_its_event(nats_server: EmbeddedNats) -> None:
    """Two schedulers on one database read one consumer: a handler that takes longer than the ack
    wait tells the server it is still at work, so the other is not handed the same event meanwhile."""
    job, calls = _job(), []
    name = f"slow-{job}"

    async def slow(who: str, event: Event) -> None:
        calls.append((who, event.data))
        await asyncio.sleep(3.0)  # three ack waits

    async with connected_bus(nats_server.url) as one, connected_bus(nats_server.url) as two:
        await one.subscribe_durable(f"rlvr.jobs.{job}.>", name, functools.partial(slow, "one"), ordered=True, ack_wait_s=1.0)
        await two.subscribe_durable(f"rlvr.jobs.{job}.>", name, functools.partial(slow, "two"), ordered=True, ack_wait_s=1.0)
        await one.publish(job_metrics_subject(job), b"m1", metric_msg_id(job, 1))
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(4.0)  # the first handler's three seconds and a second beyond
        info = await one.js.consumer_info(STREAM_NAME, name)
    assert [data for _, data in calls] == [b"m1"], calls
    assert info.ack_floor.stream_seq == info.delivered.stream_seq and info.num_redelivered == 0


async def test_a_consumer_takes_over_from_the_ones_it_replaces(private_nats: EmbeddedNats) -> None:
    """An upgrade from two consumers (metrics, status) to one: the new one starts where the old ones
    had acknowledged everything, not at the start of the stream, and the old ones are deleted."""
    job, old, new = _job(), [], []

    async def old_handler(event: Event) -> None:
        old.append(event.data)

    async def new_handler(event: Event) -> None:
        new.append(event.data)

    async with connected_bus(private_nats.url) as bus:
        for data, subject in [(b"m1", job_metrics_subject(job)), (b"s2", job_status_subject(job)),
                              (b"m3", job_metrics_subject(job)), (b"s4", job_status_subject(job))]:
            await bus.publish(subject, data, data.decode())
        subs = [await bus.subscribe_durable("rlvr.jobs.*.metrics", "old-metrics", old_handler),
                await bus.subscribe_durable("rlvr.jobs.*.status", "old-status", old_handler)]
        await _collect(4, old)
        for sub in subs:
            await sub.stop()
        await bus.publish(job_metrics_subject(job), b"m5", "m5")
        await bus.publish(job_status_subject(job), b"s6", "s6")

        replaced = ("old-metrics", "old-status", "never-existed")
        sub = await bus.subscribe_durable("rlvr.jobs.>", "one", new_handler, ordered=True, replaces=replaced)
        await _collect(3, new)
        await sub.stop()
        # The metrics consumer acknowledged up to m3: from s4 on (a repeat is harmless: handlers are
        # idempotent), never the whole history.
        assert new == [b"s4", b"m5", b"s6"]
        for name in ("old-metrics", "old-status"):
            with pytest.raises(nats.js.errors.NotFoundError):
                await bus.js.consumer_info(STREAM_NAME, name)

        # Started again (its start position is kept): it resumes after its own acks.
        await bus.publish(job_metrics_subject(job), b"m7", "m7")
        await bus.subscribe_durable("rlvr.jobs.>", "one", new_handler, ordered=True, replaces=replaced)
        await _collect(4, new)
        await asyncio.sleep(0.3)
    assert new == [b"s4", b"m5", b"s6", b"m7"]


async def test_a_consumer_nobody_pulls_from_ages_out_with_the_stream(private_nats: EmbeddedNats) -> None:
    """A durable consumer left by a deployment that is gone is deleted by the server once nobody
    has pulled from it for the stream's max age; one that is pulled from stays, and the name can be
    used again, from the stream's start."""
    job, got = _job(), []

    async def handler(event: Event) -> None:
        got.append(event.data)

    async with connected_bus(private_nats.url) as bus:
        info = await bus.js.stream_info(STREAM_NAME)
        assert info.config.max_age == 7 * 24 * 3600
        await ensure_stream(bus.js, max_age_s=3.0, duplicate_window_s=1.0)
        await bus.publish(job_metrics_subject(job), b"e1", "e1")
        # "kept" was made by an older rlvr, with no threshold: subscribing brings it one.
        await bus.js.add_consumer(STREAM_NAME, ConsumerConfig(durable_name="kept", name="kept",
                                                              filter_subject=job_metrics_subject(job),
                                                              ack_policy=AckPolicy.EXPLICIT))
        kept = await bus.subscribe_durable(job_metrics_subject(job), "kept", handler)
        gone = await bus.subscribe_durable(job_metrics_subject(job), "gone", handler)
        for name in ("kept", "gone"):
            assert (await bus.js.consumer_info(STREAM_NAME, name)).config.inactive_threshold == 3.0
        await _collect(2, got)
        await gone.stop()
        await asyncio.sleep(6.0)
        with pytest.raises(nats.js.errors.NotFoundError):
            await bus.js.consumer_info(STREAM_NAME, "gone")
        assert (await bus.js.consumer_info(STREAM_NAME, "kept")).config.durable_name == "kept"
        await kept.stop()
        await bus.publish(job_metrics_subject(job), b"e2", "e2")
        await bus.subscribe_durable(job_metrics_subject(job), "gone", handler)
        await _collect(3, got)
        await asyncio.sleep(0.3)
    # Made again from the stream's start, it reads what the stream still holds: e1 has aged out.
    assert got == [b"e1", b"e1", b"e2"]


async def test_watch_live_and_from_start(nats_server: EmbeddedNats) -> None:
    job = _job()
    async with connected_bus(nats_server.url) as bus:
        old = await bus.publish(job_metrics_subject(job), b"old", metric_msg_id(job, 1))
        live: list[Event] = []

        async def watch_new() -> None:
            async for event in bus.watch(job_events_subject(job), from_start=False):
                live.append(event)
                if len(live) == 2:
                    return

        task = asyncio.create_task(watch_new())
        await asyncio.sleep(0.3)  # let the consumer exist before publishing
        await bus.publish(job_metrics_subject(job), b"new", metric_msg_id(job, 2))
        await bus.publish(job_status_subject(job), b"COMPLETED", f"{job}:status:done")
        await asyncio.wait_for(task, 10)
        assert [(e.subject, e.data) for e in live] == [
            (job_metrics_subject(job), b"new"),
            (job_status_subject(job), b"COMPLETED"),
        ]
        history = [e.data async for e in _take(bus, job_events_subject(job), 3)]
        assert history == [b"old", b"new", b"COMPLETED"]
        resumed = [data async for data in _take_from(bus, job_events_subject(job), old.seq + 1)]
        assert resumed == [b"new"]


async def _take_from(bus: EventBus, subject: str, seq: int) -> AsyncIterator[bytes]:
    async for _subject, data, _seq in bus.watch(subject, start_seq=seq):
        yield data
        return


def test_a_stranger_sees_the_stream(nats_server: EmbeddedNats) -> None:
    """tests/tools/nats_tap.py knows nothing of rlvr (nats-py only): it replays the stream and
    checks that no Nats-Msg-Id appears twice."""
    job = _job()

    async def fill() -> None:
        async with connected_bus(nats_server.url) as bus:
            for step in (1, 2, 2, 3):  # step 2 twice: a publisher retry
                await bus.publish(job_metrics_subject(job), b"m", metric_msg_id(job, step))

    asyncio.run(fill())
    out = subprocess.run(
        [sys.executable, str(NATS_TAP), nats_server.url, job_events_subject(job), "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{job_metrics_subject(job)}: 3" in out.stdout
    assert "duplicated ids 0" in out.stdout


async def test_durable_consumer_survives_a_quiet_spell(nats_server) -> None:
    """A consumer idle for many fetch timeouts still gets the next event. nats-py raises the builtin
    TimeoutError from one of fetch's paths; the fetch loop once died on it after ~30-40 s of quiet."""
    import nats.js.client as js_client

    got: list[Event] = []

    async def handler(event: Event) -> None:
        got.append(event)

    job = _job()
    original = js_client.JetStreamContext.PullSubscription.fetch
    calls = 0

    async def fetch_with_builtin_timeout(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls <= 3:  # the path that raised the builtin TimeoutError, reproduced on demand
            raise TimeoutError
        return await original(self, *args, **kwargs)

    js_client.JetStreamContext.PullSubscription.fetch = fetch_with_builtin_timeout
    try:
        async with connected_bus(nats_server.url) as bus:
            sub = await bus.subscribe_durable(job_metrics_subject(job), f"quiet-{job}", handler)
            await asyncio.sleep(0.2)
            await bus.publish(job_metrics_subject(job), b"x", metric_msg_id(job, 1))
            await _collect(1, got)
            await sub.stop()
    finally:
        js_client.JetStreamContext.PullSubscription.fetch = original
    assert calls > 3 and len(got) == 1


async def test_a_nats_only_client_decodes_metric_events(nats_server: EmbeddedNats) -> None:
    """docs/events.md's recipe: plain nats-py and the generated protos, nothing of
    rlvr's own client code, read what the trainer's publisher puts on the job's subject."""
    from rlvr.services.trainer.process.publisher import EventPublisher
    from rlvr.v1 import common_pb2

    job = _job()
    publisher = EventPublisher(nats_server.url)
    publisher.start()
    try:
        for step in (1, 2):
            publisher.publish_metric(common_pb2.MetricEvent(job_id=job, step=step, total_steps=2, accuracy=step / 4,
                                                            adapter_version=step - 1))
    finally:
        assert await asyncio.to_thread(publisher.close)
    nc = await nats.connect(nats_server.url)
    try:
        sub = await nc.jetstream().subscribe(f"rlvr.jobs.{job}.metrics", deliver_policy="all")
        seen = []
        async for msg in sub.messages:
            e = common_pb2.MetricEvent.FromString(msg.data)
            seen.append((e.step, e.accuracy, e.adapter_version))
            await msg.ack()
            if len(seen) == 2:
                break
    finally:
        await nc.close()
    assert seen == [(1, 0.25, 0), (2, 0.5, 1)]


async def test_a_normal_close_is_no_warning(nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture) -> None:
    """Every job closes its connection when it ends: that is no "disconnected from nats" warning."""
    import logging

    from rlvr.services.trainer.process.publisher import EventPublisher

    caplog.set_level(logging.DEBUG, logger="rlvr")
    async with connected_bus(nats_server.url, name="closing"):
        pass
    publisher = EventPublisher(nats_server.url, name="job")
    publisher.start()
    assert await asyncio.to_thread(publisher.close)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sum("connection to" in r.getMessage() and "closed" in r.getMessage() for r in caplog.records) == 2


def _kill_nats(server: EmbeddedNats) -> None:
    """kill -9, and back only once it is gone (its port closed)."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    while server.returncode is None:
        time.sleep(0.01)


async def _stored(url: str, subject: str) -> list[tuple[str, bytes]]:
    """Every message the stream holds on `subject`, (Nats-Msg-Id, payload), in stream order."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM_NAME, subjects_filter=subject)
        count = (info.state.subjects or {}).get(subject, 0)
        sub = await js.subscribe(subject, deliver_policy="all", ordered_consumer=True)
        got = []
        for _ in range(count):
            msg = await sub.next_msg(timeout=5)
            got.append(((msg.headers or {}).get("Nats-Msg-Id", ""), msg.data))
        await sub.unsubscribe()
        return got
    finally:
        await nc.close()


@pytest.mark.slow  # a chaos run, make test-all (12 s); make test keeps an outage past its bound failing the job
async def test_a_job_rides_out_a_nats_outage_longer_than_the_old_limits(
        private_nats: EmbeddedNats, caplog: pytest.LogCaptureFixture) -> None:
    """NATS killed (-9) for 11 s, past the 10 s in which a job's publisher had to connect at its
    start: a job that runs through the outage, one that starts during it and ends (closes its
    publisher) before NATS is back lose no event and store none twice, including the retry of a
    step NATS had stored before it died (its ack lost): the duplicate window spans the restart.
    Each client says it lost NATS once and that it is back once, with the failed attempts counted
    (it warned twice a second), and a normal close is no warning."""
    import logging
    import threading

    from rlvr.services.trainer.process.publisher import EventPublisher
    from rlvr.v1 import common_pb2

    caplog.set_level(logging.DEBUG, logger="rlvr")
    url, running, starting = private_nats.url, _job(), _job()

    def metric(job: str, step: int) -> common_pb2.MetricEvent:
        return common_pb2.MetricEvent(job_id=job, step=step, total_steps=8)

    async with connected_bus(url):  # the stream, as every service ensures it at its start
        pass
    before = EventPublisher(url, name="running", outage_s=60)
    before.start()
    for step in (1, 2, 3):
        before.publish_metric(metric(running, step))
    while before.published < 3:
        await asyncio.sleep(0.01)
    nc = await nats.connect(url)  # step 4 stored by NATS, its ack lost: the publisher will send it again
    await nc.jetstream().publish(job_metrics_subject(running), metric(running, 4).SerializeToString(),
                                 headers={"Nats-Msg-Id": metric_msg_id(running, 4)})
    await nc.close()

    _kill_nats(private_nats)
    down = time.monotonic()
    for step in (4, 5, 6):
        before.publish_metric(metric(running, step))
    during = EventPublisher(url, name="starting", outage_s=60)
    started = threading.Thread(target=during.start)
    started.start()
    closed: list[bool] = []
    ended = threading.Thread(target=lambda: closed.append(before.close()))  # the job ends while NATS is away
    ended.start()
    await asyncio.sleep(11)
    assert ended.is_alive() and started.is_alive()
    private_nats.start()  # same port, same JetStream folder
    await asyncio.to_thread(started.join, 30)
    await asyncio.to_thread(ended.join, 30)
    for step in (1, 2):
        during.publish_metric(metric(starting, step))
    assert closed == [True] and await asyncio.to_thread(during.close)
    assert time.monotonic() - down > 11

    ids = [msg_id for msg_id, _ in await _stored(url, job_metrics_subject(running))]
    assert ids == [metric_msg_id(running, step) for step in range(1, 7)]  # each once, in order
    assert [msg_id for msg_id, _ in await _stored(url, job_metrics_subject(starting))] == \
        [metric_msg_id(starting, 1), metric_msg_id(starting, 2)]
    records = [r for r in caplog.records if r.name.startswith("rlvr")]
    warned = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert [m for m in warned if "disconnected from" in m] == [f"nats running: disconnected from {url}; reconnecting"]
    assert len(warned) <= 3, warned  # lost (the connection, the publisher), nothing per attempt, nothing at close
    back = [r.getMessage() for r in records if "reconnected to" in r.getMessage()]
    assert len(back) == 1 and re.search(r"after \d+\.\d s \((\d+) failed attempts\)", back[0]), back
    assert int(re.search(r"\((\d+) failed", back[0]).group(1)) >= 5  # type: ignore[union-attr]
    attempts = [r for r in records if "reconnect attempt" in r.getMessage()]
    assert attempts and all(r.levelno == logging.DEBUG for r in attempts)


async def test_an_outage_past_its_bound_fails_the_job_naming_nats_and_the_setting(private_nats: EmbeddedNats) -> None:
    """NATS away for longer than the publisher's bound (the trainer's nats_outage_seconds, 1 s
    here): the next event the job publishes raises one line that names NATS and the setting, as
    does a publisher started while NATS is away."""
    from rlvr.services.trainer.process.publisher import EventPublisher
    from rlvr.v1 import common_pb2

    job = _job()
    publisher = EventPublisher(private_nats.url, outage_s=1, setting="setting nats_outage_seconds")
    publisher.start()
    _kill_nats(private_nats)
    publisher.publish_metric(common_pb2.MetricEvent(job_id=job, step=1))
    deadline = time.monotonic() + 10
    while publisher.error is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    with pytest.raises(EventBusError, match="took none of this job's events for 1 s .setting nats_outage_seconds.") as err:
        publisher.publish_metric(common_pb2.MetricEvent(job_id=job, step=2))
    assert private_nats.url in str(err.value) and "\n" not in str(err.value)
    assert not await asyncio.to_thread(publisher.close)
    with pytest.raises(EventBusError, match=r"cannot reach NATS .* \(setting nats_outage_seconds = 1 s\)"):
        await asyncio.to_thread(EventPublisher(private_nats.url, outage_s=1, setting="setting nats_outage_seconds").start)


async def test_cancel_and_wait_survives_a_swallowed_cancellation() -> None:
    """Python 3.11's wait_for can turn a cancellation into a TimeoutError; a fetch loop that retries
    on timeouts then outlives one `cancel()`. Stopping must still end it."""
    from rlvr.infra.events import cancel_and_wait

    swallowed = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # as wait_for does in the race: the loop carries on

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.3)
    assert not done  # one cancel() is not enough for such a loop
    await asyncio.wait_for(cancel_and_wait(task, poll_s=0.1), timeout=5)
    assert task.cancelled() and swallowed == [True]


async def test_nats_over_tls_with_a_password_and_the_services_settings(tmp_path: Path) -> None:
    """An embedded NATS that takes TLS clients with the user and password only; a service reaches
    it through its settings: the URL (with the password) from a file, and the CA."""
    from fixtures_tls import make_pki

    from rlvr.services.common.server import StartupError
    from rlvr.services.common.startup import open_bus
    from rlvr.services.scheduler.settings import SchedulerSettings

    pki = make_pki(tmp_path / "pki")
    server = EmbeddedNats(tmp_path / "nats", user="rlvr", password="pa:ss/wörd", tls_cert=pki.cert,
                          tls_key=pki.key).start()
    try:
        async def reaches(url: str, ca: Path | None) -> bool:
            try:
                bus = await EventBus.connect(url, name="test-tls", connect_timeout_s=3, tls_ca_file=ca)
            except EventBusError as e:
                assert "pa:ss" not in str(e) and "w%C3%B6rd" not in str(e)  # the password is never shown
                return False
            await bus.publish(job_status_subject(_job()), b"x", uuid.uuid4().hex)
            await bus.close()
            return True

        good = server.url_with_credentials
        assert await reaches(good, pki.ca)
        assert not await reaches(good, None)  # plaintext to a TLS port
        assert not await reaches(server.url, pki.ca)  # no credentials
        assert not await reaches(good.replace("pa%3Ass", "guess"), pki.ca)
        (tmp_path / "nats-url").write_text(good + "\n")
        settings = SchedulerSettings(nats_url_file=tmp_path / "nats-url", nats_ca_file=pki.ca)
        bus = await open_bus(settings, "test-settings")
        await bus.close()
        with pytest.raises(StartupError, match=r"nats_url_file: cannot read"):
            await open_bus(SchedulerSettings(nats_url_file=tmp_path / "missing", nats_ca_file=pki.ca), "x")
        with pytest.raises(StartupError, match=r"RLVR_SCHEDULER_NATS_URL\) = 'nats://rlvr:\*\*\*@.*CERTIFICATE_VERIFY_FAILED"):
            await open_bus(SchedulerSettings(nats_url=good), "x")  # without the CA: refused, password hidden
    finally:
        server.stop()
