"""Bad input never reaches INTERNAL: every RPC of every service (and of the standard health and
reflection services each one also serves), walked from the descriptors, with
undecodable bytes, invalid UTF-8 in each string field, a 1 MiB value in each string field, the
extremes of each number and an undeclared value of each enum. No call may answer INTERNAL,
UNKNOWN or RESOURCE_EXHAUSTED (a status message over gRPC's metadata limit), an
INVALID_ARGUMENT message starts with the field at fault, and no message names a server folder
(the artifact, data or adapter roots, the home folder): besides the walk, each service gets the
requests that make it talk about its folders (a path outside its roots, another base model).

The services run in-process (ServiceRunner); the rollout service on the transformers backend with
the tiny test model; nothing trains and nothing generates for long (requests that pass are a base
request, one field changed, whose other fields keep the work small).
"""

from __future__ import annotations

import json
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

from rlvr.services.common.server import ServiceRunner
from rlvr.v1 import benchmark_pb2, common_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2

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
        if f.type == F.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:  # a map: its key, and a scalar value
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            yield (*path, key)
            if value.type != F.TYPE_MESSAGE:
                yield (*path, value)
        elif f.type == F.TYPE_MESSAGE:
            if depth < 4 and not f.message_type.full_name.startswith("google.protobuf"):
                yield from _paths(f.message_type, path, depth + 1)
        elif f.type != F.TYPE_BOOL and f.type != F.TYPE_BYTES:
            yield path


def _set(msg: Message, path: tuple[FieldDescriptor, ...], value: Any) -> None:
    if len(path) > 1 and path[-2].type == F.TYPE_MESSAGE and path[-2].message_type.GetOptions().map_entry:
        _set_map(msg, path, value)
        return
    for f in path[:-1]:
        msg = getattr(msg, f.name).add() if f.is_repeated else getattr(msg, f.name)
    leaf = path[-1]
    if leaf.is_repeated:
        getattr(msg, leaf.name).append(value)
    else:
        setattr(msg, leaf.name, value)


def _set_map(msg: Message, path: tuple[FieldDescriptor, ...], value: Any) -> None:
    """A map field's entry: the fuzzed key with a plain value, or key "k" with the fuzzed value."""
    for f in path[:-2]:
        msg = getattr(msg, f.name).add() if f.is_repeated else getattr(msg, f.name)
    container, leaf = getattr(msg, path[-2].name), path[-1]
    entry_value = path[-2].message_type.fields_by_name["value"]
    if leaf.name == "key":
        if entry_value.type == F.TYPE_MESSAGE:
            container[value].SetInParent()
        else:  # a plain value of the map's type (map<string, double>, map<string, string>)
            container[value] = "v" if entry_value.type == F.TYPE_STRING else 0.5
    else:
        container["k"] = value


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


async def _call(channel: grpc.aio.Channel, service: ServiceDescriptor, method: Any, data: bytes,
                lead: bytes | None = None) -> None:
    """One call; a client stream sends `lead` (a good first message) before `data` when given."""
    path = f"/{service.full_name}/{method.name}"
    if method.client_streaming and method.server_streaming:  # server reflection
        both = channel.stream_stream(path)(iter([data] if lead is None else [lead, data]), timeout=20)
        async for _ in both:
            both.cancel()
            break
    elif method.client_streaming:
        await channel.stream_unary(path)(iter([data] if lead is None else [lead, data]), timeout=20)
    elif method.server_streaming:
        call = channel.unary_stream(path)(data, timeout=20)
        async for _ in call:  # the request was taken: that is enough
            call.cancel()
            break
    else:
        await channel.unary_unary(path)(data, timeout=20)


PATH_PROBE = "/nonexistent-rlvr-probe/x.jsonl"
"""A client's path outside every root: echoing it back is fine, naming the roots is not."""


def server_folders(*folders: Path | str) -> tuple[str, ...]:
    """What no message to a client may contain: these folders and the server's home folder."""
    return tuple({str(f) for f in folders} | {str(Path.home())})


