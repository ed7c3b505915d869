"""Faults on the real stack: one training job per fault, a process killed with SIGKILL mid-job.

    python bench/faults.py                                  # every fault, rlvr-tiny-small, 16 steps
    python bench/faults.py --faults rollout,trainer --steps 24 --at-step 6

One stack (embedded NATS, SQLite, the five services as processes, the rollout server on vLLM);
first a job without a fault, then the same job (same spec, same seed) once per fault:

- `rollout`:     the rollout server's main process (its vLLM engine must go with it), restarted;
- `scheduler`:   the scheduler, restarted;
- `trainer`:     the trainer service (its job process must go with it), restarted;
- `job-process`: the job's training process alone (the trainer service stays).

Each is killed once the job has stored step `--at-step`. The whole round (the job without a fault,
then one per fault) runs `--repeats` times (at least 3) on the same stack. Per fault it prints, over
its runs: how many ended COMPLETED; steps stored (of the job's steps); stored twice (metric points
with the same step; the store and the stream both deduplicate, so anything here is a bug); re-run
(steps the trainer computed again, from the job's log: the steps after its last checkpoint); time
to recover (from the kill to the next stored step); the counts and times as median
[lowest-highest]; and how many final adapters are bit-identical to the first fault-free run's (for
"none", its later runs). Writes JSON (`--out`). It never fails on a result: it measures.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repeats import check_repeats, spreads, tally  # noqa: E402  (bench/repeats.py)

FAULTS = ("rollout", "scheduler", "trainer", "job-process")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-small")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--at-step", type=int, default=5, help="kill once this step is stored")
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--repeats", type=check_repeats, default=3,
                   help="rounds of every fault (>= 3), on one stack, one round after the other")
    p.add_argument("--home", type=Path, default=None, help="stack folder (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    args = p.parse_args(argv)
    unknown = sorted(set(args.faults.split(",")) - set(FAULTS))
    if unknown:
        p.error(f"--faults: unknown {', '.join(unknown)}; allowed: {', '.join(FAULTS)}")
    if not 1 <= args.at_step < args.steps:
        p.error(f"--at-step: {args.at_step} is out of range; allowed: 1..{args.steps - 1} (below --steps)")
    return args


def job_spec(args: argparse.Namespace, name: str, seed: int = 7) -> Any:
    """The fault benches' job (bench/chaos.py's rounds too): `args.model`, `args.steps` and
    `args.checkpoint_every`, Math Pairs on the rollout server, seeded."""
    from rlvr.v1 import common_pb2 as C

    spec = C.JobSpec(name=name, base_model=args.model)
    spec.reward.function = C.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 64
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = 4, 8, 32
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = 4, 128, 1e-5, args.steps
    spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM
    spec.advanced.checkpoint_every = args.checkpoint_every
    spec.advanced.seed = seed
    return spec


def job_process_pid(job_id: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rlvr.services.trainer.process.job_process" in cmdline and any(job_id.encode() in c for c in cmdline):
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


def run_one(stack: Any, client: Any, home: Path, args: argparse.Namespace, fault: str | None,
            repeat: int = 1) -> dict[str, Any]:
    from rlvr.infra.store import Store
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import scheduler_pb2 as S

    name = f"fault-{fault or 'none'}-{repeat}"
    job_id = client.scheduler.create_job(S.CreateJobRequest(spec=job_spec(args, name))).job.id
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
        "fault": fault or "none", "repeat": repeat, "job": job_id, "outcome": C.JobStatus.Name(job.status).removeprefix("JOB_STATUS_"),
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
    faults = ["none", *args.faults.split(",")]
    rows = []
    with local_stack(home, args.model) as (stack, client):
        for repeat in range(1, args.repeats + 1):
            for fault in faults:
                print(f"round {repeat}/{args.repeats}, job with fault: {fault}", flush=True)
                rows.append(run_one(stack, client, home, args, None if fault == "none" else fault, repeat))
    baseline = rows[0]["adapter"]  # the first fault-free run's
    for r in rows:
        r["same_adapter"] = (None if r is rows[0]
                             else r["adapter"] is not None and r["adapter"] == baseline)
    table = {key: spreads(rows, key, by="fault") for key in ("stored", "doubled", "rerun", "recover_s")}
    print(f"\n{args.steps} steps, killed at step {args.at_step}; median [lowest-highest] of {args.repeats} runs each; "
          "same adapter: bit-identical to the first fault-free run's")
    header = (f"{'fault':<12} {'completed':>13} {'stored':>14} {'doubled':>14} {'re-run':>14} {'recover s':>24} "
              f"{'same adapter':>12}")
    print(header + "\n" + "-" * len(header))
    summary: dict[str, dict[str, Any]] = {}
    for fault in faults:
        mine = [r for r in rows if r["fault"] == fault]
        compared = [r["same_adapter"] for r in mine if r["same_adapter"] is not None]
        cells = {key: table[key][fault] for key in table}
        recover = "-" if fault == "none" else cells["recover_s"].cell(1, of=len(mine))
        print(f"{fault:<12} {tally((r['outcome'] == 'COMPLETED' for r in mine), 'completed'):>13} "
              f"{cells['stored'].cell(0):>14} {cells['doubled'].cell(0):>14} {cells['rerun'].cell(0):>14} "
              f"{recover:>24} {tally(compared, 'same'):>12}")
        for r in mine:
            if r["error"]:
                print(f"{'':<12} run {r['repeat']}: {r['error'][:150]}")
        summary[fault] = {"completed": sum(r["outcome"] == "COMPLETED" for r in mine), "runs": len(mine),
                          "same_adapter": sum(compared), "compared": len(compared),
                          **{key: cells[key].to_json() for key in table}}
    if args.out:
        args.out.write_text(json.dumps({"repeats": args.repeats, "steps": args.steps, "faults": summary,
                                        "runs": [{k: v for k, v in r.items() if k != "adapter"} for r in rows]},
                                       indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
