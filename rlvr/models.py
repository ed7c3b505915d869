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

A bare name (no "/", e.g. `smollm2-135m`) names the folder of that name under the model roots
(the scheduler's model_roots setting, which replaces the default $RLVR_HOME/models:
`configured_model_roots`), where `rlvr models import` puts models (rlvr.model_import). The scheduler
resolves it to that folder at CreateJob, the rollout engine and the benchmark with `bare_to_folder`;
a bare name found there nowhere is refused at once unless the hub has that model (`hub_lacks`): a
legacy hub id like `gpt2` is a bare name too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from rlvr.common.errors import InvalidArgument
from rlvr.common.settings import rlvr_home

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


def default_model_roots() -> list[Path]:
    """Where models live by default: $RLVR_HOME/models (the tiny models are built there too)."""
    return [rlvr_home() / "models"]


ROOTS_VARIABLE = "RLVR_SCHEDULER_MODEL_ROOTS"


def configured_model_roots() -> list[Path]:
    """The model roots as the scheduler has them: its model_roots setting when this process's
    environment sets it (RLVR_SCHEDULER_MODEL_ROOTS: a JSON or comma list), which replaces the
    default, else $RLVR_HOME/models."""
    value = os.environ.get(ROOTS_VARIABLE, "").strip()
    if not value:
        return default_model_roots()
    items = json.loads(value) if value.startswith("[") else value.split(",")
    return list(dict.fromkeys(Path(str(item).strip()).expanduser().absolute() for item in items if str(item).strip()))


def is_bare_name(name: str) -> bool:
    """A name with no owner and no path (`smollm2-135m`): a folder under the model roots, else a
    legacy hub id."""
    return not is_tiny(name) and not is_local_path(name) and "/" not in name and bool(_HUB_ID.match(name))


def find_local_model(name: str, model_roots: Sequence[Path]) -> Path | None:
    """The model folder (with a config.json) called `name` directly under one of `model_roots`,
    first root first; None when there is none."""
    if not is_bare_name(name):
        return None
    for root in model_roots:
        folder = Path(root).expanduser().absolute() / name
        if (folder / "config.json").is_file():
            return folder
    return None


def bare_to_folder(name: str, model_roots: Sequence[Path] | None = None) -> str:
    """The folder a bare name names under `model_roots` (default `configured_model_roots()`) when
    there is one, else `name` unchanged (a hub id, a path, a bundled model's name)."""
    if not is_bare_name(name):
        return name
    found = find_local_model(name, configured_model_roots() if model_roots is None else model_roots)
    return str(found) if found is not None else name


def local_model_names(model_roots: Sequence[Path]) -> list[str]:
    """The names of the model folders directly under `model_roots` (each root once, sorted)."""
    names: set[str] = set()
    for root in model_roots:
        try:
            names |= {d.name for d in Path(root).expanduser().iterdir()
                      if not d.name.startswith(".") and (d / "config.json").is_file()}  # .x: an import under way
        except OSError:
            continue  # a root that does not exist (yet)
    return sorted(names)


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001 (no huggingface_hub where only the scheduler runs)
        home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
        cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub")
    entry = cache / ("models--" + name.replace("/", "--"))
    return any((snapshot / "config.json").exists() for snapshot in (entry / "snapshots").glob("*"))


_HUB_PROBES: dict[tuple[str, str], tuple[float, str | None]] = {}
_HUB_PROBE_SECONDS = 60.0  # how long one answer about a model on the hub is reused


