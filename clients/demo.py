"""`rlvr demo`: the README's main command. It brings up the whole stack on this machine (embedded
NATS, SQLite, the five services), measures the bundled tiny model's greedy accuracy on the
held-out Math Pairs benchmark, trains an RLVR (GRPO) job on Math Pairs through the services with a
live progress bar, measures the trained adapter on the same benchmark, prints both, and stops
everything. Every step goes through the public gRPC API, as a user's program would.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlvr.clients.compare import compare_evaluations
from rlvr.jobspec import LOSS_NAMES
from rlvr.paired import Comparison
from rlvr.recipes import TINY_HEADROOM
from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

BENCHMARK = "rlvr-math-pairs-heldout"
DEFAULT_MODEL = "rlvr-tiny-headroom"
TOOLS_MODEL = "rlvr-tiny-tools"  # the calculator environment's base (rlvr/tiny/build.py, recipe "tools")
# `rlvr demo`'s default step count, the measured recipe's (bench/loop.py's rounds use it too)
DEMO_STEPS = int(TINY_HEADROOM.fields["grpo.max_steps"])  # type: ignore[call-overload]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"GRPO steps (default {DEMO_STEPS}; bench/learning.py runs 300)")
    p.add_argument("--eval-n", type=int, default=500, help="held-out questions per evaluation (default 500)")
    p.add_argument("--backend", choices=("vllm", "transformers"), default="vllm",
                   help="generation backend of the job (default vllm: the dedicated rollout server, as a job on a "
                        "real model runs; transformers: in the trainer's process, 1.1-1.3x faster on a CPU for a "
                        "model this small, docs/measurements/demo.md)")
    p.add_argument("--model", default=None,
                   help="base model (default: rlvr-tiny-headroom, the bundled tiny model built and gated for RL "
                        f"headroom: docs/tiny-model.md; with --environment calculator, {TOOLS_MODEL}, its sibling "
                        "warmed up to call the calculator now and then)")
    p.add_argument("--environment", default="",
                   help="train an agent: each prompt an episode with this environment (e.g. calculator: the model "
                        "may call a calculator tool; docs/environments.md); the evaluations run the same episodes")
    p.add_argument("--max-turns", type=int, default=0, help="assistant turns per episode (default: the environment's)")
    p.add_argument("--home", default=None, help="state folder (default $RLVR_HOME/demo)")


LOSSES = {key: value for value, key in LOSS_NAMES.items()}

# The measured configuration (rlvr/recipes.py, the bundled headroom model's recipe) by the names of
# bench/learning.py's flags, which runs it for 300 steps (docs/measurements/learning.md); `rlvr demo`
# runs the recipe's own step count.
_R = TINY_HEADROOM.fields
RECIPE: dict[str, object] = {
    "steps": 300, "group_size": _R["grpo.group_size"], "batch_size": _R["grpo.batch_size"],
    "max_tokens": _R["grpo.max_completion_tokens"], "rank": _R["grpo.lora_rank"], "alpha": _R["grpo.lora_alpha"],
    "lr": _R["grpo.learning_rate"], "loss_type": LOSS_NAMES[int(_R["advanced.loss_type"])],  # type: ignore[call-overload]
    "temperature": _R["advanced.temperature"], "prompts": _R["reward.synthetic_prompts"],
    "dynamic_sampling": _R["advanced.dynamic_sampling"], "lora_init": _R["advanced.lora_init"],
}


def recipe_spec(*, model: str, steps: int, group_size: int, batch_size: int, max_tokens: int, rank: int, alpha: int,
                lr: float, loss_type: int, temperature: float, prompts: int, backend: str, seed: int = 0,
                dynamic_sampling: bool = False, lora_init: str = "default", max_async_steps: int = 0,
                name: str = "demo-math-pairs", environment: str = "", max_turns: int = 0,
                reward: str = "math_pairs", dataset: str = "") -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(name=name, base_model=model)
    if environment:  # an agent job: episodes with the environment (dynamic sampling does not run with one)
        spec.environment.key, spec.environment.max_turns = environment, max_turns
        dynamic_sampling = False
    spec.reward.key = reward
    if dataset:
        spec.reward.dataset = dataset
    spec.reward.synthetic_prompts = prompts
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = group_size, batch_size, max_tokens
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = rank, alpha, lr, steps
    a = spec.advanced
    a.loss_type, a.temperature, a.seed = loss_type, temperature, seed
    a.dynamic_sampling, a.lora_init = dynamic_sampling, lora_init
    a.generation_backend = (common_pb2.GENERATION_BACKEND_VLLM if backend == "vllm"
                            else common_pb2.GENERATION_BACKEND_TRANSFORMERS)
    if max_async_steps:
        a.max_async_steps = max_async_steps
    return spec


def demo_spec(args: argparse.Namespace) -> common_pb2.JobSpec:
    """The measured configuration (`RECIPE`) with the demo's step count and backend."""
    r = RECIPE
    return recipe_spec(model=demo_model(args), steps=args.steps, group_size=r["group_size"], batch_size=r["batch_size"],
                       max_tokens=r["max_tokens"], rank=r["rank"], alpha=r["alpha"], lr=r["lr"],
                       loss_type=LOSSES[str(r["loss_type"])],
                       temperature=r["temperature"], prompts=r["prompts"], backend=args.backend,
                       dynamic_sampling=bool(r["dynamic_sampling"]), lora_init=str(r["lora_init"]),
                       environment=args.environment, max_turns=args.max_turns)


