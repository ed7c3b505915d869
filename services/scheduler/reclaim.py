"""Reclaim storage between loop rounds: delete what a finished job made beside its adapter; and
delete all of a job's files when the job itself is deleted (`delete_job_files`).

A job's adapter (`<artifact_root>/jobs/<id>/adapter`) is always kept: it is the round's result and
stays servable and downloadable. What goes, for the loop's "Reclaim storage between rounds":
its intermediate checkpoints (`checkpoints/`, advanced.checkpoint_every), the trainer's scratch
folder (`trl/`, TRL's output_dir) and its merged checkpoints (`<artifact_root>/merged/...`, with
their records). Files, not rows of the job itself: the job stays listed with its metrics.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from rlvr.infra.schema import JobRow
from rlvr.infra.store import Store

log = logging.getLogger("rlvr.scheduler.reclaim")

JOB_EXTRAS = ("checkpoints", "trl")  # folders of a job beside its adapter


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _remove(path: Path, root: Path) -> int | None:
    """Deletes `path` (which must lie under `root`) and returns the bytes it held; None, deleting
    nothing, for a path outside the root."""
    resolved = path.resolve()
    if root.resolve() not in resolved.parents:
        log.warning("not reclaiming %s: outside the artifact root %s", path, root)
        return None
    if not resolved.exists():
        return 0
    size = tree_size(resolved)
    if resolved.is_dir():
        shutil.rmtree(resolved, ignore_errors=True)
    else:
        resolved.unlink(missing_ok=True)
    return size


def reclaim_job(store: Store, artifact_root: Path, job_id: str, keep: Path | None = None) -> int:
    """Deletes a finished job's extras (see the module docstring) but `keep`, a checkpoint that is
    a loop round's adapter (LoopSpec.best_step); returns the bytes freed."""
    freed = 0
    job_dir = artifact_root / "jobs" / job_id
    for name in JOB_EXTRAS:
        folder = job_dir / name
        if keep is not None and folder.resolve() in keep.resolve().parents:
            for child in sorted(folder.iterdir()):
                if child.resolve() != keep.resolve():
                    freed += _remove(child, artifact_root) or 0
            continue
        freed += _remove(folder, artifact_root) or 0
    for artifact in store.artifacts(job_id, kind="merged"):
        path = Path(artifact.path)
        size = _remove(path if path.is_absolute() else artifact_root / path, artifact_root)
        if size is not None:  # gone (or already gone): so is its record
            freed += size
            store.delete_artifact(artifact.id)
    return freed


def delete_job_files(store: Store, artifact_root: Path, job: JobRow) -> int:
    """Deletes every file a job made under the artifact root: its recorded artifacts (merged
    checkpoints, exports, checkpoints), merged checkpoints left unrecorded by a merge that did not
    finish, its adapter folder, and its whole job folder (`jobs/<id>`: adapter, checkpoints, the
    trainer's scratch folder, request, progress and log files). Anything outside the root is left
    alone and logged. Returns the bytes freed. The records are the caller's (Store.delete_job)."""
    freed = 0
    for artifact in store.artifacts(job.id):
        path = Path(artifact.path)
        freed += _remove(path if path.is_absolute() else artifact_root / path, artifact_root) or 0
    # Merged checkpoints are named job-<id>-v<version> (services/scheduler/actions.py); ids are hex.
    for leftover in sorted((artifact_root / "merged").glob(f"job-{job.id}-v*")):
        freed += _remove(leftover, artifact_root) or 0
    if job.adapter_path:
        freed += _remove(Path(job.adapter_path), artifact_root) or 0
    freed += _remove(artifact_root / "jobs" / job.id, artifact_root) or 0
    return freed
