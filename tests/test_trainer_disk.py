"""A full artifact disk, on a real small filesystem: a tmpfs mounted for each test as the job's
artifact root (root may mount one; elsewhere the tests skip saying why, and under CI=true, whose
host is root, they fail instead).

A write that finds the disk full leaves nothing half-written, says so naming the disk and its free
bytes, and is taken again once space comes back (artifacts.DiskSpace): the job then ends with the
adapter an undisturbed run gives, byte for byte. A disk that stays full past the wait fails the job
with the same message, and the job's result.json is still written (artifacts.reserve).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_trainer_job import _job, _scorer

from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.job.engine import RESUME_FILE, checkpoints
from rlvr.services.trainer.job.runner import JobDeps, run_job

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own (a job of the test model takes about 0.5 MiB)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                              capture_output=True, text=True, timeout=30)
        why = done.stderr.strip() or f"mount exited with {done.returncode}"
    except OSError as e:
        done, why = None, str(e)
    if done is None or done.returncode != 0:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"cannot mount a tmpfs for the full-disk tests ({why}); CI runs as root and must")
        pytest.skip(f"cannot mount a tmpfs for the full-disk tests ({why}): they need root")
    try:
        yield mount
    finally:
        busy = subprocess.run(["umount", str(mount)], capture_output=True, text=True, timeout=30).returncode
        if busy:  # a file left open on it (its space is not given back either)
            subprocess.run(["umount", "--lazy", str(mount)], check=True, timeout=30)
            pytest.fail(f"{mount} was still in use at the end of the test")


def fill(disk: Path) -> Path:
    """Takes every free byte of `disk`; the file that holds them."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    assert artifacts.free_bytes(disk) < 4096
    return filler


def test_a_job_whose_disk_fills_waits_for_space_and_ends_with_the_undisturbed_adapter(
        tmp_path: Path, small_disk: Path, tiny_model: str) -> None:
    """The disk fills at step 1, just before TRL writes that step's checkpoint: its partial folder is
    removed, the job says so (the status message job_process publishes), and once the filler is
    deleted the checkpoint is written whole and the job goes on, to the undisturbed run's bytes."""
    options = dict(synthetic_prompts=8, batch_size=8, group_size=2, max_steps=2, checkpoint_every=1,
                   max_completion_tokens=16)
    whole = run_job(_job(tmp_path / "whole", tiny_model, **options), JobDeps(scorer=_scorer(), publish=lambda e: None))
    assert whole.status == "completed", whole.error

    root = small_disk / "artifacts"
    fillers: list[Path] = []
    notices: list[str] = []

    def on_step(step: int, total: int) -> None:
        if step == 1:
            fillers.append(fill(small_disk))

    def on_wait(message: str) -> None:  # the job's status message; seen, space comes back
        notices.append(message)
        partial = root / "jobs" / "t1" / "trl" / "checkpoint-1"
        assert not partial.exists(), "the partial checkpoint is still there while the job waits"
        fillers.pop().unlink()

    space = artifacts.DiskSpace(root, wait_s=60, on_wait=on_wait, poll_s=0.05)
    result = run_job(_job(root, tiny_model, **options),
                     JobDeps(scorer=_scorer(), publish=lambda e: None, on_step=on_step, space=space))
    assert result.status == "completed", result.error
    assert len(notices) == 1, notices
    assert re.fullmatch(rf"no space left on {re.escape(str(root))} \(\d+(\.\d)? (B|KiB|MiB) free\): step 1's "
                        r"checkpoint not written; waiting for space \(up to 60 s\)", notices[0]), notices[0]
    job_dir = root / "jobs" / "t1"
    assert all((path / RESUME_FILE).is_file() for _, path in checkpoints(job_dir))  # every checkpoint whole
    assert sorted(step for step, _ in checkpoints(job_dir)) == [1, 2]
    for name in artifacts.ADAPTER_FILES:
        assert (Path(result.adapter_path) / name).read_bytes() == (Path(whole.adapter_path) / name).read_bytes()
    assert not [p for p in job_dir.rglob(".*") if p.name.endswith((".tmp", ".staging"))]


def test_a_write_into_a_full_disk_leaves_nothing_and_fails_naming_the_disk_after_the_wait(small_disk: Path) -> None:
    """torch.save's error on a full disk names no cause ("iostream error"): the disk's free bytes
    tell. The partial folder goes, and its space with it (the failed writer's file is closed before
    the wait), the wait is bounded, and the error carries the wait's message."""
    import torch

    root = small_disk / "artifacts"
    partial = root / "checkpoint-3"
    partial.mkdir(parents=True)
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 65536)  # 64 KiB free, which the partial file takes
    notices: list[str] = []
    space = artifacts.DiskSpace(root, wait_s=0.3, on_wait=notices.append, poll_s=0.05)
    with pytest.raises(artifacts.DiskFull) as failed:
        space.write("step 3's checkpoint", lambda: torch.save({"w": torch.zeros(100_000)}, partial / "optimizer.pt"),
                    partial=partial)
    assert notices == [f"no space left on {root} (64.0 KiB free): step 3's checkpoint not written; "
                       "waiting for space (up to 0.3 s)"]
    assert str(failed.value).startswith(f"no space left on {root} (")
    assert "step 3's checkpoint not written; no space came back within 0.3 s" in str(failed.value)
    assert not partial.exists()

    # Each writer removes its own temporary file; an error that is not the disk's is not waited on.
    with pytest.raises(artifacts.DiskFull):
        artifacts.DiskSpace(root).write("step 3's progress.json",
                                        lambda: artifacts.write_json_atomic(root / "progress.json", {"x": "y" * 100_000}))
    assert sorted(p.name for p in root.iterdir()) == []
    filler.unlink()
    with pytest.raises(KeyError):
        artifacts.DiskSpace(root, wait_s=60).write("step 3's adapter", lambda: {}["a"])


def test_a_result_is_written_into_its_reserved_room_on_a_full_disk(small_disk: Path) -> None:
    """The job process reserves its result.json's room when it starts (job_process.run): a job
    failed for a full disk still has its result read by the worker, not reported lost."""
    job_dir = small_disk / "jobs" / "t1"
    job_dir.mkdir(parents=True)
    artifacts.reserve(job_dir / "result.json")
    fill(small_disk)
    result = {"status": "failed", "error": "no space left on ... " + "x" * 500}
    artifacts.write_json_atomic(job_dir / "result.json", result)
    assert artifacts.read_json(job_dir / "result.json") == result
    assert sorted(p.name for p in job_dir.iterdir()) == ["result.json"]
