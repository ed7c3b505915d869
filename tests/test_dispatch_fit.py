"""`fit(spec, capabilities)` (services/scheduler/fit.py), the pure check of whether a trainer worker
can run a job, branch by branch, and `queue_reason`, the line a queued job carries."""

from __future__ import annotations

import pytest

from rlvr.services.scheduler.fit import fit, queue_reason
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T

TINY = ["rlvr-tiny", "rlvr-tiny-test", "rlvr-tiny-small"]


def cpu_worker(cores: int = 2, *, bnb: bool = False, vllm: bool = False, cached: tuple[str, ...] = (),
               offline: bool = False) -> T.WorkerCapabilities:
    return T.WorkerCapabilities(device_kind="cpu", cpu_cores=cores, memory_bytes=16 << 30,
                                precisions=["fp32", "bf16"],
                                quantizations=["full", "4bit", "8bit"] if bnb else ["full"], vllm_colocate=vllm,
                                max_num_processes=cores, cached_models=[*TINY, *cached],
                                model_roots=["/srv/models"], hub_offline=offline)


def gpu_worker(n: int, *, bf16: bool = True, name: str = "NVIDIA H200") -> T.WorkerCapabilities:
    caps = cpu_worker(16, bnb=True, vllm=True)
    caps.device_kind, caps.max_num_processes = "cuda", n
    caps.gpus.extend(T.GpuDevice(index=i, name=name, memory_bytes=80 << 30, bf16=bf16) for i in range(n))
    del caps.precisions[:]
    caps.precisions.extend(["fp32", "fp16"] + (["bf16"] if bf16 else []))
    return caps


def spec(**advanced: object) -> C.JobSpec:
    s = C.JobSpec(base_model=str(advanced.pop("base_model", "rlvr-tiny")))
    for key, value in advanced.items():
        setattr(s.advanced, key, value)
    return s


def test_no_capabilities_fits_anything() -> None:
    """A trainer that does not report its capabilities (older than the field) is not refused."""
    assert fit(spec(gpu_selection="0,1", num_processes=2, precision="fp16"), None, "w0") is None


def test_a_default_job_fits_a_cpu_worker_and_a_gpu_worker() -> None:
    assert fit(C.JobSpec(), cpu_worker(1), "w0") is None
    assert fit(spec(gpu_selection="auto", precision="bf16"), gpu_worker(1), "w0") is None


@pytest.mark.parametrize(("job", "caps", "reason"), [
    (spec(gpu_selection="0,1", num_processes=2), cpu_worker(),
     "needs 2 GPU(s) (gpu_selection 0,1), worker w1 has 0"),
    (spec(gpu_selection="0,3", num_processes=2), gpu_worker(2),
     "needs 2 GPU(s) (gpu_selection 0,3), worker w1 has 2 (0,1)"),
    (spec(gpu_selection="auto", num_processes=4), gpu_worker(2),
     "needs 4 GPUs (gpu_selection auto, num_processes 4), worker w1 has 2 (0,1)"),
    (spec(gpu_selection="auto", num_processes=4), cpu_worker(2),
     "needs 4 training processes on the CPU (num_processes 4), worker w1 has 2 core(s)"),
    (spec(gpu_selection="cpu", num_processes=3), gpu_worker(4),  # 16 cores there: fits
     None),
])
def test_devices_and_processes(job: C.JobSpec, caps: T.WorkerCapabilities, reason: str | None) -> None:
    assert fit(job, caps, "w1") == reason


def test_precision_on_the_device_the_job_would_train_on() -> None:
    assert fit(spec(precision="fp16"), cpu_worker(), "w1") == "precision fp16 needs a CUDA device; worker w1 has none"
    assert fit(spec(precision="fp16", gpu_selection="cpu"), gpu_worker(1), "w1") == \
        "precision fp16 needs a CUDA device; it trains on the CPU (gpu_selection cpu)"
    assert fit(spec(precision="fp16"), gpu_worker(1), "w1") is None
    assert fit(spec(precision="bf16"), cpu_worker(), "w1") is None  # a CPU trains in bf16
    assert fit(spec(precision="bf16"), gpu_worker(2, bf16=False, name="Tesla V100"), "w1") == \
        "precision bf16 is not supported by GPU 0 (Tesla V100) of worker w1"
    assert fit(spec(precision="bf16", gpu_selection="cpu"), gpu_worker(2, bf16=False), "w1") is None


def test_quantization_and_colocate() -> None:
    assert fit(spec(quantization=C.QUANTIZATION_4BIT), cpu_worker(), "w1") == \
        "quantization 4-bit QLoRA is not supported on worker w1 (it has: full; bitsandbytes is not installed there)"
    assert fit(spec(quantization=C.QUANTIZATION_8BIT), cpu_worker(bnb=True), "w1") is None
    colocate = spec(generation_backend=C.GENERATION_BACKEND_VLLM_COLOCATE)
    assert fit(colocate, cpu_worker(), "w1") == \
        "generation backend vLLM (colocate) needs vLLM in the job's process; worker w1 has no vllm"
    assert fit(colocate, cpu_worker(vllm=True), "w1") is None


def test_base_model_cached_downloadable_or_missing() -> None:
    hub = "Qwen/Qwen2.5-0.5B-Instruct"
    assert fit(spec(base_model=hub), cpu_worker(), "w1") is None  # online: it downloads it at start
    assert fit(spec(base_model=hub), cpu_worker(offline=True), "w1") == \
        "base model Qwen/Qwen2.5-0.5B-Instruct is not cached on worker w1 and it cannot download it (offline)"
    assert fit(spec(base_model=hub), cpu_worker(offline=True, cached=(hub,)), "w1") is None
    assert fit(spec(base_model="rlvr-tiny-small"), cpu_worker(offline=True), "w1") is None  # bundled
    bare = cpu_worker()
    del bare.cached_models[:]
    assert fit(spec(base_model="rlvr-tiny"), bare, "w1") == "base model rlvr-tiny (bundled) is not offered by worker w1"
    # A folder under the worker's model roots: there only if the worker lists it.
    assert fit(spec(base_model="/srv/models/mine"), cpu_worker(cached=("/srv/models/mine",)), "w1") is None
    assert fit(spec(base_model="/srv/models/mine/"), cpu_worker(cached=("/srv/models/mine",)), "w1") is None
    assert fit(spec(base_model="/srv/models/mine"), cpu_worker(), "w1") == \
        "base model /srv/models/mine is not on worker w1 (not among its models under /srv/models)"
    # Outside every root it reports, the worker cannot say: not refused (the load decides).
    assert fit(spec(base_model="/elsewhere/model"), cpu_worker(), "w1") is None


def test_queue_reason_says_busy_none_fits_or_none_answers() -> None:
    assert queue_reason({"a:1": None, "b:1": "needs 2 GPUs"}, 2) == \
        "waiting for a free worker: 1 of 2 reachable can run it, and all are busy"
    assert queue_reason({"a:1": "needs 2 GPUs, worker a has 0", "b:1": "needs 2 GPUs, worker a has 0",
                         "c:1": "precision fp16 needs a CUDA device; worker c has none"}, 3) == \
        "no trainer worker can run it: needs 2 GPUs, worker a has 0; precision fp16 needs a CUDA device; worker c has none"
    assert queue_reason({}, 2) == "no trainer worker answers (0 of 2 reachable)"
    assert queue_reason({}, 0) == "no trainer worker is configured"
