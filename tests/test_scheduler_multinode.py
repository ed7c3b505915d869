"""A job of several nodes (advanced.num_nodes) in the scheduler's job core, over a real store with
scripted workers (test_scheduler_jobs.FakeWorkers, which also record each StartJob's node rank and
rendezvous endpoint here): refused at CreateJob when fewer workers exist, waits QUEUED until that
many are idle, starts on all of them or on none (node 0 last), ends with node 0's outcome, and
follows the node failure rule (services/scheduler/dispatch.py): once no node runs it, it is queued
again and resumed on as many workers, within MAX_RESUMES."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

import pytest
from test_scheduler_jobs import FakeWorkers

from rlvr.common.errors import InvalidArgument
from rlvr.common.nodes import peer_lost_error
from rlvr.infra.store import Store
from rlvr.services.scheduler.actions import JobActions
from rlvr.services.scheduler.jobs import MAX_RESUMES, JobManager
from rlvr.services.scheduler.nodes import AT_WORK, ENDED, LOST, Outages, judge
from rlvr.services.scheduler.workers import WorkerBusy, WorkerState
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T


class NodeWorkers(FakeWorkers):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.addresses = [f"10.0.0.{i + 1}:5005{i}" for i in range(n)]
        self.nodes: list[tuple[str, int, str]] = []  # (address, node_rank, endpoint) of each StartJob
        self.fetched: list[tuple[str, str]] = []  # (address, path) of each FetchFolder
        self.merged: list[tuple[str, str]] = []  # (address, adapter path) of each MergeAdapter

    async def start(self, address: str, job_id: str, spec: C.JobSpec, total_steps: int, resume: bool = False,
                    stored_steps: int = 0, node_rank: int = 0, rendezvous_endpoint: str = "", **sources: str) -> str:
        self.nodes.append((address, node_rank, rendezvous_endpoint))
        return await super().start(address, job_id, spec, total_steps, resume, stored_steps, **sources)

    async def fetch(self, address: str, path: str, files: Sequence[str] | None = None
                    ) -> AsyncGenerator[C.FileChunk, None]:
        self.fetched.append((address, path))
        yield C.FileChunk(path="adapter_config.json", data=b"{}", file_size=2, last=True)

    async def merge(self, address: str, request: T.MergeAdapterRequest) -> AsyncGenerator[T.MergeProgress, None]:
        self.merged.append((address, request.adapter_path))
        yield T.MergeProgress(done=True, path=f"/{address}/merged/{request.output_name}", size_bytes=7)


def _spec(nodes: int) -> C.JobSpec:
    spec = C.JobSpec()
    spec.grpo.max_steps, spec.grpo.batch_size, spec.grpo.group_size = 3, 8, 2
    spec.advanced.num_nodes = nodes
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    return spec


async def test_more_nodes_than_workers_is_refused_at_create(sqlite_store: Store) -> None:
    jobs = JobManager(sqlite_store, None, NodeWorkers(2))
    with pytest.raises(InvalidArgument, match="advanced.num_nodes: 4 nodes need 4 trainer workers, but this "
                                              "scheduler has 2"):
        await jobs.create(_spec(4), dry_run=False)
    with pytest.raises(InvalidArgument, match="advanced.num_nodes: 17 is out of range"):
        await jobs.create(_spec(17), dry_run=False)
    with pytest.raises(InvalidArgument, match="grpo.batch_size: 8 does not split into whole groups of grpo.group_size "
                                              "8 on each of advanced.num_nodes 2 x advanced.num_processes 1"):
        spec = _spec(2)
        spec.grpo.group_size = 8
        await jobs.create(spec, dry_run=False)


async def test_waits_for_enough_idle_workers_then_starts_on_all_node_zero_last(sqlite_store: Store) -> None:
    workers = NodeWorkers(4)
    jobs = JobManager(sqlite_store, None, workers, rendezvous_port=29500)
    workers.running[workers.addresses[1]] = "another"  # one of four busy: three idle
    _, three = await jobs.create(_spec(4), dry_run=False)
    await jobs.dispatch_once()
    row = sqlite_store.get_job(three.id)
    assert (row.status, row.worker, workers.calls) == ("QUEUED", "", [])  # never half-started
    assert "waits for 4 idle trainer workers that fit it (advanced.num_nodes 4); 3 now" in row.queue_reason
    del workers.running[workers.addresses[1]]
    await jobs.dispatch_once()
    row = sqlite_store.get_job(three.id)
    a = workers.addresses
    assert (row.status, row.worker) == ("RUNNING", ",".join(a))  # node 0 first
    # Nodes 1-3 first, node 0 last; the rendezvous on node 0's host, its own port.
    assert workers.nodes == [(a[i], i, "10.0.0.1:29500") for i in (1, 2, 3, 0)]
    await jobs.dispatch_once()  # every node runs it: nothing changes
    assert sqlite_store.get_job(three.id).status == "RUNNING" and len(workers.calls) == 4


async def test_a_refused_node_stops_the_parts_started_all_or_none(sqlite_store: Store) -> None:
    workers = NodeWorkers(2)
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(_spec(2), dry_run=False)
    workers.fail_next[workers.addresses[0]] = (WorkerBusy("busy"), False, False)  # node 0, started last
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker) == ("QUEUED", "")
    assert workers.cancelled == [job.id] and workers.running == {}  # node 1's part stopped
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job.id).status == "RUNNING"


async def test_node_zero_outcome_is_the_job_and_a_lost_node_resumes_on_as_many(sqlite_store: Store) -> None:
    workers = NodeWorkers(2)
    a = workers.addresses
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(_spec(2), dry_run=False)
    await jobs.dispatch_once()
    sqlite_store.update_job(job.id, current_step=2)
    for n in range(1, MAX_RESUMES + 1):
        # Node 1's process dies: node 0's part still runs (it is about to lose its peer): RUNNING.
        workers.lose(job.id, "the job process killed by signal 9 without a result")
        workers.running[a[0]] = job.id
        await jobs.dispatch_once()
        assert sqlite_store.get_job(job.id).status == "RUNNING"
        # Node 0's part ends lost too: no node runs it, so it is queued again and resumed on both.
        del workers.running[a[0]]
        workers.last[a[0]] = (job.id, "FAILED:lost a node")
        workers.lost.add(a[0])
        await jobs.dispatch_once()
        row = sqlite_store.get_job(job.id)
        assert (row.status, row.worker, row.resumes) == ("RUNNING", ",".join(a), n), row.error
        assert workers.resumes[-2:] == [(job.id, True, 2)] * 2
    workers.lose(job.id, "the job process killed by signal 9 without a result")
    await jobs.dispatch_once()
    failed = sqlite_store.get_job(job.id)
    assert failed.status == "FAILED"
    assert failed.error.startswith("nodes 0 and 1 were lost at step 2: node 0 (10.0.0.1:50050): the job process "
                                   "killed by signal 9 without a result; node 1 (10.0.0.2:50051): the job process killed")
    assert failed.error.endswith(f"not resumed again after {MAX_RESUMES} resumes")

    _, done = await jobs.create(_spec(2), dry_run=False)
    await jobs.dispatch_once()
    workers.finish(done.id, "COMPLETED")  # both parts end; node 0's outcome is the job's
    await jobs.dispatch_once()
    assert sqlite_store.get_job(done.id).status == "COMPLETED"


async def test_cancel_stops_every_node(sqlite_store: Store) -> None:
    workers = NodeWorkers(2)
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(_spec(2), dry_run=False)
    await jobs.dispatch_once()
    cancelled = await jobs.cancel(job.id)
    assert cancelled.status == C.JOB_STATUS_CANCELLED
    assert workers.cancelled == [job.id, job.id] and workers.running == {}


async def test_the_adapter_is_downloaded_and_merged_from_node_zero(sqlite_store: Store, tmp_path: Path) -> None:
    """A completed job of two nodes records both workers ("node0,node1"); its adapter lies under node
    0's artifact root (not on the scheduler's disk), so DownloadAdapter is relayed from node 0 and
    MergeModel runs there."""
    workers = NodeWorkers(2)
    a = workers.addresses
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(_spec(2), dry_run=False)
    folder = f"/host-of-{a[1]}/jobs/{job.id}/adapter"
    sqlite_store.update_job(job.id, status="COMPLETED", worker=f"{a[1]},{a[0]}", adapter_name=f"job-{job.id}",
                            adapter_version=3, adapter_path=folder)
    actions = JobActions(jobs, tmp_path / "scheduler-root")
    chunks = [c async for c in actions.adapter_chunks(job.id)]
    assert [c.path for c in chunks] == ["adapter_config.json"]
    assert workers.fetched == [(a[1], folder)]  # node 0, not the "node0,node1" string
    progress = [p async for p in actions.merge(job.id)]
    assert progress[-1].done and workers.merged == [(a[1], folder)]
    # A job of one node that starts from that adapter fetches it from node 0 too.
    spec = _spec(1)
    spec.init_adapter.name = f"job-{job.id}"
    _, stacked = await jobs.create(spec, dry_run=False)
    workers.running[a[1]] = "another"  # node 0 busy: the job starts on node 1's worker, which lacks the adapter
    await jobs.dispatch_once()
    assert sqlite_store.get_job(stacked.id).worker == a[0]
    assert workers.sources[stacked.id] == {"init_adapter_source": a[1]}


# ---------------------------------------------------------------- a node lost (services/scheduler/nodes.py)

A0, A1 = "10.0.0.1:50050", "10.0.0.2:50051"
T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def _state(address: str, job_id: str = "", last: str = "", status: str = "", error: str = "",
           lost: bool = False) -> WorkerState:
    return WorkerState(address=address, name=address, busy=bool(job_id), job_id=job_id, last_job_id=last,
                       last_status=status, last_error=error, last_lost=lost)


def test_the_lost_node_rule_reads_the_workers_answers_and_their_outages() -> None:
    peer = peer_lost_error("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    node0_lost_peer = _state(A0, last="j", status="FAILED", error=peer, lost=True)
    # Node 1's worker stopped answering at T0; node 0's part lost its peer and ended.
    for seconds in (0, 59):
        verdict = judge("j", [A0, A1], {A0: node0_lost_peer, A1: None}, {A1: T0}, T0 + seconds, 60)
        assert verdict.kind == AT_WORK, seconds  # not lost yet: it may come back
    verdict = judge("j", [A0, A1], {A0: node0_lost_peer, A1: None}, {A1: T0}, T0 + 60, 60)
    assert (verdict.kind, verdict.what(), verdict.since) == (LOST, f"node 1 ({A1})", T0)
    assert verdict.why() == "its worker has not answered since 2027-01-15 08:00:00 UTC"  # not node 0's peer loss
    # Lost even while node 0's part still runs; node 1's part, were it reachable, would be stopped.
    assert judge("j", [A0, A1], {A0: _state(A0, "j"), A1: None}, {A1: T0}, T0 + 60, 60).kind == LOST
    three = judge("j", [A0, A1, "h:3"], {A0: _state(A0, "j"), A1: _state(A1, "j"), "h:3": None}, {"h:3": T0},
                  T0 + 60, 60)
    assert (three.what(), three.stop) == ("node 2 (h:3)", (A1,))
    # Node 1's worker answered again (restarted) before node_lost_seconds: it is the node named, with its
    # worker's word, and node 0 (which only lost its peer) is not.
    restarted = _state(A1, last="j", status="FAILED", lost=True,
                       error="the trainer service trainer-b was restarted while the job ran (its part of node 1)")
    verdict = judge("j", [A0, A1], {A0: node0_lost_peer, A1: restarted}, {}, T0, 60)
    assert (verdict.kind, verdict.what(), verdict.why(), verdict.since) == (
        LOST, f"node 1 ({A1})", restarted.last_error, None)
    unknown = judge("j", [A0, A1], {A0: node0_lost_peer, A1: _state(A1)}, {}, T0, 60)
    assert unknown.why() == "its worker no longer knows the job (restarted?)"
    # Node 0 completed: the job's outcome; every part at work: nothing to do.
    done = _state(A0, last="j", status="COMPLETED")
    assert judge("j", [A0, A1], {A0: done, A1: None}, {A1: T0}, T0 + 600, 60).kind == ENDED
    assert judge("j", [A0, A1], {A0: _state(A0, "j"), A1: _state(A1, "j")}, {}, T0, 60).kind == AT_WORK


def test_outages_keep_since_when_each_worker_has_not_answered() -> None:
    outages = Outages()
    outages.observe({A0: _state(A0), A1: None}, T0)
    outages.observe({A0: _state(A0), A1: None}, T0 + 4)
    assert outages.down_since == {A1: T0}  # the outage's start, not the last failed call
    outages.observe({A0: None, A1: _state(A1)}, T0 + 8)
    assert outages.down_since == {A0: T0 + 8}


async def test_a_lost_node_frees_the_survivor_and_the_job_resumes_on_its_return_or_fails(sqlite_store: Store) -> None:
    """kill -9 of node 1's worker mid-job: within node_lost_seconds the job names node 1 and since
    when (its status message and queue reason), its survivor runs a job of one node queued
    meanwhile, and it resumes on both once node 1's worker is back and the survivor idle; lost
    again, it fails naming node 1 once node_wait_seconds have passed."""
    workers = NodeWorkers(2)
    a = workers.addresses
    jobs = JobManager(sqlite_store, None, workers, node_lost_seconds=60, node_wait_seconds=600)
    now = [T0]
    jobs.dispatcher.clock = lambda: now[0]
    _, job = await jobs.create(_spec(2), dry_run=False)
    await jobs.dispatch_once()
    sqlite_store.update_job(job.id, current_step=2)
    # Node 1's worker dies with its part; node 0's part loses its peer and ends lost.
    workers.down.add(a[1])
    workers.running.clear()
    workers.last[a[0]] = (job.id, f"FAILED:{peer_lost_error('RuntimeError: Connection closed by peer')}")
    workers.lost.add(a[0])
    _, single = await jobs.create(_spec(1), dry_run=False)
    await jobs.dispatch_once()
    now[0] += 59
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job.id).status == "RUNNING"  # not lost yet: both workers stay its own
    assert sqlite_store.get_job(single.id).status == "QUEUED"
    now[0] += 1
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker, row.resumes) == ("QUEUED", "", 1)
    assert row.queue_reason.startswith(
        f"node 1 ({a[1]}) lost since 2027-01-15 08:00:00 UTC (its worker has not answered since 2027-01-15 "
        "08:00:00 UTC); waits for 2 idle trainer workers that fit it (advanced.num_nodes 2); 1 now")
    assert row.queue_reason.endswith("fails at 2027-01-15 08:11:00 UTC unless it resumes by then")
    assert (sqlite_store.get_job(single.id).status, sqlite_store.get_job(single.id).worker) == ("RUNNING", a[0])
    # Node 1's worker is back (restarted); the job resumes once the survivor is idle again.
    workers.down.discard(a[1])
    workers.last[a[1]] = (job.id, "FAILED:the trainer service was restarted while the job ran (its part of node 1)")
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job.id).status == "QUEUED"
    workers.finish(single.id, "COMPLETED")
    await jobs.dispatch_once()
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job.id)
    assert (row.status, row.worker) == ("RUNNING", f"{a[0]},{a[1]}") and workers.resumes[-2:] == [(job.id, True, 2)] * 2
    assert jobs.dispatcher.node_losses == {}

    # Lost again, while node 0's part still runs (it is about to lose its peer): queued, and node 0's
    # part is not cancelled (node 0 would publish CANCELLED for the job).
    workers.down.add(a[1])
    cancelled = list(workers.cancelled)
    await jobs.dispatch_once()
    now[0] += 60
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job.id).status == "QUEUED" and workers.cancelled == cancelled
    now[0] += 599
    await jobs.dispatch_once()
    assert sqlite_store.get_job(job.id).status == "QUEUED"
    now[0] += 1
    await jobs.dispatch_once()
    row = sqlite_store.get_job(job.id)
    assert row.status == "FAILED"
    assert row.error == (f"node 1 ({a[1]}) was lost at step 2 (its worker has not answered since 2027-01-15 "
                         "08:01:00 UTC), and no 2 idle trainer workers that fit the job were found to resume it "
                         "within node_wait_seconds (600 s, by 2027-01-15 08:12:00 UTC)")


async def test_a_resume_names_the_lost_node_not_the_one_that_lost_its_peer(sqlite_store: Store) -> None:
    workers = NodeWorkers(2)
    a = workers.addresses
    jobs = JobManager(sqlite_store, None, workers)
    _, job = await jobs.create(_spec(2), dry_run=False)
    await jobs.dispatch_once()
    sqlite_store.update_job(job.id, current_step=2)
    workers.running.clear()
    workers.last[a[0]] = (job.id, f"FAILED:{peer_lost_error('RuntimeError: Connection closed by peer')}")
    workers.last[a[1]] = (job.id, "FAILED:the job process killed by signal 9 without a result")
    workers.lost.update(a)
    resumed: list[str] = []

    async def record(job_id: str, status: str, message: str, *rest: object) -> None:
        resumed.append(message)

    jobs.lifecycle.publish_status = record  # type: ignore[method-assign,assignment]
    await jobs.dispatch_once()
    assert resumed[0] == (f"resuming from the last checkpoint after node 1 ({a[1]}) was lost at step 2 (the job "
                          "process killed by signal 9 without a result); resume 1 of 3")
