"""Token auth and TLS on the real services: the five services in-process (ServiceRunner), the rollout
server on the transformers backend with the tiny test model, embedded NATS, SQLite.

With auth on, every RPC of every service, walked from the descriptors, refuses a call without a
token and one with a wrong token (UNAUTHENTICATED, the token never echoed); health and reflection
stay open; a user token may not call the internal RPCs (PERMISSION_DENIED naming the RPC and the
role), yet the SDK with that user token trains a job through the scheduler, which takes the service
token to the trainer, and the trainer's job process to the rollout and reward services. Over TLS
the same job runs end to end with the CA given to the client, a plaintext client to a TLS port
fails, and mutual TLS refuses a client without a certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures_tls import Pki, make_pki
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlvr.common.auth import SERVICE_ONLY
from rlvr.common.settings import SettingsError
from rlvr.services.common.server import ServiceRunner
from rlvr.v1 import benchmark_pb2, common_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2

MODEL = "rlvr-tiny-test"
SERVICE_TOKEN = "service-token-for-the-tests-0123456789"
USER_TOKEN = "user-token-for-the-tests-0123456789"
WRONG_TOKEN = "wrong-token-QzQzQzQz"
MODULES = {"scheduler": scheduler_pb2, "trainer": trainer_pb2, "reward": reward_pb2, "rollout": rollout_pb2,
           "benchmark": benchmark_pb2}


@dataclass
class SecuredStack:
    addresses: dict[str, str]
    pki: Pki | None

    def client_settings(self, **overrides: Any) -> Any:
        from rlvr.clients.sdk import ClientSettings

        values: dict[str, Any] = {f"{name}_address": address for name, address in self.addresses.items()}
        if self.pki is not None:
            values["ca_file"] = self.pki.ca
        return ClientSettings(**{**values, **overrides})


@contextlib.asynccontextmanager
async def secured_stack(root: Path, nats_url: str, pki: Pki | None = None) -> AsyncIterator[SecuredStack]:
    """The five services with auth on (a shared service token and a tokens file with a user token),
    over TLS when `pki` is given (each service calls its peers over TLS, trusting the CA)."""
    from rlvr.services.benchmark.server import build_service as benchmark
    from rlvr.services.benchmark.settings import BenchmarkSettings
    from rlvr.services.reward.server import build_service as reward
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.services.rollout.server import build_service as rollout
    from rlvr.services.rollout.settings import RolloutSettings
    from rlvr.services.scheduler.server import build_service as scheduler
    from rlvr.services.scheduler.settings import SchedulerSettings
    from rlvr.services.trainer.server import build_service as trainer
    from rlvr.services.trainer.settings import TrainerSettings

    root.mkdir(parents=True, exist_ok=True)
    tokens_file = root / "tokens.json"
    tokens_file.write_text(json.dumps({USER_TOKEN: "user"}))
    common: dict[str, Any] = {"port": 0, "auth_token": SERVICE_TOKEN, "auth_tokens_file": tokens_file}
    if pki is not None:
        common |= {"tls_cert_file": pki.cert, "tls_key_file": pki.key, "tls_ca_file": pki.ca}
    db = f"sqlite:///{root / 'rlvr.db'}"
    artifacts = root / "artifacts"
    addresses: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        async def start(name: str, build: Any, settings: Any) -> None:
            runner = await stack.enter_async_context(ServiceRunner(build(settings), settings))
            addresses[name] = runner.address

        await start("reward", reward, RewardSettings(**common, data_roots=[root]))
        await start("rollout", rollout, RolloutSettings(**common, model=MODEL, backend="transformers",
                                                        max_model_len=512, adapter_root=root / "rollout"))
        peers = {"rollout_address": addresses["rollout"], "reward_address": addresses["reward"]}
        await start("trainer", trainer, TrainerSettings(**common, **peers, nats_url=nats_url, artifact_root=artifacts,
                                                        torch_threads=1, worker_name="auth-trainer"))
        await start("benchmark", benchmark, BenchmarkSettings(**common, **peers, nats_url=nats_url, database_url=db,
                                                              adapter_roots=[artifacts]))
        await start("scheduler", scheduler, SchedulerSettings(
            **common, nats_url=nats_url, database_url=db, artifact_root=artifacts, data_roots=[root],
            trainer_addresses=[addresses["trainer"]], benchmark_address=addresses["benchmark"]))
        yield SecuredStack(addresses, pki)


def _job_spec(name: str) -> common_pb2.JobSpec:
    """One step through the rollout server (generation) and the reward service (scores)."""
    spec = common_pb2.JobSpec(name=name, base_model=MODEL)
    spec.reward.function = common_pb2.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.max_steps, g.group_size, g.batch_size, g.max_completion_tokens, g.lora_rank = 1, 2, 4, 32, 4
    return spec


def _train_one_step(settings: Any, name: str) -> common_pb2.Job:
    from rlvr.clients.sdk import connect

    with connect(settings) as rlvr:
        job = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=_job_spec(name))).job
        events = list(rlvr.scheduler.watch(job.id, timeout=300))
        assert events and events[-1].status.status == common_pb2.JOB_STATUS_COMPLETED, events[-1] if events else None
        done = rlvr.scheduler.get_job(scheduler_pb2.GetJobRequest(id=job.id))
        assert done.status == common_pb2.JOB_STATUS_COMPLETED, done.error
        assert done.adapter.version == 1  # pushed to the rollout server by the trainer's job process
        return done


async def _raw_call(channel: grpc.aio.Channel, method: Any, metadata: tuple[tuple[str, str], ...]) -> None:
    """One call of `method` with an empty request and `metadata`; raises AioRpcError."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:
        await channel.stream_unary(path)(iter([b""]), metadata=metadata, timeout=10)
    elif method.server_streaming:
        async for _ in channel.unary_stream(path)(b"", metadata=metadata, timeout=10):
            break
    else:
        await channel.unary_unary(path)(b"", metadata=metadata, timeout=10)


