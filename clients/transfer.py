"""Chunked file transfer over the contract's FileChunk: the LoadAdapter upload stream for a PEFT
directory, and writing a downloaded chunk stream (DownloadAdapter, DownloadMergedModel) to disk.

Adapters and merged checkpoints never travel as one message (the channel limit is 64 MiB, and a
merged model is gigabytes): each file is a run of chunks, `path` relative to the directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import rollout_pb2 as ro

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of a PEFT adapter directory, in the order they are uploaded."""


def adapter_upload(
    name: str, version: int, directory: str | os.PathLike[str], chunk_size: int = 1024 * 1024
) -> Iterator[ro.LoadAdapterRequest]:
    """The LoadAdapter request stream for a PEFT directory: the header (with the total size, so
    the server can refuse an oversized upload up front), then each file's chunks.

    Raises FileNotFoundError before the first message when a file is missing: once gRPC
    consumes the iterator, an exception there would reach the caller as a bare CANCELLED."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: {chunk_size} must be > 0")
    paths = [Path(directory) / file for file in ADAPTER_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"not a PEFT adapter directory: missing {', '.join(missing)}")
    sizes = [p.stat().st_size for p in paths]
    header = ro.AdapterHeader(name=name, version=version, total_size=sum(sizes))

    def messages() -> Iterator[ro.LoadAdapterRequest]:
        yield ro.LoadAdapterRequest(header=header)
        for path, size in zip(paths, sizes, strict=True):
            with path.open("rb") as f:
                offset = 0
                while True:
                    data = f.read(chunk_size)
                    last = offset + len(data) >= size
                    yield ro.LoadAdapterRequest(
                        chunk=cm.FileChunk(
                            path=path.name, offset=offset, data=data, file_size=size, last=last
                        )
                    )
                    offset += len(data)
                    if last or not data:
                        break

    return messages()


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
