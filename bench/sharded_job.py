"""One job of several processes, DDP or FSDP (advanced.sharding), and what it trained: the GPU check's
job-fsdp part (bench/gpu_check.py) runs it twice and compares the two; it runs on a CPU as well.

    python bench/sharded_job.py --model PATH --sharding fsdp --processes 2 --gpus 0,1 --out run.json
    python bench/sharded_job.py --model rlvr-tiny-small --sharding ddp,fsdp --gpus cpu --out runs.json

It launches itself under torchrun (`torch.distributed.run --standalone`, as the worker launches a job
of advanced.num_processes processes: services/trainer/job/distributed.py); each rank runs the job
(runner.run_job with its rank's Group, the transformers backend, so no rollout server is needed), and
rank 0 writes its run's file: the steps' losses, rewards and seconds, the adapter's folder, and each
rank's share of the policy's parameters (`engine.shard_sizes`). `compare` reads two such files.

Each sharding given (`--sharding ddp,fsdp` runs both) runs `--repeats` times (at least 3), the
shardings taking turns (ddp, fsdp, ddp, ...), each run a fresh job in its own artifact root, its file
beside `--out` (`<its stem>-<sharding>-<k>.json`). Prints, per sharding, the median [lowest-highest] over
the runs of each run's median step, generate, train and sync seconds (steps after the first), and with
both shardings the comparison of each round's pair (`compare`); `--out` gets the runs and the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats, spreads, tally  # noqa: E402  (bench/repeats.py)

SHARDINGS = ("ddp", "fsdp")
PARTS = ("step", "generate", "train", "sync")  # the run's <part>_seconds per step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder, a hub id or rlvr-tiny[-<size>]")
    p.add_argument("--sharding", required=True,
                   help=f"{' or '.join(SHARDINGS)}, or a comma list of both (compared round by round)")
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs per sharding (>= 3), interleaved")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--gpus", default="cpu", help='advanced.gpu_selection: "cpu" or one device per process, "0,1"')
    p.add_argument("--precision", default="fp32")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--lora-rank", type=int, default=4)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--root", type=Path, default=None, help="the job's artifact root (default: beside --out)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # set for the ranks torchrun starts
    args = p.parse_args(argv)
    shardings = [s.strip() for s in args.sharding.split(",") if s.strip()]
    if not shardings or any(s not in SHARDINGS for s in shardings) or len(set(shardings)) < len(shardings):
        p.error(f"--sharding: {args.sharding!r}; choose {', '.join(SHARDINGS)} or both, each once")
    if args.rank and len(shardings) > 1:
        p.error("--sharding: one per launched job")
    args.shardings = shardings
    return args


def launch(args: argparse.Namespace, timeout: float | None = None) -> dict[str, Any]:
    """The job under torchrun; rank 0's `--out`, read back."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
           str(args.processes), "--max-restarts", "0", str(Path(__file__).resolve()), *_argv(args), "--rank"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0 or not args.out.is_file():
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"the {args.sharding} job exited {done.returncode}: {tail}")
    return json.loads(args.out.read_text())


def _argv(args: argparse.Namespace) -> list[str]:
    out = []
    for key in ("model", "sharding", "processes", "gpus", "precision", "steps", "batch_size", "group_size",
                "max_tokens", "lora_rank", "seed", "out"):
        out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.root is not None:
        out += ["--root", str(args.root)]
    return out


def run_rank(args: argparse.Namespace) -> int:
    from rlvr.services.trainer.job.config import job_config_from_request
    from rlvr.services.trainer.job.distributed import Group
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import trainer_pb2 as T


    if args.gpus == "cpu":
        import torch

        torch.set_num_threads(1)  # the processes share the host's cores
    spec = C.JobSpec(base_model=args.model)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = (args.group_size, args.batch_size,
                                                                         args.max_tokens, args.steps)
    g.lora_rank, g.lora_alpha, g.learning_rate = args.lora_rank, 64, 1e-5
    a = spec.advanced
    a.generation_backend, a.loss_type = C.GENERATION_BACKEND_TRANSFORMERS, C.LOSS_TYPE_DAPO
    a.seed, a.temperature, a.num_processes, a.gpu_selection = args.seed, 1.0, args.processes, args.gpus
    a.sharding, a.precision = args.sharding, args.precision
    root = args.root or args.out.with_suffix(".artifacts")
    job = job_config_from_request(T.StartJobRequest(job_id=f"sharded-{args.sharding}", spec=spec,
                                                    total_steps=args.steps), root)
    group = Group.from_env()
    events: list[Any] = []
    shares = _ShareLog()  # the engine logs the rank's share once, at train begin (fsdp only)
    logging.getLogger("rlvr.trainer.engine").addHandler(shares)
    logging.getLogger("rlvr.trainer.engine").setLevel(logging.INFO)
    scorer = LocalScorer(ScoreSettings(job.reward_function, job.format_bonus, job.format_bonus_weight))
    result = run_job(job, JobDeps(scorer=scorer, publish=events.append, group=group))
    held = group.gather(shares.held)
    if group.is_main:
        args.out.write_text(json.dumps({
            "sharding": args.sharding, "status": result.status, "error": result.error,
            "adapter": result.adapter_path, "loss": [e.loss for e in events],
            "reward": [e.reward_mean for e in events], "step_seconds": [e.step_seconds for e in events],
            **{f"{part}_seconds": [getattr(e, f"{part}_seconds") for e in events] for part in ("generate", "train", "sync")},
            "held": held}, indent=2) + "\n")
    return 0 if result.status == "completed" else 1


