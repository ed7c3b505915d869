"""Several rollout replicas (`rollout_addresses`): real rollout servers as separate processes (the
transformers backend, the test-size tiny model), a job's rollouts and an evaluation's questions
spread across them, counted from the servers' side (GetInfo's generate_calls), the same adapter
versions on each, and a job that survives the loss of one (SIGKILL mid-job).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_bootstrap import _free_port, _wait_serving

from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py
EVAL_N = 40


class Servers:
    """Service processes with their logs, killed at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, label: str = "") -> str:
        address = f"127.0.0.1:{_free_port()}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread decodes faster on shared cores
        with (self.logs / f"{label or name}.log").open("wb") as out:
            self.procs[address] = subprocess.Popen(
                [sys.executable, "-m", f"rlvr.services.{name}.main", "--port", address.rsplit(":", 1)[1],
                 "--log-format", "text", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        return address

    def rollout(self, model: str, root: Path, label: str) -> str:
        return self.start("rollout", "--model", model, "--backend", "transformers", "--max-model-len", "512",
                          "--max-lora-rank", "8", "--adapter-root", str(root / label), label=label)

    def ready(self, *addresses: str, timeout: float = 180) -> None:
        for address in addresses:
            try:
                _wait_serving(address, timeout=timeout)
            except TimeoutError:
                logs = "\n".join(p.read_text()[-2000:] for p in self.logs.glob("*.log"))
                pytest.fail(f"{address} did not start:\n{logs}")

    def kill(self, address: str) -> None:
        proc = self.procs[address]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=30)


@dataclass
class Replicas:
    servers: Servers
    model: str
    heldout_accuracy: float
    a: str
    b: str
    root: Path


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    from rlvr.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("replicas")
    report = build_tiny_model(root / "rlvr-tiny-test", size="test", eval_n=EVAL_N)
    servers = Servers(root)
    try:
        a, b = (servers.rollout(report.path, root, label) for label in ("replica-a", "replica-b"))
        servers.ready(a, b)
        yield Replicas(servers, report.path, report.heldout_accuracy, a, b, root)
    finally:
        servers.stop()


def _served(address: str) -> int:
    from rlvr.clients.sdk import RolloutClient

    with RolloutClient(address) as client:
        return int(client.get_info().generate_calls)


def _live(address: str) -> dict[str, int]:
    from rlvr.clients.sdk import RolloutClient

    with RolloutClient(address) as client:
        return {a.name: a.version for a in client.list_adapters().adapters}


def _job(root: Path, model: str, job_id: str, steps: int) -> Any:
    from rlvr.services.trainer.job.config import job_config

    # 4 prompts x 4 completions a step: two prompts to each replica.
    return job_config(job_id=job_id, base_model=model, artifact_root=root / "artifacts", group_size=4,
                      batch_size=16, max_completion_tokens=32, lora_rank=4, lora_alpha=64, learning_rate=1e-3,
                      max_steps=steps, loss_type="dapo", generation_backend="vllm", synthetic_prompts=32, seed=3)


def _train(job: Any, generator: Any, **deps: Any) -> tuple[Any, list[C.MetricEvent]]:
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    events: list[C.MetricEvent] = []
    try:
        result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append, **deps,
                                      generator=generator))
    finally:
        generator.close()
    return result, events


def test_the_settings_take_several_rollout_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.common.settings import SettingsError, load_settings
    from rlvr.services.benchmark.settings import BenchmarkSettings
    from rlvr.services.trainer.settings import TrainerSettings

    assert TrainerSettings().rollout_replicas() == ["127.0.0.1:50054"]  # one, as before
    flags = load_settings(TrainerSettings, ["--rollout-addresses", "h1:50054, h2:50054"])
    assert flags.rollout_replicas() == ["h1:50054", "h2:50054"]
    monkeypatch.setenv("RLVR_BENCHMARK_ROLLOUT_ADDRESSES", "h1:1,h2:2")
    assert load_settings(BenchmarkSettings, []).rollout_replicas() == ["h1:1", "h2:2"]
    monkeypatch.setenv("RLVR_BENCHMARK_ROLLOUT_ADDRESSES", '["h3:3", "h4:4"]')
    assert load_settings(BenchmarkSettings, []).rollout_replicas() == ["h3:3", "h4:4"]
    with pytest.raises(SettingsError, match=r"^setting rollout_addresses \(--rollout-addresses / "
                                            r"RLVR_TRAINER_ROLLOUT_ADDRESSES\) = .*'h1' is not HOST:PORT"):
        load_settings(TrainerSettings, ["--rollout-addresses", "h1,h2:2"])
    with pytest.raises(SettingsError, match=r"h2:2 given twice"):
        load_settings(TrainerSettings, ["--rollout-addresses", "h2:2,h2:2"])
    # settings.json, as the worker hands it to the job process
    again = TrainerSettings.model_validate_json(flags.model_dump_json())
    assert again.rollout_replicas() == ["h1:50054", "h2:50054"]


