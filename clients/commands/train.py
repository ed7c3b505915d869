"""`rlvr train` and `rlvr jobs ...`: start an RLVR job with the spec's options as flags, watch it
live, and list, show (with the RL Metrics card) or cancel jobs. Talks to the scheduler through the
SDK. `rlvr jobs report|download|merge|export` live in clients/commands/jobs.py and are registered here.

Flags left out are left unset in the JobSpec, so the scheduler applies the spec's defaults in one
place (rlvr/jobspec/) and says what it rounded or ignored in its warnings.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from rlvr.clients.commands import jobs as jobs_cmd
from rlvr.clients.views import jobs as jobs_view
from rlvr.clients.views.jobs import summary_lines
from rlvr.jobspec import (
    APPLIES_NOTES,
    BACKEND_KEYS,
    CHECKPOINTING_CHOICES,
    HEAD_TASK_NAMES,
    LORA_INITS,
    LOSS_NAMES,
    METHOD_KEYS,
    PRECISIONS,
    QUANT_KEYS,
    SHARDINGS,
    SPEC_FIELDS,
    SpecField,
    job_status_name,
)
from rlvr.v1 import common_pb2 as C

# The choices of the enum flags: the spec's keys, with "-" for "_" where a flag reads better.
LOSSES = {key: value for value, key in LOSS_NAMES.items()}
METHODS = {key: value for value, key in METHOD_KEYS.items()}
HEAD_TASKS = {name: value for value, name in HEAD_TASK_NAMES.items()}
QUANTS = {key: value for value, key in QUANT_KEYS.items()}
BACKENDS = {key.replace("_", "-"): value for value, key in BACKEND_KEYS.items()}
KINDS: dict[str, type] = {"int": int, "float": float, "text": str}


def flag_help(row: SpecField) -> str:
    """A flag's help: the field's own words, its allowed values and where it applies (rlvr/jobspec/)."""
    allowed, only = row.allowed(), APPLIES_NOTES.get(row.applies)
    text = f"{row.help}{f' Allowed: {allowed}.' if allowed else ''}{f' ({only})' if only else ''}"
    return text.replace("%", "%%")


# flag -> (message path, field, type, help): the rows of rlvr/jobspec/fields.py's table that have a flag
SPEC_FLAGS: list[tuple[str, str, str, type, str]] = [
    (row.flag, row.group, row.name, KINDS[row.kind], flag_help(row)) for row in SPEC_FIELDS if row.flag]


def flag_dest(group: str, field: str) -> str:
    """A flag's attribute on the parsed args: the field's name, or group_name where the name alone
    says little or is taken ("environment.key" -> environment_key, "init_adapter.name" -> init_adapter_name
    beside --name's) or another card has it too ("sft.learning_rate" -> sft_learning_rate, beside grpo's;
    "head.learning_rate" -> head_learning_rate)."""
    return f"{group}_{field}" if group and (field in ("key", "name") or group in ("sft", "head")) else field


def add_spec_arguments(p: argparse.ArgumentParser, *,
                       name_help: str = "job name (default: derived from model and loss)") -> None:
    """The JobSpec's flags (what `spec_from_args` reads): `rlvr train`'s and `rlvr loops start`'s."""
    p.add_argument("--name", default="", help=name_help)
    p.add_argument("--method", choices=list(METHODS), default=None,
                   help="rlvr (default: the model answers the reward's prompts and learns from their scores), sft "
                        "(Supervised: the adapter learns --sft-dataset's completions; the --sft-* flags) or head (a "
                        "classification or regression head learns --head-dataset's labels; the --head-* flags)")
    p.add_argument("--head-task", choices=list(HEAD_TASKS), default=None,
                   help="with --method head: classification (default: the label column's classes) or regression "
                        "(a number)")
    p.add_argument("--model", default="", help="base model: hub id, local path or rlvr-tiny (default)")
    p.add_argument("--reward", action="append", type=reward_term, default=None, metavar="KEY[:WEIGHT]",
                   help="the reward, by key (default math_pairs; `rlvr rewards` lists them); give it several times "
                        "to combine rewards, each with an optional weight (default 1): --reward gsm8k --reward "
                        "length:0.2 (the first is the job's reward)")
    p.add_argument("--accuracy-key", default="", help="with several rewards: which one is the accuracy (default "
                                                      "the first)")
    p.add_argument("--no-format-bonus", action="store_true", help="turn the format bonus off")
    p.add_argument("--loss-type", choices=sorted(LOSSES), default=None, help="default grpo")
    p.add_argument("--quantization", choices=sorted(QUANTS), default=None, help="default full")
    p.add_argument("--backend", choices=sorted(BACKENDS), default=None,
                   help="vllm (the rollout server, default), vllm-colocate (an engine in the job's process) or "
                        "transformers (in-process)")
    for flag, group, field, kind, text in SPEC_FLAGS:
        p.add_argument(flag, dest=flag_dest(group, field), metavar=field.upper(), type=kind, default=None, help=text)
    p.add_argument("--environment-setting", action="append", type=environment_setting, default=None,
                   dest="environment_settings", metavar="KEY=VALUE",
                   help="with --environment: one of the environment's own settings; repeat for several")
    p.add_argument("--lora-init", choices=LORA_INITS, default=None,
                   help="LoRA A initialisation: peft's kaiming-uniform (default) or gaussian N(0, 1/r)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="training precision: auto (default: bf16 on a CUDA device that supports it, fp32 "
                        "elsewhere), fp32, bf16, or fp16 (CUDA only)")
    p.add_argument("--gradient-checkpointing", choices=CHECKPOINTING_CHOICES, default=None,
                   help="auto (default: on for a 1B+ model on a CUDA device, off on a CPU), on or off")
    p.add_argument("--sharding", choices=SHARDINGS, default=None,
                   help="with --processes 2 or more: ddp (default, a whole model per process) or fsdp (the "
                        "model sharded across the processes)")
    p.add_argument("--dynamic-sampling", action="store_true",
                   help="DAPO's dynamic sampling: replace groups without a reward spread by further prompts' groups")
    p.add_argument("--recipe", action="store_true",
                   help="fill every setting not given here from --model's measured recipe (the settings whose "
                        "learning was measured: rlvr models list says which models have one; docs/jobs.md)")
    p.add_argument("--no-completion-only-loss", action="store_true",
                   help="with --method sft: train on the whole text, prompt included (default: the completion only)")
    p.add_argument("--packing", action="store_true",
                   help="with --method sft: pack several examples into each --max-seq-length sequence")
    p.add_argument("--mask-truncated", action="store_true",
                   help="DAPO's overlong masking: leave completions cut at --max-completion out of the loss")
    p.add_argument("--track", action="append", type=jobs_cmd.tracker_arg, default=None, metavar="KIND:TARGET",
                   help="mirror the job's metrics into an experiment tracker, written by the scheduler: "
                        "tensorboard:DIR, mlflow[:URI], wandb:DIR (offline), trackio:DIR; options after a comma: "
                        ",project=NAME ,run=NAME ,online (wandb); repeat for several (docs/tracking.md)")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="validate and print the Training Summary only")
    p.add_argument("--detach", action="store_true", help="start the job and return without watching")
    p.add_argument("--address", default=None, help="scheduler HOST:PORT (default RLVR_SCHEDULER_ADDRESS)")


