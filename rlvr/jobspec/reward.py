"""The job's reward checked: its key, its terms, and the data it reads."""

from __future__ import annotations

from typing import Any

from rlvr.common.errors import FailedPrecondition, InvalidArgument, Violations, out_of_range, shown
from rlvr.jobspec.fields import _checked, _float, _int
from rlvr.jobspec.ranges import (
    DEFAULT_DATASET_SPLIT,
    DEFAULT_REWARD,
    REWARD_FUNCTIONS,
    REWARD_KEYS,
    REWARD_WEIGHT,
    SYNTHETIC_PROMPTS,
    C,
)
from rlvr.rewards.registry import KEY_RE as REWARD_KEY_RE
from rlvr.rewards.registry import KEY_RULE as REWARD_KEY_RULE
from rlvr.rewards.registry import Catalog, RewardInfo, UnavailableReward, UnknownReward, load_registry
from rlvr.v1 import common_pb2


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
