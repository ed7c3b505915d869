"""The policy-lag ratio of asynchronous steps computed from the training forward (engine.py,
`trainer_class(correct_lag=True)`) instead of TRL's extra no-grad pass: on one fixed batch whose
sampling logprobs differ from the policy's, the per-token ratio, TRL's metrics of it, the loss and
the adapter's gradients equal TRL's own path's, with one policy forward instead of two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

ROWS = 8  # 2 prompts x 4 samples
RATIO_METRICS = ["sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                 "sampling/importance_sampling_ratio/max", "sampling/sampling_logp_difference/mean",
                 "sampling/sampling_logp_difference/max"]


def _trainer(tmp_path: Path, tiny_model: str, loss_type: str) -> Any:
    import torch
    from datasets import Dataset

    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.engine import grpo_args
    from rlvr.services.trainer.job.grpo_trainer import trainer_class
    from rlvr.services.trainer.job.runner import load_policy

    job = job_config(job_id="lag", base_model=tiny_model, artifact_root=tmp_path, group_size=4, batch_size=ROWS,
                     max_completion_tokens=12, lora_rank=4, lora_alpha=16, loss_type=loss_type, kl_beta=0.05,
                     max_async_steps=1, synthetic_prompts=2)
    model, tokenizer = load_policy(job, tiny_model, "cpu")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a trained-looking adapter (B != 0), so A has gradients too
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    vocab = model.config.vocab_size
    prompt_ids = [torch.randint(3, vocab, (5 + i % 2,), generator=gen).tolist() for i in range(ROWS)]
    completion_ids = [torch.randint(3, vocab, (4 + i,), generator=gen).tolist() for i in range(ROWS)]
    # Sampling logprobs far from the policy's either way (ratios from ~0 to past the cap of 3), one
    # token vLLM could not score (None: a ratio of 1 in TRL).
    logprobs: list[list[float | None]] = [(-torch.rand(len(c), generator=gen) * 12).tolist() for c in completion_ids]
    logprobs[2][1] = None

    def rollout(prompts: list[str], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [float(i % 3) for i in range(len(completions))]

    trainer = trainer_class(correct_lag=True)(
        model=model, reward_funcs=reward, args=grpo_args(job, 1, tmp_path / "trl", use_cpu=True),
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}), processing_class=tokenizer, rollout_func=rollout)
    return trainer


def _step(trainer: Any) -> tuple[Any, Any, dict[str, Any], dict[str, float], int]:
    """One batch through TRL's generation and loss: (ratio, loss, adapter grads, metrics, forwards)."""
    forwards = 0
    inner = trainer._get_per_token_logps_and_entropies

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal forwards
        forwards += 1
        return inner(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    trainer._metrics["train"].clear()
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' training loop
    trainer.model.train()
    trainer.model.zero_grad()
    try:
        with trainer.compute_loss_context_manager():
            inputs = trainer._generate_and_score_completions([{"prompt": p} for p in ["a"] * 4 + ["b"] * 4])
            generated_with_ratio = "importance_sampling_ratio" in inputs
            loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    assert generated_with_ratio == (not trainer.deferred_ratio)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = {k: trainer._metrics["train"][k][-1] for k in RATIO_METRICS}
    return inputs["importance_sampling_ratio"], loss.detach(), grads, metrics, forwards


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_the_deferred_lag_ratio_equals_trls_extra_pass(tmp_path: Path, tiny_model: str, loss_type: str) -> None:
    import torch

    trainer = _trainer(tmp_path, tiny_model, loss_type)
    assert trainer.deferred_ratio  # num_iterations 1, one generation per optimizer step: grpo_trainer.can_defer_ratio
    deferred = _step(trainer)
    trainer.deferred_ratio = False  # TRL's own path: its no-grad pass for the old logprobs
    trl = _step(trainer)

    (ratio, loss, grads, metrics, forwards), (trl_ratio, trl_loss, trl_grads, trl_metrics, trl_forwards) = deferred, trl
    assert (forwards, trl_forwards) == (2, 3)  # the KL reference's and the loss's; TRL's old-logprob pass too
    assert ratio.shape == trl_ratio.shape == (ROWS, 11)
    # The batch exercises the truncation and the unscored token: ratios below 1, capped at 3, and a 1.
    assert trl_ratio.max() == 3.0 and trl_ratio.min() < 0.5 and trl_ratio[2, 1] == 1.0
    # Tolerances: the two paths' forwards are the same computation on the same rows (measured equal
    # to the bit on this CPU); 1e-6 relative leaves room for a kernel that is not batch-invariant.
    torch.testing.assert_close(ratio, trl_ratio, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(loss, trl_loss, rtol=1e-6, atol=1e-7)
    assert grads.keys() == trl_grads.keys() and any("lora_A" in n for n in grads)
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grad, trl_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    assert metrics == pytest.approx(trl_metrics, rel=1e-6), (metrics, trl_metrics)
    assert trl_metrics["sampling/importance_sampling_ratio/max"] == 3.0


def test_the_ratio_is_deferred_only_when_exact() -> None:
    """TRL's own pass stays wherever the old logprobs could come from an earlier policy (a generation
    trained on over several optimizer steps) or the mode is not token_truncate."""
    from types import SimpleNamespace

    from rlvr.services.trainer.job.grpo_trainer import can_defer_ratio

    def args(**changes: Any) -> Any:
        base = dict(vllm_importance_sampling_mode="token_truncate", num_iterations=1, steps_per_generation=1,
                    gradient_accumulation_steps=1)
        return SimpleNamespace(**(base | changes))

    assert can_defer_ratio(args())
    assert can_defer_ratio(args(steps_per_generation=2, gradient_accumulation_steps=4))
    assert not can_defer_ratio(args(num_iterations=2))
    assert not can_defer_ratio(args(steps_per_generation=2))  # one generation over 2 optimizer steps
    assert not can_defer_ratio(args(vllm_importance_sampling_mode="sequence_mask"))
