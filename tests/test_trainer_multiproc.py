"""A job across two training processes (advanced.num_processes = 2) on this machine's CPU: the worker
launches it with torchrun (gloo), rank 0 alone publishes, and the job trains what one process
trains with the same global batch.

Why they can agree: each prompt's group is sampled with random numbers of its own (seeded by the
step's seed and the prompt's index in the step's whole batch: rollouts.SeededSampler, in one batched
generate call), so the split does not change the completions; TRL gathers the rewards across
ranks for the group advantages and normalises the DAPO loss by the global token count; DDP
averages the two halves' gradients. What remains is the order of float32 sums (the gradient
all-reduce), so losses and the final adapter agree to a tolerance (LOSS_TOL, ADAPTER_TOL), not bit
for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fixtures_infra import connected_bus
from fixtures_trainer import job_events

from rlvr.infra.subjects import job_metrics_subject
from rlvr.services.trainer.process.worker import JobSupervisor
from rlvr.services.trainer.settings import TrainerSettings
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

STEPS = 3
MODEL = "rlvr-tiny-small"  # writes the answer format and is sometimes right: rewards differ, the adapter moves
LOSS_TOL = 1e-4  # relative, per step (with an absolute floor of 1e-6)
ADAPTER_TOL = 1e-3  # per LoRA weight, relative to the largest change the steps made to B


def _settings(tmp_path: Path, nats_url: str, job_start: str = "fork") -> TrainerSettings:
    return TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url=nats_url, scorer="local",
                           torch_threads=1, cancel_grace_seconds=20.0, worker_name="trainer-mp", job_start=job_start)


@contextlib.asynccontextmanager
async def _supervisor(tmp_path: Path, nats_url: str, job_start: str = "fork") -> AsyncIterator[JobSupervisor]:
    """A trainer worker's job supervisor, closed however the test ends (its job processes with it:
    a failed assertion never leaves ranks running under pytest)."""
    supervisor = JobSupervisor(_settings(tmp_path, nats_url, job_start))
    try:
        yield supervisor
    finally:
        await supervisor.close()


def _request(job_id: str, model: str, processes: int, steps: int = STEPS) -> T.StartJobRequest:
    spec = C.JobSpec(base_model=model)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, steps
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    a = spec.advanced
    a.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    a.loss_type = C.LOSS_TYPE_DAPO
    a.seed, a.temperature, a.num_processes, a.gpu_selection = 3, 1.0, processes, "cpu"
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=steps)


def _ranks(job_dir: Path) -> list[int]:
    """The pids of the job's rank processes (`... job_process --job-dir <dir> --rank-of <pid>`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        rank = b"--rank-of" in argv and b"torch.distributed.run" not in argv  # not torchrun itself
        if rank and str(job_dir).encode() in argv and state != "Z":
            pids.append(int(entry.name))
    return pids


