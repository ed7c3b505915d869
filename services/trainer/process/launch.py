"""How the ranks of a job of several processes or nodes are started: torchrun's arguments and the
devices a job sees. What the ranks do once started, and how they agree, is the job's:
services/trainer/job/distributed.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Nodes:
    """Where this worker's part of a job of several nodes joins the others (advanced.num_nodes)."""

    count: int  # advanced.num_nodes
    rank: int  # this worker's node (0: the speaker's)
    endpoint: str  # HOST:PORT of the rendezvous, on node 0's host
    run_id: str  # the rendezvous' name: the job id
    local_addr: str = ""  # the address the other nodes reach this one at ("": its FQDN)


# The module every job process and every rank runs (`python -m`; a restarted worker finds its job's
# processes by it in their command lines).
JOB_MODULE = "rlvr.services.trainer.process.job_process"


def rank_arguments(job_dir: Path, launcher_pid: int) -> list[str]:
    """The command-line arguments of a rank of the job in `job_dir`, whose launcher is `launcher_pid`."""
    return ["--job-dir", str(job_dir), "--rank-of", str(launcher_pid)]


def torchrun_arguments(job_dir: Path, processes: int, launcher_pid: int, nodes: Nodes | None = None,
                       forked: bool = False) -> list[str]:
    """torchrun's arguments for `processes` ranks of the job process (`launcher_pid` is the ranks'
    parent, which they die with); with `nodes`, this node's ranks of a rendezvous of `nodes.count`
    nodes. `forked`: the launcher runs torchrun's agent itself and the ranks are forked from it
    (`--run-path` of this package's job_process.py with `--start-method fork`, torchrun's way of
    starting a function rather than a program), else each rank is `python -m` of it."""
    if nodes is None or nodes.count == 1:
        where = ["--standalone", "--nnodes", "1"]
    else:
        where = ["--nnodes", str(nodes.count), "--node-rank", str(nodes.rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", nodes.endpoint, "--rdzv-id", nodes.run_id,
                 "--rdzv-conf", f"is_host={'true' if nodes.rank == 0 else 'false'}"]
        if nodes.local_addr:
            where += ["--local-addr", nodes.local_addr]
    entry = (["--run-path", "--start-method", "fork", str(Path(__file__).with_name("job_process.py"))] if forked
             else ["-m", JOB_MODULE])
    return [*where, "--nproc-per-node", str(processes), "--max-restarts", "0",
            *entry, *rank_arguments(job_dir, launcher_pid)]


def launch_command(job_dir: Path, processes: int, launcher_pid: int, nodes: Nodes | None = None) -> list[str]:
    """torchrun over `processes` ranks of the job process, as a program (the launcher execs it,
    keeping its pid): each rank a fresh interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_arguments(job_dir, processes, launcher_pid, nodes)]


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
