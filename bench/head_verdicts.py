"""A Head on the bundled Math Pairs verdicts (examples/head/math-verdicts): how well a head on the
demo's model tells a right worked answer from a near miss, held out, for a few cards.

    python bench/head_verdicts.py                        # the measured configurations (docs/measurements/head.md)
    python bench/head_verdicts.py --model rlvr-tiny-headroom --epochs 3 --configs 0:1e-3 8:1e-4 8:1e-3

Each configuration (LoRA rank : learning rate; rank 0 = the base frozen, the head alone) is one Head
job run in-process (`run_job`, as a trainer worker runs it) on the 512 training rows, evaluated on the
128 held-out ones (problems from Math Pairs' held-out class, half of them wrong). Prints a table:
held-out accuracy with its standard error (binomial, n = 128; the majority class scores 50%), macro F1,
steps and seconds.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "examples" / "head" / "math-verdicts"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-headroom")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", nargs="+", default=["0:1e-3", "8:1e-4", "8:1e-3"], metavar="RANK:LR")
    return p.parse_args(argv)


def run(model: str, rank: int, lr: float, args: argparse.Namespace, root: Path) -> dict[str, float]:
    from rlvr.services.trainer.job.config import HeadSettings, job_config
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
    from rlvr.v1 import common_pb2

    events: list[common_pb2.MetricEvent] = []
    head = HeadSettings(dataset=str(DATA), dataset_split="train", text_column="text", label_column="label",
                        task="classification", learning_rate=lr, epochs=args.epochs, max_steps=-1,
                        batch_size=args.batch_size, max_seq_length=128, lora_rank=rank, lora_alpha=16,
                        lora_dropout=0.05, target_modules="all-linear", reward_label="")
    job = job_config(f"bench-head-r{rank}", model, root, gpu_selection="cpu", method="head", data_roots=(DATA,),
                     head=head, seed=args.seed)
    started = time.monotonic()
    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append))
    if result.status != "completed":
        raise SystemExit(f"rank {rank} lr {lr:g}: {result.status}: {result.error}")
    last = [e for e in events if e.HasField("heldout_accuracy")][-1]
    return {"accuracy": last.heldout_accuracy, "f1": last.heldout_f1, "steps": result.steps_done,
            "seconds": time.monotonic() - started, "loss": last.heldout_loss}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = sum(1 for _ in (DATA / "test.jsonl").open())
    print(f"Head on {args.model}, {DATA.relative_to(ROOT)}: {args.epochs} epochs, batch {args.batch_size}, "
          f"seed {args.seed}, {n} held-out rows")
    print(f"{'rank':>4} {'lr':>7} {'steps':>5} {'held-out acc':>13} {'SE':>5} {'macro F1':>8} {'loss':>6} {'seconds':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            rank, lr = int(config.split(":")[0]), float(config.split(":")[1])
            r = run(args.model, rank, lr, args, Path(tmp))
            se = math.sqrt(r["accuracy"] * (1 - r["accuracy"]) / n)
            print(f"{rank:>4} {lr:>7g} {r['steps']:>5.0f} {100 * r['accuracy']:>12.1f}% {100 * se:>5.1f} "
                  f"{r['f1']:>8.3f} {r['loss']:>6.3f} {r['seconds']:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
