"""Which of rlvr's own files one training step runs through, counted by tracing every process.

    python bench/step_path.py                         # this checkout
    python bench/step_path.py --checkout /tmp/old     # another checkout (an older commit), same method

Starts the checkout's own stack (`rlvr up`: embedded NATS, SQLite, the five services; vLLM rollout on
`--model`) with `bench/step_path/sitecustomize.py` loaded into every Python process, runs one job
(`rlvr train`, `--steps` steps) and reads back, per process, when each of the checkout's source files
was entered (tests/ and bench/ are not counted). One step's window is the time between TRL's
`GRPOTrainer.training_step` calls `--window` and `--window`+1 in the job process (generate, score,
update, push, publish), plus `--store-slack` seconds for the scheduler to store the point.

Prints, per process (CLI, stack supervisor, each service, the job process), the files entered in that
window, and the totals: "step" (the services and the job process) and "run" (every file any process
entered from `rlvr train` to the end of the job). The counts include the generated contract
(rlvr/v1) separately. It measures; it never fails on a count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", type=Path, default=ROOT, help="the checkout to trace (default: this one)")
    p.add_argument("--python", default=sys.executable, help="the interpreter with rlvr's dependencies")
    p.add_argument("--model", default="rlvr-tiny-test")
    p.add_argument("--backend", default="vllm", choices=["vllm", "transformers"], help="the rollout server's")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--window", type=int, default=3, help="the step whose files are counted (1-based)")
    p.add_argument("--store-slack", type=float, default=0.5, help="seconds after the step for its store")
    p.add_argument("--base-port", type=int, default=56100)
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    p.add_argument("--list", action="store_true", help="print the step's files, in the order first entered")
    return p.parse_args(argv)


def role(argv: list[str]) -> str:
    text = " ".join(argv)
    for name in ("scheduler", "trainer", "rollout", "reward", "benchmark"):
        if f"services/{name}/" in text or f"services.{name}." in text or f"rlvr-{name}" in text:
            return name
    if "job_process" in text:
        return "job process"
    if " up" in f" {text}" or text.endswith("up"):
        return "rlvr up"
    if "train" in text:
        return "rlvr train"
    return "other: " + text[:60]


def run(args: argparse.Namespace, trace: Path, home: Path) -> float:
    env = dict(os.environ, RLVR_HOME=str(home), RLVR_TRACE_DIR=str(trace), RLVR_TRACE_ROOT=str(args.checkout),
               PYTHONPATH=f"{HERE / 'step_path'}{os.pathsep}{args.checkout}", PYTHONUNBUFFERED="1")
    package = "rlvr.clients" if (args.checkout / "rlvr" / "clients").exists() else "clients"  # before the rename
    cli = [args.python, "-m", f"{package}.cli"]
    log = open(trace.parent / "up.log", "wb")  # noqa: SIM115 (closed with the stack)
    up = subprocess.Popen([*cli, "up", "--base-port", str(args.base_port), "--model", args.model,
                           "--rollout-backend", args.backend, "--home", str(trace.parent / "stack"), "--no-web"],
                          cwd=args.checkout, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        address = f"127.0.0.1:{args.base_port}"
        deadline = time.time() + 600
        tokens = trace.parent / "stack" / "tokens.json"  # a stack with auth (not in older checkouts)
        while True:
            if tokens.exists():
                env["RLVR_TOKEN"] = next(t for t, r in json.loads(tokens.read_text()).items() if r == "user")
            if subprocess.run([*cli, "jobs", "list", "--address", address], cwd=args.checkout, env=env,
                              capture_output=True).returncode == 0:
                break
            if up.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the stack did not start: see {trace.parent / 'up.log'}")
            time.sleep(3)
        started = time.time()
        train = subprocess.run([*cli, "train", "--model", args.model, "--max-steps", str(args.steps),
                                "--address", address], cwd=args.checkout, env=env, capture_output=True, text=True)
        print(train.stdout[-1500:], train.stderr[-1500:], sep="\n")
        time.sleep(3)  # the last flushes
        return started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
        log.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.checkout = args.checkout.resolve()
    work = Path(tempfile.mkdtemp(prefix="rlvr-step-path-"))
    trace = work / "trace"
    trace.mkdir()
    home = Path(os.environ.get("RLVR_HOME", work / "home"))
    started = run(args, trace, home)
    procs = [json.loads(p.read_text()) for p in trace.glob("*.json")]
    steps = sorted(t for p in procs for t in p["steps"])
    if len(steps) < args.window + 1:
        raise SystemExit(f"only {len(steps)} training steps were traced: see {work}")
    lo, hi = steps[args.window - 1], steps[args.window] + args.store_slack
    per_role: dict[str, set[str]] = defaultdict(set)
    first: dict[str, float] = {}
    run_files: set[str] = set()
    for p in procs:
        r = role(p["argv"])
        for f, times in p["files"].items():
            if any(t >= started for t in times):
                run_files.add(f)
            inside = [t for t in times if lo <= t <= hi]
            if inside:
                per_role[r].add(f)
                first[f] = min(first.get(f, inside[0]), inside[0])
    service_roles = {"scheduler", "trainer", "rollout", "reward", "benchmark", "job process"}
    step_files = set().union(*(fs for r, fs in per_role.items() if r in service_roles))

    def count(files: set[str]) -> str:
        own = [f for f in files if not f.startswith("rlvr/v1/")]
        return f"{len(own)} (+{len(files) - len(own)} generated)"

    print(f"\ncheckout {args.checkout} ({subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=args.checkout, capture_output=True, text=True).stdout.strip()}),"
          f" step {args.window} of {args.steps}, window {hi - lo:.2f} s\n")
    print("| process | files entered during the step |\n|---|---|")
    for r in sorted(per_role):
        print(f"| {r} | {count(per_role[r])} |")
    print(f"| **step (services + job process)** | **{count(step_files)}** |")
    print(f"| run (any process, `rlvr train` to the end) | {count(run_files)} |")
    if args.list:
        print("\nthe step's files, first entered first:")
        for f in sorted(step_files, key=lambda f: first[f]):
            print(f"  {first[f] - lo:7.3f} s  {f}")
    if args.out:
        args.out.write_text(json.dumps({"per_role": {r: sorted(f) for r, f in per_role.items()},
                                        "step": sorted(step_files), "run": sorted(run_files)}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
