"""Learning gain: held-out Math Pairs accuracy of the tiny model before and after one RLVR run
through the whole stack (embedded NATS, SQLite, the five services, the rollout server on vLLM).

    python bench/learning.py                        # the measured configuration (docs/measurements/learning.md)
    python bench/learning.py --steps 100 --backend transformers
    python bench/learning.py --require-gain 8       # exit 1 below +8 points (tests/test_e2e_training.py)
    python bench/learning.py --steps 100 --max-async-steps 1   # generation one step ahead of training
    python bench/learning.py --model rlvr-tiny-headroom --steps 60 --backend transformers --seeds 0 1
                                                    # the two-seed table: one run per seed, then a row each

Every setting is inside the spec's ranges (group size 2-32, rank 4-64, alpha 4-128, learning rate
5e-7 to 1e-5, batch size 1-32, at most 300 steps here). The evaluations are the benchmark
service's: greedy, `--eval-n` distinct held-out problems, never seen in training. Prints a table
and writes JSON (`--out`; with `--seeds`, one file per seed, `learning-seedN.json`); with `--seeds`,
also the seeds' table (before, after, gain with its SE, the paired test's p: McNemar's on right/wrong
scores, a paired z-test on scores with partial credit; wrong -> right and right -> wrong, from the
run's paired comparison, rlvr/paired.py).

    python bench/learning.py --model smollm2-135m --reward reasoning_gym \
        --dataset "chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1" --steps 60 --group-size 8 \
        --batch-size 16 --max-tokens 64 --rank 8 --alpha 128 --lr 1e-5 --loss-type dapo --temperature 0.7 \
        --prompts 256 --no-dynamic-sampling --lora-init default --eval-n 121 --seeds 0 1
                                                    # SmolLM2's measured recipe (rlvr models import smollm2-135m)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr.clients.demo import LOSSES, RECIPE  # noqa: E402
from rlvr.v1 import common_pb2  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny")
    p.add_argument("--reward", default="math_pairs",
                   help="the reward key (the benchmark the benchmark service makes of it is the evaluation)")
    p.add_argument("--dataset", default="", help="reward.dataset: e.g. a reasoning_gym task with its options")
    p.add_argument("--steps", type=int, default=RECIPE["steps"], help="GRPO steps (the issue's budget: at most 300)")
    p.add_argument("--group-size", type=int, default=RECIPE["group_size"])
    p.add_argument("--batch-size", type=int, default=RECIPE["batch_size"])
    p.add_argument("--max-tokens", type=int, default=RECIPE["max_tokens"])
    p.add_argument("--rank", type=int, default=RECIPE["rank"])
    p.add_argument("--alpha", type=int, default=RECIPE["alpha"])
    p.add_argument("--lr", type=float, default=RECIPE["lr"])
    p.add_argument("--loss-type", choices=sorted(LOSSES), default=RECIPE["loss_type"])
    p.add_argument("--temperature", type=float, default=RECIPE["temperature"])
    p.add_argument("--prompts", type=int, default=RECIPE["prompts"], help="synthetic training prompts")
    p.add_argument("--dynamic-sampling", action=argparse.BooleanOptionalAction, default=RECIPE["dynamic_sampling"])
    p.add_argument("--lora-init", choices=("default", "gaussian"), default=RECIPE["lora_init"])
    p.add_argument("--backend", choices=("vllm", "transformers"), default="vllm")
    p.add_argument("--environment", default="", help="an agent job: episodes with this environment (e.g. calculator)")
    p.add_argument("--max-turns", type=int, default=0, help="assistant turns per episode (0: the environment's)")
    p.add_argument("--max-async-steps", type=int, default=0,
                   help="advanced.max_async_steps: steps generated ahead of training (vllm backend; 0 = synchronous)")
    p.add_argument("--eval-n", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run once per seed (each in its own state folder) and print the seeds' table; overrides --seed")
    p.add_argument("--home", type=Path, default=None, help="state folder (default: a fresh one under $RLVR_HOME/bench)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "learning.json")
    p.add_argument("--require-gain", type=float, default=None, help="exit 1 when the gain is below this many points")
    return p.parse_args(argv)


def spec_from(args: argparse.Namespace) -> common_pb2.JobSpec:
    from rlvr.clients.demo import recipe_spec

    return recipe_spec(
        model=args.model, steps=args.steps, group_size=args.group_size, batch_size=args.batch_size,
        max_tokens=args.max_tokens, rank=args.rank, alpha=args.alpha, lr=args.lr,
        loss_type=LOSSES[args.loss_type], temperature=args.temperature, prompts=args.prompts,
        backend=args.backend, seed=args.seed, dynamic_sampling=args.dynamic_sampling, lora_init=args.lora_init,
        max_async_steps=args.max_async_steps, name="bench-learning", environment=args.environment,
        max_turns=args.max_turns, reward=args.reward, dataset=args.dataset)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.seeds:
        return run_one(args)[0]
    codes, table = [], []
    out = args.out
    for seed in args.seeds:
        one = argparse.Namespace(**(vars(args) | {"seed": seed, "out": out.with_name(f"{out.stem}-seed{seed}{out.suffix}"),
                                                  "home": args.home / f"seed{seed}" if args.home else None}))
        code, row = run_one(one)
        codes.append(code)
        table.append(row)
    print("\n| seed | before | after | gain (SE) | p (paired) | wrong -> right | right -> wrong |\n|---|---|---|---|---|---|---|")
    for row in table:
        print(row)
    return max(codes)


def run_one(args: argparse.Namespace) -> tuple[int, str]:
    """One training run and its table; the exit code and the seeds' table row."""
    from rlvr.clients.demo import measure_training
    from rlvr.common.settings import rlvr_home

    home = args.home or rlvr_home() / "bench" / f"learning-{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}"
    outcome = measure_training(spec_from(args), args.eval_n, home)
    if outcome.after is None:
        print(f"the job did not complete: {outcome.error}", file=sys.stderr)
        return 1, f"| {args.seed} | did not complete: {outcome.error} | | | | | |"
    before, after, job = outcome.before.scores, outcome.after.scores, outcome.job
    steps = job.current_step
    rows = [
        ("held-out accuracy before", f"{before.accuracy:.1%}"),
        ("held-out accuracy after", f"{after.accuracy:.1%}"),
        ("gain (points)", f"{outcome.gain_points:+.1f}"),
        ("accuracy_strict before -> after", f"{before.accuracy_strict:.1%} -> {after.accuracy_strict:.1%}"),
        ("held-out questions (greedy)", f"{args.eval_n}"),
        ("one standard error after (points)", f"{100 * (after.accuracy * (1 - after.accuracy) / args.eval_n) ** 0.5:.1f}"),
        *([("paired: gain, SE, test", outcome.comparison.verdict()),
           ("paired: wrong -> right, right -> wrong",
            f"{outcome.comparison.gained}, {outcome.comparison.lost}" if outcome.comparison.test.startswith("McNemar")
            else "- (scores with partial credit: the paired z-test above)")]
          if outcome.comparison is not None else []),
        ("GRPO steps", f"{steps}"),
        ("training wall time", f"{outcome.train_seconds:.0f} s ({outcome.train_seconds / max(1, steps):.2f} s/step)"),
        ("total wall time", f"{outcome.total_seconds:.0f} s"),
    ]
    settings = (f"{args.model}, {args.reward}" + (f" {args.dataset}" if args.dataset else "") + f", {args.backend}, group {args.group_size}, batch {args.batch_size}, rank {args.rank}, "
                f"alpha {args.alpha}, lr {args.lr:g}, {args.loss_type}, temperature {args.temperature:g}, "
                f"{args.prompts} prompts, max tokens {args.max_tokens}, "
                f"dynamic sampling {args.dynamic_sampling and not args.environment}, "
                f"LoRA init {args.lora_init}, seed {args.seed}, max async steps {args.max_async_steps}"
                + (f", environment {args.environment} (max turns {args.max_turns or 'its own'})" if args.environment else ""))
    print(f"\n{settings}\n")
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for key, value in rows:
        print(f"| {key:<{width}} | {value} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "accuracy_before": before.accuracy, "accuracy_after": after.accuracy, "gain_points": outcome.gain_points,
        "steps": steps, "eval_n": args.eval_n, "max_async_steps": args.max_async_steps,
        "train_seconds": outcome.train_seconds, "total_seconds": outcome.total_seconds,
        "adapter": job.adapter.path,
        **({"paired": {"se_points": outcome.comparison.se_points, "p_value": outcome.comparison.p_value,
                       "test": outcome.comparison.test, "gained": outcome.comparison.gained,
                       "lost": outcome.comparison.lost}} if outcome.comparison is not None else {}),
    }, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    c = outcome.comparison
    row = (f"| {args.seed} | {before.accuracy:.1%} | {after.accuracy:.1%} | "
           + (f"{c.gain_points:+.1f} ({c.se_points:.1f}) | {c.p_text()} | "
              + (f"{c.gained} | {c.lost} |" if c.test.startswith("McNemar") else "- | - |") if c is not None
              else f"{outcome.gain_points:+.1f} | - | - | - |"))
    if args.require_gain is not None and outcome.gain_points < args.require_gain:
        print(f"gain {outcome.gain_points:+.1f} points is below the required {args.require_gain:+.1f}", file=sys.stderr)
        return 1, row
    return 0, row


if __name__ == "__main__":
    sys.exit(main())