async def _refused(channel: grpc.aio.Channel, method: Any, metadata: tuple[tuple[str, str], ...]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _raw_call(channel, method, metadata)
    return info.value


async def _health(channel: grpc.aio.Channel) -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return response.status


def _dispatch_and_cancel(settings: Any) -> None:
    from rlvr.clients.sdk import connect

    with connect(settings) as rlvr:
        job = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=_job_spec("auth"))).job
        running = False
        for event in rlvr.scheduler.watch(job.id, timeout=120):
            status = event.status.status if event.HasField("status") else None
            if status == common_pb2.JOB_STATUS_RUNNING and not running:  # the trainer took StartJob
                running = True
                rlvr.scheduler.cancel_job(scheduler_pb2.CancelJobRequest(id=job.id))
            elif status in (common_pb2.JOB_STATUS_COMPLETED, common_pb2.JOB_STATUS_FAILED):
                raise AssertionError(f"the job ended {event.status} before its cancel")
        done = rlvr.scheduler.get_job(scheduler_pb2.GetJobRequest(id=job.id))
        assert running and done.status == common_pb2.JOB_STATUS_CANCELLED, done


def _user_and_service_calls(stack: SecuredStack) -> None:
    """The user token: StartJob on a trainer is refused, public RPCs answer on every service; the
    service token gets past auth on the trainer (to the request's own check)."""
    from rlvr.clients.sdk import connect
    from rlvr.peers.base import RlvrError

    with connect(stack.client_settings(token=USER_TOKEN)) as rlvr:
        with pytest.raises(RlvrError) as denied:
            rlvr.trainer.start_job(trainer_pb2.StartJobRequest(job_id="bypass"))
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "rlvr.v1.TrainerService/StartJob" in denied.value.details
        assert "SchedulerService/CreateJob" in denied.value.details
        assert rlvr.reward.list_reward_functions().functions
        assert rlvr.rollout.get_info().model
        assert rlvr.benchmark.list_benchmarks().benchmarks
        assert rlvr.scheduler.list_jobs().jobs == []
    with connect(stack.client_settings(token=SERVICE_TOKEN)) as rlvr:
        assert rlvr.trainer.get_worker_status().worker == "auth-trainer"
        with pytest.raises(RlvrError) as refused:
            rlvr.trainer.start_job(trainer_pb2.StartJobRequest())
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT  # past auth: the request's own check


