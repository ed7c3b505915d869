"""A job of several processes whose rollout server is restarted without its adapters (issue 16).

Only rank 0 pushes each adapter version (services/trainer/job/distributed.py); the other ranks adopt
it (`ServiceGenerator.adopt_adapter`) and push it again themselves when they find a restarted
server without it, instead of failing NOT_FOUND ("nothing of ours to bring back") or waiting for
rank 0, which may have generated its part of the step before the server went away and so never
push again. The server is restarted with an empty adapter folder (a new container, a lost
volume): one that keeps its folder brings the live versions back from its disk by itself.

- the rank-level test: two `ServiceGenerator`s standing for rank 0 (which pushed) and rank 1
  (which adopted), against the real rollout server (transformers backend) restarted on its port;
  also what the server answers to the same version pushed twice at once (one goes live, the
  other is refused FAILED_PRECONDITION "not newer", which the generators take as done). Rank 1
  calls while the server is down, so its channel backs off its reconnects: the re-push goes
  through a fresh channel once the server is back (`_recover`), or it would fail UNAVAILABLE;
- the job test (`slow`): a job of two processes (gloo, CPU) through a rollout server killed with
  SIGKILL after step 1 and started again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fixtures_infra import connected_bus
from fixtures_trainer import job_events
from test_rollout_core import make_lora

from rlvr.peers.types import AdapterTag, Sampling
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import rollout_pb2 as R
from rlvr.v1 import trainer_pb2 as T

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

NAME = "repush"
PROMPTS = [[1, 2, 3], [4, 5, 6]]
SAMPLING = Sampling(group_size=2, max_tokens=32, temperature=1.0, seed=5)


@contextlib.asynccontextmanager
async def rollout_server(model: str, port: int, adapter_root: Path) -> AsyncIterator[str]:
    """The rollout server (transformers backend) in this process, on `port`."""
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.rollout.server import build_service
    from rlvr.services.rollout.settings import RolloutSettings

    settings = RolloutSettings(host="127.0.0.1", port=port, model=model, backend="transformers",
                               adapter_root=adapter_root, max_model_len=512, memory_fraction=0.1)
    async with ServiceRunner(build_service(settings), settings) as runner:
        yield runner.address


def _live(address: str) -> dict[str, int]:
    from rlvr.peers.clients import RolloutClient

    with RolloutClient(address) as client:
        return {a.name: a.version for a in client.list_adapters(R.ListAdaptersRequest()).adapters}


async def test_a_rank_that_did_not_push_brings_the_adapter_back_to_a_restarted_server(
        tmp_path: Path, tiny_model: str) -> None:
    from rlvr.clients.stack import free_port
    from rlvr.peers.base import RlvrError
    from rlvr.peers.clients import RolloutClient
    from rlvr.services.trainer.job.rollouts import RolloutError, ServiceGenerator

    port = free_port()
    folder = make_lora(Path(tiny_model), tmp_path / "adapter", seed=0, targets=["q_proj", "v_proj"])  # the job's adapter folder, shared by the ranks
    v1 = AdapterTag(NAME, 1)
    told: list[str] = []
    ranks = [ServiceGenerator(f"127.0.0.1:{port}", wait_s=120.0, on_wait=told.append) for _ in range(2)]
    stranger = ServiceGenerator(f"127.0.0.1:{port}", wait_s=120.0)  # neither pushed nor adopted
    try:
        async with rollout_server(tiny_model, port, tmp_path / "root-1") as address:
            await asyncio.to_thread(ranks[0].publish_adapter, folder, v1)  # rank 0 pushes ...
            ranks[1].adopt_adapter(folder, v1)  # ... rank 1 adopts (engine.py, on_step_end)
            assert (await asyncio.to_thread(ranks[1].generate, PROMPTS, SAMPLING, v1)).adapter == v1

        # The server goes away while rank 1 generates, and comes back without the adapter.
        pending = asyncio.create_task(asyncio.to_thread(ranks[1].generate, PROMPTS, SAMPLING, v1))
        while not told:  # rank 1 found it gone and waits
            assert not pending.done(), pending.result()
            await asyncio.sleep(0.05)
        async with rollout_server(tiny_model, port, tmp_path / "root-2") as address:
            batch = await pending
            assert batch.adapter == v1 and len(batch.completion_ids) == len(PROMPTS) * SAMPLING.group_size
            assert any(m.startswith("step 0: the rollout service at") and "is back after" in m for m in told), told
            assert await asyncio.to_thread(_live, address) == {NAME: 1}  # pushed again, by rank 1
            # A NOT_FOUND with nothing of the generator's own to bring back is not waited out.
            with pytest.raises(RolloutError, match="NOT_FOUND"):
                await asyncio.to_thread(stranger.generate, PROMPTS, SAMPLING, AdapterTag("never-pushed", 1))

        # Both ranks find the next server without it, and both push it again at once.
        async with rollout_server(tiny_model, port, tmp_path / "root-3") as address:
            assert await asyncio.to_thread(_live, address) == {}
            both = await asyncio.gather(*(asyncio.to_thread(r.generate, PROMPTS, SAMPLING, v1) for r in ranks))
            assert [b.adapter for b in both] == [v1, v1]
            assert await asyncio.to_thread(_live, address) == {NAME: 1}

            # What the server answers to one version pushed twice at once: one push goes live, the
            # other is FAILED_PRECONDITION "not newer" (what `_recover` takes as brought back).
            def push() -> str:
                with RolloutClient(address) as client:
                    try:
                        info = client.load_adapter(NAME, 2, folder)
                    except RlvrError as e:
                        return str(e)
                    return f"OK v{info.version}"

            answers = sorted(await asyncio.gather(asyncio.to_thread(push), asyncio.to_thread(push)))
            assert answers[0].startswith("FAILED_PRECONDITION: ") and "version 2 is not newer" in answers[0], answers
            assert answers[1] == "OK v2", answers
    finally:
        for generator in (*ranks, stranger):
            generator.close()


# ---------------------------------------------------------------------------------------- the job

STEPS = 4
MODEL = "rlvr-tiny-test"


def _serve(port: int, adapter_root: Path, log: Path) -> subprocess.Popen[bytes]:
    """The rollout server as a process of its own (so that it can be killed -9), once SERVING."""
    from rlvr.peers.base import check_health

    with open(log, "ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "rlvr.services.rollout.main", "--host", "127.0.0.1", "--port", str(port),
             "--model", MODEL, "--backend", "transformers", "--adapter-root", str(adapter_root),
             "--log-format", "text"], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while check_health(f"127.0.0.1:{port}") != "SERVING":
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return server


@contextlib.contextmanager
def _killed_at_the_end(servers: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()


@pytest.mark.slow
async def test_a_job_of_two_processes_survives_its_rollout_server_restarted_empty(
        nats_server, tmp_path: Path) -> None:
    from rlvr.clients.stack import free_port
    from rlvr.infra.subjects import job_metrics_subject
    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.services.trainer.settings import TrainerSettings

    port = free_port()
    log = tmp_path / "rollout.out"
    servers = [await asyncio.to_thread(_serve, port, tmp_path / "rollout-1", log)]
    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url=nats_server.url, scorer="local",
                               torch_threads=1, cancel_grace_seconds=20.0, worker_name="trainer-mp",
                               rollout_address=f"127.0.0.1:{port}", rollout_wait_seconds=240.0)
    spec = C.JobSpec(base_model=MODEL)
    spec.reward.function = C.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, STEPS
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    a = spec.advanced
    a.generation_backend = C.GENERATION_BACKEND_VLLM  # through the rollout server (its transformers backend)
    a.loss_type = C.LOSS_TYPE_DAPO
    a.seed, a.num_processes, a.gpu_selection = 3, 2, "cpu"
    job_id = f"mp-rollout-{time.monotonic_ns()}"
    supervisor = JobSupervisor(settings)
    with _killed_at_the_end(servers):
        async with connected_bus(nats_server.url) as bus:
            published: list[bytes] = []  # every publish, duplicates the stream would drop included

            async def count(msg: object) -> None:
                published.append(msg.data)  # type: ignore[attr-defined]

            raw = await bus.nc.subscribe(job_metrics_subject(job_id), cb=count)
            await supervisor.start(T.StartJobRequest(job_id=job_id, spec=spec, total_steps=STEPS))
            await job_events(bus, job_id, timeout_s=300, metrics_wanted=1)
            os.kill(servers[0].pid, signal.SIGKILL)  # after step 1: v1 is live there, and only there
            servers[0].wait()
            # Started again on the same port with an empty adapter folder: v1 is gone with it.
            servers.append(await asyncio.to_thread(_serve, port, tmp_path / "rollout-2", log))
            metrics, statuses = await job_events(bus, job_id, timeout_s=300)
            await raw.unsubscribe()
        while supervisor.current is not None:
            await asyncio.sleep(0.05)
        job_log = (tmp_path / "artifacts" / "jobs" / job_id / "job.log").read_text()
        assert statuses[-1].status == C.JOB_STATUS_COMPLETED, f"{statuses[-1].message}\n{job_log[-4000:]}"
        assert "[rank 1]" in job_log  # it did run as two processes
        assert [m.step for m in metrics] == list(range(1, STEPS + 1)) and len(published) == STEPS  # each once
        assert (statuses[-1].adapter.version, statuses[-1].current_step) == (STEPS, STEPS)
        assert await asyncio.to_thread(_live, f"127.0.0.1:{port}") == {statuses[-1].adapter.name: STEPS}
        # The job waited for the server (said so), and rank 1 brought v1 back or found it back.
        messages = [s.message for s in statuses]
        assert any("is back after" in m for m in messages) or "is back after" in job_log, messages
        await supervisor.close()
