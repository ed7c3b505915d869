"""A Supervised (SFT) job in-process (`run_job` with method "sft") on the "test"-size tiny model,
through TRL's SFTTrainer: the adapter learns the dataset's completions and nothing else moves, every
step is a MetricEvent with the SFT metrics, the held-out loss comes at the eval steps and the last,
the options reach TRL, a cancel keeps the last step's adapter, and a resumed job ends exactly where
an undisturbed one does."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fixtures_trainer import local_deps, write_jsonl

from rlvr.common.errors import FailedPrecondition
from rlvr.services.trainer.job.config import JobConfig, SftSettings, job_config
from rlvr.services.trainer.job.runner import run_job
from rlvr.services.trainer.job.sft import sft_data
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sft" / "math-pairs"



def _pairs(tmp_path: Path, n: int = 32) -> Path:
    """Prompt/completion text rows: one fixed answer per prompt, easy to memorise."""
    return write_jsonl(tmp_path / "data" / "pairs.jsonl",
                  [{"prompt": f"{i % 4} {i % 4} ", "completion": f"{(i % 4) * 2}"} for i in range(n)])


def _job(tmp_path: Path, model: str, dataset: Path, **overrides: Any) -> JobConfig:
    sft = dict(dataset=str(dataset), dataset_split="train", learning_rate=5e-3, epochs=1, max_steps=4, batch_size=4,
               max_seq_length=64, lora_rank=4, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
               completion_only_loss=True, packing=False)
    sft.update(overrides.pop("sft", {}))
    return job_config("s1", model, tmp_path / "artifacts", gpu_selection="cpu", method="sft",
                      data_roots=(dataset.parent, EXAMPLE.parent), sft=SftSettings(**sft), **overrides)



def _adapter(result: Any) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))


def test_sft_trains_the_adapter_on_the_completions(tmp_path: Path, tiny_model: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    events: list[C.MetricEvent] = []
    steps: list[tuple[int, int]] = []
    job = _job(tmp_path, tiny_model, _pairs(tmp_path), sft={"max_steps": 8}, checkpoint_every=4)
    result = run_job(job, local_deps(events, on_step=lambda s, t: steps.append((s, t))))

    assert result.status == "completed", result.error
    assert (result.steps_done, result.total_steps, result.adapter_version) == (8, 8, 8)
    assert steps == [(s, 8) for s in range(1, 9)]  # the adapter saved after every step, then its progress
    assert [e.step for e in events] == list(range(1, 9))
    for e in events:
        assert e.total_steps == 8 and e.loss > 0 and 0 <= e.token_accuracy <= 1 and e.tokens_per_second > 0
        assert not e.HasField("heldout_loss")  # advanced.eval_every is off
    assert events[0].learning_rate > events[-1].learning_rate > 0  # TRL's linear decay from sft.learning_rate
    assert events[0].learning_rate == pytest.approx(5e-3)
    # memorisable pairs: the loss falls
    assert sum(e.loss for e in events[-2:]) < sum(e.loss for e in events[:2])

    # the adapter (and the checkpoint at step 4) load in peft on the base; the base is untouched
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    tuned = PeftModel.from_pretrained(base, result.adapter_path)
    assert any(v.abs().sum() > 0 for k, v in tuned.state_dict().items() if "lora_B" in k)
    assert all(torch.equal(before[k], v) for k, v in tuned.get_base_model().state_dict().items()
               if "lora_" not in k and k in before)
    assert (Path(job.job_dir) / "checkpoints" / "step-4" / "adapter_config.json").is_file()
    config = json.loads((Path(result.adapter_path) / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 16)


def test_the_held_out_loss_at_the_eval_steps_and_the_last(tmp_path: Path, tiny_model: str) -> None:
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, EXAMPLE, sft={"max_steps": 5, "max_seq_length": 128}, eval_every=2)
    result = run_job(job, local_deps(events))
    assert result.status == "completed", result.error
    assert [e.step for e in events if e.HasField("heldout_loss")] == [2, 4, 5]
    assert all(e.heldout_loss > 0 for e in events if e.HasField("heldout_loss"))
    # the folder's test split is the held-out one: the training split is kept whole
    train, heldout = sft_data(job)
    assert (len(train), len(heldout)) == (512, 64)


def test_a_file_without_a_test_split_holds_five_percent_back(tmp_path: Path, tiny_model: str) -> None:
    job = _job(tmp_path, tiny_model, _pairs(tmp_path, 40), eval_every=3)
    train, heldout = sft_data(job)
    assert (len(train), len(heldout)) == (38, 2)
    assert sft_data(job) == (train, heldout)  # seeded


def test_the_options_reach_trl(tmp_path: Path, tiny_model: str) -> None:
    """completion_only_loss, the learning rate and the LoRA card change what TRL trains."""
    data = _pairs(tmp_path)
    runs = {}
    for name, sft in (("default", {}), ("whole_text", {"completion_only_loss": False}), ("lr", {"learning_rate": 1e-4}),
                      ("targets", {"target_modules": "q_proj,v_proj"})):
        events: list[C.MetricEvent] = []
        result = run_job(_job(tmp_path / name, tiny_model, data, sft={"max_steps": 2, **sft}), local_deps(events))
        assert result.status == "completed", result.error
        runs[name] = (events, _adapter(result))
    loss = {name: events[0].loss for name, (events, _) in runs.items()}
    assert loss["whole_text"] != pytest.approx(loss["default"])  # the prompt's tokens count too
    assert runs["lr"][0][0].learning_rate == pytest.approx(1e-4)
    assert set(runs["targets"][1]) < set(runs["default"][1])  # fewer modules adapted
    assert all(".q_proj." in k or ".v_proj." in k for k in runs["targets"][1])


def test_chats_train_on_the_last_assistant_message(tmp_path: Path, tiny_model: str) -> None:
    """The bundled chats: prompt = every message but the last, rendered with the chat template; the
    loss on the answer alone is far below the loss on the whole text (the prompt's four digits are
    unpredictable, the worked answer follows from them)."""
    losses = {}
    for only in (True, False):
        events: list[C.MetricEvent] = []
        result = run_job(_job(tmp_path / str(only), tiny_model, EXAMPLE,
                              sft={"max_steps": 1, "max_seq_length": 128, "completion_only_loss": only}), local_deps(events))
        assert result.status == "completed", result.error
        losses[only] = events[0].loss
    assert losses[True] < losses[False]
    train, _ = sft_data(_job(tmp_path, tiny_model, EXAMPLE))
    assert [m["role"] for m in train[0]["prompt"]] == ["user"] and train[0]["completion"][0]["role"] == "assistant"


@pytest.mark.parametrize(("rows", "expected"), [
    ([{"question": "1", "answer": "2"}],
     "has no 'prompt' and 'completion' or 'messages' column, which method SFT trains on; columns present: "
     "['question', 'answer']"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], "row 0: messages must be a chat of at least two messages"),
])
def test_a_dataset_sft_cannot_train_on_fails_the_job_naming_why(tmp_path: Path, tiny_model: str,
                                                                 rows: list[dict[str, Any]], expected: str) -> None:
    data = write_jsonl(tmp_path / "data" / "bad.jsonl", rows)
    result = run_job(_job(tmp_path, tiny_model, data), local_deps([]))
    assert result.status == "failed"
    assert result.error.startswith("sft.dataset: ") and expected in result.error, result.error
    with pytest.raises(FailedPrecondition):
        sft_data(_job(tmp_path, tiny_model, data))


def test_unknown_target_modules_fail_naming_the_field(tmp_path: Path, tiny_model: str) -> None:
    result = run_job(_job(tmp_path, tiny_model, _pairs(tmp_path), sft={"target_modules": "no_such_proj"}), local_deps([]))
    assert result.status == "failed" and result.error.startswith("sft.target_modules: 'no_such_proj'"), result.error


def test_a_cancel_keeps_the_last_steps_adapter(tmp_path: Path, tiny_model: str) -> None:
    cancel = threading.Event()
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, _pairs(tmp_path), sft={"max_steps": 6}),
                     local_deps(events, cancel=cancel, on_step=lambda s, t: cancel.set() if s == 2 else None))
    assert (result.status, result.steps_done, result.total_steps, result.adapter_version) == ("cancelled", 2, 6, 2)
    assert [e.step for e in events] == [1, 2]
    assert Path(result.adapter_path, "adapter_model.safetensors").is_file()


def test_a_cancel_while_loading_is_a_cancelled_job(tmp_path: Path, tiny_model: str) -> None:
    cancel = threading.Event()
    cancel.set()
    result = run_job(_job(tmp_path, tiny_model, _pairs(tmp_path), sft={"max_steps": 6}), local_deps([], cancel=cancel))
    assert (result.status, result.steps_done, result.total_steps, result.adapter_path) == ("cancelled", 0, 6, "")


def test_the_micro_batch_fits_the_memory_budget(tmp_path: Path, tiny_model: str) -> None:
    from transformers import AutoConfig

    from rlvr.services.trainer.job.engine import token_bytes
    from rlvr.services.trainer.job.sft import sft_micro_batch

    config = AutoConfig.from_pretrained(tiny_model)
    job = _job(tmp_path, tiny_model, _pairs(tmp_path), sft={"batch_size": 12, "max_seq_length": 100})
    row = token_bytes(config) * 100
    assert sft_micro_batch(job, config) == 12  # the tiny model's whole batch fits 2 GiB
    assert sft_micro_batch(job, config, budget=5 * row) == 4  # the largest divisor of 12 that fits
    assert sft_micro_batch(job, config, budget=row // 2) == 1
    from dataclasses import replace

    assert sft_micro_batch(replace(job, micro_batch_size=3), config) == 3


def test_a_resumed_job_ends_exactly_as_an_undisturbed_one(tmp_path: Path, tiny_model: str) -> None:
    """Lost after step 3 (its last checkpoint at step 2), re-dispatched with resume: it goes on from
    TRL's checkpoint (optimizer, scheduler, data order and random state) and publishes only the steps
    the scheduler does not hold; its final adapter is the undisturbed run's, bit for bit."""
    import torch

    data = _pairs(tmp_path)
    whole = run_job(_job(tmp_path / "whole", tiny_model, data, sft={"max_steps": 5}, checkpoint_every=2), local_deps([]))
    assert whole.status == "completed", whole.error

    cancel = threading.Event()
    lost = _job(tmp_path / "lost", tiny_model, data, sft={"max_steps": 5}, checkpoint_every=2)
    first = run_job(lost, local_deps([], cancel=cancel, on_step=lambda s, t: cancel.set() if s == 3 else None))
    assert first.steps_done == 3
    events: list[C.MetricEvent] = []
    steps: list[int] = []
    again = JobConfig.from_json({**lost.to_json(), "resume": True, "stored_steps": 3})
    resumed = run_job(again, local_deps(events, on_step=lambda s, t: steps.append(s)))
    assert resumed.status == "completed", resumed.error
    assert steps == [2, 3, 4, 5]  # the checkpoint's step 2 (its adapter restored first), then on
    assert [e.step for e in events] == [4, 5]  # step 3 is stored already
    expected, got = _adapter(whole), _adapter(resumed)
    assert set(expected) == set(got) and all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_checkpoint_cut_short_is_not_resumed_from(tmp_path: Path, tiny_model: str) -> None:
    """The lost run's newest checkpoint lacks its trainer_state.json (the kill came mid-save): the job
    resumes from the whole one before it, and the cut one is removed."""
    import shutil

    data = _pairs(tmp_path)
    lost = _job(tmp_path, tiny_model, data, sft={"max_steps": 6}, checkpoint_every=2)
    cancel = threading.Event()
    run_job(lost, local_deps([], cancel=cancel, on_step=lambda s, t: cancel.set() if s == 4 else None))
    trl = lost.job_dir / "trl"
    assert sorted(p.name for p in trl.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    (trl / "checkpoint-4" / "trainer_state.json").unlink()
    steps: list[int] = []
    again = JobConfig.from_json({**lost.to_json(), "resume": True, "stored_steps": 4})
    resumed = run_job(again, local_deps([], on_step=lambda s, t: steps.append(s)))
    assert resumed.status == "completed" and steps == [2, 3, 4, 5, 6], (resumed.error, steps)
    assert not (trl / "checkpoint-4").exists() or (trl / "checkpoint-4" / "trainer_state.json").is_file()
    shutil.rmtree(trl)


def test_a_job_lost_after_its_last_checkpoint_completes_with_that_adapter(tmp_path: Path, tiny_model: str) -> None:
    """Lost once its final checkpoint was written (TRL saves one at the last step): the re-dispatched
    job trains nothing and reports the checkpoint's adapter, version and all."""
    import torch

    job = _job(tmp_path, tiny_model, _pairs(tmp_path), sft={"max_steps": 3}, checkpoint_every=2)
    first = run_job(job, local_deps([]))
    assert first.status == "completed" and (job.job_dir / "trl" / "checkpoint-3").is_dir()
    events: list[C.MetricEvent] = []
    again = run_job(JobConfig.from_json({**job.to_json(), "resume": True, "stored_steps": 3}), local_deps(events))
    assert (again.status, again.steps_done, again.total_steps, again.adapter_version) == ("completed", 3, 3, 3)
    assert events == []
    expected, got = _adapter(first), _adapter(again)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
