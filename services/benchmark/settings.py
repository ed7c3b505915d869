"""Settings of the benchmark service (evaluations)."""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import (
    DEFAULT_PORTS,
    NatsFields,
    PeerFields,
    ServiceSettings,
    StoreFields,
    port_field,
    rlvr_home,
)


class BenchmarkSettings(PeerFields, NatsFields, StoreFields, ServiceSettings):
    service_name = "benchmark"
    model_config = SettingsConfigDict(env_prefix="RLVR_BENCHMARK_", extra="ignore", use_attribute_docstrings=True)

    port: int = port_field(DEFAULT_PORTS["benchmark"])
    """gRPC port of the benchmark service."""
    batch_size: int = Field(default=128, ge=1, le=4096)
    """Questions per Generate call; progress events and stored rows follow these batches. 128 is the
    batch `rlvr models build-tiny` measures its held-out accuracy with."""
    max_concurrent: int = Field(default=2, ge=1, le=64)
    """Evaluations that run at once; later ones wait, QUEUED."""
    generate_timeout_seconds: float = Field(default=600.0, gt=0, le=86_400)
    """Deadline of one batch's Generate call; a rollout service that stalls fails the evaluation."""
    score_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    """Deadline of one batch's Score call on the reward service."""
    rollout_wait_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """An evaluation whose rollout service goes away (killed, restarting: vLLM takes tens of seconds
    to start; every replica down) waits this long for it, then generates the batch again; past it,
    the evaluation fails naming the rollout service. 0: fail at once."""
    reward_wait_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """The same for the reward service: an evaluation waits this long for it to score again."""
    adapter_roots: list[Path] = Field(default_factory=lambda: [rlvr_home() / "stack" / "artifacts"])
    """Folders a RunEvaluation `adapter_path` may name (JSON list or comma list); nothing outside."""
    trainer_addresses: list[str] = Field(default_factory=list)
    """Trainer workers (HOST:PORT, JSON list or comma list) to fetch an `adapter_path` from when it
    is not readable here (under adapter_roots): the one whose artifact root holds it sends it
    (TrainerService.FetchFolder), so the hosts need share no disk. Empty: local folders only."""
    prompt_style: Literal["auto", "full", "compact"] = "auto"
    """How questions are put to the model: auto reads the rollout model's own declaration (the tiny
    models are compact), full adds the <think>/<answer> instruction, compact gives the bare problem."""
