"""Folders from a trainer worker's artifact root (TrainerService/FetchFolder), resumed across a
broken stream: what lets hosts share no disk (docs/operations.md, Multi-node).

`fetch_folder` writes a folder into a local one (a worker fetching a loop round's init_adapter or a
resumed job's folder, the benchmark an adapter it evaluates by path); `relay_folder` passes the
chunks on as they come (the scheduler's DownloadAdapter and DownloadMergedModel). Both call again
after UNAVAILABLE, asking the worker to skip what arrived whole (by sha256) and to resume the file
that was cut off where it was cut off (rlvr.transfer.FolderWriter, FolderRelay); every other
failure raises `RlvrError` at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncTrainerClient
from rlvr.transfer import FolderRelay, FolderWriter
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.peers.folders")

ATTEMPTS = 4
"""Calls of one fetch: the first, then one after each broken stream (UNAVAILABLE)."""
RETRY_WAIT_S = 0.5


def _retryable(error: RlvrError, attempt: int, attempts: int) -> bool:
    return error.code == grpc.StatusCode.UNAVAILABLE and attempt + 1 < attempts


async def fetch_folder(client: AsyncTrainerClient, path: str, dest: str | Path, files: Sequence[str] | None = None,
                       attempts: int = ATTEMPTS) -> FolderWriter:
    """The folder `path` on the worker `client` reaches, written into `dest` (created), each file
    checked against its sha256; files `dest` holds already with that digest are not sent again.
    Returns the writer (`received`: the files that came, `listing`: every file of the folder)."""
    writer = FolderWriter(dest, path, files)
    for attempt in range(attempts):
        request = await asyncio.to_thread(writer.request)
        try:
            async for chunk in client.fetch_folder(request):
                await asyncio.to_thread(writer.add, chunk)
            break
        except RlvrError as e:
            if not _retryable(e, attempt, attempts):
                raise
            log.warning("fetching %s from %s broke off (%s): resuming", path, client.address, e.details)
            await asyncio.sleep(RETRY_WAIT_S * (attempt + 1))
    await asyncio.to_thread(writer.finish)
    return writer


async def relay_folder(client: AsyncTrainerClient, path: str, files: Sequence[str] | None = None,
                       attempts: int = ATTEMPTS) -> AsyncIterator[common_pb2.FileChunk]:
    """The folder `path` on the worker `client` reaches, chunk by chunk as FetchFolder sends it,
    each chunk once even when the stream broke and was resumed."""
    relay = FolderRelay(path, files)
    for attempt in range(attempts):
        try:
            async for chunk in client.fetch_folder(relay.request()):
                if relay.accept(chunk):
                    yield chunk
            return
        except RlvrError as e:
            if not _retryable(e, attempt, attempts):
                raise
            log.warning("relaying %s from %s broke off (%s): resuming", path, client.address, e.details)
            await asyncio.sleep(RETRY_WAIT_S * (attempt + 1))
