"""What a vLLM rollout server takes from the host between two Generate calls, on a CPU.

    python bench/rollout_idle.py                     # rlvr-tiny: vLLM's 1 s spins, rlvr's defaults, none
    python bench/rollout_idle.py --spins 1:1,0.05:1,0:0 --calls 5

vLLM's engine core and its worker wait on shared-memory queues by spinning for 1 s after their last
read (`shm_broadcast.SpinCondition.busy_loop_s`); `rlvr/vllm_lora_ops.py`'s vLLM plugin caps the
worker's at RLVR_VLLM_WORKER_SPIN_S (default 0.05) and the engine core's at RLVR_VLLM_IDLE_SPIN_S
(default 1) on a CPU host. For each `WORKER:ENGINE` pair, this starts the rollout server
(`--backend vllm`) with them, makes `--calls` Generate calls of a training step's shape
(4 prompts x 8 completions, 48 tokens, temperature 1, seeded; the trainer's own client) with a pause
of `--idle` seconds after each, and reads the CPU time of the server's processes (every thread of
its process group, from /proc) during each call and during each pause: the pause is when a
synchronous trainer runs its update on the same cores; the call's CPU beyond its wall time is what an
asynchronous trainer's update, running beside it, loses. Medians over the calls after the first.
Prints a table and writes JSON (`--out`). It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny")
    p.add_argument("--spins", default="1:1,0.05:1,0.05:0",
                   help="WORKER:ENGINE spin caps in seconds (RLVR_VLLM_WORKER_SPIN_S:RLVR_VLLM_IDLE_SPIN_S), "
                        "comma-separated; 1:1 = vLLM's own")
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--idle", type=float, default=1.5, help="seconds after each call")
    p.add_argument("--memory", type=float, default=0.3, help="the server's --memory-fraction")
    p.add_argument("--out", type=Path, default=Path(".rlvr/bench/rollout_idle.json"))
    return p.parse_args(argv)


def cpu_seconds(group: int) -> float:
    """CPU time (user + system) of every process in process group `group`, from /proc."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.getpgid(int(entry)) != group:
                continue
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


def measure(args: argparse.Namespace, spin: str) -> dict[str, float]:
    from rlvr.clients.stack import free_port
    from rlvr.infra.reaper import stop_process_groups
    from rlvr.peers.base import check_health
    from rlvr.peers.types import AdapterTag, Sampling
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    port = free_port()
    home = Path(os.environ.get("RLVR_HOME", ROOT / ".rlvr"))
    worker, engine = spin.split(":")
    env = {**os.environ, "RLVR_VLLM_WORKER_SPIN_S": worker, "RLVR_VLLM_IDLE_SPIN_S": engine}
    log = (args.out.parent / f"rollout_idle-{worker}-{engine}.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", args.model,
         "--backend", "vllm", "--memory-fraction", str(args.memory),
         "--adapter-root", str(home / "bench" / f"idle-adapters-{port}")],
        cwd=ROOT, stdout=log, stderr=log, start_new_session=True, env=env)
    try:
        started = time.monotonic()
        while check_health(f"127.0.0.1:{port}") != "SERVING":
            if server.poll() is not None or time.monotonic() - started > 600:
                raise RuntimeError(f"the rollout server did not start; see {log.name}")
            time.sleep(1.0)
        generator = ServiceGenerator(f"127.0.0.1:{port}")
        prompt = list(range(1, 27))  # a Math Pairs prompt's length
        rows: list[tuple[float, float, float]] = []
        for call in range(args.calls):
            before, t0 = cpu_seconds(server.pid), time.monotonic()
            generator.generate([prompt] * 4, Sampling(temperature=1.0, max_tokens=48, seed=call, group_size=8),
                               AdapterTag("", 0))
            during, t1 = cpu_seconds(server.pid), time.monotonic()
            time.sleep(args.idle)
            rows.append((t1 - t0, during - before, cpu_seconds(server.pid) - during))
        generator.close()
        kept = rows[1:] or rows
        return {"generate_s": statistics.median(r[0] for r in kept),
                "cpu_generate_s": statistics.median(r[1] for r in kept),
                "cpu_idle_s": statistics.median(r[2] for r in kept)}
    finally:
        stop_process_groups([server], grace=60)
        log.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    results = {spin: measure(args, spin) for spin in [s.strip() for s in args.spins.split(",") if s.strip()]}
    load_after = os.getloadavg()[0]
    print(f"model {args.model}, 4 prompts x 8, 48 tokens; {args.calls} calls, {args.idle} s after each; "
          f"medians over calls 2-{args.calls}")
    print(f"{'worker:engine spin s':<24}{'Generate s':>12}{'server CPU s, call':>20}"
          f"{f'server CPU s, {args.idle} s after':>26}")
    for spin, r in results.items():
        label = spin + (" (vLLM's own)" if spin == "1:1" else " (rlvr's default)" if spin == "0.05:1" else "")
        print(f"{label:<24}{r['generate_s']:>12.3f}{r['cpu_generate_s']:>20.3f}{r['cpu_idle_s']:>26.3f}")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} CPUs): a shared host")
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                    "loadavg_before": load_before, "loadavg_after": load_after}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