async def test_auth_on_every_service(tmp_path: Path, nats_server: Any, tiny_rollout_ready: None) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with secured_stack(tmp_path, nats_server.url) as stack:
        walked = 0
        for name, module in MODULES.items():
            (service,) = module.DESCRIPTOR.services_by_name.values()
            async with grpc.aio.insecure_channel(stack.addresses[name]) as channel:
                for method in service.methods:
                    rpc = f"{service.full_name}/{method.name}"
                    missing = await _refused(channel, method, ())
                    assert missing.code() == grpc.StatusCode.UNAUTHENTICATED, (rpc, missing.details())
                    assert "authorization: Bearer <token>" in missing.details() and rpc in missing.details()
                    wrong = await _refused(channel, method, (("authorization", f"Bearer {WRONG_TOKEN}"),))
                    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED, (rpc, wrong.details())
                    assert WRONG_TOKEN not in wrong.details() and "not valid" in wrong.details()
                    basic = await _refused(channel, method, (("authorization", f"Basic {USER_TOKEN}"),))
                    assert basic.code() == grpc.StatusCode.UNAUTHENTICATED and USER_TOKEN not in basic.details()
                    if rpc in SERVICE_ONLY:
                        denied = await _refused(channel, method, (("authorization", f"Bearer {USER_TOKEN}"),))
                        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED, (rpc, denied.details())
                        assert rpc in denied.details() and "role service" in denied.details()
                        assert "role user" in denied.details()
                    walked += 1
                # Health and reflection need no token.
                assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
                reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
                async for answer in reflection.ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5):
                    assert service.full_name in {s.name for s in answer.list_services_response.service}
                    break
        assert walked == sum(len(m.DESCRIPTOR.services_by_name[n].methods) for m in MODULES.values()
                             for n in m.DESCRIPTOR.services_by_name)
        assert "rlvr.v1.TrainerService/StartJob" in SERVICE_ONLY

        await asyncio.to_thread(_user_and_service_calls, stack)
        # The SDK with the user token creates a job through the scheduler, which starts it on the
        # trainer and cancels it there with the service token (both internal RPCs). The TLS test
        # trains one to the end.
        await asyncio.to_thread(_dispatch_and_cancel, stack.client_settings(token=USER_TOKEN))


def _tls_calls(stack: SecuredStack, settings: Any) -> None:
    """A real call on each service over TLS; plaintext to each TLS port fails."""
    from rlvr.clients.sdk import connect
    from rlvr.peers.base import check_health

    with connect(settings) as rlvr:  # a real call on each service, over TLS
        assert rlvr.reward.list_reward_functions().functions
        assert rlvr.rollout.get_info().model
        assert rlvr.benchmark.list_benchmarks().benchmarks
        assert rlvr.scheduler.list_jobs().jobs == []
    with connect(stack.client_settings(token=SERVICE_TOKEN)) as rlvr:
        assert rlvr.trainer.get_worker_status().worker == "auth-trainer"
    for name, address in stack.addresses.items():
        assert check_health(address, auth=settings.auth()) == "SERVING", name
        # Plaintext to a TLS port: no answer, whatever the token (a raw channel: no retries).
        (service,) = MODULES[name].DESCRIPTOR.services_by_name.values()
        with grpc.insecure_channel(address) as channel:
            for method in service.methods:
                if method.client_streaming or method.server_streaming:
                    continue
                with pytest.raises(grpc.RpcError) as plain:
                    channel.unary_unary(f"/{service.full_name}/{method.name}")(
                        b"", metadata=(("authorization", f"Bearer {SERVICE_TOKEN}"),), timeout=10)
                assert plain.value.code() == grpc.StatusCode.UNAVAILABLE, (name, method.name, plain.value)


