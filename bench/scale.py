"""Steps per second of one job with 1 and 2 training processes (advanced.num_processes), through the
trainer worker's own launch (services/trainer/process/worker.py: one job process, or torchrun over N ranks).

    python bench/scale.py                           # rlvr-tiny-small, transformers backend, 1 and 2 processes
    python bench/scale.py --processes 1,2,4 --steps 8 --batch-size 16 --group-size 4

Each run is a fresh job of the same spec (the worker's JobSupervisor, no NATS: nothing is
published); the step times are read from progress.json, which rank 0 rewrites after every step
(polled every 50 ms). The first `--skip` steps are left out (start-up, first batches); start-up
(process start, imports, model load, the first steps) is reported apart. Every process count runs
`--repeats` times (at least 3), the counts taking turns (1, 2, 1, 2, ...: a slow spell of a shared
host touches each alike); prints one line per run, then one row per process count with the median
[lowest-highest] over its completed runs, and writes JSON (`--out`). It never fails on time: it measures.

What limits it on a 2-core machine: N processes share the same cores (each gets cores / N torch
threads), so the arithmetic of a step is not faster, and each rank pays its own start-up
(imports, model load) and the per-step all-reduce, gather and push barrier; the rows show that
shape, not a speed-up. On a host with a device per process each rank's share of the batch runs in
parallel.
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-small")
    p.add_argument("--processes", default="1,2", help="comma list of process counts")
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs per process count (>= 3), interleaved")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip", type=int, default=1, help="first steps left out of the rate")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--gpu", default="cpu", help='advanced.gpu_selection ("cpu", "auto"; a device list names one per process)')
    p.add_argument("--precision", default="fp32")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: cores / processes)")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def request(args: argparse.Namespace, job_id: str, processes: int) -> Any:
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
    a.loss_type, a.seed, a.num_processes, a.precision = C.LOSS_TYPE_DAPO, 1, processes, args.precision
    a.gpu_selection = args.gpu if args.gpu != "auto" else ""
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=args.steps)


async def one_run(args: argparse.Namespace, root: Path, processes: int) -> dict[str, Any]:
    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.services.trainer.settings import TrainerSettings

    settings = TrainerSettings(port=0, artifact_root=root, nats_url="", scorer="local", torch_threads=args.threads,
                               worker_name="bench-scale")
    supervisor = JobSupervisor(settings)
    job_id = f"scale-{processes}-{time.monotonic_ns()}"
    progress = root / "jobs" / job_id / "progress.json"
    started = time.perf_counter()
    await supervisor.start(request(args, job_id, processes))
    done_at: dict[int, float] = {}
    while supervisor.current is not None:
        try:
            step = int(json.loads(progress.read_text())["step"])
        except (OSError, ValueError, KeyError):
            step = 0
        if step and step not in done_at:
            done_at[step] = time.perf_counter()
        await asyncio.sleep(0.05)
    last = supervisor.last
    await supervisor.close()
    row: dict[str, Any] = {"processes": processes, "status": last.status if last else None,
                           "error": last.error if last else "", "wall_s": round(time.perf_counter() - started, 1)}
    steps = sorted(s for s in done_at if s > args.skip)
    if len(steps) >= 2:
        seconds = [done_at[b] - done_at[a] for a, b in zip(steps, steps[1:], strict=False) if b == a + 1]
        row["step_s"] = round(statistics.fmean(seconds), 2) if seconds else None
        row["steps_per_s"] = round(1 / row["step_s"], 3) if row["step_s"] else None
    row["startup_s"] = round(done_at[min(done_at)] - started, 1) if done_at else None
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rlvr.v1 import common_pb2 as C

    counts = [int(x) for x in args.processes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-scale-") as tmp:
        for repeat in range(args.repeats):
            for n in counts:  # interleaved: one run of every count, then the next round
                row = asyncio.run(one_run(args, Path(tmp), n))
                row["status"] = C.JobStatus.Name(row["status"]).removeprefix("JOB_STATUS_") if row["status"] else "?"
                row["repeat"] = repeat + 1
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.model}, batch {args.batch_size} = {args.batch_size // args.group_size} prompts x {args.group_size}, "
          f"{args.max_tokens} tokens, {args.steps} steps (first {args.skip} left out), gpu {args.gpu}, {args.precision}; "
          f"median [lowest-highest] of {args.repeats} runs each")
    columns = {"step_s": ("s/step", 2), "steps_per_s": ("steps/s", 2), "startup_s": ("start-up s", 1),
               "wall_s": ("wall s", 1)}
    completed = [r for r in rows if r["status"] == "COMPLETED"]  # a failed run's times are left out
    table = {key: spreads(completed, key, by="processes", configs=counts) for key in columns}
    print(f"{'processes':>9} {'runs':>9} " + " ".join(f"{name:>22}" for name, _ in columns.values()))
    summary: dict[int, dict[str, object]] = {}
    for n in counts:
        mine = [r for r in rows if r["processes"] == n]
        cells = {key: table[key][n] for key in columns}
        print(f"{n:>9} {tally(r['status'] == 'COMPLETED' for r in mine):>9} "
              + " ".join(f"{cells[key].cell(digits, of=len(mine)):>22}" for key, (_, digits) in columns.items()))
        for r in mine:
            if r["error"]:
                print(f"{'':>9} run {r['repeat']}: {r['error'][:120]}")
        summary[n] = {"completed": sum(r["status"] == "COMPLETED" for r in mine), "runs": len(mine),
                      **{key: cells[key].to_json() for key in columns}}
    if args.out:
        args.out.write_text(json.dumps({"repeats": args.repeats, "processes": summary, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
