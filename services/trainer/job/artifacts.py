"""Where a job's files live under the artifact root, and how adapters are written without ever
leaving a half-written one behind.

    <artifact_root>/jobs/<job_id>/adapter/            the adapter of the last finished step (PEFT; for a
                                                      job with an init_adapter, init + trained as one)
    <artifact_root>/jobs/<job_id>/checkpoints/step-N/ periodic checkpoints (PEFT: the published adapter)
    <artifact_root>/jobs/<job_id>/trl/checkpoint-M/   TRL's checkpoints at the same steps, named by TRL's
                                                      optimizer steps (M = N x num_iterations x mini_batches):
                                                      what a resume starts from (resume.resume_point)
    <artifact_root>/jobs/<job_id>/{request.pb,progress.json,result.json,job.log}  the worker's files
    <artifact_root>/jobs/<job_id>/result-rank<N>.json  a failed rank's result (a job of several processes)
    <artifact_root>/jobs/<job_id>/cancel-requested    the worker's mark that its SIGTERM is a cancel
    <artifact_root>/jobs/<job_id>/init-adapter/       the job's init_adapter, fetched from the worker that
                                                      holds it (StartJobRequest.init_adapter_source)
    <artifact_root>/merged/<name>/                    merged models (Hugging Face format)

The adapter is rewritten after every step (it is also what goes to the rollout service),
so a job killed mid-step still leaves the adapter of its last finished step: that is what makes a
SIGKILL on cancel safe. Each file is replaced atomically (write a temporary file, then rename), and
a write that fails removes its temporary file: nothing half-written is left, nor its space taken.

A full artifact root (`DiskSpace`): the write that found no space is taken again once space comes
back, for at most the trainer's `disk_wait_seconds`, the job's status saying so meanwhile; then the
job fails with the same message, which names the disk. The step waits rather than fails, so the run
goes on exactly as an undisturbed one. The job's result.json has its room taken when the job starts
(`reserve`), so that a job failed for a full disk can still say so.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rlvr.adapters import ADAPTER_FILES, ADAPTER_NAME_RE
from rlvr.common import paths
from rlvr.common.errors import InvalidArgument, shown

log = logging.getLogger("rlvr.trainer.artifacts")

CANCEL_FILE = "cancel-requested"
# Written by node 0's speaker of a job of several nodes whose collective lost a peer (job_process.py):
# the error, which the worker reports as the lost part's cause instead of the launcher's exit.
PEER_LOST_FILE = "peer-lost.json"
RESULT_ROOM = 16 * 1024  # bytes `reserve` takes for a result.json (an error is at most 500 characters)

_T = TypeVar("_T")


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
    """`data` as `path`, whole or not at all; written into the room `reserve` took for it, if any."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    text = (json.dumps(data, indent=2) + "\n").encode()
    reserved = tmp.is_file() and tmp.stat().st_size >= len(text)
    try:
        with open(tmp, "r+b" if reserved else "wb") as f:  # r+b: over bytes the disk holds already
            f.write(text)
            f.truncate()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def reserve(path: Path, size: int = RESULT_ROOM) -> None:
    """Takes `size` bytes of the disk now for `path`'s later `write_json_atomic`, which then needs
    no new space: a job's result.json, so that a job failed for a full disk can still report it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(b" " * size)
    except OSError as e:  # full already: the result is written when there is room again, or not
        tmp.unlink(missing_ok=True)
        log.warning("could not reserve room for %s: %s", path, e)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def save_adapter(model: Any, dest: Path, stack_on: Any = None,
                 finish: Callable[[Path], None] | None = None) -> Path:  # model: a peft PeftModel
    """Writes the LoRA weights alone (never merged) in PEFT format to `dest`, file by file atomically.
    `finish` completes the staged folder before it replaces `dest`'s files (a Head job's description).

    With `stack_on` (a `stacking.Adapter`: a job's frozen init_adapter) the folder holds the two
    adapters written as ONE adapter on the original base (`stacking.combine(stack_on, trained)`),
    never the trained adapter alone, so every version a stacked job publishes is its whole policy.
    """
    staging = dest.with_name(f".{dest.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    # A sharded policy's adapter comes gathered (distributed.Gathered): its whole tensors are written.
    from rlvr.services.trainer.job.distributed import Gathered

    state = None
    if isinstance(model, Gathered):
        model, state = model.model, model.state_dict
    try:
        if stack_on is None:
            # Only the trained adapter: with kl_beta > 0 TRL keeps a frozen copy named "ref" beside it.
            model.save_pretrained(str(staging), safe_serialization=True, selected_adapters=["default"],
                                  state_dict=state)
        else:
            from rlvr.services.trainer.job import stacking

            trained = stacking.from_peft_model(model, "default", state_dict=state)
            stacking.write_adapter(stacking.combine(stack_on, trained), staging)
        missing = [f for f in ADAPTER_FILES if not (staging / f).is_file()]
        if finish is not None and not missing:
            finish(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if missing:
        raise RuntimeError(f"peft wrote no {', '.join(missing)} (is the model a PeftModel?)")
    dest.mkdir(parents=True, exist_ok=True)
    # The config first: it is identical from step to step, so a kill between the two renames
    # leaves a loadable pair (the old weights with an equal config).
    for name in ADAPTER_FILES:
        os.replace(staging / name, dest / name)
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def copy_adapter(src: Path, dest: Path, finish: Callable[[Path], None] | None = None) -> Path:
    """A checkpoint: a copy of the PEFT files of `src` (written to a temporary folder, completed by
    `finish` as save_adapter's, then renamed)."""
    staging = dest.with_name(f".{dest.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    try:
        staging.mkdir(parents=True)
        for name in ADAPTER_FILES:
            shutil.copy2(src / name, staging / name)
        if finish is not None:
            finish(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(staging, dest)
    return dest


class DiskFull(RuntimeError):
    """A write to the artifact root found no space, and none came back within the wait."""


# A write finds the disk full when its error says so: an errno, or the OS's words in the message of
# a writer that drops the errno (safetensors). torch.save's zip writer says only "iostream error",
# so an error raised while the disk has less than NEARLY_FULL free counts too: the failed write has
# just taken the last bytes (measured on a full tmpfs: 0 B free).
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = ("No space left on device", "Disk quota exceeded")
NEARLY_FULL = 1 << 20


def says_full(exc: BaseException) -> bool:
    """Whether `exc` or an error it came from says that the disk (or the user's quota) is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "errno", None) in FULL_ERRNOS or any(w in str(seen) for w in FULL_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def free_bytes(root: Path) -> int:
    """The bytes this process may still write under `root` (0 when it cannot be read)."""
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return 0


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@dataclass
class DiskSpace:
    """A job's writes to its artifact root, which wait for space when the disk is full (`write`)."""

    root: Path
    wait_s: float = 0.0  # the trainer's disk_wait_seconds (0: fail at the first full disk)
    on_wait: Callable[[str], None] = lambda _message: None  # the job's status message
    cancel: threading.Event = field(default_factory=threading.Event)  # a cancel ends the wait
    poll_s: float = 1.0  # how often the free space is looked at while waiting

    def write(self, what: str, write: Callable[[], _T], partial: Path | None = None) -> _T:
        """`write()`; when it finds the disk full, its `partial` folder removed (each file write
        removes its own temporary file), then taken again once the free space grows, until
        `wait_s` after the first failure: then DiskFull, with the message the wait showed.
        `what` names the write in that message ("step 7's checkpoint")."""
        since: float | None = None
        while True:
            try:
                return write()
            except Exception as e:
                if not (says_full(e) or free_bytes(self.root) < NEARLY_FULL):
                    raise
                cause = f"{type(e).__name__}: {e}"
            # Out of the except block: the error's traceback is gone, and with it a failed torch.save's
            # open file, whose space a removed partial file would otherwise keep while the job waits.
            if partial is not None:
                shutil.rmtree(partial, ignore_errors=True)
            free = free_bytes(self.root)
            message = f"no space left on {self.root} ({human_bytes(free)} free): {what} not written"
            log.warning("%s (%s)", message, cause)
            since = time.monotonic() if since is None else since
            deadline = since + self.wait_s
            if time.monotonic() >= deadline or self.cancel.is_set():
                raise DiskFull(f"{message}; no space came back within {self.wait_s:g} s "
                               "(the trainer's disk_wait_seconds)")
            self.on_wait(f"{message}; waiting for space (up to {self.wait_s:g} s)")
            while free_bytes(self.root) <= free and time.monotonic() < deadline:
                if self.cancel.wait(self.poll_s):
                    break
