"""A Head job in-process (`run_job` with method "head") on the "test"-size tiny model, through
transformers' Trainer on a sequence-classification head: the head learns a separable labeling, the
held-out accuracy, macro F1 and each class's F1 come at the eval steps and always at the last, a
frozen base (rank 0) moves the head alone, regression reports its mean squared error, the adapter
carries the head's description (rlvr/heads.py) and loads back as a scorer, and bad data fails the job
naming the column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures_trainer import local_deps, write_jsonl

from rlvr.heads import HeadScorer, default_reward_label, labels_problem, read_head, sample_text
from rlvr.services.trainer.job.config import HeadSettings, JobConfig, job_config
from rlvr.services.trainer.job.runner import run_job
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "head" / "math-verdicts"



def _words(tmp_path: Path, n: int = 48) -> Path:
    """A labeling the first word decides: "apple ..." is fruit, "stone ..." is rock."""
    words = ("apple", "stone")
    return write_jsonl(tmp_path / "data" / "words.jsonl",
                  [{"text": f"{words[i % 2]} number {i}", "label": ("fruit", "rock")[i % 2]} for i in range(n)])


def _job(tmp_path: Path, model: str, dataset: Path, **overrides: Any) -> JobConfig:
    head = dict(dataset=str(dataset), dataset_split="train", text_column="text", label_column="label",
                task="classification", learning_rate=1e-2, epochs=1, max_steps=12, batch_size=8, max_seq_length=32,
                lora_rank=4, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", reward_label="")
    head.update(overrides.pop("head", {}))
    return job_config("h1", model, tmp_path / "artifacts", gpu_selection="cpu", method="head",
                      data_roots=(dataset.parent, EXAMPLE.parent), head=HeadSettings(**head), **overrides)



def test_a_head_learns_a_separable_labeling(tmp_path: Path, tiny_model: str) -> None:
    from rlvr.models import resolve_model

    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, _words(tmp_path), eval_every=6)
    result = run_job(job, local_deps(events))

    assert result.status == "completed", result.error
    assert (result.steps_done, result.total_steps) == (12, 12)
    assert [e.step for e in events] == list(range(1, 13))
    evaluated = [e for e in events if e.HasField("heldout_accuracy")]
    assert [e.step for e in evaluated] == [6, 12]
    last = evaluated[-1]
    assert last.heldout_accuracy == 1.0 and last.heldout_f1 == 1.0
    assert dict(last.class_f1) == {"fruit": 1.0, "rock": 1.0}
    assert last.heldout_loss < events[0].loss
    info = read_head(Path(result.adapter_path))
    assert info is not None and info.classes == ("fruit", "rock") and info.task == "classification"
    assert info.reward_label == "rock"  # no 1/true/yes/correct/positive class: the last in sorted order
    scorer = HeadScorer(resolve_model(tiny_model), Path(result.adapter_path))
    fruit, rock = scorer.scores(["apple number 99", "stone number 99"])
    assert rock > 0.5 > fruit  # the score is P(rock)


async def test_the_reward_service_scores_with_a_completed_head_by_its_key(tmp_path: Path, tiny_model: str) -> None:
    """A Head job's adapter under the reward service's head roots is the reward head_<job id> once it
    is there (no restart): listed, scored alone or as a term beside a built-in, and an adapter that is
    not a head is no reward."""
    import asyncio

    import grpc

    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.v1 import reward_pb2 as R
    from rlvr.v1 import reward_pb2_grpc

    root = tmp_path / "artifacts"
    settings = RewardSettings(port=0, data_roots=[tmp_path], head_roots=[root])
    async with ServiceRunner(build_service(settings), settings) as runner, \
            grpc.aio.insecure_channel(runner.address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        listed = await stub.ListRewardFunctions(R.ListRewardFunctionsRequest(), timeout=30)
        assert not [r.key for r in listed.functions if r.key.startswith("head_")]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Score(R.ScoreRequest(key="head_h1", items=[R.ScoreItem(completion="x")]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "head_h1" in (e.value.details() or "")

        result = await asyncio.to_thread(run_job, _job(tmp_path, tiny_model, _words(tmp_path)), local_deps([]))
        assert result.status == "completed", result.error
        (root / "jobs" / "other" / "adapter").mkdir(parents=True)  # not a head: no key
        broken = root / "jobs" / "broken" / "adapter"  # a cut weights file: no key, and no harm to the others
        broken.mkdir(parents=True)
        (broken / "adapter_model.safetensors").write_bytes(b"\x10\x00 not a safetensors file")
        listed = await stub.ListRewardFunctions(R.ListRewardFunctionsRequest(), timeout=30)
        heads = {r.key: r for r in listed.functions if r.key.startswith("head_")}
        assert list(heads) == ["head_h1"] and "'rock'" in heads["head_h1"].description
        items = [R.ScoreItem(prompt="stone", completion="number 5"), R.ScoreItem(prompt="apple", completion="number 5")]
        alone = await stub.Score(R.ScoreRequest(key="head_h1", items=items, format_bonus=False), timeout=120)
        rock, fruit = (r.reward for r in alone.results)
        assert rock > 0.5 > fruit and not any(r.error for r in alone.results)
        terms = [C.RewardTerm(key="math_pairs", weight=1.0), C.RewardTerm(key="head_h1", weight=0.5)]
        both = await stub.Score(R.ScoreRequest(terms=terms, items=items, format_bonus=False), timeout=120)
        assert [round(r.components["head_h1"], 6) for r in both.results] == [round(rock, 6), round(fruit, 6)]
        assert both.results[0].reward == pytest.approx(0.5 * rock, abs=1e-6)  # math_pairs scores these 0


def test_bad_head_data_is_named(tmp_path: Path) -> None:
    def problem(rows: list[dict[str, Any]], *args: str) -> tuple[str, str]:
        found = labels_problem(rows, *args)[1]
        assert found is not None
        return found.field, found.why

    rows = [{"text": "a", "label": "x"}, {"text": "b", "label": "x"}]
    assert problem(rows, "text", "label", "classification") == (
        "head.dataset", "column 'label' has one class only ('x'): a classification head needs two at least")
    assert problem(rows, "words", "label", "classification")[0] == "head.text_column"
    assert problem(rows, "text", "verdict", "classification")[0] == "head.label_column"
    assert "is not a number" in problem(rows, "text", "label", "regression")[1]
    assert "label is empty" in problem([*rows, {"text": "c", "label": None}], "text", "label", "classification")[1]
    two = [*rows, {"text": "c", "label": "y"}]
    assert labels_problem(two, "text", "label", "classification") == (("x", "y"), None)
    assert problem(two, "text", "label", "classification", "z") == ("head.reward_label",
                                                                     "has no class 'z'; its classes: ['x', 'y']")
    assert labels_problem([{"text": "a", "label": "2.5"}, {"text": "b", "label": 3}], "text", "label",
                          "regression") == ((), None)
    # 1 and 1.0 are one class; numbers in the head's order by value, and the default reward class the largest
    numbers = [{"text": "a", "label": 1.0}, {"text": "b", "label": "1"}, {"text": "c", "label": 10},
               {"text": "d", "label": 2}]
    assert labels_problem(numbers, "text", "label", "classification") == (("1", "2", "10"), None)
    assert default_reward_label(("2", "10", "3")) == "10" and default_reward_label(("no", "Yes")) == "Yes"
    assert sample_text("Q", "A") == "Q\nA" and sample_text("", "A") == "A"


def test_a_frozen_base_regression_head_moves_the_head_alone(tmp_path: Path, tiny_model: str) -> None:
    """Rank 0: the base frozen (its zero LoRA never moves, so base + adapter is the base exactly) and
    the head alone trained; regression: the held-out loss is the mean squared error, no accuracy."""
    from safetensors.torch import load_file

    rows = [{"text": f"{'apple' if i % 2 else 'stone'} number {i}", "label": 0.9 if i % 2 else 0.1} for i in range(40)]
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, write_jsonl(tmp_path / "data" / "numbers.jsonl", rows),
               head={"task": "regression", "lora_rank": 0, "learning_rate": 5e-3, "max_steps": 8})
    result = run_job(job, local_deps(events))
    assert result.status == "completed", result.error
    tensors = load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))
    lora = {k: v for k, v in tensors.items() if "lora_" in k}
    assert lora and all(not v.any() for k, v in lora.items() if "lora_B" in k)  # the base exactly
    assert [k for k in tensors if "score" in k] == ["base_model.model.score.weight"]
    last = events[-1]
    assert last.step == 8 and last.HasField("heldout_loss") and not last.HasField("heldout_accuracy")
    assert not last.class_f1 and all(e.tokens_per_second > 0 for e in events)
    info = read_head(Path(result.adapter_path))
    assert info is not None and (info.task, info.classes, info.lora_rank) == ("regression", (), 0)


def test_a_head_job_on_data_it_cannot_learn_fails_naming_the_column(tmp_path: Path, tiny_model: str) -> None:
    rows = [{"text": f"t{i}", "label": "same"} for i in range(8)]
    job = _job(tmp_path, tiny_model, write_jsonl(tmp_path / "data" / "one.jsonl", rows))
    result = run_job(job, local_deps([]))
    assert result.status == "failed" and "head.dataset" in result.error and "one class only" in result.error
