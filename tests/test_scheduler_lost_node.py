"""A host lost from a job of two nodes, end to end: a scheduler (in this process) and two trainer
workers (processes of their own, each with its own artifact root; their gRPC on 127.0.0.1, their
rendezvous on 127.0.0.1 and 127.0.0.2, as tests/test_trainer_multinode.py runs two hosts).

kill -9 of node 1's worker at step 2: within node_lost_seconds (3 s here) the job is QUEUED with a
status naming node 1 and since when; a job of one node queued meanwhile runs on the survivor; node 1's
worker started again, the job resumes on both and completes with each step stored once. Slow (two
trainer services and three runs of the job's ranks): the rule itself is tested without processes in
tests/test_scheduler_multinode.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_trainer_multiproc import MODEL, _request

from rlvr.clients.sdk import SchedulerClient
from rlvr.clients.stack.ports import free_port
from rlvr.infra.store import Store
from rlvr.services.common.server import ServiceRunner
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

pytestmark = pytest.mark.slow

STEPS = 5


def _worker(root: Path, port: int, nats_url: str, name: str, ip: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RLVR_TRAINER_PORT": str(port), "RLVR_TRAINER_ARTIFACT_ROOT": str(root),
           "RLVR_TRAINER_NATS_URL": nats_url, "RLVR_TRAINER_SCORER": "local", "RLVR_TRAINER_TORCH_THREADS": "1",
           "RLVR_TRAINER_WORKER_NAME": name, "RLVR_TRAINER_RENDEZVOUS_ADDRESS": ip}
    log = (root.parent / f"{name}.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "rlvr.services.trainer.main"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def _until(what: str, check, timeout: float, logs: list[Path]):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(check)
        if got:
            return got
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tails}")
        await asyncio.sleep(0.3)


async def test_a_killed_node_is_named_its_survivor_runs_other_work_and_the_job_resumes(nats_server,
                                                                                       tmp_path: Path) -> None:
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    roots = [tmp_path / "host-a" / "artifacts", tmp_path / "host-b" / "artifacts"]
    ports = [free_port("127.0.0.1"), free_port("127.0.0.1")]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    names, ips = ["trainer-a", "trainer-b"], ["127.0.0.1", "127.0.0.2"]
    logs = [tmp_path / "host-a" / "trainer-a.log", tmp_path / "host-b" / "trainer-b.log"]
    for root in roots:
        root.mkdir(parents=True)
    procs = [_worker(roots[i], ports[i], nats_server.url, names[i], ips[i]) for i in (0, 1)]
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = SchedulerSettings(port=0, database_url=db, nats_url=nats_server.url,
                                 artifact_root=tmp_path / "scheduler", trainer_addresses=addresses,
                                 rendezvous_port=free_port("127.0.0.1"), node_lost_seconds=3.0,
                                 node_wait_seconds=600.0)
    try:
        async with ServiceRunner(build_service(settings), settings) as scheduler:
            client = SchedulerClient(scheduler.address)
            spec = _request("x", MODEL, processes=1, steps=STEPS).spec
            spec.advanced.num_nodes, spec.advanced.checkpoint_every = 2, 1
            job_id = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=spec))).job.id

            def job() -> C.Job:
                return client.get_job(S.GetJobRequest(id=job_id))

            def at_step_2() -> C.Job | None:
                j = job()
                return j if j.current_step >= 2 or j.status in (C.JOB_STATUS_FAILED, C.JOB_STATUS_COMPLETED) else None

            reached = await _until("the two-node job reached step 2 (or ended)", at_step_2, 300, logs)
            assert reached.status == C.JOB_STATUS_RUNNING, (reached.status, reached.error, reached.queue_reason)
            # node 0 on trainer-a, node 1 on trainer-b (a blocking call: off the loop that serves it)
            assert (await asyncio.to_thread(job)).worker == ",".join(addresses)
            procs[1].send_signal(signal.SIGKILL)  # host B is gone, its job process with it
            killed = time.monotonic()
            single_spec = _request("y", MODEL, processes=1, steps=1).spec
            single_id = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=single_spec))).job.id

            lost = await _until("the job names its lost node", lambda: (j := job()).status == C.JOB_STATUS_QUEUED
                                and j.queue_reason.startswith(f"node 1 ({addresses[1]}) lost since") and j, 60, logs)
            print(f"named {time.monotonic() - killed:.1f} s after the kill: {lost.queue_reason}")
            assert "its worker has not answered since" in lost.queue_reason

            def single() -> C.Job:
                return client.get_job(S.GetJobRequest(id=single_id))

            await _until("the job of one node ran on the survivor",
                         lambda: single().status == C.JOB_STATUS_COMPLETED, 180, logs)
            assert (await asyncio.to_thread(single)).worker == addresses[0]

            procs[1].wait()
            procs[1] = _worker(roots[1], ports[1], nats_server.url, names[1], ips[1])  # host B is back
            done = await _until("the job resumed and ended", lambda: (j := job()).status in (
                C.JOB_STATUS_COMPLETED, C.JOB_STATUS_FAILED) and j, 300, logs)
            assert done.status == C.JOB_STATUS_COMPLETED, done.error
            client.close()
        store = Store(db)
        steps = [p.step for p in store.metric_points(job_id)]
        assert steps == list(range(1, STEPS + 1))  # each step stored once
        assert store.get_job(job_id).resumes == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
