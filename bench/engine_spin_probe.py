"""Where the threads of an asynchronous step run: bench/trainer_step.py's `max_async_steps=1` run
(rlvr-tiny, batch 32, 8 steps, one torch thread) on a rollout server whose engine core spins for
RLVR_VLLM_IDLE_SPIN_S seconds, with a probe that samples every 0.1 s the core and the CPU ticks of
the busiest thread of the trainer, of vLLM's worker and of its engine core (/proc/PID/task/*/stat).
Linux only. docs/measurements/trainer-step.md quotes it.

    python bench/engine_spin_probe.py --runs 6 --spin 0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import trainer_step as ts  # noqa: E402

STEP_ARGS = "--model rlvr-tiny --threads 1 --batch-size 32 --steps 8 --skip 2 --backends vllm"
Threads = dict[str, tuple[int, int]]  # thread id -> (utime + stime ticks, the core it last ran on)


def threads(pid: str) -> Threads:
    out: Threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        rest = raw.rsplit(")", 1)[1].split()  # rest[0] is field 3; utime 14, stime 15, processor 39
        out[tid] = (int(rest[11]) + int(rest[12]), int(rest[36]))
    return out


def first_process(prefix: str) -> str | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith(prefix):
                return pid
        except OSError:
            continue
    return None


def busiest(before: Threads, now: Threads) -> tuple[int, int] | None:
    """(ticks since the last sample, core) of the thread that ran most, or None if none ran."""
    best = None
    for tid, (ticks, core) in now.items():
        ran = ticks - before.get(tid, (ticks, core))[0]
        if ran > 0 and (best is None or ran > best[0]):
            best = (ran, core)
    return best


def sample(stop: threading.Event, samples: list[dict[str, tuple[int, int]]]) -> None:
    before: dict[str, Threads] = {"trainer": {}, "worker": {}, "engine": {}}
    while not stop.is_set():
        pids = {"trainer": str(os.getpid()), "worker": first_process("VLLM::Worker"),
                "engine": first_process("VLLM::EngineCor")}
        now = {name: threads(pid) if pid else {} for name, pid in pids.items()}
        got = {name: busiest(before[name], now[name]) for name in now}
        if all(got.values()):
            samples.append(got)  # type: ignore[arg-type]
        before = now
        time.sleep(0.1)


def share(samples: list[dict[str, tuple[int, int]]], a: str, b: str) -> float:
    return sum(1 for s in samples if s[a][1] == s[b][1]) / max(len(samples), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--spin", nargs="+", default=["0"], help="engine core spin caps in seconds, run in turn")
    opts = p.parse_args()
    args = ts.parse_args(STEP_ARGS.split())
    import torch

    from rlvr.services.trainer.job.runner import resolve_base_model

    torch.set_num_threads(1)
    base = resolve_base_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(opts.runs):
            for spin in opts.spin:
                root = Path(tmp) / f"{run}-{spin}"
                root.mkdir()
                samples: list[dict[str, tuple[int, int]]] = []
                stop = threading.Event()
                probe = threading.Thread(target=sample, args=(stop, samples), daemon=True)
                probe.start()
                rows = ts.run_rlvr(args, "vllm", base, root, server_env={"RLVR_VLLM_IDLE_SPIN_S": spin},
                                   max_async_steps=1)
                stop.set()
                probe.join()
                n = max(len(samples), 1)
                ticks = {name: sum(s[name][0] for s in samples) / n for name in ("engine", "worker")}
                print(f"run {run + 1} spin {spin}: {ts.mean(rows, 'step', args.skip):.3f} s/step (generate wait "
                      f"{ts.mean(rows, 'generate', args.skip):.3f}, train {ts.mean(rows, 'train', args.skip):.3f}); "
                      f"same core: trainer+worker {share(samples, 'trainer', 'worker'):.0%}, engine core+worker "
                      f"{share(samples, 'engine', 'worker'):.0%}, engine core+trainer "
                      f"{share(samples, 'engine', 'trainer'):.0%} of {len(samples)} samples; ticks per 0.1 s: "
                      f"engine core {ticks['engine']:.1f}, worker {ticks['worker']:.1f}", flush=True)


if __name__ == "__main__":
    main()
