"""Which jobs sample from another policy than they train, and what the rollout dtype setting picks.

The job-level behaviour (the gap measured on every step, the correction applied and named) is in
tests/test_trainer_job.py; the engines' dtype on a real server in tests/test_rollout_service.py."""

from __future__ import annotations

import pytest

from rlvr.services.rollout.server import resolve_dtype
from rlvr.services.rollout.settings import RolloutSettings
from rlvr.services.trainer.job.quantization import sampler_corrections
from rlvr.services.trainer.job.step_record import StepRecord, metric_event


@pytest.mark.parametrize(("job", "dtypes", "expected"), [
    # (max_async_steps, precision, quantization, backend), the sampler dtypes, the reasons
    ((0, "fp32", "full", "vllm"), ["float32"], ()),
    ((0, "fp32", "full", "vllm"), [""], ()),  # a server older than GetInfo.dtype ran float32
    ((0, "bf16", "full", "vllm"), ["bfloat16"], ()),
    ((0, "fp32", "full", "vllm"), ["bfloat16"], ("precision",)),  # the GPU default: bf16 server, fp32 job
    ((0, "bf16", "full", "vllm"), ["bfloat16", "float32"], ("precision",)),  # one replica of another dtype
    ((1, "fp32", "4bit", "vllm"), ["bfloat16"], ("policy_lag", "precision", "quantization")),
    ((0, "fp32", "8bit", "vllm_colocate"), ["float32"], ("quantization",)),
    ((0, "bf16", "4bit", "transformers"), [], ()),  # samples from the very policy it trains
])
def test_every_reason_the_sampler_is_not_the_policy_trained(job: tuple, dtypes: list[str],
                                                            expected: tuple[str, ...]) -> None:
    assert sampler_corrections(*job, dtypes) == expected


def test_the_rollout_dtype_setting_resolves_auto_and_keeps_an_explicit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert RolloutSettings().dtype == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto") == ("float32", "cpu")
    assert resolve_dtype("bfloat16") == ("bfloat16", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto") == ("bfloat16", "cuda")
    assert resolve_dtype("auto", backend="transformers") == ("float32", "cpu")  # in-process, on the CPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # before Ampere
    assert resolve_dtype("auto") == ("float16", "cuda")
    assert resolve_dtype("float32") == ("float32", "cuda")
    with pytest.raises(ValueError, match="dtype: 'int4' is not one of auto"):
        resolve_dtype("int4")


def test_the_step_event_carries_trls_gap_metrics() -> None:
    logs = {"loss": 0.5, "sampling/sampling_logp_difference/mean": 0.03,
            "sampling/sampling_logp_difference/max": 1.2}
    event = metric_event("j", 4, StepRecord(step=1), logs, kl_computed=False)
    assert event.logprob_gap == pytest.approx(0.03) and event.logprob_gap_max == pytest.approx(1.2)
    assert not metric_event("j", 4, StepRecord(step=1), {"loss": 0.5}, kl_computed=False).HasField("logprob_gap")


def test_a_reshaped_sampler_is_corrected_on_the_vllm_backends_only() -> None:
    """top_p, top_k, min_p or a repetition penalty draw from another distribution than the tempered
    policy TRL's loss scores; vLLM reports the drawn one's logprobs (processed_logprobs), so the vLLM
    backends correct against them, and the transformers backend, which reports none, cannot."""
    for backend in ("vllm", "vllm_colocate"):
        assert sampler_corrections(0, "fp32", "full", backend, ["float32"], reshaped=True) == ("sampling",)
    assert sampler_corrections(1, "fp32", "full", "vllm", ["bfloat16"], True) == ("policy_lag", "precision", "sampling")
    assert sampler_corrections(0, "fp32", "full", "transformers", [], reshaped=True) == ()


def test_the_jobs_sampling_controls_reach_its_sampling_and_trls_config(tmp_path) -> None:  # noqa: ANN001
    from rlvr.jobspec import reshaped_sampling
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.engine import grpo_args

    plain = job_config("plain", "rlvr-tiny", tmp_path)
    assert reshaped_sampling(plain) == []
    assert (plain.top_p, plain.top_k, plain.min_p, plain.repetition_penalty) == (1.0, 0, 0.0, 1.0)
    job = job_config("shaped", "rlvr-tiny", tmp_path, top_p=0.9, top_k=5, min_p=0.05, repetition_penalty=1.1)
    assert reshaped_sampling(job) == ["top_p 0.9", "top_k 5", "min_p 0.05", "repetition_penalty 1.1"]
    sampling = job.sampling(max_tokens=64, seed=3, group_size=4)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.repetition_penalty,
            sampling.max_tokens, sampling.seed, sampling.group_size) == (1.0, 0.9, 5, 0.05, 1.1, 64, 3, 4)
    args = grpo_args(job, 10, tmp_path / "trl", use_cpu=True)
    assert (args.top_p, args.top_k, args.min_p, args.repetition_penalty) == (0.9, 5, 0.05, 1.1)
    assert grpo_args(plain, 10, tmp_path / "trl", use_cpu=True).min_p is None  # TRL's own "off"
