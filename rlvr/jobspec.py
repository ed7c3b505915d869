"""Job spec validation and the Training Summary: the one place where the spec's ranges and
defaults live (the proto comments state the same numbers; tests/test_spec_docs.py checks they agree).

`resolve_spec` takes the JobSpec a user sent and returns it with every default filled in and the
batch size rounded up to a multiple of the group size, plus the warnings to show; a value out of
range raises InvalidArgument naming the field, the value and the range. It is pure: no store, no
gRPC, so the CLI's dry run, the scheduler and the tests share it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from google.protobuf.message import Message

from rlvr.common.errors import InvalidArgument, bounded, out_of_range, shown
from rlvr.tasks.gsm8k import BUNDLED_SPLITS
from rlvr.v1 import common_pb2

C = common_pb2

DEFAULT_BASE_MODEL = "rlvr-tiny"
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ %-]{0,127}$")
# The size limits of the strings a user sends (names, model ids, datasets, splits, labels): a value
# over its limit is INVALID_ARGUMENT naming the field and the limit, before it is used anywhere.
MAX_NAME_CHARS = 128  # job, loop and adapter names; ids
MAX_MODEL_CHARS = 1024  # a hub id or a local path
MAX_DATASET_CHARS = 1024  # a hub dataset or a local path
MAX_PATH_CHARS = 1024
MAX_SPLIT_CHARS = 128
MAX_OPTION_CHARS = 64  # short settings: gpu_selection, lora_init, precision
MAX_LABEL_CHARS = 200
SEED_MAX = 2**63 - 1  # what SQLite stores (a signed 64-bit integer); a uint64 field can carry more
GPU_SELECTION_RE = re.compile(r"^(auto|cpu|\d+(,\d+)*)$")


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    default: int

    def text(self) -> str:
        return f"{self.low}-{self.high}"


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    default: float

    def text(self) -> str:
        return f"{self.low:g} to {self.high:g}"


# The spec's cards, verbatim: Reward Function, GRPO Configuration, Advanced Options.
SYNTHETIC_PROMPTS = IntRange(8, 100_000, 256)
FORMAT_BONUS_WEIGHT = FloatRange(0.0, 1.0, 0.1)
GROUP_SIZE = IntRange(2, 32, 8)
MAX_COMPLETION = IntRange(32, 2048, 256)
LORA_RANK = IntRange(4, 64, 8)
LORA_ALPHA = IntRange(4, 128, 16)
LEARNING_RATE = FloatRange(5e-7, 1e-5, 1e-6)
MAX_STEPS_DEFAULT = 100
MAX_STEPS_HIGH = 1_000_000
BATCH_SIZE_DEFAULT = 4
EPOCHS = IntRange(1, 100, 1)
GPU_MEMORY_FRACTION = FloatRange(0.05, 0.95, 0.3)
KL_BETA = FloatRange(0.0, 1.0, 0.0)
TEMPERATURE = FloatRange(0.1, 2.0, 1.0)
# Temperatures below this are greedy, as in vLLM's sampler (`_SAMPLING_EPS`): evaluations ask for 0.
GREEDY_EPS = 1e-5
LORA_INITS = ("default", "gaussian")
DEFAULT_DATASET_SPLIT = "train"
GSM8K_SPLITS = BUNDLED_SPLITS  # the built-in copy's
CHECKPOINT_EVERY = IntRange(0, 100_000, 0)
# Steps of generation run ahead of training (0 = synchronous); a step trains on completions at most
# this many adapter versions old. The rollout server backend only.
MAX_ASYNC_STEPS = IntRange(0, 4, 0)
JOB_SEED = IntRange(0, 2**32 - 1, 0)  # a job's seed also seeds numpy (transformers' set_seed), 32-bit
# Training processes of a job (data parallel through torch.distributed: torchrun, gloo on a CPU,
# NCCL on GPUs); one per device listed in gpu_selection.
NUM_PROCESSES = IntRange(1, 8, 1)
# Training precision: "fp32" (default), or mixed precision over a base loaded in that dtype (the
# LoRA weights stay fp32). fp16 needs a CUDA device (torch's CPU autocast has no fp16 training).
Precision = Literal["fp32", "bf16", "fp16"]
PRECISION_KEYS: dict[str, Precision] = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
PRECISIONS = tuple(PRECISION_KEYS)

REWARD_NAMES: dict[int, str] = {
    C.REWARD_FUNCTION_MATH_PAIRS: "Math Pairs (synthetic)",
    C.REWARD_FUNCTION_GSM8K: "GSM8K accuracy",
    C.REWARD_FUNCTION_BOXED: "Boxed-answer accuracy",
}
BACKEND_NAMES: dict[int, str] = {
    C.GENERATION_BACKEND_VLLM: "vLLM (rollout server)",
    C.GENERATION_BACKEND_VLLM_COLOCATE: "vLLM (colocate)",
    C.GENERATION_BACKEND_TRANSFORMERS: "Transformers (in-process)",
}
LossType = Literal["grpo", "dapo", "dr_grpo"]
Quantization = Literal["full", "4bit", "8bit"]
# "vllm": the rollout server; "vllm_colocate": a vLLM engine in the job's process; "transformers": in-process.
Backend = Literal["vllm", "vllm_colocate", "transformers"]
RewardName = Literal["math_pairs", "gsm8k", "boxed"]

# Each enum's short key, declared once: the trainer's JobConfig, the reward calls and the CLI's
# choices (`rlvr train --reward gsm8k`, with "-" for "_") all derive from these.
REWARD_KEYS: dict[common_pb2.RewardFunction, RewardName] = {
    C.REWARD_FUNCTION_MATH_PAIRS: "math_pairs",
    C.REWARD_FUNCTION_GSM8K: "gsm8k",
    C.REWARD_FUNCTION_BOXED: "boxed",
}
REWARD_FUNCTIONS: dict[str, common_pb2.RewardFunction] = {key: value for value, key in REWARD_KEYS.items()}
LOSS_NAMES: dict[int, LossType] = {C.LOSS_TYPE_GRPO: "grpo", C.LOSS_TYPE_DAPO: "dapo", C.LOSS_TYPE_DR_GRPO: "dr_grpo"}
QUANT_KEYS: dict[int, Quantization] = {C.QUANTIZATION_FULL: "full", C.QUANTIZATION_4BIT: "4bit",
                                       C.QUANTIZATION_8BIT: "8bit"}
BACKEND_KEYS: dict[int, Backend] = {
    C.GENERATION_BACKEND_VLLM: "vllm",
    C.GENERATION_BACKEND_VLLM_COLOCATE: "vllm_colocate",
    C.GENERATION_BACKEND_TRANSFORMERS: "transformers",
}
QUANT_NAMES: dict[int, str] = {C.QUANTIZATION_FULL: "Full Precision", C.QUANTIZATION_4BIT: "4-bit QLoRA",
                               C.QUANTIZATION_8BIT: "8-bit"}


def job_status_name(value: int) -> str:
    """A JobStatus as the store, the status events' ids and the CLI spell it: QUEUED, RUNNING,
    COMPLETED, ... (the enum name without its prefix; an unknown value as its number)."""
    try:
        return C.JobStatus.Name(value).removeprefix("JOB_STATUS_")
    except ValueError:
        return str(value)


def job_status_value(name: str) -> common_pb2.JobStatus:
    return C.JobStatus.Value(f"JOB_STATUS_{name}")


@dataclass
class ResolvedJob:
    spec: common_pb2.JobSpec
    summary: common_pb2.TrainingSummary
    warnings: list[str]
    total_steps: int


def _int(msg: Message, field: str, path: str, rng: IntRange) -> int:
    if not msg.HasField(field):
        setattr(msg, field, rng.default)
        return rng.default
    value = getattr(msg, field)
    if not rng.low <= value <= rng.high:
        raise out_of_range(path, value, f"{rng.text()} (default {rng.default})")
    return int(value)


def _float(msg: Message, field: str, path: str, rng: FloatRange) -> float:
    if not msg.HasField(field):
        setattr(msg, field, rng.default)
        return rng.default
    value = getattr(msg, field)
    # float32 fields carry rounding noise: compare with a relative tolerance.
    tol = 1e-6 * max(abs(rng.low), abs(rng.high), 1e-12)
    if not (rng.low - tol <= value <= rng.high + tol) or math.isnan(value):
        raise out_of_range(path, value, f"{rng.text()} (default {rng.default:g})")
    return float(value)


def _enum(msg: Message, field: str, path: str, names: Mapping[int, object], default: int) -> int:
    value = getattr(msg, field)
    if value == 0:
        setattr(msg, field, default)
        return default
    if value not in names:
        raise out_of_range(path, value, ", ".join(f"{k} ({v})" for k, v in names.items()))
    return int(value)


def _validate_reward(spec: common_pb2.JobSpec, warnings: list[str]) -> None:
    r = spec.reward
    fn = _enum(r, "function", "reward.function", REWARD_NAMES, C.REWARD_FUNCTION_MATH_PAIRS)
    if fn == C.REWARD_FUNCTION_MATH_PAIRS:
        _int(r, "synthetic_prompts", "reward.synthetic_prompts", SYNTHETIC_PROMPTS)
    elif r.HasField("synthetic_prompts"):
        warnings.append(f"reward.synthetic_prompts is only used by Math Pairs; ignored for {REWARD_NAMES[fn]}")
        r.ClearField("synthetic_prompts")
    if not r.HasField("format_bonus"):
        r.format_bonus = True
    _float(r, "format_bonus_weight", "reward.format_bonus_weight", FORMAT_BONUS_WEIGHT)
    if fn == C.REWARD_FUNCTION_BOXED:
        if not r.dataset.strip():
            raise InvalidArgument("reward.dataset: required for Boxed-answer accuracy (a Hugging Face dataset "
                                  "name, a local JSONL/Parquet/CSV file or a folder of split files, with prompt "
                                  "and ground_truth columns)")
        r.dataset = r.dataset.strip()
        r.dataset_split = r.dataset_split.strip() or DEFAULT_DATASET_SPLIT  # checked against the data at submit
        return
    if r.dataset:
        warnings.append(f"reward.dataset {r.dataset!r} is ignored for {REWARD_NAMES[fn]}"
                        + (" (it uses the built-in openai/gsm8k)" if fn == C.REWARD_FUNCTION_GSM8K
                           else " (its prompts are self-generated)"))
        r.dataset = ""
    if fn == C.REWARD_FUNCTION_GSM8K:
        r.dataset_split = r.dataset_split.strip() or DEFAULT_DATASET_SPLIT
        if r.dataset_split not in GSM8K_SPLITS:
            raise out_of_range("reward.dataset_split", r.dataset_split,
                               f"a split of the built-in openai/gsm8k: {', '.join(GSM8K_SPLITS)} (default train)")
    elif r.dataset_split:
        warnings.append(f"reward.dataset_split {r.dataset_split!r} is ignored for {REWARD_NAMES[fn]} (its prompts "
                        "are self-generated; its held-out set is the benchmark's)")
        r.dataset_split = ""


def _validate_grpo(spec: common_pb2.JobSpec, warnings: list[str]) -> None:
    g = spec.grpo
    group = _int(g, "group_size", "grpo.group_size", GROUP_SIZE)
    _int(g, "max_completion_tokens", "grpo.max_completion_tokens", MAX_COMPLETION)
    _int(g, "lora_rank", "grpo.lora_rank", LORA_RANK)
    _int(g, "lora_alpha", "grpo.lora_alpha", LORA_ALPHA)
    _float(g, "learning_rate", "grpo.learning_rate", LEARNING_RATE)
    if not g.HasField("max_steps"):
        g.max_steps = MAX_STEPS_DEFAULT
    elif g.max_steps != -1 and not 1 <= g.max_steps <= MAX_STEPS_HIGH:
        raise out_of_range("grpo.max_steps", g.max_steps,
                           f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default {MAX_STEPS_DEFAULT})")
    if not g.HasField("batch_size"):
        g.batch_size = BATCH_SIZE_DEFAULT
    elif g.batch_size not in BATCH_SIZES:
        raise out_of_range("grpo.batch_size", g.batch_size,
                           f"one of {', '.join(map(str, BATCH_SIZES))} (default {BATCH_SIZE_DEFAULT})")
    if g.batch_size % group != 0:
        rounded = math.ceil(g.batch_size / group) * group
        warnings.append(f"grpo.batch_size {g.batch_size} rounded up to {rounded}, a multiple of "
                        f"grpo.group_size {group}")
        g.batch_size = rounded


def _validate_advanced(spec: common_pb2.JobSpec, warnings: list[str]) -> None:
    a = spec.advanced
    _enum(a, "loss_type", "advanced.loss_type", LOSS_NAMES, C.LOSS_TYPE_GRPO)
    _int(a, "epochs", "advanced.epochs", EPOCHS)
    _enum(a, "quantization", "advanced.quantization", QUANT_NAMES, C.QUANTIZATION_FULL)
    backend = _enum(a, "generation_backend", "advanced.generation_backend", BACKEND_NAMES,
                    C.GENERATION_BACKEND_VLLM)
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        _float(a, "gpu_memory_fraction", "advanced.gpu_memory_fraction", GPU_MEMORY_FRACTION)
    elif a.HasField("gpu_memory_fraction"):
        why = ("the rollout server sizes its own engine (its --memory-fraction setting)"
               if backend == C.GENERATION_BACKEND_VLLM else "that backend runs no vLLM engine")
        raise InvalidArgument(f"advanced.gpu_memory_fraction: only the vLLM (colocate) backend takes a memory "
                              f"share; with {BACKEND_NAMES[backend]} {why}")
    a.gpu_selection = a.gpu_selection.strip() or "auto"
    if not GPU_SELECTION_RE.match(a.gpu_selection):
        raise out_of_range("advanced.gpu_selection", a.gpu_selection,
                           '"auto", "cpu", or a comma list of device indices such as "0,1"')
    _validate_processes(spec, backend)
    _float(a, "kl_beta", "advanced.kl_beta", KL_BETA)
    _float(a, "temperature", "advanced.temperature", TEMPERATURE)
    if not a.HasField("seed"):
        a.seed = 0
    _int(a, "checkpoint_every", "advanced.checkpoint_every", CHECKPOINT_EVERY)
    if _int(a, "max_async_steps", "advanced.max_async_steps", MAX_ASYNC_STEPS) and \
            backend != C.GENERATION_BACKEND_VLLM:
        raise InvalidArgument(
            f"advanced.max_async_steps: {a.max_async_steps} needs the vLLM (rollout server) backend, which generates "
            f"in another process while the trainer trains; {BACKEND_NAMES[backend]} generates inside the training "
            f"process, so only 0 (synchronous) is allowed with it (range {MAX_ASYNC_STEPS.text()}, default "
            f"{MAX_ASYNC_STEPS.default})")
    a.lora_init = a.lora_init.strip() or "default"
    if a.lora_init not in LORA_INITS:
        raise out_of_range("advanced.lora_init", a.lora_init, " or ".join(f'"{v}"' for v in LORA_INITS) +
                           ' (default "default")')
    a.precision = a.precision.strip() or PRECISIONS[0]
    if a.precision not in PRECISIONS:
        raise out_of_range("advanced.precision", a.precision, ", ".join(f'"{v}"' for v in PRECISIONS[:-1]) +
                           f' or "{PRECISIONS[-1]}" (default "{PRECISIONS[0]}")')


def _validate_processes(spec: common_pb2.JobSpec, backend: int) -> None:
    """advanced.num_processes against the fields it must agree with: one process per listed device,
    whole groups on every process, and the options that do not run across processes yet."""
    a, g = spec.advanced, spec.grpo
    procs = _int(a, "num_processes", "advanced.num_processes", NUM_PROCESSES)
    if a.gpu_selection not in ("auto", "cpu"):
        devices = a.gpu_selection.split(",")
        if len(set(devices)) != len(devices):
            raise InvalidArgument(f"advanced.gpu_selection: {a.gpu_selection!r} lists a device twice")
        if len(devices) != procs:
            raise InvalidArgument(
                f"advanced.gpu_selection: {a.gpu_selection!r} lists {len(devices)} device(s) but "
                f"advanced.num_processes is {procs}; a job trains with one process per device: set "
                f"advanced.num_processes to {len(devices)} or list {procs} device(s)")
    if procs == 1:
        return
    if g.batch_size % (procs * g.group_size):
        raise InvalidArgument(
            f"grpo.batch_size: {g.batch_size} does not split into whole groups of grpo.group_size {g.group_size} "
            f"on each of advanced.num_processes {procs}; use a multiple of {procs * g.group_size}")
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        raise InvalidArgument(f"advanced.num_processes: {procs} processes cannot each start a vLLM (colocate) "
                              "engine yet; use the vLLM (rollout server) or Transformers backend, or 1 process")
    if a.dynamic_sampling:
        raise InvalidArgument(f"advanced.dynamic_sampling: not supported across processes yet "
                              f"(advanced.num_processes {procs}); use 1 process or turn it off")
    if a.max_async_steps:
        raise InvalidArgument(f"advanced.max_async_steps: asynchronous steps are not supported across processes "
                              f"yet (advanced.num_processes {procs}); use 1 process or 0")


def prompt_count(spec: common_pb2.JobSpec) -> int | None:
    """Training prompts the reward function provides, where known without loading data."""
    if spec.reward.function == C.REWARD_FUNCTION_MATH_PAIRS:
        return spec.reward.synthetic_prompts
    return None


def total_steps(spec: common_pb2.JobSpec, n_prompts: int | None = None) -> int:
    """max_steps, or for Full (-1): every prompt for the chosen epochs, group_size completions each."""
    if spec.grpo.max_steps != -1:
        return spec.grpo.max_steps
    n = n_prompts if n_prompts is not None else prompt_count(spec)
    if n is None:
        return -1  # known once the dataset is loaded
    prompts_per_step = spec.grpo.batch_size // spec.grpo.group_size
    return max(1, math.ceil(n * spec.advanced.epochs / prompts_per_step))


def summary(spec: common_pb2.JobSpec, steps: int) -> common_pb2.TrainingSummary:
    g, a = spec.grpo, spec.advanced
    return common_pb2.TrainingSummary(
        method="RLVR (GRPO)", model=spec.base_model, reward=REWARD_NAMES[spec.reward.function],
        group_size=g.group_size, max_completion=g.max_completion_tokens, gpu_selection=a.gpu_selection,
        lora_rank=g.lora_rank, learn_rate=g.learning_rate, max_steps=g.max_steps,
        backend=BACKEND_NAMES[a.generation_backend], batch_size=g.batch_size, lora_alpha=g.lora_alpha,
        loss_type=LOSS_NAMES[a.loss_type], quantization=QUANT_NAMES[a.quantization], total_steps=steps,
    )


def check_sizes(spec: common_pb2.JobSpec) -> None:
    """Every string of a JobSpec within its size limit (InvalidArgument naming the field)."""
    for path, value, limit in (
        ("name", spec.name, MAX_NAME_CHARS),
        ("base_model", spec.base_model, MAX_MODEL_CHARS),
        ("reward.dataset", spec.reward.dataset, MAX_DATASET_CHARS),
        ("reward.dataset_split", spec.reward.dataset_split, MAX_SPLIT_CHARS),
        ("advanced.gpu_selection", spec.advanced.gpu_selection, MAX_OPTION_CHARS),
        ("advanced.lora_init", spec.advanced.lora_init, MAX_OPTION_CHARS),
        ("advanced.precision", spec.advanced.precision, MAX_OPTION_CHARS),
        ("init_adapter.name", spec.init_adapter.name, MAX_NAME_CHARS),
        ("init_adapter.path", spec.init_adapter.path, MAX_PATH_CHARS),
    ):
        bounded(path, value, limit)


def default_name(base_model: str, loss: str) -> str:
    """A job's name when none is given: the model's last path part and the loss, in the characters
    a name allows (so a model id with other characters never makes the name the field at fault)."""
    stem = re.sub(r"[^A-Za-z0-9._ %-]+", "-", base_model.rstrip("/").split("/")[-1]).lstrip("._ %-")
    return f"{stem or 'job'}-{loss}"[:MAX_NAME_CHARS]


def resolve_spec(user_spec: common_pb2.JobSpec, n_prompts: int | None = None) -> ResolvedJob:
    """Validates and fills in `user_spec` (not modified); raises InvalidArgument on a bad value."""
    check_sizes(user_spec)
    spec = common_pb2.JobSpec()
    spec.CopyFrom(user_spec)
    warnings: list[str] = []
    spec.base_model = spec.base_model.strip() or DEFAULT_BASE_MODEL
    _validate_reward(spec, warnings)
    _validate_grpo(spec, warnings)
    _validate_advanced(spec, warnings)
    if not spec.name:
        spec.name = default_name(spec.base_model, LOSS_NAMES[spec.advanced.loss_type])
    if not NAME_RE.match(spec.name):
        raise InvalidArgument(f"name: {shown(spec.name)} is not allowed; use 1-128 letters, digits, spaces "
                              "and . _ - %, starting with a letter or digit")
    if spec.advanced.seed > JOB_SEED.high:
        raise out_of_range("advanced.seed", spec.advanced.seed, f"{JOB_SEED.text()} (default {JOB_SEED.default})")
    if spec.HasField("init_adapter") and spec.init_adapter.name and spec.init_adapter.version < 0:
        raise out_of_range("init_adapter.version", spec.init_adapter.version, ">= 0 (0 = latest)")
    steps = total_steps(spec, n_prompts)
    return ResolvedJob(spec=spec, summary=summary(spec, steps), warnings=warnings, total_steps=steps)
