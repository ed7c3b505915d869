"""Reclaim storage between loop rounds (services/scheduler/reclaim.py): a finished job's checkpoints,
scratch folder and merged checkpoints go, with their bytes counted; its adapter always stays."""

from __future__ import annotations

from pathlib import Path

from rlvr.infra.schema import ArtifactRow, JobRow
from rlvr.infra.store import Store
from rlvr.services.scheduler.reclaim import reclaim_job


def _write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_reclaim_keeps_the_adapter_and_counts_what_it_deletes(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    job = store.add_job(JobRow(name="r1"))
    job_dir = root / "jobs" / job.id
    _write(job_dir / "adapter" / "adapter_model.safetensors", 1000)
    _write(job_dir / "adapter" / "adapter_config.json", 10)
    _write(job_dir / "checkpoints" / "step-1" / "adapter_model.safetensors", 300)
    _write(job_dir / "checkpoints" / "step-2" / "adapter_model.safetensors", 300)
    _write(job_dir / "trl" / "scratch.bin", 40)
    _write(job_dir / "job.log", 5)
    merged = root / "merged" / f"job-{job.id}-v2"
    _write(merged / "model.safetensors", 2000)
    store.add_artifact(ArtifactRow(job_id=job.id, kind="merged", path=str(merged)))
    outside = tmp_path / "elsewhere"
    _write(outside / "model.safetensors", 7)
    store.add_artifact(ArtifactRow(job_id=job.id, kind="merged", path=str(outside)))  # never outside the root

    assert reclaim_job(store, root, job.id) == 300 + 300 + 40 + 2000
    assert (job_dir / "adapter" / "adapter_model.safetensors").stat().st_size == 1000  # always kept
    assert (job_dir / "job.log").is_file()
    assert not (job_dir / "checkpoints").exists() and not (job_dir / "trl").exists() and not merged.exists()
    assert (outside / "model.safetensors").is_file()
    assert [a.path for a in store.artifacts(job.id, "merged")] == [str(outside)]  # the record of what went is gone
    assert reclaim_job(store, root, job.id) == 0  # nothing left to reclaim
    store.close()


def test_reclaim_keeps_the_checkpoint_a_round_is(tmp_path: Path) -> None:
    """LoopSpec.best_step: a round whose adapter is its step-1 checkpoint keeps that folder."""
    root = tmp_path / "artifacts"
    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    job = store.add_job(JobRow(name="r1"))
    job_dir = root / "jobs" / job.id
    for step in (1, 2):
        _write(job_dir / "checkpoints" / f"step-{step}" / "adapter_model.safetensors", 300)
    _write(job_dir / "trl" / "scratch.bin", 40)
    assert reclaim_job(store, root, job.id, keep=job_dir / "checkpoints" / "step-1") == 300 + 40
    assert (job_dir / "checkpoints" / "step-1" / "adapter_model.safetensors").is_file()
    assert not (job_dir / "checkpoints" / "step-2").exists() and not (job_dir / "trl").exists()
