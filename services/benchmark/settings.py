"""Settings of the benchmark service (evaluations)."""

from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import NatsFields, PeerFields, ServiceSettings, StoreFields, port_field


class BenchmarkSettings(PeerFields, NatsFields, StoreFields, ServiceSettings):
    service_name = "benchmark"
    model_config = SettingsConfigDict(env_prefix="RLVR_BENCHMARK_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(50055)
    """gRPC port of the benchmark service."""
