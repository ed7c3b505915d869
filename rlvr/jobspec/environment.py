"""The job's environment checked against the environments this process knows."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rlvr.common.errors import FailedPrecondition, InvalidArgument, Violations, out_of_range, shown
from rlvr.environments.base import KEY_RE as ENVIRONMENT_KEY_RE
from rlvr.environments.base import KEY_RULE as ENVIRONMENT_KEY_RULE
from rlvr.environments.base import EnvironmentInfo
from rlvr.jobspec.fields import FIELDS_BY_PATH
from rlvr.jobspec.ranges import (
    EPISODE_TOKENS_PER_TURN,
    MAX_ENVIRONMENT_SETTINGS,
    MAX_EPISODE_TOKENS,
    MAX_SETTING_CHARS,
    MAX_TURNS,
    SETTING_KEY_RE,
)
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.v1 import common_pb2


class EnvironmentCatalog(Protocol):
    """What a job's environment is checked against: the loaded environments' declarations by key,
    and why the others did not load (key -> error). rlvr/environments/registry.py's Catalog is one;
    `EnvironmentChoices` is the plain one (tests, and none at all where no registry is installed)."""

    @property
    def environments(self) -> Mapping[str, EnvironmentInfo]: ...

    @property
    def failed(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class EnvironmentChoices:
    environments: Mapping[str, EnvironmentInfo] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)


def _environment_catalog() -> EnvironmentCatalog:
    """This process's environments (rlvr/environments/registry.py's `load_registry`), imported when
    first asked; a build without the registry knows none, so any key is refused as unknown."""
    try:  # by name: this module type-checks the same before and after the registry exists
        registry = importlib.import_module("rlvr.environments.registry")
    except ImportError:
        return EnvironmentChoices()
    catalog: EnvironmentCatalog = registry.load_registry()
    return catalog


def environment_info(key: str, catalog: EnvironmentCatalog | None = None) -> EnvironmentInfo | None:
    """The declaration of the environment a (resolved) spec names; None for "" or an unknown key."""
    if not key:
        return None
    return (catalog if catalog is not None else _environment_catalog()).environments.get(key)


def _validate_environment(spec: common_pb2.JobSpec, warnings: list[str], catalog: EnvironmentCatalog | None,
                          rewards: Catalog | None, v: Violations) -> None:
    """JobSpec.environment: the key against `catalog`, the settings, and max_turns and
    max_episode_tokens filled from the environment and the per-turn cap. Without a key the other
    fields are ignored (with a warning) and the whole message is cleared: a single-answer job."""
    e = spec.environment
    if v.bad("environment"):  # over its size limit already
        return
    e.key = e.key.strip()
    if not e.key:
        ignored = [name for name, given in (("environment.settings", bool(e.settings)),
                                            ("environment.max_turns", bool(e.max_turns)),
                                            ("environment.max_episode_tokens", bool(e.max_episode_tokens))) if given]
        if ignored:
            warnings.append(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored without an "
                            "environment (environment.key is empty)")
        spec.ClearField("environment")
        return
    info: EnvironmentInfo | None = None
    if not ENVIRONMENT_KEY_RE.match(e.key):
        v.add(InvalidArgument(f"environment.key: {shown(e.key)} is not an environment key ({ENVIRONMENT_KEY_RULE})"))
    else:
        known = catalog if catalog is not None else _environment_catalog()
        info = known.environments.get(e.key)
        if info is None and e.key in known.failed:
            raise FailedPrecondition(f"environment.key: environment {e.key!r} could not be loaded: "
                                     f"{known.failed[e.key]}")
        if info is None:
            v.add(InvalidArgument(f"environment.key: {e.key!r} is not an environment; known: "
                                  f"{', '.join(sorted(known.environments)) or 'none'}"))
    e.version = info.version if info is not None else ""
    if e.max_turns == 0 and info is not None:
        e.max_turns = info.max_turns
    elif e.max_turns and not MAX_TURNS.low <= e.max_turns <= MAX_TURNS.high:
        v.add(out_of_range("environment.max_turns", e.max_turns, FIELDS_BY_PATH["environment.max_turns"].allowed()))
    per_turn = spec.grpo.max_completion_tokens
    if e.max_episode_tokens == 0 and not v.bad("grpo.max_completion_tokens"):
        e.max_episode_tokens = EPISODE_TOKENS_PER_TURN * per_turn
    elif e.max_episode_tokens and not MAX_EPISODE_TOKENS.low <= e.max_episode_tokens <= MAX_EPISODE_TOKENS.high:
        v.add(out_of_range("environment.max_episode_tokens", e.max_episode_tokens,
                           FIELDS_BY_PATH["environment.max_episode_tokens"].allowed()))
    elif e.max_episode_tokens < per_turn and not v.bad("grpo.max_completion_tokens"):
        warnings.append(f"environment.max_episode_tokens {e.max_episode_tokens} is below grpo.max_completion_tokens "
                        f"{per_turn}: an episode's first answer may be cut at {e.max_episode_tokens} tokens")
    _validate_settings(e, v, info)
    if spec.advanced.dynamic_sampling:
        v.add(InvalidArgument("advanced.dynamic_sampling: not available with an environment (environment.key "
                              f"{e.key!r}); turn it off"))
    if info is not None and info.columns and not spec.reward.dataset and not v.bad("reward"):
        # the prompts are the reward's own: they must hold the columns the environment reads
        reward = (rewards.rewards if rewards is not None else load_registry().rewards).get(spec.reward.key)
        missing = [c for c in info.columns if reward is None or c not in reward.columns]
        if reward is not None and missing:
            v.add(InvalidArgument(
                f"environment.key: {e.key!r} reads the column {missing[0]!r}, which {reward.display_name}'s own "
                f"prompts do not have (they have: {', '.join(reward.columns) or 'no other columns'}); give a "
                "reward.dataset holding it"))


def _validate_settings(e: common_pb2.EnvironmentConfig, v: Violations, info: EnvironmentInfo | None) -> None:
    if len(e.settings) > MAX_ENVIRONMENT_SETTINGS:
        v.add(out_of_range("environment.settings", f"{len(e.settings)} settings",
                           f"at most {MAX_ENVIRONMENT_SETTINGS}"))
        return
    declared = getattr(info, "settings", None)
    unknown = sorted(set(e.settings) - set(declared)) if declared is not None else []
    if unknown:
        v.add(InvalidArgument(f"environment.settings: {e.key!r} takes no setting {', '.join(map(repr, unknown))}; "
                              f"it takes: {', '.join(declared) if declared else 'none'}"))
    for key in sorted(e.settings):
        if not SETTING_KEY_RE.match(key):
            v.add(InvalidArgument(f"environment.settings: the key {shown(key)} is not allowed; use 1-64 letters, "
                                  "digits and _, starting with a letter"))
        elif len(e.settings[key]) > MAX_SETTING_CHARS:
            v.add(InvalidArgument(f"environment.settings: the value of {key!r} has {len(e.settings[key])} "
                                  f"characters, over the limit of {MAX_SETTING_CHARS}"))