def test_a_step_is_split_across_replicas_and_put_back_in_prompt_order(replicas: Replicas) -> None:
    from rlvr.peers.types import BASE_MODEL, Sampling
    from rlvr.services.trainer.job.replicas import ReplicatedGenerator
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    sampling = Sampling(temperature=1.0, max_tokens=32, seed=11, group_size=3)
    both = ReplicatedGenerator([replicas.a, replicas.b])
    try:
        before = _served(replicas.a), _served(replicas.b)
        batch = both.generate(prompts, sampling, BASE_MODEL)
        assert (_served(replicas.a), _served(replicas.b)) == (before[0] + 1, before[1] + 1)
        assert batch.prompt_ids == [p for p in prompts for _ in range(3)]
        assert both.generate(prompts, sampling, BASE_MODEL).completion_ids == batch.completion_ids  # seeded
    finally:
        both.close()
    # The first half is what replica A alone makes of it, the second B's: each part carries the step's
    # seed moved to its first prompt (rlvr/seeds.py), so no two parts sample with the same numbers.
    halves = []
    for address, part, first in ((replicas.a, prompts[:2], 0), (replicas.b, prompts[2:], 2)):
        one = ServiceGenerator(address)
        try:
            halves += one.generate(part, sampling.from_prompt(first), BASE_MODEL).completion_ids
        finally:
            one.close()
    assert batch.completion_ids == halves


def test_a_job_spreads_its_rollouts_and_pushes_every_version_to_both(replicas: Replicas) -> None:
    from rlvr.services.trainer.job.replicas import ReplicatedGenerator

    job = _job(replicas.root, replicas.model, "two-replicas", steps=2)
    before = _served(replicas.a), _served(replicas.b)
    result, events = _train(job, ReplicatedGenerator([replicas.a, replicas.b]))
    assert result.status == "completed", result.error
    # Step s generated from version s-1 on both (the trainer checks every completion's stamp) ...
    assert [e.adapter_version for e in events] == [0, 1]
    # ... each replica answered one part of every step ...
    assert (_served(replicas.a) - before[0], _served(replicas.b) - before[1]) == (2, 2)
    # ... and each holds the last version pushed.
    assert _live(replicas.a)[job.adapter_name] == _live(replicas.b)[job.adapter_name] == 2


@pytest.mark.slow  # a chaos run, make test-all (8 s); make test keeps a step split across both replicas
def test_a_job_survives_the_loss_of_a_replica(replicas: Replicas) -> None:
    from rlvr.services.trainer.job.replicas import ReplicatedGenerator

    doomed = replicas.servers.rollout(replicas.model, replicas.root, "replica-doomed")
    replicas.servers.ready(doomed)
    notices: list[str] = []
    generator = ReplicatedGenerator([replicas.a, doomed], on_wait=notices.append)
    killed = threading.Event()

    def kill_after_step_1(step: int, total: int) -> None:
        if step == 1:  # between step 1's update and the push of its adapter
            replicas.servers.kill(doomed)
            killed.set()

    job = _job(replicas.root, replicas.model, "replica-lost", steps=4)
    before = _served(replicas.a)
    result, events = _train(job, generator, on_step=kill_after_step_1)
    assert killed.is_set()
    assert result.status == "completed" and result.steps_done == 4, result.error
    assert [e.adapter_version for e in events] == [0, 1, 2, 3]
    assert any(f"dropped the rollout replica at {doomed}" in m and "going on with 1 of 2" in m for m in notices), notices
    assert generator.dropped and generator.dropped[0].startswith(f"{doomed} (pushing adapter ")
    assert _served(replicas.a) - before == 4  # half of step 1, then every step whole
    assert _live(replicas.a)[job.adapter_name] == 4


def test_no_replica_left_fails_naming_every_address() -> None:
    from rlvr.peers.types import BASE_MODEL, Sampling
    from rlvr.services.trainer.job.replicas import ReplicatedGenerator
    from rlvr.services.trainer.job.rollouts import RolloutGone

    gone = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]  # nothing listens there
    notices: list[str] = []
    generator = ReplicatedGenerator(gone, wait_s=0.0, on_wait=notices.append)
    try:
        with pytest.raises(RuntimeError, match=r"^no rollout replica is SERVING after 0 s: ") as started:
            generator.wait_ready(timeout_s=0.0)
        assert all(a in str(started.value) for a in gone)
        with pytest.raises(RolloutGone, match=r"^no rollout replica is left: ") as caught:
            generator.generate([[5, 6]], Sampling(group_size=2, max_tokens=32), BASE_MODEL)
        # one prompt: one replica tried, dropped, then the other
        assert all(f"{a} (generating at step 0: " in str(caught.value) for a in gone), caught.value
        assert len(notices) == 1 and f"dropped the rollout replica at {gone[0]}" in notices[0]
    finally:
        generator.close()


