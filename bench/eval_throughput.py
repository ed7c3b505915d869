"""Evaluation throughput: questions per second of a whole evaluation through the services
(RunEvaluation -> rollout Generate -> reward Score -> store, followed with WatchEvaluation),
against scoring the very same completions in-process and through the reward service alone.

    python bench/eval_throughput.py                         # rlvr-tiny, transformers backend, 500 questions
    python bench/eval_throughput.py --backend vllm --repeats 3
    python bench/eval_throughput.py --benchmark-address HOST:PORT --reward-address HOST:PORT  # a running stack

Without addresses it starts NATS, a rollout, a reward and a benchmark service of its own (the
rollout on `--model`, built under $RLVR_HOME on first use). Rows:

- "evaluation via services": wall time from RunEvaluation to the final event, all phases;
- "  generate (rollout)", "  score (reward)": the service's own split of that run (batches overlap:
  the next batch generates while the last is scored, so the parts may add up to more than the whole);
- "score in-process": `rlvr.services.reward.pool.score_many` on the stored completions, no gRPC;
- "score via reward gRPC": the same completions in one Score call per benchmark batch.

Every row is measured `--repeats` times (at least 3; each round one evaluation, then its completions
scored both ways). Prints a table, each cell the median [lowest-highest] over the rounds, and writes
bench/results/eval_throughput.json. It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.clients.sdk import BenchmarkClient, RewardClient
    from rlvr.v1.benchmark_pb2 import Evaluation

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers: free ports, waiting for SERVING
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="rollout base model (rlvr-tiny, rlvr-tiny-test, a path)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    p.add_argument("--benchmark", default="rlvr-math-pairs-heldout")
    p.add_argument("--limit", type=int, default=0, help="questions (0 = the whole benchmark)")
    p.add_argument("--max-tokens", type=int, default=0, help="0 = the service default (256)")
    p.add_argument("--batch-size", type=int, default=128, help="benchmark questions per Generate/Score call")
    p.add_argument("--repeats", type=check_repeats, default=3, help="rounds of every row (>= 3)")
    p.add_argument("--rollout-threads", type=int, default=0,
                   help="OMP_NUM_THREADS for the rollout service it starts (0 = torch's default: all cores)")
    p.add_argument("--benchmark-address", default="", help="use a running benchmark service")
    p.add_argument("--reward-address", default="", help="its reward service (needed with --benchmark-address)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eval_throughput.json")
    return p.parse_args(argv)


@contextmanager
def own_stack(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """NATS + rollout + reward + benchmark in subprocesses; yields (benchmark, reward) addresses."""
    from test_bootstrap import _free_port, _wait_serving

    from rlvr.infra.nats_server import EmbeddedNats

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlvr-eval-bench-")))
        nats = stack.enter_context(EmbeddedNats(work / "nats"))
        procs: list[subprocess.Popen[bytes]] = []

        def start(name: str, *flags: str, env: dict[str, str] | None = None) -> str:
            port = _free_port()
            log = (work / f"{name}.log").open("wb")
            procs.append(subprocess.Popen([sys.executable, "-m", f"rlvr.services.{name}.main", "--port", str(port),
                                           "--log-format", "text", *flags], stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, **(env or {})}))
            try:
                _wait_serving(f"127.0.0.1:{port}", timeout=600)
            except TimeoutError:
                sys.exit(f"{name} did not start; its log:\n{(work / f'{name}.log').read_text()[-3000:]}")
            return f"127.0.0.1:{port}"

        try:
            threads = {"OMP_NUM_THREADS": str(args.rollout_threads)} if args.rollout_threads else None
            rollout = start("rollout", "--model", args.model, "--backend", args.backend, "--max-model-len", "1024",
                            "--adapter-root", str(work / "adapters"), env=threads)
            reward = start("reward")
            benchmark = start("benchmark", "--rollout-address", rollout, "--reward-address", reward,
                              "--nats-url", nats.url, "--database-url", f"sqlite:///{work / 'rlvr.db'}",
                              "--batch-size", str(args.batch_size))
            yield benchmark, reward
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)


def evaluate(client: BenchmarkClient, args: argparse.Namespace) -> tuple[Evaluation, float]:
    """One evaluation to its end: the stored result and the wall seconds it took."""
    from rlvr.v1 import benchmark_pb2 as B
    from rlvr.v1 import common_pb2 as C

    t0 = time.perf_counter()
    started = client.run_evaluation(B.RunEvaluationRequest(benchmark=args.benchmark, limit=args.limit,
                                                           sampling=C.SamplingParams(max_tokens=args.max_tokens)))
    for event in client.watch_evaluation(B.WatchEvaluationRequest(id=started.id)):
        if event.status in (B.EVALUATION_STATUS_COMPLETED, B.EVALUATION_STATUS_FAILED):
            break
    wall = time.perf_counter() - t0
    final = client.get_evaluation(B.GetEvaluationRequest(id=started.id))
    if final.status != B.EVALUATION_STATUS_COMPLETED:
        sys.exit(f"evaluation {final.id} failed: {final.error}")
    return final, wall


def score_inprocess(function: str, items: list[tuple[str, str]]) -> float:
    from rlvr.services.reward.pool import ScoreItem, score_many

    t0 = time.perf_counter()
    score_many([ScoreItem(function, c, g) for c, g in items])  # type: ignore[arg-type]
    return time.perf_counter() - t0


def score_grpc(reward: RewardClient, function: str, items: list[tuple[str, str]], batch: int) -> float:
    from rlvr.jobspec import REWARD_FUNCTIONS as FUNCTIONS
    from rlvr.v1 import reward_pb2

    t0 = time.perf_counter()
    for i in range(0, len(items), batch):
        reward.score(reward_pb2.ScoreRequest(function=FUNCTIONS[function], items=[
            reward_pb2.ScoreItem(completion=c, ground_truth=g) for c, g in items[i : i + batch]]))
    return time.perf_counter() - t0


def measure(args: argparse.Namespace, benchmark: str, reward_address: str) -> dict[str, object]:
    from rlvr.clients.sdk import BenchmarkClient, RewardClient
    from rlvr.services.benchmark.catalog import get_benchmark
    from rlvr.v1 import benchmark_pb2 as B

    client, reward = BenchmarkClient(benchmark), RewardClient(reward_address)
    function = get_benchmark(args.benchmark).reward_function
    runs: dict[str, list[float]] = {"evaluation via services": [], "  generate (rollout)": [],
                                    "  score (reward)": [], "score in-process": [], "score via reward gRPC": []}
    # Warm-up, not counted: the reward service starts its scoring workers and the rollout engine
    # its kernels on first use.
    evaluate(client, argparse.Namespace(**{**vars(args), "limit": 8}))
    evaluation = None
    for _ in range(args.repeats):
        evaluation, wall = evaluate(client, args)
        rows = client.get_evaluation_results(B.GetEvaluationResultsRequest(id=evaluation.id)).results
        items = [(r.completion, r.ground_truth) for r in rows]
        runs["evaluation via services"].append(wall)
        runs["  generate (rollout)"].append(evaluation.generate_seconds)
        runs["  score (reward)"].append(evaluation.score_seconds)
        runs["score in-process"].append(score_inprocess(function, items))
        runs["score via reward gRPC"].append(score_grpc(reward, function, items, args.batch_size))
    assert evaluation is not None
    n = evaluation.questions_total
    threads = f", rollout threads {args.rollout_threads}" if args.rollout_threads else ""
    print(f"{args.benchmark}: {n} questions, model {evaluation.model} ({args.backend}{threads}), greedy, "
          f"max_tokens {evaluation.sampling.max_tokens}, batches of {args.batch_size}, "
          f"median [lowest-highest] of {args.repeats}; accuracy {evaluation.scores.accuracy:.1%}")
    print(f"{'path':<28}{'seconds':>26}{'questions/s':>32}")
    table = {}
    for name, seconds in runs.items():
        spread = Spread.of(seconds)
        rate = Spread.of([n / s if s > 0 else None for s in seconds])
        table[name.strip()] = {"seconds": spread.median, "questions_per_s": rate.median, "runs": seconds,
                               "seconds_spread": spread.to_json(), "questions_per_s_spread": rate.to_json()}
        print(f"{name:<28}{spread.cell(3):>26}{rate.cell(of=len(seconds), fmt=',.1f'):>32}")
    return {"benchmark": args.benchmark, "questions": n, "model": evaluation.model, "backend": args.backend,
            "rollout_threads": args.rollout_threads or None,
            "max_tokens": evaluation.sampling.max_tokens, "batch_size": args.batch_size,
            "accuracy": evaluation.scores.accuracy, "rows": table}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.benchmark_address:
        if not args.reward_address:
            sys.exit("--reward-address is needed with --benchmark-address")
        args.backend = "a running stack"  # its rollout backend is whatever that stack was started with
        results = measure(args, args.benchmark_address, args.reward_address)
    else:
        with own_stack(args) as (benchmark, reward):
            results = measure(args, benchmark, reward)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
