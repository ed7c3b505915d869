"""Where a job's files live under the artifact root, and how adapters are written without ever
leaving a half-written one behind.

    <artifact_root>/jobs/<job_id>/adapter/            the adapter of the last finished step (PEFT; for a
                                                      job with an init_adapter, init + trained as one)
    <artifact_root>/jobs/<job_id>/checkpoints/step-N/ periodic checkpoints (PEFT: the published adapter)
    <artifact_root>/jobs/<job_id>/trl/checkpoint-N/   TRL's checkpoints at the same steps: what a
                                                      resume starts from (runner.resume_point)
    <artifact_root>/jobs/<job_id>/{request.pb,progress.json,result.json,job.log}  the worker's files
    <artifact_root>/jobs/<job_id>/result-rank<N>.json  a failed rank's result (a job of several processes)
    <artifact_root>/jobs/<job_id>/cancel-requested    the worker's mark that its SIGTERM is a cancel
    <artifact_root>/jobs/<job_id>/init-adapter/       the job's init_adapter, fetched from the worker that
                                                      holds it (StartJobRequest.init_adapter_source)
    <artifact_root>/merged/<name>/                    merged models (Hugging Face format)

The adapter is rewritten after every optimizer step (it is also what goes to the rollout service),
so a job killed mid-step still leaves the adapter of its last finished step: that is what makes a
SIGKILL on cancel safe. Each file is replaced atomically (write a temporary file, then rename).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rlvr.adapters import ADAPTER_FILES, ADAPTER_NAME_RE
from rlvr.common import paths
from rlvr.common.errors import InvalidArgument, shown

log = logging.getLogger("rlvr.trainer.artifacts")

CANCEL_FILE = "cancel-requested"
# Written by node 0's speaker of a job of several nodes whose collective lost a peer (job_process.py):
# the error, which the worker reports as the lost part's cause instead of the launcher's exit.
PEER_LOST_FILE = "peer-lost.json"


def check_name(name: str, field: str) -> str:
    if not ADAPTER_NAME_RE.match(name) or name in (".", ".."):
        raise InvalidArgument(f"{field}: {name!r} is not a valid name; use {ADAPTER_NAME_RE.pattern}")
    return name


def under_root(root: Path, path: str | Path, field: str) -> Path:
    """`path` (absolute, or relative to `root`) resolved, if it stays under `root`."""
    base = root.resolve()
    resolved = paths.resolve(path, base)
    if not paths.is_under(resolved, [base]):
        log.info("%s: %s resolves to %s, outside the artifact root %s", field, shown(str(path)), resolved, base)
        raise InvalidArgument(f"{field}: {shown(str(path))} is outside the artifact root (give a folder under it, "
                              "or a path relative to it)")
    return resolved


def job_dir(root: Path, job_id: str) -> Path:
    return root / "jobs" / job_id


def adapter_dir(root: Path, job_id: str) -> Path:
    return job_dir(root, job_id) / "adapter"


def fetched_init_adapter_dir(root: Path, job_id: str) -> Path:
    return job_dir(root, job_id) / "init-adapter"


def checkpoint_dir(root: Path, job_id: str, step: int) -> Path:
    return job_dir(root, job_id) / "checkpoints" / f"step-{step}"


def unlink_rank_results(job_dir: Path) -> None:
    """The results of a job's ranks other than 0 (`result-rank<N>.json`, job_process.py)."""
    for path in job_dir.glob("result-rank*.json"):
        path.unlink(missing_ok=True)


def rank_failure(job_dir: Path) -> str | None:
    """The error of the first failed rank of a job of several processes (job_process.py), if any."""
    for path in sorted(job_dir.glob("result-rank*.json")):
        data = read_json(path)
        if data is not None and data.get("status") == "failed":
            rank = path.stem.removeprefix("result-rank")
            return f"training process {rank} failed: {data.get('error') or 'no cause given'}"
    return None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def save_adapter(model: Any, dest: Path, stack_on: Any = None) -> Path:  # model: a peft PeftModel
    """Writes the LoRA weights alone (never merged) in PEFT format to `dest`, file by file atomically.

    With `stack_on` (a `stacking.Adapter`: a job's frozen init_adapter) the folder holds the two
    adapters written as ONE adapter on the original base (`stacking.combine(stack_on, trained)`),
    never the trained adapter alone, so every version a stacked job publishes is its whole policy.
    """
    staging = dest.with_name(f".{dest.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    # A sharded policy's adapter comes gathered (distributed.Gathered): its whole tensors are written.
    from rlvr.services.trainer.distributed import Gathered

    state = None
    if isinstance(model, Gathered):
        model, state = model.model, model.state_dict
    if stack_on is None:
        # Only the trained adapter: with kl_beta > 0 TRL keeps a frozen copy named "ref" beside it.
        model.save_pretrained(str(staging), safe_serialization=True, selected_adapters=["default"], state_dict=state)
    else:
        from rlvr.services.trainer import stacking

        trained = stacking.from_peft_model(model, "default", state_dict=state)
        stacking.write_adapter(stacking.combine(stack_on, trained), staging)
    missing = [f for f in ADAPTER_FILES if not (staging / f).is_file()]
    if missing:
        raise RuntimeError(f"peft wrote no {', '.join(missing)} (is the model a PeftModel?)")
    dest.mkdir(parents=True, exist_ok=True)
    # The config first: it is identical from step to step, so a kill between the two renames
    # leaves a loadable pair (the old weights with an equal config).
    for name in ADAPTER_FILES:
        os.replace(staging / name, dest / name)
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def copy_adapter(src: Path, dest: Path) -> Path:
    """A checkpoint: a copy of the PEFT files of `src` (written to a temporary folder, then renamed)."""
    staging = dest.with_name(f".{dest.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copy2(src / name, staging / name)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(staging, dest)
    return dest
