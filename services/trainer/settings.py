"""Settings of the trainer service (a GRPO worker)."""

from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import ArtifactFields, NatsFields, PeerFields, ServiceSettings, port_field


class TrainerSettings(PeerFields, NatsFields, ArtifactFields, ServiceSettings):
    service_name = "trainer"
    model_config = SettingsConfigDict(env_prefix="RLVR_TRAINER_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(50052)
    """gRPC port of this trainer worker."""
    worker_name: str = "trainer-0"
    """Name this worker reports to the scheduler and stamps on its jobs."""
