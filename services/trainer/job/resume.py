"""Where a re-dispatched job goes on from: its last whole checkpoint, on each node."""


from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.distributed import Group

if TYPE_CHECKING:
    pass


log = logging.getLogger("rlvr.trainer.runner")

def resume_point(job: JobConfig) -> tuple[Path, dict[str, Any]] | None:
    """Resume: where a re-dispatched job (`job.resume`) goes on from, None for step 0.

    The job's last whole TRL checkpoint (engine.py, `resume_checkpoint`): TRL/transformers restore
    the adapter, the optimizer, the LR scheduler, the python/numpy/torch RNG states and the sampler's
    position (accelerate's skip_first_batches), and the engine our state saved beside it, so the run
    goes on as the uninterrupted one would have, bit for bit on the CPU (tests/test_trainer_job.py).
    Later checkpoints that were not whole are removed. A job with no whole checkpoint (none taken:
    checkpoint_every 0, or none reached) starts again from step 0, in a clean TRL folder: with
    the same seed that is the same run again.

    Steps after the checkpoint run again. Their metrics are stored once, the first run's: steps
    up to `job.stored_steps` (stored by the scheduler already) are not published again, and a step
    published but not yet stored when the trainer was lost is published again under the same
    Nats-Msg-Id ("<job>:<step>"), which the stream drops within its duplicate window and the store
    refuses after it ((job_id, step) is its key). The first run's point is the one kept because it
    is the one watchers and loop rules may have seen already; the re-run's is the same up to its
    timings, the run being exact.
    """
    import shutil

    from rlvr.services.trainer.job.engine import TRL_DIR, checkpoints, resume_checkpoint

    trl = job.job_dir / TRL_DIR
    found = resume_checkpoint(job.job_dir) if job.resume else None
    if found is None:
        if job.resume:
            log.info("job %s: no whole checkpoint to resume from; starting again from step 0", job.job_id)
        shutil.rmtree(trl, ignore_errors=True)
        return None
    checkpoint, _ = found
    steps = {path: step for step, path in checkpoints(job.job_dir)}
    for other, step in steps.items():
        if step > steps[checkpoint]:
            shutil.rmtree(other, ignore_errors=True)
    return found


def node_resume_point(job: JobConfig, group: Group, found: tuple[Path, dict[str, Any]] | None
                      ) -> tuple[Path, dict[str, Any]] | None:
    """A job of several nodes: node 0's resume point (`resume_point`, its checkpoint's path under
    node 0's root) as this node's, the same checkpoint under its own artifact root. Each other
    node tidies its own checkpoints as node 0 did, and one whose root lacks the whole checkpoint
    (another worker than last time) gets node 0's over the process group (`Group.share_folder`)."""
    import shutil

    from rlvr.services.trainer.job.engine import RESUME_FILE, TRL_DIR, checkpoints

    here = job.job_dir / TRL_DIR / found[0].name if found is not None else None
    if group.is_node_main and not group.is_main:
        step = int(here.name.removeprefix("checkpoint-")) if here is not None else -1
        for number, path in checkpoints(job.job_dir):
            if number > step:
                shutil.rmtree(path, ignore_errors=True)
    if here is None or found is None:
        return None
    missing = not (here / RESUME_FILE).is_file()
    group.share_folder(here, wanted=missing)
    if missing and group.is_node_main:
        log.info("job %s: node %d had no whole %s: node 0's copy received", job.job_id, group.node, here.name)
    return here, found[1]
