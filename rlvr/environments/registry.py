"""The environment registry: every environment an episode can run in, built-in or plugin, declared once.

As the reward registry (rlvr/rewards/registry.py): an environment is an `EnvironmentDefinition`
found through the entry-point group ``rlvr.environments``; the built-ins are entry points of rlvr's
own distribution (``pyproject.toml``), a plugin is any installed package that declares one::

    [project.entry-points."rlvr.environments"]
    wordle = "my_envs:WORDLE"      # an EnvironmentDefinition, e.g. made by @environment

The entry point's name is the key. A plugin that fails to import, declares something else or a key
another environment has, is logged once and listed in ``failed`` with why; the others load.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata

from rlvr.environments.base import EnvironmentDefinition, EnvironmentInfo

log = logging.getLogger("rlvr.environments")

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "Catalog", "Registry", "UnavailableEnvironment",
           "UnknownEnvironment", "clear_cache", "discover", "get_environment", "load_registry"]

ENTRY_POINT_GROUP = "rlvr.environments"
BUILTIN_DISTRIBUTION = "rlvr"
# The built-ins, as pyproject.toml declares them (a test keeps the two equal). Read from here only when
# the installed rlvr predates them (an editable install made before they were added): its metadata
# then has no entry point of this group, and `make install` brings them.
BUILTINS = {
    "calculator": "rlvr.environments.builtin.calculator:ENVIRONMENT",
    "code_run": "rlvr.environments.builtin.code_run:ENVIRONMENT",
    "guess_number": "rlvr.environments.builtin.guess_number:ENVIRONMENT",
    "calculator_agent": "rlvr.agents.builtin.calculator:calculator_agent",
}


class UnknownEnvironment(LookupError):
    """No environment has this key; the message lists the known ones."""


class UnavailableEnvironment(LookupError):
    """An environment of this key exists but could not be loaded; the message is its error."""


@dataclass(frozen=True)
class Catalog:
    """The environments that loaded (declarations, by key) and why the others did not (key -> error):
    what ListEnvironments answers and a job naming an environment is checked against."""

    environments: Mapping[str, EnvironmentInfo]
    failed: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> EnvironmentInfo:
        try:
            return self.environments[key]
        except KeyError:
            if key in self.failed:
                raise UnavailableEnvironment(f"environment {key!r} could not be loaded: {self.failed[key]}") \
                    from None
            known = ", ".join(sorted(self.environments)) or "none"
            raise UnknownEnvironment(f"{key!r} is not an environment; known: {known}") from None

    def infos(self) -> list[EnvironmentInfo]:
        """The loaded environments' declarations (no code), by key."""
        return [_info(self.environments[k]) for k in sorted(self.environments)]


def _info(env: EnvironmentInfo) -> EnvironmentInfo:
    return env.info() if isinstance(env, EnvironmentDefinition) else env


@dataclass(frozen=True)
class Registry(Catalog):
    """The environments of this process, with their code."""

    environments: Mapping[str, EnvironmentDefinition]  # narrower: the definitions

    def get(self, key: str) -> EnvironmentDefinition:
        return super().get(key)  # type: ignore[return-value]  # every entry is an EnvironmentDefinition

    def catalog(self) -> Catalog:
        """The declarations alone (what another process is told)."""
        return Catalog({i.key: i for i in self.infos()}, dict(self.failed))


def _source(entry: metadata.EntryPoint) -> str:
    dist = entry.dist
    if dist is None or dist.metadata["Name"] == BUILTIN_DISTRIBUTION:
        return "built-in"
    return f"plugin {dist.metadata['Name']} {dist.version}"


def _entry_points() -> list[metadata.EntryPoint]:
    entries = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    if not any(_source(e) == "built-in" for e in entries):
        log.warning("rlvr's own environments are not registered (entry-point group %r): the installed rlvr "
                    "predates them; using its built-in list (reinstall rlvr: make install)", ENTRY_POINT_GROUP)
        entries += [metadata.EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTINS.items()]
    return entries


