"""Crash recovery on the real stack: embedded NATS, SQLite, the five services as child processes (the
end-to-end modules' shared stack, tests/fixtures_stack.py; these jobs generate on their own
transformers backend), jobs created through the public SDK.

A job whose trainer is killed with SIGKILL after a checkpoint, only its job process or the whole
trainer service (restarted then), is not failed: the scheduler resumes it from the checkpoint
(services/scheduler/dispatch.py), it ends COMPLETED with every step stored exactly once, and its final
adapter is bit for bit the adapter of an uninterrupted job with the same spec and seed
(services/trainer/job/resume.py, `resume_point`). The job process of a killed trainer service dies with
it (PR_SET_PDEATHSIG), so the resumed run never trains beside the lost one.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from fixtures_stack import SMALL_MODEL as MODEL  # the shared stack's model

from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

STEPS = 6  # the kill comes after step 3, about 3 steps (2 s each, idle) before the job would end


@pytest.fixture(scope="module")
def stack(small_stack) -> tuple[object, object, Path]:  # noqa: ANN001 (tests/fixtures_stack.py)
    shared = small_stack.get()
    return shared.client, shared.running, shared.home


def _spec(name: str) -> C.JobSpec:
    spec = C.JobSpec(name=name, base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, STEPS
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 128, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    spec.advanced.checkpoint_every = 2
    spec.advanced.seed = 7
    return spec


def _create(client, name: str) -> str:  # noqa: ANN001 (the SDK facade)
    return str(client.scheduler.create_job(S.CreateJobRequest(spec=_spec(name))).job.id)


def _finish(client, job_id: str) -> tuple[C.Job, list[C.JobStatusEvent]]:  # noqa: ANN001
    statuses = [e.status for e in client.scheduler.watch(job_id, timeout=300) if e.HasField("status")]
    return client.scheduler.get_job(S.GetJobRequest(id=job_id)), statuses


def _until_step(client, job_id: str, step: int, timeout: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while client.scheduler.get_job(S.GetJobRequest(id=job_id)).current_step < step:
        assert time.monotonic() < deadline, f"job {job_id} did not reach step {step}"
        time.sleep(0.1)


def _job_process(job_id: str) -> int:
    """The pid of the job's process (`python -m rlvr.services.trainer.process.job_process --job-dir .../<job_id>`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rlvr.services.trainer.process.job_process" in argv and any(a.endswith(f"/{job_id}".encode()) for a in argv):
            return int(entry.name)
    raise AssertionError(f"no job process of {job_id}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stored_steps(home: Path, job_id: str) -> list[int]:
    from rlvr.infra.store import Store

    with Store(f"sqlite:///{home / 'rlvr.db'}") as store:
        return [p.step for p in store.metric_points(job_id)]


def _tensors(job: C.Job) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(Path(job.adapter.path) / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(stack: tuple[object, object, Path]) -> dict[str, object]:
    client, _, home = stack
    job, _ = _finish(client, _create(client, "whole"))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert _stored_steps(home, job.id) == list(range(1, STEPS + 1))
    tensors = _tensors(job)
    # Not a trivially equal adapter: the run trained (B starts at 0 and moves only with a gradient).
    assert any(v.abs().sum() > 0 for k, v in tensors.items() if "lora_B" in k)  # type: ignore[attr-defined]
    return tensors


def _check_resumed(client, home: Path, job_id: str, expected: dict[str, object]) -> list[C.JobStatusEvent]:  # noqa: ANN001
    import torch

    job, statuses = _finish(client, job_id)
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert _stored_steps(home, job_id) == list(range(1, STEPS + 1))  # each step once, none missing
    assert job.adapter.version == STEPS
    got = _tensors(job)
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)  # type: ignore[arg-type]
    return statuses


@pytest.mark.slow  # a chaos run, make test-all (28 s); make test keeps test_trainer_service's killed job resuming from
# its checkpoint and test_trainer_job's bit-exact resume
def test_a_killed_job_process_resumes_from_its_checkpoint(stack, uninterrupted) -> None:  # noqa: ANN001
    client, _, home = stack
    job_id = _create(client, "job-process-killed")
    _until_step(client, job_id, 3)  # after the checkpoint of step 2
    os.kill(_job_process(job_id), signal.SIGKILL)
    statuses = _check_resumed(client, home, job_id, uninterrupted)
    messages = [s.message for s in statuses]
    assert any(m.startswith("resuming from the last checkpoint after the trainer was lost at step ")
               and "killed by signal 9" in m for m in messages), messages
    assert any(m.startswith("resuming from step ") for m in messages), messages


@pytest.mark.slow  # a chaos run, make test-all (15 s); make test keeps test_trainer_service's killed job resuming
def test_a_killed_trainer_service_resumes_the_job_when_restarted(stack, uninterrupted) -> None:  # noqa: ANN001
    client, running, home = stack
    job_id = _create(client, "trainer-killed")
    _until_step(client, job_id, 3)
    lost = _job_process(job_id)
    assert running.restart("trainer")  # SIGKILL to the service's process group, then started again
    deadline = time.monotonic() + 10
    while _alive(lost):  # its job process (a session of its own) dies with it: PR_SET_PDEATHSIG
        assert time.monotonic() < deadline, "the job process outlived its trainer service"
        time.sleep(0.05)
    statuses = _check_resumed(client, home, job_id, uninterrupted)
    messages = [s.message for s in statuses]
    assert any("was restarted while the job ran" in m for m in messages), messages


@pytest.mark.slow  # make test-all (30 s), as test_loops_e2e's scheduler restarts; make test restarts a scheduler in-process
def test_a_killed_scheduler_leaves_the_job_running_to_the_same_end(stack, uninterrupted) -> None:  # noqa: ANN001
    """kill -9 of the scheduler mid-job: the job trains on, the restarted scheduler reads the steps
    published meanwhile off the stream (its durable consumer) and stores each once."""
    client, running, home = stack
    job_id = _create(client, "scheduler-killed")
    _until_step(client, job_id, 2)
    worker = _job_process(job_id)
    assert running.restart("scheduler")
    assert _alive(worker) or client.scheduler.get_job(S.GetJobRequest(id=job_id)).status == C.JOB_STATUS_COMPLETED
    statuses = _check_resumed(client, home, job_id, uninterrupted)
    assert not any(s.message.startswith("resuming") for s in statuses)  # never lost: it just went on