async def test_the_benchmark_lets_the_live_replica_answer(replicas: Replicas) -> None:
    from rlvr.peers.types import BASE_MODEL, Sampling
    from rlvr.services.benchmark.peers import ServicePeers
    from rlvr.services.benchmark.runner import Question

    down = f"127.0.0.1:{_free_port()}"
    peers = ServicePeers([down, replicas.a], "127.0.0.1:9")
    try:
        model = await peers.rollout_model()
        assert model.address == replicas.a  # GetInfo answered by the one up
        questions = [Question(i, (("user", f"{i}+{i}="),), str(2 * i)) for i in range(4)]
        answers = await peers.generate(questions, Sampling(max_tokens=32), BASE_MODEL)
        assert sorted(a.index for a in answers) == [0, 1, 2, 3]
        assert peers.replicas.all[0].down_until > 0 and peers.replicas.all[1].down_until == 0
    finally:
        await peers.close()


def test_an_evaluation_across_two_replicas(replicas: Replicas, nats_server: Any) -> None:
    from test_rollout_core import make_lora

    from rlvr.clients.sdk import BenchmarkClient

    servers, root = replicas.servers, replicas.root
    (root / "adapters").mkdir(exist_ok=True)
    reward = servers.start("reward")
    benchmark = servers.start("benchmark", "--rollout-addresses", f"{replicas.a},{replicas.b}",
                              "--reward-address", reward, "--nats-url", nats_server.url,
                              "--database-url", f"sqlite:///{root / 'bench.db'}",
                              "--adapter-roots", str(root / "adapters"), "--batch-size", "16")
    servers.ready(reward, benchmark)
    lora = make_lora(Path(replicas.model), root / "adapters" / "eval-lora", seed=5)
    with BenchmarkClient(benchmark) as client:
        def run(**fields: Any) -> B.Evaluation:
            started = client.run_evaluation(B.RunEvaluationRequest(benchmark="rlvr-math-pairs-heldout", **fields))
            list(client.watch_evaluation(B.WatchEvaluationRequest(id=started.id), timeout=300))
            done = client.get_evaluation(B.GetEvaluationRequest(id=started.id))
            assert done.status == B.EVALUATION_STATUS_COMPLETED, done.error
            return done

        before = _served(replicas.a), _served(replicas.b)
        base = run(limit=EVAL_N, sampling=C.SamplingParams(max_tokens=48))
        # Batches of 16, 16 and 8 questions, each split in two: three calls to each replica, and
        # the score build-tiny measured on one process (greedy answers do not depend on the split).
        assert (_served(replicas.a) - before[0], _served(replicas.b) - before[1]) == (3, 3)
        assert base.scores.accuracy == pytest.approx(replicas.heldout_accuracy, abs=1e-12)
        assert base.questions_done == EVAL_N
        tuned = run(limit=16, sampling=C.SamplingParams(max_tokens=32), adapter=C.AdapterSelector(name="eval-lora"),
                    adapter_path=str(lora))
        assert (tuned.adapter_name, tuned.adapter_version) == ("eval-lora", 1)
        assert _live(replicas.a)["eval-lora"] == _live(replicas.b)["eval-lora"] == 1  # uploaded to both


@pytest.mark.slow  # 30 s; `make test-all`: the job and evaluation tests above cover the replicas themselves
def test_a_stack_with_two_rollout_replicas_trains_through_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlvr up --rollout-replicas 2` as the stack runs it: the job process reads both addresses from
    its settings, and a job created through the SDK generates on both and leaves its adapter on both."""
    monkeypatch.setenv("RLVR_TRAINER_TORCH_THREADS", "1")  # the tiny model: one thread steps faster
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # and decodes faster in the rollout servers
    from rlvr.clients.sdk import RolloutClient, connect
    from rlvr.clients.stack import Stack, StackConfig, free_port
    from rlvr.common.auth import ChannelAuth
    from rlvr.v1 import scheduler_pb2 as S

    names = ("scheduler", "trainer", "reward", "rollout", "benchmark", "rollout-2")
    cfg = StackConfig(home=tmp_path, model="rlvr-tiny-test", ports={name: free_port() for name in names},
                      rollout_backend="transformers", rollout_replicas=2, start_timeout=300.0, log_format="text")
    with open(tmp_path / "stack.out", "w") as out:
        running = Stack(cfg, out=out)
        try:
            running.start()
            assert running.wait_serving(), (tmp_path / "stack.out").read_text()
            spec = C.JobSpec(name="two-replicas", base_model="rlvr-tiny-test")
            spec.reward.synthetic_prompts = 16
            g = spec.grpo
            g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, 2
            g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
            spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM  # through the rollout service(s)
            spec.advanced.loss_type = C.LOSS_TYPE_DAPO
            with connect(running.client_settings()) as client:
                job_id = client.scheduler.create_job(S.CreateJobRequest(spec=spec)).job.id
                list(client.scheduler.watch(job_id, timeout=300))
                job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
            assert job.status == C.JOB_STATUS_COMPLETED, job.error
            for name in ("rollout", "rollout-2"):
                with RolloutClient(cfg.addresses[name], auth=ChannelAuth(token=running.service_token)) as rollout:
                    assert rollout.get_info().generate_calls == 2, name  # half of each step's prompts
                    assert {a.name: a.version for a in rollout.list_adapters().adapters}[job.adapter.name] == 2
        finally:
            running.stop()
