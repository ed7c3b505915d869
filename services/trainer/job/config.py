"""What one GRPO job needs to run, as plain Python: the resolved JobSpec turned into a `JobConfig`.

The trainer core (`runner.py`, `engine.py`) never sees protobuf: the gRPC layer and the job process
call `job_config_from_request`, which re-validates the spec with the scheduler's `resolve_spec` (the
one place where the spec's ranges and defaults live; a resolved spec passes through unchanged) and
adds what only a worker knows: where artifacts go and the adapter name it pushes to rollout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from google.protobuf.descriptor import FieldDescriptor

from rlvr.common.errors import FailedPrecondition, InvalidArgument
from rlvr.infra.subjects import SUBJECT_TOKEN_RE
from rlvr.jobspec import (
    BACKEND_KEYS,
    DEFAULT_DATASET_SPLIT,
    LOSS_NAMES,
    METHOD_KEYS,
    QUANT_KEYS,
    SPEC_FIELDS,
    Backend,
    LossType,
    Method,
    Precision,
    Quantization,
    RewardName,
    Sharding,
    is_head,
    is_sft,
    proto_field,
    resolve_spec,
    value_of,
)
from rlvr.peers.types import Sampling
from rlvr.services.trainer.job.artifacts import under_root
from rlvr.v1 import common_pb2, trainer_pb2

C = common_pb2


# A job id becomes a NATS subject token and a folder name: no dots, slashes or wildcards.
JOB_ID_RE = SUBJECT_TOKEN_RE
ADAPTER_NAME_MAX = 128


@dataclass(frozen=True)
class SftSettings:
    """A Supervised (SFT) job's card (JobSpec.sft), resolved: the names are the card's
    (rlvr/jobspec/fields.py's "sft" rows)."""

    dataset: str
    dataset_split: str
    learning_rate: float
    epochs: int
    max_steps: int  # -1 = Full
    batch_size: int
    max_seq_length: int
    lora_rank: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str  # "all-linear" or a comma list
    completion_only_loss: bool
    packing: bool


@dataclass(frozen=True)
class HeadSettings:
    """A Head job's card (JobSpec.head), resolved: the names are the card's (fields.py's "head" rows),
    the task as its key ("classification" or "regression")."""

    dataset: str
    dataset_split: str
    text_column: str
    label_column: str
    task: str
    learning_rate: float
    epochs: int
    max_steps: int  # -1 = Full
    batch_size: int
    max_seq_length: int
    lora_rank: int  # 0 = the base frozen, the head alone trained
    lora_alpha: int
    lora_dropout: float
    target_modules: str
    reward_label: str  # "" = the default class (rlvr.heads.default_reward_label)


@dataclass(frozen=True)
class JobConfig:
    """One job, every option resolved. Field names follow the spec's cards; no field restates a spec
    default (rlvr/jobspec/ holds them): build one from a request (`job_config_from_request`) or
    with the spec's defaults (`job_config`)."""

    job_id: str
    base_model: str  # hub id, local path, or rlvr-tiny[-<size>]
    artifact_root: Path
    # Reward Function card
    reward_function: RewardName  # the job's reward: a key (reward.key, the first of reward.terms)
    synthetic_prompts: int
    format_bonus: bool
    format_bonus_weight: float
    dataset: str
    dataset_split: str
    # GRPO Configuration card
    group_size: int
    max_completion_tokens: int
    lora_rank: int
    lora_alpha: int
    learning_rate: float
    max_steps: int  # -1 = Full
    batch_size: int  # completions per optimizer step, a multiple of group_size
    # Advanced Options
    loss_type: LossType
    epochs: int
    quantization: Quantization
    generation_backend: Backend
    # vllm_colocate: the share of the device's memory the job's vLLM engine keeps (host memory on CPU)
    gpu_memory_fraction: float
    gpu_selection: str
    kl_beta: float
    temperature: float
    # advanced.top_p, top_k, min_p, repetition_penalty: the sampling controls every generator applies
    # (rlvr/sampling.py's order); their defaults leave the tempered distribution whole.
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    dynamic_sampling: bool
    # LoRA A initialisation of a fresh adapter: peft's default (kaiming-uniform) or "gaussian"
    # (the LoRA paper's N(0, 1/r)); advanced.lora_init.
    lora_init: Literal["default", "gaussian"]
    seed: int
    checkpoint_every: int
    # Training processes (data parallel, launched with torchrun by the worker) and precision
    # ("fp32", "bf16", "fp16"); advanced.num_processes and advanced.precision.
    num_processes: int
    precision: Precision
    # advanced.max_async_steps: steps of generation ahead of training (0 = synchronous); the bound
    # on the policy lag of a step's training data (services/trainer/job/prefetch.py).
    max_async_steps: int
    # advanced.epsilon_high: DAPO's clip-higher, TRL's GRPOConfig(epsilon_high).
    epsilon_high: float
    # advanced.num_iterations (optimizer passes over a step's batch) and advanced.mini_batches (optimizer
    # steps per pass): a step makes num_iterations x mini_batches optimizer steps (engine.py, `grpo_args`).
    num_iterations: int
    mini_batches: int
    # advanced.mask_truncated_completions: DAPO's overlong masking (TRL's own option).
    mask_truncated_completions: bool
    # advanced.gradient_checkpointing: "auto", "on" or "off" (engine.py, `checkpointing_on`).
    gradient_checkpointing: str
    # advanced.eval_every (0 = off) and eval_size: evaluation while training (heldout.py).
    eval_every: int
    eval_size: int
    # advanced.sharding: how a job of several processes holds the model, "ddp" (a whole copy each)
    # or "fsdp" (sharded across them: engine.py, `fsdp_args`).
    sharding: Sharding
    # A PEFT directory to stack on ("" = none): merged into the base and kept frozen; a fresh adapter
    # trains on top, and the job publishes the two as one adapter on the original base.
    init_adapter_path: str = ""
    # How messages to the client name the init_adapter: its name ("job-<id>"), or the path as the
    # spec gave it; never the resolved folder (no server paths in client messages).
    init_adapter_label: str = ""
    total_steps: int = 0  # 0 = derive from max_steps / the prompt count (see `steps_for`)
    data_roots: tuple[Path, ...] = field(default_factory=tuple)
    # A re-dispatch after the trainer was lost (StartJobRequest.resume): go on from the job's last
    # checkpoint; `stored_steps` are the steps the scheduler stores already, not published again.
    resume: bool = False
    stored_steps: int = 0
    # reward.terms: several rewards (key, weight) combined; () = reward_function alone with weight 1.
    reward_terms: tuple[tuple[str, float], ...] = ()
    accuracy_key: str = ""  # reward.accuracy_key ("" = reward_function)
    # advanced.num_nodes: trainer workers the job spans (num_processes on each), and this worker's
    # node in it with the rendezvous every node joins (StartJobRequest.node_rank, rendezvous_endpoint;
    # services/trainer/job/distributed.py). Node 0 speaks for the job.
    num_nodes: int = 1
    node_rank: int = 0
    rendezvous_endpoint: str = ""
    # JobSpec.environment: the environment every prompt's episode runs in ("" = none, a single-answer
    # job), its settings (each episode's instance is made with them), the turns per episode and the
    # cap on an episode's completion tokens (sampled + observations; max_completion_tokens caps
    # each turn), both resolved (0 only without an environment); and the version it declared when
    # the job was created (environment.version).
    environment: str = ""
    environment_settings: dict[str, str] = field(default_factory=dict)
    max_turns: int = 0
    max_episode_tokens: int = 0
    environment_version: str = ""
    # Completions per forward/backward of the loss (each process's share of the batch split into
    # micro-batches whose gradients accumulate into the one optimizer step): 0 = the trainer's own
    # choice from the model's size (engine.py, `micro_batch_size`). Not a spec field: benches and tests
    # force it.
    micro_batch_size: int = 0
    # JobSpec.method ("rlvr", "sft" or "head") and, for a Supervised (SFT) or Head job, its card
    # (services/trainer/job/sft.py and head.py train them; the GRPO fields above are then not read).
    method: Method = "rlvr"
    sft: SftSettings | None = None
    head: HeadSettings | None = None

    def __post_init__(self) -> None:
        if not JOB_ID_RE.match(self.job_id):
            raise InvalidArgument(f"job_id: {self.job_id!r} is not allowed; use 1-128 letters, digits, '_' or '-'")
        if self.batch_size % self.group_size:
            raise InvalidArgument(
                f"grpo.batch_size: {self.batch_size} is not a multiple of grpo.group_size {self.group_size}; "
                "the scheduler rounds it up on submit"
            )

    def sampling(self, **fields: Any) -> Sampling:
        """How the job samples: its temperature and sampling controls, with `fields` (max_tokens,
        seed, group_size) for the call."""
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                        repetition_penalty=self.repetition_penalty, **fields)

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per step (one generated batch): num_iterations x mini_batches."""
        return self.num_iterations * self.mini_batches

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobConfig:
        """The JobConfig `to_json` wrote: the job process reads its worker's, already validated."""
        # A config written before the sampling controls existed (a job orphaned across an upgrade) reads
        # as the controls off, which is how it sampled.
        # So does one written before num_iterations, mini_batches and overlong masking: one update a step.
        data = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "num_iterations": 1,
                "mini_batches": 1, "mask_truncated_completions": False, "eval_every": 0, "eval_size": 64,
                "gradient_checkpointing": "off", **data}
        sft, head = data.get("sft"), data.get("head")
        return cls(**{**data, "artifact_root": Path(data["artifact_root"]),
                      "sft": SftSettings(**sft) if sft else None, "head": HeadSettings(**head) if head else None,
                      "data_roots": tuple(Path(p) for p in data["data_roots"]),
                      "reward_terms": tuple((str(k), float(w)) for k, w in data.get("reward_terms", ()))})


