"""Steps per second of a job through 1 and 2 rollout replicas (`rollout_addresses`).

    python bench/replicas.py                                 # rlvr-tiny-test, transformers rollout servers
    python bench/replicas.py --model rlvr-tiny --backend vllm --steps 8

Starts two rollout servers (separate processes, `--backend`), then runs the same job (the same
seed, `rlvr.services.trainer.job.runner.run_job` as a job process runs it) through the first server
alone and through both, `--repeats` times each (at least 3), taking turns (1, 2, 1, 2, ...). Per run:
steps/s and the means of the step's generate and whole-step seconds (from its MetricEvents, the
first `--skip` steps left out) and how many Generate calls each server answered (their GetInfo);
the table prints each as the median [lowest-highest] over the runs. It never fails on time: it
measures.

What to expect on a small CPU host: each replica is a process decoding on the same cores as the
other and as the trainer, so two replicas split a step's prompts but not the work per core; the
gain needs a core (or a GPU) per replica.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repeats import Spread, check_repeats, spreads, tally  # noqa: E402  (bench/repeats.py)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-test", help="base model: rlvr-tiny[-size], hub id or path")
    p.add_argument("--backend", choices=("transformers", "vllm"), default="transformers",
                   help="the rollout servers' backend")
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs per replica count (>= 3), interleaved")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip", type=int, default=1, help="first steps left out of the means")
    p.add_argument("--batch-size", type=int, default=32, help="completions per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--memory", type=float, default=0.15, help="vLLM memory fraction of each server")
    return p.parse_args(argv)


def start_server(args: argparse.Namespace, model: str, root: Path, k: int) -> tuple[str, subprocess.Popen[bytes]]:
    from rlvr.clients.stack import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", model,
           "--backend", args.backend, "--memory-fraction", str(args.memory), "--max-model-len", "1024",
           "--adapter-root", str(root / f"adapters-{k}"), "--log-format", "text"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(root / f"rollout-{k}.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, env=env, start_new_session=True)
    return f"127.0.0.1:{port}", proc


def served(address: str) -> int:
    from rlvr.clients.sdk import RolloutClient

    with RolloutClient(address) as client:
        return int(client.get_info().generate_calls)


def run(args: argparse.Namespace, model: str, addresses: list[str], root: Path, repeat: int = 1) -> dict[str, Any]:
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.replicas import rollout_generator
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    job = job_config(job_id=f"bench-replicas-{len(addresses)}-{repeat}-{os.getpid()}", base_model=model,
                     artifact_root=root / "artifacts", group_size=args.group_size, batch_size=args.batch_size,
                     max_completion_tokens=args.max_tokens, lora_rank=8, lora_alpha=16, learning_rate=1e-5,
                     max_steps=args.steps, loss_type="dapo", generation_backend="vllm", seed=1)
    before = [served(a) for a in addresses]
    events: list[Any] = []
    generator = rollout_generator(addresses)
    started = time.perf_counter()
    try:
        result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append,
                                      generator=generator))
    finally:
        generator.close()
    seconds = time.perf_counter() - started
    if result.status != "completed":
        print(f"  run {repeat}: the job with {len(addresses)} replica(s) failed: {result.error}", flush=True)
        return {"replicas": len(addresses), "repeat": repeat, "ok": False, "error": result.error}
    kept = events[args.skip:] or events
    return {
        "replicas": len(addresses), "repeat": repeat, "ok": True,
        "steps_per_s": len(kept) / sum(e.step_seconds for e in kept),
        "generate_s": statistics.mean(e.generate_seconds for e in kept),
        "step_s": statistics.mean(e.step_seconds for e in kept),
        "job_s": seconds,
        "calls": [served(a) - b for a, b in zip(addresses, before, strict=True)],
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    from rlvr.infra.reaper import stop_process_groups
    from rlvr.models import resolve_model
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    args = parse_args(argv)
    torch.set_num_threads(1)
    model = resolve_model(args.model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-replicas-") as tmp:
        root = Path(tmp)
        servers = [start_server(args, model, root, k) for k in (1, 2)]
        try:
            for address, _ in servers:
                waiting = ServiceGenerator(address)
                waiting.wait_ready(900)
                waiting.close()
            addresses = [a for a, _ in servers]
            for repeat in range(1, args.repeats + 1):
                for n in (1, 2):  # interleaved: a slow spell of the host touches both counts alike
                    rows.append(run(args, model, addresses[:n], root, repeat))
        finally:
            stop_process_groups([proc for _, proc in servers], grace=60)
    print(f"\n{args.model}, {args.backend} rollout servers, {args.batch_size} completions "
          f"({args.batch_size // args.group_size} prompts x {args.group_size}) of <= {args.max_tokens} tokens, "
          f"{args.steps} steps ({args.skip} left out), {os.cpu_count()} cores; median [lowest-highest] of "
          f"{args.repeats} runs each")
    table = {key: spreads(rows, key, by="replicas") for key in ("steps_per_s", "generate_s", "step_s")}
    print("| replicas | runs | steps/s | generate s | step s | Generate calls per server |")
    print("|---|---|---|---|---|---|")
    for n in (1, 2):
        mine = [r for r in rows if r["replicas"] == n]
        calls = [Spread.of([r["calls"][k] for r in mine if r["ok"]]).cell(0) for k in range(n)]
        print(f"| {n} | {tally(r['ok'] for r in mine)} | {table['steps_per_s'][n].cell(3, of=len(mine))} | "
              f"{table['generate_s'][n].cell(2, of=len(mine))} | {table['step_s'][n].cell(2, of=len(mine))} | "
              f"{', '.join(calls)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
