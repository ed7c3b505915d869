"""The trainer service over real gRPC with a real embedded NATS: each job in its own process.

StartJob -> one MetricEvent per step on rlvr.jobs.<id>.metrics (msg ids "<job>:<step>", so a
republished step is dropped by the stream), RUNNING and COMPLETED on .status; StartJob is
idempotent by job id (the same job again is OK and starts nothing, even while it is being started
and after its first caller went away) and another job while busy is RESOURCE_EXHAUSTED; CancelJob
stops a job within seconds and keeps the adapter of its last finished step; MergeAdapter writes a
loadable Hugging Face checkpoint, and refuses an existing output with ALREADY_EXISTS.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from fixtures_infra import connected_bus
from fixtures_trainer import build_trainer_test_model, job_events

from rlvr.common.client import make_channel
from rlvr.infra.subjects import job_metrics_subject, metric_msg_id
from rlvr.services.common.server import ServiceRunner
from rlvr.services.trainer.server import build_service
from rlvr.services.trainer.settings import TrainerSettings
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T
from rlvr.v1 import trainer_pb2_grpc


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return build_trainer_test_model()  # tests/fixtures_trainer.py: built once, under a lock


def _settings(tmp_path: Path, nats_url: str, job_start: str = "auto") -> TrainerSettings:
    return TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url=nats_url, scorer="local",
                           torch_threads=1, cancel_grace_seconds=5.0, worker_name="trainer-test", job_start=job_start)


def _request(job_id: str, model: str, max_steps: int) -> T.StartJobRequest:
    spec = C.JobSpec(base_model=model)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, max_steps
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=max_steps)


async def test_job_streams_one_metric_event_per_step(nats_server, tmp_path: Path, tiny_model: str) -> None:
    settings = _settings(tmp_path, nats_server.url)
    async with ServiceRunner(build_service(settings), settings) as runner, connected_bus(nats_server.url) as bus:
        channel = make_channel(runner.address, aio=True)
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        job_id = f"svc-{time.monotonic_ns()}"
        response = await stub.StartJob(_request(job_id, tiny_model, max_steps=3))
        assert (response.job_id, response.worker) == (job_id, "trainer-test")

        again = await stub.StartJob(_request(job_id, tiny_model, max_steps=3))  # already running it: OK
        assert (again.job_id, again.worker) == (job_id, "trainer-test")
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await stub.StartJob(_request(job_id + "-b", tiny_model, max_steps=3))
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and job_id in busy.value.details()
        status = await stub.GetWorkerStatus(T.GetWorkerStatusRequest())
        assert status.busy and status.job_id == job_id

        metrics, statuses = await job_events(bus, job_id, timeout_s=120)
        assert [m.step for m in metrics] == [1, 2, 3] and all(m.total_steps == 3 for m in metrics)
        assert all(m.job_id == job_id and m.step_seconds > 0 and m.HasField("entropy") for m in metrics)
        assert [s.status for s in statuses] == [C.JOB_STATUS_RUNNING, C.JOB_STATUS_COMPLETED]
        final = statuses[-1]
        assert (final.adapter.name, final.adapter.version) == (f"job-{job_id}", 3) and final.current_step == 3

        # A republished step is dropped by the stream's duplicate window (Nats-Msg-Id "<job>:<step>").
        ack = await bus.publish(job_metrics_subject(job_id), metrics[0].SerializeToString(), metric_msg_id(job_id, 1))
        assert ack.duplicate
        assert metric_msg_id(job_id, 1) == f"{job_id}:1"

        # The worker notices the exit just after the process published it: within a second on a quiet
        # machine, over 5 s with two test workers beside other jobs on two cores.
        for _ in range(300):
            status = await stub.GetWorkerStatus(T.GetWorkerStatusRequest())
            if not status.busy:
                break
            await asyncio.sleep(0.1)
        assert not status.busy and status.last_job_id == job_id
        assert status.last_job_status == C.JOB_STATUS_COMPLETED and status.last_job_error == ""
        adapter = Path(status.last_job_adapter.path)
        assert (adapter / "adapter_model.safetensors").is_file() and status.last_job_adapter.version == 3

        merged = [p async for p in stub.MergeAdapter(T.MergeAdapterRequest(
            base_model=tiny_model, adapter_path=str(adapter), output_name=f"m-{job_id}"))]
        assert merged[-1].done and [p.stage for p in merged][0] == "loading"
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(merged[-1].path)
        assert merged[-1].size_bytes > 0 and Path(merged[-1].path).parent == settings.artifact_root / "merged"
        with pytest.raises(grpc.aio.AioRpcError) as exists:
            await stub.MergeAdapter(T.MergeAdapterRequest(
                base_model=tiny_model, adapter_path=str(adapter), output_name=f"m-{job_id}")).read()
        assert exists.value.code() == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(grpc.aio.AioRpcError) as outside:
            await stub.MergeAdapter(T.MergeAdapterRequest(adapter_path="/etc", output_name="x")).read()
        assert outside.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await channel.close()


async def test_cancel_stops_within_seconds_and_keeps_the_adapter(nats_server, tmp_path: Path, tiny_model: str) -> None:
    settings = _settings(tmp_path, nats_server.url)
    async with ServiceRunner(build_service(settings), settings) as runner, connected_bus(nats_server.url) as bus:
        channel = make_channel(runner.address, aio=True)
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.CancelJob(T.TrainerCancelJobRequest(job_id="nope"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        job_id = f"cancel-{time.monotonic_ns()}"
        await stub.StartJob(_request(job_id, tiny_model, max_steps=500))
        await job_events(bus, job_id, timeout_s=120, until_terminal=False, metrics_wanted=2)
        started = time.monotonic()
        response = await stub.CancelJob(T.TrainerCancelJobRequest(job_id=job_id))
        assert time.monotonic() - started < settings.cancel_grace_seconds + 3
        assert response.adapter.version >= 2 and Path(response.adapter.path, "adapter_model.safetensors").is_file()

        metrics, statuses = await job_events(bus, job_id, timeout_s=30)
        assert statuses[-1].status == C.JOB_STATUS_CANCELLED
        assert statuses[-1].adapter.version == response.adapter.version == len(metrics)
        status = await stub.GetWorkerStatus(T.GetWorkerStatusRequest())
        assert not status.busy and status.last_job_status == C.JOB_STATUS_CANCELLED
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), response.adapter.path)
        await channel.close()


async def test_a_failing_job_fails_alone_with_its_cause_and_a_killed_one_resumes(nats_server, tmp_path: Path, tiny_model: str) -> None:
    import os
    import signal

    from rlvr.services.trainer.process.worker import JobSupervisor

    supervisor = JobSupervisor(_settings(tmp_path, nats_server.url))
    async with connected_bus(nats_server.url) as bus:
        # A job that fails inside its process: the result carries the cause in one line.
        bad = f"bad-{time.monotonic_ns()}"
        await supervisor.start(_request(bad, str(tmp_path / "no-such-model"), max_steps=3))
        _, statuses = await job_events(bus, bad, timeout_s=120)
        assert statuses[-1].status == C.JOB_STATUS_FAILED
        assert statuses[-1].message.startswith("base_model:") and "no-such-model" in statuses[-1].message
        await asyncio.wait_for(_idle(supervisor), 10)
        assert supervisor.last is not None and "no-such-model" in supervisor.last.error

        # A job process killed from outside (as the OOM killer would): the worker reports it lost,
        # with its cause and the adapter of its last finished step, and publishes no final status
        # (the scheduler resumes such a job); the worker itself carries on.
        crashed = f"crash-{time.monotonic_ns()}"
        request = _request(crashed, tiny_model, max_steps=6)
        request.spec.advanced.checkpoint_every = 1
        await supervisor.start(request)
        await job_events(bus, crashed, timeout_s=120, until_terminal=False, metrics_wanted=2)
        assert supervisor.current is not None
        os.killpg(supervisor.current.process.pid, signal.SIGKILL)
        await asyncio.wait_for(_idle(supervisor), 10)
        status = supervisor.status()
        assert not status.busy and status.last_job_id == crashed and status.last_job_lost
        assert status.last_job_status == C.JOB_STATUS_FAILED and "killed by signal 9" in status.last_job_error
        assert status.last_job_adapter.version >= 2
        lost_at = status.last_job_adapter.version
        # A worker started again on the same artifact root (the service restarted) reports it lost too.
        restarted = JobSupervisor(_settings(tmp_path, nats_server.url)).status()
        assert (restarted.last_job_id, restarted.last_job_lost, restarted.busy) == (crashed, True, False)
        assert restarted.last_job_adapter == status.last_job_adapter
        assert "was restarted while the job ran" in restarted.last_job_error
        _, statuses = await job_events(bus, crashed, timeout_s=10, until_terminal=False, metrics_wanted=lost_at)
        assert [s.status for s in statuses] == [C.JOB_STATUS_RUNNING]

        # Started again as a resume, it goes on from its last checkpoint (its checkpoints kept)
        # and each step is on the stream once.
        request.resume, request.stored_steps = True, 1
        await supervisor.start(request)
        metrics, statuses = await job_events(bus, crashed, timeout_s=120)
        assert statuses[-1].status == C.JOB_STATUS_COMPLETED, statuses[-1].message
        assert statuses[1].message.startswith("resuming from step ") and statuses[1].current_step >= 1
        assert [m.step for m in metrics] == [1, 2, 3, 4, 5, 6]
        assert statuses[-1].adapter.version == 6
    await supervisor.close()


async def _idle(supervisor: object) -> None:
    while supervisor.current is not None:  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)


async def test_start_is_idempotent_by_job_id_and_outlives_its_caller(
        nats_server, tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.services.trainer.process import worker as worker_module
    from rlvr.services.trainer.process.worker import JobSupervisor, WorkerBusy

    real_check = worker_module.check_quantization

    def slow_check(*args: object) -> None:  # a start that takes a while
        time.sleep(0.5)
        real_check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_module, "check_quantization", slow_check)
    # A fresh job process: what is checked is the start, and the job is cancelled as soon as it runs
    # (a fork server would first import the job's libraries, 13 s of CPU, for a job that never trains).
    supervisor = JobSupervisor(_settings(tmp_path, nats_server.url, job_start="fresh"))
    job_id = f"idem-{time.monotonic_ns()}"
    request = _request(job_id, tiny_model, max_steps=500)
    first = asyncio.create_task(supervisor.start(request))
    await asyncio.sleep(0.1)
    status = supervisor.status()
    assert status.busy and status.job_id == job_id  # being started: already this job's worker
    with pytest.raises(WorkerBusy, match=job_id):
        await supervisor.start(_request("another", tiny_model, max_steps=3))
    first.cancel()  # its caller goes away (a deadline): the start goes on
    assert await supervisor.start(request) is False  # the same job: shares that start
    assert first.cancelled()
    assert supervisor.current is not None and supervisor.current.config.job_id == job_id
    pid = supervisor.current.process.pid
    assert await supervisor.start(request) is False  # and once it runs: nothing new
    assert supervisor.current is not None and supervisor.current.process.pid == pid
    await supervisor.cancel(job_id)
    assert supervisor.last is not None and supervisor.last.job_id == job_id
    await supervisor.close()


def test_a_restarted_worker_ends_a_job_process_that_outlived_it(tmp_path: Path) -> None:
    """Job processes die with their service (PR_SET_PDEATHSIG); should one not have, a worker
    started again kills it before anything else, so it never has two jobs training."""
    import json
    import subprocess
    import sys

    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.process.worker import JobSupervisor

    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url="", worker_name="trainer-test")
    job = job_config("orphaned", "rlvr-tiny-test", settings.artifact_root)
    job.job_dir.mkdir(parents=True)
    (job.job_dir / "config.json").write_text(json.dumps(job.to_json()))
    (job.job_dir / "progress.json").write_text(json.dumps({"step": 2, "total_steps": 9}))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "rlvr.services.trainer.process.job_process",
                               str(job.job_dir)], start_new_session=True)
    try:
        (job.job_dir / "pid").write_text(str(orphan.pid))
        cmdline = Path(f"/proc/{orphan.pid}/cmdline")
        while b"rlvr.services.trainer.process.job_process" not in cmdline.read_bytes():  # exec is under way
            time.sleep(0.01)
        status = JobSupervisor(settings).status()
        assert orphan.wait(timeout=10) == -9
        assert (status.last_job_id, status.last_job_lost, status.last_job_adapter.version) == ("orphaned", True, 2)
    finally:
        orphan.kill()


async def test_the_worker_reports_what_it_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GetWorkerStatus carries the capabilities computed at start: this host's devices and cores,
    the precisions and quantizations it can train in, in-process vLLM, and the base models it has
    (the bundled tiny ones, a hub id in the Hugging Face cache, a folder under its model roots)."""
    import importlib.util
    import os

    import torch
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    (hub / "models--acme--small-lm" / "snapshots" / "abc123").mkdir(parents=True)
    (hub / "models--acme--small-lm" / "snapshots" / "abc123" / "config.json").write_text("{}")
    (hub / "models--acme--no-snapshot").mkdir()  # an interrupted download: not cached
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    roots = tmp_path / "models"
    (roots / "mine").mkdir(parents=True)
    (roots / "mine" / "config.json").write_text("{}")
    (roots / "not-a-model").mkdir()
    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url="", worker_name="trainer-caps",
                               model_roots=[roots])
    async with ServiceRunner(build_service(settings), settings) as runner:
        stub = trainer_pb2_grpc.TrainerServiceStub(make_channel(runner.address, aio=True))
        status = await stub.GetWorkerStatus(T.GetWorkerStatusRequest())
    assert status.HasField("capabilities") and not status.busy
    caps = status.capabilities
    assert caps.cpu_cores == len(os.sched_getaffinity(0)) and caps.memory_bytes > 2**28
    if torch.cuda.is_available():  # a GPU host
        assert caps.device_kind == "cuda" and len(caps.gpus) == torch.cuda.device_count()
        assert "fp16" in caps.precisions and caps.max_num_processes == min(len(caps.gpus), 8)
    else:  # this CPU host: no GPU, fp16 cannot train here, one process per core
        assert caps.device_kind == "cpu" and not caps.gpus
        assert list(caps.precisions) == ["fp32", "bf16"] and caps.max_num_processes == min(caps.cpu_cores, 8)
    bnb = importlib.util.find_spec("bitsandbytes") is not None
    assert list(caps.quantizations) == (["full", "4bit", "8bit"] if bnb else ["full"])
    assert caps.vllm_colocate == (importlib.util.find_spec("vllm") is not None)
    cached = set(caps.cached_models)
    assert {"rlvr-tiny", "rlvr-tiny-test", "rlvr-tiny-small", "acme/small-lm", str(roots / "mine")} <= cached
    assert "acme/no-snapshot" not in cached and str(roots / "not-a-model") not in cached
    assert str(roots) in caps.model_roots and caps.hub_offline
