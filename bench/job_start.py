"""Seconds from StartJob to the end of a one-step job, a job process started fresh or forked.

    python bench/job_start.py                 # 3 rounds of 3 jobs each way
    python bench/job_start.py --jobs 5 --repeats 5
    python bench/job_start.py --processes 2   # jobs of two training processes (torchrun's ranks)

A trainer worker (`JobSupervisor`, in this process: no NATS, the local scorer, one torch thread)
runs `--jobs` one-step jobs on the test-size tiny model (group 4, batch 8, 32 tokens, the
transformers backend) one after another, with `job_start = "fresh"` (each job process a new
interpreter that imports torch, transformers, peft and TRL) and `job_start = "fork"` (forked from the
worker's fork server, services/trainer/process/forkserver.py). With `--processes N` each job has N ranks:
"fresh" execs torchrun, whose ranks are new interpreters, and "fork" runs torchrun's agent in the
forked job process, which forks the ranks (job_process.launch). Rounds alternate the two; each cell is the
median [lowest-highest] over the jobs of every round. "server start" is the fork server's own
import, paid once per worker when the service starts. Prints the load average before and after
(compare rows of one invocation on a shared host). It never fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

MODES = ("fresh", "fork")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=3, help="one-step jobs per worker and round")
    p.add_argument("--processes", type=int, default=1, choices=(1, 2, 4), help="training processes of each job")
    p.add_argument("--repeats", type=check_repeats, default=3, help="rounds, each mode once a round (>= 3)")
    p.add_argument("--out", default=None, help="default bench/results/job_start.json (job_start_p<N>.json for N > 1)")
    args = p.parse_args(argv)
    if args.out is None:
        suffix = "" if args.processes == 1 else f"_p{args.processes}"
        args.out = str(ROOT / "bench" / "results" / f"job_start{suffix}.json")
    return args


def _request(job_id: str, model: str, processes: int):  # noqa: ANN202 (rlvr's protos imported late)
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import trainer_pb2 as T

    spec = C.JobSpec(base_model=model)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, 1
    g.lora_rank, g.lora_alpha = 4, 64
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.num_processes, spec.advanced.gpu_selection = processes, "cpu"
    return T.StartJobRequest(job_id=job_id, spec=spec, total_steps=1)


async def one_worker(mode: str, model: str, jobs: int, round_no: int, processes: int) -> dict[str, object]:
    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.services.trainer.settings import TrainerSettings
    from rlvr.v1 import common_pb2 as C

    root = Path(tempfile.mkdtemp(prefix=f"job-start-{mode}-"))
    settings = TrainerSettings(port=0, artifact_root=root, nats_url="", scorer="local", torch_threads=1,
                               worker_name=f"bench-{mode}", job_start=mode)
    supervisor = JobSupervisor(settings)
    row: dict[str, object] = {"mode": mode, "round": round_no, "server_s": None, "jobs_s": [], "ok": True}
    try:
        if supervisor.forks is not None:
            started = time.monotonic()
            await supervisor.forks.start()
            row["server_s"] = time.monotonic() - started
        for i in range(jobs):
            started = time.monotonic()
            await supervisor.start(_request(f"{mode}-{round_no}-{i}", model, processes))
            assert supervisor.current is not None
            await supervisor.current.done.wait()
            row["jobs_s"].append(time.monotonic() - started)  # type: ignore[union-attr]
            row["ok"] = row["ok"] and supervisor.last is not None and supervisor.last.status == C.JOB_STATUS_COMPLETED
    finally:
        await supervisor.close()
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from fixtures_trainer import build_trainer_test_model

    model = build_trainer_test_model()
    print(f"load average before: {os.getloadavg()}")
    rows = []
    for r in range(args.repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            row = asyncio.run(one_worker(mode, model, args.jobs, r, args.processes))
            server = "" if row["server_s"] is None else f", fork server start {row['server_s']:.2f} s"
            print(f"round {r} {mode}: jobs {[round(s, 2) for s in row['jobs_s']]} s{server}",  # type: ignore[union-attr]
                  flush=True)
            rows.append(row)
    print(f"load average after: {os.getloadavg()}")
    table = {}
    print(f"\n{args.processes} training process(es) per job")
    print("\n| job process | one-step job, StartJob to its end (s) | fork server start (s) | completed |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        jobs = Spread.of([s for r in mine for s in r["jobs_s"]])  # type: ignore[union-attr]
        server = Spread.of([r["server_s"] for r in mine])  # type: ignore[misc]
        done = sum(len(r["jobs_s"]) for r in mine if r["ok"])  # type: ignore[arg-type]
        print(f"| {mode} | {jobs.cell(2)} | {server.cell(2)} | {done}/{args.jobs * len(mine)} |")
        table[mode] = {"job_s": jobs.to_json(), "server_start_s": server.to_json()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "table": table, "jobs": args.jobs, "repeats": args.repeats,
                                          "processes": args.processes}, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