def as_typed(value: float) -> float:
    """A proto `float` (32-bit) as the decimal the user typed: 0.3 arrives as 0.30000001192..."""
    return float(f"{value:.7g}")


def job_config_from_request(
    request: trainer_pb2.StartJobRequest, artifact_root: Path, data_roots: tuple[Path, ...] = ()
) -> JobConfig:
    """The JobConfig of a StartJob request; raises InvalidArgument naming the field on a bad value."""
    if not JOB_ID_RE.match(request.job_id):
        raise InvalidArgument(f"job_id: {request.job_id!r} is not allowed; use 1-128 letters, digits, '_' or '-'")
    resolved = resolve_spec(request.spec)  # idempotent on a spec the scheduler already resolved
    spec = resolved.spec
    r = spec.reward
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
    nodes = spec.advanced.num_nodes
    if nodes > 1:
        if not 0 <= request.node_rank < nodes:
            raise InvalidArgument(f"node_rank: {request.node_rank} is not a node of a job of advanced.num_nodes "
                                  f"{nodes} (0-{nodes - 1})")
        host, _, port = request.rendezvous_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"rendezvous_endpoint: {request.rendezvous_endpoint!r} is not HOST:PORT; a job of "
                                  f"advanced.num_nodes {nodes} needs node 0's rendezvous endpoint")
    return JobConfig(
        **spec_fields(spec),
        job_id=request.job_id,
        base_model=spec.base_model,
        artifact_root=artifact_root,
        reward_function=r.key,
        reward_terms=tuple((t.key, t.weight) for t in r.terms) if len(r.terms) > 1 else (),
        accuracy_key=r.accuracy_key if r.accuracy_key != r.key else "",
        dataset_split=r.dataset_split or DEFAULT_DATASET_SPLIT,  # "" for Math Pairs, which has no splits
        init_adapter_path=init_path,
        init_adapter_label=spec.init_adapter.name or spec.init_adapter.path,
        total_steps=max(0, request.total_steps),
        data_roots=tuple(data_roots),
        resume=request.resume,
        stored_steps=max(0, request.stored_steps),
        node_rank=request.node_rank if nodes > 1 else 0,
        rendezvous_endpoint=request.rendezvous_endpoint if nodes > 1 else "",
        environment_version=spec.environment.version,
        method=METHOD_KEYS[spec.method],
        sft=SftSettings(**card_values(spec, "sft")) if is_sft(spec) else None,
        head=HeadSettings(**card_values(spec, "head")) if is_head(spec) else None,
    )


