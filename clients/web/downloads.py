"""Download Adapter (and the merged model) as one zip, streamed as the chunks arrive.

`DownloadAdapter` / `DownloadMergedModel` send the PEFT folder as runs of FileChunks (`path`
relative to the folder). `zip_stream` turns that stream into zip bytes without holding a file in
memory or on disk: zipfile writes to an unseekable sink (data descriptors after each entry), so a
merged checkpoint of gigabytes streams like a 100 kB adapter.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Iterator
from pathlib import PurePosixPath

from rlvr.v1 import common_pb2 as C


class _Sink:
    """A write-only file: zipfile writes into it, the generator takes the bytes out."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def safe_name(path: str) -> str:
    """A chunk's relative path as a zip entry name; refuses absolute paths and `..`."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts:
        raise ValueError(f"refusing the file name {path!r} from the server")
    return pure.as_posix()


def zip_stream(chunks: Iterable[C.FileChunk], folder: str) -> Iterator[bytes]:
    """The files of a FileChunk stream as a zip whose entries sit under `folder/`."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        entry = None
        current = ""
        for chunk in chunks:
            if chunk.path != current or entry is None:
                if entry is not None:
                    entry.close()
                current = chunk.path
                entry = archive.open(f"{folder}/{safe_name(chunk.path)}", "w", force_zip64=True)
            entry.write(chunk.data)
            if chunk.last:
                entry.close()
                entry = None
            data = sink.take()
            if data:
                yield data
        if entry is not None:
            entry.close()
    yield sink.take()
