"""The spec's ranges, defaults and enum keys: the numbers every field's row (fields.py) and check reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

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
REWARD_WEIGHT = FloatRange(0.0, 100.0, 1.0)  # a reward's weight in a combination (reward.terms)
DEFAULT_REWARD = "math_pairs"  # the spec's "ideal first run"
MAX_REWARD_TERMS = 8
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
# The sampling controls (advanced.top_p, top_k, min_p, repetition_penalty): each default leaves the
# tempered distribution whole; top_k 0 and min_p 0 are off, as in vLLM and TRL.
TOP_P = FloatRange(0.01, 1.0, 1.0)
TOP_K = IntRange(0, 1000, 0)
MIN_P = FloatRange(0.0, 1.0, 0.0)
REPETITION_PENALTY = FloatRange(0.5, 2.0, 1.0)
# Temperatures below this are greedy, as in vLLM's sampler (`_SAMPLING_EPS`): evaluations ask for 0.
GREEDY_EPS = 1e-5
LORA_INITS = ("default", "gaussian")
DEFAULT_DATASET_SPLIT = "train"
GSM8K_SPLITS = BUNDLED_SPLITS  # the built-in copy's
CHECKPOINT_EVERY = IntRange(0, 100_000, 0)
# Steps of generation run ahead of training (0 = synchronous); a step trains on completions at most
# this many adapter versions old. The rollout server backend only.
MAX_ASYNC_STEPS = IntRange(0, 4, 0)
# environment.max_turns: assistant turns per episode; 0 (unset) = the environment's declared
# max_turns (EnvironmentInfo.max_turns), which resolve_spec writes into the resolved spec.
MAX_TURNS = IntRange(1, 64, 0)
# environment.max_episode_tokens: a whole episode's completion tokens (sampled + observations); 0
# (unset) = EPISODE_TOKENS_PER_TURN x grpo.max_completion_tokens (the per-turn cap), resolved.
MAX_EPISODE_TOKENS = IntRange(64, 32_768, 0)
EPISODE_TOKENS_PER_TURN = 4
# environment.settings: at most this many, keys a Python keyword's shape (a class declared with
# @environment takes them as its constructor's keyword arguments), values of bounded size.
MAX_ENVIRONMENT_SETTINGS = 32
SETTING_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
MAX_SETTING_CHARS = 1024
# The loop spec's own ranges (services/scheduler/loopspec.py validates; the console shows them).
MAX_ROUNDS = IntRange(1, 100, 8)
GIVE_UP_AFTER = IntRange(1, 100, 2)
MIN_GAIN = (0.0, 100.0)  # points
TARGET = (0.0, 100.0)  # percent, (low, high]
TARGET_ALLOWED = "a percent in (0, 100], the leaderboard's scale; required"
MIN_GAIN_ALLOWED = "0-100 points (unset = one standard error of the gain, paired question by question)"
# DAPO's clip-higher (advanced.epsilon_high): 0.2 = TRL's epsilon, the symmetric clip; DAPO uses 0.28.
EPSILON_HIGH = FloatRange(0.2, 1.0, 0.2)
# Optimizer passes over a step's batch (advanced.num_iterations, DeepSeekMath's mu) and optimizer steps
# per pass (advanced.mini_batches): above 1 the later updates train on completions of an earlier
# policy, the importance ratio moves away from 1 and the clip binds (engine.py, `grpo_args`).
NUM_ITERATIONS = IntRange(1, 8, 1)
MINI_BATCHES = IntRange(1, 16, 1)
# Evaluation while training (advanced.eval_every, eval_size): every N steps, greedy on the reward's
# held-out problems (services/trainer/job/heldout.py); 0 = off.
EVAL_EVERY = IntRange(0, 100_000, 0)
EVAL_SIZE = IntRange(8, 2000, 64)
# Supervised (SFT)'s card (JobSpec.sft). The learning rate is TRL's LoRA recipe's (SFTConfig
# learning_rate 2.0e-4, "about 10x the full fine-tuning rate for LoRA": TRL's PEFT integration docs;
# Thinking Machines' "LoRA Without Regret" finds the same factor), and so is the dropout (0.05).
SFT_LEARNING_RATE = FloatRange(1e-6, 1e-3, 2e-4)
SFT_BATCH_SIZE = IntRange(1, 256, 8)
SFT_MAX_SEQ_LENGTH = IntRange(32, 32_768, 1024)
LORA_DROPOUT = FloatRange(0.0, 0.5, 0.05)
SFT_MAX_STEPS_DEFAULT = -1  # Full: every example for the chosen epochs
TARGET_MODULES_RE = re.compile(r"^(all-linear|[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*)$")
# The Advanced Options an SFT or Head job reads (docs/sft.md, docs/head.md); the others, the reward and
# the GRPO card are Reinforcement (RLVR)'s: set on such a job they are dropped, with a warning (sft.py,
# `drop_rlvr_fields`), and their rows apply to RLVR jobs only (fields.py).
SFT_READS_ADVANCED = frozenset({"seed", "gpu_selection", "precision", "quantization", "gradient_checkpointing",
                                "checkpoint_every", "eval_every", "lora_init", "num_processes", "num_nodes",
                                "sharding"})
# The columns an SFT dataset holds: prompt and completion (text, or chat messages each), or messages.
SFT_COLUMN_SETS: tuple[tuple[str, ...], ...] = (("prompt", "completion"), ("messages",))
# Head's card (JobSpec.head). The learning rate is TRL's LoRA reward-model recipe's
# (examples/scripts/reward_modeling.py: --learning_rate 1.0e-4 with --use_peft, a sequence-classification
# head under a LoRA); rank 0 trains the head alone on the frozen base.
HEAD_LEARNING_RATE = FloatRange(1e-6, 1e-2, 1e-4)
HEAD_MAX_SEQ_LENGTH = IntRange(32, 32_768, 512)
HEAD_LORA_RANK = IntRange(0, 64, 8)
HEAD_TASK_NAMES: dict[int, str] = {C.HEAD_TASK_CLASSIFICATION: "classification", C.HEAD_TASK_REGRESSION: "regression"}
HEAD_TEXT_COLUMN, HEAD_LABEL_COLUMN = "text", "label"
JOB_SEED = IntRange(0, 2**32 - 1, 0)  # a job's seed also seeds numpy (transformers' set_seed), 32-bit
# Training processes of a job (data parallel through torch.distributed: torchrun, gloo on a CPU,
# NCCL on GPUs); one per device listed in gpu_selection.
NUM_PROCESSES = IntRange(1, 8, 1)
# Hosts (trainer workers) one job spans, num_processes on each, all in one torchrun rendezvous
# (services/trainer/job/distributed.py); the scheduler reserves that many idle workers, all or none.
NUM_NODES = IntRange(1, 16, 1)
# Training precision: "fp32" (default), or mixed precision over a base loaded in that dtype (the
# LoRA weights stay fp32). fp16 needs a CUDA device (torch's CPU autocast has no fp16 training).
# "auto": bf16 on a CUDA device that supports it, else fp32 (services/trainer/job/quantization.py,
# `effective_precision`, resolves it where the device is known).
Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISION_KEYS: dict[str, Precision] = {"auto": "auto", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
PRECISIONS = tuple(PRECISION_KEYS)
# advanced.gradient_checkpointing: "auto" turns it on for a model of this many parameters or more on
# a CUDA device (services/trainer/job/engine.py, `checkpointing_on`); on a CPU it only costs time.
CHECKPOINTING_CHOICES = ("auto", "on", "off")
CHECKPOINTING_PARAMETERS = 1_000_000_000
# How a job of several processes holds the model (advanced.sharding): "ddp" a whole copy on each
# process, gradients averaged; "fsdp" the weights, gradients and optimizer state sharded across the
# processes (FSDP2 through accelerate: services/trainer/job/engine.py, `fsdp_args`).
Sharding = Literal["ddp", "fsdp"]
SHARDINGS: tuple[Sharding, ...] = ("ddp", "fsdp")

BACKEND_NAMES: dict[int, str] = {
    C.GENERATION_BACKEND_VLLM: "vLLM (rollout server)",
    C.GENERATION_BACKEND_VLLM_COLOCATE: "vLLM (colocate)",
    C.GENERATION_BACKEND_TRANSFORMERS: "Transformers (in-process)",
}
LossType = Literal["grpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo"]
Quantization = Literal["full", "4bit", "8bit"]
# "vllm": the rollout server; "vllm_colocate": a vLLM engine in the job's process; "transformers": in-process.
Backend = Literal["vllm", "vllm_colocate", "transformers"]
RewardName = str  # a reward's key (rlvr/rewards/registry.py): "math_pairs", "gsm8k", a plugin's, ...

# Each enum's short key, declared once: the trainer's JobConfig and the CLI's choices (`rlvr train
# --reward gsm8k`, with "-" for "_") derive from these. The RewardFunction enum names the spec's three
# built-in rewards; their key is the same reward's registry key (rlvr/tasks/<task>.py declares each).
REWARD_KEYS: dict[common_pb2.RewardFunction, RewardName] = {
    C.REWARD_FUNCTION_MATH_PAIRS: "math_pairs",
    C.REWARD_FUNCTION_GSM8K: "gsm8k",
    C.REWARD_FUNCTION_BOXED: "boxed",
}
REWARD_FUNCTIONS: dict[str, common_pb2.RewardFunction] = {key: value for value, key in REWARD_KEYS.items()}
LOSS_NAMES: dict[int, LossType] = {C.LOSS_TYPE_GRPO: "grpo", C.LOSS_TYPE_DAPO: "dapo", C.LOSS_TYPE_DR_GRPO: "dr_grpo",
                                   C.LOSS_TYPE_GSPO: "gspo", C.LOSS_TYPE_CISPO: "cispo", C.LOSS_TYPE_SAPO: "sapo"}
# The losses that clip the importance ratio at 1 - 0.2 / 1 + advanced.epsilon_high; the others bound it
# their own way, written here (the Training Summary and the refusal of an epsilon_high they ignore).
CLIPPED_LOSSES: tuple[LossType, ...] = ("grpo", "dapo", "dr_grpo")
OWN_BOUNDS: dict[str, str] = {
    "gspo": "gspo clips its sequence-level ratio at 1 - 3e-4 / 1 + 4e-4 (the GSPO paper's)",
    "cispo": "cispo clips its detached importance weight at 5 (ScaleRL's epsilon_max)",
    "sapo": "sapo gates the ratio smoothly (temperatures 1.0 and 1.05) instead of clipping it",
}
Method = Literal["rlvr", "sft", "head"]
METHOD_KEYS: dict[int, Method] = {C.TRAINING_METHOD_RLVR: "rlvr", C.TRAINING_METHOD_SFT: "sft",
                                  C.TRAINING_METHOD_HEAD: "head"}
METHOD_NAMES: dict[int, str] = {C.TRAINING_METHOD_RLVR: "RLVR (GRPO)", C.TRAINING_METHOD_SFT: "Supervised (SFT)",
                                C.TRAINING_METHOD_HEAD: "Head"}
QUANT_KEYS: dict[int, Quantization] = {C.QUANTIZATION_FULL: "full", C.QUANTIZATION_4BIT: "4bit",
                                       C.QUANTIZATION_8BIT: "8bit"}
BACKEND_KEYS: dict[int, Backend] = {
    C.GENERATION_BACKEND_VLLM: "vllm",
    C.GENERATION_BACKEND_VLLM_COLOCATE: "vllm_colocate",
    C.GENERATION_BACKEND_TRANSFORMERS: "transformers",
}
QUANT_NAMES: dict[int, str] = {C.QUANTIZATION_FULL: "Full Precision", C.QUANTIZATION_4BIT: "4-bit QLoRA",
                               C.QUANTIZATION_8BIT: "8-bit"}

# "map": a map<string, string> field (KEY=VALUE pairs: environment.settings).
FieldKind = Literal["int", "float", "bool", "text", "enum", "word", "map"]
# Where a field applies ("" = every job): rewards that generate their prompts, rewards that read a
# dataset, the vLLM (colocate) backend, the vLLM (rollout server) backend, jobs with an environment.
Applies = Literal["", "generated", "dataset", "colocate", "vllm", "environment", "sft", "head", "rlvr"]
APPLIES_NOTES: dict[str, str] = {"generated": "rewards that generate their prompts only",
                                 "dataset": "rewards that read a dataset only", "colocate": "vLLM (colocate) only",
                                 "vllm": "vLLM (rollout server) only", "environment": "jobs with an environment only",
                                 "sft": "Supervised (SFT) jobs only", "head": "Head jobs only",
                                 "rlvr": "Reinforcement (RLVR) jobs only"}


def one_update_per_step(a: common_pb2.AdvancedOptions) -> bool:
    """Whether a job makes one optimizer step per generated batch (num_iterations 1, mini_batches 1):
    then the loss's importance ratio is exactly 1 and no clip binds."""
    return a.num_iterations <= 1 and a.mini_batches <= 1


def clip_inactive(a: common_pb2.AdvancedOptions) -> bool:
    """Whether advanced.epsilon_high changes nothing for these options: a loss that bounds its ratio
    its own way (OWN_BOUNDS), or one optimizer step per batch (the ratio is 1)."""
    return LOSS_NAMES.get(a.loss_type, "") in OWN_BOUNDS or one_update_per_step(a)


MERGE_DTYPES = PRECISIONS  # a merged checkpoint's dtype: "auto" (the base model's) or one of the precisions


def merge_dtype(value: str, field: str = "dtype") -> str:
    """A merge's dtype ("" is "auto"), or InvalidArgument naming the allowed values."""
    from rlvr.common.errors import InvalidArgument

    key = value or "auto"
    if key not in MERGE_DTYPES:
        raise InvalidArgument(f"{field}: {value!r} is not a dtype to merge in; use "
                              f"{', '.join(repr(d) for d in MERGE_DTYPES)} (\"auto\", the default, keeps the "
                              "base model's)")
    return key
