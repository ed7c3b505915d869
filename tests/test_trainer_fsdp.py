"""A job sharded with FSDP (advanced.sharding "fsdp", two gloo processes on this machine's CPU) trains
what the same job trains data parallel (advanced.sharding "ddp"), publishes a complete adapter, and
resumes from its checkpoint.

Why they can agree: each rank generates and trains the same rows under both (the completions do not
depend on how the model is held: rollouts.SeededSampler), and FSDP's reduce-scatter of the gradients
averages the two ranks' halves as DDP's all-reduce does. The adapters and losses are compared within a
tolerance (ADAPTER_TOL, LOSS_TOL) rather than bit for bit, as in tests/test_trainer_multiproc.py,
since the two collectives need not sum in one order (on this machine they came out bit-equal).

The two jobs run at once, each on a worker of its own (a JobSupervisor, with its own artifact root),
launched as a worker launches any job of several processes, in its two ways (job_process.launch):
the FSDP job's ranks forked from its job process (torchrun's agent in it, as on a host without a
GPU), the DDP job's started by torchrun exec'd (`job_start = "fresh"`, as on a GPU host), so the
comparison also shows that the two ways train alike.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from fixtures_infra import connected_bus
from fixtures_trainer import job_events

from rlvr.services.trainer.settings import TrainerSettings
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

STEPS = 3
MODEL = "rlvr-tiny-small"  # writes the answer format and is sometimes right: rewards differ, the adapter moves
LOSS_TOL = 1e-4  # relative, per step (with an absolute floor of 1e-6)
ADAPTER_TOL = 1e-3  # per LoRA weight, relative to the largest change the steps made to B
SHARDED = re.compile(r"\[rank (\d)\].*policy sharded with FSDP2 across 2 processes: this one holds (\d+) of its (\d+)")


def _settings(root: Path, nats_url: str, name: str, job_start: str = "fork") -> TrainerSettings:
    return TrainerSettings(port=0, artifact_root=root, nats_url=nats_url, scorer="local", torch_threads=1,
                           cancel_grace_seconds=20.0, worker_name=name, job_start=job_start)


def _request(job_id: str, sharding: str, resume: bool = False, stored: int = 0) -> T.StartJobRequest:
    spec = C.JobSpec(base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, STEPS
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    a = spec.advanced
    a.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    a.loss_type = C.LOSS_TYPE_DAPO
    a.seed, a.temperature, a.num_processes, a.gpu_selection = 3, 1.0, 2, "cpu"
    a.sharding, a.checkpoint_every = sharding, 2
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=STEPS, resume=resume, stored_steps=stored)


def _adapter(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


async def _idle(supervisor: object) -> None:
    while supervisor.current is not None:  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)


async def test_fsdp_trains_what_ddp_trains_and_pushes_the_whole_adapter(nats_server, tmp_path: Path) -> None:
    import json

    from rlvr.services.trainer.process.worker import JobSupervisor

    stamp = time.monotonic_ns()
    runs = {"fsdp": f"fsdp-{stamp}", "ddp": f"ddp-{stamp}"}
    starts = {"fsdp": "fork", "ddp": "fresh"}
    supervisors = {kind: JobSupervisor(_settings(tmp_path / kind, nats_server.url, f"trainer-{kind}", starts[kind]))
                   for kind in runs}
    async with connected_bus(nats_server.url) as bus:
        for kind, job_id in runs.items():
            await supervisors[kind].start(_request(job_id, kind))
        events = {kind: await job_events(bus, job_id, timeout_s=240) for kind, job_id in runs.items()}
    for supervisor in supervisors.values():
        await asyncio.wait_for(_idle(supervisor), 30)
    logs = {kind: (tmp_path / kind / "jobs" / job_id / "job.log").read_text() for kind, job_id in runs.items()}
    for kind, (_, statuses) in events.items():
        assert statuses[-1].status == C.JOB_STATUS_COMPLETED, f"{kind}: {statuses[-1].message}\n{logs[kind][-3000:]}"

    # The FSDP job's policy was sharded: each rank held half of it; the DDP job's was not.
    held = {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in SHARDED.finditer(logs["fsdp"])}
    assert sorted(held) == [0, 1], logs["fsdp"][-3000:]
    assert all(h < total for h, total in held.values()) and sum(h for h, _ in held.values()) == held[0][1]
    assert not SHARDED.search(logs["ddp"])
    # Each job started its ranks as its worker's job_start says.
    assert "2 training processes, forked: torchrun" in logs["fsdp"] and "-m torch.distributed.run" in logs["ddp"]

    # The same rewards and losses, step by step.
    (fsdp, fsdp_status), (ddp, ddp_status) = events["fsdp"], events["ddp"]
    assert [m.step for m in fsdp] == [m.step for m in ddp] == list(range(1, STEPS + 1))
    for a, b in zip(fsdp, ddp, strict=True):
        assert (a.reward_mean, a.reward_std, a.completion_length_mean) == (
            b.reward_mean, b.reward_std, b.completion_length_mean), a.step
        assert a.loss == pytest.approx(b.loss, rel=LOSS_TOL, abs=1e-6), a.step
    assert any(m.reward_std > 0 for m in ddp)  # the groups had a reward spread: the adapter moved

    # The adapter FSDP pushed is whole: every LoRA tensor DDP's has, at its full shape, and equal to it.
    sharded, plain = _adapter(Path(fsdp_status[-1].adapter.path)), _adapter(Path(ddp_status[-1].adapter.path))
    assert sharded.keys() == plain.keys() and len(plain) == 2 * 7 * 2  # A and B of 7 projections x 2 layers
    assert {k: tuple(v.shape) for k, v in sharded.items()} == {k: tuple(v.shape) for k, v in plain.items()}  # type: ignore[attr-defined]
    moved = max(float(t.abs().max()) for k, t in plain.items() if "lora_B" in k)  # type: ignore[attr-defined]
    assert moved > 0  # B starts at zero: the steps trained it
    worst = max(float((sharded[k] - plain[k]).abs().max()) for k in plain)  # type: ignore[operator]
    print(f"B moved up to {moved:g}; the FSDP and DDP adapters differ by up to {worst:g}")
    assert worst <= ADAPTER_TOL * moved, f"adapters differ by up to {worst:g} (B moved up to {moved:g})"
    config = json.loads((Path(fsdp_status[-1].adapter.path) / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 64)

    # Resume: the FSDP job re-dispatched goes on from its checkpoint (step 2) and ends where it ended.
    job_dir = tmp_path / "fsdp" / "jobs" / runs["fsdp"]
    assert (job_dir / "trl" / "checkpoint-2" / "rlvr-resume.json").is_file()
    await supervisors["fsdp"].start(_request(runs["fsdp"], "fsdp", resume=True, stored=STEPS))
    await asyncio.wait_for(_idle(supervisors["fsdp"]), 240)
    result = json.loads((job_dir / "result.json").read_text())
    log = (job_dir / "job.log").read_text()
    assert result["status"] == "completed", log[-3000:]
    assert "resuming from step 2" in log
    resumed = _adapter(Path(result["adapter_path"]))
    worst = max(float((resumed[k] - sharded[k]).abs().max()) for k in sharded)  # type: ignore[operator]
    assert worst <= ADAPTER_TOL * moved, f"the resumed run's adapter differs by up to {worst:g}"
    for supervisor in supervisors.values():
        await supervisor.close()