async def probe(address: str, service: ServiceDescriptor, calls: dict[str, Message], folders: tuple[str, ...]
                ) -> Found:
    """Requests that make a service talk about its folders; every answer's message is checked."""
    found = Found()
    async with grpc.aio.insecure_channel(address) as channel:
        for name, request in calls.items():
            found.calls += 1
            try:
                await _call(channel, service, service.methods_by_name[name], request.SerializeToString())
                found.bad.append(f"{name}: probe accepted")
            except grpc.aio.AioRpcError as e:
                _check_message(found, name, e, folders)
    return found


def _check_message(found: Found, where: str, e: grpc.aio.AioRpcError, folders: tuple[str, ...]) -> None:
    details = e.details() or ""
    if e.code() in BAD_CODES:
        found.bad.append(f"{where}: {e.code().name} {details[:300]}")
    elif e.code() == grpc.StatusCode.INVALID_ARGUMENT and not FIELD_FIRST.match(details):
        found.bad.append(f"{where}: INVALID_ARGUMENT names no field: {details[:300]}")
    elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        found.bad.append(f"{where}: took over 20 s")
    elif len(details) > 5000:
        found.bad.append(f"{where}: {len(details)}-character message")
    elif any(folder in details for folder in folders):
        found.bad.append(f"{where}: names a server folder: {details[:300]}")


async def walk(address: str, service: ServiceDescriptor, bases: dict[str, Message] | None = None,
               skip: tuple[str, ...] = (), folders: tuple[str, ...] = (),
               leads: dict[str, Message] | None = None) -> Found:
    """Every case of every method; a client stream named in `leads` gets each case twice: first in
    the stream, and again after that good first message (a bad chunk later in an upload)."""
    found = Found()
    bases, leads = bases or {}, leads or {}
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        for method in service.methods:
            if method.name in skip:
                continue
            lead = leads[method.name].SerializeToString() if method.name in leads else None
            for case in cases(method.input_type, bases.get(method.name)):
                for first in (None, lead) if lead is not None else (None,):
                    found.calls += 1
                    where = f"{method.name}({case.name}{'' if first is None else ', after a good first message'})"
                    t0 = time.monotonic()
                    try:
                        await _call(channel, service, method, case.data, first)
                    except grpc.aio.AioRpcError as e:
                        _check_message(found, where, e, folders)
                    finally:
                        if time.monotonic() - t0 > 10:  # an unreachable peer costs ~3 s of retries
                            found.slow.append(f"{where}: {time.monotonic() - t0:.1f} s")
    return found


async def walk_standard(address: str, folders: tuple[str, ...]) -> Found:
    """The standard services every rlvr server also serves (grpc.health.v1.Health: Check, Watch,
    List; server reflection), walked like its own: undecodable bytes must be INVALID_ARGUMENT too."""
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    found = Found()
    for service in (health_pb2.DESCRIPTOR.services_by_name["Health"],
                    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]):
        one = await walk(address, service, folders=folders)
        found.bad += one.bad
        found.slow += one.slow
        found.calls += one.calls
    return found


def _assert_clean(found: Found) -> None:
    assert found.calls > 0
    assert not found.slow, f"slow calls: {found.slow}"
    assert not found.bad, f"{len(found.bad)} of {found.calls} calls:\n" + "\n".join(found.bad)


def _svc(module: Any, name: str) -> ServiceDescriptor:
    return module.DESCRIPTOR.services_by_name[name]


# ----------------------------------------------------------------------------------- the services

