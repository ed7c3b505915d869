"""What the SDK's download and export calls write: files written whole or not at all, a stream of
chunks saved as a folder, the export formats' names (rlvr.clients.sdk re-exports `export_format`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import grpc

from rlvr.peers.base import (
    AsyncStream,
    RlvrError,
)
from rlvr.transfer import save_file_chunks
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import scheduler_pb2 as sc


def merged_result(last: sc.MergeModelProgress | None, job_id: str, method: str, address: str) -> sc.MergeModelProgress:
    if last is None or not last.done:
        raise RlvrError(grpc.StatusCode.INTERNAL, f"the merge of job {job_id} ended without a result", method,
                        address)
    return last


def write_file(path: str | os.PathLike[str] | None, name: str, content: bytes | str) -> Path:
    """Writes `content` to `path`, or into it as `name` when it is a folder (default: the current
    folder); returns the file written."""
    target = Path(path) if path is not None else Path.cwd()
    if target.is_dir():
        target = target / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_text(content, encoding="utf-8")
    else:
        target.write_bytes(content)
    return target


def write_loop(loop: sc.Loop, loop_id: str, fmt: str | int, path: str | os.PathLike[str] | None) -> Path:
    from rlvr.clients.views.loops import export_text

    ext = "jsonl" if export_format(fmt) == sc.EXPORT_FORMAT_JSONL else "csv"
    return write_file(path, f"loop-{loop.id or loop_id}-rounds.{ext}", export_text(loop, ext))


async def save_chunks(stream: AsyncStream[cm.FileChunk], directory: str | os.PathLike[str]) -> list[Path]:
    """`save_file_chunks` over an async stream: a worker thread writes the files, pulling each
    chunk from the event loop as it needs it (no chunk waits in memory, no write blocks the loop)."""
    loop = asyncio.get_running_loop()
    done = cm.FileChunk()

    async def pull() -> cm.FileChunk:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return done

    def chunks() -> Iterator[cm.FileChunk]:
        while (chunk := asyncio.run_coroutine_threadsafe(pull(), loop).result()) is not done:
            yield chunk

    try:
        return await asyncio.to_thread(save_file_chunks, chunks(), directory)
    finally:
        stream.cancel()


def export_format(fmt: str | int) -> int:
    """An ExportFormat value from "csv" / "jsonl" (any case) or the value itself."""
    if isinstance(fmt, int):
        if fmt not in sc.ExportFormat.values():
            raise ValueError(f"fmt: {fmt!r} is not an ExportFormat; allowed: {list(sc.ExportFormat.values())}")
        return fmt
    name = f"EXPORT_FORMAT_{fmt.strip().upper().removeprefix('EXPORT_FORMAT_')}"
    if name not in sc.ExportFormat.DESCRIPTOR.values_by_name or name == "EXPORT_FORMAT_UNSPECIFIED":
        raise ValueError(f"fmt: {fmt!r} is not an export format; allowed: csv, jsonl")
    return sc.ExportFormat.Value(name)
