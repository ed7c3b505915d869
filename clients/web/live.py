"""Live pages over server-sent events: the job page follows `WatchJob`, the loop page `WatchLoop`.

The SDK's streams are blocking iterators, so each SSE connection runs its stream in a thread of its
own, on a scheduler client of its own: when the browser goes away, closing that client's channel
cancels the gRPC stream and the thread ends (a stream waiting for a job's next step could otherwise
hold its thread for hours).

What goes to the browser is HTML, not data: an `update` event is a JSON object of element id ->
the element's new outer HTML, rendered by the same templates as the page (so a page without
JavaScript and a live one show the same thing), and `done` once the job or loop has ended (the
script then closes the EventSource, which would otherwise reconnect).

Job pages re-read the job and its RL Metrics (GetJob, GetJobMetrics) at every event rather than
adding up the events: a burst of steps is one render, and the card is exactly what
GetJobMetrics answers. A metric event can reach NATS subscribers before the scheduler has stored
the step, so the page is also re-read every few seconds while nothing arrives, and after the job
ends until the stored steps have caught up with the job's last step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from starlette.concurrency import run_in_threadpool

from rlvr.peers.base import RlvrError

POLL_SECONDS = 2.0      # re-read a running job this often when no event arrives
_END = object()


class StreamThread:
    """Runs `open_stream(client)` (a blocking iterator) in a thread and hands its items to asyncio."""

    def __init__(self, client: Any, open_stream: Callable[[Any], Iterator[Any]]) -> None:
        self.client = client
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.error: RlvrError | None = None
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, args=(open_stream,), daemon=True, name="rlvr-web-sse")
        self._thread.start()

    def _put(self, item: object) -> None:
        self._loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def _run(self, open_stream: Callable[[Any], Iterator[Any]]) -> None:
        try:
            for item in open_stream(self.client):
                self._put(item)
        except RlvrError as e:
            self.error = e
        except Exception as e:  # noqa: BLE001 (the channel closed under it: the browser left)
            self.error = RlvrError(grpc.StatusCode.UNKNOWN, str(e))
        finally:
            with contextlib.suppress(RuntimeError):  # the event loop is gone (server shutdown)
                self._put(_END)

    async def next_batch(self, timeout: float | None) -> tuple[list[Any], bool]:
        """Everything queued (waiting up to `timeout` for the first item): (items, ended)."""
        items: list[Any] = []
        try:
            items.append(await asyncio.wait_for(self.queue.get(), timeout))
        except TimeoutError:
            return [], False
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        ended = any(item is _END for item in items)
        return [item for item in items if item is not _END], ended

    def close(self) -> None:
        self.client.close()


def update_event(regions: dict[str, str]) -> dict[str, str]:
    return {"event": "update", "data": json.dumps(regions)}


def done_event(reason: str = "") -> dict[str, str]:
    return {"event": "done", "data": reason}


async def job_events(job_id: str, since: str, stream_client: Callable[[], Any],
                     read: Callable[[], tuple[Any, Any]], render: Callable[[Any, Any], dict[str, str]],
                     fingerprint: Callable[[Any, Any], str],
                     is_final: Callable[[Any], bool]) -> AsyncIterator[dict[str, str]]:
    """The job page's events. `read()` -> (job, metrics) (blocking: run in a thread); `render`
    -> regions; `since` the fingerprint the page was rendered at (no update until it changes).
    A job that reads as ended has every step stored (the scheduler stores its events in order), so
    the update rendered with the final status is the last one."""
    from rlvr.v1 import scheduler_pb2 as S

    stream = StreamThread(stream_client(), lambda c: c.watch_job(S.WatchJobRequest(id=job_id, from_start=False)))
    watching = True  # until WatchJob ends (the job ended, or the stream broke: then polling alone)
    last = since
    try:
        while True:
            if watching:
                _, ended = await stream.next_batch(POLL_SECONDS)
                watching = not ended
            else:
                await asyncio.sleep(POLL_SECONDS)
            job, metrics = await run_in_threadpool(read)
            shown = fingerprint(job, metrics)
            if shown != last:
                yield update_event(await run_in_threadpool(render, job, metrics))
                last = shown
            if is_final(job):
                yield done_event("ended")
                return
    finally:
        stream.close()


async def loop_events(loop_id: str, stream_client: Callable[[], Any], read: Callable[[], Any],
                      render: Callable[[Any], dict[str, str]],
                      is_final: Callable[[Any], bool]) -> AsyncIterator[dict[str, str]]:
    """The loop page's events: WatchLoop's Loop messages (the latest of a burst) rendered; if the
    stream breaks before the loop ends (a scheduler restart), GetLoop every few seconds."""
    from rlvr.v1 import scheduler_pb2 as S

    stream = StreamThread(stream_client(), lambda c: c.watch_loop(S.WatchLoopRequest(id=loop_id)))
    watching = True
    try:
        while True:
            if watching:
                items, ended = await stream.next_batch(None)
                watching = not ended
            else:
                await asyncio.sleep(POLL_SECONDS)
                items = [await run_in_threadpool(read)]
            if items:
                loop = items[-1]
                yield update_event(await run_in_threadpool(render, loop))
                if is_final(loop.status):
                    yield done_event("ended")
                    return
    finally:
        stream.close()
