"""Artifacts without a shared disk: two trainer workers and a scheduler, each with an artifact root
of its own (in this process, over real gRPC; the jobs and the merge in processes of their own, a
real embedded NATS and SQLite), as docs/operations.md's multi-host layout runs them.

One real 2-step job on rlvr-tiny-test trains on worker B (listed first, so the first idle one).
Then: the scheduler, whose root does not hold the job, relays DownloadAdapter from B byte for byte;
MergeModel runs on B (it holds the adapter) and DownloadMergedModel is relayed too; a FetchFolder
of B's job folder broken off midway resumes without sending the finished files again (and, with
small chunks, mid-file); a path outside B's root is INVALID_ARGUMENT and a folder not there
NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from rlvr.adapters import ADAPTER_FILES
from rlvr.clients.sdk import SchedulerClient
from rlvr.common.client import make_channel
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncTrainerClient
from rlvr.peers.folders import fetch_folder
from rlvr.services.common.server import ServiceRunner
from rlvr.transfer import PARTIAL_DIR, FolderWriter, folder_chunks, list_files
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S
from rlvr.v1 import trainer_pb2 as T

MODEL = "rlvr-tiny-test"


@dataclass
class Cluster:
    client: SchedulerClient
    roots: dict[str, Path]  # "a", "b", "scheduler": one artifact root each
    addresses: dict[str, str]  # "a", "b": the workers
    job: C.Job  # trained on worker B, COMPLETED


def _spec(steps: int = 2) -> C.JobSpec:
    spec = C.JobSpec(name="relay-test", base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, steps
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 128, 1e-5
    spec.advanced.checkpoint_every = 1  # a job folder of several files: checkpoints, TRL's state
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    return spec


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(nats_server, tmp_path_factory: pytest.TempPathFactory):
    from rlvr.models import resolve_model
    from rlvr.services.scheduler.server import build_service as build_scheduler
    from rlvr.services.scheduler.settings import SchedulerSettings
    from rlvr.services.trainer.server import build_service as build_trainer
    from rlvr.services.trainer.settings import TrainerSettings

    await asyncio.to_thread(resolve_model, MODEL)
    home = tmp_path_factory.mktemp("relay")
    roots = {name: home / name / "artifacts" for name in ("a", "b", "scheduler")}
    settings = {name: TrainerSettings(port=0, artifact_root=roots[name], nats_url=nats_server.url, scorer="local",
                                      torch_threads=1, worker_name=f"trainer-{name}") for name in ("a", "b")}
    async with ServiceRunner(build_trainer(settings["a"]), settings["a"]) as a, \
            ServiceRunner(build_trainer(settings["b"]), settings["b"]) as b:
        addresses = {"a": a.address, "b": b.address}
        scheduler_settings = SchedulerSettings(port=0, database_url=f"sqlite:///{home / 'db.sqlite'}",
                                               nats_url=nats_server.url, artifact_root=roots["scheduler"],
                                               trainer_addresses=[b.address, a.address])
        async with ServiceRunner(build_scheduler(scheduler_settings), scheduler_settings) as scheduler:
            client = SchedulerClient(scheduler.address)
            job_id = (await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=_spec()))).job.id
            await asyncio.to_thread(lambda: list(client.watch(job_id, timeout=240)))
            job = await asyncio.to_thread(client.get_job, S.GetJobRequest(id=job_id))
            assert job.status == C.JOB_STATUS_COMPLETED, job.error
            assert job.worker == b.address and Path(job.adapter.path).is_relative_to(roots["b"].resolve())
            yield Cluster(client, roots, addresses, job)
            client.close()


def _digests(folder: Path) -> dict[str, str]:
    return {rel: hashlib.sha256(path.read_bytes()).hexdigest() for rel, path in list_files(folder)}


async def test_download_adapter_is_relayed_from_the_worker_that_holds_it(cluster: Cluster, tmp_path: Path) -> None:
    folder = Path(cluster.job.adapter.path)
    assert not (cluster.roots["scheduler"] / "jobs").exists() and not (cluster.roots["a"] / "jobs").exists()
    written = await asyncio.to_thread(cluster.client.save_adapter, cluster.job.id, tmp_path / "adapter")
    assert [p.name for p in written] == list(ADAPTER_FILES)
    for name in ADAPTER_FILES:
        assert (tmp_path / "adapter" / name).read_bytes() == (folder / name).read_bytes()
    # Relayed from B's FetchFolder (the scheduler's own disk would send no digest), each chunk
    # with its file's sha256.
    chunks = await asyncio.to_thread(lambda: list(cluster.client.download_adapter(
        S.DownloadAdapterRequest(job_id=cluster.job.id))))
    assert {c.sha256 for c in chunks} == {hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ADAPTER_FILES}


async def test_merge_runs_on_the_holding_worker_and_its_download_is_relayed(cluster: Cluster, tmp_path: Path) -> None:
    done = await asyncio.to_thread(cluster.client.merge, cluster.job.id)
    merged = Path(done.path)
    assert done.done and merged.is_relative_to(cluster.roots["b"].resolve()) and merged.is_dir()
    files = await asyncio.to_thread(cluster.client.save_merged_model, cluster.job.id, tmp_path / "merged")
    assert sum(p.stat().st_size for p in files) == done.size_bytes
    assert _digests(tmp_path / "merged") == _digests(merged)
    chunks = await asyncio.to_thread(lambda: list(cluster.client.download_merged_model(
        S.DownloadMergedModelRequest(job_id=cluster.job.id))))
    assert {c.sha256 for c in chunks} == set(_digests(merged).values())  # relayed from B
    assert not (cluster.roots["scheduler"] / "merged").exists()


async def test_a_broken_fetch_resumes_without_sending_finished_files_again(cluster: Cluster, tmp_path: Path) -> None:
    job_dir = Path(cluster.job.adapter.path).parent  # <root b>/jobs/<id>: adapter, checkpoints, trl, ...
    expected = {rel: sha for rel, sha in _digests(job_dir).items() if rel != "settings.json"}  # B's own (a token)
    assert len(expected) > 6 and (job_dir / "settings.json").is_file(), sorted(expected)
    dest = tmp_path / "job"
    client = AsyncTrainerClient(make_channel(cluster.addresses["b"], aio=True))
    client.address = cluster.addresses["b"]
    writer = FolderWriter(dest, str(job_dir))
    stream = client.fetch_folder(writer.request())
    async for chunk in stream:  # the first three files, then the stream is cut
        await asyncio.to_thread(writer.add, chunk)
        if len(writer.received) == 3:
            stream.cancel()
            break
    first = list(writer.received)
    resumed = await fetch_folder(client, str(job_dir), dest)
    assert not set(first) & set(resumed.received)
    assert sorted(first + resumed.received) == sorted(expected) == sorted(resumed.listing)
    assert _digests(dest) == expected and not (dest / PARTIAL_DIR).exists()
    again = await fetch_folder(client, str(job_dir), dest)  # all held: nothing is sent
    assert again.received == [] and sorted(again.listing) == sorted(expected)


def test_a_file_cut_midway_resumes_at_its_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(bytes(range(256)) * 3)
    (src / "sub" / "b.bin").write_bytes(b"x" * 1000)
    (src / "empty").write_bytes(b"")
    writer = FolderWriter(tmp_path / "dest", str(src))
    chunks = folder_chunks(src, chunk_size=100)
    for chunk in chunks:
        writer.add(chunk)
        if chunk.path == "sub/b.bin" and chunk.offset == 300:
            break  # 400 bytes of b.bin held
    request = writer.request()
    assert (request.resume_path, request.resume_offset) == ("sub/b.bin", 400)
    assert {d.path for d in request.have} == {"a.bin", "empty"}
    rest = list(folder_chunks(src, have={d.path: d.sha256 for d in request.have}, resume_path=request.resume_path,
                              resume_offset=request.resume_offset, chunk_size=100))
    assert [(c.path, c.offset) for c in rest if c.data] == [("sub/b.bin", o) for o in range(400, 1000, 100)]
    for chunk in rest:
        writer.add(chunk)
    writer.finish()
    assert _digests(tmp_path / "dest") == _digests(src)
    # A chunk whose bytes differ from the sender's digest is refused, and its partial copy dropped.
    bad = next(folder_chunks(src, files=["empty"]))
    bad.data, bad.file_size = b"tampered", 8
    with pytest.raises(ValueError, match="sha256"):
        FolderWriter(tmp_path / "other", str(src)).add(bad)
    assert not (tmp_path / "other" / "empty").exists()


async def test_a_path_outside_the_artifact_root_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    client = AsyncTrainerClient(make_channel(cluster.addresses["b"], aio=True))
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key").write_text("no")
    job_dir = Path(cluster.job.adapter.path).parent
    refused = [T.FetchFolderRequest(path=str(outside)),
               T.FetchFolderRequest(path=str(job_dir / ".." / ".." / ".." / ".." / outside.name)),
               T.FetchFolderRequest(path=str(cluster.roots["a"])),  # the other worker's root
               T.FetchFolderRequest(path=str(job_dir), files=["../../../../secret/key"])]
    for request in refused:
        with pytest.raises(RlvrError) as e:
            async for _ in client.fetch_folder(request):
                pass
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, request
        assert "outside the artifact root" in e.value.details
    with pytest.raises(RlvrError) as e:
        async for _ in client.fetch_folder(T.FetchFolderRequest(path="jobs/no-such-job")):
            pass
    assert e.value.code == grpc.StatusCode.NOT_FOUND


async def _run_on(address: str, request: T.StartJobRequest, timeout: float = 120) -> T.WorkerStatus:
    """StartJob on one worker, then its status once the job has ended there."""
    async with AsyncTrainerClient(address) as worker:
        await worker.start_job(request)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status = await worker.get_worker_status(T.GetWorkerStatusRequest())
            if not status.busy and status.last_job_id == request.job_id:
                return status
            assert asyncio.get_running_loop().time() < deadline, "the job did not end in time"
            await asyncio.sleep(0.3)


async def test_a_worker_fetches_an_init_adapter_and_a_resumed_job_from_the_worker_that_holds_them(
        cluster: Cluster) -> None:
    from rlvr.jobspec import resolve_spec

    b_job = Path(cluster.job.adapter.path).parent
    # A loop round on worker A stacking on the adapter worker B trained: by its path on B.
    spec = resolve_spec(_spec(steps=1)).spec
    spec.init_adapter.CopyFrom(cluster.job.adapter)
    request = T.StartJobRequest(job_id="stacked-on-b", spec=spec, total_steps=1)
    async with AsyncTrainerClient(cluster.addresses["a"]) as worker:  # not under A's root, and no source named
        with pytest.raises(RlvrError) as e:
            await worker.start_job(request)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "init_adapter.path" in e.value.details
    request.init_adapter_source = cluster.addresses["b"]
    status = await _run_on(cluster.addresses["a"], request)
    assert status.last_job_status == C.JOB_STATUS_COMPLETED, status.last_job_error
    fetched = cluster.roots["a"] / "jobs" / "stacked-on-b" / "init-adapter"
    assert _digests(fetched) == {n: _digests(b_job / "adapter")[n] for n in ADAPTER_FILES}

    # B's job resumed on A (as after B lost it): A fetches the job's folder, checkpoints included,
    # and goes on from B's last one; B's settings (0600: the service token) stay on B.
    resume = T.StartJobRequest(job_id=cluster.job.id, spec=resolve_spec(_spec(steps=3)).spec, total_steps=3,
                               resume=True, stored_steps=2, resume_source=cluster.addresses["b"])
    status = await _run_on(cluster.addresses["a"], resume)
    assert status.last_job_status == C.JOB_STATUS_COMPLETED, status.last_job_error
    assert status.last_job_adapter.version == 3
    a_job = cluster.roots["a"] / "jobs" / cluster.job.id
    assert "resuming from step 2" in (a_job / "job.log").read_text()
    assert (b_job / "settings.json").is_file() and (b_job / "settings.json").stat().st_mode & 0o077 == 0
    assert (a_job / "settings.json").read_text() != (b_job / "settings.json").read_text()  # A's own


async def test_the_benchmark_fetches_an_adapter_path_it_cannot_read_from_the_worker_that_holds_it(
        cluster: Cluster, tmp_path: Path) -> None:
    from rlvr.common.errors import InvalidArgument
    from rlvr.services.benchmark.peers import ServicePeers
    from rlvr.services.benchmark.planning import _adapter_source

    folder = Path(cluster.job.adapter.path)
    own_root = tmp_path / "benchmark-adapters"  # the benchmark's adapter_roots: not B's
    # A first (its root does not hold the path: it refuses, and B is asked next).
    peers = ServicePeers("127.0.0.1:1", "127.0.0.1:1", trainer_addresses=[cluster.addresses["a"], cluster.addresses["b"]])
    try:
        got = await _adapter_source(str(folder), [own_root], peers, tmp_path / "scratch")
        assert got.is_relative_to(tmp_path / "scratch")
        assert {n: (got / n).read_bytes() for n in ADAPTER_FILES} == {n: (folder / n).read_bytes() for n in ADAPTER_FILES}
        with pytest.raises(InvalidArgument, match="nor does a trainer worker"):
            await _adapter_source(str(cluster.roots["b"] / "jobs" / "none" / "adapter"), [own_root], peers,
                                  tmp_path / "scratch2")
    finally:
        await peers.close()
    alone = ServicePeers("127.0.0.1:1", "127.0.0.1:1")  # no trainer_addresses: local folders only, as before
    try:
        with pytest.raises(InvalidArgument, match="outside the allowed adapter roots"):
            await _adapter_source(str(folder), [own_root], alone, tmp_path / "scratch3")
    finally:
        await alone.close()