def reward_term(text: str) -> C.RewardTerm:
    """`--reward KEY[:WEIGHT]` as a RewardTerm ("-" reads as "_" in a key: math-pairs = math_pairs);
    the scheduler checks the key and the weight's range."""
    key, sep, weight = text.strip().partition(":")
    term = C.RewardTerm(key=key.strip().replace("-", "_"))
    if sep:
        try:
            term.weight = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: the weight {weight!r} is not a number") from None
    return term


def environment_setting(text: str) -> tuple[str, str]:
    """`--environment-setting KEY=VALUE` as (key, value); the scheduler checks the key's shape."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def spec_from_args(args: argparse.Namespace) -> C.JobSpec:
    spec = C.JobSpec(name=args.name, base_model=args.model)
    if getattr(args, "track", None):
        spec.tracking.extend(args.track)
    if args.reward:
        terms = args.reward
        if len(terms) == 1 and not terms[0].HasField("weight"):
            spec.reward.key = terms[0].key
        else:
            spec.reward.terms.extend(terms)
    if args.accuracy_key:
        spec.reward.accuracy_key = args.accuracy_key
    if args.no_format_bonus:
        spec.reward.format_bonus = False
    if getattr(args, "method", None):
        spec.method = METHODS[args.method]
    if getattr(args, "no_completion_only_loss", False):
        spec.sft.completion_only_loss = False
    if getattr(args, "packing", False):
        spec.sft.packing = True
    if getattr(args, "head_task", None):
        spec.head.task = HEAD_TASKS[args.head_task]
    if args.loss_type:
        spec.advanced.loss_type = LOSSES[args.loss_type]
    if args.quantization:
        spec.advanced.quantization = QUANTS[args.quantization]
    if args.backend:
        spec.advanced.generation_backend = BACKENDS[args.backend]
    if args.dynamic_sampling:
        spec.advanced.dynamic_sampling = True
    if args.mask_truncated:
        spec.advanced.mask_truncated_completions = True
    if args.lora_init:
        spec.advanced.lora_init = args.lora_init
    if args.precision:
        spec.advanced.precision = args.precision
    if args.gradient_checkpointing:
        spec.advanced.gradient_checkpointing = args.gradient_checkpointing
    if args.sharding:
        spec.advanced.sharding = args.sharding
    for _, group, field, _, _ in SPEC_FLAGS:
        value = getattr(args, flag_dest(group, field))
        if value is not None:
            setattr(getattr(spec, group), field, value)
    for key, value in getattr(args, "environment_settings", None) or ():
        spec.environment.settings[key] = value
    if getattr(args, "recipe", False):
        use_recipe(spec)
    return spec


def use_recipe(spec: C.JobSpec, out=sys.stdout) -> None:  # noqa: ANN001 (a text stream)
    """`--recipe`: the model's measured recipe under what the flags set, said with its source; exit 2
    (a usage error) for a model without one."""
    from rlvr.recipes import MEASURED_RECIPES, apply_recipe, recipe_for

    recipe = recipe_for(spec.base_model)
    if recipe is None:
        which = f"--model {spec.base_model!r} has" if spec.base_model else "no --model given:"
        print(f"error: --recipe: {which} no measured recipe; models with one: {', '.join(sorted(MEASURED_RECIPES))}",
              file=sys.stderr)
        raise SystemExit(2)
    written = apply_recipe(spec, recipe)
    print(f"measured recipe of {recipe.model} ({recipe.source}): "
          f"{', '.join(f'{p} {recipe.text(p)}' for p in written) or 'every setting was given'}", file=out)


def watch_job(client, job_id: str, out=sys.stdout) -> C.JobStatus:  # noqa: ANN001 (SDK client)
    """A live progress bar with reward and accuracy until the job ends; Ctrl-C detaches."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rlvr.v1 import scheduler_pb2

    status = C.JOB_STATUS_QUEUED
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    try:
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(f"job {job_id}", total=None, stats="queued")
            for event in client.watch_job(scheduler_pb2.WatchJobRequest(id=job_id, from_start=True)):
                if event.HasField("metric"):
                    m = event.metric
                    lag = f" lag {m.policy_lag}" if m.policy_lag else ""  # asynchronous steps' stale data
                    stats = (f"loss {m.loss:.4f} token acc {m.token_accuracy:.3f}" if m.HasField("token_accuracy")
                             else f"reward {m.reward_mean:.3f} acc {m.accuracy:.3f} loss {m.loss:.4f}{lag}")
                    bar.update(task, completed=m.step, total=m.total_steps or None, stats=stats)
                else:
                    status = event.status.status
                    name = job_status_name(status).lower()
                    if status in (C.JOB_STATUS_COMPLETED, C.JOB_STATUS_FAILED, C.JOB_STATUS_CANCELLED):
                        bar.update(task, stats=name + (f": {event.status.message}" if event.status.message else ""))
                        break
                    if event.status.message.startswith("warning: "):  # a running job's (it cannot learn)
                        bar.console.print(event.status.message)
                    bar.update(task, stats=name)
    except KeyboardInterrupt:
        print(f"\ndetached; `rlvr jobs watch {job_id}` re-attaches", file=out)
    return status


