"""A path a client names, resolved and checked against the server's roots: the one definition.

A client may name files only inside the folders an operator allowed (the reward service's and the
benchmark's `data_roots`, the benchmark's `adapter_roots`, the trainer's artifact root, the
scheduler's `tracking_roots`). `~`, `..` and symlinks are resolved before the check, so none of
them leads out of a root; a root itself counts as inside. Each caller words its own refusal (the
field and the setting it names differ), and logs the resolved path for the operator only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def resolve(path: str | Path, base: Path | None = None) -> Path:
    """`path` with `~`, `..` and symlinks resolved; a relative path is taken from `base` when given."""
    candidate = Path(path).expanduser()
    if base is not None and not candidate.is_absolute():
        candidate = base / candidate
    return candidate.resolve()


def resolve_all(roots: Iterable[str | Path]) -> list[Path]:
    return [resolve(r) for r in roots]


def is_under(resolved: Path, roots: Iterable[Path]) -> bool:
    """Whether an already resolved path is one of `roots` (resolved) or lies below one."""
    return any(resolved == root or resolved.is_relative_to(root) for root in roots)
