"""Where remote environments are: the setting ``remote_environments`` (also RLVR_REMOTE_ENVIRONMENTS
for every service, rlvr.common.settings.SHARED_ENV_FIELDS) mapping a key to a server of the user's
own that implements rlvr.v1.EnvironmentService (rlvr.environments.remote calls it), the way the
reward service's ``remote_rewards`` maps keys to reward servers.

A service that runs episodes adds `RemoteEnvironmentFields` to its settings; any other process
reads `EnvironmentSettings()` (the environment variable alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rlvr.environments.base import KEY_RE, KEY_RULE

__all__ = ["EnvironmentSettings", "RemoteEnvironmentFields", "RemoteEnvironmentSettings"]


class RemoteEnvironmentSettings(BaseModel):
    """An environment served by a service of the user's own (any language) that implements
    rlvr.v1.EnvironmentService (protos/rlvr/v1/environment.proto); rlvr.environments.remote calls
    it. The mapping is the operator's: a job names the key, never an address."""

    model_config = ConfigDict(extra="forbid")

    address: str
    """HOST:PORT of the remote environment server."""
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    """Deadline of each call to it (Describe, Reset, Step, Finish, Close); CallTool has the tool
    time limit instead."""
    tool_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    """Deadline of one CallTool when its Describe declares none."""
    wait_seconds: float = Field(default=10.0, ge=0, le=3600)
    """How long Describe (at start) and Reset (an episode's first call) ride over it being
    unreachable, retrying with backoff, before they fail naming it. Calls inside an episode are
    never retried: a server gone mid-episode ends that episode."""
    tls_ca_file: Path | None = None
    """Set: call it over TLS, trusting this CA (PEM)."""
    token_file: Path | None = None
    """A file holding the bearer token it expects (sent as `authorization: Bearer <token>`)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        host, _, port = value.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not HOST:PORT")
        return value.strip()


class RemoteEnvironmentFields(BaseSettings):
    """The remote environments of a process that runs episodes (the trainer, the benchmark service;
    `EnvironmentSettings` for any other)."""

    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    remote_environments: Annotated[dict[str, RemoteEnvironmentSettings], NoDecode] = Field(default_factory=dict)
    """Environments served by other services: a JSON object {"<key>": "HOST:PORT"} or
    {"<key>": {"address": "HOST:PORT", "timeout_seconds": 30, "token_file": ..., ...}} (see
    docs/design.md, "The contract"); also RLVR_REMOTE_ENVIRONMENTS for every service."""

    @field_validator("remote_environments", mode="before")
    @classmethod
    def _remote_environments_json(cls, value: Any) -> Any:
        if isinstance(value, str | bytes):  # RLVR_REMOTE_ENVIRONMENTS reaches here unparsed
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as e:
                raise ValueError(f"not a JSON object ({e.msg})") from None
        if isinstance(value, dict):  # "HOST:PORT" alone is {"address": "HOST:PORT"}
            return {k: {"address": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("remote_environments")
    @classmethod
    def _remote_environment_keys(
        cls, value: dict[str, RemoteEnvironmentSettings]
    ) -> dict[str, RemoteEnvironmentSettings]:
        for key in value:
            if not KEY_RE.match(key):
                raise ValueError(f"remote environment key {key!r} is not allowed ({KEY_RULE})")
        return value


class EnvironmentSettings(RemoteEnvironmentFields):
    """The remote environments from the environment alone (RLVR_REMOTE_ENVIRONMENTS), for a
    process without service settings of its own (a script, the job process)."""

    model_config = SettingsConfigDict(env_prefix="RLVR_", extra="ignore", use_attribute_docstrings=True)
