"""Settings of the reward service (stateless scoring, the task data, and the rewards it offers)."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import DEFAULT_PORTS, DataRootFields, ServiceSettings, port_field, rlvr_home
from rlvr.rewards.registry import DEFAULT_INSTRUCTION, KEY_RE, KEY_RULE

ALL_PLUGINS = "*"


class RemoteReward(BaseModel):
    """A reward served by a service of the user's own (any language) that implements
    rlvr.v1.RewardService/Score for its key. The declaration is the operator's: a client names the
    key, never an address."""

    model_config = ConfigDict(extra="forbid")

    address: str
    """HOST:PORT of the remote reward server."""
    display_name: str = ""
    description: str = ""
    needs_dataset: bool = True
    columns: list[str] = Field(default_factory=list)
    """Dataset columns it reads besides prompt and ground_truth."""
    instruction: str = DEFAULT_INSTRUCTION
    default_benchmark: str = ""
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    """Deadline of one Score call to it (the whole batch)."""
    wait_seconds: float = Field(default=60.0, ge=0, le=3600)
    """How long a call rides over it being unreachable (retrying with backoff) before it answers
    UNAVAILABLE naming it."""
    tls_ca_file: Path | None = None
    """Set: call it over TLS, trusting this CA (PEM)."""
    token_file: Path | None = Field(default=None)
    """A file holding the bearer token it expects (sent as `authorization: Bearer <token>`)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        host, _, port = value.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not HOST:PORT")
        return value.strip()


class RewardSettings(DataRootFields, ServiceSettings):
    service_name = "reward"
    model_config = SettingsConfigDict(env_prefix="RLVR_REWARD_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(DEFAULT_PORTS["reward"])
    """gRPC port of the reward service."""
    timeout_seconds: float = Field(default=0.5, gt=0, le=10)
    """Default hard time limit for scoring one completion (a request may ask for another; a reward
    may declare a longer one it needs, e.g. the code reward's test run)."""
    max_batch: int = Field(default=100_000, ge=1, le=1_000_000)
    """Most completions one Score call may carry."""
    workers: int = Field(default=0, ge=0, le=64)
    """Scoring processes (0 = one per core, at most 4)."""
    plugins: list[str] = Field(default_factory=lambda: [ALL_PLUGINS])
    """The reward plugins to load, by key (JSON list or comma list; "*" = every installed one,
    entry-point group `rlvr.rewards`). The built-in rewards always load."""
    remote_rewards: dict[str, RemoteReward] = Field(default_factory=dict)
    """Rewards served by other services: a JSON object {"<key>": {"address": "HOST:PORT", ...}} (see
    docs/rewards.md for every setting of one)."""

    head_roots: list[Path] = Field(default_factory=lambda: [rlvr_home() / "stack" / "artifacts"])
    """Artifact roots whose Head jobs' adapters (<root>/jobs/<id>/adapter) this service scores with, each by
    the reward key head_<job id> (JSON list or comma list; docs/head.md). Default: the local stack's."""

    @field_validator("remote_rewards")
    @classmethod
    def _remote_keys(cls, value: dict[str, RemoteReward]) -> dict[str, RemoteReward]:
        for key in value:
            if not KEY_RE.match(key):
                raise ValueError(f"remote reward key {key!r} is not allowed ({KEY_RULE})")
        return value

    def allowed_plugins(self) -> list[str] | None:
        """The keys for rlvr.rewards.registry.discover (None = every installed plugin)."""
        return None if ALL_PLUGINS in self.plugins else list(self.plugins)
