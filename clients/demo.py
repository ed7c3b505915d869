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

from rlvr.v1 import benchmark_pb2, common_pb2, scheduler_pb2

BENCHMARK = "rlvr-math-pairs-heldout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=40, help="GRPO steps (default 40)")
    p.add_argument("--eval-n", type=int, default=500, help="held-out questions per evaluation (default 500)")
    p.add_argument("--backend", choices=("vllm", "transformers"), default="vllm",
                   help="generation backend of the job (default vllm: the rollout server)")
    p.add_argument("--model", default="rlvr-tiny", help="base model (default: the bundled tiny model)")
    p.add_argument("--home", default=None, help="state folder (default $RLVR_HOME/demo)")


def demo_spec(args: argparse.Namespace) -> common_pb2.JobSpec:
    """Settings inside the spec's ranges that DESIGN.md's first experiment found to move this model:
    a high alpha/rank ratio, dapo, the top of the learning-rate range."""
    spec = common_pb2.JobSpec(name="demo-math-pairs", base_model=args.model)
    spec.reward.function = common_pb2.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 1024
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = 8, 32, 64
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = 4, 128, 1e-5, args.steps
    spec.advanced.loss_type = common_pb2.LOSS_TYPE_DAPO
    spec.advanced.generation_backend = (common_pb2.GENERATION_BACKEND_VLLM if args.backend == "vllm"
                                        else common_pb2.GENERATION_BACKEND_TRANSFORMERS)
    return spec


def evaluate(client, n: int, label: str, adapter: common_pb2.AdapterRef | None = None) -> benchmark_pb2.Evaluation:  # noqa: ANN001
    """Runs one evaluation and follows it to the end with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    request = benchmark_pb2.RunEvaluationRequest(benchmark=BENCHMARK, limit=n, label=label)
    if adapter is not None:
        request.adapter.CopyFrom(common_pb2.AdapterSelector(name=adapter.name, version=adapter.version))
    evaluation = client.run_evaluation(request)
    with Progress(TextColumn(f"[bold]eval {label}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task(label, total=n)
        for event in client.watch_evaluation(benchmark_pb2.WatchEvaluationRequest(id=evaluation.id)):
            bar.update(task, completed=event.questions_done, total=event.questions_total or n)
    return client.get_evaluation(benchmark_pb2.GetEvaluationRequest(id=evaluation.id))


def _settled(client, job_id: str, timeout_s: float = 60.0) -> common_pb2.Job:  # noqa: ANN001
    """The job as stored once its final status is in: the watch reads events straight off NATS,
    the store gets them a moment later through the scheduler's consumer."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get_job(scheduler_pb2.GetJobRequest(id=job_id))
        done = job.status in (common_pb2.JOB_STATUS_COMPLETED, common_pb2.JOB_STATUS_FAILED,
                              common_pb2.JOB_STATUS_CANCELLED)
        if done or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def _scores(e: benchmark_pb2.Evaluation) -> str:
    s = e.scores
    return (f"accuracy {s.accuracy:6.1%}  accuracy_strict {s.accuracy_strict:6.1%}  format {s.format:6.1%}  "
            f"answered {s.answered:6.1%}")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clients.sdk import ClientSettings, RlvrError, connect
    from clients.stack import Stack, StackConfig, free_port
    from clients.train_cmd import summary_lines, watch_job
    from rlvr.common.settings import rlvr_home

    home = Path(args.home).expanduser() if args.home else rlvr_home() / "demo"
    cfg = StackConfig(home=home.resolve(), model=args.model,
                      ports={name: free_port() for name in ("scheduler", "trainer", "reward", "rollout", "benchmark")})
    stack = Stack(cfg)
    started = time.monotonic()
    try:
        stack.start()
        if not stack.wait_serving():
            return 1
        a = cfg.addresses
        rlvr = connect(ClientSettings(scheduler_address=a["scheduler"], trainer_address=a["trainer"],
                                      reward_address=a["reward"], rollout_address=a["rollout"],
                                      benchmark_address=a["benchmark"]))
        print(f"\n1/3 held-out Math Pairs accuracy of the base model ({args.eval_n} questions, greedy)")
        before = evaluate(rlvr.benchmark, args.eval_n, "base")
        print(f"    base     {_scores(before)}")

        print(f"\n2/3 RLVR training: {args.steps} GRPO steps on Math Pairs")
        created = rlvr.scheduler.create_job(scheduler_pb2.CreateJobRequest(spec=demo_spec(args)))
        print("\n".join("    " + line for line in summary_lines(created.summary, list(created.warnings))))
        status = watch_job(rlvr.scheduler, created.job.id)
        job = _settled(rlvr.scheduler, created.job.id)
        if status != common_pb2.JOB_STATUS_COMPLETED or not job.adapter.name:
            print(f"the job did not complete: {job.error or common_pb2.JobStatus.Name(job.status)}")
            return 1

        print(f"\n3/3 held-out accuracy of the trained adapter {job.adapter.name} v{job.adapter.version}")
        after = evaluate(rlvr.benchmark, args.eval_n, "trained", adapter=job.adapter)
        print(f"    trained  {_scores(after)}")
        delta = (after.scores.accuracy - before.scores.accuracy) * 100
        print(f"\nheld-out accuracy before {before.scores.accuracy:.1%} -> after {after.scores.accuracy:.1%} "
              f"({delta:+.1f} points) after {job.current_step} steps; adapter at {job.adapter.path}")
        print(f"total {time.monotonic() - started:.0f} s; state in {cfg.home}")
        return 0
    except RlvrError as e:
        print(f"error: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        stack.stop()
        print("stack stopped.")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the whole stack, an RLVR run on the tiny model, accuracy before/after",
                              description=__doc__)
    add_arguments(p)
    p.set_defaults(handler=run)
