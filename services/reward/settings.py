"""Settings of the reward service (stateless scoring and the task data)."""


from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import DEFAULT_PORTS, DataRootFields, ServiceSettings, port_field


class RewardSettings(DataRootFields, ServiceSettings):
    service_name = "reward"
    model_config = SettingsConfigDict(env_prefix="RLVR_REWARD_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(DEFAULT_PORTS["reward"])
    """gRPC port of the reward service."""
    timeout_seconds: float = Field(default=0.5, gt=0, le=10)
    """Default hard time limit for scoring one completion (a request may ask for another)."""
    max_batch: int = Field(default=100_000, ge=1, le=1_000_000)
    """Most completions one Score call may carry."""
