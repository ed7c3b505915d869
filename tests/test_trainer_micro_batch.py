"""The loss trained in micro-batches (engine.py `micro_batch_size`): a step's update is the one of its
whole batch up to float rounding, for each loss type whose normalisation TRL spreads over gradient
accumulation, with one MetricEvent per optimizer step; and the automatic rule's choices."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_trainer_job import _capture_policy, _job, _lora_state, _scorer

from rlvr.services.trainer.job.config import job_config
from rlvr.services.trainer.job.engine import MICRO_BATCH_BUDGET, micro_batch_size, token_bytes
from rlvr.services.trainer.job.runner import JobDeps, run_job
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

# SmolLM2-135M's shape (config.json): the issue-43 model
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152)
# bundled tiny models' shapes (rlvr/tiny/model.py, their config.json): the test size, and the default size
# the demo recipe and the learning measurements train (rlvr-tiny-headroom)
TINY_TEST = SimpleNamespace(num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=320)
TINY_DEFAULT = SimpleNamespace(num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=640)


def _step_one(tmp_path: Path, model: str, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> tuple[
        dict[str, Any], dict[str, Any], list[C.MetricEvent], list[int]]:
    """(LoRA before, LoRA after step 1, the job's MetricEvents, the micro-batch sizes TRL trained with)
    of a two-step job."""
    captured = _capture_policy(monkeypatch)
    from trl import GRPOTrainer

    micro: list[int] = []
    compute_loss = GRPOTrainer._compute_loss

    def spy(self: Any, model_: Any, inputs: dict[str, Any]) -> Any:
        micro.append(int(inputs["completion_ids"].shape[0]))
        return compute_loss(self, model_, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)

    def on_step(step: int, _total: int) -> None:
        if step == 1:
            captured["after"] = _lora_state(captured["model"])

    events: list[C.MetricEvent] = []
    job = _job(tmp_path, model, max_steps=2, **overrides)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, on_step=on_step))
    assert result.status == "completed", result.error
    return captured["initial_lora"], captured["after"], events, micro


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batches_give_the_whole_batch_update(tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch,
                                                   loss_type: str) -> None:
    import torch

    before, whole, events, micro = _step_one(tmp_path / "whole", tiny_model, monkeypatch, loss_type=loss_type)
    assert micro == [8, 8]  # the tiny model's batch fits: one micro-batch a step, as before micro-batching
    assert [e.step for e in events] == [1, 2]
    before2, split, split_events, micro2 = _step_one(tmp_path / "split", tiny_model, monkeypatch, loss_type=loss_type,
                                                     micro_batch_size=2)
    assert micro2 == [2] * 8  # four micro-batches a step
    # one MetricEvent per optimizer step, of the whole batch
    assert [e.step for e in split_events] == [1, 2]
    assert all(k in before2 and torch.equal(before2[k], v) for k, v in before.items())
    moved = [k for k in whole if not torch.equal(whole[k], before[k])]
    assert moved, "the step did not move the adapter"
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-6)
    first, first_split = events[0], split_events[0]
    # the same completions were trained on: the step's rollout metrics are the same ...
    assert (first_split.reward_mean, first_split.completion_length_mean) == (first.reward_mean,
                                                                             first.completion_length_mean)
    # ... and the loss TRL logs is the whole batch's (the micro-batches' parts add up to it)
    assert first_split.loss == pytest.approx(first.loss, rel=1e-4, abs=1e-6)
    assert first_split.entropy == pytest.approx(first.entropy, rel=1e-4)


def test_micro_batch_rule(tmp_path: Path) -> None:
    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=8, batch_size=32)
    # SmolLM2-135M, the issue-43 step (batch 32, 74 prompt + 32 completion tokens): the loss's forward
    # of the whole batch peaked near 11 GiB; the rule trains it in micro-batches that fit the budget.
    per_token = token_bytes(SMOLLM2)
    assert per_token == 4 * (14 * 30 * (576 + 1536) + 49152)  # ~3.6 MiB
    chosen = micro_batch_size(job, SMOLLM2, row_tokens=106)
    assert 32 % chosen == 0 and chosen * 106 * per_token <= MICRO_BATCH_BUDGET < 2 * chosen * 106 * per_token
    assert chosen == 4
    # a longer row: fewer completions per micro-batch, one at least
    assert micro_batch_size(job, SMOLLM2, row_tokens=74 + 128) == 2  # issue 43's target
    assert micro_batch_size(job, SMOLLM2, row_tokens=100_000) == 1
    # a divisor of the process's share: 32 / 2 processes = 16 each
    assert micro_batch_size(job, SMOLLM2, row_tokens=106, processes=2) == 4
    assert micro_batch_size(job, SMOLLM2, row_tokens=106, budget=6 * 106 * per_token) == 4  # 6 does not divide 32
    assert micro_batch_size(job, SMOLLM2, row_tokens=106, processes=4, budget=16 * 106 * per_token) == 8  # the share
    # the bundled tiny models train their batch at once, the trainer's behaviour before micro-batching: the
    # test model at the longest completions (2,048), the default size at the demo recipe's (64 tokens) and
    # at an environment job's default episode (4 turns x 64), each with a prompt of up to 64
    assert micro_batch_size(job, TINY_TEST, row_tokens=2048 + 64) == 32
    assert micro_batch_size(job, TINY_DEFAULT, row_tokens=64 + 64) == 32
    assert micro_batch_size(job, TINY_DEFAULT, row_tokens=4 * 64 + 64) == 32
    # the job's own setting wins
    from dataclasses import replace

    assert micro_batch_size(replace(job, micro_batch_size=8), SMOLLM2, row_tokens=106) == 8


def test_grpo_args_accumulate_over_micro_batches(tmp_path: Path) -> None:
    from rlvr.services.trainer.job.engine import grpo_args
    from rlvr.services.trainer.job.grpo_trainer import can_defer_ratio, trained_at_once

    job = job_config(job_id="x", base_model="m", artifact_root=tmp_path, group_size=8, batch_size=32,
                     max_async_steps=1)
    whole = grpo_args(job, total_steps=4, output_dir=tmp_path / "trl", use_cpu=True)
    assert (whole.per_device_train_batch_size, whole.gradient_accumulation_steps, whole.steps_per_generation) == (
        32, 1, 1)
    args = grpo_args(job, total_steps=4, output_dir=tmp_path / "trl", use_cpu=True, micro_batch=4)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation) == (4, 8, 8)
    assert args.generation_batch_size == 32  # one generation of the whole batch per optimizer step
    # each generation is still trained on within one optimizer step: the lag ratio from the loss's forward
    assert trained_at_once(args) and can_defer_ratio(args)
    shared = grpo_args(job, total_steps=4, output_dir=tmp_path / "trl", use_cpu=True, processes=2, micro_batch=4)
    assert (shared.per_device_train_batch_size, shared.gradient_accumulation_steps) == (4, 4)
    with pytest.raises(ValueError, match="does not divide"):
        grpo_args(job, total_steps=4, output_dir=tmp_path / "trl", use_cpu=True, micro_batch=5)
