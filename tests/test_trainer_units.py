"""Pure pieces of the trainer: job config from a request, step counts, the adapter version check,
the metric event, TRL's config per loss type, and the scorers. No model is loaded here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlvr.common.errors import FailedPrecondition, InvalidArgument
from rlvr.peers.types import BASE_MODEL, AdapterTag, Sampling, Score, ScoreInput
from rlvr.services.trainer.job.config import job_config, job_config_from_request
from rlvr.services.trainer.job.rollouts import AdapterVersionMismatch, RolloutBatch, check_versions
from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
from rlvr.services.trainer.job.step_record import StepRecord, metric_event
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2

# MetricEvent's episode metrics: a job with an environment's only (unset at a single-answer step)
EPISODE_METRICS = {"turns_mean", "turns_max", "tool_calls", "tool_errors", "tool_seconds", "observation_tokens_mean",
                   "episode_tokens_mean", "truncated_episodes", "failed_episodes",
                   "episode_splits"}
# and a Supervised (SFT) job's (unset at an RLVR step)
SFT_METRICS = {"token_accuracy", "tokens_per_second", "heldout_loss", "heldout_f1", "class_f1"}  # SFT's, Head's
METRIC_FIELDS = [f.name for f in C.MetricEvent.DESCRIPTOR.fields if f.name not in EPISODE_METRICS | SFT_METRICS]


def _request(**grpo: object) -> trainer_pb2.StartJobRequest:
    spec = C.JobSpec(base_model="rlvr-tiny-test", grpo=C.GrpoConfig(**grpo))
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    return trainer_pb2.StartJobRequest(job_id="job_1", spec=spec, total_steps=0)


def test_job_config_fills_defaults_and_rounds_batch(tmp_path: Path) -> None:
    job = job_config_from_request(_request(group_size=4, batch_size=2), tmp_path)
    assert (job.group_size, job.batch_size, job.prompts_per_step) == (4, 4, 1)  # 2 rounded up to 4
    assert (job.lora_rank, job.lora_alpha, job.max_completion_tokens) == (8, 16, 256)
    assert job.learning_rate == pytest.approx(1e-6) and job.max_steps == 100
    assert (job.loss_type, job.generation_backend, job.quantization) == ("dapo", "transformers", "full")
    assert job.adapter_name == "job-job_1" and job.job_dir == tmp_path / "jobs" / "job_1"


def test_job_config_rejects_bad_values(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="grpo.lora_rank"):
        job_config_from_request(_request(lora_rank=65), tmp_path)
    with pytest.raises(InvalidArgument, match="job_id"):
        job_config_from_request(trainer_pb2.StartJobRequest(job_id="a.b", spec=C.JobSpec()), tmp_path)
    request = _request()
    request.spec.init_adapter.path = "/etc"
    with pytest.raises(InvalidArgument, match="outside the artifact root") as outside:
        job_config_from_request(request, tmp_path)
    assert str(tmp_path) not in str(outside.value)  # the server's folder stays in its log


def test_init_adapter_errors_name_the_adapter_as_the_client_gave_it(tmp_path: Path) -> None:
    """A name resolved by the scheduler to a folder: messages say the name, never the folder."""
    from rlvr.services.trainer.job.runner import read_init_adapter

    folder = tmp_path / "jobs" / "abc" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{")
    (folder / "adapter_model.safetensors").write_bytes(b"")
    request = _request()
    request.spec.init_adapter.name, request.spec.init_adapter.path = "job-abc", str(folder)
    job = job_config_from_request(request, tmp_path)
    assert job.init_adapter_path == str(folder) and job.init_adapter_label == "job-abc"
    with pytest.raises(FailedPrecondition, match="^init_adapter: 'job-abc' cannot be stacked on: its adapter_config.json") as bad:
        read_init_adapter(job)
    assert str(tmp_path) not in str(bad.value)
    with pytest.raises(InvalidArgument, match="multiple of grpo.group_size"):
        job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=8, batch_size=4)


def test_full_run_step_count(tmp_path: Path) -> None:
    # max_steps = -1: every prompt for every epoch, group_size completions each, batch_size per step.
    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=4, batch_size=8,
                    max_steps=-1, epochs=3)
    assert job.steps_for(25) == math.ceil(25 * 3 * 4 / 8) == 38
    assert job_config(job_id="x", base_model="m", artifact_root=tmp_path, max_steps=7).steps_for(25) == 7
    assert job_config(job_id="x", base_model="m", artifact_root=tmp_path, total_steps=5).steps_for(25) == 5


def test_version_check_names_the_stale_completion() -> None:
    expected = AdapterTag("job-a", 3)
    check_versions([expected] * 4, expected, step=4)
    with pytest.raises(AdapterVersionMismatch) as err:
        check_versions([expected, AdapterTag("job-a", 2), expected, BASE_MODEL], expected, step=4)
    message = str(err.value)
    assert "\n" not in message
    assert "step 4" in message and "completion 1" in message and "job-a v2" in message
    assert "expected job-a v3" in message and "1 more of 4" in message


def test_metric_event_has_every_field() -> None:
    record = StepRecord(step=3, adapter_version=1, policy_lag=1, completion_lengths=[3, 5, 7, 9],
                        clipped=[False, False, False, True],
                        scores=[Score(1.1, 1, 1, components={"gsm8k": 1.0, "length": 0.5}),
                                Score(0.1, 0, 1, components={"gsm8k": 0.0, "length": 1.0}),
                                Score(0.0, 0, 0, error="length: ValueError: bad"),
                                Score(1.0, 1, 0, components={"gsm8k": 1.0, "length": 0.25})],
                        generate_seconds=0.5, score_seconds=0.01, sync_seconds=0.02)
    record.scored_at, record.optimizer_done_at = 10.0, 10.25
    record.finish()
    logs = {"loss": 0.125, "learning_rate": 1e-5, "entropy": 2.5, "kl": 0.01,
            "sampling/sampling_logp_difference/mean": 0.02, "sampling/sampling_logp_difference/max": 0.5,
            "clip_ratio/region_mean": 0.125}
    record.heldout_accuracy = 0.375
    event = metric_event("job_1", 10, record, logs, kl_computed=True, correction="precision", group_size=2)
    assert event.groups_with_signal == 2  # rewards 1.1, 0.1 | 0.0, 1.0: both groups differ
    assert event.heldout_accuracy == 0.375
    flat = StepRecord(step=1, scores=[Score(0.5, 0, 0), Score(0.5, 0, 0), Score(0.0, 0, 0), Score(1.0, 1, 0)])
    assert metric_event("j", 10, flat, {}, False, group_size=2).groups_with_signal == 1
    assert metric_event("j", 10, flat, {}, False, group_size=4).groups_with_signal == 1
    assert not metric_event("j", 10, flat, {}, False).HasField("groups_with_signal")
    assert event.clip_fraction == 0.125  # TRL's share of tokens its loss clipped; cispo's under its own key
    assert metric_event("j", 10, record, {"loss": 0.1, "cispo_clip_ratio": 0.5}, False).clip_fraction == 0.5
    assert not metric_event("j", 10, record, {"loss": 0.1}, False).HasField("clip_fraction")  # sapo: no clip
    assert event.reward_mean == pytest.approx(0.55) and event.reward_std == pytest.approx(0.5024938)
    assert (event.accuracy, event.format, event.clipped_ratio) == (0.5, 0.5, 0.25)
    assert (event.completion_length_mean, event.completion_length_max) == (6.0, 9)
    assert event.train_seconds == pytest.approx(0.25) and (event.adapter_version, event.policy_lag) == (1, 1)
    # each component's mean over the step's completions, the errored one counting 0; and the errors
    assert dict(event.reward_components) == {"gsm8k": 0.5, "length": pytest.approx(1.75 / 4)}
    assert event.reward_errors == 1
    assert (event.logprob_gap, event.logprob_gap_max, event.sampler_correction) == (0.02, 0.5, "precision")
    assert event.HasField("kl") and event.HasField("entropy") and event.HasField("time")
    assert set(METRIC_FIELDS) <= {f.name for f, _ in event.ListFields()} | {"adapter_version"}
    # KL is reported only when the KL term is computed (kl_beta > 0).
    assert not metric_event("job_1", 10, record, logs, kl_computed=False).HasField("kl")


@pytest.mark.parametrize(("loss_type", "scale"), [("grpo", "group"), ("dapo", "group"), ("dr_grpo", "none")])
def test_trl_config_per_loss_type(tmp_path: Path, loss_type: str, scale: str) -> None:
    from rlvr.services.trainer.job.engine import grpo_args

    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=4, batch_size=8,
                    loss_type=loss_type, kl_beta=0.04, temperature=0.7, learning_rate=5e-6)  # type: ignore[arg-type]
    args = grpo_args(job, total_steps=12, output_dir=tmp_path / "trl", use_cpu=True)
    assert (args.loss_type, args.scale_rewards, args.beta) == (loss_type, scale, 0.04)
    assert (args.per_device_train_batch_size, args.num_generations, args.max_steps) == (8, 4, 12)
    assert args.temperature == pytest.approx(0.7) and args.learning_rate == pytest.approx(5e-6)
    # docs/design.md's CPU facts: fp32, no gradient checkpointing.
    assert not args.bf16 and not args.fp16 and not args.gradient_checkpointing
    assert args.lr_scheduler_type == "constant" and args.num_iterations == 1
    assert args.epsilon_high == pytest.approx(args.epsilon) == pytest.approx(0.2)  # the spec's default: symmetric


def test_epsilon_high_reaches_trl(tmp_path: Path) -> None:
    from rlvr.services.trainer.job.config import job_config_from_request
    from rlvr.services.trainer.job.engine import grpo_args
    from rlvr.v1 import trainer_pb2

    request = trainer_pb2.StartJobRequest(job_id="x")
    request.spec.advanced.epsilon_high = 0.28  # DAPO's
    job = job_config_from_request(request, tmp_path)
    assert job.epsilon_high == 0.28  # the decimal typed, not float32's 0.2800000011920929
    args = grpo_args(job, total_steps=4, output_dir=tmp_path / "trl", use_cpu=True)
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.28)


def test_local_scorer_keeps_components_apart() -> None:
    scorer = LocalScorer(ScoreSettings("math_pairs", format_bonus=True, format_bonus_weight=0.1))
    scores = scorer.score([ScoreInput(c, "77") for c in (
        "<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>", "<think>x</think><answer>76</answer>", "77")])
    assert scores == [Score(1.1, 1.0, 1.0, True, "77", {"math_pairs": 1.0}),
                      Score(0.1, 0.0, 1.0, False, "76", {"math_pairs": 0.0}),
                      Score(1.0, 1.0, 0.0, True, "77", {"math_pairs": 1.0})]


def test_event_ids_match_the_scheduler() -> None:
    from rlvr.infra.subjects import metric_msg_id, status_msg_id
    from rlvr.jobspec import job_status_name, job_status_value

    assert metric_msg_id("j1", 7) == "j1:7"
    # Both publishers spell a status as the store does ("<job>:status:<STATUS>"): the same id dedups.
    assert status_msg_id("j1", job_status_name(C.JOB_STATUS_RUNNING)) == "j1:status:RUNNING"
    assert status_msg_id("j1", "QUEUED", again="resume-2") == "j1:status:QUEUED:resume-2"
    for value in C.JobStatus.values():
        assert job_status_value(job_status_name(value)) == value
    assert job_status_name(99) == "99"  # a newer server's status: shown, not a crash


def test_dynamic_sampling_round_seeds_meet_no_other_seed() -> None:
    """An extra round's seed must differ from every step's own seed and every other round's, or a
    prompt drawn again later would be sampled with the same random stream."""
    from rlvr.services.trainer.job.step import round_seed, step_seed

    for job_seed in (0, 1, 12345):
        own = {step_seed(job_seed, step) for step in range(1, 2001)}
        extra = [round_seed(job_seed, step, r) for step in range(1, 2001) for r in (1, 2, 3)]
        assert len(set(extra)) == len(extra) and not own & set(extra)
        assert all(0 <= s < 2**63 for s in extra)


class _Tokens:
    """A tokenizer for `Step` without a model: a prompt is one id (its length), a completion decodes to
    as many "x" as it has ids."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [len(text)]}

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["x" * len(row) for row in ids]