async def test_reward_service(tmp_path: Path) -> None:
    from rlvr.services.reward.server import build_service
    from rlvr.services.reward.settings import RewardSettings

    settings = RewardSettings(port=0, data_roots=[tmp_path])
    bases = {"Score": reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(completion="<answer>1</answer>",
                                                                          ground_truth="1")]),
             "GetProblems": reward_pb2.GetProblemsRequest(limit=8)}
    folders = server_folders(tmp_path)
    service = _svc(reward_pb2, "RewardService")
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, service, bases, folders=folders))
        _assert_clean(await walk_standard(runner.address, folders))
        outside = reward_pb2.GetProblemsRequest(function=common_pb2.REWARD_FUNCTION_BOXED, dataset=PATH_PROBE)
        _assert_clean(await probe(runner.address, service, {"GetProblems": outside}, folders))


async def test_scheduler_service(tmp_path: Path, nats_server) -> None:
    from rlvr.services.benchmark.server import build_service as build_benchmark
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    # A benchmark service to list the benchmarks, so CreateLoop's checks run without a peer's retries.
    bench = _benchmark_settings(tmp_path / "bench", nats_server.url)
    spec = common_pb2.JobSpec(name="fuzz")
    bases = {"CreateJob": scheduler_pb2.CreateJobRequest(spec=spec, dry_run=True),
             "CreateLoop": scheduler_pb2.CreateLoopRequest(spec=scheduler_pb2.LoopSpec(target=50.0), dry_run=True)}
    async with ServiceRunner(build_benchmark(bench), bench) as benchmark:
        settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                     nats_url=nats_server.url, artifact_root=tmp_path / "artifacts",
                                     data_roots=[tmp_path / "data"],
                                     trainer_addresses=["127.0.0.1:1"], benchmark_address=benchmark.address)
        folders = server_folders(tmp_path)
        service = _svc(scheduler_pb2, "SchedulerService")
        async with ServiceRunner(build_service(settings), settings) as runner:
            _assert_clean(await walk(runner.address, service, bases, folders=folders))
            _assert_clean(await walk_standard(runner.address, folders))
            boxed = common_pb2.JobSpec(name="fuzz")
            boxed.reward.function, boxed.reward.dataset = common_pb2.REWARD_FUNCTION_BOXED, PATH_PROBE
            calls = {"CreateJob": scheduler_pb2.CreateJobRequest(spec=boxed, dry_run=True),
                     "CreateLoop": scheduler_pb2.CreateLoopRequest(spec=scheduler_pb2.LoopSpec(target=50.0, job=boxed),
                                                                   dry_run=True)}
            _assert_clean(await probe(runner.address, service, calls, folders))


async def test_create_loop_checks_its_spec_before_asking_the_benchmark_service(tmp_path: Path, nats_server) -> None:
    """A bad loop spec is INVALID_ARGUMENT at once, also while the benchmark service is down
    (it used to be UNAVAILABLE after the retries of asking that service for its benchmarks)."""
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", nats_url=nats_server.url,
                                 artifact_root=tmp_path / "artifacts", trainer_addresses=["127.0.0.1:1"],
                                 benchmark_address="127.0.0.1:1")
    bad_job = scheduler_pb2.LoopSpec(target=50.0)
    bad_job.job.grpo.group_size = 1
    async with ServiceRunner(build_service(settings), settings) as runner, \
            grpc.aio.insecure_channel(runner.address) as channel:
        create = channel.unary_unary("/rlvr.v1.SchedulerService/CreateLoop",
                                     request_serializer=scheduler_pb2.CreateLoopRequest.SerializeToString,
                                     response_deserializer=scheduler_pb2.CreateLoopResponse.FromString)
        for spec, field in ((scheduler_pb2.LoopSpec(target=0.0), "target"), (bad_job, "job.grpo.group_size")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await create(scheduler_pb2.CreateLoopRequest(spec=spec, dry_run=True), timeout=20)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert (refused.value.details() or "").startswith(f"{field}: ")
        with pytest.raises(grpc.aio.AioRpcError) as down:  # a good spec needs the benchmark list
            await create(scheduler_pb2.CreateLoopRequest(spec=scheduler_pb2.LoopSpec(target=50.0), dry_run=True),
                         timeout=20)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE


def _benchmark_settings(root: Path, nats_url: str) -> Any:
    from rlvr.services.benchmark.settings import BenchmarkSettings

    root.mkdir(parents=True, exist_ok=True)
    return BenchmarkSettings(port=0, database_url=f"sqlite:///{root / 'db.sqlite'}", nats_url=nats_url,
                             rollout_address="127.0.0.1:1", reward_address="127.0.0.1:1",
                             adapter_roots=[root / "adapters"])


async def test_benchmark_service(tmp_path: Path, nats_server) -> None:
    from rlvr.services.benchmark.server import build_service

    settings = _benchmark_settings(tmp_path, nats_server.url)
    bases = {"RunEvaluation": benchmark_pb2.RunEvaluationRequest(benchmark="gsm8k", limit=1)}
    folders = server_folders(tmp_path)
    service = _svc(benchmark_pb2, "BenchmarkService")
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, service, bases, folders=folders))
        _assert_clean(await walk_standard(runner.address, folders))
        outside = benchmark_pb2.RunEvaluationRequest(benchmark="gsm8k", limit=1, adapter_path=PATH_PROBE,
                                                     adapter=common_pb2.AdapterSelector(name="probe"))
        _assert_clean(await probe(runner.address, service, {"RunEvaluation": outside}, folders))


