"""advanced.precision: mixed precision where the job's device supports it, refused clearly where it
does not (fp16 training needs CUDA: torch's CPU autocast has no fp16 training)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from test_trainer_job import _capture_policy

from rlvr.common.errors import FailedPrecondition
from rlvr.services.trainer.config import job_config
from rlvr.services.trainer.quantization import check_precision
from rlvr.services.trainer.runner import JobDeps, run_job
from rlvr.services.trainer.scorers import LocalScorer, ScoreSettings

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
