"""Learning curves of GRPO settings on a tiny model, in-process: where does held-out accuracy go?

    python bench/learning_sweep.py                                  # one run, docs/measurements/learning.md's settings
    python bench/learning_sweep.py --warmup-steps 300 --temperature 0.6 --dynamic-sampling
    python bench/learning_sweep.py --model /path/to/model --lr 1e-5 --steps 300 --eval-every 50

Runs `rlvr.services.trainer.job.runner.run_job` (what a job process runs: TRL's GRPOTrainer with our rollout
function and scorer) on the transformers backend, without the services, and measures greedy
held-out Math Pairs accuracy of the adapter every `--eval-every` steps, plus greedy accuracy on
problems from the run's prompt list and on problems of the training distribution outside it at the
end (the split that tells learning arithmetic from remembering answers). The base model is the bundled tiny
model, or a tiny model with a shorter supervised warm-up (`--warmup-steps`, built once under
$RLVR_HOME/models). bench/learning.py measures the same through the whole stack.

Prints the curve and a table; writes JSON (`--out`). It never fails on accuracy: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="rlvr-tiny or a model folder (ignored with --warmup-steps)")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="build a tiny model with this many warm-up steps instead (the bundled one: 450)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--loss-type", default="dapo", choices=["grpo", "dapo", "dr_grpo"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--dynamic-sampling", action="store_true")
    p.add_argument("--lora-init", default="default", choices=["default", "gaussian"])
    p.add_argument("--prompts", type=int, default=4096, help="synthetic training prompts")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-n", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for this size here)")
    p.add_argument("--out", type=Path, default=None, help="default bench/results/learning_sweep-<time>.json")
    return p.parse_args(argv)


def base_model(args: argparse.Namespace) -> Path:
    from rlvr.models import resolve_model
    from rlvr.tiny import build

    if not args.warmup_steps:
        return Path(resolve_model(args.model))
    default = build.RECIPES["default"]
    recipe = build.WarmupRecipe(steps=args.warmup_steps, batch_size=default.batch_size,
                                learning_rate=default.learning_rate, warmup_steps=default.warmup_steps)
    out = build.default_model_dir(f"rlvr-tiny-warm{args.warmup_steps}")
    build.RECIPES["default"] = recipe  # build_tiny_model builds sizes by name; same shapes as "default"
    try:
        return Path(build.build_tiny_model(out, size="default", seed=args.seed, progress=print).path)
    finally:
        build.RECIPES["default"] = default


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.rewards.scoring import score
    from rlvr.services.trainer.job import artifacts
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
    from rlvr.tasks import math_pairs as mp
    from rlvr.tasks import render_prompt
    from rlvr.tiny.build import generate_greedy, heldout_accuracy

    model_dir = base_model(args)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    root = ROOT / ".rlvr" / "bench" / f"sweep-{os.getpid()}"
    job = job_config(
        job_id=f"sweep{os.getpid()}", base_model=str(model_dir), artifact_root=root, group_size=args.group_size,
        batch_size=args.batch_size, max_completion_tokens=args.max_tokens, lora_rank=args.rank,
        lora_alpha=args.alpha, learning_rate=args.lr, max_steps=args.steps, loss_type=args.loss_type,
        generation_backend="transformers", temperature=args.temperature, synthetic_prompts=args.prompts,
        seed=args.seed, dynamic_sampling=args.dynamic_sampling, lora_init=args.lora_init,
    )

    def load(adapter: bool):  # noqa: ANN202
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        if adapter:
            model = PeftModel.from_pretrained(model, str(artifacts.adapter_dir(root, job.job_id)))
        return model.eval()

    def greedy_accuracy(model, problems) -> float:  # noqa: ANN001
        outs = generate_greedy(model, tokenizer, [render_prompt(tokenizer, p) for p in problems], 48, 128)
        return sum(score("math_pairs", o, p.ground_truth).accuracy for o, p in zip(outs, problems, strict=True)) / len(problems)

    base = load(adapter=False)
    curve = [(0, heldout_accuracy(base, tokenizer, args.eval_n, args.seed)[0])]
    print(f"step    0  held-out {curve[0][1]:.3f}", flush=True)
    sampled: list[float] = []
    started = time.perf_counter()

    def on_event(event) -> None:  # noqa: ANN001 (a MetricEvent, published after the step's adapter is saved)
        sampled.append(event.accuracy)
        if event.step % args.eval_every == 0 or event.step == event.total_steps:
            accuracy = heldout_accuracy(load(adapter=True), tokenizer, args.eval_n, args.seed)[0]
            curve.append((event.step, accuracy))
            recent = sampled[-args.eval_every:]
            print(f"step {event.step:4d}  held-out {accuracy:.3f}  training reward accuracy (sampled, last "
                  f"{len(recent)} steps) {sum(recent) / max(1, len(recent)):.3f}  {time.perf_counter() - started:.0f} s",
                  flush=True)

    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=on_event))
    if result.status != "completed":
        print(f"the run {result.status}: {result.error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    listed = mp.training_problems(args.prompts, args.seed)
    seen = listed[: args.eval_n]  # from the run's prompt list
    keys = {mp.canonical_key(mp.parse_numbers(p.question)) for p in listed}
    unseen = [p for p in mp.training_problems(20 * args.eval_n, args.seed + 10_007)
              if mp.canonical_key(mp.parse_numbers(p.question)) not in keys][: args.eval_n]
    trained = load(adapter=True)
    probs_of = {"in the run's prompt list": seen, "training distribution, no key in that list": unseen}
    split = {name: (greedy_accuracy(base, probs), greedy_accuracy(trained, probs))
             for name, probs in probs_of.items() if probs}
    split["held-out"] = (curve[0][1], curve[-1][1])
    probs_of["held-out"] = [None] * args.eval_n
    print(f"\n{job.lora_rank=} {job.lora_alpha=} {job.learning_rate=} {job.temperature=} {job.dynamic_sampling=} "
          f"{job.lora_init=} group {job.group_size} batch {job.batch_size} {args.steps} steps in {seconds:.0f} s\n")
    print("| greedy accuracy on | base | trained | change (points) |\n|---|---|---|---|")
    for name, (before, after) in split.items():
        print(f"| {name} ({len(probs_of[name])}) | {before:.1%} | {after:.1%} | {100 * (after - before):+.1f} |")
    out = args.out or ROOT / "bench" / "results" / f"learning_sweep-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                               "model": str(model_dir), "curve": curve, "split": split, "seconds": round(seconds)},
                              indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
