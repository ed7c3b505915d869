"""CreateLoop's validation (services/scheduler/loopspec.py): every bad value is INVALID_ARGUMENT naming
the field and the allowed range or choices; the job spec is checked exactly as CreateJob checks it."""

from __future__ import annotations

import pytest

from rlvr.common.errors import InvalidArgument
from rlvr.jobspec import resolve_spec
from rlvr.services.benchmark.evaluations import EvaluationManager
from rlvr.services.scheduler.loopspec import resolve_loop_spec
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

# What the benchmark service lists: its own catalog, not a copy.
BENCHMARKS = EvaluationManager.benchmarks()


def spec(**fields: object) -> S.LoopSpec:
    s = S.LoopSpec(name="math-pairs to 35%", benchmark="rlvr-math-pairs-heldout", target=35.0)
    for key, value in fields.items():
        if key == "job":
            s.job.CopyFrom(value)
        else:
            setattr(s, key, value)
    return s


def resolve(s: S.LoopSpec, max_rank: int = 64):
    return resolve_loop_spec(s, BENCHMARKS, max_rank)


def test_defaults_are_filled_in_one_place() -> None:
    resolved = resolve(spec())
    s = resolved.spec
    assert (s.max_rounds, s.give_up_after, s.reclaim_storage, s.score_column) == (8, 2, True, "accuracy")
    assert not s.HasField("min_gain")  # unset = one standard error
    assert s.job.grpo.group_size == 8 and s.job.grpo.batch_size == 8  # the job spec, resolved as CreateJob does
    assert resolved.job.summary.method == "RLVR (GRPO)"
    assert any("rounded up" in w for w in resolved.warnings)  # batch 4 -> 8, CreateJob's warning


def test_name_and_benchmark_default_from_the_task_and_the_target() -> None:
    s = resolve(spec(name="", benchmark="")).spec
    assert (s.name, s.benchmark) == ("rlvr-math-pairs-heldout to 35%", "rlvr-math-pairs-heldout")
    assert s.job.name == s.name  # each round's job is "<loop name> R<k>"
    gsm = spec(name="", benchmark="")
    gsm.job.reward.function = C.REWARD_FUNCTION_GSM8K
    assert resolve(gsm).spec.name == "gsm8k to 35%"


def test_the_job_spec_is_resolved_exactly_as_create_job_resolves_it() -> None:
    job = C.JobSpec(base_model="rlvr-tiny")
    job.grpo.lora_rank, job.grpo.batch_size = 4, 16
    job.advanced.temperature = 0.3
    job.name = "mine"
    assert resolve(spec(job=job)).spec.job == resolve_spec(job).spec


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "-bad"}, "name: '-bad'"),
        ({"name": "x" * 129}, "name:"),
        ({"target": 0.0}, "target: 0.0 is out of range; allowed: a percent in (0, 100]"),
        ({"target": 100.5}, "target: 100.5"),
        ({"target": -3.0}, "target: -3.0"),
        ({"target": float("nan")}, "target: nan"),
        ({"max_rounds": 0}, "max_rounds: 0 is out of range; allowed: 1-100 (default 8)"),
        ({"max_rounds": 101}, "max_rounds: 101"),
        ({"give_up_after": 0}, "give_up_after: 0 is out of range; allowed: 1-100 (default 2)"),
        ({"min_gain": -1.0}, "min_gain: -1.0 is out of range; allowed: 0-100 points"),
        ({"min_gain": 101.0}, "min_gain: 101.0"),
        ({"benchmark": "mmlu"}, "benchmark: 'mmlu' is not a benchmark the benchmark service lists; choose one of "
                                "rlvr-math-pairs-heldout, gsm8k, boxed"),
        ({"score_column": "f1"}, "score_column: 'f1' is not a score column of rlvr-math-pairs-heldout; choose one of "
                                 "accuracy, accuracy_strict, format, answered"),
        ({"benchmark_limit": -1}, "benchmark_limit: -1 is out of range; allowed: 0-500"),
        ({"benchmark_limit": 501}, "benchmark_limit: 501"),
        ({"benchmark": "boxed"}, "benchmark_dataset: required for the boxed benchmark"),
        ({"benchmark_dataset": "x.jsonl"}, "benchmark_dataset: 'x.jsonl' given, but only a benchmark that needs"),
    ],
)
def test_bad_loop_values_name_the_field_and_the_range(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        resolve(spec(**fields))
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda j: setattr(j.grpo, "lora_rank", 65), "job.grpo.lora_rank: 65 is out of range; allowed: 4-64"),
        (lambda j: setattr(j.grpo, "learning_rate", 1e-3), "job.grpo.learning_rate: 0.001 is out of range"),
        (lambda j: setattr(j.grpo, "batch_size", 3), "job.grpo.batch_size: 3 is out of range"),
        (lambda j: setattr(j.advanced, "temperature", 5.0), "job.advanced.temperature: 5.0"),
        (lambda j: setattr(j.reward, "function", C.REWARD_FUNCTION_BOXED), "job.reward.dataset: required"),
        (lambda j: j.init_adapter.CopyFrom(C.AdapterRef(path="jobs/abc/adapter")),
         "job.init_adapter.path: not allowed in a loop; name the adapter it starts from"),
    ],
)
def test_bad_job_values_are_named_under_job(mutate, message: str) -> None:
    s = spec()
    mutate(s.job)
    with pytest.raises(InvalidArgument) as e:
        resolve(s)
    assert message in str(e.value)


