"""Base model names: a hub id, a local path, or one of the project's own tiny models.

`rlvr-tiny` (and `rlvr-tiny-test` and `rlvr-tiny-small`, seconds-to-build variants for tests: the
first earns no reward, the second writes the answer format and gets a few percent right) name the
bundled tiny models: they are built on first use under $RLVR_HOME/models and reused afterwards. Every service resolves
names through `resolve_model`, so a job spec, the rollout server and the benchmark agree on what
"rlvr-tiny" means. A file lock keeps two services starting together from building it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TINY_MODELS = {"rlvr-tiny": "default", "rlvr-tiny-test": "test", "rlvr-tiny-small": "small"}


def is_tiny(name: str) -> bool:
    return name in TINY_MODELS


def is_local_path(name: str) -> bool:
    """A base model named by a folder (absolute, relative or under ~) rather than a hub id."""
    return name.startswith(("~", ".", "/"))


def resolve_model(name: str, progress: Callable[[str], None] | None = None) -> str:
    """A path or hub id the engines can load. Builds a tiny model the first time it is named."""
    if not is_tiny(name):
        return str(Path(name).expanduser()) if is_local_path(name) else name
    from filelock import FileLock

    from rlvr.tiny import build_tiny_model, default_model_dir

    out = default_model_dir(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        report = build_tiny_model(out, size=TINY_MODELS[name], progress=progress)
    return str(report.path)
