"""An automated training loop on the bundled headroom model, through the whole stack (embedded
NATS, SQLite, the five services; rounds train on the transformers backend, every evaluation
generates on the rollout server's vLLM engine), asked to double the base model's score by itself.

    python bench/loop.py                        # issue 30's loop: rlvr-tiny-headroom, target 2 x base, 8 rounds, give up after 2
    python bench/loop.py --times 1.5            # target 1.5 x the base score
    python bench/loop.py --gain 10 --model rlvr-tiny --steps 150   # target = base + 10 points instead

The target is a multiple (`--times`, default 2.0) of the base model's held-out accuracy on the same
questions (measured through the benchmark service first), capped at 99.9%, or that accuracy plus
`--gain` points (the two are exclusive). Each round trains the demo's recipe (clients/demo.py,
RECIPE) for `--steps` steps (default 60: `rlvr demo`'s count, the one that measured +44.6 points on
rlvr-tiny-headroom in one run) on top of the best round so far. Prints the per-round table (each
score with its standard error), the best round against the base question by question (the gain,
its standard error and McNemar's exact test, from rlvr/clients/compare.py), the time split
(training / benchmarking / overhead between them) and how the loop ended; writes JSON (`--out`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr.clients.demo import BENCHMARK, DEMO_STEPS, LOSSES, RECIPE, recipe_spec  # noqa: E402
from rlvr.scores import standard_error  # noqa: E402
from rlvr.v1 import scheduler_pb2  # noqa: E402

TARGET_CAP = 99.9


def target_of(args: argparse.Namespace, base: float) -> float:
    """The loop's target in percent: base + --gain points, or --times x base, capped below 100%.

    >>> target_of(argparse.Namespace(gain=None, times=2.0), 43.8)
    87.6
    >>> target_of(argparse.Namespace(gain=None, times=2.0), 60.0)
    99.9
    >>> target_of(argparse.Namespace(gain=8.0, times=2.0), 43.8)
    51.8
    """
    target = base + args.gain if args.gain is not None else base * args.times
    return round(min(target, TARGET_CAP), 1)


def se_points(score: float, n: int) -> float:
    """Standard error in points of an accuracy of `score` percent on n questions (rlvr/scores.py)."""
    return 100.0 * standard_error(score / 100.0, n)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-headroom")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--times", type=float, default=2.0,
                        help="target = this multiple of the base model's score, capped at 99.9%% (default 2.0)")
    target.add_argument("--gain", type=float, default=None, help="target = the base model's score + this many points")
    p.add_argument("--rounds", type=int, default=8, help="max rounds (each a full training run; default 8)")
    p.add_argument("--give-up-after", type=int, default=2, help="stop after this many rounds without a real gain")
    p.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"GRPO steps per round (default {DEMO_STEPS}, the demo's)")
    p.add_argument("--eval-n", type=int, default=500, help="benchmark questions per evaluation (0 = all)")
    p.add_argument("--backend", choices=("vllm", "transformers"), default="transformers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--home", type=Path, default=None, help="state folder (default: a fresh one under $RLVR_HOME/bench)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "loop.json")
    return p.parse_args(argv)


def base_score(client, eval_n: int) -> float:  # noqa: ANN001 (the SDK facade)
    """The base model's score in percent on the loop's own benchmark and question count, measured
    through the benchmark service before the loop starts (the loop measures it again as its
    baseline: the same greedy evaluation, so the same number)."""
    from rlvr.v1 import benchmark_pb2

    evaluation = client.benchmark.run_evaluation(benchmark_pb2.RunEvaluationRequest(
        benchmark=BENCHMARK, limit=eval_n, label="bench/loop.py base"))
    for _ in client.benchmark.watch_evaluation(benchmark_pb2.WatchEvaluationRequest(id=evaluation.id)):
        pass
    evaluation = client.benchmark.get_evaluation(benchmark_pb2.GetEvaluationRequest(id=evaluation.id))
    return 100.0 * evaluation.scores.accuracy


def loop_spec(args: argparse.Namespace, target: float) -> scheduler_pb2.LoopSpec:
    r = RECIPE
    job = recipe_spec(model=args.model, steps=args.steps, group_size=r["group_size"], batch_size=r["batch_size"],
                      max_tokens=r["max_tokens"], rank=r["rank"], alpha=r["alpha"], lr=r["lr"],
                      loss_type=LOSSES[str(r["loss_type"])], temperature=r["temperature"], prompts=r["prompts"],
                      backend=args.backend, seed=args.seed, dynamic_sampling=bool(r["dynamic_sampling"]),
                      lora_init=str(r["lora_init"]), name="")
    return scheduler_pb2.LoopSpec(name=f"tiny to {target:.1f}%", job=job, benchmark=BENCHMARK, score_column="accuracy",
                                  target=target, max_rounds=args.rounds, give_up_after=args.give_up_after,
                                  benchmark_limit=args.eval_n)


def rows_of(loop: scheduler_pb2.Loop) -> list[dict[str, object]]:
    return [{"round": r.index, "job_id": r.job_id, "on_top_of": f"R{r.base_round}" if r.base_round else "base",
             "status": scheduler_pb2.RoundStatus.Name(r.status).removeprefix("ROUND_STATUS_"),
             "score": r.score if r.HasField("score") else None, "delta": r.delta if r.HasField("delta") else None,
             "real_gain": r.real_gain, "threshold": r.gain_threshold, "best": r.best,
             "training_s": round(r.training_seconds, 1), "benchmarking_s": round(r.benchmarking_seconds, 1),
             "duration_s": round(r.duration_seconds, 1), "adapter": f"{r.adapter.name} v{r.adapter.version}"}
            for r in loop.rounds]


def print_table(loop: scheduler_pb2.Loop, n: int) -> None:
    """The rounds, each score with its standard error on the n questions every evaluation asks."""
    print(f"\n{'round':<6}{'on top of':<10}{'score (SE)':>14}{'delta':>8}  {'real gain (threshold)':<23}{'train s':>9}"
          f"{'bench s':>9}{'round s':>9}  job")
    base = f"{loop.baseline_score:.1f}% ({se_points(loop.baseline_score, n):.1f})"
    print(f"{'base':<6}{'-':<10}{base:>14}{'':>8}  {'':<23}{'':>9}{'':>9}{'':>9}")
    for row in rows_of(loop):
        score = (f"{row['score']:.1f}% ({se_points(float(row['score']), n):.1f})"  # type: ignore[arg-type]
                 if row["score"] is not None else row["status"].lower())
        delta = f"{row['delta']:+.1f}" if row["delta"] is not None else ""
        gain = f"{'yes' if row['real_gain'] else 'no'} (> {row['threshold']:.2f})"
        print(f"R{row['round']:<5}{row['on_top_of']:<10}{score:>14}{delta:>8}  {gain:<23}{row['training_s']:>9.0f}"
              f"{row['benchmarking_s']:>9.0f}{row['duration_s']:>9.0f}  {row['job_id']}{'  BEST' if row['best'] else ''}")


def best_against_base(client, loop: scheduler_pb2.Loop) -> tuple[int, list[str]]:  # noqa: ANN001 (the SDK facade)
    """The question count of the loop's evaluations and the best round's paired comparison with the
    base evaluation (rlvr/clients/compare.py: gain, SE, McNemar), [] when there is no best round."""
    from rlvr.clients.compare import NotComparable, compare_evaluations, summary_lines
    from rlvr.v1 import benchmark_pb2

    base_id = loop.baseline_evaluation_id
    n = client.benchmark.get_evaluation(benchmark_pb2.GetEvaluationRequest(id=base_id)).questions_total if base_id else 0
    best = [r for r in loop.rounds if r.best and r.evaluation_id]
    if not base_id or not best:
        return n, []
    try:
        before, after, comparison = compare_evaluations(client.benchmark, base_id, best[0].evaluation_id)
    except NotComparable as e:
        return n, [f"not comparable: {e}"]
    return n, summary_lines(before, after, comparison)


def main(argv: list[str] | None = None) -> int:
    from rlvr.clients.stack import local_stack
    from rlvr.common.settings import rlvr_home

    args = parse_args(argv)
    home = (args.home or rlvr_home() / "bench" / f"loop-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    started = time.monotonic()
    with local_stack(home, args.model) as (_, client):
        base = base_score(client, args.eval_n)
        target = target_of(args, base)
        created = client.scheduler.create_loop(scheduler_pb2.CreateLoopRequest(spec=loop_spec(args, target)))
        loop = created.loop
        print(f"loop {loop.id}: {loop.spec.name}, base {base:.1f}%, up to {args.rounds} rounds of "
              f"{args.steps} steps; warnings: {list(created.warnings) or 'none'}", flush=True)
        last = ""
        for loop in client.scheduler.watch_loop_updates(created.loop.id):  # noqa: B020 (the last one is kept)
            running = loop.rounds[-1] if loop.rounds else None
            line = f"{scheduler_pb2.LoopStatus.Name(loop.status)[12:]:<15} {loop.message}"
            if running is not None and running.total_steps and running.status == scheduler_pb2.ROUND_STATUS_TRAINING:
                line += f" [step {running.current_step}/{running.total_steps}]"
            if line != last and (running is None or running.current_step % 10 == 0 or "step" not in line):
                print(f"{time.monotonic() - started:7.0f}s  {line}", flush=True)
                last = line
        n, paired = best_against_base(client, loop)
    print_table(loop, n)
    if paired:
        print("\nbest round against the base, question by question:")
        print("\n".join(f"  {line}" for line in paired))
    overhead = loop.elapsed_seconds - loop.training_seconds - loop.benchmarking_seconds
    print(f"\n{scheduler_pb2.LoopStatus.Name(loop.status)[12:]}: {loop.message}{(' ' + loop.error) if loop.error else ''}")
    best = loop.best_score if loop.HasField("best_score") else loop.baseline_score
    print(f"target {loop.spec.target:.1f}%  best {best:.1f}% ({best - loop.baseline_score:+.1f} points over the base "
          f"model; {best - loop.spec.target:+.1f} against the target)")
    print(f"elapsed {loop.elapsed_seconds / 60:.1f} min: training {loop.training_seconds / 60:.1f} min, "
          f"benchmarking {loop.benchmarking_seconds / 60:.1f} min, overhead between them {overhead / 60:.1f} min")
    result = {"loop_id": loop.id, "status": scheduler_pb2.LoopStatus.Name(loop.status), "message": loop.message,
              "error": loop.error, "base": loop.baseline_score, "target": loop.spec.target, "best": best,
              "rounds": rows_of(loop), "elapsed_s": loop.elapsed_seconds, "training_s": loop.training_seconds,
              "benchmarking_s": loop.benchmarking_seconds, "overhead_s": overhead, "questions": n,
              "best_against_base": paired,
              "settings": vars(args) | {"home": str(home), "out": str(args.out)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}; state in {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