def demo_model(args: argparse.Namespace) -> str:
    """The model asked for, else the demo's: the tools model for the calculator environment."""
    if args.model:
        return str(args.model)
    return TOOLS_MODEL if args.environment == "calculator" else DEFAULT_MODEL


def evaluate(client, n: int, label: str, adapter: common_pb2.AdapterRef | None = None,  # noqa: ANN001
             upload: bool = False, environment: common_pb2.EnvironmentConfig | None = None,
             benchmark: str = BENCHMARK, dataset: str = "") -> benchmark_pb2.Evaluation:
    """Runs one evaluation of `benchmark` (on `dataset`, for a benchmark that takes one; its questions
    as episodes with `environment`, when given) and follows it to the end with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    request = benchmark_pb2.RunEvaluationRequest(benchmark=benchmark, limit=n, label=label, dataset=dataset)
    if environment is not None and environment.key:
        request.environment.CopyFrom(environment)
    if adapter is not None and upload:
        # Trained on the transformers backend: the rollout server has never seen this adapter, so
        # the benchmark service uploads it from the shared artifact root as the name's next version.
        request.adapter.CopyFrom(common_pb2.AdapterSelector(name=adapter.name))
        request.adapter_path = adapter.path
    elif adapter is not None:
        request.adapter.CopyFrom(common_pb2.AdapterSelector(name=adapter.name, version=adapter.version))
    evaluation = client.run_evaluation(request)
    with Progress(TextColumn(f"[bold]eval {label}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task(label, total=n)
        for event in client.watch_evaluation(benchmark_pb2.WatchEvaluationRequest(id=evaluation.id)):
            bar.update(task, completed=event.questions_done, total=event.questions_total or n)
    return client.get_evaluation(benchmark_pb2.GetEvaluationRequest(id=evaluation.id))


def reward_benchmark(client, reward_key: str) -> str:  # noqa: ANN001 (the SDK's benchmark client)
    """The benchmark the benchmark service makes of the reward `reward_key`'s held-out split."""
    listed = client.list_benchmarks(benchmark_pb2.ListBenchmarksRequest()).benchmarks
    for info in listed:
        if info.reward_key == reward_key:
            return info.name
    raise ValueError(f"no benchmark scores with the reward {reward_key!r}; the benchmarks: "
                     + ", ".join(f"{i.name} ({i.reward_key})" for i in listed))


def _scores(e: benchmark_pb2.Evaluation) -> str:
    s = e.scores
    line = (f"accuracy {s.accuracy:6.1%}  accuracy_strict {s.accuracy_strict:6.1%}  format {s.format:6.1%}  "
            f"answered {s.answered:6.1%}")
    if e.HasField("episodes") and e.episodes.episodes:
        line += f"  tool calls/question {e.episodes.tool_calls / e.episodes.episodes:.2f}"
    return line


@dataclass
class Outcome:
    """What one measured run produced: the evaluations before and after, and the trained job."""

    before: benchmark_pb2.Evaluation
    after: benchmark_pb2.Evaluation | None
    job: common_pb2.Job
    train_seconds: float
    total_seconds: float
    error: str = ""
    comparison: Comparison | None = None  # after against before, question by question (rlvr/paired.py)

    @property
    def gain_points(self) -> float:
        return 0.0 if self.after is None else (self.after.scores.accuracy - self.before.scores.accuracy) * 100


