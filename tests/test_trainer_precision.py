"""advanced.precision: mixed precision where the job's device supports it, refused clearly where it
does not (fp16 training needs CUDA: torch's CPU autocast has no fp16 training)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from test_trainer_job import _capture_policy

from rlvr.common.errors import FailedPrecondition
from rlvr.services.trainer.job.config import job_config
from rlvr.services.trainer.job.quantization import check_precision
from rlvr.services.trainer.job.runner import JobDeps, run_job
from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py


def test_fp16_on_a_cpu_is_refused_naming_the_field() -> None:
    with pytest.raises(FailedPrecondition, match=r"advanced.precision: fp16 needs a CUDA device.*use bf16 or fp32"):
        check_precision("fp16", "cpu")
    check_precision("bf16", "cpu")  # torch trains in bf16 on a CPU
    check_precision("fp32", "cpu")


def test_a_fp16_job_on_a_cpu_fails_before_loading_anything(tmp_path: Path, tiny_model: str) -> None:
    job = job_config("fp16", tiny_model, tmp_path, precision="fp16", gpu_selection="cpu",
                     generation_backend="transformers", max_steps=1)
    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=lambda _e: None))
    assert result.status == "failed" and result.error.startswith("advanced.precision: fp16 needs a CUDA device")


def test_a_bf16_job_trains_on_the_cpu(tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors.torch import load_file

    captured = _capture_policy(monkeypatch)
    events: list[Any] = []
    job = job_config("bf16", tiny_model, tmp_path, precision="bf16", generation_backend="transformers",
                     group_size=4, batch_size=8, max_completion_tokens=32, lora_rank=4, max_steps=2,
                     synthetic_prompts=16, loss_type="dapo")
    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append))
    assert result.status == "completed", result.error
    assert [e.step for e in events] == [1, 2] and all(math.isfinite(e.loss) for e in events)
    dtypes = {n: p.dtype for n, p in captured["model"].named_parameters()}
    # The frozen base in bf16, the trained LoRA weights in fp32 (peft's autocast_adapter_dtype).
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    saved = load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))
    assert saved and all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in saved.values())


def test_auto_precision_follows_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """advanced.precision "auto" (the default): bf16 on a CUDA device that supports it, so a default GPU
    job trains in what vLLM serves a bf16 model in; fp32 on a CPU and on an older CUDA device."""
    import torch

    from rlvr.services.trainer.job.quantization import effective_precision

    assert effective_precision("auto", "cpu") == "fp32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert effective_precision("auto", "cuda") == effective_precision("auto", "cuda:1") == "bf16"
    assert effective_precision("fp32", "cuda") == "fp32" and effective_precision("fp16", "cpu") == "fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert effective_precision("auto", "cuda") == "fp32"
    check_precision("auto", "cpu")


def test_gradient_checkpointing_is_on_in_the_policy_the_job_trains_when_asked(tmp_path: Path, tiny_model: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """advanced.gradient_checkpointing "on": TRL checkpoints the policy it trains (which then still
    learns); "off" does not; "auto" is off on a CPU and for a small model, on for a 1B one on a GPU.
    (The two runs' adapters differ: the in-process sampler generates without a KV cache once the policy
    checkpoints, so its rollouts differ in the last bits, and so do the updates.)"""
    import torch
    from test_trainer_job import _job, _lora_state, _scorer

    from rlvr.services.trainer.job.engine import checkpointing_on, grpo_args

    for mode in ("off", "on"):
        captured = _capture_policy(monkeypatch)
        job = _job(tmp_path / mode, tiny_model, max_steps=1, gradient_checkpointing=mode)
        result = run_job(job, JobDeps(scorer=_scorer(), publish=lambda _e: None))
        assert result.status == "completed", result.error
        model = captured["model"]
        assert model.base_model.model.is_gradient_checkpointing == (mode == "on")
        after = _lora_state(model)
        assert any(not torch.equal(after[k], v) for k, v in captured["initial_lora"].items()), mode
        assert grpo_args(job, 2, tmp_path, use_cpu=True).gradient_checkpointing == (mode == "on")
    auto = _job(tmp_path, tiny_model, gradient_checkpointing="auto")
    assert not checkpointing_on(auto, 2_000_000_000, use_cpu=True)
    assert not checkpointing_on(auto, 500_000_000, use_cpu=False)
    assert checkpointing_on(auto, 1_000_000_000, use_cpu=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_merge_is_written_in_the_base_models_dtype(tmp_path: Path, tiny_model: str, dtype: str) -> None:
    """MergeModel writes base + adapter in the base's own dtype: a bf16 checkpoint merges to bf16 (half
    the bytes, what vLLM serves it in), an fp32 one to fp32."""
    import json

    import torch
    from safetensors import safe_open
    from test_stacking import random_lora
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.services.trainer.job.merge import merge_adapter

    base = tmp_path / "base"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=getattr(torch, dtype)).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(base)
    adapter = random_lora(base, tmp_path / "lora", seed=3, r=4, lora_alpha=8)
    merge_adapter(str(base), adapter, tmp_path / "merged", lambda *_: None)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == dtype
    with safe_open(str(tmp_path / "merged" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {getattr(torch, dtype)}  # noqa: SIM118
