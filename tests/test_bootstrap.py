"""The service bootstrap every service shares: health, reflection, graceful shutdown, settings."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlvr.clients.stack import free_port
from rlvr.common.errors import FailedPrecondition, NotFound, map_errors
from rlvr.common.settings import SettingsError, load_settings
from rlvr.services.common.server import GrpcService, ServiceRunner
from rlvr.services.reward.settings import RewardSettings
from rlvr.services.scheduler.settings import SchedulerSettings
from rlvr.v1 import common_pb2, reward_pb2, reward_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "tools" / "grpc_probe.py"  # a client that knows nothing of rlvr


@map_errors
class SlowReward(reward_pb2_grpc.RewardServiceServicer):
    """Score sleeps, so shutdown can be observed with a call in flight; other RPCs raise core errors."""

    async def Score(self, request, context):  # noqa: N802 (gRPC method name)
        await asyncio.sleep(1.0)
        return reward_pb2.ScoreResponse(results=[common_pb2.RewardComponents(reward=1.0)])

    async def GetProblems(self, request, context):  # noqa: N802
        if request.limit < 0:
            raise ValueError(f"limit: {request.limit} is out of range; allowed: >= 0")
        if request.limit == 1:
            raise NotFound("dataset 'x' not found")
        if request.limit == 2:
            raise FailedPrecondition("busy")
        raise RuntimeError("secret internal detail")


def _service() -> GrpcService:
    name = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name
    return GrpcService([(reward_pb2_grpc.add_RewardServiceServicer_to_server, SlowReward(), name)])


async def test_health_serving_and_error_mapping() -> None:
    settings = RewardSettings(port=0)
    async with ServiceRunner(_service(), settings) as runner, grpc.aio.insecure_channel(runner.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "rlvr.v1.RewardService"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reward_pb2_grpc.RewardServiceStub(ch)
        cases = {-1: grpc.StatusCode.INVALID_ARGUMENT, 1: grpc.StatusCode.NOT_FOUND,
                 2: grpc.StatusCode.FAILED_PRECONDITION, 3: grpc.StatusCode.INTERNAL}
        for limit, code in cases.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetProblems(reward_pb2.GetProblemsRequest(limit=limit), timeout=5)
            assert err.value.code() == code
            if limit == -1:
                assert err.value.details() == "limit: -1 is out of range; allowed: >= 0"
        # INTERNAL never carries the cause or a stack trace to the client.
        assert "secret" not in err.value.details() and "Traceback" not in err.value.details()


async def test_undecodable_bytes_are_invalid_argument_on_the_standard_and_the_sync_handlers() -> None:
    """Raw bytes that do not parse, sent to the standard health service's List (grpcio's asyncio
    servicer leaves it a plain, unimplemented function), to server reflection and to an RPC the
    servicer does not implement (the generated base class's sync method): INVALID_ARGUMENT naming
    the message, never UNKNOWN with the Python exception. List itself answers every status."""
    bad = b"\x0a\xff\xff"  # field 1, a length that breaks off
    async with ServiceRunner(_service(), RewardSettings(port=0)) as runner, \
            grpc.aio.insecure_channel(runner.address) as ch:
        for method in ("/grpc.health.v1.Health/List", "/grpc.health.v1.Health/Check",
                       "/rlvr.v1.RewardService/ListRewardFunctions"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(method)(bad, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
            assert "do not parse" in (err.value.details() or "") and "DecodeError" not in (err.value.details() or "")
        reflection = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")(iter([bad]),
                                                                                                     timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await reflection.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        listed = await health_pb2_grpc.HealthStub(ch).List(health_pb2.HealthListRequest(), timeout=5)
        assert {name: s.status for name, s in listed.statuses.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING, "rlvr.v1.RewardService": health_pb2.HealthCheckResponse.SERVING}


async def test_in_flight_call_finishes_on_shutdown() -> None:
    runner = ServiceRunner(_service(), RewardSettings(port=0))
    await runner.start()
    async with grpc.aio.insecure_channel(runner.address) as ch:
        call = reward_pb2_grpc.RewardServiceStub(ch).Score(reward_pb2.ScoreRequest(), timeout=10)
        await asyncio.sleep(0.3)  # the call is in flight
        await runner.stop(grace=5.0)
        resp = await call
        assert resp.results[0].reward == 1.0


def test_reflection_and_health_by_an_outside_client() -> None:
    """tests/tools/grpc_probe.py knows nothing of rlvr (reflection and health only): the scheduler's
    reflection must describe its methods and health report it SERVING."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.services.scheduler.main", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_serving(f"127.0.0.1:{port}")
        out = subprocess.run([sys.executable, str(PROBE), f"127.0.0.1:{port}"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "rlvr.v1.SchedulerService SERVING" in out.stdout and "CreateJob" in out.stdout
        assert "serving 1/1" in out.stdout
        # SIGTERM: graceful, exit code 0, promptly.
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            proc.kill()


def test_port_in_use_is_one_clear_line() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "rlvr.services.reward.main", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "RLVR_REWARD_PORT" in lines[0] and str(port) in lines[0] and "Traceback" not in out.stderr


def test_settings_precedence_flag_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "rlvr.toml"
    cfg.write_text('log_level = "WARNING"\n[scheduler]\nport = 6001\nbenchmark_address = "b:1"\n')
    s = load_settings(SchedulerSettings, ["--config", str(cfg)])
    assert (s.port, s.log_level, s.benchmark_address) == (6001, "WARNING", "b:1")
    monkeypatch.setenv("RLVR_SCHEDULER_PORT", "6002")
    assert load_settings(SchedulerSettings, ["--config", str(cfg)]).port == 6002
    assert load_settings(SchedulerSettings, ["--config", str(cfg), "--port", "6003"]).port == 6003
    with pytest.raises(SettingsError, match=r"port .*RLVR_SCHEDULER_PORT.*70000"):
        load_settings(SchedulerSettings, ["--port", "70000"])
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(SchedulerSettings, ["--config", str(tmp_path / "missing.toml")])


def test_every_settings_field_is_documented() -> None:
    from rlvr.services.benchmark.settings import BenchmarkSettings
    from rlvr.services.rollout.settings import RolloutSettings
    from rlvr.services.trainer.settings import TrainerSettings

    for cls in (SchedulerSettings, TrainerSettings, RolloutSettings, RewardSettings, BenchmarkSettings):
        undocumented = [n for n, f in cls.model_fields.items() if not f.description]
        assert not undocumented, f"{cls.__name__}: {undocumented}"


def test_help_answers_without_heavy_imports() -> None:
    code = ("import sys; from rlvr.services.rollout.main import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--max-lora-rank" in out.stdout and "RLVR_ROLLOUT_" in out.stdout


def _free_port() -> int:
    return free_port()  # the stack's own helper; other test modules import this name


def _wait_serving(address: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{address} not SERVING after {timeout} s")


@pytest.mark.parametrize("flag,value,setting", [
    ("--database-url", "postgresql+psycopg://nobody@127.0.0.1:1/none", "database_url"),
    ("--nats-url", "nats://127.0.0.1:1", "nats_url"),
])
def test_unreachable_dependency_is_one_line_naming_the_setting(flag: str, value: str, setting: str,
                                                                 tmp_path: Path, nats_server) -> None:
    args = ["--port", "0", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}", "--nats-url", nats_server.url,
            "--artifact-root", str(tmp_path / "artifacts"), flag, value]
    out = subprocess.run([sys.executable, "-m", "rlvr.services.scheduler.main", *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    # The structured log lines go to stderr too; the error itself is one line for a person.
    errors = [line for line in out.stderr.splitlines() if line.startswith("rlvr-scheduler: error:")]
    assert len(errors) == 1 and setting in errors[0] and "Traceback" not in out.stderr, out.stderr


def _service_settings() -> dict[str, type]:
    """Every console script of pyproject.toml but `rlvr` is a service's: its settings class, by name."""
    import importlib
    import tomllib

    from rlvr.common.settings import ServiceSettings

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for target in scripts.values():
        importlib.import_module(target.partition(":")[0])
    found, todo = {}, list(ServiceSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("rlvr.services."):
            found[f"rlvr-{cls.service_name}"] = cls
    assert sorted(found) == sorted(s for s in scripts if s != "rlvr")
    return found


def test_every_flag_of_every_service_prints_a_true_default(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--help` of each service names each flag's default as the value that flag would take (given
    back as the flag, it changes nothing), or in words where it depends on where the service starts."""
    import importlib
    import os
    import re
    import tomllib

    from rlvr.common.settings import build_parser

    for name in [n for n in os.environ if n.startswith("RLVR_")]:
        monkeypatch.delenv(name)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for script, cls in _service_settings().items():
        module, _, func = scripts[script].partition(":")
        with pytest.raises(SystemExit):
            getattr(importlib.import_module(module), func)(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "Undefined" not in text, script
        if "data_roots" in cls.model_fields:
            assert "default: the folder the service starts in]" in text, script
        defaults = load_settings(cls, [])
        for action in build_parser(cls, script, "")._actions:
            field = action.dest
            if field not in cls.model_fields or cls.model_fields[field].annotation is bool:
                continue
            shown = re.search(r"; default: (.*)\]\Z", action.help or "", re.S)
            assert shown, (script, field, action.help)
            value = shown.group(1)
            if value == "unset" or value.startswith("the folder the service starts in"):
                continue
            given = load_settings(cls, [action.option_strings[0], value])
            assert getattr(given, field) == getattr(defaults, field), (script, field, value)