class _Generator:
    """Row j of a call gets j + 1 tokens (so each group has a length spread); records rows per call."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        rows = [list(p) for p in prompts for _ in range(sampling.group_size)]
        self.rows.append(len(rows))
        return RolloutBatch(rows, [[7] * (j + 1) for j in range(len(rows))], [[-0.5] * (j + 1) for j in range(len(rows))],
                            [False] * len(rows), expected, 0.0)

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        pass

    def close(self) -> None:
        pass


class _EvenOnly:
    """A reward spread (by length) only for even answers; records the items of each call."""

    def __init__(self) -> None:
        self.items: list[int] = []

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        self.items.append(len(items))
        return [Score(len(i.completion) / 10 if int(i.ground_truth) % 2 == 0 else 0.0, 0.0, 0.0) for i in items]

    def close(self) -> None:
        pass


def _step(tmp_path: Path, prompts: list[tuple[str, str]], dynamic: bool) -> tuple[Any, _Generator, _EvenOnly]:
    import threading

    from rlvr.services.trainer.job.dynamic import PromptDraw
    from rlvr.services.trainer.job.step import Step, StepContext, StepHooks, answers

    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=2, batch_size=4,
                     dynamic_sampling=dynamic)
    generator, scorer = _Generator(), _EvenOnly()
    hooks = StepHooks(save_adapter=lambda model, step: tmp_path, publish=lambda event: None, cancel=threading.Event())
    ctx = StepContext(job=job, tokenizer=_Tokens(), generator=generator, scorer=scorer, hooks=hooks, total_steps=1,
                      truth=answers(prompts), draw=PromptDraw(prompts, job.seed) if dynamic else None, live=BASE_MODEL)
    return Step(ctx, 1), generator, scorer


def test_a_dynamic_sampling_step_scores_each_completion_once(tmp_path: Path) -> None:
    """Generate -> score in the rollout, once per completion and round; the rows TRL trains on carry
    their scores, and the reward function returns them without scoring again."""
    prompts = [(f"question {i}", str(i)) for i in range(1, 9)]  # odd answers first: no signal in the own groups
    step, generator, scorer = _step(tmp_path, [p for p in prompts if int(p[1]) % 2] + [p for p in prompts
                                                                                        if not int(p[1]) % 2], True)
    rows = step.rollout(["question 1", "question 1", "question 3", "question 3"])
    assert scorer.items == generator.rows and len(generator.rows) > 1  # further rounds, each scored once
    assert len(rows["completion_ids"]) == 4 and all(int(t) % 2 == 0 for t in rows["ground_truth"])
    texts = ["x" * len(c) for c in rows["completion_ids"]]
    assert rows["score"] == _EvenOnly().score([ScoreInput(c, t) for c, t in zip(texts, rows["ground_truth"],
                                                                                 strict=True)])  # each row's own
    assert rows["logprobs"] == [[-0.5] * len(c) for c in rows["completion_ids"]]
    rewards = step.rewards(rows["score"], texts, rows["ground_truth"], ["question"] * len(texts))
    assert rewards == [s.reward for s in rows["score"]] and scorer.items == generator.rows  # not scored again
    # The metrics describe every completion generated, the groups not trained on included.
    assert len(step.record.scores) == len(step.record.completion_lengths) == sum(generator.rows)
    assert step.record.groups_drawn == sum(generator.rows) // 2 and step.record.groups_with_signal >= 2


def test_a_step_over_a_question_with_two_answers_scores_in_the_reward_function(tmp_path: Path) -> None:
    """The rollout sees prompts, not rows: with a question asked twice with different answers it
    cannot score, so TRL's rows are scored against their own answers (once) by the reward function."""
    from rlvr.services.trainer.job.step import answers

    prompts = [("q", "2"), ("q", "3"), ("r", "4")]
    assert answers(prompts) is None and answers(prompts[1:]) == {"q": "3", "r": "4"}
    step, generator, scorer = _step(tmp_path, prompts, False)
    rows = step.rollout(["q", "q", "r", "r"])
    assert "score" not in rows and scorer.items == []
    texts = ["x" * len(c) for c in rows["completion_ids"]]
    assert step.rewards(None, texts, ["3", "3", "4", "4"], ["q", "q", "r", "r"]) == [0.0, 0.0, 0.3, 0.4]
    assert scorer.items == [4] and step.record.scores and step.record.scored_at is not None


