"""`SPEC_FIELDS`, the spec's user-facing fields declared once, and what reads a spec through them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rlvr.common.errors import Violations, out_of_range
from rlvr.jobspec.ranges import (
    APPLIES_NOTES,
    BACKEND_NAMES,
    BATCH_SIZE_DEFAULT,
    BATCH_SIZES,
    CHECKPOINT_EVERY,
    CHECKPOINTING_CHOICES,
    DEFAULT_BASE_MODEL,
    DEFAULT_REWARD,
    EPISODE_TOKENS_PER_TURN,
    EPOCHS,
    EPSILON_HIGH,
    EVAL_EVERY,
    EVAL_SIZE,
    FORMAT_BONUS_WEIGHT,
    GPU_MEMORY_FRACTION,
    GROUP_SIZE,
    HEAD_LABEL_COLUMN,
    HEAD_LEARNING_RATE,
    HEAD_LORA_RANK,
    HEAD_MAX_SEQ_LENGTH,
    HEAD_TASK_NAMES,
    HEAD_TEXT_COLUMN,
    JOB_SEED,
    KL_BETA,
    LEARNING_RATE,
    LORA_ALPHA,
    LORA_DROPOUT,
    LORA_INITS,
    LORA_RANK,
    LOSS_NAMES,
    MAX_ASYNC_STEPS,
    MAX_COMPLETION,
    MAX_ENVIRONMENT_SETTINGS,
    MAX_EPISODE_TOKENS,
    MAX_SETTING_CHARS,
    MAX_STEPS_DEFAULT,
    MAX_STEPS_HIGH,
    MAX_TURNS,
    METHOD_NAMES,
    MIN_P,
    MINI_BATCHES,
    NUM_ITERATIONS,
    NUM_NODES,
    NUM_PROCESSES,
    PRECISIONS,
    QUANT_NAMES,
    REPETITION_PENALTY,
    SFT_BATCH_SIZE,
    SFT_LEARNING_RATE,
    SFT_MAX_SEQ_LENGTH,
    SFT_MAX_STEPS_DEFAULT,
    SFT_READS_ADVANCED,
    SHARDINGS,
    SYNTHETIC_PROMPTS,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    Applies,
    C,
    FieldKind,
    FloatRange,
    IntRange,
    clip_inactive,
)
from rlvr.v1 import common_pb2

Card = Literal["run", "reward", "grpo", "sft", "head", "advanced"]


@dataclass(frozen=True)
class SpecField:
    """One field of the JobSpec, declared once (see the package's docstring, rlvr/jobspec/__init__.py, for what derives from it)."""

    path: str                                # the JobSpec path: "grpo.lora_rank" (the error's and the form's name)
    label: str                               # the console's label and the Training Summary's
    help: str                                # the one wording: CLI --help, the console's hint, the docs
    kind: FieldKind
    card: Card  # where the console shows it
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


def _card(card: Card) -> Any:
    return lambda *args, **kw: SpecField(*args, card=card, **kw)  # type: ignore[misc]


_RUN, _REWARD, _GRPO, _SFT, _ADVANCED = _card("run"), _card("reward"), _card("grpo"), _card("sft"), _card("advanced")
_HEAD = _card("head")
# Supervised (SFT)'s and Head's cards: JobConfig carries each as its own settings (`sft`, `head`:
# services/trainer/job/config.py).
_SFT_ONLY: dict[str, Any] = {"applies": "sft", "config": None}
_HEAD_ONLY: dict[str, Any] = {"applies": "head", "config": None}


def _trained(card: Card, lr_help: str, lr: FloatRange, seq_help: str, seq: IntRange, rank: IntRange,
             rank_help: str, flags: tuple[str, ...]) -> tuple[SpecField, ...]:
    """The rows a supervised card shares (SFT's and Head's): learning rate, epochs, max steps, batch
    size, sequence length and the LoRA's rank, alpha, dropout and target modules, with the card's
    own ranges and flags (in that order)."""
    only = {"applies": card, "config": None}
    make = _card(card)
    rows = (
        make(f"{card}.learning_rate", "Learning Rate", lr_help, "float", range=lr, checked=True),
        make(f"{card}.epochs", "Epochs", "Passes over the dataset when Max Steps is Full.", "int", range=EPOCHS,
             checked=True),
        make(f"{card}.max_steps", "Max Steps", "Full (-1) trains every example for the chosen epochs.", "int",
             default=SFT_MAX_STEPS_DEFAULT, allowed_text=f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default Full)"),
        make(f"{card}.batch_size", "Batch Size", "Examples per optimizer step.", "int", range=SFT_BATCH_SIZE,
             checked=True),
        make(f"{card}.max_seq_length", "Max sequence length", seq_help, "int", range=seq, checked=True),
        make(f"{card}.lora_rank", "Rank (r)", rank_help, "int", range=rank, checked=True),
        make(f"{card}.lora_alpha", "Alpha", "LoRA scaling factor.", "int", range=LORA_ALPHA, checked=True),
        make(f"{card}.lora_dropout", "Dropout", "LoRA dropout on the adapter's input.", "float", range=LORA_DROPOUT,
             checked=True),
        make(f"{card}.target_modules", "Target modules",
             'The modules the adapter wraps: "all-linear" or a comma list such as "q_proj,v_proj".', "text",
             default="all-linear", allowed_text='"all-linear" (default) or a comma list of module names'),
    )
    return tuple(replace(row, flag=flag, **only) for row, flag in zip(rows, flags, strict=True))

# The rows in the console's order, card by card. A new field: its proto field, then a row here.
SPEC_FIELDS: tuple[SpecField, ...] = (
    _RUN("name", "Name", "Labels the run; default: derived from the model and the loss type.", "text", config=None),
    _RUN("method", "Training Method",
         "Reinforcement (RLVR): the model answers the reward's prompts and learns from their scores. Supervised "
         "(SFT): the adapter learns a labeled dataset's completions (the SFT card). Head: a classification or "
         "regression head learns a dataset's text -> label (the Head card), and can then score as a reward.", "enum",
         names=METHOD_NAMES,
         default=C.TRAINING_METHOD_RLVR, config=None),
    _RUN("base_model", "Base model", "A Hugging Face hub id, a bundled tiny model, or a model folder under the "
         "model roots by its path or its bare name (`rlvr models import`).", "text",
         default=DEFAULT_BASE_MODEL, config=None),
    _RUN("init_adapter.name", "Start from adapter",
         "An RLVR job may start from another job's adapter, kept frozen under the fresh one (an SFT job's, "
         "for SFT then RLVR): its name, job-<id>, as `rlvr jobs show` prints it. Empty: the base model.", "text",
         default="", allowed_text="a job's adapter name, job-<id>, or empty", applies="rlvr", flag="--init-adapter",
         config=None),
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
    _SFT("sft.dataset", "Dataset",
         "The labeled data: a local JSONL/Parquet/CSV file (or a folder of split files) under the data roots, or a "
         "Hugging Face dataset, with prompt and completion columns or a chat messages column.", "text", default="",
         allowed_text="a dataset with prompt and completion columns, or a messages column; required",
         flag="--sft-dataset", **_SFT_ONLY),
    _SFT("sft.dataset_split", "Split", "The split trained on.", "text", default="train", flag="--sft-split",
         **_SFT_ONLY),
    *_trained("sft", "TRL's LoRA recipe's default: about 10x a full fine-tune's, and above RLVR's range.",
              SFT_LEARNING_RATE, "Tokens per example, prompt and completion together (cut at the end); with "
              "packing, per packed sequence.", SFT_MAX_SEQ_LENGTH, LORA_RANK, "LoRA adapter capacity.",
              ("--sft-lr", "--sft-epochs", "--sft-max-steps", "--sft-batch-size", "--max-seq-length", "--sft-rank",
               "--sft-alpha", "--lora-dropout", "--target-modules")),
    _SFT("sft.completion_only_loss", "Completion-only loss",
         "Loss on the completion (a chat's last assistant message) only; off trains on the prompt too.", "bool",
         default=True, **_SFT_ONLY),
    _SFT("sft.packing", "Packing", "Pack several examples into each sequence (TRL's best-fit packing).", "bool",
         default=False, **_SFT_ONLY),
    _HEAD("head.dataset", "Dataset",
          "The labeled data: a local JSONL/Parquet/CSV file (or a folder of split files) under the data roots, or a "
          "Hugging Face dataset, with a text column and a label column.", "text", default="",
          allowed_text="a dataset with the text and label columns; required", flag="--head-dataset", **_HEAD_ONLY),
    _HEAD("head.dataset_split", "Split", "The split trained on (held out: its test split, else 10% of this one).",
          "text", default="train", flag="--head-split", **_HEAD_ONLY),
    _HEAD("head.text_column", "Text column", "The column the head reads.", "text", default=HEAD_TEXT_COLUMN,
          flag="--text-column", **_HEAD_ONLY),
    _HEAD("head.label_column", "Label column", "The column it learns: classes, or numbers for regression.", "text",
          default=HEAD_LABEL_COLUMN, flag="--label-column", **_HEAD_ONLY),
    _HEAD("head.task", "Task", "Classification (one of the label column's classes) or regression (a number).",
          "enum", names=HEAD_TASK_NAMES, default=C.HEAD_TASK_CLASSIFICATION, **_HEAD_ONLY),
    *_trained("head", "TRL's LoRA reward-model recipe's default (1e-4); a frozen base's head alone may take more.",
              HEAD_LEARNING_RATE, "Tokens of each text (cut at the end).", HEAD_MAX_SEQ_LENGTH, HEAD_LORA_RANK,
              "LoRA capacity under the head; 0 trains the head alone on the frozen base.",
              ("--head-lr", "--head-epochs", "--head-max-steps", "--head-batch-size", "--head-max-seq-length",
               "--head-rank", "--head-alpha", "--head-lora-dropout", "--head-target-modules")),
    _HEAD("head.reward_label", "Reward class",
          "Used as a reward: the class whose probability is the score (regression: the number, clipped to 0-1).",
          "text", default="", allowed_text="one of the dataset's classes, or empty: the class named 1, true, yes, "
          "correct or positive, else the last in sorted order", flag="--reward-label", **_HEAD_ONLY),
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
# The Advanced Options only RLVR reads, and that no backend or reward narrows already, apply to RLVR jobs.
SPEC_FIELDS = tuple(
    replace(row, applies="rlvr") if row.card == "advanced" and not row.applies and row.group == "advanced"
    and row.name not in SFT_READS_ADVANCED else row for row in SPEC_FIELDS)
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
    docs/jobs.md and the submit's warning or refusal say why). A Supervised (SFT) job's: its card's
    rows, every one, and a Head job's its card's."""
    card = {C.TRAINING_METHOD_SFT: "sft", C.TRAINING_METHOD_HEAD: "head"}.get(spec.method)
    if card is not None:
        return {row.path: row.shown(value_of(spec, row)) for row in SPEC_FIELDS if row.card == card}
    out = {row.path: row.shown(value_of(spec, row)) for row in SPEC_FIELDS
           if row.summary and (row.group != "environment" or spec.environment.key)}
    if clip_inactive(spec.advanced) and "advanced.epsilon_high" in out:
        out["advanced.epsilon_high"] += " (inactive)"
    return out


def fields_markdown() -> str:
    """docs/spec-fields.md: the job spec's field reference, written from the table
    (tests/test_spec_docs.py checks the file is current)."""
    lines = ["# Job spec fields", "",
             "Every field of a JobSpec a user sets, from `rlvr/jobspec/fields.py`'s table (`SPEC_FIELDS`), which the",
             "CLI, the web console and the trainer also read. Regenerate after changing the table:",
             "`.venv/bin/python -c 'from rlvr.jobspec import fields_markdown as f; print(f(), end=\"\")' > "
             "docs/spec-fields.md`.", ""]
    for card, title in (("run", "Run"), ("reward", "Reward Function"), ("grpo", "GRPO Configuration"),
                        ("sft", "Supervised (SFT)"), ("head", "Head"), ("advanced", "Advanced Options")):
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
