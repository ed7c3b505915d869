"""Chunked file transfer over the contract's FileChunk, both ways and for every user: a directory
as a chunk stream (`directory_chunks`: the LoadAdapter upload of a PEFT directory, the scheduler's
DownloadAdapter and DownloadMergedModel), and a received stream written back to disk
(`save_file_chunks`), the LoadAdapter stream reassembled on the receiving side
(`AdapterUpload`), and a folder fetched from another host, checked and resumable (TrainerService
FetchFolder: `folder_chunks`, `FolderWriter`, `FolderRelay`).

Adapters and merged checkpoints never travel as one message (the channel limit is 64 MiB, and a
merged model is gigabytes): each file is a run of chunks, `path` relative to the directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from rlvr.adapters import ADAPTER_FILES
from rlvr.common.errors import InvalidArgument, out_of_range
from rlvr.v1 import common_pb2 as cm
from rlvr.v1 import rollout_pb2 as ro
from rlvr.v1 import trainer_pb2 as tr

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


# ---------------------------------------------------------------------------- folders between hosts
#
# TrainerService/FetchFolder: a folder under a worker's artifact root sent to another host (the
# scheduler relaying DownloadAdapter, a worker fetching an init_adapter or a resumed job's folder,
# the benchmark an adapter to evaluate). Each chunk carries its file's sha256; the caller names the
# files it holds (skipped when the digest matches) and the file it holds the start of (resumed
# there), so a broken transfer goes on where it stopped. `folder_chunks` is the sending side,
# `FolderWriter` the receiving one that writes to disk, `FolderRelay` one that passes the chunks
# on (the scheduler's relay) and can still resume.

PARTIAL_DIR = ".partial"
"""Under a `FolderWriter` destination: the file being received, at its relative path, until its
last chunk is checked and it is renamed into place. Hidden, so `list_files` skips it."""


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK_SIZE):
            digest.update(block)
    return digest.hexdigest()


def folder_chunks(
    directory: str | os.PathLike[str], files: Sequence[str] | None = None, have: Mapping[str, str] | None = None,
    resume_path: str = "", resume_offset: int = 0, chunk_size: int = CHUNK_SIZE,
) -> Iterator[cm.FileChunk]:
    """`directory` as a FetchFolder stream: `directory_chunks`'s, each chunk with its file's sha256;
    a file whose digest is `have[path]` is one empty chunk at offset = file_size (last), and
    `resume_path` starts at `resume_offset`. The listing and the digests are worked out when this is
    called (FileNotFoundError, InvalidArgument for a resume point that is no file's), not when the
    stream is first read."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: {chunk_size} must be > 0")
    have = have or {}
    listed = [(rel, path, path.stat().st_size, file_sha256(path)) for rel, path in list_files(directory, files)]
    if resume_path:
        size = next((s for rel, _, s, _ in listed if rel == resume_path), None)
        if size is None:
            raise InvalidArgument(f"resume_path: {resume_path!r} is not a file of the folder")
        if not 0 <= resume_offset <= size:
            raise out_of_range("resume_offset", resume_offset, f"0..{size} (the size of {resume_path})")

    def chunks() -> Iterator[cm.FileChunk]:
        for rel, path, size, sha in listed:
            if have.get(rel) == sha:
                yield cm.FileChunk(path=rel, offset=size, file_size=size, last=True, sha256=sha)
                continue
            offset = resume_offset if rel == resume_path else 0
            with path.open("rb") as f:
                f.seek(offset)
                while True:
                    data = f.read(chunk_size)
                    last = offset + len(data) >= size or not data
                    yield cm.FileChunk(path=rel, offset=offset, data=data, file_size=size, last=last, sha256=sha)
                    offset += len(data)
                    if last:
                        break

    return chunks()