async def test_trainer_service(tmp_path: Path, nats_server) -> None:
    from rlvr.services.trainer.server import build_service
    from rlvr.services.trainer.settings import TrainerSettings

    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url=nats_server.url,
                               scorer="local", torch_threads=1, worker_name="fuzz-trainer")
    # No base request: StartJob without a job_id is refused, so nothing ever trains here.
    folders = server_folders(tmp_path)
    service = _svc(trainer_pb2, "TrainerService")
    async with ServiceRunner(build_service(settings), settings) as runner:
        _assert_clean(await walk(runner.address, service, folders=folders))
        _assert_clean(await walk_standard(runner.address, folders))
        spec = common_pb2.JobSpec(name="probe", init_adapter=common_pb2.AdapterRef(path=PATH_PROBE))
        calls = {"MergeAdapter": trainer_pb2.MergeAdapterRequest(adapter_path=PATH_PROBE, output_name="probe"),
                 "StartJob": trainer_pb2.StartJobRequest(job_id="probe", spec=spec)}
        _assert_clean(await probe(runner.address, service, calls, folders))


@pytest.fixture(scope="module")
def tiny_rollout_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.tiny import build_untrained_model

    return build_untrained_model(tmp_path_factory.mktemp("tiny") / "model", size="test", seed=0)


async def test_rollout_service(tmp_path: Path, tiny_rollout_model: Path) -> None:
    from rlvr.services.rollout.server import build_service
    from rlvr.services.rollout.settings import RolloutSettings

    settings = RolloutSettings(port=0, model=str(tiny_rollout_model), backend="transformers", max_lora_rank=8,
                               max_model_len=512, adapter_root=tmp_path / "adapters", max_adapter_bytes=262144)
    prompt = rollout_pb2.Prompt(text="1+1=")
    bases = {"Generate": rollout_pb2.GenerateRequest(prompts=[prompt], sampling=common_pb2.SamplingParams(
        max_tokens=32))}
    folders = server_folders(tmp_path)  # the adapter root (the model is named by the setting, as GetInfo says)
    service = _svc(rollout_pb2, "RolloutService")
    async with ServiceRunner(build_service(settings), settings) as runner:
        header = rollout_pb2.AdapterHeader(name="fuzz", version=1, total_size=1024)
        leads = {"LoadAdapter": rollout_pb2.LoadAdapterRequest(header=header)}
        _assert_clean(await walk(runner.address, service, bases, folders=folders, leads=leads))
        _assert_clean(await walk_standard(runner.address, folders))
        other = rollout_pb2.GenerateRequest(model="another-model", prompts=[prompt])
        _assert_clean(await probe(runner.address, service, {"Generate": other}, folders))