def test_stacked_rank_must_fit_the_rollout_server() -> None:
    s = spec(max_rounds=8)
    s.job.grpo.lora_rank = 16
    with pytest.raises(InvalidArgument) as e:
        resolve(s)
    assert "max_rounds: 8 rounds of job.grpo.lora_rank 16 stack to a rank-128 adapter" in str(e.value)
    assert "at most 4 rounds at rank 16" in str(e.value)
    s.max_rounds = 4
    assert resolve(s).spec.max_rounds == 4
    assert resolve(spec(max_rounds=8)).spec.job.grpo.lora_rank == 8  # the defaults fit: 8 x 8 = 64
    # a loop from a start adapter (job.init_adapter.name) stacks its rounds on that adapter's rank
    started = spec(max_rounds=8)
    started.job.init_adapter.name = "job-abc"
    with pytest.raises(InvalidArgument) as e:
        resolve_loop_spec(started, BENCHMARKS, 64, start_rank=16)
    assert ("max_rounds: 8 rounds of job.grpo.lora_rank 8 on the start adapter's rank 16 stack to a rank-80 adapter"
            in str(e.value)) and "at most 6 rounds at rank 8" in str(e.value)
    started.max_rounds = 6
    assert resolve_loop_spec(started, BENCHMARKS, 64, start_rank=16).spec.job.init_adapter.name == "job-abc"


def test_score_column_defaults_to_the_benchmarks_and_boxed_takes_the_jobs_dataset() -> None:
    assert resolve(spec(benchmark="gsm8k")).spec.score_column == "accuracy"
    s = spec(benchmark="boxed")
    s.job.reward.function = C.REWARD_FUNCTION_BOXED
    s.job.reward.dataset = "/data/set.jsonl"
    resolved = resolve(s).spec
    assert (resolved.benchmark_dataset, resolved.benchmark_dataset_split) == ("/data/set.jsonl", "test")


def test_a_benchmark_that_trains_on_another_task_warns() -> None:
    warnings = resolve(spec(benchmark="gsm8k")).warnings
    assert any("train on Math Pairs (synthetic) but are scored on gsm8k" in w for w in warnings)
    assert not any("scored on" in w for w in resolve(spec()).warnings)


def test_give_up_after_not_below_max_rounds_is_accepted_with_a_warning() -> None:
    """Rounds spent is checked before Plateaued: Give Up After >= Max Rounds can never plateau."""
    for rounds, give_up in ((3, 5), (3, 3)):
        resolved = resolve(spec(max_rounds=rounds, give_up_after=give_up))
        assert (resolved.spec.max_rounds, resolved.spec.give_up_after) == (rounds, give_up)
        assert any(w.startswith(f"give_up_after {give_up} is not below max_rounds {rounds}") and "Plateaued" in w
                   for w in resolved.warnings), resolved.warnings
    assert not any("give_up_after" in w for w in resolve(spec(max_rounds=3, give_up_after=2)).warnings)


def test_the_catalog_is_what_the_benchmark_service_lists() -> None:
    assert [b.name for b in BENCHMARKS] == ["rlvr-math-pairs-heldout", "gsm8k", "boxed", "code-heldout",
                                             "guess-number", "reasoning_gym"]
    assert isinstance(BENCHMARKS[0], B.BenchmarkInfo) and BENCHMARKS[0].size == 500