def cmd_train(args: argparse.Namespace) -> int:
    from rlvr.clients.errors import explain, invalid_fields, is_unreachable
    from rlvr.clients.sdk import RlvrError
    from rlvr.v1 import scheduler_pb2

    client = jobs_cmd.scheduler_client(args)
    try:
        resp = client.create_job(scheduler_pb2.CreateJobRequest(spec=spec_from_args(args), dry_run=args.dry_run))
    except RlvrError as e:
        print(f"error: {explain(e) if is_unreachable(e) else invalid_fields(e)}", file=sys.stderr)
        return 2 if e.code.name == "INVALID_ARGUMENT" else 1
    print("\n".join(summary_lines(resp.summary, list(resp.warnings))))
    if args.dry_run:
        return 0
    print(f"job {resp.job.id} queued")
    if args.detach:
        return 0
    try:
        status = watch_job(client, resp.job.id)
    except RlvrError as e:  # the job is queued: losing the watch loses nothing
        print(f"error: watching job {resp.job.id}: {explain(e)}; `rlvr jobs watch {resp.job.id}` "
              "re-attaches", file=sys.stderr)
        return 1
    return 0 if status in (C.JOB_STATUS_COMPLETED, C.JOB_STATUS_QUEUED, C.JOB_STATUS_RUNNING) else 1


def _fmt_time(ts) -> str:  # noqa: ANN001 (protobuf Timestamp)
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S") if ts.seconds else "-"