def test_the_walk_covers_every_rpc() -> None:
    """Each service's every method gets the undecodable cases, and every leaf field its own."""
    for module in (benchmark_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                names = [c.name for c in cases(method.input_type, None)]
                assert "random bytes" in names
                for path in _paths(method.input_type):
                    assert any(n.startswith(_label(path) + " = ") for n in names), (method.name, _label(path))


# ----------------------------------------------------------------------------------- page sizes

WIDE = "\U0010ffff"  # 4 bytes in UTF-8, and 10 characters in a repr (\U0010ffff): the widest a character gets


def _widest_job() -> Message:
    """The largest Job a list can hold: every string at its size limit in 4-byte characters; the
    warnings, which quote the dataset and split, at their repr's widest; the error at the store's
    2000-character cut; the server-made fields (adapter path, worker address) at a path's limit."""
    from rlvr.infra.schema import JobRow
    from rlvr.jobspec import (
        MAX_DATASET_CHARS,
        MAX_MODEL_CHARS,
        MAX_NAME_CHARS,
        MAX_OPTION_CHARS,
        MAX_PATH_CHARS,
        MAX_SPLIT_CHARS,
    )
    from rlvr.services.scheduler.convert import job_to_proto, spec_to_json

    spec = common_pb2.JobSpec(name=WIDE * MAX_NAME_CHARS, base_model=WIDE * MAX_MODEL_CHARS)
    spec.reward.dataset, spec.reward.dataset_split = WIDE * MAX_DATASET_CHARS, WIDE * MAX_SPLIT_CHARS
    spec.advanced.gpu_selection = spec.advanced.lora_init = WIDE * MAX_OPTION_CHARS
    spec.init_adapter.name, spec.init_adapter.path = WIDE * MAX_NAME_CHARS, WIDE * MAX_PATH_CHARS
    spec.reward.function = common_pb2.REWARD_FUNCTION_BOXED  # a resolved spec has every choice made
    spec.advanced.generation_backend = common_pb2.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type, spec.advanced.quantization = common_pb2.LOSS_TYPE_DAPO, common_pb2.QUANTIZATION_4BIT
    quoted = 10 * (MAX_DATASET_CHARS + MAX_SPLIT_CHARS) + 400  # every warning jobspec.py makes, at most this long
    warnings = ["w" * quoted] * 4
    row = JobRow(id="f" * 64, name=spec.name, spec_json=spec_to_json(spec), status="FAILED", error=WIDE * 2000,
                 adapter_name=WIDE * MAX_NAME_CHARS, adapter_version=2**62, adapter_path=WIDE * MAX_PATH_CHARS,
                 warnings_json=json.dumps(warnings), worker=WIDE * MAX_PATH_CHARS,
                 current_step=2**31 - 1, total_steps=2**31 - 1)
    return job_to_proto(row)


def test_a_full_page_of_the_largest_rows_fits_in_one_message() -> None:
    """ListJobs and ListEvaluations at the largest page (MAX_PAGE) of the largest rows the size
    limits allow stay under the 64 MiB message limit of the services and clients."""
    from rlvr.common.client import MAX_MESSAGE_BYTES
    from rlvr.common.errors import MAX_PAGE
    from rlvr.infra.schema import EvaluationRow
    from rlvr.jobspec import MAX_LABEL_CHARS, MAX_MODEL_CHARS, MAX_NAME_CHARS
    from rlvr.services.benchmark.records import evaluation_of, extras_json

    job = _widest_job()
    jobs = scheduler_pb2.ListJobsResponse(jobs=[job] * MAX_PAGE, total=2**31 - 1)
    sampling = common_pb2.SamplingParams(temperature=2.0, top_p=1.0, max_tokens=2048, seed=2**63)
    evaluation = evaluation_of(EvaluationRow(
        id="f" * 64, model=WIDE * MAX_MODEL_CHARS, adapter_name=WIDE * MAX_NAME_CHARS, adapter_version=2**62,
        benchmark="rlvr-math-pairs-heldout", limit=2**31 - 1, seed=2**63 - 1, status="FAILED", error=WIDE * 2000,
        sampling_json=extras_json(sampling, WIDE * MAX_LABEL_CHARS, 1e9, 1e9), score=1.0, accuracy=1.0,
        accuracy_strict=1.0, format=1.0, answered=2**31 - 1, n_questions=2**31 - 1, n_done=2**31 - 1))
    evaluations = benchmark_pb2.ListEvaluationsResponse(evaluations=[evaluation] * MAX_PAGE, total=2**31 - 1)
    for reply, one in ((jobs, job), (evaluations, evaluation)):
        assert one.ByteSize() > 10_000  # the widest strings really are in it
        assert reply.ByteSize() < MAX_MESSAGE_BYTES, (type(reply).__name__, one.ByteSize(), reply.ByteSize())
    print(f"widest Job {job.ByteSize()} B, page {jobs.ByteSize() / 2**20:.1f} MiB; widest Evaluation "
          f"{evaluation.ByteSize()} B, page {evaluations.ByteSize() / 2**20:.1f} MiB")


async def test_every_bad_field_is_named_at_once(tmp_path: Path, nats_server) -> None:
    """A spec with several bad fields is refused once with every one of them: one line per field in
    the message, and each as a google.rpc.BadRequest field violation (what the SDK, the CLI and the
    console read); CreateLoop prefixes its job's fields with `job.` and adds its own."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from rlvr.peers.base import RlvrError
    from rlvr.services.scheduler.server import build_service
    from rlvr.services.scheduler.settings import SchedulerSettings

    settings = SchedulerSettings(port=0, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", nats_url=nats_server.url,
                                 artifact_root=tmp_path / "artifacts", trainer_addresses=["127.0.0.1:1"],
                                 benchmark_address="127.0.0.1:1")
    spec = common_pb2.JobSpec()
    spec.grpo.lora_rank, spec.grpo.learning_rate = 99, 0.01
    loop = scheduler_pb2.LoopSpec(target=0.0, job=spec)
    async with ServiceRunner(build_service(settings), settings) as runner, \
            grpc.aio.insecure_channel(runner.address) as channel:
        calls = {
            "CreateJob": (scheduler_pb2.CreateJobRequest(spec=spec, dry_run=True), scheduler_pb2.CreateJobResponse,
                          ["grpo.lora_rank", "grpo.learning_rate"]),
            "CreateLoop": (scheduler_pb2.CreateLoopRequest(spec=loop, dry_run=True), scheduler_pb2.CreateLoopResponse,
                           ["target", "job.grpo.lora_rank", "job.grpo.learning_rate"]),
        }
        for method, (request, response, fields) in calls.items():
            call = channel.unary_unary(f"/rlvr.v1.SchedulerService/{method}",
                                       request_serializer=type(request).SerializeToString,
                                       response_deserializer=response.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(request, timeout=20)
            error = refused.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            lines = (error.details() or "").split("\n")
            assert [line.split(": ", 1)[0] for line in lines] == fields
            assert lines[-2].startswith(f"{fields[-2]}: 99 is out of range; allowed: 4-64")
            assert lines[-1].startswith(f"{fields[-1]}: 0.01 is out of range; allowed: 5e-07 to 1e-05")
            status = rpc_status.from_call(error)
            assert status is not None and len(status.details) == 1
            bad = error_details_pb2.BadRequest()
            assert status.details[0].Unpack(bad)
            assert [(v.field, f"{v.field}: {v.description}") for v in bad.field_violations] == \
                [(f, line) for f, line in zip(fields, lines, strict=True)]
            assert RlvrError.from_rpc(error).violations == [(v.field, v.description) for v in bad.field_violations]
