"""docker-compose.yml, run: its own service commands, and its NATS's, started as separate local
processes (no Docker engine here), against this machine's PostgreSQL (127.0.0.1:5432, database
`test`, a schema of the test's own), driving a short job and an evaluation through them.

What is mapped, and nothing else: the compose host names (nats, postgres, reward, rollout, trainer,
benchmark, scheduler) to 127.0.0.1 with free ports; `/data` (the shared volume) to a folder of the
test's; `--host 0.0.0.0` to 127.0.0.1; `/run/secrets/NAME` to the file `deploy/make-secrets.sh` made
for the secret (the services serve TLS with token auth, the client uses the user token and the CA); and the compose variables RLVR_MODEL to `rlvr-tiny-small`, the
seconds-to-build tiny model (the file's default, rlvr-tiny, takes minutes to build), and
RLVR_MEMORY_FRACTION to 0.3 (vLLM's share of host memory here, as `rlvr up` uses; the file's default
0.45 is a GPU's); RLVR_METRICS_PORT to 0 (one port per container there, a free one each here). Where those
servers are absent the test skips saying why; under CI=true it fails instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fixtures_infra import POSTGRES_URL, _drop_postgres_schema, _postgres_schema_url
from test_compose import make_secrets, secret_files, substitute

from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

# make test-all only (about 65 s): make test runs tests/test_multihost.py, the same separate-process
# layout with the machine's PostgreSQL and NATS over TLS, and tests/test_compose.py checks this file.
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
ORDER = ("reward", "rollout", "trainer", "benchmark", "scheduler")
MODEL = "rlvr-tiny-small"


def _missing(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{why}; CI must have it")
    pytest.skip(why)


def local_commands(compose: dict, ports: dict[str, int], data: Path, database_url: str,
                   env: dict[str, str]) -> dict[str, list[str]]:
    """Each service's compose command, mapped onto this machine (see the module docstring)."""
    bin_dir = Path(sys.executable).parent
    hosts = "|".join(ORDER)
    commands: dict[str, list[str]] = {}
    for name in ORDER:
        argv = [substitute(a, env) for a in compose["services"][name]["command"]]
        out = [str(bin_dir / argv[0])]
        for i, arg in enumerate(argv[1:], start=1):
            previous = argv[i - 1]
            if previous == "--port":
                arg = str(ports[name])
            elif previous == "--host":
                arg = "127.0.0.1"
            elif arg.startswith("postgresql"):
                assert "@postgres:5432/" in arg
                arg = database_url
            else:
                arg = re.sub(rf"^({hosts}):\d+$", lambda m: f"127.0.0.1:{ports[m.group(1)]}", arg)
                arg = re.sub(r"^/data(?=/|$)", str(data), arg)
            out.append(arg)
        commands[name] = out
    return commands