def _connect(endpoint: str, timeout: float) -> str | None:
    """Why `endpoint` refuses a TCP connection; None when it takes one (where huggingface_hub is
    not installed, as on a scheduler-only host, this is all that can be asked)."""
    parts = urlsplit(endpoint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except (OSError, ValueError) as e:
        return f"the hub ({endpoint}) is not reachable from this host ({e.strerror or e})" \
            if isinstance(e, OSError) else f"the hub's endpoint {endpoint!r} is not a URL"
    return None


def hub_lacks(name: str, timeout: float = 2.0) -> str | None:
    """Why the Hugging Face hub cannot supply model `name` to this host: HF_HUB_OFFLINE or
    TRANSFORMERS_OFFLINE is set, the hub (HF_ENDPOINT, through the environment's proxies) says it
    has no such model, or it does not answer within `timeout`; None when it has the model. Asked
    with huggingface_hub's model_info; an answer is reused for a minute, so a burst of CreateJob
    calls asks once."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"the hub is off ({variable} is set)"
    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or "https://huggingface.co"
    now = time.monotonic()
    cached = _HUB_PROBES.get((endpoint, name))
    if cached is not None and now - cached[0] < _HUB_PROBE_SECONDS:
        return cached[1]
    reason: str | None
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:
        reason = _connect(endpoint, timeout)
    else:
        try:
            HfApi(endpoint=endpoint).model_info(name, timeout=timeout)
            reason = None
        except GatedRepoError:
            reason = None  # it is there; a worker with a token may download it
        except RepositoryNotFoundError:
            reason = f"the hub ({endpoint}) has no model {name!r}"
        except Exception as e:  # noqa: BLE001 (unreachable, a proxy's refusal, a timeout, a 5xx)
            text = " ".join(str(e).split())[:200] or type(e).__name__
            reason = f"the hub ({endpoint}) did not answer from this host ({type(e).__name__}: {text})"
    for key, (at, _) in list(_HUB_PROBES.items()):  # forget old answers: names are the callers'
        if now - at >= _HUB_PROBE_SECONDS:
            _HUB_PROBES.pop(key, None)
    _HUB_PROBES[(endpoint, name)] = (now, reason)
    return reason


def check_base_model(name: str, model_roots: Sequence[Path], field: str = "base_model") -> str:
    """The name a job should carry for base model `name`: a bare name found under `model_roots`
    becomes that folder's path; anything else that passes comes back unchanged.

    InvalidArgument naming `field` unless `name` is a bundled model, a well-formed hub id, a local
    path (after ~, symlinks and ".." are resolved) inside one of `model_roots`, as a local dataset
    must be inside the data roots, or a bare name that is a folder under the roots (else the hub
    must have that model: `hub_lacks`). The roots are the server's folders: logged, never sent.

    Whether a named path holds a model is for the worker to say (it may be on another host).

    >>> check_base_model("Qwen/Qwen2.5-0.5B-Instruct", []), check_base_model("/srv/models/mine", [Path("/srv/models")])
    ('Qwen/Qwen2.5-0.5B-Instruct', '/srv/models/mine')
    """
    allowed = (f"allowed: a bundled model ({', '.join(TINY_MODELS)}), a Hugging Face hub id (owner/name: letters, "
               "digits, - _ .) or a model folder under the model roots (the scheduler's model_roots setting; "
               "default $RLVR_HOME/models), by its path or its bare name")
    if is_tiny(name):
        return name
    if "\x00" in name or not name.isprintable():
        raise InvalidArgument(f"{field}: {name!r} contains a control character; {allowed}")
    if is_local_path(name):
        path = Path(name).expanduser().resolve()
        roots = [Path(r).expanduser().resolve() for r in model_roots]
        if not any(path.is_relative_to(root) for root in roots):
            log.info("base model %r resolves to %s, outside the model roots %s", name[:200], path,
                     ", ".join(map(str, roots)))
            raise InvalidArgument(f"{field}: {name!r} is a local path outside the model roots; {allowed}")
        return name
    if not _HUB_ID.match(name) or "--" in name or ".." in name:
        raise InvalidArgument(f"{field}: {name!r} is not a hub id, a bundled model or a local path; {allowed}")
    if "/" in name:
        return name
    found = find_local_model(name, model_roots)
    if found is not None:
        return str(found)
    if _in_hub_cache(name):
        return name
    reason = hub_lacks(name)
    if reason is None:
        return name  # a legacy hub id (gpt2) the hub has: the worker downloads it
    log.info("base model %r is no folder under the model roots %s and %s", name, ", ".join(map(str, model_roots)),
             reason)
    names = local_model_names(model_roots)
    there = f"the models there: {', '.join(names[:20])}" if names else "there are none yet"
    raise InvalidArgument(
        f"{field}: {name!r} is no model folder under the model roots (the scheduler's model_roots setting, default "
        f"$RLVR_HOME/models; {there}; `rlvr models import` brings one in) and {reason}, so it cannot be "
        "downloaded either")


def resolve_model(name: str, progress: Callable[[str], None] | None = None,
                  model_roots: Sequence[Path] | None = None) -> str:
    """A path or hub id the engines can load. Installs a shipped tiny model, or builds another, the
    first time it is named; ShippedModelError naming the file when a shipped one's bits differ. A
    bare name is the folder of that name under `model_roots` (default `configured_model_roots()`)
    when there is one, else a hub id."""
    if not is_tiny(name):
        if is_local_path(name):
            return str(Path(name).expanduser())
        return bare_to_folder(name, model_roots)
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