def cmd_jobs(args: argparse.Namespace) -> int:
    from rlvr.clients.errors import explain
    from rlvr.clients.sdk import RlvrError
    from rlvr.v1 import scheduler_pb2

    client = jobs_cmd.scheduler_client(args)
    try:
        if args.jobs_command == "list":
            resp = client.list_jobs(scheduler_pb2.ListJobsRequest(limit=args.limit, offset=args.offset))
            print(f"{'ID':<14}{'STATUS':<11}{'STEP':>9}  {'CREATED':<20}NAME")
            for job in resp.jobs:
                status = job_status_name(job.status)
                print(f"{job.id:<14}{status:<11}{job.current_step:>4}/{job.total_steps:<4}  "
                      f"{_fmt_time(job.created_at):<20}{job.spec.name}")
            print(f"{resp.total} job(s)")
        elif args.jobs_command == "show":
            job = client.get_job(scheduler_pb2.GetJobRequest(id=args.id))
            width, unicode = jobs_cmd.terminal_width(sys.stdout), jobs_view.supports_unicode(sys.stdout)
            print("\n".join(jobs_view.job_lines(job, width=width, unicode=unicode)))
            for line in jobs_cmd.tracking_lines(job):
                print(line)
            print("\n".join(summary_lines(job.summary, list(job.warnings), width=width, unicode=unicode)))
            print()
            jobs_cmd.print_metrics(client, job.id)
        elif args.jobs_command == "cancel":
            job = client.cancel_job(scheduler_pb2.CancelJobRequest(id=args.id))
            kept = f"; adapter {job.adapter.name} v{job.adapter.version} kept" if job.adapter.name else ""
            print(f"job {job.id} cancelled{kept}")
        elif args.jobs_command == "delete":
            resp = client.delete_job(scheduler_pb2.DeleteJobRequest(id=args.id))
            print(f"job {resp.id} deleted with its metrics and files "
                  f"({jobs_view.human_size(resp.freed_bytes)} freed)")
        elif args.jobs_command == "watch":
            status = watch_job(client, args.id)
            return 0 if status != C.JOB_STATUS_FAILED else 1
    except RlvrError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="start an RLVR (GRPO) job and watch it",
                                  description="Start an RLVR job: the spec's Reward, GRPO and Advanced options.")
    add_train_arguments(train)
    train.set_defaults(handler=cmd_train)
    jobs = subparsers.add_parser("jobs", help="list, show, watch, cancel or delete jobs; report, download, merge, "
                                 "export")
    sub = jobs.add_subparsers(dest="jobs_command", required=True)
    ls = sub.add_parser("list", help="recent jobs")
    ls.add_argument("--limit", type=int, default=50, help="at most N, up to 500 (default 50)")
    ls.add_argument("--offset", type=int, default=0, help="skip the N newest (paging; default 0)")
    for name, text in (("show", "a job's status, summary, adapter and RL Metrics (trends, tiles, charts)"),
                       ("watch", "follow a job live"),
                       ("cancel", "cancel a job (its partial adapter is kept)"),
                       ("delete", "delete a finished job: its metrics, adapter, checkpoints and merged models")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
    for p in (ls, *[sub.choices[n] for n in ("show", "watch", "cancel", "delete")]):
        p.add_argument("--address", default=None, help="scheduler HOST:PORT")
        p.set_defaults(handler=cmd_jobs)
    jobs_cmd.register(sub)
    rewards = subparsers.add_parser("rewards", help="the rewards a job may name (--reward KEY): the built-ins, "
                                    "plugins and remote rewards the reward service has")
    rewards.add_argument("--address", default=None, help="scheduler HOST:PORT")
    rewards.set_defaults(handler=cmd_rewards)


def cmd_rewards(args: argparse.Namespace) -> int:
    """`rlvr rewards`: one line per reward (key, name, whether it needs a dataset, the columns it
    reads, where it comes from), then those that failed to load, with why."""
    from rlvr.v1 import reward_pb2

    client = jobs_cmd.scheduler_client(args)
    response = client.list_reward_functions(reward_pb2.ListRewardFunctionsRequest())
    width = max((len(f.key) for f in response.functions), default=3)
    for f in response.functions:
        data = "needs a dataset" if f.needs_dataset else "takes a dataset" if f.accepts_dataset else "own prompts"
        if f.dataset_names:
            data = f"--dataset names one of its {len(f.dataset_names)} tasks"
        columns = f"; reads {', '.join(f.columns)}" if f.columns else ""
        print(f"{f.key:<{width}}  {f.display_name} ({data}{columns}; {f.source})")
        if f.description:
            print(f"{'':<{width}}  {f.description}")
        if f.dataset_names:  # the names the Dataset field takes (reasoning-gym's tasks), wrapped
            indent = " " * (width + 2)
            print(textwrap.fill("tasks: " + ", ".join(f.dataset_names), width=100, initial_indent=indent,
                                subsequent_indent=indent + "  "))
    for u in response.unavailable:
        print(f"{u.key:<{width}}  not loaded: {u.error}")
    return 0
