"""Prometheus /metrics (docs/metrics.md): every service of a real `rlvr up --metrics` stack is
scraped, and the counters move with the work done (N Score calls: the Score counter rose by N);
one service in-process for the RPC series' status codes; the Grafana dashboard names only
metrics that exist."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlvr.services.common.server import ServiceRunner
from rlvr.services.reward.server import build_service
from rlvr.services.reward.settings import RewardSettings
from rlvr.v1 import reward_pb2, reward_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "rlvr.json"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when the series does not exist yet (a counter before its first increment)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def rpc(samples: Samples, method: str, code: str = "OK", service: str = "rlvr.v1.RewardService") -> float:
    return value(samples, "rlvr_grpc_server_handled_total", grpc_service=service, grpc_method=method, grpc_code=code)


def _items(n: int) -> list[reward_pb2.ScoreItem]:
    return [reward_pb2.ScoreItem(completion=f"<think>x</think><answer>{i}</answer>", ground_truth="1")
            for i in range(n)]


async def test_rpc_counts_and_latencies_by_method_and_code(tmp_path: Path) -> None:
    settings = RewardSettings(port=0, metrics_port=0, data_roots=[tmp_path])
    async with ServiceRunner(build_service(settings), settings) as runner:
        url = f"http://127.0.0.1:{runner.metrics.port}/metrics"
        before = scrape(url)
        async with grpc.aio.insecure_channel(runner.address) as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            for _ in range(3):
                await stub.Score(reward_pb2.ScoreRequest(key="math_pairs", items=_items(4)))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.Score(reward_pb2.ScoreRequest(key="no-such-reward", items=_items(1)))
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A call is counted when its handler has returned; an aborted one's status reaches the client
        # first (context.abort sends it, then raises), so its count may come a moment after.
        after, deadline = scrape(url), time.monotonic() + 10
        while rpc(after, "Score", "INVALID_ARGUMENT") == rpc(before, "Score", "INVALID_ARGUMENT") \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            after = scrape(url)
    assert rpc(after, "Score") - rpc(before, "Score") == 3
    assert rpc(after, "Score", "INVALID_ARGUMENT") - rpc(before, "Score", "INVALID_ARGUMENT") == 1
    latency = {"grpc_service": "rlvr.v1.RewardService", "grpc_method": "Score", "grpc_code": "OK"}
    assert value(after, "rlvr_grpc_server_handling_seconds_count", **latency) == 3
    assert value(after, "rlvr_grpc_server_handling_seconds_sum", **latency) > 0
    assert value(after, "rlvr_grpc_server_handling_seconds_bucket", **latency, le="+Inf") == 3
    assert value(after, "rlvr_reward_items_scored_total") - value(before, "rlvr_reward_items_scored_total") == 12
    assert value(after, "rlvr_reward_item_timeouts_total") == 0


def test_metrics_are_off_unless_a_port_is_set() -> None:
    assert RewardSettings().metrics_port is None


# ---------------------------------------------------------------- every service of a real stack

SERVICES = ("scheduler", "trainer", "reward", "rollout", "benchmark")
OWN_SERIES = {  # each service's own series, present from its start
    "scheduler": ["rlvr_scheduler_queue_depth", "rlvr_scheduler_jobs"],
    "trainer": ["rlvr_trainer_busy", "rlvr_trainer_step_seconds_count"],
    "reward": ["rlvr_reward_items_scored_total", "rlvr_reward_item_timeouts_total"],
    "rollout": ["rlvr_rollout_generated_tokens_total", "rlvr_rollout_requests_running", "rlvr_rollout_adapters_loaded"],
    "benchmark": ["rlvr_benchmark_evaluations_running", "rlvr_benchmark_evaluations"],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """`rlvr up --metrics` with the transformers rollout backend (the lighter start), as a user runs it."""
    home = tmp_path_factory.mktemp("metrics-stack")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.clients.cli", "up", "--home", str(home), "--base-port", "0",
                             "--model", "rlvr-tiny-test", "--rollout-backend", "transformers", "--no-web",
                             "--metrics", "--start-timeout", "240"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "rlvr is up" in line or proc.poll() is not None:
                break
        assert any("rlvr is up" in line for line in lines), "".join(lines)
        yield json.loads((home / "stack.json").read_text()), "".join(lines)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_every_service_of_the_stack_serves_its_metrics(stack) -> None:
    state, out = stack
    assert set(state["metrics"]) == set(SERVICES)
    for name, url in state["metrics"].items():
        assert re.search(rf"^{name}\s.*SERVING  metrics :{url.rsplit(':', 1)[1].split('/')[0]}$", out, re.M), out
        samples = scrape(url)
        names = {n for n, _ in samples}
        for series in OWN_SERIES[name]:
            assert series in names, (name, series)
        # `rlvr up` waited on each one's health check: counted like any RPC.
        assert rpc(samples, "Check", service="grpc.health.v1.Health") >= 1, name
    scheduler = scrape(state["metrics"]["scheduler"])
    assert {dict(labels)["status"] for n, labels in scheduler if n == "rlvr_scheduler_jobs"} >= {
        "QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"}
    assert value(scrape(state["metrics"]["trainer"]), "rlvr_trainer_busy") == 0


def test_the_counters_move_with_the_work_done(stack) -> None:
    state, _ = stack
    token = json.loads(Path(state["tokens_file"]).read_text())
    service_token = next(t for t, role in token.items() if role == "service")
    auth = (("authorization", f"Bearer {service_token}"),)
    reward_url, rollout_url = state["metrics"]["reward"], state["metrics"]["rollout"]

    before = scrape(reward_url)
    with grpc.insecure_channel(state["addresses"]["reward"]) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        for _ in range(5):
            stub.Score(reward_pb2.ScoreRequest(key="math_pairs", items=_items(3)), metadata=auth)
    after = scrape(reward_url)
    assert rpc(after, "Score") - rpc(before, "Score") == 5
    assert value(after, "rlvr_reward_items_scored_total") - value(before, "rlvr_reward_items_scored_total") == 15

    from rlvr.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

    before = scrape(rollout_url)
    with grpc.insecure_channel(state["addresses"]["rollout"]) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        responses = list(stub.Generate(rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.Prompt(text="1 + 1 =")], n=2,
            sampling=common_pb2.SamplingParams(max_tokens=32, temperature=1.0, seed=3)), metadata=auth))
    tokens = sum(len(c.token_ids) for r in responses for c in r.completions)
    after = scrape(rollout_url)
    assert tokens > 0
    assert value(after, "rlvr_rollout_generated_tokens_total") - value(before, "rlvr_rollout_generated_tokens_total") \
        == tokens
    assert value(after, "rlvr_rollout_completions_total") - value(before, "rlvr_rollout_completions_total") == 2
    assert rpc(after, "Generate", service="rlvr.v1.RolloutService") - \
        rpc(before, "Generate", service="rlvr.v1.RolloutService") == 1
    assert value(after, "rlvr_rollout_requests_running") == 0

    # A call the auth check refuses still counts, with its code.
    before = scrape(reward_url)
    with grpc.insecure_channel(state["addresses"]["reward"]) as channel, pytest.raises(grpc.RpcError) as refused:
        reward_pb2_grpc.RewardServiceStub(channel).Score(reward_pb2.ScoreRequest(key="math_pairs", items=_items(1)))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # An aborted call's status reaches the client before the interceptor that counts it has run
    # to its end: the count is read until it moves (a fresh-clone run read it a moment too soon).
    deadline = time.monotonic() + 10
    while True:
        after = scrape(reward_url)
        moved = rpc(after, "Score", "UNAUTHENTICATED") - rpc(before, "Score", "UNAUTHENTICATED")
        if moved or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert moved == 1


# ---------------------------------------------------------------- the Grafana dashboard


def _documented_metrics() -> set[str]:
    """The metric names docs/metrics.md lists (its table's first column)."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `(rlvr_[a-z_]+)`", text, re.M))


def test_the_dashboard_names_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\brlvr_[a-z_]+", e)}
    suffixes = ("_bucket", "_count", "_sum")
    bases = {next((u.removesuffix(s) for s in suffixes if u.endswith(s)), u) for u in used}
    documented = _documented_metrics()
    assert bases <= documented, bases - documented
    # Every service has at least one panel.
    for prefix in ("rlvr_scheduler_", "rlvr_trainer_", "rlvr_rollout_", "rlvr_reward_", "rlvr_benchmark_",
                   "rlvr_grpc_server_"):
        assert any(b.startswith(prefix) for b in bases), prefix


def test_the_docs_list_every_metric_the_services_declare() -> None:
    """docs/metrics.md names each series the code declares (a new metric without its line fails)."""
    declared = set()
    for path in (ROOT / "services").rglob("*.py"):
        declared |= set(re.findall(r'"(rlvr_[a-z_]+)"', path.read_text()))
    declared = {d.removesuffix("_total") if d.endswith("_total") else d for d in declared}
    documented = {d.removesuffix("_total") for d in _documented_metrics()}
    assert declared == documented, (declared ^ documented)


def test_a_service_with_metrics_on_says_where_at_start(tmp_path: Path) -> None:
    """--metrics-port 0 picks a free port, and the log line names its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.services.reward.main", "--port", "0", "--metrics-port", "0",
                             "--data-roots", str(tmp_path), "--log-format", "text"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        url = None
        for line in proc.stderr:  # type: ignore[union-attr]
            found = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
            if found:
                url = found.group(0)
                break
            assert time.monotonic() < deadline
        assert url is not None
        for _ in range(100):
            try:
                assert "rlvr_reward_items_scored_total" in {n for n, _ in scrape(url)}
                break
            except OSError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---------------------------------------------------------------- the trainer's steps


async def test_the_trainer_counts_the_steps_it_ran_and_their_time(nats_server, tmp_path: Path) -> None:
    """A 2-step job on a trainer in-process: busy while it runs, then 2 steps whose seconds sum to
    the step_seconds of the job's metric events."""
    from fixtures_infra import connected_bus
    from fixtures_trainer import job_events
    from test_trainer_service import _request, _settings

    from rlvr.peers.base import make_channel
    from rlvr.services.trainer.server import build_service as build_trainer
    from rlvr.tiny.build import build_tiny_model, default_model_dir
    from rlvr.v1 import trainer_pb2_grpc

    model = build_tiny_model(default_model_dir("trainer-tests-tiny-test"), size="test").path
    settings = _settings(tmp_path, nats_server.url)
    async with ServiceRunner(build_trainer(settings), settings) as runner, connected_bus(nats_server.url) as bus:
        registry = runner.metrics.registry
        assert registry.get_sample_value("rlvr_trainer_busy") == 0
        assert registry.get_sample_value("rlvr_trainer_step_seconds_count") == 0
        channel = make_channel(runner.address, aio=True)
        job_id = f"metrics-{time.monotonic_ns()}"
        await trainer_pb2_grpc.TrainerServiceStub(channel).StartJob(_request(job_id, model, max_steps=2))
        assert registry.get_sample_value("rlvr_trainer_busy") == 1
        events, _ = await job_events(bus, job_id, timeout_s=180)
        for _ in range(100):  # the worker notices the exit just after the process published its end
            if registry.get_sample_value("rlvr_trainer_busy") == 0:
                break
            await asyncio.sleep(0.1)
        assert registry.get_sample_value("rlvr_trainer_busy") == 0
        assert registry.get_sample_value("rlvr_trainer_step_seconds_count") == len(events) == 2
        assert registry.get_sample_value("rlvr_trainer_step_seconds_sum") == pytest.approx(
            sum(e.step_seconds for e in events))
        assert registry.get_sample_value("rlvr_grpc_server_handled_total", {
            "grpc_service": "rlvr.v1.TrainerService", "grpc_method": "StartJob", "grpc_code": "OK"}) == 1
        await channel.close()
