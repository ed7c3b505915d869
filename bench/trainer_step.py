"""Time per GRPO step of the trainer worker, split by phase, next to TRL's GRPOTrainer run plainly.

    python bench/trainer_step.py                      # the default tiny model, transformers backend
    python bench/trainer_step.py --backend vllm --rollout-address 127.0.0.1:50054

One configuration, both runs in this process on the same model, prompts and settings:

- "rlvr": `services.trainer.runner.run_job` (what a job process runs): TRL's GRPOTrainer with our
  rollout_func, scorer and per-step callback (adapter saved every step, pushed to the rollout
  service with the vllm backend, one MetricEvent per step). Phases come from the MetricEvents.
- "trl": a plain `GRPOTrainer` (its own in-process generation, the same reward as a plain reward
  function, `peft_config` instead of our PeftModel), timed from step begin to step end.

The first `--skip` steps of each run are left out (lazy initialisation). Prints a table and writes
JSON next to it (`--out`). It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PHASES = ("generate", "score", "train", "sync", "rest", "step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="base model: rlvr-tiny[-size], hub id or path")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip", type=int, default=2, help="first steps left out of the means")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--lora-rank", type=int, default=4)
    p.add_argument("--lora-alpha", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--loss-type", default="dapo", choices=["grpo", "dapo", "dr_grpo"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores this process may use)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    p.add_argument("--rollout-address", default="127.0.0.1:50054", help="the rollout service, for --backend vllm")
    p.add_argument("--out", type=Path, default=Path(".rlvr/bench/trainer_step.json"))
    return p.parse_args(argv)


def run_rlvr(args: argparse.Namespace, base: str, root: Path) -> list[dict[str, float]]:
    from services.trainer.config import JobConfig
    from services.trainer.rollouts import ServiceGenerator
    from services.trainer.runner import JobDeps, run_job
    from services.trainer.scorers import LocalScorer, ScoreSettings

    job = JobConfig(
        job_id=f"bench-{os.getpid()}", base_model=base, artifact_root=root, group_size=args.group_size,
        batch_size=args.batch_size, max_completion_tokens=args.max_tokens, lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha, learning_rate=args.learning_rate, max_steps=args.steps,
        loss_type=args.loss_type, generation_backend=args.backend,
    )
    events: list[Any] = []
    generator = ServiceGenerator(args.rollout_address) if args.backend == "vllm" else None
    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append,
                                  generator=generator))
    if result.status != "completed":
        raise SystemExit(f"the rlvr run {result.status}: {result.error}")
    rows = []
    for e in events:
        known = e.generate_seconds + e.score_seconds + e.train_seconds + e.sync_seconds
        rows.append({"generate": e.generate_seconds, "score": e.score_seconds, "train": e.train_seconds,
                     "sync": e.sync_seconds, "rest": max(0.0, e.step_seconds - known), "step": e.step_seconds})
    return rows


def run_trl(args: argparse.Namespace, base: str, root: Path) -> list[dict[str, float]]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from services.reward.scoring import score
    from services.trainer.config import JobConfig
    from services.trainer.engine import grpo_args
    from services.trainer.runner import training_prompts

    job = JobConfig(job_id="trl", base_model=base, artifact_root=root, group_size=args.group_size,
                    batch_size=args.batch_size, max_completion_tokens=args.max_tokens, learning_rate=args.learning_rate,
                    loss_type=args.loss_type, max_steps=args.steps)
    tokenizer = AutoTokenizer.from_pretrained(base)
    prompts = training_prompts(job, tokenizer)
    dataset = Dataset.from_dict({"prompt": [p for p, _ in prompts], "ground_truth": [t for _, t in prompts]})
    times: list[dict[str, float]] = []

    def reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        return [score("math_pairs", c, t).reward for c, t in zip(completions, ground_truth, strict=True)]

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append({"step": time.perf_counter() - self.started})

    config = grpo_args(job, args.steps, root / "trl-plain", use_cpu=not torch.cuda.is_available())
    config.top_k = 0  # sample from the full distribution, as our in-process generator does
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), reward_funcs=reward, args=config,
        train_dataset=dataset, processing_class=tokenizer,
        peft_config=LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                               target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Timer())
    trainer.train()
    return times


def mean(rows: list[dict[str, float]], key: str, skip: int) -> float | None:
    values = [r[key] for r in rows[skip:] if key in r]
    return statistics.fmean(values) if values else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from services.trainer.runner import resolve_base_model

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(args.threads or cores)
    base = resolve_base_model(args.model)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-") as tmp:
        started = time.perf_counter()
        ours = run_rlvr(args, base, Path(tmp))
        ours_wall = time.perf_counter() - started
        started = time.perf_counter()
        trl = run_trl(args, base, Path(tmp))
        trl_wall = time.perf_counter() - started

    config = (f"model {args.model}, batch {args.batch_size} = {args.batch_size // args.group_size} prompts x "
              f"{args.group_size}, max {args.max_tokens} tokens, r={args.lora_rank} alpha={args.lora_alpha}, "
              f"{args.loss_type}, backend {args.backend}, {torch.get_num_threads()} threads, "
              f"means over steps {args.skip + 1}-{args.steps}")
    print(config)
    print(f"{'phase':<10}{'rlvr s/step':>14}{'trl s/step':>14}{'rlvr/trl':>10}")
    table: dict[str, dict[str, float | None]] = {}
    for phase in PHASES:
        a, b = mean(ours, phase, args.skip), mean(trl, phase, args.skip)
        ratio = a / b if a is not None and b else None
        table[phase] = {"rlvr": a, "trl": b, "ratio": ratio}

        def cell(x: float | None, width: int = 14) -> str:
            return f"{x:>{width}.3f}" if x is not None else f"{'-':>{width}}"

        print(f"{phase:<10}{cell(a)}{cell(b)}{cell(ratio, 10)}")
    print(f"wall time incl. model load and TRL set-up: rlvr {ours_wall:.1f} s, trl {trl_wall:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "args": {k: str(v) for k, v in vars(args).items()},
                                    "per_step": table, "rlvr_steps": ours, "trl_steps": trl}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
