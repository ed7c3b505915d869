"""Bad input never reaches INTERNAL: every RPC of every service, walked from the descriptors, with
undecodable bytes, invalid UTF-8 in each string field, a 1 MiB value in each string field, the
extremes of each number and an undeclared value of each enum. No call may answer INTERNAL,
UNKNOWN or RESOURCE_EXHAUSTED (a status message over gRPC's metadata limit), and an
INVALID_ARGUMENT message starts with the field at fault.

The services run in-process (ServiceRunner); the rollout service on the transformers backend with
the tiny test model; nothing trains and nothing generates for long (requests that pass are a base
request, one field changed, whose other fields keep the work small).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from rlvr.v1 import benchmark_pb2, common_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2
from services.common.server import ServiceRunner

F = FieldDescriptor
BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED}
FIELD_FIRST = re.compile(r"^[a-z_][a-z0-9_]*(\[\d+\])?(\.[a-z_][a-z0-9_]*(\[\d+\])?)*: ")
HUGE = "a" * (1 << 20)
MARK = "QzQzQzQz"  # replaced by as many invalid UTF-8 bytes in the serialized request
INTS = {F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_INT64: (-(2**63), 2**63 - 1),
        F.TYPE_UINT32: (2**32 - 1,), F.TYPE_UINT64: (2**64 - 1,), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
        F.TYPE_SINT64: (-(2**63), 2**63 - 1)}
FLOATS = (math.nan, math.inf, -math.inf, -1e30)


@dataclass
class Case:
    name: str
    data: bytes


@dataclass
class Found:
    bad: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    calls: int = 0


def _paths(desc: Descriptor, prefix: tuple[FieldDescriptor, ...] = (), depth: int = 0
           ) -> Iterator[tuple[FieldDescriptor, ...]]:
    """Every leaf field (string, number, enum) reachable from `desc`, as a path of fields."""
    for f in desc.fields:
        path = (*prefix, f)
        if f.type == F.TYPE_MESSAGE:
            if depth < 4 and not f.message_type.full_name.startswith("google.protobuf"):
                yield from _paths(f.message_type, path, depth + 1)
        elif f.type != F.TYPE_BOOL and f.type != F.TYPE_BYTES:
            yield path


def _set(msg: Message, path: tuple[FieldDescriptor, ...], value: Any) -> None:
    for f in path[:-1]:
        msg = getattr(msg, f.name).add() if f.is_repeated else getattr(msg, f.name)
    leaf = path[-1]
    if leaf.is_repeated:
        getattr(msg, leaf.name).append(value)
    else:
        setattr(msg, leaf.name, value)


def _label(path: tuple[FieldDescriptor, ...]) -> str:
    return ".".join(f.name for f in path)


def cases(desc: Descriptor, base: Message | None) -> Iterator[Case]:
    cls = message_factory.GetMessageClass(desc)
    rng = random.Random(0)
    yield Case("random bytes", bytes(rng.randrange(256) for _ in range(64)))
    yield Case("corrupt varint", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    yield Case("truncated field", b"\x0a\x7f")
    for path in _paths(desc):
        def variant(value: Any, path: tuple[FieldDescriptor, ...] = path) -> Message:
            m = cls()
            if base is not None:
                m.CopyFrom(base)
            _set(m, path, value)
            return m

        leaf, label = path[-1], _label(path)
        if leaf.type == F.TYPE_STRING:
            yield Case(f"{label} = 1 MiB", variant(HUGE).SerializeToString())
            yield Case(f"{label} = 300 characters", variant("b" * 300).SerializeToString())  # > a file name
            data = variant(MARK).SerializeToString()
            yield Case(f"{label} = invalid UTF-8", data.replace(MARK.encode(), b"\xff" * len(MARK)))
        elif leaf.type == F.TYPE_ENUM:
            yield Case(f"{label} = 99 (undeclared)", variant(99).SerializeToString())
        elif leaf.type in INTS:
            for value in INTS[leaf.type]:
                yield Case(f"{label} = {value}", variant(value).SerializeToString())
        elif leaf.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            for value in FLOATS:
                yield Case(f"{label} = {value}", variant(value).SerializeToString())


async def _call(channel: grpc.aio.Channel, service: ServiceDescriptor, method: Any, data: bytes) -> None:
    path = f"/{service.full_name}/{method.name}"
    if method.client_streaming and method.server_streaming:
        raise AssertionError("no bidirectional RPC is expected")
    if method.client_streaming:
        await channel.stream_unary(path)(iter([data]), timeout=20)
    elif method.server_streaming:
        call = channel.unary_stream(path)(data, timeout=20)
        async for _ in call:  # the request was taken: that is enough
            call.cancel()
            break
    else:
        await channel.unary_unary(path)(data, timeout=20)


async def walk(address: str, service: ServiceDescriptor, bases: dict[str, Message] | None = None,
               skip: tuple[str, ...] = ()) -> Found:
    found = Found()
    bases = bases or {}
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        for method in service.methods:
            if method.name in skip:
                continue
            for case in cases(method.input_type, bases.get(method.name)):
                found.calls += 1
                where = f"{method.name}({case.name})"
                t0 = time.monotonic()
                try:
                    await _call(channel, service, method, case.data)
                except grpc.aio.AioRpcError as e:
                    details = e.details() or ""
                    if e.code() in BAD_CODES:
                        found.bad.append(f"{where}: {e.code().name} {details[:300]}")
                    elif e.code() == grpc.StatusCode.INVALID_ARGUMENT and not FIELD_FIRST.match(details):
                        found.bad.append(f"{where}: INVALID_ARGUMENT names no field: {details[:300]}")
                    elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        found.bad.append(f"{where}: took over 20 s")
                    elif len(details) > 5000:
                        found.bad.append(f"{where}: {len(details)}-character message")
                finally:
                    if time.monotonic() - t0 > 10:  # an unreachable peer costs ~3 s of retries
                        found.slow.append(f"{where}: {time.monotonic() - t0:.1f} s")
    return found


def _assert_clean(found: Found) -> None:
    assert found.calls > 0
    assert not found.slow, f"slow calls: {found.slow}"
    assert not found.bad, f"{len(found.bad)} of {found.calls} calls:\n" + "\n".join(found.bad)


def _svc(module: Any, name: str) -> ServiceDescriptor:
    return module.DESCRIPTOR.services_by_name[name]


# ----------------------------------------------------------------------------------- the services

async def test_reward_service(tmp_path: Path) -> None:
    from services.reward.server import build_service
    from services.reward.settings import RewardSettings

    settings = RewardSettings(port=0, data_roots=[tmp_path])
    bases = {"Score": reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(completion="<answer>1</answer>",
                                                                          ground_truth="1")]),
             "GetProblems": reward_pb2.GetProblemsRequest(limit=8)}
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, _svc(reward_pb2, "RewardService"), bases))


async def test_scheduler_service(tmp_path: Path, nats_server) -> None:
    from services.benchmark.server import build_service as build_benchmark
    from services.scheduler.server import build_service
    from services.scheduler.settings import SchedulerSettings

    # A benchmark service to list the benchmarks, so CreateLoop's checks run without a peer's retries.
    bench = _benchmark_settings(tmp_path / "bench", nats_server.url)
    spec = common_pb2.JobSpec(name="fuzz")
    bases = {"CreateJob": scheduler_pb2.CreateJobRequest(spec=spec, dry_run=True),
             "CreateLoop": scheduler_pb2.CreateLoopRequest(spec=scheduler_pb2.LoopSpec(target=50.0), dry_run=True)}
    async with ServiceRunner(build_benchmark(bench), bench) as benchmark:
        settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                     nats_url=nats_server.url, artifact_root=tmp_path / "artifacts",
                                     trainer_addresses=["127.0.0.1:1"], benchmark_address=benchmark.address)
        async with ServiceRunner(build_service(settings), settings) as runner:
            _assert_clean(await walk(runner.address, _svc(scheduler_pb2, "SchedulerService"), bases))


def _benchmark_settings(root: Path, nats_url: str) -> Any:
    from services.benchmark.settings import BenchmarkSettings

    root.mkdir(parents=True, exist_ok=True)
    return BenchmarkSettings(port=0, database_url=f"sqlite:///{root / 'db.sqlite'}", nats_url=nats_url,
                             rollout_address="127.0.0.1:1", reward_address="127.0.0.1:1",
                             adapter_roots=[root / "adapters"])


async def test_benchmark_service(tmp_path: Path, nats_server) -> None:
    from services.benchmark.server import build_service

    settings = _benchmark_settings(tmp_path, nats_server.url)
    bases = {"RunEvaluation": benchmark_pb2.RunEvaluationRequest(benchmark="gsm8k", limit=1)}
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, _svc(benchmark_pb2, "BenchmarkService"), bases))


async def test_trainer_service(tmp_path: Path, nats_server) -> None:
    from services.trainer.server import build_service
    from services.trainer.settings import TrainerSettings

    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url=nats_server.url,
                               scorer="local", torch_threads=1, worker_name="fuzz-trainer")
    # No base request: StartJob without a job_id is refused, so nothing ever trains here.
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, _svc(trainer_pb2, "TrainerService")))


@pytest.fixture(scope="module")
def tiny_rollout_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.tiny import build_untrained_model

    return build_untrained_model(tmp_path_factory.mktemp("tiny") / "model", size="test", seed=0)


async def test_rollout_service(tmp_path: Path, tiny_rollout_model: Path) -> None:
    from services.rollout.server import build_service
    from services.rollout.settings import RolloutSettings

    settings = RolloutSettings(port=0, model=str(tiny_rollout_model), backend="transformers", max_lora_rank=8,
                               max_model_len=512, adapter_root=tmp_path / "adapters", max_adapter_bytes=262144)
    prompt = rollout_pb2.Prompt(text="1+1=")
    bases = {"Generate": rollout_pb2.GenerateRequest(prompts=[prompt], sampling=common_pb2.SamplingParams(
        max_tokens=32))}
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, _svc(rollout_pb2, "RolloutService"), bases))


def test_the_walk_covers_every_rpc() -> None:
    """Each service's every method gets the undecodable cases, and every leaf field its own."""
    for module in (benchmark_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                names = [c.name for c in cases(method.input_type, None)]
                assert "random bytes" in names
                for path in _paths(method.input_type):
                    assert any(n.startswith(_label(path) + " = ") for n in names), (method.name, _label(path))
