"""Job spec validation and the Training Summary: the one place where the spec's ranges and
defaults live (the proto comments state the same numbers; tests/test_spec_docs.py checks they agree).

`SPEC_FIELDS` declares the spec's user-facing fields once, a row each: path, label, help, range or
choices, default, and which reward or backend it applies to. Everything else is derived from it:
the CLI's flags and help (clients/commands/train.py), the console's form, hints and limits
(clients/web/forms.py, limits.py), the trainer's JobConfig (services/trainer/job/config.py, by field
name), the Training Summary's extra rows, docs/spec-fields.md and the proto-comment test. A plain
ranged field (`checked`) is validated from its row alone: adding one is its proto field and a row.

`resolve_spec` takes the JobSpec a user sent and returns it with every default filled in and the
batch size rounded up to a multiple of the group size, plus the warnings to show; values out of
range raise one InvalidArgument naming every bad field, its value and its range (`Violations`). It is pure: no store, no
gRPC, so the CLI's dry run, the scheduler and the tests share it.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rlvr.common.errors import FailedPrecondition, InvalidArgument, Violations, bounded, out_of_range, shown
from rlvr.environments.base import KEY_RE as ENVIRONMENT_KEY_RE
from rlvr.environments.base import KEY_RULE as ENVIRONMENT_KEY_RULE
from rlvr.environments.base import EnvironmentInfo
from rlvr.rewards.registry import KEY_RE as REWARD_KEY_RE
from rlvr.rewards.registry import KEY_RULE as REWARD_KEY_RULE
from rlvr.rewards.registry import Catalog, RewardInfo, UnavailableReward, UnknownReward, load_registry
from rlvr.tasks.gsm8k import BUNDLED_SPLITS
from rlvr.tracking.config import validate_tracking
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
Applies = Literal["", "generated", "dataset", "colocate", "vllm", "environment"]
APPLIES_NOTES: dict[str, str] = {"generated": "rewards that generate their prompts only",
                                 "dataset": "rewards that read a dataset only", "colocate": "vLLM (colocate) only",
                                 "vllm": "vLLM (rollout server) only", "environment": "jobs with an environment only"}


@dataclass(frozen=True)
class SpecField:
    """One field of the JobSpec, declared once (see the module's docstring for what derives from it)."""

    path: str                                # the JobSpec path: "grpo.lora_rank" (the error's and the form's name)
    label: str                               # the console's label and the Training Summary's
    help: str                                # the one wording: CLI --help, the console's hint, the docs
    kind: FieldKind
    card: Literal["run", "reward", "grpo", "advanced"]  # where the console shows it
    range: IntRange | FloatRange | None = None
    choices: tuple[str, ...] = ()            # a word field's closed list (the first is the default)
    names: Mapping[int, str] | None = None   # an enum field's value -> display name
    default: object = None                   # when no range holds it
    allowed_text: str = ""                   # the allowed values in words, when not range or choices
    applies: Applies = ""
    flag: str = ""                           # `rlvr train`'s flag ("" = a hand-written flag or none)
    config: str | None = ""                  # JobConfig's name ("" = the field's name; None = not in it)
    unset: object = None                     # JobConfig's value when the field is unset (None = the default)
    checked: bool = False                    # validated from the row alone (presence, range, default)
    summary: bool = False                    # a row of the Training Summary (TrainingSummary.settings)

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def group(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def config_name(self) -> str | None:
        return None if self.config is None else self.config or self.name

    @property
    def default_value(self) -> object:
        if self.range is not None:
            return self.range.default
        if self.choices:
            return self.choices[0]
        return self.default

    def default_text(self) -> str:
        value = self.default_value
        return f"{value:g}" if isinstance(value, float) else "" if value is None else str(value)

    def allowed(self) -> str:
        """The allowed values as an INVALID_ARGUMENT names them: `4-64 (default 8)`."""
        if self.allowed_text:
            return self.allowed_text
        if self.range is not None:
            return f"{self.range.text()} (default {self.default_text()})"
        if self.choices:
            quoted = [f'"{c}"' for c in self.choices]
            words = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
            return f'{words} (default "{self.choices[0]}")'
        if self.names:
            return ", ".join(f"{k} ({v})" for k, v in self.names.items())
        return ""

    def shown(self, value: object) -> str:
        """A value as the Training Summary shows it."""
        if self.names is not None and isinstance(value, int):
            return self.names.get(value, str(value))
        if isinstance(value, bool):
            return "on" if value else "off"
        return f"{value:g}" if isinstance(value, float) else str(value)


def _card(card: Literal["run", "reward", "grpo", "advanced"]) -> Any:
    return lambda *args, **kw: SpecField(*args, card=card, **kw)  # type: ignore[misc]


_RUN, _REWARD, _GRPO, _ADVANCED = _card("run"), _card("reward"), _card("grpo"), _card("advanced")

# The rows in the console's order, card by card. A new field: its proto field, then a row here.
SPEC_FIELDS: tuple[SpecField, ...] = (
    _RUN("name", "Name", "Labels the run; default: derived from the model and the loss type.", "text", config=None),
    _RUN("base_model", "Base model", "A Hugging Face hub id, a bundled tiny model, or a model folder under the "
         "model roots by its path or its bare name (`rlvr models import`).", "text",
         default=DEFAULT_BASE_MODEL, config=None),
    _REWARD("reward.key", "Reward", "The reward, by key (`rlvr rewards` lists them).", "word", default=DEFAULT_REWARD,
            config=None),
    _REWARD("reward.synthetic_prompts", "Synthetic prompts", "How many problems to generate on the fly.", "int",
            range=SYNTHETIC_PROMPTS, applies="generated", flag="--synthetic-prompts", unset=0),
    _REWARD("reward.format_bonus", "Format bonus",
            "A small extra reward for wrapping the answer in <think>…</think><answer>…</answer>, on top of "
            "whether the answer itself was correct.", "bool", default=True),
    _REWARD("reward.dataset", "Dataset",
            "A Hugging Face dataset or a local JSONL/Parquet/CSV file with prompt and ground_truth columns (and "
            "those the reward reads); for reasoning_gym, the name of one of its tasks.", "text", applies="dataset", flag="--dataset", default=""),
    _REWARD("environment.key", "Environment",
            "A multi-turn agent job: the environment each prompt's episode runs in (its tools and replies), by "
            "key (as ListEnvironments lists them). Empty: a single-answer job.", "text", default="",
            allowed_text='an installed environment\'s key, or "" for none (default "")', flag="--environment",
            config="environment", summary=True),
    _REWARD("environment.max_turns", "Max turns", "Assistant turns per episode at most.", "int", default=0,
            allowed_text=f"{MAX_TURNS.text()} (default 0: the environment's declared max_turns)",
            applies="environment", flag="--max-turns", summary=True),
    _REWARD("environment.max_episode_tokens", "Max episode tokens",
            "Cap on a whole episode's completion tokens (sampled plus tool and environment observations); Max "
            "completion caps each turn.", "int", default=0,
            allowed_text=f"{MAX_EPISODE_TOKENS.text()} (default 0: {EPISODE_TOKENS_PER_TURN} x Max completion)",
            applies="environment", flag="--max-episode-tokens"),
    _REWARD("environment.settings", "Environment settings",
            "The environment's own settings, KEY=VALUE, passed to each episode's instance (`rlvr train "
            "--environment-setting KEY=VALUE`, repeated).", "map", default="",
            allowed_text=f"at most {MAX_ENVIRONMENT_SETTINGS} KEY=VALUE pairs; keys 1-64 letters, digits and _ "
                         f"starting with a letter, values at most {MAX_SETTING_CHARS} characters",
            applies="environment", config="environment_settings"),
    _GRPO("grpo.group_size", "Group size", "Rollouts generated per prompt: the group GRPO compares against itself.",
          "int", range=GROUP_SIZE, flag="--group-size", checked=True),
    _GRPO("grpo.max_completion_tokens", "Max completion", "Cap on how long each generated answer can be, in tokens.",
          "int", range=MAX_COMPLETION, flag="--max-completion", checked=True),
    _GRPO("grpo.lora_rank", "Rank (r)", "LoRA adapter capacity.", "int", range=LORA_RANK, flag="--rank",
          checked=True),
    _GRPO("grpo.lora_alpha", "Alpha", "LoRA scaling factor.", "int", range=LORA_ALPHA, flag="--alpha", checked=True),
    _GRPO("grpo.learning_rate", "Learning Rate", "Deliberately lower than SFT's range: RL updates are noisier.",
          "float", range=LEARNING_RATE, flag="--lr", checked=True),
    _GRPO("grpo.max_steps", "Max Steps",
          "Full (-1) trains every prompt for the chosen epochs instead of stopping at a fixed step count.", "int",
          default=MAX_STEPS_DEFAULT, allowed_text=f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default {MAX_STEPS_DEFAULT})",
          flag="--max-steps"),
    _GRPO("grpo.batch_size", "Batch Size", "Examples per gradient step; should be a multiple of Group size.", "int",
          default=BATCH_SIZE_DEFAULT,
          allowed_text=f"one of {', '.join(map(str, BATCH_SIZES))} (default {BATCH_SIZE_DEFAULT})",
          flag="--batch-size"),
    _ADVANCED("advanced.loss_type", "Loss Type",
              "The GRPO loss: grpo, dapo or dr_grpo (token ratios clipped at epsilon_high); gspo (a sequence-level "
              "ratio), cispo (a clipped, detached importance weight) or sapo (a soft gate). The ratio moves only "
              "with Iterations or Mini-batches above 1.", "enum", names=LOSS_NAMES, default=C.LOSS_TYPE_GRPO),
    _ADVANCED("advanced.epochs", "Epochs", "Passes over the prompts when Max Steps is Full.", "int", range=EPOCHS,
              flag="--epochs", checked=True),
    _ADVANCED("advanced.quantization", "Quantization", "The base model's weights: full, 4-bit or 8-bit.", "enum",
              names=QUANT_NAMES, default=C.QUANTIZATION_FULL),
    _ADVANCED("advanced.generation_backend", "Generation Backend",
              "vLLM (colocate) is fast and shares the training GPU; Transformers runs in-process (use it if vLLM "
              "runs out of memory); vLLM (rollout server) generates on the dedicated rollout service.", "enum",
              names=BACKEND_NAMES, default=C.GENERATION_BACKEND_VLLM),
    _ADVANCED("advanced.gpu_memory_fraction", "GPU memory",
              "How much of the training GPU vLLM (colocate) keeps for itself.", "float", range=GPU_MEMORY_FRACTION,
              applies="colocate", flag="--gpu-memory"),
    _ADVANCED("advanced.gpu_selection", "GPU Selection", 'Which devices train: "auto", "cpu" or indices "0,1".',
              "text", default="auto", allowed_text='"auto", "cpu", or a comma list of device indices such as "0,1"',
              flag="--gpu"),
    _ADVANCED("advanced.num_processes", "Processes",
              "Training processes, data parallel: one per device GPU Selection lists.", "int", range=NUM_PROCESSES,
              flag="--processes"),
    _ADVANCED("advanced.sharding", "Sharding",
              "With several processes: ddp keeps a whole model on each; fsdp shards the weights, gradients and "
              "optimizer state across them (for a base that does not fit one device).", "word", choices=SHARDINGS),
    _ADVANCED("advanced.num_nodes", "Nodes",
              "Trainer workers (hosts) the job spans, Processes on each: reserved all or none.", "int",
              range=NUM_NODES, flag="--nodes"),
    _ADVANCED("advanced.precision", "Precision",
              "auto (bf16 on a CUDA device that supports it, fp32 elsewhere), fp32, or mixed precision (bf16; "
              "fp16 needs a CUDA device).", "word", choices=PRECISIONS),
    _ADVANCED("advanced.gradient_checkpointing", "Gradient checkpointing",
              "Recompute the forward's activations in the backward: less memory, about a third more compute. auto: "
              "on for a model of 1B parameters or more on a CUDA device, off on a CPU.", "word",
              choices=CHECKPOINTING_CHOICES),
    _ADVANCED("advanced.kl_beta", "KL beta", "KL coefficient against the base model.", "float", range=KL_BETA,
              flag="--kl-beta", checked=True),
    _ADVANCED("advanced.temperature", "Temperature", "Sampling temperature of the rollouts.", "float",
              range=TEMPERATURE, flag="--temperature", checked=True),
    _ADVANCED("advanced.top_p", "Top-p",
              "Nucleus sampling: keep the most likely tokens whose mass reaches this (1 = off). Like top-k, min-p "
              "and the repetition penalty, on every backend alike; the loss scores the whole tempered policy "
              "(docs/jobs.md, Sampling controls).", "float", range=TOP_P, flag="--top-p", checked=True),
    _ADVANCED("advanced.top_k", "Top-k", "Keep only the k most likely tokens (0 = off).", "int", range=TOP_K,
              flag="--top-k", checked=True),
    _ADVANCED("advanced.min_p", "Min-p", "Drop tokens less likely than this times the most likely one (0 = off).",
              "float", range=MIN_P, flag="--min-p", checked=True),
    _ADVANCED("advanced.repetition_penalty", "Repetition penalty",
              "Penalise tokens already in the prompt or the completion: above 1 discourages repeats, below 1 "
              "encourages them (1 = off).", "float", range=REPETITION_PENALTY, flag="--repetition-penalty",
              checked=True),
    _ADVANCED("reward.format_bonus_weight", "Format bonus weight", "Size of the format bonus when earned.", "float",
              range=FORMAT_BONUS_WEIGHT, flag="--format-bonus-weight", checked=True),
    _ADVANCED("advanced.seed", "Seed", "Seed for prompts, sampling and initialisation.", "int", range=JOB_SEED,
              flag="--seed"),
    _ADVANCED("advanced.checkpoint_every", "Checkpoint every",
              "Save a PEFT checkpoint every N steps (0 = only the final adapter).", "int", range=CHECKPOINT_EVERY,
              flag="--checkpoint-every", checked=True),
    _ADVANCED("advanced.lora_init", "LoRA init",
              "peft's kaiming-uniform A (default) or the LoRA paper's gaussian N(0, 1/r).", "word", choices=LORA_INITS),
    _ADVANCED("advanced.dynamic_sampling", "Dynamic sampling",
              "DAPO's dynamic sampling: replace groups without a reward spread by further prompts' groups.", "bool",
              default=False),
    _ADVANCED("advanced.max_async_steps", "Max async steps",
              "Generate the next steps on the rollout server while this one trains (0 = synchronous); a step "
              "trains on completions at most this many adapter versions old.", "int", range=MAX_ASYNC_STEPS,
              applies="vllm", flag="--max-async-steps"),
    _ADVANCED("advanced.epsilon_high", "Epsilon high",
              "DAPO's clip-higher: the importance ratio's upper clip is 1 + this (the lower stays 1 - 0.2); DAPO "
              "uses 0.28, 0.2 is the symmetric clip. It binds only with Iterations or Mini-batches above 1 (else "
              "the ratio is 1), and only for the grpo, dapo and dr_grpo losses.", "float", range=EPSILON_HIGH,
              flag="--epsilon-high", checked=True, summary=True),
    _ADVANCED("advanced.num_iterations", "Iterations",
              "Optimizer passes over each step's batch (DeepSeekMath's mu): the passes after the first train on "
              "completions of an earlier policy, which is what the clip and the loss's ratio act on.", "int",
              range=NUM_ITERATIONS, flag="--num-iterations", checked=True, summary=True),
    _ADVANCED("advanced.mini_batches", "Mini-batches",
              "Optimizer steps per pass over a step's batch, each on its own share of the completions; must "
              "divide each process's share of Batch Size.", "int", range=MINI_BATCHES, flag="--mini-batches",
              checked=True, summary=True),
    _ADVANCED("advanced.eval_every", "Evaluate every",
              "Every N steps (and at the last), the adapter's greedy accuracy on the reward's held-out problems, "
              "a line of the RL Metrics chart (0 = off).", "int", range=EVAL_EVERY, flag="--eval-every",
              checked=True, summary=True),
    _ADVANCED("advanced.eval_size", "Evaluation size",
              "Held-out problems each evaluation while training answers (the first of the held-out split).", "int",
              range=EVAL_SIZE, flag="--eval-size", checked=True),
    _ADVANCED("advanced.mask_truncated_completions", "Mask truncated",
              "DAPO's overlong masking: completions cut at Max completion are left out of the loss "
              "(`rlvr train --mask-truncated`).", "bool",
              default=False, summary=True),
)
FIELDS_BY_PATH: dict[str, SpecField] = {f.path: f for f in SPEC_FIELDS}
# The sampling controls beyond temperature: JobConfig, Sampling, SamplingSpec and AdvancedOptions
# carry each under this name.
SAMPLING_CONTROLS = ("top_p", "top_k", "min_p", "repetition_penalty")
SAMPLING_PATHS = tuple(f"advanced.{name}" for name in SAMPLING_CONTROLS)


def reshaped_sampling(values: object) -> list[str]:
    """The sampling controls `values` (an AdvancedOptions, a JobConfig, a Sampling) sets off their
    defaults, as "top_p 0.9": a sampler whose distribution is no longer the whole tempered policy."""
    return [f"{name} {getattr(values, name):.7g}" for name, path in zip(SAMPLING_CONTROLS, SAMPLING_PATHS, strict=True)
            if getattr(values, name) != FIELDS_BY_PATH[path].default_value]


def proto_field(row: SpecField) -> FieldDescriptor:
    """The row's field in the JobSpec's descriptor."""
    desc = C.JobSpec.DESCRIPTOR
    for part in row.group.split(".") if row.group else ():
        desc = desc.fields_by_name[part].message_type
    return desc.fields_by_name[row.name]


def _message_of(spec: Message, row: SpecField) -> Message:
    msg = spec
    for part in row.group.split(".") if row.group else ():
        msg = getattr(msg, part)
    return msg


def value_of(spec: Message, row: SpecField) -> object:
    """The row's value in a (resolved) JobSpec; `row.unset` (or the default) where it is unset."""
    msg = _message_of(spec, row)
    if proto_field(row).has_presence and not msg.HasField(row.name):
        return row.default_value if row.unset is None else row.unset
    return getattr(msg, row.name)


def settings_of(spec: common_pb2.JobSpec) -> dict[str, str]:
    """TrainingSummary.settings: the summary rows' values, by path (the environment's rows only for a
    job with an environment); epsilon_high says "(inactive)" where it binds nowhere (`clip_inactive`;
    docs/jobs.md and the submit's warning or refusal say why)."""
    out = {row.path: row.shown(value_of(spec, row)) for row in SPEC_FIELDS
           if row.summary and (row.group != "environment" or spec.environment.key)}
    if clip_inactive(spec.advanced) and "advanced.epsilon_high" in out:
        out["advanced.epsilon_high"] += " (inactive)"
    return out


def fields_markdown() -> str:
    """docs/spec-fields.md: the job spec's field reference, written from the table
    (tests/test_spec_docs.py checks the file is current)."""
    lines = ["# Job spec fields", "",
             "Every field of a JobSpec a user sets, from `rlvr/jobspec.py`'s table (`SPEC_FIELDS`), which the",
             "CLI, the web console and the trainer also read. Regenerate after changing the table:",
             "`.venv/bin/python -c 'from rlvr.jobspec import fields_markdown as f; print(f(), end=\"\")' > "
             "docs/spec-fields.md`.", ""]
    for card, title in (("run", "Run"), ("reward", "Reward Function"), ("grpo", "GRPO Configuration"),
                        ("advanced", "Advanced Options")):
        lines += [f"## {title}", "", "| Field | Label | Allowed | CLI | Applies to | Description |",
                  "|---|---|---|---|---|---|"]
        for row in SPEC_FIELDS:
            if row.card == card:
                allowed = row.allowed() or (f"default {row.default_text()}" if row.default_text() else "")
                cells = [f"`{row.path}`", row.label, allowed, f"`{row.flag}`" if row.flag else "",
                         APPLIES_NOTES.get(row.applies, "every job"), row.help]
                lines.append("| " + " | ".join(c.replace("|", "\\|").replace("<", "&lt;") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _checked(spec: common_pb2.JobSpec, group: str, v: Violations) -> None:
    """Every `checked` row of `group`: unset takes the default, a set value must be in range."""
    for row in SPEC_FIELDS:
        if row.checked and row.group == group:
            rng = row.range
            with v.check():
                if isinstance(rng, IntRange):
                    _int(_message_of(spec, row), row.name, row.path, rng)
                elif isinstance(rng, FloatRange):
                    _float(_message_of(spec, row), row.name, row.path, rng)


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


def reward_terms(r: common_pb2.RewardConfig | Any, prefix: str = "reward.") -> list[common_pb2.RewardTerm]:
    """reward.function / reward.key / reward.terms as the terms of the job, each key checked for its
    shape and each weight for its range: one InvalidArgument naming every bad field, under `prefix`.
    `r` is a RewardConfig, or any message with the same fields (a ScoreRequest, prefix "")."""
    v = Violations()
    fn = r.function
    if fn and fn not in REWARD_KEYS:
        v.add(out_of_range(f"{prefix}function", fn, ", ".join(f"{k} ({C.RewardFunction.Name(k)})" for k in REWARD_KEYS)))
        fn = C.REWARD_FUNCTION_UNSPECIFIED
    key = r.key.strip()
    if key and not REWARD_KEY_RE.match(key):
        v.add(InvalidArgument(f"{prefix}key: {shown(key)} is not a reward key ({REWARD_KEY_RULE})"))
    elif fn and key and key != REWARD_KEYS[fn]:
        v.add(InvalidArgument(f"{prefix}key: {key!r} disagrees with {prefix}function {C.RewardFunction.Name(fn)} "
                              f"({REWARD_KEYS[fn]!r}); set one of them"))
    key = key or (REWARD_KEYS[fn] if fn else "")
    terms = [common_pb2.RewardTerm(key=t.key.strip(), weight=t.weight if t.HasField("weight") else REWARD_WEIGHT.default)
             for t in getattr(r, "terms", ())]
    if not terms:
        v.raise_any()
        return [common_pb2.RewardTerm(key=key or DEFAULT_REWARD, weight=REWARD_WEIGHT.default)]
    seen: set[str] = set()
    for i, term in enumerate(terms):
        if not REWARD_KEY_RE.match(term.key):
            v.add(InvalidArgument(f"{prefix}terms[{i}].key: {shown(term.key)} is not a reward key ({REWARD_KEY_RULE})"))
        elif term.key in seen:
            v.add(InvalidArgument(f"{prefix}terms[{i}].key: {term.key!r} is named twice; give each reward once"))
        seen.add(term.key)
        with v.check():
            _float(term, "weight", f"{prefix}terms[{i}].weight", REWARD_WEIGHT)
    if key and key != terms[0].key and not v.bad(f"{prefix}key", f"{prefix}function", f"{prefix}terms[0].key"):
        field = f"{prefix}key" if r.key.strip() else f"{prefix}function"
        v.add(InvalidArgument(f"{field}: {key!r} is not {prefix}terms[0].key ({terms[0].key!r}); the first term is "
                              "the job's reward: name it once"))
    weights_bad = any(v.bad(f"{prefix}terms[{i}].weight") for i in range(len(terms)))
    if not weights_bad and not any(t.weight > 0 for t in terms):
        v.add(InvalidArgument(f"{prefix}terms: every weight is 0; at least one reward must count (range "
                              f"{REWARD_WEIGHT.text()}, default {REWARD_WEIGHT.default:g})"))
    v.raise_any()
    return terms


def _known(catalog: Catalog | None, key: str, field: str) -> RewardInfo | None:
    """The reward's declaration: from `catalog` (unknown: InvalidArgument listing the known keys; one
    that failed to load: FailedPrecondition with its error), or without one from this process's
    registry, where a reward it lacks is left for the reward service to check (None)."""
    if catalog is None:
        return load_registry().rewards.get(key)
    try:
        return catalog.get(key)
    except UnavailableReward as e:
        raise FailedPrecondition(f"{field}: {e}") from None
    except UnknownReward:
        raise InvalidArgument(f"{field}: {key!r} is not a reward the reward service has; known: "
                              f"{', '.join(catalog.rewards) or 'none'}") from None


def generates_prompts(info: RewardInfo | None, dataset: str) -> bool:
    """The reward makes its training prompts itself (Math Pairs; the code reward without a dataset; a
    reasoning-gym task, which its Dataset field names): the Synthetic prompts field sets how many."""
    if info is not None and info.dataset_names:
        return True
    return info is not None and not info.needs_dataset and not info.splits and not (info.accepts_dataset and dataset)


def _validate_reward(spec: common_pb2.JobSpec, warnings: list[str], catalog: Catalog | None, v: Violations) -> None:
    if not v.bad("reward"):  # a reward field refused already (over its size limit) is not read further
        _validate_reward_data(spec, warnings, catalog, v)
    _checked(spec, "reward", v)


def _validate_reward_data(spec: common_pb2.JobSpec, warnings: list[str], catalog: Catalog | None,
                          v: Violations) -> None:
    """The reward's terms and keys, then its data fields, which read the rewards' declarations: every
    bad term or key at once, and when they are good every bad data field at once."""
    r = spec.reward
    try:
        terms = reward_terms(r)
    except InvalidArgument as e:
        v.add(e)
        return
    field = (lambda i: f"reward.terms[{i}].key") if r.terms else (lambda i: "reward.key")
    known = Violations()
    infos: list[RewardInfo | None] = []
    for i, t in enumerate(terms):
        infos.append(None)
        with known.check():
            infos[i] = _known(catalog, t.key, field(i))
    if known.errors:
        v.errors.extend(known.errors)
        return
    del r.terms[:]
    r.terms.extend(terms)
    info = infos[0]
    r.key = terms[0].key
    r.function = REWARD_FUNCTIONS.get(r.key, C.REWARD_FUNCTION_UNSPECIFIED)
    r.accuracy_key = r.accuracy_key.strip() or r.key
    if r.accuracy_key not in {t.key for t in terms}:
        v.add(InvalidArgument(f"reward.accuracy_key: {shown(r.accuracy_key)} is not a key of the job's rewards "
                              f"({', '.join(t.key for t in terms)})"))
    name = info.display_name if info is not None else r.key
    r.dataset = r.dataset.strip()
    if generates_prompts(info, r.dataset):
        with v.check():
            _int(r, "synthetic_prompts", "reward.synthetic_prompts", SYNTHETIC_PROMPTS)
    elif r.HasField("synthetic_prompts"):
        warnings.append(f"reward.synthetic_prompts is only used by rewards that generate their prompts (Math "
                        f"Pairs); ignored for {name}")
        r.ClearField("synthetic_prompts")
    if not r.HasField("format_bonus"):
        r.format_bonus = True
    if info is None or info.needs_dataset or (info.accepts_dataset and r.dataset):
        if info is not None and info.dataset_names:  # the Dataset field names one of the reward's own tasks
            if r.dataset.partition("?")[0] not in info.dataset_names:
                what = f"{shown(r.dataset)} is not a task of {name}" if r.dataset else f"required for {name}"
                v.add(InvalidArgument(f"reward.dataset: {what}; its tasks: {', '.join(info.dataset_names)}"))
            split = r.dataset_split.strip()
            if split and split != DEFAULT_DATASET_SPLIT:  # its "test" split is the held-out pool benchmarks score
                v.add(InvalidArgument(f"reward.dataset_split: {shown(split)}: {name} trains on its "
                                      f"{DEFAULT_DATASET_SPLIT!r} split only (its held-out split is for evaluations)"))
        elif info is not None and info.needs_dataset and not r.dataset:
            v.add(InvalidArgument(f"reward.dataset: required for {name} (a Hugging Face dataset name, a local "
                                  "JSONL/Parquet/CSV file or a folder of split files, with prompt and ground_truth"
                                  + "".join(f", {c}" for c in info.columns) + " columns)"))
        if r.dataset:  # checked against the data at submit (the scheduler: services/scheduler/datasets.py)
            r.dataset_split = r.dataset_split.strip() or DEFAULT_DATASET_SPLIT
    else:
        if r.dataset:
            why = f" (it uses {info.data_name})" if info.data_name else " (its prompts are self-generated)"
            warnings.append(f"reward.dataset {r.dataset!r} is ignored for {name}{why}")
            r.dataset = ""
        if info.splits:
            r.dataset_split = r.dataset_split.strip() or DEFAULT_DATASET_SPLIT
            if r.dataset_split not in info.splits:
                v.add(out_of_range("reward.dataset_split", r.dataset_split,
                                   f"a split of {info.data_name or name}: {', '.join(info.splits)} (default train)"))
        elif r.dataset_split:
            warnings.append(f"reward.dataset_split {r.dataset_split!r} is ignored for {name} (its prompts "
                            "are self-generated; its held-out set is the benchmark's)")
            r.dataset_split = ""
    if info is not None and not r.dataset and not v.bad("reward.dataset"):
        # the problems are the reward's own: they hold its columns
        for i, (term, term_info) in enumerate(zip(terms, infos, strict=True)):
            missing = [c for c in (term_info.columns if term_info else ()) if c not in info.columns]
            if i and missing:
                v.add(InvalidArgument(
                    f"reward.terms[{i}].key: {term.key!r} reads the column {missing[0]!r}, which {name}'s own "
                    f"prompts do not have (they have: {', '.join(info.columns) or 'no other columns'}); "
                    "combine it with a reward that reads a dataset holding it"))


class EnvironmentCatalog(Protocol):
    """What a job's environment is checked against: the loaded environments' declarations by key,
    and why the others did not load (key -> error). rlvr/environments/registry.py's Catalog is one;
    `EnvironmentChoices` is the plain one (tests, and none at all where no registry is installed)."""

    @property
    def environments(self) -> Mapping[str, EnvironmentInfo]: ...

    @property
    def failed(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class EnvironmentChoices:
    environments: Mapping[str, EnvironmentInfo] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)


def _environment_catalog() -> EnvironmentCatalog:
    """This process's environments (rlvr/environments/registry.py's `load_registry`), imported when
    first asked; a build without the registry knows none, so any key is refused as unknown."""
    try:  # by name: this module type-checks the same before and after the registry exists
        registry = importlib.import_module("rlvr.environments.registry")
    except ImportError:
        return EnvironmentChoices()
    catalog: EnvironmentCatalog = registry.load_registry()
    return catalog


def environment_info(key: str, catalog: EnvironmentCatalog | None = None) -> EnvironmentInfo | None:
    """The declaration of the environment a (resolved) spec names; None for "" or an unknown key."""
    if not key:
        return None
    return (catalog if catalog is not None else _environment_catalog()).environments.get(key)


def _validate_environment(spec: common_pb2.JobSpec, warnings: list[str], catalog: EnvironmentCatalog | None,
                          rewards: Catalog | None, v: Violations) -> None:
    """JobSpec.environment: the key against `catalog`, the settings, and max_turns and
    max_episode_tokens filled from the environment and the per-turn cap. Without a key the other
    fields are ignored (with a warning) and the whole message is cleared: a single-answer job."""
    e = spec.environment
    if v.bad("environment"):  # over its size limit already
        return
    e.key = e.key.strip()
    if not e.key:
        ignored = [name for name, given in (("environment.settings", bool(e.settings)),
                                            ("environment.max_turns", bool(e.max_turns)),
                                            ("environment.max_episode_tokens", bool(e.max_episode_tokens))) if given]
        if ignored:
            warnings.append(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored without an "
                            "environment (environment.key is empty)")
        spec.ClearField("environment")
        return
    info: EnvironmentInfo | None = None
    if not ENVIRONMENT_KEY_RE.match(e.key):
        v.add(InvalidArgument(f"environment.key: {shown(e.key)} is not an environment key ({ENVIRONMENT_KEY_RULE})"))
    else:
        known = catalog if catalog is not None else _environment_catalog()
        info = known.environments.get(e.key)
        if info is None and e.key in known.failed:
            raise FailedPrecondition(f"environment.key: environment {e.key!r} could not be loaded: "
                                     f"{known.failed[e.key]}")
        if info is None:
            v.add(InvalidArgument(f"environment.key: {e.key!r} is not an environment; known: "
                                  f"{', '.join(sorted(known.environments)) or 'none'}"))
    e.version = info.version if info is not None else ""
    if e.max_turns == 0 and info is not None:
        e.max_turns = info.max_turns
    elif e.max_turns and not MAX_TURNS.low <= e.max_turns <= MAX_TURNS.high:
        v.add(out_of_range("environment.max_turns", e.max_turns, FIELDS_BY_PATH["environment.max_turns"].allowed()))
    per_turn = spec.grpo.max_completion_tokens
    if e.max_episode_tokens == 0 and not v.bad("grpo.max_completion_tokens"):
        e.max_episode_tokens = EPISODE_TOKENS_PER_TURN * per_turn
    elif e.max_episode_tokens and not MAX_EPISODE_TOKENS.low <= e.max_episode_tokens <= MAX_EPISODE_TOKENS.high:
        v.add(out_of_range("environment.max_episode_tokens", e.max_episode_tokens,
                           FIELDS_BY_PATH["environment.max_episode_tokens"].allowed()))
    elif e.max_episode_tokens < per_turn and not v.bad("grpo.max_completion_tokens"):
        warnings.append(f"environment.max_episode_tokens {e.max_episode_tokens} is below grpo.max_completion_tokens "
                        f"{per_turn}: an episode's first answer may be cut at {e.max_episode_tokens} tokens")
    _validate_settings(e, v, info)
    if spec.advanced.dynamic_sampling:
        v.add(InvalidArgument("advanced.dynamic_sampling: not available with an environment (environment.key "
                              f"{e.key!r}); turn it off"))
    if info is not None and info.columns and not spec.reward.dataset and not v.bad("reward"):
        # the prompts are the reward's own: they must hold the columns the environment reads
        reward = (rewards.rewards if rewards is not None else load_registry().rewards).get(spec.reward.key)
        missing = [c for c in info.columns if reward is None or c not in reward.columns]
        if reward is not None and missing:
            v.add(InvalidArgument(
                f"environment.key: {e.key!r} reads the column {missing[0]!r}, which {reward.display_name}'s own "
                f"prompts do not have (they have: {', '.join(reward.columns) or 'no other columns'}); give a "
                "reward.dataset holding it"))


def _validate_settings(e: common_pb2.EnvironmentConfig, v: Violations, info: EnvironmentInfo | None) -> None:
    if len(e.settings) > MAX_ENVIRONMENT_SETTINGS:
        v.add(out_of_range("environment.settings", f"{len(e.settings)} settings",
                           f"at most {MAX_ENVIRONMENT_SETTINGS}"))
        return
    declared = getattr(info, "settings", None)
    unknown = sorted(set(e.settings) - set(declared)) if declared is not None else []
    if unknown:
        v.add(InvalidArgument(f"environment.settings: {e.key!r} takes no setting {', '.join(map(repr, unknown))}; "
                              f"it takes: {', '.join(declared) if declared else 'none'}"))
    for key in sorted(e.settings):
        if not SETTING_KEY_RE.match(key):
            v.add(InvalidArgument(f"environment.settings: the key {shown(key)} is not allowed; use 1-64 letters, "
                                  "digits and _, starting with a letter"))
        elif len(e.settings[key]) > MAX_SETTING_CHARS:
            v.add(InvalidArgument(f"environment.settings: the value of {key!r} has {len(e.settings[key])} "
                                  f"characters, over the limit of {MAX_SETTING_CHARS}"))


def _validate_grpo(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    g = spec.grpo
    _checked(spec, "grpo", v)
    if not g.HasField("max_steps"):
        g.max_steps = MAX_STEPS_DEFAULT
    elif g.max_steps != -1 and not 1 <= g.max_steps <= MAX_STEPS_HIGH:
        v.add(out_of_range("grpo.max_steps", g.max_steps,
                           f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default {MAX_STEPS_DEFAULT})"))
    if not g.HasField("batch_size"):
        g.batch_size = BATCH_SIZE_DEFAULT
    elif g.batch_size not in BATCH_SIZES:
        v.add(out_of_range("grpo.batch_size", g.batch_size,
                           f"one of {', '.join(map(str, BATCH_SIZES))} (default {BATCH_SIZE_DEFAULT})"))
    if v.bad("grpo.group_size", "grpo.batch_size"):
        return
    group = g.group_size
    if g.batch_size % group != 0:
        rounded = math.ceil(g.batch_size / group) * group
        warnings.append(f"grpo.batch_size {g.batch_size} rounded up to {rounded}, a multiple of "
                        f"grpo.group_size {group}")
        g.batch_size = rounded


def _validate_advanced(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    a = spec.advanced
    with v.check():
        _enum(a, "loss_type", "advanced.loss_type", LOSS_NAMES, C.LOSS_TYPE_GRPO)
    with v.check():
        _enum(a, "quantization", "advanced.quantization", QUANT_NAMES, C.QUANTIZATION_FULL)
    with v.check():
        _enum(a, "generation_backend", "advanced.generation_backend", BACKEND_NAMES, C.GENERATION_BACKEND_VLLM)
    backend = a.generation_backend
    with v.check():
        _validate_memory(a, backend)
    a.gpu_selection = a.gpu_selection.strip() or "auto"
    if not v.bad("advanced.gpu_selection") and not GPU_SELECTION_RE.match(a.gpu_selection):
        v.add(out_of_range("advanced.gpu_selection", a.gpu_selection,
                           '"auto", "cpu", or a comma list of device indices such as "0,1"'))
    _validate_processes(spec, backend, v)
    _checked(spec, "advanced", v)
    _validate_updates(spec, warnings, v)
    reshaped = reshaped_sampling(a)
    if reshaped and backend == C.GENERATION_BACKEND_TRANSFORMERS and not v.bad(*SAMPLING_PATHS):
        warnings.append(f"advanced.{', '.join(reshaped)}: the Transformers backend reports no sampling logprobs, so "
                        "the loss, which scores the whole tempered policy, is not importance-corrected for the "
                        "reshaped distribution (a vLLM backend corrects it)")
    if not a.HasField("seed"):
        a.seed = 0
    with v.check():
        _validate_async(a, backend)
    a.lora_init = a.lora_init.strip() or "default"
    if a.lora_init not in LORA_INITS and not v.bad("advanced.lora_init"):
        v.add(out_of_range("advanced.lora_init", a.lora_init, " or ".join(f'"{x}"' for x in LORA_INITS) +
                           ' (default "default")'))
    with v.check():
        _validate_sharding(a, v)
    a.precision = a.precision.strip() or PRECISIONS[0]
    if a.precision not in PRECISIONS and not v.bad("advanced.precision"):
        v.add(out_of_range("advanced.precision", a.precision, FIELDS_BY_PATH["advanced.precision"].allowed()))
    a.gradient_checkpointing = a.gradient_checkpointing.strip() or CHECKPOINTING_CHOICES[0]
    if a.gradient_checkpointing not in CHECKPOINTING_CHOICES and not v.bad("advanced.gradient_checkpointing"):
        v.add(out_of_range("advanced.gradient_checkpointing", a.gradient_checkpointing,
                           FIELDS_BY_PATH["advanced.gradient_checkpointing"].allowed()))


# What each loss does when a step makes one optimizer step over its batch (the ratio is exactly 1).
ON_POLICY_EQUIVALENT = {"gspo": "grpo", "cispo": "dapo", "sapo": "grpo"}


def one_update_per_step(a: common_pb2.AdvancedOptions) -> bool:
    """Whether a job makes one optimizer step per generated batch (num_iterations 1, mini_batches 1):
    then the loss's importance ratio is exactly 1 and no clip binds."""
    return a.num_iterations <= 1 and a.mini_batches <= 1


def clip_inactive(a: common_pb2.AdvancedOptions) -> bool:
    """Whether advanced.epsilon_high changes nothing for these options: a loss that bounds its ratio
    its own way (OWN_BOUNDS), or one optimizer step per batch (the ratio is 1)."""
    return LOSS_NAMES.get(a.loss_type, "") in OWN_BOUNDS or one_update_per_step(a)


def _validate_updates(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    """advanced.num_iterations, mini_batches and epsilon_high against the loss and the batch."""
    a, g = spec.advanced, spec.grpo
    loss = LOSS_NAMES.get(a.loss_type, "")
    changed = abs(a.epsilon_high - EPSILON_HIGH.default) > 1e-6
    if loss in OWN_BOUNDS and changed and not v.bad("advanced.epsilon_high"):
        v.add(InvalidArgument(f"advanced.epsilon_high: {a.epsilon_high:.7g} applies to the "
                              f"{', '.join(CLIPPED_LOSSES)} losses only; {OWN_BOUNDS[loss]}: leave it at "
                              f"{EPSILON_HIGH.default:g} or pick one of those losses"))
    world = max(a.num_processes, 1) * max(a.num_nodes, 1)
    if not v.bad("advanced.mini_batches", "grpo.batch_size", "grpo.group_size", "advanced.num_processes",
                 "advanced.num_nodes") and (g.batch_size // world) % a.mini_batches:
        share = g.batch_size // world
        fits = [m for m in range(MINI_BATCHES.low, MINI_BATCHES.high + 1) if share % m == 0]
        v.add(InvalidArgument(f"advanced.mini_batches: {a.mini_batches} does not divide the {share} completions "
                              f"each process trains per step (grpo.batch_size {g.batch_size}"
                              f"{f' over {world} processes' if world > 1 else ''}); allowed here: "
                              f"{', '.join(map(str, fits))}"))
    if a.eval_every and not v.bad("advanced.eval_every"):
        if spec.environment.key:
            v.add(InvalidArgument(f"advanced.eval_every: {a.eval_every} evaluates single answers; a job with an "
                                  f"environment ({spec.environment.key!r}) is evaluated by `rlvr eval run` with "
                                  "its adapter; set 0"))
        elif world > 1:
            v.add(InvalidArgument(f"advanced.eval_every: {a.eval_every} runs in a job of one process; this job "
                                  f"has {world} (advanced.num_processes x advanced.num_nodes); set 0 and evaluate "
                                  "its adapters with `rlvr eval run`"))
    if v.bad("advanced.num_iterations", "advanced.mini_batches", "advanced.loss_type"):
        return
    if one_update_per_step(a):
        if changed and loss not in OWN_BOUNDS and not v.bad("advanced.epsilon_high"):
            warnings.append(f"advanced.epsilon_high {a.epsilon_high:.7g} changes nothing here: with "
                            "advanced.num_iterations 1 and advanced.mini_batches 1 each step makes one optimizer "
                            "step, so the importance ratio is 1 and the clip never binds")
        if loss in ON_POLICY_EQUIVALENT:
            warnings.append(f"advanced.loss_type {loss} trains as {ON_POLICY_EQUIVALENT[loss]} with one optimizer "
                            "step per batch (its ratio is 1); it differs with advanced.num_iterations or "
                            "advanced.mini_batches above 1")


def _validate_eval_size(spec: common_pb2.JobSpec, catalog: Catalog | None, v: Violations) -> None:
    """advanced.eval_size against the held-out pool of a reward that makes its own problems (its
    RewardInfo.heldout_size); a dataset's held-out split is read at the job's start (all of it when
    it is smaller)."""
    a = spec.advanced
    if not a.eval_every or spec.reward.dataset or v.bad("advanced.eval_size", "advanced.eval_every", "reward"):
        return
    known = catalog.rewards if catalog is not None else load_registry().rewards
    info = known.get(spec.reward.key)
    pool = int(getattr(info, "heldout_size", 0) or 0)
    if pool and a.eval_size > pool:
        v.add(out_of_range("advanced.eval_size", a.eval_size,
                           f"{EVAL_SIZE.low}-{pool}: {getattr(info, 'display_name', spec.reward.key)}'s held-out "
                           f"split has {pool} problems"))


def _validate_memory(a: common_pb2.AdvancedOptions, backend: int) -> None:
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        _float(a, "gpu_memory_fraction", "advanced.gpu_memory_fraction", GPU_MEMORY_FRACTION)
    elif a.HasField("gpu_memory_fraction") and backend in BACKEND_NAMES:
        why = ("the rollout server sizes its own engine (its --memory-fraction setting)"
               if backend == C.GENERATION_BACKEND_VLLM else "that backend runs no vLLM engine")
        raise InvalidArgument(f"advanced.gpu_memory_fraction: only the vLLM (colocate) backend takes a memory "
                              f"share; with {BACKEND_NAMES[backend]} {why}")


def _validate_async(a: common_pb2.AdvancedOptions, backend: int) -> None:
    if _int(a, "max_async_steps", "advanced.max_async_steps", MAX_ASYNC_STEPS) and \
            backend != C.GENERATION_BACKEND_VLLM and backend in BACKEND_NAMES:
        raise InvalidArgument(
            f"advanced.max_async_steps: {a.max_async_steps} needs the vLLM (rollout server) backend, which generates "
            f"in another process while the trainer trains; {BACKEND_NAMES[backend]} generates inside the training "
            f"process, so only 0 (synchronous) is allowed with it (range {MAX_ASYNC_STEPS.text()}, default "
            f"{MAX_ASYNC_STEPS.default})")


def _validate_sharding(a: common_pb2.AdvancedOptions, v: Violations) -> None:
    """advanced.sharding: one of SHARDINGS, and fsdp only where it can run (docs/jobs.md says why)."""
    a.sharding = a.sharding.strip() or SHARDINGS[0]
    if v.bad("advanced.sharding"):
        return
    if a.sharding not in SHARDINGS:
        raise out_of_range("advanced.sharding", a.sharding, FIELDS_BY_PATH["advanced.sharding"].allowed())
    if a.sharding != "fsdp" or v.bad("advanced.num_processes"):
        return
    if a.num_nodes > 1 and not v.bad("advanced.num_nodes"):
        raise InvalidArgument(f"advanced.sharding: fsdp runs on one node only (advanced.num_nodes is "
                              f"{a.num_nodes}): its checkpoints are sharded across the ranks, and a node that "
                              'resumes receives node 0\'s checkpoint alone; use advanced.num_nodes 1, or "ddp"')
    if a.num_processes < 2:
        raise InvalidArgument(f"advanced.sharding: fsdp shards the model across processes, and "
                              f"advanced.num_processes is {a.num_processes}; set it to 2 or more, or use "
                              f'"ddp"')
    if a.quantization == C.QUANTIZATION_8BIT:
        raise InvalidArgument("advanced.sharding: fsdp cannot shard an 8-bit base (FSDP2 re-creates the "
                              "parameters it shards, and bitsandbytes' int8 weights lose their quantization "
                              'state with it); use Full Precision or 4-bit QLoRA with fsdp, or "ddp"')


def _validate_processes(spec: common_pb2.JobSpec, backend: int, v: Violations) -> None:
    """advanced.num_processes against the fields it must agree with: one process per listed device,
    whole groups on every process, and the options that do not run across processes yet. Every
    field found bad goes to `v`."""
    a, g = spec.advanced, spec.grpo
    with v.check():
        _int(a, "num_processes", "advanced.num_processes", NUM_PROCESSES)
    with v.check():
        _int(a, "num_nodes", "advanced.num_nodes", NUM_NODES)
    if v.bad("advanced.num_processes", "advanced.num_nodes"):
        return
    procs, nodes = a.num_processes, a.num_nodes
    if a.gpu_selection not in ("auto", "cpu") and not v.bad("advanced.gpu_selection"):
        devices = a.gpu_selection.split(",")
        if len(set(devices)) != len(devices):
            v.add(InvalidArgument(f"advanced.gpu_selection: {a.gpu_selection!r} lists a device twice"))
        elif len(devices) != procs:
            v.add(InvalidArgument(
                f"advanced.gpu_selection: {a.gpu_selection!r} lists {len(devices)} device(s) but "
                f"advanced.num_processes is {procs}; a job trains with one process per device: set "
                f"advanced.num_processes to {len(devices)} or list {procs} device(s)"))
    if procs * nodes == 1:
        return
    # A job of several nodes is advanced.num_nodes x num_processes ranks, each named as such.
    field, count = ("advanced.num_processes", procs) if nodes == 1 else ("advanced.num_nodes", nodes)
    what = f"advanced.num_processes {procs}" if nodes == 1 else \
        f"advanced.num_nodes {nodes} x advanced.num_processes {procs}"
    world = procs * nodes
    if not v.bad("grpo.group_size", "grpo.batch_size") and g.batch_size % (world * g.group_size):
        v.add(InvalidArgument(
            f"grpo.batch_size: {g.batch_size} does not split into whole groups of grpo.group_size {g.group_size} "
            f"on each of {what}; use a multiple of {world * g.group_size}"))
    one = "1 process" if nodes == 1 else "1 node"
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        v.add(InvalidArgument(f"{field}: {count} {'processes' if nodes == 1 else 'nodes'} cannot each start a "
                              f"vLLM (colocate) engine yet; use the vLLM (rollout server) or Transformers backend, "
                              f"or {one}"))
    if a.dynamic_sampling:
        v.add(InvalidArgument(f"advanced.dynamic_sampling: not supported across processes yet "
                              f"({what}); use {one} or turn it off"))
    if a.max_async_steps:
        v.add(InvalidArgument(f"advanced.max_async_steps: asynchronous steps are not supported across processes "
                              f"yet ({what}); use {one} or 0"))


def prompt_count(spec: common_pb2.JobSpec) -> int | None:
    """Training prompts of a resolved spec, where known without loading data: a reward that
    generates its prompts has synthetic_prompts set (generates_prompts)."""
    return spec.reward.synthetic_prompts if spec.reward.HasField("synthetic_prompts") else None


def total_steps(spec: common_pb2.JobSpec, n_prompts: int | None = None) -> int:
    """max_steps, or for Full (-1): every prompt for the chosen epochs, group_size completions each."""
    if spec.grpo.max_steps != -1:
        return spec.grpo.max_steps
    n = n_prompts if n_prompts is not None else prompt_count(spec)
    if n is None:
        return -1  # known once the dataset is loaded
    prompts_per_step = spec.grpo.batch_size // spec.grpo.group_size
    return max(1, math.ceil(n * spec.advanced.epochs / prompts_per_step))


def reward_title(reward: common_pb2.RewardConfig, catalog: Catalog | None = None) -> str:
    """The Training Summary's Reward (the one place every view's text comes from): the reward's
    display name ("GSM8K accuracy"), or a combination as "GSM8K accuracy + 0.2 x Length". One form
    for every term: where this process does not know a term (a plugin or remote reward only the
    reward service has), every term is named by its key ("gsm8k + 0.2 x length")."""
    names = catalog.rewards if catalog is not None else load_registry().rewards
    terms = list(reward.terms) or [common_pb2.RewardTerm(key=reward.key or DEFAULT_REWARD, weight=1.0)]
    by_display_name = all(t.key in names for t in terms)

    def name(key: str) -> str:
        return names[key].display_name if by_display_name else key

    return " + ".join(name(t.key) if t.weight == 1.0 else f"{t.weight:g} x {name(t.key)}" for t in terms)


def summary(spec: common_pb2.JobSpec, steps: int, catalog: Catalog | None = None) -> common_pb2.TrainingSummary:
    g, a = spec.grpo, spec.advanced
    return common_pb2.TrainingSummary(
        method="RLVR (GRPO)", model=spec.base_model, reward=reward_title(spec.reward, catalog),
        group_size=g.group_size, max_completion=g.max_completion_tokens, gpu_selection=a.gpu_selection,
        lora_rank=g.lora_rank, learn_rate=g.learning_rate, max_steps=g.max_steps,
        backend=BACKEND_NAMES[a.generation_backend], batch_size=g.batch_size, lora_alpha=g.lora_alpha,
        loss_type=LOSS_NAMES[a.loss_type], quantization=QUANT_NAMES[a.quantization], total_steps=steps,
        settings=settings_of(spec),
    )


def check_sizes(spec: common_pb2.JobSpec) -> None:
    """Every string of a JobSpec within its size limit: one InvalidArgument naming every field over
    its limit. The terms' keys are checked up to MAX_REWARD_TERMS (more terms are refused as such)."""
    v = Violations()
    for path, value, limit in (
        ("name", spec.name, MAX_NAME_CHARS),
        ("base_model", spec.base_model, MAX_MODEL_CHARS),
        ("reward.dataset", spec.reward.dataset, MAX_DATASET_CHARS),
        ("reward.dataset_split", spec.reward.dataset_split, MAX_SPLIT_CHARS),
        ("reward.key", spec.reward.key, MAX_NAME_CHARS),
        ("reward.accuracy_key", spec.reward.accuracy_key, MAX_NAME_CHARS),
        *((f"reward.terms[{i}].key", t.key, MAX_NAME_CHARS)
          for i, t in enumerate(spec.reward.terms[:MAX_REWARD_TERMS])),
        ("advanced.gpu_selection", spec.advanced.gpu_selection, MAX_OPTION_CHARS),
        ("advanced.lora_init", spec.advanced.lora_init, MAX_OPTION_CHARS),
        ("advanced.precision", spec.advanced.precision, MAX_OPTION_CHARS),
        ("advanced.gradient_checkpointing", spec.advanced.gradient_checkpointing, MAX_OPTION_CHARS),
        ("advanced.sharding", spec.advanced.sharding, MAX_OPTION_CHARS),
        ("init_adapter.name", spec.init_adapter.name, MAX_NAME_CHARS),
        ("init_adapter.path", spec.init_adapter.path, MAX_PATH_CHARS),
        ("environment.key", spec.environment.key, MAX_NAME_CHARS),
    ):
        with v.check():
            bounded(path, value, limit)
    v.raise_any()


def default_name(base_model: str, loss: str) -> str:
    """A job's name when none is given: the model's last path part and the loss, in the characters
    a name allows (so a model id with other characters never makes the name the field at fault)."""
    stem = re.sub(r"[^A-Za-z0-9._ %-]+", "-", base_model.rstrip("/").split("/")[-1]).lstrip("._ %-")
    return f"{stem or 'job'}-{loss}"[:MAX_NAME_CHARS]


def resolve_spec(user_spec: common_pb2.JobSpec, n_prompts: int | None = None,
                 catalog: Catalog | None = None, environments: EnvironmentCatalog | None = None) -> ResolvedJob:
    """Validates and fills in `user_spec` (not modified); raises InvalidArgument on a bad value.

    `catalog`: the rewards the reward service has (the scheduler passes its ListRewardFunctions):
    a key it lacks is refused. Without one (the trainer's re-check, a dry run in a client) the
    rewards this process knows are checked in full and any other key is left to the reward service.
    `environments`: the environments a job may name; without it, this process's (the registry's)."""
    v = Violations()  # every bad field, refused at once; a field found bad is not read again
    if len(user_spec.reward.terms) > MAX_REWARD_TERMS:
        v.add(out_of_range("reward.terms", f"{len(user_spec.reward.terms)} rewards", f"at most {MAX_REWARD_TERMS}"))
    with v.check():
        check_sizes(user_spec)
    spec = common_pb2.JobSpec()
    spec.CopyFrom(user_spec)
    warnings: list[str] = []
    spec.base_model = spec.base_model.strip() or DEFAULT_BASE_MODEL
    _validate_reward(spec, warnings, catalog, v)
    _validate_grpo(spec, warnings, v)
    _validate_environment(spec, warnings, environments, catalog, v)
    _validate_advanced(spec, warnings, v)
    _validate_eval_size(spec, catalog, v)
    with v.check():
        validate_tracking(spec)
    if not spec.name:
        spec.name = default_name(spec.base_model, LOSS_NAMES.get(spec.advanced.loss_type, "grpo"))
    if not v.bad("name") and not NAME_RE.match(spec.name):
        v.add(InvalidArgument(f"name: {shown(spec.name)} is not allowed; use 1-128 letters, digits, spaces "
                              "and . _ - %, starting with a letter or digit"))
    if spec.advanced.seed > JOB_SEED.high:
        v.add(out_of_range("advanced.seed", spec.advanced.seed, f"{JOB_SEED.text()} (default {JOB_SEED.default})"))
    if spec.HasField("init_adapter") and spec.init_adapter.name and spec.init_adapter.version < 0:
        v.add(out_of_range("init_adapter.version", spec.init_adapter.version, ">= 0 (0 = latest)"))
    v.raise_any()
    steps = total_steps(spec, n_prompts)
    return ResolvedJob(spec=spec, summary=summary(spec, steps, catalog), warnings=warnings, total_steps=steps)
