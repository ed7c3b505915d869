"""The Training Method and Supervised (SFT)'s card: defaults, the Training Summary, every bad field
at once, what an SFT job refuses, and CreateJob's check of its dataset (services/scheduler/datasets.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.common.errors import InvalidArgument
from rlvr.jobspec import resolve_spec
from rlvr.services.scheduler.datasets import check_sft_dataset
from rlvr.v1 import common_pb2 as C


def sft(**card: object) -> C.JobSpec:
    return C.JobSpec(method=C.TRAINING_METHOD_SFT, sft=C.SftConfig(**{"dataset": "data/train.jsonl", **card}))


def _refused(spec: C.JobSpec) -> list[str]:
    with pytest.raises(InvalidArgument) as refused:
        resolve_spec(spec)
    return str(refused.value).splitlines()


def test_sft_defaults_and_summary() -> None:
    r = resolve_spec(sft())
    s = r.spec.sft
    assert (s.dataset_split, s.epochs, s.max_steps, s.batch_size, s.max_seq_length) == ("train", 1, -1, 8, 1024)
    assert (s.lora_rank, s.lora_alpha, s.target_modules, s.completion_only_loss, s.packing) == (8, 16, "all-linear",
                                                                                                True, False)
    assert s.learning_rate == pytest.approx(2e-4) and s.lora_dropout == pytest.approx(0.05)
    assert r.spec.name == "rlvr-tiny-sft"
    assert r.warnings == []  # nothing of the reward's or GRPO's: an SFT job reads neither
    assert r.total_steps == -1  # Full: known once the trainer has read the dataset
    summary = r.summary
    assert (summary.method, summary.reward, summary.backend, summary.group_size) == ("Supervised (SFT)", "", "", 0)
    assert (summary.lora_rank, summary.lora_alpha, summary.batch_size, summary.max_steps) == (8, 16, 8, -1)
    assert summary.settings["sft.dataset"] == "data/train.jsonl" and summary.settings["sft.packing"] == "off"
    assert not any(path.startswith(("grpo.", "advanced.", "reward.")) for path in summary.settings)
    assert resolve_spec(sft(max_steps=30, batch_size=4)).total_steps == 30


def test_the_sft_summary_reads_as_its_card() -> None:
    from rlvr.clients.views.jobs import summary_rows

    rows = dict(summary_rows(resolve_spec(sft()).summary))
    assert rows["Method"] == "Supervised (SFT)" and rows["Max Steps"] == "Full" and rows["Dataset"] == "data/train.jsonl"
    assert "Group Size" not in rows and "Reward" not in rows and "Backend" not in rows
    assert dict(summary_rows(resolve_spec(C.JobSpec()).summary))["Method"] == "RLVR (GRPO)"


def test_every_bad_sft_field_is_named_at_once() -> None:
    spec = C.JobSpec(method=C.TRAINING_METHOD_SFT, sft=C.SftConfig(
        learning_rate=0.5, lora_dropout=0.9, batch_size=0, max_seq_length=8, lora_rank=2, epochs=0, max_steps=0,
        target_modules="q_proj;drop"))
    spec.advanced.num_nodes = 2
    spec.init_adapter.name = "job-abc"
    lines = _refused(spec)
    fields = [line.split(":", 1)[0] for line in lines]
    assert sorted(fields) == sorted([
        "sft.learning_rate", "sft.lora_dropout", "sft.batch_size", "sft.max_seq_length", "sft.lora_rank",
        "sft.epochs", "sft.max_steps", "sft.target_modules", "sft.dataset", "advanced.num_nodes",
        "init_adapter"]), lines
    text = "\n".join(lines)
    assert "sft.learning_rate: 0.5 is out of range; allowed: 1e-06 to 0.001 (default 0.0002)" in text
    assert "sft.dataset: required for a Supervised (SFT) job" in text
    assert "sft.max_steps: 0 is out of range; allowed: -1 (Full) or 1-1000000 (default Full)" in text
    assert "init_adapter: not allowed with method SFT" in text
    # several processes train it, each an equal share of a step's examples
    shared = C.JobSpec(method=C.TRAINING_METHOD_SFT, sft=C.SftConfig(dataset="d.jsonl", batch_size=6))
    shared.advanced.num_processes = 4
    assert _refused(shared) == ["sft.batch_size: 6 is not a multiple of advanced.num_processes 4: each process "
                                "trains an equal share of every step's examples"]
    shared.advanced.num_processes = 3
    assert resolve_spec(shared).spec.advanced.num_processes == 3


def test_what_only_rlvr_reads_is_dropped_with_a_warning() -> None:
    """`rlvr train --method sft --lr 1e-4 --epochs 3`: RLVR's fields, even out of their range, are not an
    SFT job's: dropped from the resolved spec (their defaults) and named once; what SFT reads stays."""
    spec = sft()
    spec.grpo.learning_rate, spec.grpo.group_size, spec.reward.key = 1e-4, 99, "gsm8k"
    spec.advanced.temperature, spec.advanced.epochs, spec.advanced.generation_backend = 9.0, 3, 2
    spec.advanced.seed, spec.advanced.checkpoint_every, spec.advanced.precision = 5, 4, "fp32"
    r = resolve_spec(spec)
    assert r.warnings == ["reward.key, grpo.group_size, grpo.learning_rate, advanced.epochs, "
                          "advanced.generation_backend, advanced.temperature: ignored: Reinforcement (RLVR)'s, and "
                          "this job's method is SFT (its own card: sft.*)"]
    assert (r.spec.grpo.group_size, r.spec.reward.key, r.spec.advanced.epochs) == (8, "math_pairs", 1)
    assert (r.spec.advanced.seed, r.spec.advanced.checkpoint_every, r.spec.advanced.precision) == (5, 4, "fp32")
    assert resolve_spec(sft()).warnings == []  # an SFT job of defaults: nothing to say


