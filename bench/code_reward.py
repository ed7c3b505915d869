"""Code-reward throughput: the sandbox running the bundled Code tasks' reference solutions.

    python bench/code_reward.py [--n 2000] [--sequential 300]

Rows: a trivial function with 3 tests and the bundled tasks (5 tests each), in batches with one
worker and with a worker per CPU (completions/s, and per core), and one run at a time (latency
p50/p99 of ``Sandbox.run``). Prints a table with the load average, writes
bench/results/code_reward.json. ``measure()`` is what bench/reward_throughput.py can call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr.rewards.sandbox import Sandbox  # noqa: E402
from rlvr.tasks.code import heldout_problems, training_problems  # noqa: E402

TRIVIAL = ("def f(x):\n    return x + 7\n", ["assert f(1) == 8", "assert f(2) == 9", "assert f(-7) == 0"])


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bundled(n: int) -> list[tuple[str, list[str]]]:
    problems = heldout_problems(150) + training_problems(max(8, n - 150), seed=0)
    return [(p.ground_truth, list(p.columns["tests"])) for p in problems[:n]]


def batch(sandbox: Sandbox, items: list[tuple[str, list[str]]]) -> dict[str, float]:
    sandbox.run_many(items[:20])  # warm
    started = time.perf_counter()
    runs = sandbox.run_many(items)
    elapsed = time.perf_counter() - started
    assert all(r.all_passed for r in runs), [r for r in runs if not r.all_passed][:3]
    rate = len(items) / elapsed
    return {"completions_per_s": rate, "per_core": rate / sandbox.workers}


def sequential(sandbox: Sandbox, items: list[tuple[str, list[str]]]) -> dict[str, float]:
    times = []
    for code, tests in items:
        started = time.perf_counter()
        sandbox.run(code, tests)
        times.append(time.perf_counter() - started)
    return {"completions_per_s": len(items) / sum(times), "p50_ms": percentile(times, 0.5) * 1000,
            "p99_ms": percentile(times, 0.99) * 1000}


def measure(n: int = 2000, sequential_n: int = 300) -> dict[str, dict[str, float]]:
    """completions/s (and per core) in batches, and the latency of single runs."""
    items = {"trivial f, 3 tests": [TRIVIAL] * n, "bundled tasks, 5 tests": bundled(n)}
    cores = len(os.sched_getaffinity(0))
    rows: dict[str, dict[str, float]] = {}
    for workers in sorted({1, cores}):
        with Sandbox(workers=workers) as sandbox:
            for name, batch_items in items.items():
                rows[f"{name}, batch, {workers} worker{'s' * (workers > 1)}"] = batch(sandbox, batch_items)
    with Sandbox(workers=1) as sandbox:
        for name, batch_items in items.items():
            rows[f"{name}, one at a time"] = sequential(sandbox, batch_items[:sequential_n])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="completions per batch row")
    parser.add_argument("--sequential", type=int, default=300, help="completions for the latency rows")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with Sandbox() as sandbox:
        isolation = sandbox.isolation()
    rows = measure(args.n, args.sequential)
    load_after = os.getloadavg()
    print(f"code reward: the sandbox on {len(os.sched_getaffinity(0))} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"isolation: {isolation['network']}; {isolation['pid']}; {isolation['user']}; {isolation['filesystem']}")
    print(f"{'row':<46}{'completions/s':>15}{'per core':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, row in rows.items():
        print(f"{name:<46}{row['completions_per_s']:>15,.0f}{row.get('per_core', float('nan')):>10,.0f}"
              f"{row.get('p50_ms', float('nan')):>9.1f}{row.get('p99_ms', float('nan')):>9.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "code_reward.json").write_text(json.dumps(
        {"rows": rows, "load_average": [load_before, load_after], "isolation": isolation,
         "median_of_rows": statistics.median(r["completions_per_s"] for r in rows.values())}, indent=2))


if __name__ == "__main__":
    main()
