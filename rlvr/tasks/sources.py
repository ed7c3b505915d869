"""Loading a dataset a user names: a local file under an allowed data root, or a hub dataset.

Every failure becomes a :class:`TaskError` that names the problem (and, for a missing column, the
columns that are there), because the reward card's Dataset field is user input and its errors go
back to the user as ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.tasks.base import Split, TaskError

# Suffix -> the `datasets` builder that reads it.
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
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
    """The file's real path, refusing anything that is not inside one of ``data_roots``.

    Symlinks and ``..`` are resolved first, so neither can lead out of a root.
    """
    path = Path(source).expanduser().resolve()
    roots = [Path(r).expanduser().resolve() for r in data_roots]
    if not roots:
        raise TaskError(f"dataset path {source!r} is not allowed: no data roots are configured")
    if not any(path.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise TaskError(f"dataset path {source!r} is outside the allowed data roots ({allowed})")
    if not path.is_file():
        raise TaskError(f"dataset file {source!r} does not exist")
    if path.suffix.lower() not in LOCAL_FORMATS:
        raise TaskError(
            f"dataset file {source!r} has an unsupported type {path.suffix!r}; "
            f"use one of {sorted(LOCAL_FORMATS)}"
        )
    return path


def load_rows(
    source: str, split: Split, data_roots: Sequence[str | Path], hub_config: str | None = None
) -> Rows:
    """Rows of a local file (the whole file, whatever the split) or of a hub dataset's split."""
    if looks_local(source):
        path = resolve_local(source, data_roots)
        return _load_local(path, source)
    if not _HUB_NAME.match(source):
        raise TaskError(f"dataset {source!r} is neither a data file (.jsonl, .parquet, .csv) nor a hub name")
    return _load_hub(source, split, hub_config)


def _load_local(path: Path, source: str) -> Rows:
    from datasets import load_dataset

    try:
        dataset = load_dataset(LOCAL_FORMATS[path.suffix.lower()], data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for a bad file; all mean "unreadable"
        raise TaskError(f"dataset file {source!r} could not be read: {_short(exc)}") from exc
    return dataset.to_list()


def _load_hub(name: str, split: Split, config: str | None) -> Rows:
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


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