@pytest.fixture(scope="module")
def compose_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str]]:
    from rlvr.clients.sdk import ClientSettings, connect
    from rlvr.clients.stack import free_port
    from rlvr.infra.nats_server import find_nats_binary
    from rlvr.infra.reaper import parent_death_command, stop_process_groups
    from rlvr.peers.base import check_health

    made = _postgres_schema_url(POSTGRES_URL)
    if made is None:
        _missing(f"PostgreSQL is not reachable at {POSTGRES_URL}")
    database_url, schema = made
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    home = tmp_path_factory.mktemp("compose")
    data = home / "data"
    (data / "datasets").mkdir(parents=True)
    ports = {name: free_port() for name in ORDER}
    commands = local_commands(compose, ports, data, database_url,
                              {"RLVR_MODEL": MODEL, "RLVR_MEMORY_FRACTION": "0.3"})
    # The compose secrets, made by deploy/make-secrets.sh; /run/secrets/NAME is NAME's file.
    secrets = make_secrets(home / "secrets")
    files = secret_files(compose, secrets)

    def local(value: str) -> str:
        if value.startswith("/run/secrets/"):
            return str(files[value.removeprefix("/run/secrets/")])
        return value.replace("/data", str(data), 1)

    # The compose file's own NATS: its command (credentials and TLS from the secrets), here.
    nats_port = free_port()
    nats_argv = [{"4222": str(nats_port), "/data": str(home / "nats")}.get(a, local(a))
                 for a in compose["services"]["nats"]["command"]]
    nats_proc = subprocess.Popen(parent_death_command([str(find_nats_binary()), "-a", "127.0.0.1", *nats_argv]),
                                 stdin=subprocess.DEVNULL, stdout=open(home / "nats.log", "ab"),  # noqa: SIM115
                                 stderr=subprocess.STDOUT, start_new_session=True)
    local_nats_url = home / "nats_url"  # the secret's URL, with nats:4222 mapped as the other host names
    local_nats_url.write_text(files["nats_url"].read_text().replace("@nats:4222", f"@127.0.0.1:{nats_port}"))
    service_env = {**os.environ, "PYTHONUNBUFFERED": "1",
                   **{k: local(substitute(str(v), {})) for k, v in compose["x-rlvr-service"]["environment"].items()},
                   "RLVR_METRICS_PORT": "0",  # the file's one port per container: a free one each, on one host
                   "RLVR_TRAINER_TORCH_THREADS": "1",
                   "RLVR_NATS_URL_FILE": str(local_nats_url)}
    client_settings = ClientSettings(**{f"{n}_address": f"127.0.0.1:{p}" for n, p in ports.items()},
                                     token=(secrets / "user_token").read_text().strip(), ca_file=files["rlvr_tls_ca"])
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ORDER:
            with open(home / f"{name}.log", "ab") as log:
                procs[name] = subprocess.Popen(parent_death_command(commands[name]), stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT, env=service_env, cwd=home,
                                               start_new_session=True)
        deadline = time.monotonic() + 300
        pending = set(ORDER)
        while pending:
            for name in sorted(pending):
                assert procs[name].poll() is None, f"{name} exited:\n" + (home / f"{name}.log").read_text()[-3000:]
                if check_health(f"127.0.0.1:{ports[name]}", timeout=1.0, auth=client_settings.auth()) == "SERVING":
                    pending.discard(name)
            assert time.monotonic() < deadline, f"not SERVING: {pending}"
            time.sleep(0.5)
        client = connect(client_settings)  # the user token, over TLS
        yield client, database_url, (local_nats_url.read_text().strip(), files["rlvr_tls_ca"])
        client.close()
    finally:
        stop_process_groups(reversed(list(procs.values())), grace=20)
        nats_proc.terminate()
        nats_proc.wait(timeout=20)
        _drop_postgres_schema(POSTGRES_URL, schema)


def test_the_compose_commands_serve_a_job_and_an_evaluation(compose_stack) -> None:
    from rlvr.infra.store import Store

    client, database_url, (nats_url, nats_ca) = compose_stack
    spec = C.JobSpec(name="compose", base_model=MODEL)  # the default backend: through the rollout server
    spec.reward.synthetic_prompts = 64
    g = spec.grpo
    g.max_steps, g.group_size, g.batch_size, g.max_completion_tokens, g.lora_rank = 2, 4, 8, 48, 4
    job = client.scheduler.create_job(S.CreateJobRequest(spec=spec)).job
    events = list(client.scheduler.watch(job.id, timeout=600))
    assert events[-1].status.status == C.JOB_STATUS_COMPLETED, events[-1]
    assert sorted({e.metric.step for e in events if e.HasField("metric")}) == [1, 2]
    done = client.scheduler.get_job(S.GetJobRequest(id=job.id))  # the watch ends once the store has the end
    assert done.status == C.JOB_STATUS_COMPLETED
    assert done.adapter.name == f"job-{job.id}" and done.adapter.version == 2
    # The evaluation of the trained adapter, by the benchmark service, from the shared artifact root.
    evaluation = client.benchmark.run_evaluation(B.RunEvaluationRequest(
        benchmark="rlvr-math-pairs-heldout", limit=16, adapter=C.AdapterSelector(name=done.adapter.name),
        adapter_path=done.adapter.path, label="compose"))
    for _ in client.benchmark.watch_evaluation(B.WatchEvaluationRequest(id=evaluation.id), timeout=300):
        pass
    finished = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=evaluation.id))
    assert finished.status == B.EVALUATION_STATUS_COMPLETED and finished.questions_done == 16, finished.error
    assert finished.scores.format > 0  # rlvr-tiny-small writes the answer format
    # The job's events went through the compose file's NATS (its password, over TLS).
    import asyncio

    from rlvr.infra.events import EventBus
    from rlvr.infra.subjects import job_events_subject

    async def job_events() -> int:
        bus = await EventBus.connect(nats_url, name="test-compose-nats", tls_ca_file=nats_ca)
        try:
            seen = 0
            async for _ in bus.watch(job_events_subject(job.id), from_start=True):
                seen += 1
                if seen == 3:  # two steps' metrics and at least one status
                    break
            return seen
        finally:
            await bus.close()

    assert asyncio.run(asyncio.wait_for(job_events(), 30)) == 3
    # Both services wrote to the one PostgreSQL the compose file shares between them.
    with Store(database_url) as store:
        assert store.get_job(job.id).status == "COMPLETED"
        assert store.get_evaluation(evaluation.id).status == "COMPLETED"
