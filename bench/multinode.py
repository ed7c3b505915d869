"""Step time of one job across two nodes (advanced.num_nodes 2 x num_processes 1) against one node
with the same world (1 x 2 processes) and one process (1 x 1), through the trainer workers' own
launch (services/trainer/process/worker.py, launch.py): two JobSupervisors on two loopback addresses
(127.0.0.1 and 127.0.0.2, an artifact root each), torchrun's c10d rendezvous on node 0's host, gloo.

    python bench/multinode.py                      # rlvr-tiny-small, 3 repeats of each layout
    python bench/multinode.py --repeats 5 --steps 8

Each run is a fresh job of the same spec (no NATS: nothing is published). Its step times are read
from node 0's progress.json, which node 0's first process rewrites after every step (polled every
50 ms); the first `--skip` steps are left out. Every layout runs `--repeats` times (at least 3), the
layouts taking turns. Prints one line per run, then a row per layout: how many runs completed, the
median [lowest-highest] of the runs' mean step time and of their start-up (StartJob to step 1). It
never fails on time: it measures.

What it measures on one machine: the same cores shared by every process, and the process group over
loopback TCP, so the two-node rows show the cost of the rendezvous and of gloo between two
torchrun agents, not a speed-up; between real hosts, add the network's latency per all-reduce.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repeats import check_repeats, spreads, tally  # noqa: E402  (bench/repeats.py)

LAYOUTS = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}  # name -> (nodes, processes per node)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-small")
    p.add_argument("--layouts", default="1x1,1x2,2x1", help="comma list of NODESxPROCESSES")
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs per layout (>= 3), interleaved")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip", type=int, default=1, help="first steps left out of the rate")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per training process (1: two processes use the two cores either way)")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def request(args: argparse.Namespace, job_id: str, nodes: int, processes: int, rank: int = 0,
            endpoint: str = "") -> Any:
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import trainer_pb2 as T

    spec = C.JobSpec(base_model=args.model)
    spec.reward.synthetic_prompts = 64
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = (args.group_size, args.batch_size,
                                                                        args.max_tokens, args.steps)
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    a = spec.advanced
    a.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    a.loss_type, a.seed, a.num_processes, a.num_nodes, a.gpu_selection = C.LOSS_TYPE_DAPO, 1, processes, nodes, "cpu"
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=args.steps, node_rank=rank,
                             rendezvous_endpoint=endpoint)


async def one_run(args: argparse.Namespace, root: Path, layout: str) -> dict[str, Any]:
    from rlvr.clients.stack.ports import free_port
    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.services.trainer.settings import TrainerSettings

    nodes, processes = LAYOUTS[layout]
    ips = ["127.0.0.1", "127.0.0.2"][:nodes]
    workers = [JobSupervisor(TrainerSettings(port=0, artifact_root=root / f"host-{i}", nats_url="", scorer="local",
                                             torch_threads=args.threads, worker_name=f"bench-node-{i}",
                                             rendezvous_address=ip))
               for i, ip in enumerate(ips)]
    job_id = f"multinode-{layout}-{time.monotonic_ns()}"
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}" if nodes > 1 else ""
    progress = root / "host-0" / "jobs" / job_id / "progress.json"
    started = time.perf_counter()
    for rank in [*range(1, nodes), 0]:  # as the scheduler starts them: node 0 last
        await workers[rank].start(request(args, job_id, nodes, processes, rank, endpoint))
    done_at: dict[int, float] = {}
    while any(w.current is not None for w in workers):
        try:
            step = int(json.loads(progress.read_text())["step"])
        except (OSError, ValueError, KeyError):
            step = 0
        if step and step not in done_at:
            done_at[step] = time.perf_counter()
        await asyncio.sleep(0.05)
    last = workers[0].last
    for w in workers:
        await w.close()
    row: dict[str, Any] = {"layout": layout, "status": last.status if last else None,
                           "error": last.error if last else "", "wall_s": round(time.perf_counter() - started, 1)}
    steps = sorted(s for s in done_at if s > args.skip)
    seconds = [done_at[b] - done_at[a] for a, b in zip(steps, steps[1:], strict=False) if b == a + 1]
    row["step_s"] = round(statistics.fmean(seconds), 3) if seconds else None
    row["startup_s"] = round(done_at[min(done_at)] - started, 1) if done_at else None
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rlvr.v1 import common_pb2 as C

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-multinode-") as tmp:
        for repeat in range(args.repeats):
            for layout in layouts:  # interleaved: a slow spell of the machine hits every layout
                row = asyncio.run(one_run(args, Path(tmp) / f"{layout}-{repeat}", layout))
                row["status"] = C.JobStatus.Name(row["status"]).removeprefix("JOB_STATUS_") if row["status"] else "?"
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.model}, batch {args.batch_size} = {args.batch_size // args.group_size} prompts x {args.group_size}, "
          f"{args.max_tokens} tokens, {args.steps} steps (first {args.skip} left out), CPU, gloo, {args.repeats} runs each")
    completed = [r for r in rows if r["status"] == "COMPLETED"]  # a failed run's times are left out
    step = spreads(completed, "step_s", by="layout", configs=layouts)
    startup = spreads(completed, "startup_s", by="layout", configs=layouts)
    print(f"{'nodes x procs':>13} {'runs':>13} {'s/step':>24} {'start-up s':>24}")
    for layout in layouts:
        mine = [r for r in rows if r["layout"] == layout]
        print(f"{layout:>13} {tally((r['status'] == 'COMPLETED' for r in mine), 'completed'):>13} "
              f"{step[layout].cell(2, of=len(mine)):>24} {startup[layout].cell(1, of=len(mine)):>24}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
