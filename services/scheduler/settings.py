"""Settings of the scheduler service (the public API, the store, dispatch)."""

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import (
    DEFAULT_PORTS,
    STARTS_IN,
    ArtifactFields,
    DataRootFields,
    NatsFields,
    ServiceSettings,
    StoreFields,
    described_field,
    local_address,
    port_field,
    rlvr_home,
)


class SchedulerSettings(NatsFields, StoreFields, ArtifactFields, DataRootFields, ServiceSettings):
    service_name = "scheduler"
    model_config = SettingsConfigDict(env_prefix="RLVR_SCHEDULER_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(DEFAULT_PORTS["scheduler"])
    """gRPC port of the public API."""
    trainer_addresses: list[str] = Field(default_factory=lambda: [local_address("trainer")])
    """Trainer workers (HOST:PORT, JSON list or comma list); one job per worker at a time."""
    benchmark_address: str = local_address("benchmark")
    """The benchmark service, for training loops."""
    reward_address: str = local_address("reward")
    """The reward service: CreateJob and CreateLoop check a job's reward against the rewards it has
    (ListRewardFunctions)."""
    model_roots: list[Path] = Field(default_factory=lambda: [rlvr_home() / "models"])
    """Folders a job's base model may be named from as a local path (JSON list or comma list); a
    path outside them is refused at CreateJob. Hub ids and the bundled tiny models need no root."""
    max_lora_rank: int = Field(default=64, ge=4, le=512)
    """The rollout server's max LoRA rank (its own max_lora_rank setting): loop rounds stack their
    adapters (round k's has rank up to grpo.lora_rank x k), so CreateLoop refuses loops whose last
    round would not fit."""
    tracking_roots: list[Path] = described_field(lambda: [Path.cwd(), rlvr_home() / "tracking"],
                                                 f"{STARTS_IN}, $RLVR_HOME/tracking")
    """Folders a job's experiment trackers may write under (TensorBoard log dirs, MLflow file
    stores, W&B run dirs, trackio stores; JSON list or comma list): a target outside them is refused
    at CreateJob and TrackJob (docs/tracking.md). MLflow servers (http/https) need no root."""
    rendezvous_port: int = Field(default=29400, ge=1, le=65535 - 64)
    """A job of several nodes (advanced.num_nodes): torchrun's rendezvous listens on node 0's host
    at this port plus node 0's index in trainer_addresses (one port per worker that can be a node
    0); the trainer hosts must reach each other there and on the ports torch.distributed opens."""
    node_lost_seconds: float = Field(default=120.0, gt=0)
    """A job of several nodes: how long a node's trainer worker may not answer before the node is
    lost. The job is then queued again to resume, its status message naming the node and since
    when, and its other workers are free for other jobs while it waits (docs/operations.md)."""
    node_wait_seconds: float = Field(default=1800.0, gt=0)
    """How long a job of several nodes that lost a node waits for as many idle workers that fit it
    (the returning one or others) to resume on, before it fails naming the lost node."""
    loop_peer_wait_seconds: float = Field(default=600.0, gt=0)
    """How long a loop waits for an unreachable benchmark service before it fails."""