# An enum field's JobConfig value: its short key.
ENUM_KEYS: dict[str, Mapping[int, str]] = {"advanced.loss_type": LOSS_NAMES, "advanced.quantization": QUANT_KEYS,
                                           "advanced.generation_backend": BACKEND_KEYS}


def spec_fields(spec: common_pb2.JobSpec) -> dict[str, Any]:
    """JobConfig's fields that rlvr/jobspec/fields.py's table declares, by name, from a resolved spec: an
    enum as its key, a 32-bit float as the decimal typed (`as_typed`), an unset field as the row says."""
    out: dict[str, Any] = {}
    for row in SPEC_FIELDS:
        name = row.config_name
        if name is None:
            continue
        value = value_of(spec, row)
        if row.path in ENUM_KEYS:
            value = ENUM_KEYS[row.path][value]  # type: ignore[index]
        elif row.kind == "map":
            value = dict(sorted(value.items()))  # type: ignore[attr-defined]  # a protobuf map
        elif proto_field(row).type == FieldDescriptor.TYPE_FLOAT:
            value = as_typed(value)  # type: ignore[arg-type]
        out[name] = value
    return out


def card_values(spec: common_pb2.JobSpec, card: str) -> dict[str, Any]:
    """A resolved SFT or Head spec's card, by the rows' names (a 32-bit float as the decimal typed, an
    enum as its key)."""
    values: dict[str, Any] = {}
    for row in SPEC_FIELDS:
        if row.card == card:
            value = value_of(spec, row)
            if row.names is not None:
                value = row.names[value]  # type: ignore[index]
            elif proto_field(row).type == FieldDescriptor.TYPE_FLOAT:
                value = as_typed(value)  # type: ignore[arg-type]
            values[row.name] = value
    return values


def job_config(job_id: str, base_model: str, artifact_root: Path, **fields: Any) -> JobConfig:
    """A JobConfig with the spec's defaults (resolved by `resolve_spec`, as for any submitted job) for
    every field not given: in-process runs, tests and benches."""
    reward = C.RewardConfig(key=fields.pop("reward_function", ""), dataset=fields.pop("dataset", ""),
                            dataset_split=fields.pop("dataset_split", ""))  # resolved as a spec's: its rules apply
    request = trainer_pb2.StartJobRequest(job_id=job_id, spec=C.JobSpec(base_model=base_model, reward=reward))
    return replace(job_config_from_request(request, artifact_root), **fields)


def one_line(exc: BaseException) -> str:
    """An exception as the one readable line a failed job reports."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    own = isinstance(exc, (FailedPrecondition, ValueError)) or type(exc).__module__.startswith("rlvr.services.")
    return (text if own else f"{type(exc).__name__}: {text}")[:500]