def _adapter(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


async def test_two_processes_train_what_one_trains_and_publish_each_step_once(
        nats_server, tmp_path: Path) -> None:
    import torch

    from rlvr.services.trainer.job.config import job_config_from_request
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    async with _supervisor(tmp_path, nats_server.url) as supervisor:
        job_id = f"mp-{time.monotonic_ns()}"
        async with connected_bus(nats_server.url) as bus:
            published: list[bytes] = []  # every publish to the subject, duplicates the stream would drop included

            async def count(msg: object) -> None:
                published.append(msg.data)  # type: ignore[attr-defined]

            raw = await bus.nc.subscribe(job_metrics_subject(job_id), cb=count)
            await supervisor.start(_request(job_id, MODEL, processes=2))
            # Meanwhile the same job in one process, in this one (the job process's local scorer).
            one = job_config_from_request(_request("mp-one", MODEL, processes=1), tmp_path / "one")
            single: list[C.MetricEvent] = []
            scorer = LocalScorer(ScoreSettings(one.reward_function, one.format_bonus, one.format_bonus_weight))
            result = await asyncio.to_thread(run_job, one, JobDeps(scorer=scorer, publish=single.append))
            assert result.status == "completed", result.error

            metrics, statuses = await job_events(bus, job_id, timeout_s=240)
            await raw.unsubscribe()
        await asyncio.wait_for(_idle(supervisor), 30)
        job_log = (tmp_path / "artifacts" / "jobs" / job_id / "job.log").read_text()
        assert statuses[-1].status == C.JOB_STATUS_COMPLETED, f"{statuses[-1].message}\n{job_log[-3000:]}"
        assert "[rank 1]" in job_log  # it did run as two processes

        # Each step published once (by rank 0), with the completions of both ranks.
        assert [m.step for m in metrics] == list(range(1, STEPS + 1))
        assert len(published) == STEPS
        assert [s.status for s in statuses] == [C.JOB_STATUS_RUNNING, C.JOB_STATUS_COMPLETED]
        assert (statuses[-1].adapter.version, statuses[-1].current_step) == (STEPS, STEPS)

        # The same completions, rewards and losses as one process with the same global batch.
        assert [m.step for m in single] == [m.step for m in metrics]
        for two, one_ in zip(metrics, single, strict=True):
            assert (two.reward_mean, two.reward_std, two.completion_length_mean, two.clipped_ratio) == (
                one_.reward_mean, one_.reward_std, one_.completion_length_mean, one_.clipped_ratio), two.step
            assert two.loss == pytest.approx(one_.loss, rel=LOSS_TOL, abs=1e-6), two.step
        assert any(m.reward_std > 0 for m in single)  # the groups had a reward spread: the adapter moved

        two_adapter = _adapter(Path(statuses[-1].adapter.path))
        one_adapter = _adapter(Path(result.adapter_path))
        assert two_adapter.keys() == one_adapter.keys()
        moved = max(float(t.abs().max()) for k, t in one_adapter.items() if "lora_B" in k)  # type: ignore[attr-defined]
        assert moved > 0  # B starts at zero: the steps trained it
        worst = max(float((two_adapter[k] - one_adapter[k]).abs().max()) for k in one_adapter)  # type: ignore[operator]
        print(f"B moved up to {moved:g}; the two runs' adapters differ by up to {worst:g}")
        assert worst <= ADAPTER_TOL * moved, f"adapters differ by up to {worst:g} (B moved up to {moved:g})"
        assert isinstance(next(iter(one_adapter.values())), torch.Tensor)
        assert _ranks(tmp_path / "artifacts" / "jobs" / job_id) == []  # every rank is gone


async def test_a_cancel_takes_down_every_rank(nats_server, tmp_path: Path) -> None:
    async with _supervisor(tmp_path, nats_server.url) as supervisor:
        job_id = f"mp-cancel-{time.monotonic_ns()}"
        job_dir = tmp_path / "artifacts" / "jobs" / job_id
        async with connected_bus(nats_server.url) as bus:
            await supervisor.start(_request(job_id, MODEL, processes=2, steps=500))
            await job_events(bus, job_id, timeout_s=240, metrics_wanted=1)
            assert len(_ranks(job_dir)) == 2
            adapter = await supervisor.cancel(job_id)
            metrics, statuses = await job_events(bus, job_id, timeout_s=30)
        assert statuses[-1].status == C.JOB_STATUS_CANCELLED
        assert adapter is not None and adapter.version == len(metrics) >= 1
        assert (Path(adapter.path) / "adapter_model.safetensors").is_file()
        assert _ranks(job_dir) == []


async def _idle(supervisor: object) -> None:
    while supervisor.current is not None:  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)



@pytest.mark.parametrize("job_start", ["fork", "fresh"])
async def test_a_killed_job_process_takes_every_rank_with_it(nats_server, tmp_path: Path, job_start: str) -> None:
    """SIGKILL to the job's process group (the worker's last resort on cancel, or the OOM killer):
    the launcher dies (torchrun's agent in it, or torchrun it exec'd), and each rank with it
    (PR_SET_PDEATHSIG: the ranks it forked are in its process group too; a fresh launcher's death
    signal is kept across its exec)."""
    import os
    import signal

    async with _supervisor(tmp_path, nats_server.url, job_start) as supervisor:
        job_id = f"mp-kill-{time.monotonic_ns()}"
        job_dir = tmp_path / "artifacts" / "jobs" / job_id
        await supervisor.start(_request(job_id, MODEL, processes=2, steps=500))
        deadline = time.monotonic() + 120
        while not all(f"[rank {r}]" in (job_dir / "job.log").read_text() for r in (0, 1)):  # past die_with_parent
            assert time.monotonic() < deadline, (job_dir / "job.log").read_text()[-3000:]
            await asyncio.sleep(0.2)
        ranks = _ranks(job_dir)
        assert len(ranks) == 2 and supervisor.current is not None
        os.killpg(supervisor.current.process.pid, signal.SIGKILL)
        await asyncio.wait_for(_idle(supervisor), 10)
        deadline = time.monotonic() + 10
        while _ranks(job_dir):
            assert time.monotonic() < deadline, f"ranks {_ranks(job_dir)} outlived their launcher"
            await asyncio.sleep(0.1)
        status = supervisor.status()
        assert status.last_job_id == job_id and status.last_job_lost and "killed by signal 9" in status.last_job_error


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _sft_request(job_id: str, processes: int, steps: int = STEPS, method: str = "sft") -> T.StartJobRequest:
    if method == "sft":
        spec = C.JobSpec(base_model=MODEL, method=C.TRAINING_METHOD_SFT, sft=C.SftConfig(
            dataset=str(EXAMPLES / "sft" / "math-pairs"), max_steps=steps, batch_size=8, max_seq_length=96,
            learning_rate=1e-3, lora_rank=4, lora_alpha=16, lora_dropout=0.0))
    else:  # a Head job trains through the same steps (services/trainer/job/sft.py's StepProgress)
        spec = C.JobSpec(base_model=MODEL, method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(
            dataset=str(EXAMPLES / "head" / "math-verdicts"), max_steps=steps, batch_size=8, max_seq_length=96,
            learning_rate=1e-3, lora_rank=4, lora_alpha=16, lora_dropout=0.0))
    a = spec.advanced
    a.seed, a.num_processes, a.gpu_selection = 3, processes, "cpu"
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=steps)


