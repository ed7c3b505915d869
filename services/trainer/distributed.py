"""A job across several training processes (advanced.num_processes): who does what, and how the
processes agree.

The worker starts one job process; for N > 1 it becomes the launcher (`launch_command`): it execs
torchrun (`torch.distributed.run --standalone`), which starts N ranks of the same entry point
(`rlvr.services.trainer.job_process --rank-of PID`). Each rank trains on batch_size / N completions of
the step (TRL's GRPOTrainer under DDP: gloo on a CPU, NCCL on GPUs; one optimizer step across all
ranks, its gradients averaged), and rank 0 alone speaks for the job: it writes progress.json and
result.json, saves and pushes each adapter version once, and publishes one MetricEvent per step,
with the step's completions of every rank (`merge_records`). The other ranks wait for that push
before they generate the next step (`Group.on_main`, which also carries a failure of rank 0 to the
others, so that no rank waits forever) and adopt the version (`adopt_adapter`: any rank pushes it
again to a rollout server that lost it), and a cancel seen by any rank stops all of them at the
same step boundary (`Group.any`).

Processes: the launcher keeps the job process's pid (the exec), so the worker's cancel (SIGTERM to
that process group, then SIGKILL) reaches torchrun, which passes SIGTERM on to the ranks (each in a
session of its own) and kills them after its own grace; every rank dies with torchrun
(PR_SET_PDEATHSIG, `job_process.die_with_parent`), and torchrun with the worker (the death signal
is kept across the exec).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rlvr.services.trainer.metrics import StepRecord

_T = TypeVar("_T")


def launch_command(job_dir: Path, processes: int, launcher_pid: int) -> list[str]:
    """torchrun over `processes` ranks of the job process (the launcher execs it, keeping its pid:
    `launcher_pid` is the ranks' parent, which they die with)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(processes), "--max-restarts", "0",
        "-m", "rlvr.services.trainer.job_process", "--job-dir", str(job_dir), "--rank-of", str(launcher_pid),
    ]


def visible_devices(gpu_selection: str, processes: int, inherited: str | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES of a job (None: leave it): the listed devices, none for "cpu", and
    for "auto" the first `processes` of the devices the worker sees, so that a job never sees more
    devices than it has processes (transformers' Trainer would wrap the model in DataParallel)."""
    if gpu_selection == "cpu":
        return ""
    if gpu_selection not in ("auto", ""):
        return gpu_selection
    if inherited is None:
        return ",".join(str(i) for i in range(processes))
    return ",".join([d.strip() for d in inherited.split(",") if d.strip()][:processes])


@dataclass
class Group:
    """This process's place in the job: rank `rank` of `world` (1: a job of one process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    _objects: Any = field(default=None, repr=False)  # a gloo group for the object collectives

    @classmethod
    def from_env(cls) -> Group:
        """The group torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def connect(self, device: str) -> None:
        """Joins the job's process group (NCCL for CUDA, gloo otherwise), before the trainer is
        built: accelerate then uses this group rather than making its own."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        if device.startswith("cuda"):
            torch.cuda.set_device(self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        # Python objects (records, errors, flags) travel through gloo on any device.
        self._objects = dist.new_group(backend="gloo") if device.startswith("cuda") else dist.group.WORLD

    def gather(self, value: _T) -> list[_T]:
        """`value` of every rank, in rank order (on every rank)."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self._objects)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on some rank."""
        return any(self.gather(bool(flag)))

    def on_main(self, work: Callable[[], _T]) -> _T:
        """`work()` on rank 0 only, its value on every rank. When it fails, rank 0 raises its error
        and the other ranks raise a RuntimeError naming it (instead of waiting for a push that will
        never come)."""
        if self.world == 1:
            return work()
        import torch.distributed as dist

        box: list[Any] = [None]
        error: BaseException | None = None
        if self.is_main:
            try:
                box[0] = ("ok", work())
            except BaseException as e:  # carried to the others, then raised here
                error = e
                box[0] = ("error", f"{type(e).__name__}: {e}")
        dist.broadcast_object_list(box, src=0, group=self._objects)
        if error is not None:
            raise error
        kind, value = box[0]
        if kind == "error":
            raise RuntimeError(f"training process 0 failed: {value}")
        return value

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


@dataclass
class Gathered:
    """A sharded policy's adapter gathered whole (advanced.sharding "fsdp"): the PeftModel, for its
    config, and the full tensors of its LoRA weights under the model's own state-dict names, which
    artifacts.save_adapter writes instead of the model's shards."""

    model: Any  # the peft PeftModel, its weights sharded (FSDP2 DTensors)
    state_dict: dict[str, Any]  # every `lora_` tensor of the model, whole, on the CPU


def gather_adapter(model: Any, group: Group) -> Gathered | None:
    """The LoRA weights of a sharded `model`, whole, on rank 0 (None on the others). A collective:
    every rank calls it, in the same order. Only the adapter's tensors are gathered (each an
    all-gather of its shards, in the state dict's order), never the base's: the push of a base too
    big for one device gathers a few MB."""
    from torch.distributed.tensor import DTensor

    full: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        if "lora_" not in name:
            continue
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if group.is_main:
            full[name] = whole.detach().to("cpu", copy=True)
    return Gathered(model, full) if group.is_main else None


def device_count_problem(device: str, group: Group) -> str | None:
    """Why this job cannot give each rank its own CUDA device (None when it can, or on a CPU)."""
    if not device.startswith("cuda") or group.world == 1:
        return None
    import torch

    count = torch.cuda.device_count()
    if count >= group.world:
        return None
    return (f"advanced.num_processes: {group.world} processes need {group.world} CUDA devices, but this worker's "
            f"job sees {count} (advanced.gpu_selection, or the worker's CUDA_VISIBLE_DEVICES)")


def shareable(record: StepRecord) -> dict[str, Any]:
    """What rank 0 needs of another rank's step record (plain values: pickled between processes)."""
    return {"completion_lengths": record.completion_lengths, "clipped": record.clipped, "scores": record.scores,
            "generate_seconds": record.generate_seconds, "score_seconds": record.score_seconds}


def merge_records(record: StepRecord, parts: Sequence[dict[str, Any]]) -> None:
    """Rank 0's record becomes the step's: every rank's completions in rank order (the global
    batch's order, as one process would have them), and the slowest rank's generation and scoring
    time (the step waits for it)."""
    record.completion_lengths = [n for p in parts for n in p["completion_lengths"]]
    record.clipped = [c for p in parts for c in p["clipped"]]
    record.scores = [s for p in parts for s in p["scores"]]
    record.generate_seconds = max(p["generate_seconds"] for p in parts)
    record.score_seconds = max(p["score_seconds"] for p in parts)
