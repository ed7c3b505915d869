"""SFT then RLVR on the bundled data, through the whole stack: held-out Math Pairs accuracy of the
base model, of a Supervised (SFT) adapter trained on examples/sft/math-pairs' worked chats, and of an
RLVR job stacked on that adapter (JobSpec.init_adapter) with the demo's measured recipe; with
`--compare`, also the same RLVR job from the base model alone.

    python bench/sft_then_rlvr.py                    # the measured configuration (docs/measurements/sft.md)
    python bench/sft_then_rlvr.py --sft-epochs 1 --rlvr-steps 30 --compare --seed 1

The evaluations are the benchmark service's (greedy, `--eval-n` held-out problems never seen in
training, `rlvr demo`'s); the gains are paired question by question (rlvr/paired.py). Prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr.clients.demo import DEFAULT_MODEL, LOSSES, RECIPE, evaluate, recipe_spec  # noqa: E402
from rlvr.v1 import common_pb2, scheduler_pb2  # noqa: E402

DATA = "examples/sft/math-pairs"  # under the stack's data roots: its services run in the repository


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--sft-batch-size", type=int, default=8)
    p.add_argument("--rlvr-steps", type=int, default=60)
    p.add_argument("--eval-n", type=int, default=500)
    p.add_argument("--seed", type=int, default=0, help="advanced.seed of every job (SFT's data order and LoRA init, RLVR's sampling)")
    p.add_argument("--compare", action="store_true", help="also RLVR from the base model alone")
    p.add_argument("--home", type=Path, default=None)
    return p.parse_args(argv)


def _train(rlvr, spec: common_pb2.JobSpec) -> tuple[common_pb2.Job, float]:  # noqa: ANN001 (the SDK facade)
    from rlvr.clients.commands.train import watch_job

    created = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=spec))
    started = time.monotonic()
    status = watch_job(rlvr.scheduler, created.job.id)
    job = rlvr.scheduler.get_job(scheduler_pb2.GetJobRequest(id=created.job.id))
    if status != common_pb2.JOB_STATUS_COMPLETED:
        raise SystemExit(f"job {job.id} ({spec.name}) did not complete: {job.error}")
    return job, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    from rlvr.clients.compare import compare_evaluations
    from rlvr.clients.stack import local_stack
    from rlvr.common.settings import rlvr_home

    args = parse_args(argv)
    os.chdir(ROOT)  # the stack's data roots are its working folder: the bundled chats must be under it
    home = args.home or rlvr_home() / "bench" / f"sft-then-rlvr-{time.strftime('%Y%m%d-%H%M%S')}"
    r = RECIPE
    rl = recipe_spec(model=args.model, steps=args.rlvr_steps, group_size=r["group_size"], batch_size=r["batch_size"],
                     max_tokens=r["max_tokens"], rank=r["rank"], alpha=r["alpha"], lr=r["lr"],
                     loss_type=LOSSES[str(r["loss_type"])], temperature=r["temperature"], prompts=r["prompts"],
                     backend="vllm", dynamic_sampling=bool(r["dynamic_sampling"]), lora_init=str(r["lora_init"]),
                     name="bench-rlvr-after-sft", seed=args.seed)  # type: ignore[arg-type]
    sft = common_pb2.JobSpec(name="bench-sft", base_model=args.model, method=common_pb2.TRAINING_METHOD_SFT,
                             sft=common_pb2.SftConfig(dataset=DATA, epochs=args.sft_epochs, learning_rate=args.sft_lr,
                                                      batch_size=args.sft_batch_size, max_seq_length=256))
    sft.advanced.eval_every = 32
    sft.advanced.seed = args.seed
    rows: list[tuple[str, str]] = []
    with local_stack(home, args.model) as (_, rlvr):
        base = evaluate(rlvr.benchmark, args.eval_n, "base")
        sft_job, sft_seconds = _train(rlvr, sft)
        after_sft = evaluate(rlvr.benchmark, args.eval_n, "sft", adapter=sft_job.adapter, upload=True)
        rl.init_adapter.name = f"job-{sft_job.id}"
        rl_job, rl_seconds = _train(rlvr, rl)
        after_both = evaluate(rlvr.benchmark, args.eval_n, "sft+rlvr", adapter=rl_job.adapter)
        gain_sft = compare_evaluations(rlvr.benchmark, base.id, after_sft.id)[2]
        gain_rl = compare_evaluations(rlvr.benchmark, after_sft.id, after_both.id)[2]
        gain_all = compare_evaluations(rlvr.benchmark, base.id, after_both.id)[2]
        rows += [("held-out accuracy: base", f"{base.scores.accuracy:.1%}"),
                 ("after SFT", f"{after_sft.scores.accuracy:.1%} ({gain_sft.verdict()})"),
                 ("after SFT then RLVR", f"{after_both.scores.accuracy:.1%} ({gain_rl.verdict()} over SFT; "
                                         f"{gain_all.verdict()} over base)"),
                 ("SFT", f"{sft_job.current_step} steps ({args.sft_epochs} epochs of 512 chats, batch "
                         f"{args.sft_batch_size}, lr {args.sft_lr:g}) in {sft_seconds:.0f} s"),
                 ("RLVR", f"{rl_job.current_step} steps of the demo's recipe in {rl_seconds:.0f} s")]
        if args.compare:
            alone_spec = common_pb2.JobSpec()
            alone_spec.CopyFrom(rl)
            alone_spec.ClearField("init_adapter")
            alone_spec.name = "bench-rlvr-alone"
            alone, _ = _train(rlvr, alone_spec)
            after_alone = evaluate(rlvr.benchmark, args.eval_n, "rlvr", adapter=alone.adapter)
            vs = compare_evaluations(rlvr.benchmark, after_alone.id, after_both.id)[2]
            rows += [("RLVR alone (same recipe)", f"{after_alone.scores.accuracy:.1%}"),
                     ("SFT then RLVR vs RLVR alone", vs.verdict())]
    print(f"\n{args.model}, {args.eval_n} held-out questions (greedy), seed {args.seed}\n")
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for key, value in rows:
        print(f"| {key:<{width}} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