@pytest.mark.parametrize("method", ["sft", "head"])
async def test_an_sft_or_head_job_across_two_processes_trains_what_one_trains(nats_server, tmp_path: Path,
                                                                             method: str) -> None:
    """Supervised (SFT) and Head on two processes (docs/sft.md, docs/head.md): TRL's SFTTrainer or
    transformers' Trainer under the job's process group (DDP over gloo), each process a half of every
    step's 8 examples, rank 0 alone writing the adapter and publishing one MetricEvent per step; the
    adapter agrees with one process's to ADAPTER_TOL."""
    from rlvr.services.trainer.job.config import job_config_from_request
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    async with _supervisor(tmp_path, nats_server.url) as supervisor:
        job_id = f"mp-{method}-{time.monotonic_ns()}"
        async with connected_bus(nats_server.url) as bus:
            await supervisor.start(_sft_request(job_id, processes=2, method=method))
            one = job_config_from_request(_sft_request(f"mp-{method}-one", processes=1, method=method), tmp_path / "one",
                                          data_roots=(Path(__file__).resolve().parent.parent,))
            single: list[C.MetricEvent] = []
            result = await asyncio.to_thread(run_job, one, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")),
                                                                    publish=single.append))
            assert result.status == "completed", result.error
            metrics, statuses = await job_events(bus, job_id, timeout_s=240)
        await asyncio.wait_for(_idle(supervisor), 30)
        job_log = (tmp_path / "artifacts" / "jobs" / job_id / "job.log").read_text()
        assert statuses[-1].status == C.JOB_STATUS_COMPLETED, f"{statuses[-1].message}\n{job_log[-3000:]}"
        assert "[rank 1]" in job_log
        assert [m.step for m in metrics] == [m.step for m in single] == list(range(1, STEPS + 1))
        assert all(m.loss > 0 and m.tokens_per_second > 0 for m in metrics)
        if method == "head":  # the last step evaluated, over both processes' halves of the held-out rows
            assert metrics[-1].HasField("heldout_accuracy") and len(metrics[-1].class_f1) == 2
            assert metrics[-1].heldout_accuracy == pytest.approx(single[-1].heldout_accuracy)
        two_adapter = _adapter(Path(statuses[-1].adapter.path))
        one_adapter = _adapter(Path(result.adapter_path))
        assert two_adapter.keys() == one_adapter.keys()
        moved = max(float(t.abs().max()) for k, t in one_adapter.items() if "lora_B" in k)  # type: ignore[attr-defined]
        worst = max(float((two_adapter[k] - one_adapter[k]).abs().max()) for k in one_adapter)  # type: ignore[operator]
        print(f"{method}: B moved up to {moved:g}; the two runs' adapters differ by up to {worst:g}")
        for two, one_ in zip(metrics, single, strict=True):  # the mean over the step's examples, as one process's
            assert two.loss == pytest.approx(one_.loss, rel=LOSS_TOL, abs=1e-6), two.step
        assert moved > 0 and worst <= ADAPTER_TOL * moved, f"adapters differ by up to {worst:g} (B moved up to {moved:g})"
        assert _ranks(tmp_path / "artifacts" / "jobs" / job_id) == []
