"""Faults on the real stack: one training job per fault, a process killed with SIGKILL mid-job.

    python bench/faults.py                                  # every fault, rlvr-tiny-small, 16 steps
    python bench/faults.py --faults rollout,trainer --steps 24 --at-step 6

One stack (embedded NATS, SQLite, the five services as processes, the rollout server on vLLM);
first a job without a fault, then the same job (same spec, same seed) once per fault:

- `rollout`:     the rollout server's main process (its vLLM engine must go with it), restarted;
- `scheduler`:   the scheduler, restarted;
- `trainer`:     the trainer service (its job process must go with it), restarted;
- `job-process`: the job's training process alone (the trainer service stays).

Each is killed once the job has stored step `--at-step`. Per fault it prints: the job's outcome;
steps stored (of the job's steps); stored twice (metric points with the same step; the store and
the stream both deduplicate, so anything here is a bug); re-run (steps the trainer computed again,
from the job's log: the steps after its last checkpoint); time to recover (from the kill to the
next stored step); and whether the final adapter is bit-identical to the fault-free run's. Writes
JSON (`--out`). It never fails on a result: it measures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FAULTS = ("rollout", "scheduler", "trainer", "job-process")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-small")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--at-step", type=int, default=5, help="kill once this step is stored")
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--home", type=Path, default=None, help="stack folder (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    args = p.parse_args(argv)
    unknown = sorted(set(args.faults.split(",")) - set(FAULTS))
    if unknown:
        p.error(f"--faults: unknown {', '.join(unknown)}; allowed: {', '.join(FAULTS)}")
    if not 1 <= args.at_step < args.steps:
        p.error(f"--at-step: {args.at_step} is out of range; allowed: 1..{args.steps - 1} (below --steps)")
    return args


def job_spec(args: argparse.Namespace, name: str) -> Any:
    from rlvr.v1 import common_pb2 as C

    spec = C.JobSpec(name=name, base_model=args.model)
    spec.reward.function = C.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 64
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = 4, 8, 32
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = 4, 128, 1e-5, args.steps
    spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM
    spec.advanced.checkpoint_every = args.checkpoint_every
    spec.advanced.seed = 7
    return spec


def job_process_pid(job_id: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rlvr.services.trainer.job_process" in cmdline and any(job_id.encode() in c for c in cmdline):
                return int(proc.name)
    return None


def inject(stack: Any, fault: str, job_id: str) -> None:
    if fault == "job-process":
        pid = job_process_pid(job_id)
        if pid is None:
            raise RuntimeError(f"no job process for {job_id}")
        os.kill(pid, signal.SIGKILL)
        return
    service = {"rollout": "rollout", "scheduler": "scheduler", "trainer": "trainer"}[fault]
    # The rollout server's main process alone: its vLLM engine processes must not outlive it.
    if not stack.restart(service, group=fault != "rollout", timeout=300):
        raise RuntimeError(f"the {service} service did not come back")


def rerun_steps(home: Path, job_id: str) -> int:
    """Steps the trainer logged more than once for the job (its log is appended to on a resume)."""
    counts: collections.Counter[int] = collections.Counter()
    for log in (home / "artifacts" / "jobs" / job_id).glob("*.log"):
        for m in re.finditer(r"\bstep (\d+)/\d+ reward", log.read_text(errors="replace")):
            counts[int(m[1])] += 1
    return sum(n - 1 for n in counts.values() if n > 1)


def run_one(stack: Any, client: Any, home: Path, args: argparse.Namespace, fault: str | None) -> dict[str, Any]:
    from rlvr.infra.store import Store
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import scheduler_pb2 as S

    job_id = client.scheduler.create_job(S.CreateJobRequest(spec=job_spec(args, f"fault-{fault or 'none'}"))).job.id
    started = time.monotonic()
    injected_at = recovered_at = None
    seen_at_kill = 0

    def get() -> Any:
        while True:
            try:
                return client.scheduler.get_job(S.GetJobRequest(id=job_id), timeout=5)
            except Exception:  # noqa: BLE001 (the scheduler itself is being restarted)
                time.sleep(0.5)

    while True:
        job = get()
        if job.status in (C.JOB_STATUS_COMPLETED, C.JOB_STATUS_FAILED, C.JOB_STATUS_CANCELLED):
            break
        if fault and injected_at is None and job.current_step >= args.at_step:
            seen_at_kill = job.current_step
            injected_at = time.monotonic()
            print(f"  {fault}: kill -9 at step {job.current_step}", flush=True)
            inject(stack, fault, job_id)
        if injected_at is not None and recovered_at is None and job.current_step > seen_at_kill:
            recovered_at = time.monotonic()
        if time.monotonic() - started > 1800:
            break
        time.sleep(0.2)
    with Store(f"sqlite:///{home / 'rlvr.db'}") as store:
        points = store.metric_points(job_id)
    steps = [p.step for p in points]
    adapter = Path(job.adapter.path, "adapter_model.safetensors") if job.adapter.path else None
    return {
        "fault": fault or "none", "job": job_id, "outcome": C.JobStatus.Name(job.status).removeprefix("JOB_STATUS_"),
        "error": job.error, "stored": len(set(steps)), "steps": args.steps, "doubled": len(steps) - len(set(steps)),
        "rerun": rerun_steps(home, job_id),
        "recover_s": None if recovered_at is None or injected_at is None else round(recovered_at - injected_at, 1),
        "seconds": round(time.monotonic() - started, 1),
        "adapter": adapter.read_bytes() if adapter is not None and adapter.is_file() else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rlvr.clients.stack import local_stack

    home = args.home or Path(tempfile.mkdtemp(prefix="rlvr-faults-"))
    rows = []
    with local_stack(home, args.model) as (stack, client):
        for fault in (None, *args.faults.split(",")):
            print(f"job with fault: {fault or 'none'}", flush=True)
            rows.append(run_one(stack, client, home, args, fault))
    baseline = rows[0]["adapter"]
    header = f"{'fault':<12} {'outcome':<10} {'stored':>7} {'doubled':>7} {'re-run':>6} {'recover s':>9} {'same adapter':>12}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        same = "-" if r["fault"] == "none" else ("yes" if r["adapter"] is not None and r["adapter"] == baseline
                                                 else "no")
        r["same_adapter"] = same
        recover = "-" if r["recover_s"] is None else f"{r['recover_s']:.1f}"
        print(f"{r['fault']:<12} {r['outcome']:<10} {r['stored']:>3}/{r['steps']:<3} {r['doubled']:>7} {r['rerun']:>6} "
              f"{recover:>9} {same:>12}")
        if r["error"]:
            print(f"{'':<12} {r['error'][:150]}")
    if args.out:
        args.out.write_text(json.dumps([{k: v for k, v in r.items() if k != "adapter"} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