class _ShareLog(logging.Handler):
    """The engine's "this one holds X of its Y parameters" line, as (X, Y)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: tuple[int, int] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"holds (\d+) of its (\d+) parameters", record.getMessage())
        if found:
            self.held = (int(found.group(1)), int(found.group(2)))


def compare(ddp: dict[str, Any], fsdp: dict[str, Any]) -> dict[str, Any]:
    """How far the FSDP run's adapter and losses are from the DDP run's, and whether its adapter is
    whole (the same LoRA tensors, at the same shapes)."""
    from safetensors.torch import load_file

    a = load_file(str(Path(ddp["adapter"]) / "adapter_model.safetensors"))
    b = load_file(str(Path(fsdp["adapter"]) / "adapter_model.safetensors"))
    whole = a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    moved = max(float(t.abs().max()) for k, t in a.items() if "lora_B" in k)
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a) if whole else float("inf")
    loss = max((abs(x - y) / max(abs(x), 1e-6) for x, y in zip(ddp["loss"], fsdp["loss"], strict=True)), default=0.0)
    return {"whole": whole, "tensors": len(b), "moved": moved, "adapter_diff": worst,
            "adapter_rel": worst / moved if moved else float("inf"), "loss_rel": loss}


def run_summary(run: dict[str, Any]) -> dict[str, float | None]:
    """One run's median seconds per part over its steps after the first (all of them for one step)."""
    return {part: Spread.of(run[f"{part}_seconds"][1:] or run[f"{part}_seconds"]).median for part in PARTS}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank:
        return run_rank(args)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    rows: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeats + 1):
        done: dict[str, dict[str, Any]] = {}
        for sharding in args.shardings:  # interleaved: a slow spell of the host touches both alike
            name = f"{args.out.stem}-{sharding}-{repeat}"
            one = argparse.Namespace(**{**vars(args), "sharding": sharding, "out": args.out.with_name(f"{name}.json"),
                                        "root": args.root / name if args.root is not None else None})
            row: dict[str, Any] = {"sharding": sharding, "repeat": repeat, "file": str(one.out)}
            try:
                done[sharding] = launch(one)
                row.update(ok=done[sharding]["status"] == "completed", held=done[sharding]["held"],
                           **run_summary(done[sharding]))
            except RuntimeError as e:
                row.update(ok=False, error=str(e)[-500:])
            print(json.dumps(row), flush=True)
            rows.append(row)
        if len(done) == len(SHARDINGS):
            pairs.append({"repeat": repeat, **compare(done["ddp"], done["fsdp"])})
    print(f"\n{args.model}, {args.processes} processes on {args.gpus}, {args.precision}, {args.steps} steps of "
          f"{args.batch_size} completions ({args.batch_size // args.group_size} prompts x {args.group_size}), "
          f"{args.max_tokens} tokens; median [lowest-highest] of {args.repeats} runs of each run's median over "
          "steps 2 on")
    table = {part: spreads(rows, part, by="sharding") for part in PARTS}
    print(f"{'sharding':<9}{'runs':>8}" + "".join(f"{part + ' s':>24}" for part in PARTS) + "  parameters held")
    summary: dict[str, Any] = {}
    for sharding in args.shardings:
        mine = [r for r in rows if r["sharding"] == sharding]
        held = next((r["held"] for r in reversed(mine) if r.get("held")), None)
        print(f"{sharding:<9}{tally(r['ok'] for r in mine):>8}"
              + "".join(f"{table[part][sharding].cell(3, of=len(mine)):>24}" for part in PARTS) + f"  {held}")
        summary[sharding] = {part: table[part][sharding].to_json() for part in PARTS}
    if pairs:
        diff = {key: Spread.of([p[key] for p in pairs]) for key in ("adapter_rel", "loss_rel")}
        whole = tally((p["whole"] for p in pairs), "whole")
        print(f"fsdp against ddp, {len(pairs)} rounds: adapter diff {diff['adapter_rel'].cell(fmt='.2g')} of B's "
              f"largest value, loss rel diff {diff['loss_rel'].cell(fmt='.2g')}, adapters {whole}")
        summary["compare"] = {key: spread.to_json() for key, spread in diff.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "summary": summary, "runs": rows, "pairs": pairs},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
