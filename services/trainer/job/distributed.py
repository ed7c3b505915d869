"""A job across several training processes (advanced.num_processes): who does what, and how the
processes agree. How the processes are started (torchrun's arguments) is the process layer's:
services/trainer/process/launch.py.

The worker starts one job process; for N > 1 it becomes the launcher: it runs torchrun
(`torch.distributed.run --standalone`), which starts N ranks of the same entry point
(`rlvr.services.trainer.process.job_process --rank-of PID`). Where the worker forks its job processes (a
host without a GPU driver: forkserver.py), the launcher has imported torch, transformers, peft and
TRL already, runs torchrun's agent itself and forks the ranks from it (launch.py `torchrun_arguments(forked=True)`:
each rank starts training about a second after the launch instead of after its own imports, 10+ s
of CPU each); elsewhere it execs torchrun (`launch_command`), whose ranks are fresh interpreters. Each rank trains on batch_size / N completions of
the step (TRL's GRPOTrainer under DDP: gloo on a CPU, NCCL on GPUs; one optimizer step across all
ranks, its gradients averaged), and rank 0 alone speaks for the job: it writes progress.json and
result.json, saves and pushes each adapter version once, and publishes one MetricEvent per step,
with the step's completions of every rank (`merge_records`). The other ranks wait for that push
before they generate the next step (`Group.on_main`, which also carries a failure of rank 0 to the
others, so that no rank waits forever) and adopt the version (`adopt_adapter`: any rank pushes it
again to a rollout server that lost it), and a cancel seen by any rank stops all of them at the
same step boundary (`Group.any`).

A job of several nodes (advanced.num_nodes, each a trainer worker the scheduler reserved: StartJob
with the worker's node_rank and node 0's rendezvous endpoint): each worker's launcher execs torchrun
with `--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT` instead of `--standalone`; node 0's
torchrun hosts the rendezvous store (is_host), the others join it, and the world is N x
num_processes ranks. c10d numbers the nodes itself (by address, `--node-rank` is for the static
backend only), so the job's speaker is not "global rank 0" but the first process of node 0
(`Group.is_main`: node 0 is the worker the scheduler made node 0, whose artifact root holds the
job's adapter and checkpoints). The other nodes write their part's result only
(job_process.py); a resume gives them node 0's checkpoint over the job's own process group when
their artifact root lacks it (`share_folder`), so no disk is shared between the nodes.

Processes: the launcher keeps the job process's pid (torchrun in it, or exec'd), so the worker's
cancel (SIGTERM to that process group, then SIGKILL) reaches torchrun's agent, which passes SIGTERM
on to the ranks (exec'd ones are each in a session of its own; forked ones are in the launcher's
process group and have the worker's SIGTERM too) and kills them after its own grace; every rank
dies with the launcher (PR_SET_PDEATHSIG, `job_process.die_with_parent`), and the launcher with the
worker (the death signal is kept across an exec).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rlvr.services.trainer.job.step_record import StepRecord

_T = TypeVar("_T")


# The environment variable that tells a rank its node in a job of several nodes (the worker's
# StartJobRequest.node_rank; torchrun's own GROUP_RANK is the rendezvous' numbering).
NODE_RANK_ENV = "RLVR_NODE_RANK"


@dataclass
class Group:
    """This process's place in the job: rank `rank` of `world` (1: a job of one process), process
    `local_rank` of node `node` (0 but in a job of several nodes)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    node: int = 0
    main_rank: int = 0  # the speaker's global rank (`connect` finds it: c10d numbers the nodes itself)
    _objects: Any = field(default=None, repr=False)  # a gloo group for the object collectives

    @classmethod
    def from_env(cls) -> Group:
        """The group torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK), on the
        node the worker was given (NODE_RANK_ENV)."""
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get(NODE_RANK_ENV, "0")))

    @property
    def is_main(self) -> bool:
        """The process that speaks for the job: the first of node 0."""
        return self.node == 0 and self.local_rank == 0

    @property
    def is_node_main(self) -> bool:
        """The first process of its node: the one that writes into that node's artifact root."""
        return self.local_rank == 0

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
        speakers = [r for r, main in enumerate(self.gather(self.is_main)) if main]
        if len(speakers) != 1:
            raise RuntimeError(f"the job's processes name {len(speakers)} speakers (node 0, process 0); "
                               "two workers were given the same node rank")
        self.main_rank = speakers[0]

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
        dist.broadcast_object_list(box, src=self.main_rank, group=self._objects)
        if error is not None:
            raise error
        kind, value = box[0]
        if kind == "error":
            raise RuntimeError(f"training process 0 failed: {value}")
        return value

    def share_folder(self, folder: Path, wanted: bool) -> None:
        """`folder`'s files as the speaker has them, on every node whose first process asks for it
        (`wanted`): a resume on a node whose artifact root lacks node 0's checkpoint. The files
        travel through the job's process group (pickled: a LoRA checkpoint, megabytes); a file the
        node has already is kept (its own ranks' RNG states)."""
        if self.world == 1 or not self.any(wanted and self.is_node_main):
            return
        files: dict[str, bytes] = self.on_main(
            lambda: {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()})
        if wanted and self.is_node_main and not self.is_main:
            for name, data in files.items():
                path = folder / name
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
        self.gather(None)  # every node has it before any rank reads it

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
# What a collective raises when a peer is gone (its host died, its process was killed): the error
# of gloo or NCCL, or of torch.distributed's store, as `runner.one_line` spells it.
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "gloo", "nccl",
              "distbackenderror", "distnetworkerror", "diststoreerror", "socket timeout")


def peer_lost(error: str) -> bool:
    """A job's failure that came out of the process group (a lost node), not out of the job itself:
    in a job of several nodes the speaker then ends lost, to be resumed (job_process.py)."""
    lowered = error.lower()
    return any(marker in lowered for marker in _PEER_LOST)


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