def test_training_prompts_come_from_the_jobs_dataset_split(tmp_path: Path) -> None:
    """reward.dataset_split reaches the trainer: a GSM8K job on "test" trains on the test split's
    problems (in a seeded order), one on the default "train" on the train split's."""
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.services.trainer.job.runner import training_prompts
    from rlvr.tasks import get_task

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("rlvr-tiny-test"))
    gsm8k = get_task("gsm8k")
    truths = {split: {p.ground_truth for p in gsm8k.prompts(split=split)} for split in ("train", "test")}
    for split in ("train", "test"):
        job = job_config(job_id="j", base_model="rlvr-tiny-test", artifact_root=tmp_path, reward_function="gsm8k",
                        dataset_split=split)
        prompts = training_prompts(job, tokenizer)
        assert len(prompts) == len(gsm8k.prompts(split=split))
        assert {t for _, t in prompts} == truths[split]
    first = [t for _, t in training_prompts(job_config(job_id="j", base_model="rlvr-tiny-test", artifact_root=tmp_path,
                                                      reward_function="gsm8k", dataset_split="test"), tokenizer)]
    assert first != [p.ground_truth for p in gsm8k.prompts(split="test", shuffle=False)]  # seeded, not file order


def test_a_rollout_server_that_stays_away_fails_the_step_naming_it() -> None:
    """The bounded wait (RLVR_TRAINER_ROLLOUT_WAIT_SECONDS): told to the job's watchers while it
    lasts, then one error that names the rollout service, the step and the cause."""
    from rlvr.clients.stack import free_port
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    told: list[str] = []
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    generator = ServiceGenerator(address, wait_s=2.0, on_wait=told.append)
    generator.step = 7
    try:
        with pytest.raises(RuntimeError) as e:
            generator.generate([[1, 2, 3]], Sampling(group_size=2, max_tokens=4), AdapterTag())
    finally:
        generator.close()
    assert str(e.value).startswith(f"the rollout service at {address} did not come back within 2 s")
    assert "generating at step 7 failed with: rollout service at" in str(e.value) and "UNAVAILABLE" in str(e.value)
    assert told and told[0].startswith(f"step 7: waiting for the rollout service at {address} (0 s of at most 2 s")


