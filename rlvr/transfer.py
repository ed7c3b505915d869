"""Chunked file transfer over the contract's FileChunk, both ways and for every user: a directory
as a chunk stream (`directory_chunks`: the LoadAdapter upload of a PEFT directory, the scheduler's
DownloadAdapter and DownloadMergedModel), and a received stream written back to disk
(`save_file_chunks`), and the LoadAdapter stream reassembled on the receiving side
(`AdapterUpload`).

Adapters and merged checkpoints never travel as one message (the channel limit is 64 MiB, and a
merged model is gigabytes): each file is a run of chunks, `path` relative to the directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from rlvr.adapters import ADAPTER_FILES
from rlvr.common.errors import InvalidArgument, out_of_range
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import rollout_pb2 as ro

CHUNK_SIZE = 1024 * 1024
"""Default chunk size: far below the 64 MiB message limit, large enough to keep per-message
overhead negligible."""


def list_files(directory: str | os.PathLike[str], files: Sequence[str] | None = None) -> list[tuple[str, Path]]:
    """The files a `directory_chunks` stream of `directory` would send, as (relative path, path):
    `files` in that order, else every regular file under the directory (recursively, sorted,
    skipping symlinks and hidden names such as a `.staging` folder). Raises FileNotFoundError naming what is
    missing, before anything is sent."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    if files is not None:
        paths = [(name, root / name) for name in files]
        missing = [str(p) for _, p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"missing {', '.join(missing)}")
        return paths
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not any(part.startswith(".") for part in rel.parts):
            found.append((rel.as_posix(), path))
    return found


def directory_chunks(
    directory: str | os.PathLike[str], files: Sequence[str] | None = None, chunk_size: int = CHUNK_SIZE
) -> Iterator[cm.FileChunk]:
    """`directory` as a FileChunk stream: each file (see `list_files`) as a run of chunks of at
    most `chunk_size` bytes, `path` relative to the directory, `last` on its final chunk (an empty
    file is one empty chunk). The file list is checked when this is called, not when the stream is
    first read: once gRPC consumes an iterator, an exception would reach the peer as a bare
    CANCELLED."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: {chunk_size} must be > 0")
    paths = [(rel, path, path.stat().st_size) for rel, path in list_files(directory, files)]

    def chunks() -> Iterator[cm.FileChunk]:
        for rel, path, size in paths:
            with path.open("rb") as f:
                offset = 0
                while True:
                    data = f.read(chunk_size)
                    last = offset + len(data) >= size or not data
                    yield cm.FileChunk(path=rel, offset=offset, data=data, file_size=size, last=last)
                    offset += len(data)
                    if last:
                        break

    return chunks()


def directory_size(directory: str | os.PathLike[str], files: Sequence[str] | None = None) -> int:
    """The bytes a `directory_chunks` stream of `directory` carries."""
    return sum(path.stat().st_size for _, path in list_files(directory, files))


def adapter_upload(
    name: str, version: int, directory: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE
) -> Iterator[ro.LoadAdapterRequest]:
    """The LoadAdapter request stream for a PEFT directory: the header (with the total size, so
    the server can refuse an oversized upload up front), then each file's chunks.

    Raises FileNotFoundError before the first message when a file is missing: once gRPC
    consumes the iterator, an exception there would reach the caller as a bare CANCELLED."""
    try:
        chunks = directory_chunks(directory, ADAPTER_FILES, chunk_size)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"not a PEFT adapter directory: {e}") from None
    header = ro.AdapterHeader(name=name, version=version, total_size=directory_size(directory, ADAPTER_FILES))

    def messages() -> Iterator[ro.LoadAdapterRequest]:
        yield ro.LoadAdapterRequest(header=header)
        for chunk in chunks:
            yield ro.LoadAdapterRequest(chunk=chunk)

    return messages()


class AdapterUpload:
    """The receiving side of `adapter_upload`: feed it each LoadAdapterRequest in order, then call
    `finish()` for the header and the files' bytes. Every malformed stream raises InvalidArgument
    naming the field (a header sent twice or not first, a file other than ADAPTER_FILES, a chunk out
    of order, more than `limit` bytes, a total that differs from the announced one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.header: ro.AdapterHeader | None = None
        self.files: dict[str, bytearray] = {}
        self.total = 0

    def add(self, part: ro.LoadAdapterRequest) -> None:
        if part.WhichOneof("part") == "header":
            if self.header is not None:
                raise InvalidArgument("header: sent twice; send it once, first")
            self.header = part.header
            if self.header.total_size > self.limit:
                raise out_of_range("header.total_size", self.header.total_size, f"at most {self.limit} bytes")
            return
        if self.header is None:
            raise InvalidArgument("header: the first message must be the adapter header")
        chunk = part.chunk
        if chunk.path not in ADAPTER_FILES:
            raise InvalidArgument(f"chunk.path: {chunk.path!r} is not accepted; send only {', '.join(ADAPTER_FILES)}")
        buf = self.files.setdefault(chunk.path, bytearray())
        if chunk.offset != len(buf):
            raise InvalidArgument(f"chunk.offset: {chunk.offset} for {chunk.path} but {len(buf)} bytes received")
        self.total += len(chunk.data)
        if self.total > self.limit:
            raise out_of_range("upload size", f"more than {self.limit} bytes", f"at most {self.limit} bytes")
        buf.extend(chunk.data)

    def finish(self) -> tuple[ro.AdapterHeader, dict[str, bytes]]:
        header = self.header
        if header is None:
            raise InvalidArgument("header: the upload was empty")
        if header.version < 1:
            raise out_of_range("header.version", header.version, ">= 1")
        if header.total_size and header.total_size != self.total:
            raise InvalidArgument(f"header.total_size: {header.total_size} announced but {self.total} bytes received")
        return header, {name: bytes(data) for name, data in self.files.items()}


def save_file_chunks(chunks: Iterable[cm.FileChunk], directory: str | os.PathLike[str]) -> list[Path]:
    """Writes a FileChunk stream (DownloadAdapter, DownloadMergedModel) under `directory`;
    returns the files in the order they completed. A chunk whose path would leave `directory`
    raises ValueError: the stream comes from a server, and a path is never trusted."""
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    done: list[Path] = []
    handles: dict[Path, IO[bytes]] = {}
    try:
        for chunk in chunks:
            target = (root / chunk.path).resolve()
            if not chunk.path or not target.is_relative_to(root):
                raise ValueError(f"chunk path {chunk.path!r} is outside {root}")
            if target not in handles:
                target.parent.mkdir(parents=True, exist_ok=True)
                handles[target] = target.open("wb")
            handles[target].seek(chunk.offset)
            handles[target].write(chunk.data)
            if chunk.last:
                handles.pop(target).close()
                done.append(target)
    finally:
        for handle in handles.values():
            handle.close()
    return done