def discover() -> Registry:
    """Loads every environment of the entry-point group, now (no cache: see `load_registry`)."""
    environments: dict[str, EnvironmentDefinition] = {}
    failed: dict[str, str] = {}
    for entry in sorted(_entry_points(), key=lambda e: (_source(e) != "built-in", e.name)):
        source = _source(entry)
        try:
            loaded = entry.load()
            loaded = getattr(loaded, "__rlvr_environment__", loaded)  # an agent function (rlvr.agents.agent)
            if not isinstance(loaded, EnvironmentDefinition):
                raise TypeError(f"{entry.value} is a {type(loaded).__name__}, not an EnvironmentDefinition "
                                "(declare it with rlvr.environments.environment or EnvironmentDefinition)")
            if loaded.key != entry.name:
                raise ValueError(f"entry point {entry.name!r} declares the environment key {loaded.key!r}; "
                                 "they must match")
            if loaded.key in environments:
                raise ValueError(f"the key {loaded.key!r} is taken by {environments[loaded.key].source}")
        except Exception as exc:  # a broken plugin never takes the others down
            error = f"{source} ({entry.value}): {type(exc).__name__}: {exc}"
            log.error("environment %r not loaded: %s", entry.name, error)
            failed.setdefault(entry.name, error)
            continue
        environments[loaded.key] = replace(loaded, source=source)
    return Registry(environments, failed)


_cache: list[Registry] = []
_remote: dict[str, EnvironmentDefinition] = {}  # remote environments described once
_remote_failed: dict[str, tuple[float, str]] = {}  # key -> (when, why) of its last failed Describe
_cache_lock = threading.Lock()
REMOTE_RETRY_SECONDS = 30.0  # a remote environment that could not be described is asked again after this


def with_remote(registry: Registry, remote: Mapping[str, object]) -> Registry:
    """`registry` with the remote environments mapped in settings (key -> RemoteEnvironmentSettings,
    rlvr/environments/settings.py): each described by its server once; one that cannot be described
    now (down, garbage) is listed as failed with its one-line error and asked again next time, so a
    server started later is found without a restart. A key the installed environments have is
    refused."""
    from rlvr.environments.remote import remote_definitions

    environments, failed = dict(registry.environments), dict(registry.failed)
    now = time.monotonic()
    with _cache_lock:
        missing = {key: entry for key, entry in remote.items() if key not in _remote
                   and now - _remote_failed.get(key, (-math.inf, ""))[0] >= REMOTE_RETRY_SECONDS}
    # Described outside the lock: a server that is down is waited for (its wait_seconds) by this
    # caller only, and remembered as failed for REMOTE_RETRY_SECONDS, so the next callers do not wait.
    found, errors = remote_definitions(missing) if missing else ([], {})  # type: ignore[arg-type]
    with _cache_lock:
        _remote.update({d.key: d for d in found})
        for definition in found:
            _remote_failed.pop(definition.key, None)
        _remote_failed.update({key: (now, error) for key, error in errors.items()})
        for key in remote:
            if key in environments:
                failed[key] = f"remote environment {key!r}: the key is taken by {environments[key].source}"
            elif key in _remote:
                environments[key] = _remote[key]
            else:
                failed[key] = _remote_failed.get(key, (0.0, f"remote environment {key!r} was not described"))[1]
    return Registry(environments, failed)


def load_registry() -> Registry:
    """The process's registry: the installed environments, loaded once (entry points do not change
    while a process runs), and those mapped to remote servers (RLVR_REMOTE_ENVIRONMENTS)."""
    from rlvr.environments.settings import EnvironmentSettings

    with _cache_lock:
        if not _cache:
            _cache.append(discover())
        installed = _cache[0]
    remote = EnvironmentSettings().remote_environments
    return with_remote(installed, remote) if remote else installed


def clear_cache() -> None:
    """Forget the loaded registry (a process that installed a plugin while running; tests)."""
    with _cache_lock:
        _cache.clear()
        _remote.clear()
        _remote_failed.clear()
    metadata_cache = getattr(metadata, "_cache_clear", None)
    if callable(metadata_cache):
        metadata_cache()


def get_environment(key: str) -> EnvironmentDefinition:
    """An environment of this process's registry by key (UnknownEnvironment / UnavailableEnvironment)."""
    return load_registry().get(key)