def measure_training(spec: common_pb2.JobSpec, eval_n: int, home: Path, say=print) -> Outcome:  # noqa: ANN001
    """The whole stack on this machine: held-out accuracy of the base model, one RLVR job with
    `spec` through the services (live progress bar), held-out accuracy of its adapter. Stops the
    stack however it ends; raises RlvrError for an RPC that fails."""
    from rlvr.clients.commands.train import watch_job
    from rlvr.clients.stack import local_stack
    from rlvr.clients.views.jobs import summary_lines

    started = time.monotonic()
    try:
        with local_stack(home, spec.base_model) as (_, rlvr):
            task = "Math Pairs" if spec.reward.key == "math_pairs" else f"{spec.reward.key} {spec.reward.dataset}".strip()
            on = {"benchmark": reward_benchmark(rlvr.benchmark, spec.reward.key or "math_pairs"),
                  "dataset": spec.reward.dataset}
            say(f"\n1/3 held-out {task} accuracy of the base model ({eval_n} questions, greedy)")
            agent = spec.environment if spec.environment.key else None
            before = evaluate(rlvr.benchmark, eval_n, "base", environment=agent, **on)
            say(f"    base     {_scores(before)}")

            episodes = f", episodes with the {spec.environment.key} environment" if spec.environment.key else ""
            say(f"\n2/3 RLVR training: {spec.grpo.max_steps} GRPO steps on {task}{episodes}")
            created = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=spec))
            say("\n".join("    " + line for line in summary_lines(created.summary, list(created.warnings))))
            train_started = time.monotonic()
            status = watch_job(rlvr.scheduler, created.job.id)
            # The watch ends once the scheduler's store holds the job's end (and every step before it).
            job = rlvr.scheduler.get_job(scheduler_pb2.GetJobRequest(id=created.job.id))
            train_seconds = time.monotonic() - train_started
            if status != common_pb2.JOB_STATUS_COMPLETED or not job.adapter.name:
                return Outcome(before, None, job, train_seconds, time.monotonic() - started,
                               error=job.error or common_pb2.JobStatus.Name(job.status))

            say(f"\n3/3 held-out accuracy of the trained adapter {job.adapter.name} v{job.adapter.version}")
            on_rollout = spec.advanced.generation_backend == common_pb2.GENERATION_BACKEND_VLLM
            after = evaluate(rlvr.benchmark, eval_n, "trained", adapter=job.adapter, upload=not on_rollout,
                             environment=agent, **on)
            say(f"    trained  {_scores(after)}")
            comparison = None
            if after.status == benchmark_pb2.EVALUATION_STATUS_COMPLETED:
                _, _, comparison = compare_evaluations(rlvr.benchmark, before.id, after.id)
            return Outcome(before, after, job, train_seconds, time.monotonic() - started, comparison=comparison)
    finally:
        say("stack stopped.")


def run(args: argparse.Namespace) -> int:
    from rlvr.clients.errors import explain
    from rlvr.clients.sdk import RlvrError
    from rlvr.common.settings import rlvr_home

    home = Path(args.home).expanduser() if args.home else rlvr_home() / "demo"
    try:
        outcome = measure_training(demo_spec(args), args.eval_n, home)
    except RlvrError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if outcome.after is None:
        print(f"the job did not complete: {outcome.error}")
        return 1
    job, before, after = outcome.job, outcome.before, outcome.after
    print(f"\nheld-out accuracy before {before.scores.accuracy:.1%} -> after {after.scores.accuracy:.1%} "
          f"after {job.current_step} steps; adapter at {job.adapter.path}")
    if outcome.comparison is not None:
        c = outcome.comparison
        print(f"gain {c.verdict()}")
        if c.test == "McNemar exact":
            print(f"     ({c.gained} questions went wrong -> right, {c.lost} right -> wrong)")
    print(f"total {outcome.total_seconds:.0f} s (training {outcome.train_seconds:.0f} s); state in {home}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the whole stack, an RLVR run on the tiny model, accuracy before/after",
                              description=__doc__)
    add_arguments(p)
    p.set_defaults(handler=run)