async def test_tls_stack_serves_a_job_and_refuses_plaintext(tmp_path: Path, nats_server: Any,
                                                            tiny_rollout_ready: None) -> None:
    pki = make_pki(tmp_path / "pki")
    async with secured_stack(tmp_path / "stack", nats_server.url, pki) as stack:
        settings = stack.client_settings(token=USER_TOKEN)
        await asyncio.to_thread(_tls_calls, stack, settings)
        await asyncio.to_thread(_train_one_step, settings, "tls")


async def test_mutual_tls_needs_a_client_certificate(tmp_path: Path) -> None:
    from rlvr.clients.sdk import connect
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings

    pki = make_pki(tmp_path / "pki")
    settings = RewardSettings(port=0, data_roots=[tmp_path], auth_token=SERVICE_TOKEN, tls_cert_file=pki.cert,
                              tls_key_file=pki.key, tls_ca_file=pki.ca, tls_client_auth=True)
    async with ServiceRunner(build_service(settings), settings) as runner:
        stack = SecuredStack({"reward": runner.address}, pki)

        def calls() -> None:
            with connect(stack.client_settings(token=SERVICE_TOKEN, cert_file=pki.client_cert,
                                               key_file=pki.client_key)) as rlvr:
                assert rlvr.reward.list_reward_functions().functions
            # Without a certificate (a raw channel: no retries), the handshake fails.
            credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
            with grpc.secure_channel(runner.address, credentials) as channel, pytest.raises(grpc.RpcError) as e:
                channel.unary_unary("/rlvr.v1.RewardService/ListRewardFunctions")(
                    b"", metadata=(("authorization", f"Bearer {SERVICE_TOKEN}"),), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE

        await asyncio.to_thread(calls)


async def test_no_auth_beyond_loopback_is_refused_unless_allowed(tmp_path: Path) -> None:
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings

    exposed = RewardSettings(host="0.0.0.0", port=0, data_roots=[tmp_path])
    with pytest.raises(SettingsError, match=r"host .* = '0.0.0.0': serving beyond loopback without auth is "
                                            r"refused.*RLVR_ALLOW_INSECURE=true"):
        async with ServiceRunner(build_service(exposed), exposed):
            pass
    for allowed in (RewardSettings(host="0.0.0.0", port=0, data_roots=[tmp_path], allow_insecure=True),
                    RewardSettings(host="0.0.0.0", port=0, data_roots=[tmp_path], auth_token=SERVICE_TOKEN)):
        async with ServiceRunner(build_service(allowed), allowed) as runner:
            assert runner.port > 0


def test_token_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RLVR_AUTH_TOKEN sets every service's shared token; a tokens file with a bad role, or TLS with
    half a key pair, is one line naming the setting."""
    from rlvr.common.auth import server_tls, token_table
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.services.trainer.settings import TrainerSettings

    monkeypatch.setenv("RLVR_AUTH_TOKEN", SERVICE_TOKEN)
    for cls in (RewardSettings, TrainerSettings):
        table = token_table(cls())
        assert table.role_of(SERVICE_TOKEN) == "service" and table.role_of(USER_TOKEN) is None
        assert SERVICE_TOKEN not in repr(cls())
    monkeypatch.setenv("RLVR_REWARD_AUTH_TOKEN", "own")  # the service's own variable wins
    assert token_table(RewardSettings()).role_of("own") == "service"
    monkeypatch.delenv("RLVR_REWARD_AUTH_TOKEN")
    monkeypatch.delenv("RLVR_AUTH_TOKEN")
    secret = tmp_path / "secret"
    secret.write_text(f"{SERVICE_TOKEN}\n")
    assert token_table(RewardSettings(auth_token_file=secret)).role_of(SERVICE_TOKEN) == "service"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({USER_TOKEN: "admin"}))
    with pytest.raises(SettingsError, match=r"auth_tokens_file .*entry 1 has role 'admin'; allowed: user, service"):
        token_table(RewardSettings(auth_tokens_file=tokens))
    assert not token_table(RewardSettings()).enabled
    with pytest.raises(SettingsError, match="TLS needs both tls_cert_file and tls_key_file"):
        server_tls(RewardSettings(tls_cert_file=secret))


@pytest.fixture(scope="module")
def tiny_rollout_ready() -> None:
    """The bundled test model, built (or found) once before a stack starts on it."""
    from rlvr.models import resolve_model

    resolve_model(MODEL)


def test_the_sdk_takes_the_local_stacks_token_only_for_that_stack(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.clients.sdk import ClientSettings
    from rlvr.common.client import DEFAULT_ADDRESSES

    home = tmp_path / "stack"
    home.mkdir()
    (home / "tokens.json").write_text(json.dumps({SERVICE_TOKEN: "service", USER_TOKEN: "user"}))
    (home / "stack.json").write_text(json.dumps({"addresses": DEFAULT_ADDRESSES,
                                                 "tokens_file": str(home / "tokens.json")}))
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    monkeypatch.delenv("RLVR_TOKEN", raising=False)
    assert ClientSettings().token == USER_TOKEN  # the user token, never the service one
    assert ClientSettings(reward_address="example.org:50053").token is None  # not sent beyond the stack
    # Per service: the stack's scheduler gets the token though another address is not the stack's
    # (`rlvr jobs list --address` on a stack started with --base-port), the outside one never.
    mixed = ClientSettings(reward_address="example.org:50053")
    assert mixed.auth("scheduler").token == USER_TOKEN and mixed.auth("reward").token is None
    assert mixed.auth().token is None
    (home / "stack.json").write_text(json.dumps({"addresses": {"scheduler": "0.0.0.0:6000"},
                                                 "tokens_file": str(home / "tokens.json")}))
    bound_wide = ClientSettings(scheduler_address="127.0.0.1:6000")  # a stack on --host 0.0.0.0
    assert bound_wide.auth("scheduler").token == USER_TOKEN and bound_wide.auth("trainer").token is None
    assert ClientSettings(scheduler_address="10.1.2.3:6000").auth("scheduler").token is None
    monkeypatch.setenv("RLVR_TOKEN", "mine")
    assert ClientSettings().token == "mine"
    assert ClientSettings.for_stack(home, reward_address="127.0.0.1:1").token == USER_TOKEN
    (home / "stack.json").unlink()
    monkeypatch.delenv("RLVR_TOKEN")
    assert ClientSettings().token is None
    with pytest.raises(FileNotFoundError, match="no running stack"):
        ClientSettings.for_stack(home)


async def test_health_port_serves_plaintext_health_alone_beside_a_tls_port(tmp_path: Path) -> None:
    """health_port (what a Kubernetes `grpc:` probe reaches: it speaks no TLS, docs/kubernetes.md):
    plaintext Health/Check answers SERVING there, and NOT_SERVING once the server drains; no other
    service answers on it, with or without a token; the main port stays TLS only."""
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings

    pki = make_pki(tmp_path / "pki")
    settings = RewardSettings(port=0, health_port=0, data_roots=[tmp_path], auth_token=SERVICE_TOKEN,
                              tls_cert_file=pki.cert, tls_key_file=pki.key, tls_ca_file=pki.ca)
    async with ServiceRunner(build_service(settings), settings) as runner:
        assert runner.health_port > 0 and runner.health_port != runner.port
        health_address = f"127.0.0.1:{runner.health_port}"
        async with grpc.aio.insecure_channel(health_address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            for service in ("", "rlvr.v1.RewardService"):
                answer = await check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as other:
                await channel.unary_unary("/rlvr.v1.RewardService/ListRewardFunctions")(
                    b"", metadata=(("authorization", f"Bearer {SERVICE_TOKEN}"),), timeout=10)
            assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(runner.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as plain:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
        assert runner.health is not None
        await runner.health.enter_graceful_shutdown()
        async with grpc.aio.insecure_channel(health_address) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert runner.health_server is None


def test_health_port_is_off_unless_set_and_shared_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.services.trainer.settings import TrainerSettings

    assert RewardSettings().health_port is None
    monkeypatch.setenv("RLVR_HEALTH_PORT", "8081")
    assert RewardSettings().health_port == TrainerSettings().health_port == 8081
