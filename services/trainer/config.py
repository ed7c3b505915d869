"""What one GRPO job needs to run, as plain Python: the resolved JobSpec turned into a `JobConfig`.

The trainer core (`runner.py`, `engine.py`) never sees protobuf: the gRPC layer and the job process
call `job_config_from_request`, which re-validates the spec with the scheduler's `resolve_spec` (the
one place where the spec's ranges and defaults live; a resolved spec passes through unchanged) and
adds what only a worker knows: where artifacts go and the adapter name it pushes to rollout.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from rlvr.common.errors import InvalidArgument
from rlvr.v1 import common_pb2, trainer_pb2
from services.scheduler.jobspec import GPU_MEMORY_FRACTION, resolve_spec
from services.trainer.artifacts import under_root

C = common_pb2

LossType = Literal["grpo", "dapo", "dr_grpo"]
Quantization = Literal["full", "4bit", "8bit"]
# "vllm": the rollout server; "vllm_colocate": a vLLM engine in the job's process; "transformers": in-process.
Backend = Literal["vllm", "vllm_colocate", "transformers"]
RewardName = Literal["math_pairs", "gsm8k", "boxed"]

# A job id becomes a NATS subject token and a folder name: no dots, slashes or wildcards.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
ADAPTER_NAME_MAX = 128

_REWARDS: dict[int, RewardName] = {
    C.REWARD_FUNCTION_MATH_PAIRS: "math_pairs",
    C.REWARD_FUNCTION_GSM8K: "gsm8k",
    C.REWARD_FUNCTION_BOXED: "boxed",
}
_LOSSES: dict[int, LossType] = {C.LOSS_TYPE_GRPO: "grpo", C.LOSS_TYPE_DAPO: "dapo", C.LOSS_TYPE_DR_GRPO: "dr_grpo"}
_QUANT: dict[int, Quantization] = {C.QUANTIZATION_FULL: "full", C.QUANTIZATION_4BIT: "4bit", C.QUANTIZATION_8BIT: "8bit"}
_BACKENDS: dict[int, Backend] = {
    C.GENERATION_BACKEND_VLLM: "vllm",
    C.GENERATION_BACKEND_VLLM_COLOCATE: "vllm_colocate",
    C.GENERATION_BACKEND_TRANSFORMERS: "transformers",
}


@dataclass(frozen=True)
class JobConfig:
    """One job, every option resolved. Field names follow the spec's cards."""

    job_id: str
    base_model: str  # hub id, local path, or rlvr-tiny[-<size>]
    artifact_root: Path
    # Reward Function card
    reward_function: RewardName = "math_pairs"
    synthetic_prompts: int = 256
    format_bonus: bool = True
    format_bonus_weight: float = 0.1
    dataset: str = ""
    dataset_split: str = "train"
    # GRPO Configuration card
    group_size: int = 8
    max_completion_tokens: int = 256
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 1e-6
    max_steps: int = 100  # -1 = Full
    batch_size: int = 8  # completions per optimizer step, a multiple of group_size
    # Advanced Options
    loss_type: LossType = "grpo"
    epochs: int = 1
    quantization: Quantization = "full"
    generation_backend: Backend = "transformers"
    # vllm_colocate: the share of the device's memory the job's vLLM engine keeps (host memory on CPU)
    gpu_memory_fraction: float = GPU_MEMORY_FRACTION.default
    gpu_selection: str = "auto"
    kl_beta: float = 0.0
    temperature: float = 1.0
    dynamic_sampling: bool = False
    # LoRA A initialisation of a fresh adapter: peft's default (kaiming-uniform) or "gaussian"
    # (the LoRA paper's N(0, 1/r)); advanced.lora_init.
    lora_init: Literal["default", "gaussian"] = "default"
    seed: int = 0
    checkpoint_every: int = 0
    # A PEFT directory to stack on ("" = none): merged into the base and kept frozen; a fresh adapter
    # trains on top, and the job publishes the two as one adapter on the original base.
    init_adapter_path: str = ""
    total_steps: int = 0  # 0 = derive from max_steps / the prompt count (see `steps_for`)
    data_roots: tuple[Path, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not JOB_ID_RE.match(self.job_id):
            raise InvalidArgument(f"job_id: {self.job_id!r} is not allowed; use 1-128 letters, digits, '_' or '-'")
        if self.batch_size % self.group_size:
            raise InvalidArgument(
                f"grpo.batch_size: {self.batch_size} is not a multiple of grpo.group_size {self.group_size}; "
                "the scheduler rounds it up on submit"
            )

    @property
    def prompts_per_step(self) -> int:
        return self.batch_size // self.group_size

    @property
    def adapter_name(self) -> str:
        """The name this job's adapter versions carry on the rollout server."""
        return f"job-{self.job_id}"[:ADAPTER_NAME_MAX]

    @property
    def job_dir(self) -> Path:
        return self.artifact_root / "jobs" / self.job_id

    def steps_for(self, n_prompts: int) -> int:
        """The step count the run makes: `total_steps` when given, else max_steps, else Full:
        ceil(prompts x epochs x group_size / batch_size)."""
        if self.total_steps > 0:
            return self.total_steps
        if self.max_steps > 0:
            return self.max_steps
        return max(1, math.ceil(n_prompts * self.epochs / self.prompts_per_step))

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["artifact_root"] = str(self.artifact_root)
        data["data_roots"] = [str(p) for p in self.data_roots]
        return data


def job_config_from_request(
    request: trainer_pb2.StartJobRequest, artifact_root: Path, data_roots: tuple[Path, ...] = ()
) -> JobConfig:
    """The JobConfig of a StartJob request; raises InvalidArgument naming the field on a bad value."""
    if not JOB_ID_RE.match(request.job_id):
        raise InvalidArgument(f"job_id: {request.job_id!r} is not allowed; use 1-128 letters, digits, '_' or '-'")
    resolved = resolve_spec(request.spec)  # idempotent on a spec the scheduler already resolved
    spec = resolved.spec
    r, g, a = spec.reward, spec.grpo, spec.advanced
    init_path = ""
    if spec.HasField("init_adapter") and (spec.init_adapter.path or spec.init_adapter.name):
        if not spec.init_adapter.path:
            raise InvalidArgument(
                "init_adapter.path: required; the scheduler resolves an adapter name to its path under the "
                "artifact root before StartJob"
            )
        init_path = str(under_root(artifact_root, spec.init_adapter.path, "init_adapter.path"))
    if request.total_steps < -1:
        raise InvalidArgument(f"total_steps: {request.total_steps} must be >= 1, or 0/-1 to derive it")
    return JobConfig(
        job_id=request.job_id,
        base_model=spec.base_model,
        artifact_root=artifact_root,
        reward_function=_REWARDS[r.function],
        synthetic_prompts=r.synthetic_prompts or 256,
        format_bonus=r.format_bonus,
        format_bonus_weight=r.format_bonus_weight,
        dataset=r.dataset,
        dataset_split=r.dataset_split or "train",
        group_size=g.group_size,
        max_completion_tokens=g.max_completion_tokens,
        lora_rank=g.lora_rank,
        lora_alpha=g.lora_alpha,
        learning_rate=g.learning_rate,
        max_steps=g.max_steps,
        batch_size=g.batch_size,
        loss_type=_LOSSES[a.loss_type],
        epochs=a.epochs,
        quantization=_QUANT[a.quantization],
        generation_backend=_BACKENDS[a.generation_backend],
        # a proto float: 0.3 arrives as 0.30000001192...
        gpu_memory_fraction=round(a.gpu_memory_fraction, 6) if a.HasField("gpu_memory_fraction")
        else GPU_MEMORY_FRACTION.default,
        gpu_selection=a.gpu_selection,
        kl_beta=a.kl_beta,
        temperature=a.temperature,
        dynamic_sampling=a.dynamic_sampling,
        lora_init="gaussian" if a.lora_init == "gaussian" else "default",
        seed=a.seed,
        checkpoint_every=a.checkpoint_every,
        init_adapter_path=init_path,
        total_steps=max(0, request.total_steps),
        data_roots=tuple(data_roots),
    )
