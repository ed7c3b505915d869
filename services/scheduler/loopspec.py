"""Loop spec validation: the "Start an automated loop" form's ranges and defaults, in one place.

`resolve_loop_spec` takes the LoopSpec a user sent, the benchmarks the benchmark service lists and
the largest LoRA rank the rollout server serves, and returns the spec with every default filled in
and its job spec resolved exactly as CreateJob resolves one (`resolve_spec`), plus the warnings to
show. Bad values raise one InvalidArgument naming every bad field (`job.<path>` for the job spec), the
value and the allowed range or choices. Pure: no store, no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlvr.common.errors import InvalidArgument, Violations, bounded, out_of_range, shown
from rlvr.jobspec import (
    GIVE_UP_AFTER,
    JOB_SEED,
    MAX_DATASET_CHARS,
    MAX_NAME_CHARS,
    MAX_ROUNDS,
    MAX_SPLIT_CHARS,
    METHOD_KEYS,
    METHOD_NAMES,
    MIN_GAIN,
    MIN_GAIN_ALLOWED,
    NAME_RE,
    TARGET,
    TARGET_ALLOWED,
    ResolvedJob,
    resolve_spec,
)
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

DEFAULT_BENCHMARK_SPLIT = "test"


@dataclass
class ResolvedLoop:
    spec: scheduler_pb2.LoopSpec
    job: ResolvedJob  # the job spec every round trains with (round k adds its seed and start)
    warnings: list[str]


def _job_spec(spec: scheduler_pb2.LoopSpec, catalog: Catalog | None) -> ResolvedJob:
    if spec.job.init_adapter.path:
        raise InvalidArgument("job.init_adapter.path: not allowed in a loop; name the adapter it starts from "
                              "(job.init_adapter.name, job-<id>), or leave it unset to start from the base model")
    if spec.job.method in (common_pb2.TRAINING_METHOD_SFT, common_pb2.TRAINING_METHOD_HEAD):
        key = METHOD_KEYS[spec.job.method]
        raise InvalidArgument(f"job.method: {key.upper()} is not allowed in a loop: its rounds are RLVR jobs, each "
                              f"benchmarked and retrained; train a {METHOD_NAMES[spec.job.method]} job alone (rlvr "
                              f"train --method {key})")
    try:
        return resolve_spec(spec.job, catalog=catalog)
    except InvalidArgument as e:
        raise e.prefixed("job.") from None


def benchmark_of(key: str, catalog: Catalog | None = None) -> str:
    """The benchmark a reward declares (its held-out split's): the one a loop scores its rounds on
    by default."""
    known = (catalog or load_registry()).rewards
    return known[key].benchmark if key in known else key


def _benchmark(spec: scheduler_pb2.LoopSpec, benchmarks: Sequence[benchmark_pb2.BenchmarkInfo],
               catalog: Catalog | None) -> benchmark_pb2.BenchmarkInfo:
    """The benchmark named, or by default the one of the task the rounds train on."""
    names = ", ".join(b.name for b in benchmarks)
    spec.benchmark = spec.benchmark.strip() or benchmark_of(spec.job.reward.key, catalog)
    for info in benchmarks:
        if info.name == spec.benchmark:
            return info
    raise InvalidArgument(f"benchmark: {shown(spec.benchmark)} is not a benchmark the benchmark service lists; "
                          f"choose one of {names}")


def start_words(spec: scheduler_pb2.LoopSpec) -> str:
    """What a loop's baseline scores and round 1 trains on, in words."""
    ref = spec.job.init_adapter
    return f"the start adapter {ref.name}" if ref.name else f"the base model {spec.job.base_model}"


def check_own_fields(user_spec: scheduler_pb2.LoopSpec, max_lora_rank: int, catalog: Catalog | None = None,
                     start_rank: int = 0) -> ResolvedLoop:
    """The checks that need no benchmark list (sizes, target, rounds, the job spec, the seeds and
    ranks the rounds reach, from `start_rank`, the rank of the adapter job.init_adapter names): CreateLoop
    runs them before it asks the benchmark service, so a bad spec is refused at once even while that
    service is down. The spec it returns still has the benchmark fields as given; `resolve_loop_spec`
    completes them."""
    for field, limit in (("name", MAX_NAME_CHARS), ("benchmark", MAX_NAME_CHARS), ("score_column", MAX_NAME_CHARS),
                         ("benchmark_dataset", MAX_DATASET_CHARS), ("benchmark_dataset_split", MAX_SPLIT_CHARS)):
        bounded(field, getattr(user_spec, field), limit)
    spec = scheduler_pb2.LoopSpec()
    spec.CopyFrom(user_spec)
    warnings: list[str] = []

    v = Violations()  # every bad field, refused at once
    low, high = TARGET
    if not spec.target or math.isnan(spec.target) or not low < spec.target <= high:
        v.add(out_of_range("target", spec.target, TARGET_ALLOWED))
    for field, rng in (("max_rounds", MAX_ROUNDS), ("give_up_after", GIVE_UP_AFTER)):
        if not spec.HasField(field):
            setattr(spec, field, rng.default)
        elif not rng.low <= getattr(spec, field) <= rng.high:
            v.add(out_of_range(field, getattr(spec, field), f"{rng.text()} (default {rng.default})"))
    if not v.bad("max_rounds", "give_up_after") and spec.give_up_after >= spec.max_rounds:  # Rounds spent is checked before Plateaued
        warnings.append(f"give_up_after {spec.give_up_after} is not below max_rounds {spec.max_rounds}: the loop ends "
                        f"with Rounds spent after round {spec.max_rounds} before it could count {spec.give_up_after} "
                        "rounds without a real gain, so it never stops as Plateaued")
    if not spec.HasField("reclaim_storage"):
        spec.reclaim_storage = True
    if spec.HasField("min_gain") and (math.isnan(spec.min_gain) or not MIN_GAIN[0] <= spec.min_gain <= MIN_GAIN[1]):
        v.add(out_of_range("min_gain", spec.min_gain, MIN_GAIN_ALLOWED))

    try:
        job = _job_spec(spec, catalog)
    except InvalidArgument as e:
        v.add(e)
    v.raise_any()
    a = job.spec.advanced
    if spec.best_step and not (a.eval_every and a.checkpoint_every and a.eval_every % a.checkpoint_every == 0):
        raise InvalidArgument(
            f"best_step: needs job.advanced.eval_every (now {a.eval_every}) and job.advanced.checkpoint_every (now "
            f"{a.checkpoint_every}) above 0, eval_every a multiple of checkpoint_every, so that every evaluated "
            "step has its adapter; e.g. --eval-every 10 --checkpoint-every 10")
    spec.job.CopyFrom(job.spec)
    warnings += job.warnings

    last_seed = spec.job.advanced.seed + spec.max_rounds - 1  # round k trains with seed + k - 1
    if last_seed > JOB_SEED.high:
        raise out_of_range("job.advanced.seed", spec.job.advanced.seed,
                           f"0-{JOB_SEED.high - spec.max_rounds + 1} for {spec.max_rounds} rounds (round k adds k - 1)")
    rank = spec.job.grpo.lora_rank
    if start_rank + rank * spec.max_rounds > max_lora_rank:
        fits = max(0, (max_lora_rank - start_rank) // rank)
        start = f" on the start adapter's rank {start_rank}" if start_rank else ""
        raise InvalidArgument(
            f"max_rounds: {spec.max_rounds} rounds of job.grpo.lora_rank {rank}{start} stack to a rank-"
            f"{start_rank + rank * spec.max_rounds} adapter, over the rollout server's max LoRA rank {max_lora_rank} "
            f"(each round adds its rank on top of the best round's); allowed: at most {fits} rounds at rank {rank}, "
            f"or a smaller rank")
    return ResolvedLoop(spec=spec, job=job, warnings=warnings)


def resolve_loop_spec(
    user_spec: scheduler_pb2.LoopSpec,
    benchmarks: Sequence[benchmark_pb2.BenchmarkInfo],
    max_lora_rank: int,
    catalog: Catalog | None = None,
    start_rank: int = 0,
) -> ResolvedLoop:
    """Validates and fills in `user_spec` (not modified); raises InvalidArgument on a bad value.
    `catalog`: the reward service's rewards (resolve_spec's); `start_rank`: check_own_fields'."""
    own = check_own_fields(user_spec, max_lora_rank, catalog, start_rank)
    spec, job, warnings = own.spec, own.job, own.warnings
    named_job = bool(user_spec.job.name)

    info = _benchmark(spec, benchmarks, catalog)
    column = spec.score_column.strip() or info.default_score_column
    if column not in info.score_columns:
        raise InvalidArgument(f"score_column: {shown(column)} is not a score column of {info.name}; choose one of "
                              f"{', '.join(info.score_columns)}")
    spec.score_column = column
    if spec.benchmark_limit < 0 or (info.size and spec.benchmark_limit > info.size):
        allowed = f"0-{info.size} (0 = all {info.size} questions)" if info.size else ">= 0 (0 = all)"
        raise out_of_range("benchmark_limit", spec.benchmark_limit, allowed)
    if info.needs_dataset:
        # the benchmark of the reward the rounds train with scores the same data's held-out split
        same_reward = (info.reward_key or info.name) == spec.job.reward.key
        spec.benchmark_dataset = spec.benchmark_dataset.strip() or (spec.job.reward.dataset if same_reward else "")
        if not spec.benchmark_dataset:
            raise InvalidArgument(f"benchmark_dataset: required for the {info.name} benchmark (a hub dataset or a "
                                  "local JSONL/Parquet/CSV file with prompt and ground_truth columns); it defaults "
                                  "to the job's reward.dataset when the job trains with that benchmark's reward")
        spec.benchmark_dataset_split = spec.benchmark_dataset_split.strip() or DEFAULT_BENCHMARK_SPLIT
    elif spec.benchmark_dataset or spec.benchmark_dataset_split:
        given = "benchmark_dataset" if spec.benchmark_dataset else "benchmark_dataset_split"
        raise InvalidArgument(f"{given}: {shown(getattr(spec, given))} given, but only a benchmark that needs a dataset takes one ({info.name} has its "
                              "own questions)")

    spec.name = spec.name.strip() or f"{info.name} to {spec.target:g}%"
    if not NAME_RE.match(spec.name):
        raise InvalidArgument(f"name: {shown(spec.name)} is not allowed; use 1-128 letters, digits, spaces and "
                              ". _ - %, starting with a letter or digit (e.g. \"math-pairs to 35%\")")
    if not named_job:  # the rounds' jobs are "<loop name> R<k>"
        spec.job.name = job.spec.name = spec.name

    if benchmark_of(spec.job.reward.key, catalog) != info.name:
        warnings.append(f"the rounds train on {job.summary.reward} but are scored on {info.name}")
    return ResolvedLoop(spec=spec, job=job, warnings=warnings)
