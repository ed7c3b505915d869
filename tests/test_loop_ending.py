"""How a loop ends when something around its end goes wrong: a job that cannot be cancelled at
StopLoop, files that cannot be reclaimed, a failure after the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_scheduler_jobs import FakeWorkers

from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.infra.store import Store
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loops import LoopManager
from rlvr.services.scheduler.workers import WorkerError, WorkerRejected, WorkerUnavailable
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S


class CancelFails(FakeWorkers):
    def __init__(self, error: WorkerError) -> None:
        super().__init__(1)
        self.error = error

    async def cancel(self, address: str, job_id: str) -> C.AdapterRef:
        self.cancelled.append(job_id)
        raise self.error


@pytest.mark.parametrize("error", [WorkerUnavailable("trainer w0:1 is unreachable"),
                                   WorkerRejected("trainer w0:1 refused CancelJob")], ids=["unreachable", "refusing"])
async def test_a_loop_stops_though_its_running_job_cannot_be_cancelled(
        store: Store, tmp_path: Path, error: WorkerError) -> None:
    workers = CancelFails(error)
    jobs = JobManager(store, None, workers)
    loops = LoopManager(store, None, jobs, benchmarks=None, artifact_root=tmp_path)  # type: ignore[arg-type]
    loop = store.add_loop(LoopRow(name="l", status="TRAINING", spec_json="{}"))
    _, job = store.add_round_with_job(RoundRow(loop_id=loop.id, index=1),
                                             JobRow(name="r1", status="RUNNING", worker="w0:1"))
    stopped = await loops.stop_loop(loop.id)
    assert workers.cancelled == [job.id]
    assert stopped.status == S.LOOP_STATUS_STOPPED
    assert f"rlvr jobs cancel {job.id}" in stopped.message and str(error) in stopped.message
    round_ = store.get_round(loop.id, 1)
    assert round_.status == "STOPPED" and f"rlvr jobs cancel {job.id}" in round_.error
    assert store.get_job(job.id).status == "RUNNING"  # not cancelled: the message says so


async def test_a_reclaim_that_fails_leaves_the_loops_end_as_it_was(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """reclaim_storage after the target was reached: files that cannot be removed now are logged
    and left for the next reclaim; the loop stays TARGET_REACHED, and a failure reported after its
    end (the driver's catch-all) does not turn it into FAILED."""
    from rlvr.services.scheduler import loops as loops_module

    jobs = JobManager(store, None, FakeWorkers())
    loops = LoopManager(store, None, jobs, benchmarks=None, artifact_root=tmp_path)  # type: ignore[arg-type]
    loop = store.add_loop(LoopRow(name="l", status="TRAINING", spec_json='{"reclaimStorage": true}'))
    store.add_round_with_job(RoundRow(loop_id=loop.id, index=1, status="SCORED", score=60.0),
                                    JobRow(name="r1", status="COMPLETED"))

    def unremovable(*_: object) -> int:
        raise PermissionError(13, "Permission denied", str(tmp_path / "jobs"))

    monkeypatch.setattr(loops_module, "reclaim_job", unremovable)
    await loops._transition(loop.id, "TARGET_REACHED", 1, "reached 60.0% in round 1")
    assert store.get_loop(loop.id).status == "TARGET_REACHED"
    await loops._fail(loop.id, "internal error while driving the loop: boom")
    row = store.get_loop(loop.id)
    assert (row.status, row.error) == ("TARGET_REACHED", "")
