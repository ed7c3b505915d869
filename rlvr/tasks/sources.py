"""Loading a dataset a user names: a local file under an allowed data root, or a hub dataset.

Every failure becomes a :class:`TaskError` that names the problem (and, for a missing column, the
columns that are there), because the reward card's Dataset field is user input and its errors go
back to the user as ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.common import paths
from rlvr.tasks.base import TaskError

log = logging.getLogger("rlvr.tasks.sources")

# Suffix -> the `datasets` builder that reads it.
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
LOCAL_FILE_SPLIT = "train"  # the one split of a single local file
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

Rows = list[dict[str, Any]]  # one dict per row; values are whatever the file holds


def looks_local(source: str) -> bool:
    """A path rather than a hub name: a known file suffix, a path prefix, or an existing file."""
    return (
        Path(source).suffix.lower() in LOCAL_FORMATS
        or source.startswith(("/", "./", "../", "~"))
        or os.path.exists(source)
    )


def resolve_local(source: str, data_roots: Sequence[str | Path]) -> Path:
    """The file's (or folder's) real path, refusing anything that is not inside one of ``data_roots``.

    Symlinks and ``..`` are resolved first, so neither can lead out of a root. A folder holds one
    file per split (``train.jsonl``, ``test.jsonl``, ...); a file is a dataset of one split.
    """
    path = paths.resolve(source)
    roots = paths.resolve_all(data_roots)
    if not roots:
        raise TaskError(f"dataset path {source!r} is not allowed: no data roots are configured")
    if not paths.is_under(path, roots):
        # The roots are the server's folders: logged for its operator, never sent to a client.
        log.info("dataset path %r resolves to %s, outside the data roots %s", source[:200], path,
                 ", ".join(map(str, roots)))
        raise TaskError(f"dataset path {source!r} is outside the allowed data roots (the server's data_roots "
                        "setting names them)")
    if path.is_dir():
        if not local_splits(path):
            raise TaskError(f"dataset folder {source!r} holds no split file (train.jsonl, test.parquet, ...; "
                            f"types {sorted(LOCAL_FORMATS)})")
        return path
    if not path.is_file():
        raise TaskError(f"dataset file {source!r} does not exist")
    if path.suffix.lower() not in LOCAL_FORMATS:
        raise TaskError(
            f"dataset file {source!r} has an unsupported type {path.suffix!r}; "
            f"use one of {sorted(LOCAL_FORMATS)}"
        )
    return path


def local_splits(path: Path) -> dict[str, Path]:
    """Split name -> file: a folder's split files by name, or a single file as the one split
    "train" (what the `datasets` library calls a file it loads without a split)."""
    if path.is_file():
        return {LOCAL_FILE_SPLIT: path}
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in LOCAL_FORMATS)
    return {p.stem: p for p in files}


def dataset_splits(source: str, data_roots: Sequence[str | Path], hub_config: str | None = None) -> list[str]:
    """The splits a dataset has: a local file's one, a local folder's files, or the hub's list."""
    if looks_local(source):
        return list(local_splits(resolve_local(source, data_roots)))
    check_hub_name(source)
    from datasets import get_dataset_split_names

    try:
        return list(get_dataset_split_names(source, hub_config))
    except Exception as exc:  # offline, unknown name, gated repo
        raise TaskError(f"hub dataset {source!r} could not be read (is the hub reachable from this machine?): "
                        f"{_short(exc)}") from exc


def check_split(source: str, split: str, splits: Sequence[str]) -> str:
    if split not in splits:
        raise TaskError(f"dataset {source!r} has no {split!r} split; its splits: {', '.join(splits)}")
    return split


def check_hub_name(source: str) -> None:
    if not _HUB_NAME.match(source):
        raise TaskError(f"dataset {source!r} is neither a data file (.jsonl, .parquet, .csv) nor a hub name "
                        "(owner/name)")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers from this machine (False at once under HF_HUB_OFFLINE)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_rows(
    source: str, split: str, data_roots: Sequence[str | Path], hub_config: str | None = None
) -> Rows:
    """Rows of a local dataset's split (a file is the one split "train") or of a hub dataset's split."""
    if looks_local(source):
        splits = local_splits(resolve_local(source, data_roots))
        return _load_local(splits[check_split(source, split, list(splits))], source)
    check_hub_name(source)
    return _load_hub(source, split, hub_config)


def peek_columns(source: str, split: str, data_roots: Sequence[str | Path]) -> list[str]:
    """The columns of a local dataset's split, read from its first row (or header) only: what
    CreateJob checks before it accepts a dataset, without loading the whole file."""
    splits = local_splits(resolve_local(source, data_roots))
    path = splits[check_split(source, split, list(splits))]
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            with path.open(encoding="utf-8") as f:
                first = next((line for line in f if line.strip()), None)
            return list(json.loads(first)) if first is not None else []
        if suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as f:
                return next(csv.reader(f), [])
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        rows = _load_local(path, source)  # .json: a list or JSON lines, as `datasets` reads it
        return list(rows[0]) if rows else []
    except (OSError, UnicodeDecodeError, ValueError, StopIteration) as exc:
        raise TaskError(f"dataset file {source!r} could not be read: {_short(exc)}") from exc


def _load_local(path: Path, source: str) -> Rows:
    from datasets import load_dataset

    try:
        dataset = load_dataset(LOCAL_FORMATS[path.suffix.lower()], data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for a bad file; all mean "unreadable"
        raise TaskError(f"dataset file {source!r} could not be read: {_short(exc)}") from exc
    return dataset.to_list()


def _load_hub(name: str, split: str, config: str | None) -> Rows:
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, config, split=split)
    except ValueError as exc:
        if "split" in str(exc).lower():
            raise TaskError(f"hub dataset {name!r} has no {split!r} split: {_short(exc)}") from exc
        raise TaskError(f"hub dataset {name!r} could not be loaded: {_short(exc)}") from exc
    except Exception as exc:  # offline, unknown name, gated repo: the user needs the cause, not a trace
        raise TaskError(
            f"hub dataset {name!r} could not be loaded (is the hub reachable from this machine?): "
            f"{_short(exc)}"
        ) from exc
    return dataset.to_list()


def require_columns(rows: Rows, columns: Sequence[str], source: str) -> None:
    """Raise a TaskError naming the missing columns and those present, or the emptiness."""
    if not rows:
        raise TaskError(f"dataset {source!r} is empty")
    present = list(rows[0].keys())
    missing = [c for c in columns if c not in present]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise TaskError(f"dataset {source!r} has no {names} column; columns present: {present}")


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/])/(?:[^\s'\",;:()\[\]]+/)+([^\s'\",;:()\[\]]*)")


def _short(exc: BaseException, limit: int = 300) -> str:
    """The cause in one line for a client: a server folder named in it (a data root, the hub
    cache under the server's home) is cut to its last part, `…/name` (the log has the whole)."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    log.info("dataset error: %s", text[:2000])
    text = _ABSOLUTE_PATH.sub(lambda m: f"…/{m.group(1)}", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
