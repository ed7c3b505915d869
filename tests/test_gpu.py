"""What a CUDA host runs, on a CUDA host: marked `gpu` (pyproject's addopts leave them out of every
default run, `make test` included) and skipped where torch sees no CUDA device or the installed vLLM
is the CPU build. Run them with `pytest -m gpu tests/test_gpu.py` (bench/gpu_check.py times the same
paths on a 0.5B model).

- the rollout server's dtype auto is bfloat16 on the device, and a bf16 job through it trains with
  no correction and a small sampler/trainer gap, while an fp32 job through it is corrected;
- a colocate job's engine runs in the job's precision on the GPU;
- a 4-bit QLoRA job trains the nf4 base on the GPU and is corrected against the unquantized sampler;
- a job of two training processes joins an NCCL group (only where two CUDA devices exist).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("one_thread")]

# A bf16 sampler against a bf16 trainer: the same weights, different kernels (vLLM's and torch's).
BF16_GAP_BOUND = 0.05


def _cuda_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from vllm.platforms import current_platform
    except Exception as e:  # noqa: BLE001
        return f"vLLM does not import: {e}"
    return "the installed vLLM is the CPU build" if current_platform.is_cpu() else None


if (_problem := _cuda_problem()) is not None:
    pytestmark.append(pytest.mark.skip(reason=f"needs a CUDA GPU and CUDA vLLM: {_problem}"))


@pytest.fixture(scope="module")
def cuda_rollout(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[tuple[Any, str]]:
    """A rollout server (vLLM, dtype auto, eager) on the GPU serving the "test" tiny model."""
    from test_bootstrap import _free_port, _wait_serving

    from rlvr.clients.sdk import RolloutClient

    model = tiny_model
    port = _free_port()
    log = tmp_path_factory.mktemp("log") / "rollout.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", model,
             "--backend", "vllm", "--max-lora-rank", "16", "--max-model-len", "512", "--memory-fraction", "0.2",
             "--enforce-eager", "true", "--adapter-root", str(tmp_path_factory.mktemp("adapters"))],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_serving(f"127.0.0.1:{port}", timeout=600)
    except TimeoutError:
        proc.kill()
        pytest.fail(f"rollout did not start:\n{log.read_text()[-3000:]}")
    client = RolloutClient(f"127.0.0.1:{port}")
    yield client, model
    client.close()
    proc.terminate()
    proc.wait(timeout=120)


def _run(tmp_path: Path, model: str, address: str | None = None, **overrides: Any) -> tuple[Any, list[Any]]:
    from test_trainer_job import _job, _scorer

    from rlvr.services.trainer.job.rollouts import ServiceGenerator
    from rlvr.services.trainer.job.runner import JobDeps, run_job

    events: list[Any] = []
    generator = ServiceGenerator(address) if address else None
    try:
        job = _job(tmp_path, model, gpu_selection="0", max_steps=2, **overrides)
        result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, generator=generator,
                                      colocate_enforce_eager=True))
    finally:
        if generator is not None:
            generator.close()
    return result, events


def test_the_rollout_server_runs_bf16_on_the_gpu(cuda_rollout: tuple[Any, str]) -> None:
    import torch

    client, _ = cuda_rollout
    info = client.get_info()
    expected = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert (info.dtype, info.device) == (expected, "cuda")


def test_a_bf16_job_through_the_gpu_server_samples_its_own_precision(
    tmp_path: Path, cuda_rollout: tuple[Any, str]
) -> None:
    client, model = cuda_rollout
    result, events = _run(tmp_path / "bf16", model, client.address, generation_backend="vllm", precision="bf16")
    assert result.status == "completed", result.error
    assert [e.sampler_correction for e in events] == ["", ""]
    assert all(e.HasField("logprob_gap") and e.logprob_gap < BF16_GAP_BOUND for e in events), events
    result, events = _run(tmp_path / "fp32", model, client.address, generation_backend="vllm", precision="fp32",
                          job_id="fp32")
    assert result.status == "completed", result.error
    assert [e.sampler_correction for e in events] == ["precision", "precision"]


def test_a_colocate_job_runs_its_engine_in_the_jobs_precision_on_the_gpu(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_trainer_colocate import _capture_colocated

    captured = _capture_colocated(monkeypatch)
    try:
        result, events = _run(tmp_path, tiny_model, generation_backend="vllm_colocate", precision="bf16",
                              gpu_memory_fraction=0.2)
        assert result.status == "completed", result.error
        assert captured["generator"].dtype == "bfloat16" and not captured["generator"].on_cpu
        assert [e.sampler_correction for e in events] == ["", ""]
        assert all(e.logprob_gap < BF16_GAP_BOUND for e in events)
    finally:
        if "close" in captured:
            captured["close"]()


def test_a_qlora_job_trains_the_nf4_base_on_the_gpu_and_is_corrected(
    tmp_path: Path, cuda_rollout: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import bitsandbytes as bnb
    import torch
    from test_trainer_job import _capture_policy

    client, model = cuda_rollout
    captured = _capture_policy(monkeypatch)
    result, events = _run(tmp_path, model, client.address, generation_backend="vllm", precision="bf16",
                          quantization="4bit", job_id="qlora")
    assert result.status == "completed", result.error
    bases = [m for n, m in captured["model"].named_modules() if n.endswith(".base_layer")]
    assert bases and all(type(m) is bnb.nn.Linear4bit and m.weight.dtype == torch.uint8 for m in bases)
    assert all(m.weight.device.type == "cuda" for m in bases)
    assert [e.sampler_correction for e in events] == ["quantization", "quantization"]


@pytest.mark.skipif(_problem is None and __import__("torch").cuda.device_count() < 2,
                    reason="a job of two processes over NCCL needs two CUDA devices")
async def test_a_two_process_job_trains_over_nccl(nats_server, tmp_path: Path) -> None:
    import asyncio

    from fixtures_infra import connected_bus
    from fixtures_trainer import job_events
    from test_trainer_multiproc import MODEL, _idle, _request, _settings

    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.v1 import common_pb2 as C

    supervisor = JobSupervisor(_settings(tmp_path, nats_server.url))
    job_id = f"nccl-{time.monotonic_ns()}"
    request = _request(job_id, MODEL, processes=2)
    request.spec.advanced.gpu_selection = "0,1"
    async with connected_bus(nats_server.url) as bus:
        await supervisor.start(request)
        metrics, statuses = await job_events(bus, job_id, timeout_s=600)
    await asyncio.wait_for(_idle(supervisor), 60)
    job_log = (tmp_path / "artifacts" / "jobs" / job_id / "job.log").read_text()
    assert statuses[-1].status == C.JOB_STATUS_COMPLETED, f"{statuses[-1].message}\n{job_log[-3000:]}"
    assert "[rank 1]" in job_log  # two processes, on cuda:0 and cuda:1: an NCCL group (distributed.py)
    assert [m.step for m in metrics] == [1, 2, 3]
    await supervisor.close()
