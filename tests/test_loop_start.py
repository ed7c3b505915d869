"""Where a loop's rounds start and what each one is: a loop from a named adapter (an SFT job's) has
that adapter as its baseline's model and round 1's start, and its rank counts against the rollout
server's limit; with LoopSpec.best_step a round is its job's best evaluated step's checkpoint, chosen
from the stored held-out accuracies and kept on the round. A real SQLite store, no stack (the whole
path runs through the real stack in tests/test_e2e_training.py; docs/loops.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.common.errors import InvalidArgument
from rlvr.infra.schema import JobRow, LoopRow, MetricPointRow, RoundRow
from rlvr.infra.store import Store
from rlvr.services.scheduler import loop_rules
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loop_driver import LoopDriver
from rlvr.services.scheduler.loops import LoopManager
from rlvr.services.scheduler.loopspec import check_own_fields
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S


def test_the_best_step_is_the_highest_held_out_accuracy_with_a_checkpoint() -> None:
    points = [(1, None), (2, 0.30), (3, None), (4, 0.50), (5, 0.55), (6, 0.45), (8, 0.40)]
    assert loop_rules.best_step(points, last=8, checkpoint_every=2) == 4  # step 5 has no checkpoint
    assert loop_rules.best_step(points, last=8, checkpoint_every=1) == 5
    assert loop_rules.best_step([(2, 0.5), (4, 0.5)], last=4, checkpoint_every=2) == 4  # a tie: the later
    assert loop_rules.best_step([(1, None), (2, None)], last=2, checkpoint_every=1) == 2  # none evaluated: the last


def test_best_step_needs_evaluations_with_checkpoints() -> None:
    spec = S.LoopSpec(target=50.0, best_step=True, job=C.JobSpec(base_model="rlvr-tiny"))
    with pytest.raises(InvalidArgument, match="best_step: needs job.advanced.eval_every \\(now 0\\)"):
        check_own_fields(spec, 64)
    spec.job.advanced.eval_every, spec.job.advanced.checkpoint_every = 4, 3
    with pytest.raises(InvalidArgument, match="eval_every a multiple of checkpoint_every"):
        check_own_fields(spec, 64)
    spec.job.advanced.checkpoint_every = 2
    assert check_own_fields(spec, 64).spec.best_step


def _manager(store: Store, tmp_path: Path) -> LoopManager:
    return LoopManager(store, None, JobManager(store, None, None),  # type: ignore[arg-type]
                       benchmarks=None, artifact_root=tmp_path)  # type: ignore[arg-type]


async def test_a_round_is_its_best_steps_checkpoint_and_the_next_round_stacks_on_it(sqlite_store: Store,
                                                                                    tmp_path: Path) -> None:
    loops = _manager(sqlite_store, tmp_path)
    job = sqlite_store.add_job(JobRow(name="R1", status="COMPLETED", adapter_name="job-x", adapter_version=4))
    adapter = tmp_path / "jobs" / job.id / "adapter"
    sqlite_store.update_job(job.id, adapter_path=str(adapter), current_step=4)
    for step, accuracy in ((1, None), (2, 0.6), (3, None), (4, 0.4)):
        sqlite_store.add_metric_point(MetricPointRow(job_id=job.id, step=step, total_steps=4,
                                                     heldout_accuracy=accuracy))
    checkpoint = adapter.parent / "checkpoints" / "step-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text(json.dumps({"r": 8}))
    loop = sqlite_store.add_loop(LoopRow(name="l", status="BENCHMARKING", spec_json="{}"))
    spec = S.LoopSpec(best_step=True, job=C.JobSpec(base_model="rlvr-tiny"))
    spec.job.advanced.eval_every = spec.job.advanced.checkpoint_every = 2
    row = sqlite_store.add_round(RoundRow(loop_id=loop.id, index=1, job_id=job.id, status="BENCHMARKING"))
    chosen = await loops._choose_step(spec, row, sqlite_store.get_job(job.id))
    assert (chosen.adapter_step, chosen.adapter_path) == (2, str(checkpoint))
    stored = sqlite_store.rounds(loop.id)[0]
    assert (stored.adapter_step, stored.adapter_path) == (2, str(checkpoint))
    request = LoopDriver._evaluation_request(spec, "R1", sqlite_store.get_job(job.id), stored)
    assert (request.adapter.name, request.adapter_path) == ("job-x", str(checkpoint))
    # without its folder the round is the final adapter
    checkpoint.joinpath("adapter_config.json").unlink()
    other = sqlite_store.add_round(RoundRow(loop_id=loop.id, index=2, job_id=job.id, status="BENCHMARKING"))
    assert (await loops._choose_step(spec, other, sqlite_store.get_job(job.id))).adapter_step == 0


def test_the_baseline_of_a_loop_from_an_adapter_scores_that_adapter() -> None:
    spec = S.LoopSpec(benchmark="rlvr-math-pairs-heldout", job=C.JobSpec(base_model="rlvr-tiny"))
    assert not LoopDriver._evaluation_request(spec, "baseline").HasField("adapter")
    spec.job.init_adapter.CopyFrom(C.AdapterRef(name="job-sft", path="/art/jobs/sft/adapter"))
    request = LoopDriver._evaluation_request(spec, "baseline")
    assert (request.adapter.name, request.adapter_path) == ("job-sft", "/art/jobs/sft/adapter")
