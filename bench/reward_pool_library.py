"""The reward service's scoring pool against a library pool (pebble's ProcessPool), on the same
batches: is a well-kept pool with per-task timeouts and worker replacement as fast?

    python bench/reward_pool_library.py [--batches 20] [--batch-size 1024] [--workers 2]

Rows, each `--batches` calls of one batch of GSM8K-like completions (bench/reward_throughput.py's),
scored by the built-in gsm8k reward with a 2 s limit per completion:

- rlvr's pool (services/reward/pool.py `ScoringPool`): persistent spawned workers, one message per
  shard of the batch, the per-item limit kept by a watchdog on shared memory;
- pebble, one task per completion (`ProcessPool.schedule(..., timeout=2)`): pebble's own per-task
  limit and worker replacement, the same guarantee;
- pebble, one task per worker's share (`timeout` = 2 s x the share): a task per shard as rlvr's pool
  sends, but a hung completion then loses its whole share's scores, not its own.

Prints the median completions/s with the range over the calls, and the p50/p99 of a call; writes
bench/results/reward_pool_library.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from reward_throughput import completions, percentile  # noqa: E402

TIMEOUT_S = 2.0


def _score(items: Sequence[object]) -> list[float]:
    """In a pebble worker: the items' rewards (the registry loads once per worker, then is cached)."""
    from rlvr.services.reward.pool import score_many

    return [r.reward for r in score_many(items)]  # type: ignore[arg-type]


def _items(n: int) -> list[object]:
    from rlvr.services.reward.pool import ScoreItem

    return [ScoreItem("gsm8k", completion, truth) for completion, truth in completions(n)]


def _timed(call: Callable[[], list[float]], batches: int, expected: list[float]) -> list[float]:
    assert call() == expected  # warm (workers started, registry loaded), and the same scores
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        got = call()
        times.append(time.perf_counter() - t0)
        assert got == expected
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    try:
        from pebble import ProcessPool
    except ImportError:
        sys.exit("pebble is not installed: .venv/bin/pip install pebble (it is in the dev extra: make install)")
    from rlvr.services.reward.pool import ScoringPool

    items = _items(args.batch_size)
    expected = _score(items)
    rows: dict[str, list[float]] = {}

    pool = ScoringPool(workers=args.workers)
    try:
        rows["rlvr's pool (a message per shard, a watchdog per item)"] = _timed(
            lambda: [r.reward for r in pool.score_batch(items, TIMEOUT_S)], args.batches, expected)
    finally:
        pool.close()

    with ProcessPool(max_workers=args.workers, context=mp.get_context("spawn")) as pebble:
        def per_item() -> list[float]:
            futures = [pebble.schedule(_score, args=([item],), timeout=TIMEOUT_S) for item in items]
            return [f.result()[0] for f in futures]

        share = -(-len(items) // args.workers)

        def per_share() -> list[float]:
            futures = [pebble.schedule(_score, args=(items[i:i + share],), timeout=TIMEOUT_S * share)
                       for i in range(0, len(items), share)]
            return [score for f in futures for score in f.result()]

        rows["pebble, a task per completion (its own per-task limit)"] = _timed(per_item, args.batches, expected)
        rows["pebble, a task per share (a limit per share only)"] = _timed(per_share, args.batches, expected)

    print(f"{args.batch_size} completions a call, {args.batches} calls, {args.workers} workers, "
          f"{os.cpu_count()} CPUs\n")
    print("| pool | completions/s (median, range) | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    out = {}
    for name, times in rows.items():
        rates = [args.batch_size / t for t in times]
        out[name] = {"rate_median": statistics.median(rates), "rate_min": min(rates), "rate_max": max(rates),
                     "p50_ms": 1000 * percentile(times, 0.5), "p99_ms": 1000 * percentile(times, 0.99)}
        r = out[name]
        print(f"| {name} | {r['rate_median']:,.0f} ({r['rate_min']:,.0f} - {r['rate_max']:,.0f}) | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "reward_pool_library.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
