"""Reward-service throughput: completions scored per second and the latency of a 1,024-completion
batch over gRPC (a real reward service in its own process), against the same scoring in-process.

    python bench/reward_throughput.py [--batches 30] [--batch-size 1024]

Prints a table and writes bench/results/reward_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def completions(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """GSM8K-like completions: reasoning with several numbers, then an answer block (or not)."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        truth = a * b
        answer = truth if rng.random() < 0.5 else truth + rng.randint(1, 9)
        body = (f"<think>She has {a} boxes of {b} apples, so {a} * {b} = {answer}. "
                f"That is ${answer:,} in total, give or take 3.5%.</think>")
        tail = f"<answer>{answer:,}</answer>" if rng.random() < 0.8 else f"The answer is {answer}."
        items.append((body + tail, str(truth)))
    return items


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bench_inprocess(items: list[tuple[str, str]], batches: int) -> list[float]:
    from rlvr.services.reward.pool import ScoreItem, score_many

    batch = [ScoreItem("gsm8k", c, g) for c, g in items]
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        score_many(batch)
        times.append(time.perf_counter() - t0)
    return times


def bench_grpc(items: list[tuple[str, str]], batches: int) -> list[float]:
    from test_bootstrap import _free_port, _wait_serving  # the tests' helpers: a real server on loopback

    from rlvr.clients.sdk import RewardClient
    from rlvr.v1 import common_pb2, reward_pb2

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.services.reward.main", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_serving(f"127.0.0.1:{port}")
        client = RewardClient(f"127.0.0.1:{port}")
        request = reward_pb2.ScoreRequest(function=common_pb2.REWARD_FUNCTION_GSM8K,
                                          items=[reward_pb2.ScoreItem(completion=c, ground_truth=g) for c, g in items])
        client.score(request)  # warm the worker pool
        times = []
        for _ in range(batches):
            t0 = time.perf_counter()
            client.score(request)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    items = completions(args.batch_size)
    rows = {"in-process (score_many)": bench_inprocess(items, args.batches),
            "gRPC reward service": bench_grpc(items, args.batches)}
    print(f"reward scoring, batches of {args.batch_size} GSM8K-like completions, {args.batches} batches")
    print(f"{'path':<26}{'completions/s':>15}{'p50 ms':>10}{'p99 ms':>10}")
    results = {}
    for name, times in rows.items():
        rate = args.batch_size / statistics.mean(times)
        p50, p99 = percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000
        results[name] = {"completions_per_s": rate, "p50_ms": p50, "p99_ms": p99}
        print(f"{name:<26}{rate:>15,.0f}{p50:>10.1f}{p99:>10.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_throughput.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
