"""Base model names: a hub id, a local path, or one of the project's own tiny models.

`rlvr-tiny` (and `rlvr-tiny-test` and `rlvr-tiny-small`, seconds-to-build variants for tests: the
first earns no reward, the second writes the answer format and gets a few percent right) and
`rlvr-tiny-headroom` (whole-number tokens, a warm-up built and gated for RL headroom) name the
bundled tiny models. `rlvr-tiny-headroom`, the demo's, ships built with rlvr (rlvr.tiny.shipped: a
build's bits differ by CPU vendor) and is installed under $RLVR_HOME/models on first use, each file
checked against the manifest on every use; the others are built there on first use and reused
afterwards. Every service resolves names through `resolve_model`, so a job spec, the rollout server
and the benchmark agree on what "rlvr-tiny" means. A file lock keeps two services starting together
from building or installing one twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from rlvr.common.errors import InvalidArgument

log = logging.getLogger(__name__)

TINY_MODELS = {"rlvr-tiny": "default", "rlvr-tiny-test": "test", "rlvr-tiny-small": "small",
               "rlvr-tiny-headroom": "headroom", "rlvr-tiny-tools": "tools"}
# A Hugging Face hub id: [owner/]name, each part 1-96 letters, digits, "-", "_" or ".", starting and
# ending with a letter or digit, no "--" or ".." (the hub's own rule).
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")


def is_tiny(name: str) -> bool:
    return name in TINY_MODELS


def is_local_path(name: str) -> bool:
    """A base model named by a folder (absolute, relative or under ~) rather than a hub id."""
    return name.startswith(("~", ".", "/"))


def check_base_model(name: str, model_roots: Sequence[Path], field: str = "base_model") -> None:
    """InvalidArgument naming `field` unless `name` is a bundled model, a well-formed hub id or a
    local path (after ~, symlinks and ".." are resolved) inside one of `model_roots`, as a local
    dataset must be inside the data roots. The roots are the server's folders: logged, never sent.

    Whether the folder holds a model is for the worker to say (it may be on another host).

    >>> check_base_model("Qwen/Qwen2.5-0.5B-Instruct", []), check_base_model("/srv/models/mine", [Path("/srv/models")])
    (None, None)
    """
    allowed = (f"allowed: a bundled model ({', '.join(TINY_MODELS)}), a Hugging Face hub id (owner/name: letters, "
               "digits, - _ .) or a model folder under the model roots (the scheduler's model_roots setting; "
               "default $RLVR_HOME/models)")
    if is_tiny(name):
        return
    if "\x00" in name or not name.isprintable():
        raise InvalidArgument(f"{field}: {name!r} contains a control character; {allowed}")
    if is_local_path(name):
        path = Path(name).expanduser().resolve()
        roots = [Path(r).expanduser().resolve() for r in model_roots]
        if not any(path.is_relative_to(root) for root in roots):
            log.info("base model %r resolves to %s, outside the model roots %s", name[:200], path,
                     ", ".join(map(str, roots)))
            raise InvalidArgument(f"{field}: {name!r} is a local path outside the model roots; {allowed}")
        return
    if not _HUB_ID.match(name) or "--" in name or ".." in name:
        raise InvalidArgument(f"{field}: {name!r} is not a hub id, a bundled model or a local path; {allowed}")


def resolve_model(name: str, progress: Callable[[str], None] | None = None) -> str:
    """A path or hub id the engines can load. Installs a shipped tiny model, or builds another, the
    first time it is named; ShippedModelError naming the file when a shipped one's bits differ."""
    if not is_tiny(name):
        return str(Path(name).expanduser()) if is_local_path(name) else name
    from filelock import FileLock

    from rlvr.tiny import build_tiny_model, default_model_dir
    from rlvr.tiny.shipped import install_shipped, is_shipped

    out = default_model_dir(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if is_shipped(name):
            return str(install_shipped(name, out, progress=progress))
        report = build_tiny_model(out, size=TINY_MODELS[name], progress=progress)
    return str(report.path)