class FolderRelay:
    """A FetchFolder stream passed on as it comes (the scheduler's DownloadAdapter relay), which
    knows where to resume: `request()` is the call to make, at first and again after a broken
    stream; `accept(chunk)` says whether the chunk is new (to pass on) or a file passed on already."""

    def __init__(self, path: str, files: Sequence[str] | None = None) -> None:
        self.path = path
        self.files = list(files or ())
        self.done: dict[str, str] = {}  # relative path -> sha256, of the files passed on whole
        self.current: tuple[str, int] = ("", 0)  # the file being passed on, and the bytes so far

    def request(self) -> tr.FetchFolderRequest:
        rel, offset = self.current
        return tr.FetchFolderRequest(path=self.path, files=self.files, resume_path=rel, resume_offset=offset,
                                     have=[tr.FileDigest(path=p, sha256=s) for p, s in self.done.items()])

    def accept(self, chunk: cm.FileChunk) -> bool:
        if chunk.path in self.done:
            return False  # sent before the break; the worker confirms it unchanged
        end = chunk.offset + len(chunk.data)
        self.current = ("", 0) if chunk.last else (chunk.path, end)
        if chunk.last:
            self.done[chunk.path] = chunk.sha256
        return True


class FolderWriter:
    """The receiving side of FetchFolder, onto disk: `request()` names the files `directory`
    holds (their digests) and the partial file it was receiving when a stream broke, `add(chunk)`
    writes each chunk (a file is renamed into place once its last chunk came and its sha256
    matched), `finish()` clears the partial folder. Raises ValueError for a chunk whose path leaves
    the directory, that does not follow on from what was written, or a file whose digest is wrong
    (its partial copy is removed: the next request sends it whole)."""

    def __init__(self, directory: str | os.PathLike[str], path: str, files: Sequence[str] | None = None) -> None:
        self.root = Path(directory).resolve()
        self.path = path
        self.files = list(files or ())
        self.received: list[str] = []  # the files written (not those the folder held already)
        self.listing: list[str] = []  # every file the stream named, in order

    def _target(self, rel: str, base: Path) -> Path:
        target = (base / rel).resolve()
        if not rel or not target.is_relative_to(base) or target == base:
            raise ValueError(f"chunk path {rel!r} is outside {base}")
        return target

    def _partials(self) -> list[tuple[str, Path]]:
        partial = self.root / PARTIAL_DIR
        return [(p.relative_to(partial).as_posix(), p) for p in sorted(partial.rglob("*")) if p.is_file()]

    def request(self) -> tr.FetchFolderRequest:
        have = []
        if self.root.is_dir():
            for rel, path in list_files(self.root, None):
                if not self.files or rel in self.files:
                    have.append(tr.FileDigest(path=rel, sha256=file_sha256(path)))
        request = tr.FetchFolderRequest(path=self.path, files=self.files, have=have)
        partials = self._partials()
        if len(partials) == 1:
            request.resume_path, request.resume_offset = partials[0][0], partials[0][1].stat().st_size
        elif partials:  # not written by one stream: start those files again
            shutil.rmtree(self.root / PARTIAL_DIR, ignore_errors=True)
        return request

    def add(self, chunk: cm.FileChunk) -> None:
        target = self._target(chunk.path, self.root)
        if chunk.path not in self.listing:
            self.listing.append(chunk.path)
            # A new file: a partial one left by a stream broken earlier, if any, is not resumed.
            for _, other in self._partials():
                if other != self._target(chunk.path, self.root / PARTIAL_DIR):
                    other.unlink()
        if chunk.last and not chunk.data and chunk.offset == chunk.file_size and chunk.file_size and target.is_file():
            return  # held already with that digest
        partial = self._target(chunk.path, self.root / PARTIAL_DIR)
        size = partial.stat().st_size if partial.is_file() else 0
        if chunk.offset != size:
            raise ValueError(f"chunk of {chunk.path} at offset {chunk.offset}, but {size} bytes are written")
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("ab") as f:
            f.write(chunk.data)
        if not chunk.last:
            return
        if chunk.sha256 and file_sha256(partial) != chunk.sha256:
            partial.unlink()
            raise ValueError(f"{chunk.path}: the sha256 of the received file differs from the sender's")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
        self.received.append(chunk.path)

    def finish(self) -> None:
        shutil.rmtree(self.root / PARTIAL_DIR, ignore_errors=True)
