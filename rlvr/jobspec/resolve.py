"""`resolve_spec`, the Training Summary, and the job statuses' names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr.common.errors import InvalidArgument, Violations, bounded, out_of_range, shown
from rlvr.jobspec.environment import EnvironmentCatalog, _validate_environment
from rlvr.jobspec.fields import settings_of
from rlvr.jobspec.ranges import (
    BACKEND_NAMES,
    DEFAULT_BASE_MODEL,
    DEFAULT_REWARD,
    JOB_SEED,
    LOSS_NAMES,
    MAX_DATASET_CHARS,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_OPTION_CHARS,
    MAX_PATH_CHARS,
    MAX_REWARD_TERMS,
    MAX_SPLIT_CHARS,
    METHOD_KEYS,
    METHOD_NAMES,
    NAME_RE,
    QUANT_NAMES,
    C,
)
from rlvr.jobspec.reward import _validate_reward
from rlvr.jobspec.sft import Card, _validate_method, drop_rlvr_fields, is_head, is_supervised, sft_total_steps
from rlvr.jobspec.training import _validate_advanced, _validate_eval_size, _validate_grpo, total_steps
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.tracking.config import validate_tracking
from rlvr.v1 import common_pb2


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
    if is_supervised(spec):  # no reward, group, completion cap or backend: the SFT or Head card's rows instead
        s: Card = spec.head if is_head(spec) else spec.sft
        return common_pb2.TrainingSummary(
            method=METHOD_NAMES[spec.method], model=spec.base_model, gpu_selection=a.gpu_selection,
            lora_rank=s.lora_rank, learn_rate=s.learning_rate, max_steps=s.max_steps, batch_size=s.batch_size,
            lora_alpha=s.lora_alpha, quantization=QUANT_NAMES[a.quantization], total_steps=steps,
            settings=settings_of(spec))
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
        ("sft.dataset", spec.sft.dataset, MAX_DATASET_CHARS),
        ("sft.dataset_split", spec.sft.dataset_split, MAX_SPLIT_CHARS),
        ("sft.target_modules", spec.sft.target_modules, MAX_PATH_CHARS),
        ("head.dataset", spec.head.dataset, MAX_DATASET_CHARS),
        ("head.dataset_split", spec.head.dataset_split, MAX_SPLIT_CHARS),
        ("head.text_column", spec.head.text_column, MAX_NAME_CHARS),
        ("head.label_column", spec.head.label_column, MAX_NAME_CHARS),
        ("head.target_modules", spec.head.target_modules, MAX_PATH_CHARS),
        ("head.reward_label", spec.head.reward_label, MAX_NAME_CHARS),
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
    if is_supervised(spec):  # what only RLVR reads is not an SFT or Head job's: dropped, said once
        dropped = drop_rlvr_fields(spec)
        key = METHOD_KEYS[spec.method]
        if dropped:
            warnings.append(f"{', '.join(dropped)}: ignored: Reinforcement (RLVR)'s, and this job's method is "
                            f"{key.upper()} (its own card: {key}.*)")
    # An SFT or Head job reads no reward, GRPO card, environment or sampler: what their checks warn of is not its concern.
    rlvr_warnings: list[str] = []
    _validate_reward(spec, rlvr_warnings, catalog, v)
    _validate_grpo(spec, rlvr_warnings, v)
    _validate_environment(spec, rlvr_warnings, environments, catalog, v)
    _validate_advanced(spec, rlvr_warnings, v)  # its warnings are of GRPO's and the sampler's options
    _validate_method(spec, warnings, v)
    if not is_supervised(spec):
        warnings[:0] = rlvr_warnings
        _validate_eval_size(spec, catalog, v)
    with v.check():
        validate_tracking(spec)
    if not spec.name:
        spec.name = default_name(spec.base_model,
                                 METHOD_KEYS[spec.method] if is_supervised(spec)
                                 else LOSS_NAMES.get(spec.advanced.loss_type, "grpo"))
    if not v.bad("name") and not NAME_RE.match(spec.name):
        v.add(InvalidArgument(f"name: {shown(spec.name)} is not allowed; use 1-128 letters, digits, spaces "
                              "and . _ - %, starting with a letter or digit"))
    if spec.advanced.seed > JOB_SEED.high:
        v.add(out_of_range("advanced.seed", spec.advanced.seed, f"{JOB_SEED.text()} (default {JOB_SEED.default})"))
    if spec.HasField("init_adapter") and spec.init_adapter.name and spec.init_adapter.version < 0:
        v.add(out_of_range("init_adapter.version", spec.init_adapter.version, ">= 0 (0 = latest)"))
    v.raise_any()
    steps = sft_total_steps(spec, n_prompts) if is_supervised(spec) else total_steps(spec, n_prompts)
    return ResolvedJob(spec=spec, summary=summary(spec, steps, catalog), warnings=warnings, total_steps=steps)
