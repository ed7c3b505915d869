"""An S3-compatible object store for artifacts (boto3: AWS S3, MinIO, Ceph, any S3 endpoint), used
when one is configured (`artifact_store` = "s3://BUCKET/PREFIX", with `artifact_store_endpoint` for
a server other than AWS): the trainer worker puts each job's final adapter there, and each merged
model; the scheduler's DownloadAdapter and DownloadMergedModel read it from there before asking the
worker (TrainerService.FetchFolder), so a download outlives the worker that wrote the folder.

A folder is stored under "<prefix>/<key>/<file>", the key being its path under the artifact root
("jobs/<id>/adapter", "merged/<name>"), each object with its sha256 in the metadata (an unchanged
file is not put again), then "<key>/.manifest.json" (every file, its size and sha256), written last:
a folder without its manifest is incomplete and is not read. Reads come as FileChunk streams like
FetchFolder's (each chunk with its file's sha256, ranged GETs of CHUNK_SIZE). Credentials come from
boto3's own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role): none is
a setting. boto3 is optional (`pip install 'rlvr[s3]'`), imported when a store is first used.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.transfer import CHUNK_SIZE, file_sha256, list_files
from rlvr.v1 import common_pb2 as cm

log = logging.getLogger("rlvr.objectstore")

MANIFEST = ".manifest.json"


class StoreError(Exception):
    """The object store failed a call (unreachable, refused, a missing object)."""


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the folder
    size: int
    sha256: str


class ObjectStore:
    def __init__(self, url: str, endpoint: str = "", client: Any = None) -> None:
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise ValueError(f"artifact_store: {url!r} is not an s3://BUCKET[/PREFIX] URL")
        bucket, _, prefix = url[5:].partition("/")
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = endpoint
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint or None)
        return self._client

    def _key(self, key: str, rel: str = "") -> str:
        parts = [p for p in (self.prefix, key.strip("/"), rel) if p]
        return "/".join(parts)

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"{what} {self.url}: {e}") from None

    def put_folder(self, folder: str | os.PathLike[str], key: str, files: Sequence[str] | None = None) -> int:
        """Puts the folder's files (`list_files`) under `key`, then its manifest; returns the bytes
        put (files the store holds with the same sha256 are not put again)."""
        put = 0
        manifest: list[StoredFile] = []
        for rel, path in list_files(folder, files):
            sha, size = file_sha256(path), path.stat().st_size
            manifest.append(StoredFile(rel, size, sha))
            if self._stored_sha(key, rel) == sha:
                continue
            with path.open("rb") as body:
                self._call("put", self.client.put_object, Key=self._key(key, rel), Body=body,
                           Metadata={"sha256": sha})
            put += size
        listing = json.dumps({"files": [f.__dict__ for f in manifest]}).encode()
        self._call("put", self.client.put_object, Key=self._key(key, MANIFEST), Body=listing)
        log.info("put %s under %s/%s (%d bytes new)", folder, self.url, key, put)
        return put

    def _stored_sha(self, key: str, rel: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key, rel))
        except ClientError:
            return None
        return str(head.get("Metadata", {}).get("sha256", "")) or None

    def manifest(self, key: str) -> list[StoredFile] | None:
        """The folder's files as its manifest lists them; None when the store has no whole folder there."""
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key, MANIFEST))["Body"].read()
        except ClientError:
            return None
        return [StoredFile(**f) for f in json.loads(body)["files"]]

    def chunks(self, key: str, files: Sequence[str] | None = None, chunk_size: int = CHUNK_SIZE
               ) -> Iterator[cm.FileChunk]:
        """The stored folder as a FileChunk stream (FetchFolder's shape: each chunk with its file's
        sha256). Raises StoreError when the folder (or a file asked for) is not stored whole, before
        anything is read."""
        manifest = self.manifest(key)
        if manifest is None:
            raise StoreError(f"no folder {key} in {self.url}")
        by_path = {f.path: f for f in manifest}
        wanted = [by_path[p] for p in files if p in by_path] if files is not None else manifest
        if files is not None and len(wanted) != len(files):
            raise StoreError(f"folder {key} in {self.url} lacks {', '.join(p for p in files if p not in by_path)}")

        def read() -> Iterator[cm.FileChunk]:
            for f in wanted:
                offset = 0
                while True:
                    end = min(offset + chunk_size, f.size) - 1
                    data = b"" if f.size == 0 else self._call(
                        "get", self.client.get_object, Key=self._key(key, f.path),
                        Range=f"bytes={offset}-{end}")["Body"].read()
                    last = offset + len(data) >= f.size
                    yield cm.FileChunk(path=f.path, offset=offset, data=data, file_size=f.size, last=last,
                                       sha256=f.sha256)
                    offset += len(data)
                    if last:
                        break

        return read()


def store_key(root: Path, folder: str | os.PathLike[str]) -> str:
    """A folder's key in the store: its path under the artifact root ("jobs/<id>/adapter")."""
    return Path(folder).resolve().relative_to(root.resolve()).as_posix()


def object_store(url: str, endpoint: str = "") -> ObjectStore | None:
    """The configured store, or None when `url` is empty."""
    return ObjectStore(url, endpoint) if url else None
