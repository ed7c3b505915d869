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
(rlvr/v1) separately. The whole run (a fresh stack, one job) is made `--repeats` times (at least 3):
what else runs during the step (the scheduler's dispatch loop, every second) is a matter of timing,
so each count is the median [lowest-highest] over the runs ("(k of n)": a process seen in only k).
It measures; it never fails on a count.
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", type=Path, default=ROOT, help="the checkout to trace (default: this one)")
    p.add_argument("--python", default=sys.executable, help="the interpreter with rlvr's dependencies")
    p.add_argument("--model", default="rlvr-tiny-test")
    p.add_argument("--backend", default="vllm", choices=["vllm", "transformers"], help="the rollout server's")
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs of the whole stack and job (>= 3)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--window", type=int, default=3, help="the step whose files are counted (1-based)")
    p.add_argument("--store-slack", type=float, default=0.5, help="seconds after the step for its store")
    p.add_argument("--base-port", type=int, default=56100)
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    p.add_argument("--list", action="store_true",
                   help="print the step's files (of every run), in the order first entered, with how many runs entered each")
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


def trace_once(args: argparse.Namespace, work: Path, home: Path) -> dict[str, Any]:
    """One run: a fresh stack, one job, its trace read back as {"per_role", "step", "run", "first",
    "window"} (files by process role; the step's files; the run's; each step file's first entry, in
    seconds after the window opened; the window's length)."""
    trace = work / "trace"
    trace.mkdir(parents=True)
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
    step_files: set[str] = set().union(*(fs for r, fs in per_role.items() if r in service_roles))
    return {"per_role": {r: sorted(f) for r, f in per_role.items()}, "step": sorted(step_files),
            "run": sorted(run_files), "first": {f: first[f] - lo for f in step_files}, "window": hi - lo}


def counts(files: list[str]) -> tuple[int, int]:
    """(rlvr's own files, generated ones under rlvr/v1)."""
    own = sum(1 for f in files if not f.startswith("rlvr/v1/"))
    return own, len(files) - own


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.checkout = args.checkout.resolve()
    work = Path(tempfile.mkdtemp(prefix="rlvr-step-path-"))
    home = Path(os.environ.get("RLVR_HOME", work / "home"))
    runs = []
    for repeat in range(1, args.repeats + 1):
        print(f"run {repeat}/{args.repeats}", flush=True)
        runs.append(trace_once(args, work / f"run-{repeat}", home))
    n = len(runs)

    def cell(lists: list[list[str] | None]) -> str:
        """The median [range] of the own files over the runs (+ the generated ones'), "(k of n)" if a
        process was seen in only k runs."""
        got = [counts(files) if files is not None else None for files in lists]
        own = Spread.of([c[0] if c is not None else None for c in got])
        generated = Spread.of([c[1] if c is not None else None for c in got])
        return f"{own.cell(0, of=n)} (+{generated.cell(0)} generated)"

    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=args.checkout, capture_output=True,
                            text=True).stdout.strip()
    windows = Spread.of([r["window"] for r in runs])
    print(f"\ncheckout {args.checkout} ({commit}), step {args.window} of {args.steps}, window {windows.cell(2)} s; "
          f"median [lowest-highest] of {n} runs\n")
    print("| process | files entered during the step |\n|---|---|")
    for role_name in sorted({r for one in runs for r in one["per_role"]}):
        print(f"| {role_name} | {cell([one['per_role'].get(role_name) for one in runs])} |")
    print(f"| **step (services + job process)** | **{cell([one['step'] for one in runs])}** |")
    print(f"| run (any process, `rlvr train` to the end) | {cell([one['run'] for one in runs])} |")
    if args.list:
        print(f"\nthe step's files of every run, first entered first (median seconds after the window opened; "
              f"runs that entered it, of {n}):")
        entered: dict[str, list[float]] = {}
        for one in runs:
            for f, at in one["first"].items():
                entered.setdefault(f, []).append(at)
        for f, ats in sorted(entered.items(), key=lambda item: Spread.of(item[1]).median or 0.0):
            print(f"  {Spread.of(ats).median:7.3f} s  {len(ats)}/{n}  {f}")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
