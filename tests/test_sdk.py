"""The SDK and the shared channel over real gRPC: fake servicers on a loopback port, the real
clients (sync and asyncio), retries, deadlines and readable errors."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rlvr.clients.sdk import (
    ASYNC_CLIENT_CLASSES,
    CLIENT_CLASSES,
    AsyncRewardClient,
    AsyncRolloutClient,
    AsyncSchedulerClient,
    AsyncStream,
    ClientSettings,
    RewardClient,
    RlvrError,
    RolloutClient,
    SchedulerClient,
    connect,
    connect_async,
)
from rlvr.common.client import (
    CONTRACT_MODULES,
    DEFAULT_DEADLINES,
    IDEMPOTENT_METHODS,
    METHOD_DEADLINES,
    SERVICE_NAMES,
    deadline_for,
    make_channel,
    method_kind,
    service_config,
)
from rlvr.peers.base import rpcs_of
from rlvr.transfer import adapter_upload, save_file_chunks
from rlvr.v1 import (
    common_pb2,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


def within(remaining: float | None, timeout: float) -> bool:
    """The server saw a deadline of about `timeout` (gRPC sends timeouts rounded up to a few
    significant digits, so it may read slightly more)."""
    return remaining is not None and 0 < remaining <= timeout * 1.01 + 0.05


class FakeReward(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.deadlines: dict[str, float | None] = {}

    def Score(self, request, context):
        self.calls["Score"] += 1
        self.deadlines["Score"] = context.time_remaining()
        return reward_pb2.ScoreResponse(
            results=[
                common_pb2.RewardComponents(reward=len(item.completion), extracted_answer=item.ground_truth)
                for item in request.items
            ]
        )

    def GetProblems(self, request, context):  # idempotent: fails twice, then answers
        self.calls["GetProblems"] += 1
        if self.calls["GetProblems"] <= 2:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return reward_pb2.GetProblemsResponse(
            problems=[reward_pb2.Problem(id="p1", question="1+1", ground_truth="2")]
        )


BAD_FIELDS = [("limit", "9999 is out of range; allowed: 0-500 (0 = 100)"), ("offset", "-1 is out of range")]


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.deadlines: dict[str, float | None] = {}

    def CreateJob(self, request, context):  # not idempotent: must never be retried
        self.calls["CreateJob"] += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "trainer unreachable")

    def GetJob(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.id!r} not found")

    def ListJobs(self, request, context):  # two bad fields, as the real services send them
        from rlvr.common.errors import bad_request_status

        status = bad_request_status(grpc.StatusCode.INVALID_ARGUMENT, "limit: bad\noffset: bad", BAD_FIELDS)
        assert status is not None
        context.abort_with_status(status)

    def WatchJob(self, request, context):
        self.deadlines["WatchJob"] = context.time_remaining()
        for step in (1, 2, 3):
            yield common_pb2.JobEvent(metric=common_pb2.MetricEvent(job_id=request.id, step=step))
        if request.id == "broken":
            context.abort(grpc.StatusCode.INTERNAL, "internal error (ref abc)")

    def DownloadAdapter(self, request, context):
        for path, data in (("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"0123456789")):
            for offset in range(0, len(data), 4):
                yield common_pb2.FileChunk(
                    path=path,
                    offset=offset,
                    data=data[offset : offset + 4],
                    file_size=len(data),
                    last=offset + 4 >= len(data),
                )


class FakeRollout(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self) -> None:
        self.uploads: list[rollout_pb2.LoadAdapterRequest] = []
        self.deadlines: dict[str, float | None] = {}

    def LoadAdapter(self, request_iterator, context):
        self.deadlines["LoadAdapter"] = context.time_remaining()
        self.uploads = list(request_iterator)
        header = self.uploads[0].header
        size = sum(len(m.chunk.data) for m in self.uploads[1:])
        return rollout_pb2.AdapterInfo(name=header.name, version=header.version, size_bytes=size)

    def GetInfo(self, request, context):
        self.deadlines["GetInfo"] = context.time_remaining()
        return rollout_pb2.RolloutInfo(model="tiny", backend="transformers")

    def ListAdapters(self, request, context):  # slower than the deadlines the tests give it
        time.sleep(1.0)
        return rollout_pb2.ListAdaptersResponse()


class Fakes:
    def __init__(self) -> None:
        self.reward = FakeReward()
        self.scheduler = FakeScheduler()
        self.rollout = FakeRollout()
        self.address = ""


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    fakes = Fakes()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(fakes.reward, server)
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(fakes.scheduler, server)
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(fakes.rollout, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fakes.address = f"127.0.0.1:{port}"
    yield fakes
    server.stop(0)


def test_unary_call_carries_the_default_or_given_deadline(fakes: Fakes) -> None:
    with RewardClient(fakes.address) as reward:
        items = [reward_pb2.ScoreItem(completion="abc", ground_truth="7")]
        response = reward.score(reward_pb2.ScoreRequest(items=items))
        assert response.results[0].reward == 3 and response.results[0].extracted_answer == "7"
        assert within(fakes.reward.deadlines["Score"], METHOD_DEADLINES["rlvr.v1.RewardService/Score"])
        reward.score(reward_pb2.ScoreRequest(items=items), timeout=2.5)
        assert within(fakes.reward.deadlines["Score"], 2.5)


def test_idempotent_call_retries_on_unavailable(fakes: Fakes) -> None:
    with RewardClient(fakes.address) as reward:
        response = reward.get_problems(reward_pb2.GetProblemsRequest())
    assert [p.id for p in response.problems] == ["p1"]
    assert fakes.reward.calls["GetProblems"] == 3


def test_non_idempotent_call_is_not_retried(fakes: Fakes) -> None:
    with SchedulerClient(fakes.address) as scheduler, pytest.raises(RlvrError) as caught:
        scheduler.create_job(scheduler_pb2.CreateJobRequest())
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert fakes.scheduler.calls["CreateJob"] == 1


def test_errors_are_readable_and_carry_no_grpc_traceback(fakes: Fakes) -> None:
    with SchedulerClient(fakes.address) as scheduler, pytest.raises(RlvrError) as caught:
        scheduler.get_job(scheduler_pb2.GetJobRequest(id="nope"))
    error = caught.value
    assert (error.code, error.details) == (grpc.StatusCode.NOT_FOUND, "job 'nope' not found")
    assert str(error) == "NOT_FOUND: job 'nope' not found"
    assert error.method == "rlvr.v1.SchedulerService/GetJob"
    assert error.__cause__ is None and error.__suppress_context__


async def test_every_bad_field_is_in_the_errors_violations(fakes: Fakes) -> None:
    with SchedulerClient(fakes.address) as scheduler, pytest.raises(RlvrError) as caught:
        scheduler.list_jobs(scheduler_pb2.ListJobsRequest())
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and caught.value.violations == BAD_FIELDS
    async with AsyncSchedulerClient(fakes.address) as aio:
        with pytest.raises(RlvrError) as caught:
            await aio.list_jobs(scheduler_pb2.ListJobsRequest())
    assert caught.value.violations == BAD_FIELDS
    with SchedulerClient(fakes.address) as scheduler, pytest.raises(RlvrError) as caught:
        scheduler.get_job(scheduler_pb2.GetJobRequest(id="nope"))
    assert caught.value.violations == []  # a status without details


def test_watch_streams_job_events_and_maps_stream_errors(fakes: Fakes) -> None:
    with connect(ClientSettings(scheduler_address=fakes.address)) as rlvr:
        events = list(rlvr.scheduler.watch("job-1"))
        assert [e.metric.step for e in events] == [1, 2, 3]
        assert {e.metric.job_id for e in events} == {"job-1"}
        assert within(fakes.scheduler.deadlines["WatchJob"], DEFAULT_DEADLINES["watch"])
        seen = []
        with pytest.raises(RlvrError) as caught:
            for event in rlvr.scheduler.watch("broken", timeout=5):
                seen.append(event)
        assert len(seen) == 3 and caught.value.code == grpc.StatusCode.INTERNAL
        assert within(fakes.scheduler.deadlines["WatchJob"], 5)


def _adapter_dir(tmp_path: Path) -> Path:
    (tmp_path / "adapter_config.json").write_text('{"r": 4}')
    (tmp_path / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 10_000)  # 2.44 MiB
    return tmp_path


def test_load_adapter_streams_header_then_chunks(fakes: Fakes, tmp_path: Path) -> None:
    directory = _adapter_dir(tmp_path)
    with RolloutClient(fakes.address) as rollout:
        info = rollout.load_adapter("math", 3, directory)
    model_size = 2_560_000
    assert (info.name, info.version, info.size_bytes) == ("math", 3, model_size + 8)
    header, *chunks = fakes.rollout.uploads
    assert header.header.total_size == model_size + 8
    assert all(m.WhichOneof("part") == "chunk" for m in chunks)
    model = [m.chunk for m in chunks if m.chunk.path == "adapter_model.safetensors"]
    assert [c.offset for c in model] == [0, 1 << 20, 2 << 20]  # 1 MiB chunks
    assert [c.last for c in model] == [False, False, True]
    assert {c.file_size for c in model} == {model_size}
    assert chunks[0].chunk.path == "adapter_config.json" and chunks[0].chunk.last
    assert within(fakes.rollout.deadlines["LoadAdapter"], DEFAULT_DEADLINES["client_stream"])


def test_load_adapter_refuses_an_incomplete_directory_before_calling(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        adapter_upload("math", 1, tmp_path)


def test_save_adapter_writes_the_files_and_refuses_escaping_paths(fakes: Fakes, tmp_path: Path) -> None:
    with SchedulerClient(fakes.address) as scheduler:
        written = scheduler.save_adapter("job-1", tmp_path / "out")
    assert [p.name for p in written] == ["adapter_config.json", "adapter_model.safetensors"]
    assert (tmp_path / "out" / "adapter_model.safetensors").read_bytes() == b"0123456789"
    evil = [common_pb2.FileChunk(path="../evil", data=b"x", last=True)]
    with pytest.raises(ValueError, match="outside"):
        save_file_chunks(evil, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_client_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLVR_REWARD_ADDRESS", "10.0.0.7:6000")
    monkeypatch.setenv("RLVR_TIMEOUT", "12.5")
    settings = ClientSettings()
    assert settings.reward_address == "10.0.0.7:6000" and settings.address("reward") == "10.0.0.7:6000"
    assert settings.scheduler_address == "127.0.0.1:50051"
    assert all(field.description for field in ClientSettings.model_fields.values())
    with connect() as rlvr:
        assert rlvr.reward.timeout_for("Score") == 12.5  # unary: the settings' timeout
        assert rlvr.scheduler.timeout_for("WatchJob") == DEFAULT_DEADLINES["watch"]  # streams keep theirs
        assert rlvr.reward.timeout_for("Score", 3) == 3


def test_settings_timeout_reaches_the_server(fakes: Fakes) -> None:
    with connect(ClientSettings(rollout_address=fakes.address, timeout=4)) as rlvr:
        assert rlvr.rollout.get_info().model == "tiny"
    assert within(fakes.rollout.deadlines["GetInfo"], 4)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_every_rpc_has_a_typed_sdk_method() -> None:
    services = {s.full_name: s for m in CONTRACT_MODULES for s in m.DESCRIPTOR.services_by_name.values()}
    assert set(services) == {SERVICE_NAMES[short] for short in CLIENT_CLASSES}
    assert set(ASYNC_CLIENT_CLASSES) == set(CLIENT_CLASSES)
    for short, client in [*CLIENT_CLASSES.items(), *ASYNC_CLIENT_CLASSES.items()]:
        for method in services[SERVICE_NAMES[short]].methods:
            # A client stream's typed method takes the request iterable; the friendly one
            # (load_adapter) takes a directory.
            name = _snake(method.name) + ("_stream" if method.client_streaming else "")
            assert callable(getattr(client, name, None)), (
                f"{client.__name__} lacks {name} ({method.full_name})"
            )
        assert {rpc.method for rpc in rpcs_of(client).values()} == {
            m.full_name.replace(f".{m.name}", f"/{m.name}") for m in services[SERVICE_NAMES[short]].methods}


def test_the_sync_and_async_clients_share_one_rpc_table() -> None:
    for short, client in CLIENT_CLASSES.items():
        twin = ASYNC_CLIENT_CLASSES[short]
        assert rpcs_of(client) == rpcs_of(twin)  # the very same descriptors, not copies
        assert all(a is b for a, b in zip(rpcs_of(client).values(), rpcs_of(twin).values(), strict=True))
    # Conveniences come in pairs too.
    for name in ("watch", "save_adapter", "merge", "save_merged_model", "export", "watch_loop_updates", "export_loop"):
        assert callable(getattr(SchedulerClient, name)) and callable(getattr(AsyncSchedulerClient, name))
    assert callable(RolloutClient.load_adapter) and callable(AsyncRolloutClient.load_adapter)


def _declare(service: str, **rpcs: object) -> str:
    """Declares a client class; the error it fails with (Python 3.11 wraps an error of
    __set_name__ in a RuntimeError), or ""."""
    try:
        type("Declared", (), {"service": service, **rpcs})
    except (RuntimeError, TypeError) as e:
        return str(e.__cause__ or e)
    return ""


def test_a_declaration_that_is_not_the_contract_fails_at_import() -> None:
    from rlvr.peers.base import ServerStream, Unary

    R, W = reward_pb2, rollout_pb2
    assert _declare("rollout", generate=ServerStream("Generate", W.GenerateRequest, W.GenerateResponse)) == ""
    assert "is a server_stream call, declared unary" in _declare(
        "rollout", generate=Unary("Generate", W.GenerateRequest, W.GenerateResponse))
    assert "the request of rlvr.v1.RewardService/Score is rlvr.v1.ScoreRequest" in _declare(
        "reward", score=Unary("Score", R.GetProblemsRequest, R.ScoreResponse))
    assert "not in the contract" in _declare("reward", x=Unary("Nope", R.ScoreRequest, R.ScoreResponse))
    assert "is the method get_problems" in _declare(
        "reward", problems=Unary("GetProblems", R.GetProblemsRequest, R.GetProblemsResponse))


def _contract_methods() -> dict[str, object]:
    return {
        f"{service.full_name}/{method.name}": method
        for module in CONTRACT_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_idempotent_methods_match_the_contract() -> None:
    methods = _contract_methods()
    contract = {name for name in IDEMPOTENT_METHODS if name.startswith("rlvr.")}
    assert contract <= set(methods), f"unknown methods: {contract - set(methods)}"
    read_only = {name for name in methods if re.search(r"/(Get|List|Watch)[A-Z]", name)}
    assert read_only <= contract, f"read-only methods without retries: {read_only - contract}"
    for name in methods:
        if re.search(r"/(Create|Start|Cancel|Stop|Delete|Run|Load|Unload|Merge|Generate)", name):
            assert name not in IDEMPOTENT_METHODS, name
    config = service_config()["methodConfig"][0]
    assert {f"{n['service']}/{n['method']}" for n in config["name"]} == IDEMPOTENT_METHODS
    assert "DEADLINE_EXCEEDED" not in config["retryPolicy"]["retryableStatusCodes"]


def test_deadline_for_every_method_kind_and_spelling() -> None:
    assert method_kind("rlvr.v1.SchedulerService/WatchJob") == "watch"
    assert method_kind("/rlvr.v1.RolloutService/Generate") == "server_stream"
    assert method_kind("rlvr.v1.RolloutService.LoadAdapter") == "client_stream"
    assert method_kind(b"/grpc.health.v1.Health/Watch") == "watch"
    assert deadline_for("/rlvr.v1.SchedulerService/GetJob") == DEFAULT_DEADLINES["unary"]
    assert deadline_for("rlvr.v1.SchedulerService.GetJob") == DEFAULT_DEADLINES["unary"]
    for name in _contract_methods():
        assert 0 < deadline_for(name) < float("inf")


def test_raw_stubs_on_shared_channels_get_a_deadline(fakes: Fakes) -> None:
    with make_channel(fakes.address) as channel:
        rollout_pb2_grpc.RolloutServiceStub(channel).GetInfo(rollout_pb2.GetInfoRequest())
    assert within(fakes.rollout.deadlines["GetInfo"], DEFAULT_DEADLINES["unary"])

    async def aio_calls() -> int:
        async with make_channel(fakes.address, aio=True) as channel:
            await rollout_pb2_grpc.RolloutServiceStub(channel).GetInfo(rollout_pb2.GetInfoRequest())
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            response = await stub.GetProblems(reward_pb2.GetProblemsRequest())  # retried twice
            return len(response.problems)

    fakes.rollout.deadlines.clear()
    assert asyncio.run(aio_calls()) == 1
    assert within(fakes.rollout.deadlines["GetInfo"], DEFAULT_DEADLINES["unary"])
    assert fakes.reward.calls["GetProblems"] == 3


def test_a_channel_with_a_connection_of_its_own_reaches_a_server_back_at_once() -> None:
    """gRPC shares one connection among a process's channels to one address with the same options,
    and with it the reconnect backoff, which grows while the server is away (1 s, then x1.6 with
    20% jitter: attempts at about 0, 1, 2.6, 5.2, 9.3, 15.9 s; the fifth comes by 11.1 s and the
    sixth not before 12.6 s). In that gap a new shared channel fails at once although the server is
    up, and one with `own_connection` (what a trainer calls a restarted rollout server through:
    ServiceGenerator._recover) connects."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from rlvr.clients.stack import free_port

    address = f"127.0.0.1:{free_port()}"

    def check(channel: grpc.Channel) -> str:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError as e:
            return str(e.code().name)
        return "OK"

    old = make_channel(address)
    started = time.monotonic()
    while time.monotonic() - started < 11.5:  # the server is away: the shared connection backs off
        assert check(old) != "OK"
        time.sleep(0.2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(address)
    server.start()
    shared, own = make_channel(address), make_channel(address, own_connection=True)
    try:
        assert check(shared) != "OK"  # the shared connection's next attempt is still to come
        assert check(own) == "OK"
    finally:
        for channel in (old, shared, own):
            channel.close()
        server.stop(0)


def test_a_call_past_its_deadline_is_deadline_exceeded(fakes: Fakes) -> None:
    with RolloutClient(fakes.address) as rollout, pytest.raises(RlvrError) as caught:
        rollout.list_adapters(timeout=0.2)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.method == "rlvr.v1.RolloutService/ListAdapters"


# ------------------------------------------------------------------------------ the asyncio clients


async def test_async_unary_calls_have_the_same_deadlines_and_retries(fakes: Fakes) -> None:
    async with AsyncRewardClient(fakes.address) as reward:
        items = [reward_pb2.ScoreItem(completion="abc", ground_truth="7")]
        response = await reward.score(reward_pb2.ScoreRequest(items=items))
        assert response.results[0].reward == 3 and response.results[0].extracted_answer == "7"
        assert within(fakes.reward.deadlines["Score"], METHOD_DEADLINES["rlvr.v1.RewardService/Score"])
        await reward.score(reward_pb2.ScoreRequest(items=items), timeout=2.5)
        assert within(fakes.reward.deadlines["Score"], 2.5)
        problems = await reward.get_problems()  # idempotent: retried through two UNAVAILABLE
    assert [p.id for p in problems.problems] == ["p1"] and fakes.reward.calls["GetProblems"] == 3
    async with AsyncSchedulerClient(fakes.address) as scheduler:
        with pytest.raises(RlvrError) as caught:
            await scheduler.create_job(scheduler_pb2.CreateJobRequest())
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE and fakes.scheduler.calls["CreateJob"] == 1


async def test_a_client_without_channel_retries_fails_at_the_first_unavailable(fakes: Fakes) -> None:
    """retries=False (a caller with a wait loop of its own: the reward service's remote rewards):
    the call that the default client retries through two UNAVAILABLE answers is tried once."""
    async with AsyncRewardClient(fakes.address, retries=False) as reward:
        with pytest.raises(RlvrError) as caught:
            await reward.get_problems()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE and fakes.reward.calls["GetProblems"] == 1


async def test_async_errors_are_rlvr_errors_naming_the_call(fakes: Fakes) -> None:
    async with AsyncSchedulerClient(fakes.address) as scheduler:
        with pytest.raises(RlvrError) as caught:
            await scheduler.get_job(scheduler_pb2.GetJobRequest(id="nope"))
    error = caught.value
    assert (error.code, error.details, str(error)) == (
        grpc.StatusCode.NOT_FOUND, "job 'nope' not found", "NOT_FOUND: job 'nope' not found")
    assert (error.method, error.address, error.service, error.call) == (
        "rlvr.v1.SchedulerService/GetJob", fakes.address, "scheduler", "GetJob")
    assert error.describe() == f"scheduler service at {fakes.address}: GetJob failed: NOT_FOUND: job 'nope' not found"
    assert error.__cause__ is None and error.__suppress_context__


async def test_async_deadline_exceeded(fakes: Fakes) -> None:
    async with AsyncRolloutClient(fakes.address) as rollout:
        started = time.monotonic()
        with pytest.raises(RlvrError) as caught:
            await rollout.list_adapters(timeout=0.2)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started < 0.9


async def test_async_streams_events_and_maps_stream_errors(fakes: Fakes) -> None:
    async with connect_async(ClientSettings(scheduler_address=fakes.address)) as rlvr:
        stream = rlvr.scheduler.watch("job-1")
        assert isinstance(stream, AsyncStream)
        events = [event async for event in stream]
        assert [e.metric.step for e in events] == [1, 2, 3]
        assert within(fakes.scheduler.deadlines["WatchJob"], DEFAULT_DEADLINES["watch"])
        seen = []
        with pytest.raises(RlvrError) as caught:
            async for event in rlvr.scheduler.watch("broken", timeout=5):
                seen.append(event)
        assert len(seen) == 3 and caught.value.code == grpc.StatusCode.INTERNAL
        assert caught.value.method == "rlvr.v1.SchedulerService/WatchJob"
        assert within(fakes.scheduler.deadlines["WatchJob"], 5)
        async with rlvr.scheduler.watch("job-1") as stream:  # leaving early cancels the call
            first = await stream.__anext__()
        assert first.metric.step == 1
        assert [event async for event in stream] == []  # and ends it


async def test_async_uploads_and_downloads(fakes: Fakes, tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    directory = _adapter_dir(tmp_path / "adapter")
    async with connect_async(ClientSettings(scheduler_address=fakes.address, rollout_address=fakes.address,
                                            timeout=4)) as rlvr:
        info = await rlvr.rollout.load_adapter("math", 3, directory)
        assert (info.name, info.version, info.size_bytes) == ("math", 3, 2_560_000 + 8)
        assert within(fakes.rollout.deadlines["LoadAdapter"], 4)  # the settings' timeout, as in sync
        written = await rlvr.scheduler.save_adapter("job-1", tmp_path / "out")
        assert (await rlvr.rollout.get_info()).model == "tiny"
    assert within(fakes.rollout.deadlines["GetInfo"], 4)
    assert [p.name for p in written] == ["adapter_config.json", "adapter_model.safetensors"]
    assert (tmp_path / "out" / "adapter_model.safetensors").read_bytes() == b"0123456789"
    header, *chunks = fakes.rollout.uploads
    assert header.header.total_size == 2_560_000 + 8 and len(chunks) == 4
