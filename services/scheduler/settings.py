"""Settings of the scheduler service (the public API, the store, dispatch)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import (
    ArtifactFields,
    DataRootFields,
    NatsFields,
    ServiceSettings,
    StoreFields,
    port_field,
)


class SchedulerSettings(NatsFields, StoreFields, ArtifactFields, DataRootFields, ServiceSettings):
    service_name = "scheduler"
    model_config = SettingsConfigDict(env_prefix="RLVR_SCHEDULER_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(50051)
    """gRPC port of the public API."""
    trainer_addresses: list[str] = Field(default_factory=lambda: ["127.0.0.1:50052"])
    """Trainer workers (HOST:PORT, JSON list or comma list); one job per worker at a time."""
    benchmark_address: str = "127.0.0.1:50055"
    """The benchmark service, for training loops."""
    max_lora_rank: int = Field(default=64, ge=4, le=512)
    """The rollout server's max LoRA rank (its own max_lora_rank setting): loop rounds stack their
    adapters (round k's has rank up to grpo.lora_rank x k), so CreateLoop refuses loops whose last
    round would not fit."""
    loop_peer_wait_seconds: float = Field(default=600.0, gt=0)
    """How long a loop waits for an unreachable benchmark service before it fails."""
