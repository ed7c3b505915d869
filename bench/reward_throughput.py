"""Reward throughput: completions scored per second, and the latency of one Score call, for a
built-in reward, a trivial plugin, a remote reward and the sandboxed code reward; in-process and
through a real reward service (its own process, over gRPC).

    python bench/reward_throughput.py [--batches 20] [--batch-size 1024] [--code-batch 64]

Each row is `--batches` calls of one batch: it prints the median completions/s with the range over
the calls, and the p50/p99 latency of a call. Writes bench/results/reward_throughput.json. Targets
(the reward issue): the plugin through the reward service within 1.5x of the built-in through it,
the code reward at least 50 completions/s per core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PLUGIN = '''
from rlvr.rewards import Sample, reward

@reward("bench_exact", display_name="Bench exact")
def bench_exact(sample: Sample) -> float:
    return 1.0 if sample.completion.rstrip().endswith(sample.ground_truth) else 0.0
'''


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


def code_items(n: int) -> list[tuple[str, str, dict]]:
    """The bundled code tasks' reference solutions (all pass), as completions."""
    from rlvr.tasks.code import CodeTask

    problems = CodeTask().prompts(min(n, 150), split="test")
    rows = [(f"<think>t</think><answer>```python\n{p.ground_truth}\n```</answer>", p.ground_truth, dict(p.columns))
            for p in problems]
    return (rows * (n // len(rows) + 1))[:n]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def timed(call: Callable[[], object], batches: int) -> list[float]:
    call()  # warm: worker processes, sandboxes, channels
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def in_process(key: str, items: list[tuple], batches: int) -> list[float]:
    from rlvr.rewards.combine import score_samples
    from rlvr.rewards.registry import Sample, load_registry

    definition = load_registry().get(key)
    samples = [Sample(c, g, columns=cols[0] if cols else {}) for c, g, *cols in items]
    return timed(lambda: score_samples([(definition, 1.0)], samples), batches)


def through_service(address: str, key: str, items: list[tuple], batches: int) -> list[float]:
    from rlvr.clients.sdk import RewardClient
    from rlvr.peers.types import ScoreInput, score_request

    client = RewardClient(address)
    request = score_request(key, [ScoreInput(c, g, columns=cols[0] if cols else {}) for c, g, *cols in items])
    response = client.score(request, timeout=600)
    assert not any(r.error for r in response.results), response.results[0].error
    return timed(lambda: client.score(request, timeout=600), batches)


def start_remote(work: Path) -> tuple[subprocess.Popen, int]:
    from test_bootstrap import _free_port
    from test_rewards_e2e import generate_stubs

    port = _free_port()
    generated = generate_stubs(work / "generated")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "remote_reward_server.py"), str(generated),
                             str(port), "exact"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
    return proc, port


def start_service(work: Path, remote_port: int) -> tuple[subprocess.Popen, str]:
    from fixtures_rewards import write_distribution
    from test_bootstrap import _free_port, _wait_serving

    plugins = write_distribution(work / "plugins", "rlvr-bench-plugin", {"rlvr_bench_plugin": PLUGIN},
                                 {"bench_exact": "rlvr_bench_plugin:bench_exact"})
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "RLVR_REWARD_REMOTE_REWARDS": json.dumps({"bench_remote": {"address": f"127.0.0.1:{remote_port}"}})}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.services.reward.main", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    address = f"127.0.0.1:{port}"
    _wait_serving(address)
    return proc, address


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--code-batch", type=int, default=64)
    args = parser.parse_args()
    items, code = completions(args.batch_size), code_items(args.code_batch)
    cores = len(os.sched_getaffinity(0))

    from fixtures_rewards import write_distribution

    from rlvr.rewards import registry

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sys.path.insert(0, str(write_distribution(work / "local", "rlvr-bench-plugin", {"rlvr_bench_plugin": PLUGIN},
                                                  {"bench_exact": "rlvr_bench_plugin:bench_exact"})))
        registry.clear_cache()
        remote, remote_port = start_remote(work)
        service, address = start_service(work, remote_port)
        try:
            rows = {
                "built-in gsm8k, in-process": (args.batch_size, in_process("gsm8k", items, args.batches)),
                "plugin, in-process": (args.batch_size, in_process("bench_exact", items, args.batches)),
                "built-in gsm8k, reward service": (args.batch_size, through_service(address, "gsm8k", items,
                                                                                    args.batches)),
                "plugin, reward service": (args.batch_size, through_service(address, "bench_exact", items,
                                                                            args.batches)),
                "remote reward, reward service": (args.batch_size, through_service(address, "bench_remote", items,
                                                                                   args.batches)),
                "code reward, in-process": (args.code_batch, in_process("code", code, args.batches)),
                "code reward, reward service": (args.code_batch, through_service(address, "code", code,
                                                                                 args.batches)),
            }
        finally:
            for proc in (service, remote):
                proc.terminate()
                proc.wait(timeout=30)
    print(f"reward scoring: {args.batches} calls per row; GSM8K-like batches of {args.batch_size}, code batches of "
          f"{args.code_batch}; {cores} cores; load {os.getloadavg()[0]:.2f}")
    print(f"{'path':<32}{'completions/s (median, range)':>34}{'p50 ms':>10}{'p99 ms':>10}")
    results = {}
    for name, (n, times) in rows.items():
        rates = [n / t for t in times]
        median, low, high = statistics.median(rates), min(rates), max(rates)
        p50, p99 = percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000
        results[name] = {"completions_per_s": median, "range": [low, high], "p50_ms": p50, "p99_ms": p99,
                         "batch": n}
        print(f"{name:<32}{median:>14,.0f}  ({low:>7,.0f} - {high:>7,.0f}){p50:>10.1f}{p99:>10.1f}")
    plugin, builtin = results["plugin, reward service"], results["built-in gsm8k, reward service"]
    print(f"plugin / built-in through the reward service: {builtin['completions_per_s'] / plugin['completions_per_s']:.2f}x "
          "the built-in's time (target <= 1.5x)")
    print(f"code reward through the reward service: {results['code reward, reward service']['completions_per_s'] / cores:,.0f}"
          " completions/s per core (target >= 50)")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_throughput.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