def test_an_sft_job_has_no_environment() -> None:
    spec = sft()
    spec.environment.key = "calculator"
    assert any(line.startswith("environment.key: not allowed with method SFT") for line in _refused(spec))


def test_the_method_is_checked_and_an_ignored_card_is_said() -> None:
    assert _refused(C.JobSpec(method=7)) == ["method: 7 is out of range; allowed: 1 (RLVR (GRPO)), 2 (Supervised (SFT)), "
                                                 "3 (Head)"]
    r = resolve_spec(C.JobSpec(sft=C.SftConfig(dataset="x.jsonl")))
    assert r.spec.method == C.TRAINING_METHOD_RLVR
    assert "sft: ignored: it is Supervised (SFT)'s card and this job's method is RLVR" in r.warnings


def test_a_loop_takes_no_sft_or_head_job() -> None:
    from rlvr.services.scheduler.loopspec import _job_spec
    from rlvr.v1 import scheduler_pb2 as S

    with pytest.raises(InvalidArgument, match="job.method: SFT is not allowed in a loop"):
        _job_spec(S.LoopSpec(job=sft()), None)
    head = C.JobSpec(method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(dataset="x.jsonl"))
    with pytest.raises(InvalidArgument, match="job.method: HEAD is not allowed in a loop.*--method head"):
        _job_spec(S.LoopSpec(job=head), None)


def test_head_defaults_and_what_a_regression_head_ignores() -> None:
    r = resolve_spec(C.JobSpec(method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(dataset=" data.jsonl ")))
    h = r.spec.head
    assert (h.dataset, h.dataset_split, h.text_column, h.label_column, h.task) == (
        "data.jsonl", "train", "text", "label", C.HEAD_TASK_CLASSIFICATION)
    assert (h.learning_rate, h.lora_rank, h.max_steps, h.max_seq_length, h.target_modules) == (
        1e-4, 8, -1, 512, "all-linear")
    assert r.summary.method == "Head" and r.spec.name == "rlvr-tiny-head" and not r.warnings
    regression = resolve_spec(C.JobSpec(method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(
        dataset="d.jsonl", task=C.HEAD_TASK_REGRESSION, reward_label="1")))
    assert regression.warnings == ["head.reward_label: ignored: a regression head's score is its number, "
                                   "clipped to 0-1"]
    assert _refused(C.JobSpec(method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(
        dataset="d.jsonl", target_modules="q proj!"))) == [
        "head.target_modules: 'qproj!' is out of range; allowed: \"all-linear\" (default) or a comma list of module "
        "names"]


@pytest.mark.parametrize(("rows", "error"), [
    ([{"prompt": "a", "completion": "b"}], None),
    ([{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}], None),
    ([{"prompt": "a", "ground_truth": "b"}],
     "sft.dataset: 'data/train.jsonl' (train) has no 'prompt' and 'completion' or 'messages' column, which method SFT "
     "trains on; columns present: ['prompt', 'ground_truth']"),
])
def test_create_job_checks_the_sft_datasets_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    rows: list[dict[str, object]], error: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = resolve_spec(sft()).spec.sft
    if error is None:
        check_sft_dataset(card, [tmp_path])
        return
    with pytest.raises(InvalidArgument) as refused:
        check_sft_dataset(card, [tmp_path])
    assert str(refused.value) == error
    card.dataset_split = "validation"
    with pytest.raises(InvalidArgument, match="sft.dataset_split: 'validation' is not a split of 'data/train.jsonl'; "
                                              "it has: train"):
        check_sft_dataset(card, [tmp_path])
    card.dataset = "/elsewhere/train.jsonl"
    with pytest.raises(InvalidArgument, match="sft.dataset: dataset path '/elsewhere/train.jsonl' is outside the "
                                              "allowed data roots"):
        check_sft_dataset(card, [tmp_path])
