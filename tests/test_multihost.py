"""Two hosts, simulated on this machine: every service a separate process on a port of its own,
on this machine's PostgreSQL (127.0.0.1:5432, database `test`, a schema of the test's own) and
NATS with JetStream (127.0.0.1:4222), not the embedded ones. docs/operations.md's "Two hosts" layout:

- host A (127.0.0.1): the scheduler, the reward service, the benchmark service, trainer worker A,
  rollout replica A;
- host B (127.0.0.2, a second loopback address): trainer worker B, rollout replica B.

Each host has its own RLVR_HOME (its copy of the base model, its logs), its own rollout adapter
folder and its own (empty) data root. Both trainers generate on both replicas (transformers
backend, `rlvr-tiny-test`). As services reached from another host must, every one takes the
secrets `deploy/make-secrets.sh` made (RLVR_TLS_NAMES=127.0.0.2 puts host B in the certificate):
the service token and the tokens file, and serves TLS; the client uses the user token and the CA.
This NATS and PostgreSQL take no password and no TLS.

Shared between the hosts, and only that: the artifact root (as an NFS mount at the same path on
both). docs/operations.md says why: a job's adapter folder is written by whichever worker ran it, and is
read by path by the benchmark service (an evaluation of that adapter, here the one host B
trained), by the scheduler (DownloadAdapter, reclaim, delete), by any worker (a loop's next round
stacking on it, MergeAdapter), none of which streams it today. The rollout replicas share nothing:
adapters reach them through LoadAdapter's stream.

Two jobs are submitted at once, one runs on each worker; then the benchmark service on host A
evaluates the adapter host B trained (by its path on B: fetched from B), and host A's by name alone
(the version the trainer pushed to the replicas: no folder). Checked: both jobs complete, on
different workers, every step stored once in PostgreSQL and published once on NATS, each replica
answered its half of every step and of each evaluation (GetInfo's generate_calls), both hold every
job's last version, the evaluations are stored, and B's adapter downloaded through the scheduler on
host A is B's, byte for byte. Without PostgreSQL or NATS here it skips saying
why; under CI=true it fails.

This NATS is the machine's, so the test removes its jobs' and evaluation's messages from the `RLVR`
stream at the end, and its scheduler's durable consumer (named after the test's database, so a
second run at the same time would have its own); nothing else in the suite uses this NATS (the
others embed their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures_infra import POSTGRES_URL, _drop_postgres_schema, _postgres_schema_url
from test_compose import make_secrets

from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

MODEL = "rlvr-tiny-test"
NATS_URL = os.environ.get("RLVR_TEST_NATS_URL", "nats://127.0.0.1:4222")
HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2"}
STEPS = {"first": 3, "second": 2}
EVAL_N = 16  # one benchmark batch (--batch-size 16), split across the two replicas


def _missing(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{why}; CI must have it")
    pytest.skip(why)


def _nats_reachable(url: str) -> bool:
    import nats

    async def probe() -> bool:
        try:
            nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False)
        except Exception:
            return False
        try:
            await nc.jetstream().account_info()  # JetStream on
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    return asyncio.run(probe())


@dataclass
class Host:
    name: str
    ip: str
    home: Path  # RLVR_HOME: the host's model copy, and the folders below

    @property
    def rollout_adapters(self) -> Path:
        return self.home / "rollout-adapters"

    @property
    def datasets(self) -> Path:
        return self.home / "datasets"

    @property
    def artifacts(self) -> Path:  # its own artifact root: no folder is shared
        return self.home / "artifacts"


@dataclass
class Cluster:
    root: Path
    secrets: Path  # deploy/make-secrets.sh's
    database_url: str
    hosts: dict[str, Host]
    addresses: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, label: str, host: Host, service: str, *args: str) -> str:
        from rlvr.clients.stack import free_port
        from rlvr.infra.reaper import parent_death_command

        address = f"{host.ip}:{free_port(host.ip)}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLVR_HOME": str(host.home),
               "OMP_NUM_THREADS": "1", "RLVR_TRAINER_TORCH_THREADS": "1",  # the tiny model: one thread is faster
               "RLVR_AUTH_TOKEN_FILE": str(self.secrets / "service_token"),
               "RLVR_AUTH_TOKENS_FILE": str(self.secrets / "tokens.json"),
               "RLVR_TLS_CERT_FILE": str(self.secrets / "tls" / "server.pem"),
               "RLVR_TLS_KEY_FILE": str(self.secrets / "tls" / "server.key"),
               "RLVR_TLS_CA_FILE": str(self.ca)}
        argv = [sys.executable, "-m", f"rlvr.services.{service}.main", "--host", host.ip,
                "--port", address.rsplit(":", 1)[1], "--log-format", "text", *args]
        with open(self.root / f"{label}.log", "ab") as log:
            self.procs[label] = subprocess.Popen(parent_death_command(argv), stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, env=env, cwd=host.home,
                                                 start_new_session=True)
        self.addresses[label] = address
        return address

    @property
    def ca(self) -> Path:
        return self.secrets / "tls" / "ca.pem"

    def token(self, name: str) -> str:
        return (self.secrets / name).read_text().strip()

    def wait_serving(self, timeout: float = 300) -> None:
        from rlvr.common.auth import ChannelAuth
        from rlvr.peers.base import check_health

        deadline = time.monotonic() + timeout
        pending = set(self.procs)
        while pending:
            for label in sorted(pending):
                assert self.procs[label].poll() is None, f"{label} exited:\n{self.log(label)}"
                if check_health(self.addresses[label], timeout=1.0, auth=ChannelAuth.from_files(ca_file=self.ca)) == "SERVING":
                    pending.discard(label)
            assert time.monotonic() < deadline, f"not SERVING after {timeout} s: {sorted(pending)}"
            time.sleep(0.5)

    def log(self, label: str) -> str:
        return (self.root / f"{label}.log").read_text()[-3000:]

    def stop(self) -> None:
        from rlvr.infra.reaper import stop_process_groups

        stop_process_groups(reversed(list(self.procs.values())), grace=20)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from rlvr.models import resolve_model

    if not _nats_reachable(NATS_URL):
        _missing(f"NATS with JetStream is not reachable at {NATS_URL} (set RLVR_TEST_NATS_URL)")
    made = _postgres_schema_url(POSTGRES_URL)
    if made is None:
        _missing(f"PostgreSQL is not reachable at {POSTGRES_URL} (set RLVR_TEST_POSTGRES_URL)")
    database_url, schema = made
    root = tmp_path_factory.mktemp("multihost")
    built = Path(resolve_model(MODEL))  # once, under the test home; each host gets its own copy
    hosts = {name: Host(name, ip, root / f"host-{name}") for name, ip in HOSTS.items()}
    for host in hosts.values():
        shutil.copytree(built, host.home / "models" / MODEL)
        host.datasets.mkdir(parents=True)
    cluster = Cluster(root, make_secrets(root / "secrets", tls_names=HOSTS["b"]), database_url, hosts)
    a, b = hosts["a"], hosts["b"]
    for host in (a, b):
        host.artifacts.mkdir(parents=True)
    try:
        replicas = ",".join(cluster.start(f"rollout-{h.name}", h, "rollout", "--model", MODEL, "--backend",
                                          "transformers", "--max-model-len", "512", "--max-lora-rank", "8",
                                          "--adapter-root", str(h.rollout_adapters)) for h in (a, b))
        reward = cluster.start("reward", a, "reward", "--data-roots", str(a.datasets))
        workers = ",".join(cluster.start(f"trainer-{h.name}", h, "trainer", "--worker-name", f"trainer-{h.name}",
                                         "--artifact-root", str(h.artifacts), "--data-roots", str(h.datasets),
                                         "--nats-url", NATS_URL, "--rollout-addresses", replicas,
                                         "--reward-address", reward) for h in (a, b))
        benchmark = cluster.start("benchmark", a, "benchmark", "--database-url", database_url, "--nats-url", NATS_URL,
                                  "--rollout-addresses", replicas, "--reward-address", reward,
                                  "--adapter-roots", str(a.artifacts), "--trainer-addresses", workers,
                                  "--batch-size", str(EVAL_N))
        cluster.start("scheduler", a, "scheduler", "--database-url", database_url, "--nats-url", NATS_URL,
                      "--artifact-root", str(a.artifacts), "--data-roots", str(a.datasets),
                      "--trainer-addresses", workers, "--benchmark-address", benchmark, "--max-lora-rank", "8")
        cluster.wait_serving()
        yield cluster
    finally:
        cluster.stop()
        _drop_postgres_schema(POSTGRES_URL, schema)


def _spec(name: str, steps: int) -> C.JobSpec:
    spec = C.JobSpec(name=name, base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.max_steps, g.group_size, g.batch_size, g.max_completion_tokens = steps, 4, 8, 32  # 2 prompts: 1 a replica
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM  # through the rollout service(s)
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    return spec


def _rollout(cluster: Cluster, label: str) -> tuple[int, dict[str, int]]:
    """A replica's generate_calls and the adapter versions it holds, asked of the replica itself."""
    from rlvr.clients.sdk import RolloutClient
    from rlvr.common.auth import ChannelAuth

    auth = ChannelAuth.from_files(token=cluster.token("service_token"), ca_file=cluster.ca)
    with RolloutClient(cluster.addresses[label], auth=auth) as client:
        return int(client.get_info().generate_calls), {a.name: a.version for a in client.list_adapters().adapters}


