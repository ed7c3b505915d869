"""Peak resident memory of the trainer's job process for one GRPO step, split by phase.

    python bench/trainer_memory.py --model /path/to/smollm2-135m                  # the issue-43 table
    python bench/trainer_memory.py --model rlvr-tiny --batch-sizes 16 --micro-batches 0,4

Every configuration (batch size x micro-batch) runs in a child process of its own: what a job process
runs (`rlvr.services.trainer.job.runner.run_job`, the transformers generation backend: the policy samples
in-process, so no rollout server is needed) for `--steps` GRPO steps, with a thread sampling the
process's resident set size (psutil, every 2 ms) and labelling each sample with the phase TRL is in:

- load: the policy built (model, LoRA, tokenizer, TRL's trainer);
- generate: `Step.rollout`, the policy sampling the step's completions (and scoring them);
- logps: the rest of TRL's `_generate_and_score_completions` (the reference model's logprobs when
  kl_beta > 0, TRL's old-logprob pass when it runs, advantages);
- loss forward: TRL's `_compute_loss` (the policy's forward, TRL's fused LM head, the loss);
- backward: the rest of `training_step` (autograd through the micro-batch);
- optimizer: the optimizer step and the per-step callbacks (adapter save, metrics).

The table gives, per configuration, the process's peak RSS (`ru_maxrss`) and the highest sample in
each phase, in MiB, and the step time. `--micro-batches 0` is the trainer's own choice
(`engine.micro_batch_size`); any other value forces advanced micro-batching through the same knob.
Writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PHASES = ("load", "generate", "logps", "loss forward", "backward", "optimizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="base model: rlvr-tiny[-size], hub id or path")
    p.add_argument("--batch-sizes", default="32", help="comma list of grpo.batch_size (completions per step)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32, help="grpo.max_completion_tokens")
    p.add_argument("--min-tokens", action="store_true",
                   help="every completion max-tokens long (EOS suppressed), the worst case of the loss")
    p.add_argument("--micro-batches", default="0",
                   help="comma list of micro-batch sizes (completions per forward/backward); 0 = the trainer's "
                        "own choice; the whole batch = one micro-batch (the trainer before micro-batching)")
    p.add_argument("--loss-type", default="dapo", choices=["grpo", "dapo", "dr_grpo"])
    p.add_argument("--kl-beta", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", type=Path, default=Path(".rlvr/bench/trainer_memory.json"))
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


class Sampler:
    """The process's RSS sampled on a thread, the highest value kept per phase."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.phase = "load"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.mark()
            time.sleep(0.002)

    def mark(self) -> None:
        rss = self.proc.memory_info().rss
        if rss > self.peaks.get(self.phase, 0):
            self.peaks[self.phase] = rss

    def set(self, phase: str) -> None:
        self.mark()
        self.phase = phase
        self.mark()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def instrument(sampler: Sampler) -> None:
    """Labels TRL's phases on the sampler: wraps GRPOTrainer's and our Step's methods (class-level, in
    this child process only)."""
    from trl import GRPOTrainer

    from rlvr.services.trainer.job.step import Step

    def wrap(cls: Any, name: str, before: str, after: str | None) -> None:
        inner = getattr(cls, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            sampler.set(before)
            try:
                return inner(*a, **k)
            finally:
                if after is not None:
                    sampler.set(after)

        setattr(cls, name, wrapped)

    wrap(Step, "rollout", "generate", "logps")
    wrap(GRPOTrainer, "_generate_and_score_completions", "logps", "loss forward")
    wrap(GRPOTrainer, "_compute_loss", "loss forward", "backward")
    wrap(GRPOTrainer, "training_step", "loss forward", "optimizer")


def child(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    if config["threads"]:
        torch.set_num_threads(config["threads"])
    from rlvr.services.trainer.job import engine
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    if config["min_tokens"]:
        from transformers import GenerationConfig

        # every completion runs to max_completion_tokens: the loss's worst case for a given batch
        original = GenerationConfig.__init__

        def no_eos(self: Any, **kwargs: Any) -> None:
            original(self, **kwargs)
            self.min_new_tokens = self.max_new_tokens

        GenerationConfig.__init__ = no_eos  # type: ignore[method-assign]
    events: list[Any] = []
    with Sampler() as sampler, tempfile.TemporaryDirectory(prefix="rlvr-trainer-memory-") as root:
        instrument(sampler)
        extra: dict[str, Any] = {}
        if config["micro_batch"]:
            extra["micro_batch_size"] = config["micro_batch"]
        job = job_config(
            job_id=f"memory-{os.getpid()}", base_model=config["model"], artifact_root=Path(root),
            group_size=config["group_size"], batch_size=config["batch_size"],
            max_completion_tokens=config["max_tokens"], loss_type=config["loss_type"], kl_beta=config["kl_beta"],
            max_steps=config["steps"], generation_backend="transformers", **extra)
        chosen: list[int] = []
        original_args = engine.grpo_args

        def spy(*a: Any, **k: Any) -> Any:
            args = original_args(*a, **k)
            chosen.append(args.per_device_train_batch_size)
            return args

        engine.grpo_args = spy  # type: ignore[assignment]
        started = time.perf_counter()
        result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append))
        wall = time.perf_counter() - started
    if result.status != "completed":
        raise SystemExit(f"the job {result.status}: {result.error}")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    tokens = [e.completion_length_mean for e in events]
    return {"peak_rss": maxrss, "phases": sampler.peaks, "micro_batch": chosen[0] if chosen else None,
            "steps": len(events), "step_seconds": [e.step_seconds for e in events],
            "train_seconds": [e.train_seconds for e in events], "wall": wall, "completion_length_mean": tokens,
            "loss": [e.loss for e in events]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for micro in [int(m) for m in args.micro_batches.split(",")]:
            config = {"model": args.model, "batch_size": batch, "group_size": args.group_size,
                      "max_tokens": args.max_tokens, "min_tokens": args.min_tokens, "micro_batch": micro,
                      "loss_type": args.loss_type, "kl_beta": args.kl_beta, "steps": args.steps,
                      "threads": args.threads}
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(config)], capture_output=True,
                                  text=True)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not found:
                print(proc.stderr[-3000:], file=sys.stderr)
                rows.append({"config": config, "error": f"exit {proc.returncode}"})
                continue
            rows.append({"config": config} | json.loads(found[-1].removeprefix("RESULT ")))
            print(format_row(rows[-1]), flush=True)
    print()
    print(format_table(rows, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"argv": sys.argv[1:], "machine": platform.processor() or platform.machine(),
                                    "rows": rows}, indent=1))
    return 0


def mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f}"


def format_row(row: dict[str, Any]) -> str:
    c = row["config"]
    if "error" in row:
        return f"| {c['batch_size']} | {c['micro_batch'] or 'auto'} | {row['error']} |"
    phases = " | ".join(mib(row["phases"].get(p)) for p in PHASES)
    train = sum(row["train_seconds"]) / max(len(row["train_seconds"]), 1)
    step = sum(row["step_seconds"]) / max(len(row["step_seconds"]), 1)
    asked = "auto" if not c["micro_batch"] else str(c["micro_batch"])
    return (f"| {c['batch_size']} | {asked} -> {row['micro_batch']} | {mib(row['peak_rss'])} | {phases} "
            f"| {train:.1f} | {step:.1f} |")


def format_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = ("| batch | micro-batch | peak RSS MiB | " + " | ".join(PHASES) + " | train s | step s |\n"
            "|---:|---:|---:|" + "---:|" * len(PHASES) + "---:|---:|")
    return "\n".join([head] + [format_row(r) for r in rows])


if __name__ == "__main__":
    raise SystemExit(main())
