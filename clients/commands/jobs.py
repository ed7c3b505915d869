"""`rlvr jobs report|download|merge|export|track|samples` and the RL Metrics part of `rlvr jobs show`: a job's
results, the way the RL Metrics card and its actions offer them (see docs/monitoring.md).

Registered into the `jobs` group by clients/commands/train.py. Every command prints one
`error: CODE: details` line on a failed call (an unknown job, a job without an adapter yet) and
exits 1; a file that cannot be written is the same kind of one-line error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rlvr.clients.views.jobs import human_size
from rlvr.jobspec import MERGE_DTYPES

if TYPE_CHECKING:
    from rlvr.v1 import common_pb2

EXPORT_FORMATS = ("csv", "jsonl")


def _format_enum(name: str) -> int:
    from rlvr.v1 import scheduler_pb2 as S

    return {"csv": S.EXPORT_FORMAT_CSV, "jsonl": S.EXPORT_FORMAT_JSONL}[name]


def terminal_width(out: TextIO) -> int:
    """The width views are drawn at: the terminal's (40-100 columns), 80 on a pipe."""
    width = shutil.get_terminal_size((80, 24)).columns if out.isatty() else 80
    return max(40, min(width, 100))


def print_metrics(client, job_id: str, out: TextIO | None = None) -> bool:  # noqa: ANN001 (SDK client)
    """Prints the job's RL Metrics card; on a failed GetJobMetrics, one warning line on stderr
    (the job itself was shown already). Returns whether the card was printed."""
    from rlvr.clients.errors import explain
    from rlvr.clients.views import jobs as jobs_view
    from rlvr.peers.base import RlvrError
    from rlvr.v1 import scheduler_pb2 as S

    out = out or sys.stdout
    try:
        metrics = client.get_job_metrics(S.GetJobMetricsRequest(job_id=job_id))
    except RlvrError as e:
        print(f"warning: RL Metrics unavailable: {explain(e)}", file=sys.stderr)
        return False
    text = jobs_view.render(metrics, width=terminal_width(out), unicode=jobs_view.supports_unicode(out))
    print(text, file=out)
    return True


# ---------------------------------------------------------------- commands