def _published(subjects: list[str], purge: bool, consumer: str = "") -> dict[str, int]:
    """How many messages the `RLVR` stream of this machine's NATS holds on each subject; with
    `purge`, removed afterwards, with the scheduler's durable `consumer` (the stream is shared with
    whatever else uses this NATS)."""
    import nats

    from rlvr.infra.events import STREAM_NAME

    async def count() -> dict[str, int]:
        nc = await nats.connect(NATS_URL)
        try:
            js = nc.jetstream()
            counts = {}
            for s in subjects:
                info = await js.stream_info(STREAM_NAME, subjects_filter=s)
                counts[s] = (info.state.subjects or {}).get(s, 0)
            if purge:
                for s in subjects:
                    await js.purge_stream(STREAM_NAME, subject=s)
                if consumer:
                    with contextlib.suppress(nats.js.errors.NotFoundError):
                        await js.delete_consumer(STREAM_NAME, consumer)
            return counts
        finally:
            await nc.close()

    return asyncio.run(count())


def test_two_hosts_run_two_jobs_at_once_and_evaluate_them(cluster: Cluster) -> None:
    from rlvr.clients.sdk import ClientSettings, connect
    from rlvr.infra.store import Store
    from rlvr.services.scheduler.jobs import events_consumer

    settings = ClientSettings(scheduler_address=cluster.addresses["scheduler"],
                              benchmark_address=cluster.addresses["benchmark"], token=cluster.token("user_token"),
                              ca_file=cluster.ca)
    client = connect(settings)
    subjects: list[str] = []
    try:
        created = {name: client.scheduler.create_job(S.CreateJobRequest(spec=_spec(name, steps))).job.id
                   for name, steps in STEPS.items()}
        subjects += [f"rlvr.jobs.{job_id}.{kind}" for job_id in created.values() for kind in ("metrics", "status")]
        for job_id in created.values():
            list(client.scheduler.watch(job_id, timeout=600))
        jobs = {name: client.scheduler.get_job(S.GetJobRequest(id=job_id)) for name, job_id in created.items()}
        for name, job in jobs.items():
            assert job.status == C.JOB_STATUS_COMPLETED, f"{name}: {job.error}"
            assert (job.adapter.name, job.adapter.version) == (f"job-{job.id}", STEPS[name])
        # One job on each worker: they ran at once, each writing under its own host's root.
        assert sorted(job.worker for job in jobs.values()) == sorted(
            cluster.addresses[f"trainer-{h}"] for h in HOSTS), [job.worker for job in jobs.values()]
        for job in jobs.values():
            host = next(h for h in HOSTS if job.worker == cluster.addresses[f"trainer-{h}"])
            assert Path(job.adapter.path).is_relative_to(cluster.hosts[host].artifacts.resolve())
        # Each replica answered one Generate call of every step of both jobs (a step's two prompts
        # split across them), and holds both jobs' last versions, streamed to its own folder.
        total = sum(STEPS.values())
        served = {h: _rollout(cluster, f"rollout-{h}") for h in HOSTS}
        for h, (calls, live) in served.items():
            assert calls == total, (h, calls)
            assert {name: live[job.adapter.name] for name, job in jobs.items()} == STEPS, (h, live)
            assert any(cluster.hosts[h].rollout_adapters.iterdir())

        def evaluate(job: C.Job, **fields: object) -> B.Evaluation:
            started = client.benchmark.run_evaluation(B.RunEvaluationRequest(
                benchmark="rlvr-math-pairs-heldout", limit=EVAL_N, sampling=C.SamplingParams(max_tokens=32),
                adapter=C.AdapterSelector(name=job.adapter.name), label="multihost", **fields))
            subjects.append(f"rlvr.evals.{started.id}.status")
            list(client.benchmark.watch_evaluation(B.WatchEvaluationRequest(id=started.id), timeout=300))
            done = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=started.id))
            assert done.status == B.EVALUATION_STATUS_COMPLETED, done.error
            assert done.questions_done == EVAL_N and done.adapter_name == job.adapter.name
            return done

        # The scheduler on host A relays the adapter host B trained (B's root only holds it).
        from_a, from_b = (next(j for j in jobs.values() if j.worker == cluster.addresses[f"trainer-{h}"]) for h in HOSTS)
        downloaded = client.scheduler.save_adapter(from_b.id, cluster.root / "downloaded")
        assert [p.read_bytes() for p in downloaded] == [(Path(from_b.adapter.path) / p.name).read_bytes()
                                                        for p in downloaded] and len(downloaded) == 2
        # The benchmark service on host A evaluates it by its path on host B (fetched from trainer
        # B), and uploads it to both replicas as a new version ...
        by_path = evaluate(from_b, adapter_path=from_b.adapter.path)
        assert by_path.adapter_version == from_b.adapter.version + 1
        # ... and host A's by name alone: the version the trainer pushed to the replicas, no file read.
        by_name = evaluate(from_a)
        assert by_name.adapter_version == from_a.adapter.version
        for h in HOSTS:
            calls, live = _rollout(cluster, f"rollout-{h}")
            assert calls == total + 2, (h, calls)  # half of each evaluation's one batch
            assert (live[from_b.adapter.name], live[from_a.adapter.name]) == (by_path.adapter_version,
                                                                              from_a.adapter.version)

        # PostgreSQL holds every step of each job once (steps 1..N, (job, step) is its key), both
        # jobs' ends and the evaluations.
        with Store(cluster.database_url) as store:
            for name, job in jobs.items():
                assert [p.step for p in store.metric_points(job.id)] == list(range(1, STEPS[name] + 1)), name
                row = store.get_job(job.id)
                assert row is not None and row.status == "COMPLETED" and row.current_step == STEPS[name]
            for evaluation in (by_path, by_name):
                stored = store.get_evaluation(evaluation.id)
                assert stored is not None and stored.status == "COMPLETED" and stored.n_done == EVAL_N
                assert (stored.adapter_name, stored.adapter_version) == (evaluation.adapter_name,
                                                                         evaluation.adapter_version)
        # ... and NATS got each step once: no retry of a publish reached the stream twice.
        counts = _published(subjects, purge=False)
        for name, job in jobs.items():
            assert counts[f"rlvr.jobs.{job.id}.metrics"] == STEPS[name], counts
    finally:
        client.close()
        consumer = ""  # the scheduler's consumer on this NATS, named after its database
        with contextlib.suppress(Exception), Store(cluster.database_url) as store:
            consumer = events_consumer(store.store_id())
        _published(subjects, purge=True, consumer=consumer)