def test_capabilities_of_a_gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch of the worker's capabilities, with torch's device queries standing in for two
    GPUs (an Ampere, then a Volta: bf16 is offered only when every device has it); and none without
    a GPU driver, where torch is not asked at all."""
    from types import SimpleNamespace

    import torch

    from rlvr.services.trainer.capabilities import worker_capabilities

    driver = tmp_path / "nvidiactl"
    driver.touch()
    majors = [8, 8]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(majors))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(
        name=f"GPU{i}", total_memory=(i + 1) << 30, major=majors[i]))
    caps = worker_capabilities(driver_files=[str(driver)])
    assert caps.device_kind == "cuda" and caps.max_num_processes == 2
    assert [(g.index, g.name, g.memory_bytes, g.bf16) for g in caps.gpus] == [(0, "GPU0", 1 << 30, True),
                                                                             (1, "GPU1", 2 << 30, True)]
    assert list(caps.precisions) == ["fp32", "fp16", "bf16"]
    majors[1] = 7
    assert list(worker_capabilities(driver_files=[str(driver)]).precisions) == ["fp32", "fp16"]
    no_driver = worker_capabilities(driver_files=[str(tmp_path / "absent")])
    assert no_driver.device_kind == "cpu" and not no_driver.gpus and "fp16" not in no_driver.precisions


@pytest.mark.parametrize(("status", "cancel_marked", "world", "expected"), [
    ("cancelled", False, 2, ("failed", "training process 1 failed: NOT_FOUND: adapter job-x v2")),
    ("failed", False, 2, ("failed", "training process 1 failed: NOT_FOUND: adapter job-x v2")),
    ("cancelled", True, 2, ("cancelled", "")),  # the worker's own cancel stays a cancel
    ("completed", False, 2, ("completed", "")),
    ("cancelled", False, 1, ("cancelled", "")),  # one process: no other rank to blame
])
def test_rank_0_reports_another_ranks_failure_not_torchruns_sigterm(
    tmp_path: Path, status: str, cancel_marked: bool, world: int, expected: tuple[str, str]
) -> None:
    from rlvr.services.trainer.job import artifacts
    from rlvr.services.trainer.job.runner import JobResult
    from rlvr.services.trainer.process.job_process import settle_ranks

    artifacts.write_json_atomic(tmp_path / "result-rank1.json", JobResult(
        job_id="x", status="failed", error="NOT_FOUND: adapter job-x v2").to_json())
    if cancel_marked:
        (tmp_path / artifacts.CANCEL_FILE).touch()
    result = JobResult(job_id="x", status=status)  # type: ignore[arg-type]  # the parametrized outcome
    settle_ranks(result, tmp_path, world)
    assert (result.status, result.error) == expected


class _Faulty:
    """A scorer whose reward errs on the completions that say "bad"."""

    def __init__(self) -> None:
        self.calls: list[list[ScoreInput]] = []

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        self.calls.append(list(items))
        return [Score(0.0, 0.0, 0.0, error="checker: ValueError: bad answer") if "bad" in i.completion
                else Score(1.0, 1.0, 0.0, components={"checker": 1.0}) for i in items]

    def close(self) -> None:
        pass


def test_a_steps_reward_errors_are_counted_logged_once_and_fail_the_job_only_when_all_err(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from rlvr.services.trainer.job.step import RewardFailure, StepContext, StepHooks
    from rlvr.tasks import Problem

    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=2, batch_size=4)
    scorer = _Faulty()
    problem = Problem("p1", "labels", "Is 2 even?", "even", columns={"choices": ["even", "odd"]})
    ctx = StepContext(job=job, tokenizer=_Tokens(), generator=_Generator(), scorer=scorer,
                      hooks=StepHooks(save_adapter=lambda m, s: tmp_path, publish=lambda e: None,
                                      cancel=threading.Event()),
                      total_steps=1, truth=None, draw=None, live=BASE_MODEL, problems={("P1", "even"): problem})
    with caplog.at_level("WARNING", logger="rlvr.trainer.step"):
        first = ctx.score(["good", "bad", "bad"], ["P1"] * 3, ["even"] * 3)
        ctx.score(["bad", "good"], ["P1"] * 2, ["even"] * 2)
    assert [s.error for s in first] == ["", "checker: ValueError: bad answer", "checker: ValueError: bad answer"]
    # the reward reads the problem's question and columns, not the rendered prompt
    assert scorer.calls[0][0] == ScoreInput("good", "even", "Is 2 even?", (), {"choices": ["even", "odd"]})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["job x: reward error on 2 of 3 completions (each scored 0): checker: ValueError: bad answer"]
    with pytest.raises(RewardFailure, match="the reward failed on every completion of the step: checker: ValueError"):
        ctx.score(["bad", "bad"], ["P1"] * 2, ["even"] * 2)