def cmd_report(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    from rlvr.clients.report import write_report
    from rlvr.v1 import scheduler_pb2 as S

    job = client.get_job(S.GetJobRequest(id=args.id))
    metrics = client.get_job_metrics(S.GetJobMetricsRequest(job_id=args.id))
    path = write_report(metrics, job, args.output or f"rlvr-report-{args.id}")
    print(path)
    return 0


def cmd_download(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    files = client.save_adapter(args.id, args.output)
    if not files:
        print(f"error: the server sent no adapter files for job {args.id}", file=sys.stderr)
        return 1
    for f in files:
        print(f"{f}  {human_size(f.stat().st_size)}")
    print(f"adapter of job {args.id} in {Path(args.output)} "
          f"(peft.PeftModel.from_pretrained(base, {str(args.output)!r}) loads it)")
    return 0


def cmd_merge(args: argparse.Namespace, client, out: TextIO | None = None) -> int:  # noqa: ANN001
    from rlvr.v1 import scheduler_pb2 as S

    out = out or sys.stdout
    live = out.isatty()
    final = None
    last_stage = None
    dtype = getattr(args, "dtype", "") or ""
    for progress in client.merge_model(S.MergeModelRequest(job_id=args.id, dtype=dtype)):
        line = f"merging: {progress.stage or '...':<28} {progress.fraction:>4.0%}"
        if live:
            print("\r" + line, end="", file=out, flush=True)
        elif progress.stage != last_stage or progress.done:
            print(line, file=out, flush=True)
        last_stage = progress.stage
        if progress.done:
            final = progress
    if live:
        print(file=out)
    if final is None:
        print(f"error: the merge of job {args.id} ended without finishing", file=sys.stderr)
        return 1
    size = f" ({human_size(final.size_bytes)})" if final.size_bytes else ""
    print(f"merged model of job {args.id} at {final.path or '?'} on the server{size}", file=out)
    if args.output:
        files = client.save_merged_model(args.id, args.output, dtype=dtype or "auto")
        total = sum(f.stat().st_size for f in files)
        print(f"downloaded {len(files)} file(s), {human_size(total)}, to {Path(args.output)}", file=out)
    return 0


def cmd_export(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    from rlvr.v1 import scheduler_pb2 as S

    resp = client.export_history(S.ExportHistoryRequest(job_id=args.id, format=_format_enum(args.format)))
    if not args.output or args.output == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(resp.content)
        sys.stdout.buffer.flush()
        return 0
    path = Path(args.output)
    if path.is_dir():
        path = path / (resp.filename or f"{args.id}.{args.format}")
    path.write_bytes(resp.content)
    print(f"wrote {resp.rows} row(s) ({resp.content_type or args.format}) to {path}")
    return 0


def tracker_arg(text: str) -> common_pb2.TrackerConfig:
    """`--track KIND:TARGET[,OPTION...]` as a TrackerConfig; a relative folder made absolute here (the
    scheduler writes it, on its own host: the same one for `rlvr up`)."""
    from pathlib import Path

    from rlvr.tracking.config import is_url, parse_tracker

    try:
        config = parse_tracker(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if config.target and not is_url(config.target) and not config.target.startswith("file:"):
        config.target = str(Path(config.target).expanduser().absolute())
    return config


def tracking_lines(job) -> list[str]:  # noqa: ANN001 (common_pb2.Job)
    """`rlvr jobs show`'s lines on where the job is tracked (none when it is not)."""
    from rlvr.tracking.config import kind_name

    lines = []
    for link in job.tracking:
        state = f"not logging: {link.error}" if link.error else \
            f"{link.steps_logged} step(s) logged{', finished' if link.finished else ''}"
        lines.append(f"Tracked in {kind_name(link.kind)}: {link.location} ({state})")
    return lines


def cmd_track(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    from rlvr.tracking.config import kind_name
    from rlvr.v1 import scheduler_pb2 as S

    resp = client.track_job(S.TrackJobRequest(job_id=args.id, trackers=args.to))
    failed = 0
    for link in resp.links:
        if link.error:
            failed += 1
            print(f"{kind_name(link.kind)}: not logged: {link.error} ({link.location})", file=sys.stderr)
        else:
            print(f"{kind_name(link.kind)}: {link.steps_logged} step(s) of job {args.id} logged to {link.location}")
    return 1 if failed else 0


def print_samples(resp, out: TextIO, prompts: bool = False) -> None:  # noqa: ANN001 (GetJobSamplesResponse)
    """Each step's samples, newest step first: reward and accuracy, the prompt's last line (all of
    it with `prompts`) and the completion; for a job with an environment, its episode turn by turn."""
    from rlvr.clients.views.episodes import from_transcript, is_transcript, text_lines

    for event in resp.steps:
        print(f"step {event.step}: {len(event.samples)} sample(s)", file=out)
        for n, sample in enumerate(event.samples, 1):
            print(f"  #{n} reward {sample.reward:.3f}, accuracy {sample.accuracy:.3f}", file=out)
            prompt = sample.prompt.strip()
            if not prompts:
                tail = [line for line in prompt.splitlines() if line.strip()][-1:]
                prompt = ("… " if len(prompt.splitlines()) > 1 else "") + (tail[0] if tail else "")
            print("    prompt: " + prompt.replace("\n", "\n    "), file=out)
            if resp.environment and is_transcript(sample.completion):
                for line in text_lines(from_transcript(sample.completion)):
                    print("    " + line.replace("\n", "\n    "), file=out)
            else:
                print("    completion: " + sample.completion.replace("\n", "\n    "), file=out)


def cmd_samples(args: argparse.Namespace, client, out: TextIO | None = None) -> int:  # noqa: ANN001
    from rlvr.v1 import scheduler_pb2 as S

    out = out or sys.stdout
    resp = client.get_job_samples(S.GetJobSamplesRequest(job_id=args.id, step=args.step or 0, limit=args.limit))
    if not resp.steps:
        which = f"step {args.step}" if args.step else "its stored steps"
        print(f"no samples of completions for job {args.id} ({which}): none published yet, or the event stream "
              "no longer keeps them", file=sys.stderr)
        return 1
    if resp.environment:
        print(f"episodes in the {resp.environment} environment, turn by turn", file=out)
    print_samples(resp, out, prompts=args.prompts)
    return 0


COMMANDS = {"report": cmd_report, "download": cmd_download, "merge": cmd_merge, "export": cmd_export,
            "track": cmd_track, "samples": cmd_samples}


def scheduler_client(args: argparse.Namespace):  # -> SchedulerClient
    """The scheduler client of a command: `--address` if given, else the settings' address."""
    from rlvr.clients.sdk import ClientSettings, connect

    settings = ClientSettings()
    if getattr(args, "address", None):
        settings = ClientSettings(scheduler_address=args.address)
    return connect(settings).scheduler


def cmd_jobs_action(args: argparse.Namespace) -> int:
    from rlvr.clients.errors import explain
    from rlvr.peers.base import RlvrError

    try:
        return COMMANDS[args.jobs_command](args, scheduler_client(args))
    except RlvrError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # a path we cannot write, a chunk path outside the directory
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted; `rlvr jobs {args.jobs_command} {args.id}` starts again", file=sys.stderr)
        return 130


def register(sub: argparse._SubParsersAction) -> None:
    """Adds report, download, merge, export, track and samples to the `jobs` subparsers."""
    report = sub.add_parser("report", help="write a self-contained HTML report (and PNG charts) of the RL Metrics",
                            description="Writes DIR/report.html (no network needed: inline CSS, charts embedded "
                            "as PNG) and the charts as PNG files next to it; prints the report's path.")
    report.add_argument("-o", "--output", metavar="DIR", default=None,
                        help="output folder (default ./rlvr-report-ID)")
    download = sub.add_parser("download", help="download the job's adapter (PEFT files)",
                              description="Writes the adapter as a PEFT directory that "
                              "peft.PeftModel.from_pretrained and vLLM's LoRA loading accept as is.")
    download.add_argument("-o", "--output", metavar="DIR", required=True, help="folder to write the adapter to")
    merge = sub.add_parser("merge", help="merge the adapter into the base model (with progress)",
                           description="Merges the job's adapter into its base model on the server (a full "
                           "Hugging Face checkpoint under the artifact root), showing progress; with -o, "
                           "downloads the merged model into DIR.")
    merge.add_argument("-o", "--output", metavar="DIR", default=None, help="download the merged model into DIR")
    merge.add_argument("--dtype", choices=MERGE_DTYPES, default="auto",
                       help="the merged checkpoint's dtype: auto (default: the base model's), fp32, bf16 or fp16")
    export = sub.add_parser("export", help="export the per-step metrics as CSV or JSONL",
                            description="One row per step, columns named as in the metric event.")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="csv", help="csv (default) or jsonl")
    export.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="file (or folder) to write; default: standard output")
    track = sub.add_parser("track", help="mirror a job's metrics into experiment trackers (also after it ended)",
                           description="The scheduler writes the job's stored steps (and, while it runs, the "
                           "next ones), its spec and final tiles into each tracker; docs/tracking.md.")
    track.add_argument("--to", action="append", type=tracker_arg, required=True, metavar="KIND:TARGET",
                       help="tensorboard:DIR, mlflow[:URI], wandb:DIR, trackio:DIR (options: ,project=NAME "
                            ",run=NAME ,online); repeat for several")
    samples = sub.add_parser("samples", help="a few completions of each of the latest steps (episodes turn by turn)",
                             description="The completions the trainer published for each step (at most 4 a step, "
                             "as the experiment trackers log them), newest step first: reward, accuracy, the "
                             "prompt and the completion; a job with an environment shows each episode turn by turn "
                             "(assistant turns, tool results, the environment's replies). Read off the event stream: "
                             "a step it no longer keeps has none.")
    samples.add_argument("--step", type=int, default=0, metavar="N", help="this step only (default: the latest steps)")
    samples.add_argument("--limit", type=int, default=3, metavar="N", help="steps to show (default 3, at most 100)")
    samples.add_argument("--prompts", action="store_true", help="print whole prompts (default: their last line)")
    for p in (report, download, merge, export, track, samples):
        p.add_argument("id", help="job id")
        p.add_argument("--address", default=None, help="scheduler HOST:PORT")
        p.set_defaults(handler=cmd_jobs_action)
