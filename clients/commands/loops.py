"""`rlvr loops ...`: automated training loops (the spec's "Automate rounds with a training loop" and
"Reading loop results"): start one with `rlvr train`'s flags plus the loop's own, follow it live,
list, show, stop, report and export them. Talks to the scheduler through the SDK.

As with `rlvr train`, flags left out stay unset in the LoopSpec, so the scheduler applies the
defaults (the name "<benchmark> to <target>%", the benchmark of --reward's task, max rounds 8,
give up after 2, reclaim storage on, the benchmark's score column, the standard-error real-gain
threshold) in one place. `--name` names the LOOP; the job spec's own name stays empty, because the
scheduler names each round's job "<loop name> R<k>".

Every command prints one `error: CODE: details` line on a failed call and exits 2 for
INVALID_ARGUMENT (as `rlvr train` does), 1 otherwise. Watching (`start` without --detach, `watch`)
exits with the loop's outcome: 0 target reached, 3 ended without reaching it (rounds spent or
plateaued), 4 stopped, 1 failed; Ctrl-C detaches (the loop goes on) with 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from rlvr.clients.commands import jobs as jobs_cmd
from rlvr.clients.commands import train as train_cmd
from rlvr.clients.views import loops as loops_view
from rlvr.v1 import scheduler_pb2 as S

# The benchmark each reward function's prompts are drawn beside (the default --benchmark).
EXPORT_FORMATS = ("csv", "jsonl")
STATUS_CHOICES = {loops_view.status_key(s).lower(): s for s in loops_view.STATUS_WORDS}

EXIT_TARGET_REACHED, EXIT_FAILED, EXIT_TARGET_MISSED, EXIT_STOPPED, EXIT_DETACHED = 0, 1, 3, 4, 130
EXIT_CODES = {
    S.LOOP_STATUS_TARGET_REACHED: EXIT_TARGET_REACHED,
    S.LOOP_STATUS_ROUNDS_SPENT: EXIT_TARGET_MISSED,
    S.LOOP_STATUS_PLATEAUED: EXIT_TARGET_MISSED,
    S.LOOP_STATUS_STOPPED: EXIT_STOPPED,
    S.LOOP_STATUS_FAILED: EXIT_FAILED,
}
EXIT_HELP = ("Exit status once the loop ends: 0 target reached, 3 rounds spent or plateaued (target not "
             "reached), 4 stopped, 1 failed; Ctrl-C detaches (the loop goes on) with 130")


def percent(text: str) -> float:
    """A percent flag: 35, 35.5 or 35%."""
    try:
        return float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percent (e.g. 35 or 35%)") from None


def exit_code(loop: S.Loop | None) -> int:
    """The exit status of a watch that saw `loop` last (see EXIT_HELP); 1 when it never ended."""
    return EXIT_CODES.get(loop.status, EXIT_FAILED) if loop is not None else EXIT_FAILED


# ---------------------------------------------------------------- the request


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """The "Start an automated loop" form's flags (see scheduler.proto's LoopSpec)."""
    g = p.add_argument_group("loop", "the automated loop's own settings (rounds train with the flags above)")
    g.add_argument("--target", type=percent, required=True, metavar="PERCENT",
                   help="stop once a round's score reaches this percent, (0, 100], the leaderboard's scale; "
                   "required")
    g.add_argument("--benchmark", default=None, metavar="NAME",
                   help="benchmark that scores every round: rlvr-math-pairs-heldout, gsm8k, boxed or any reward's "
                   "(default: the one of --reward, rlvr-math-pairs-heldout for math_pairs)")
    g.add_argument("--score-column", default="", metavar="COLUMN",
                   help="leaderboard column read back each round: accuracy, accuracy_strict, format, answered "
                   "(default: the benchmark's default column)")
    g.add_argument("--max-rounds", type=int, default=None, metavar="N", help="upper bound on rounds, 1-100 (default 8)")
    g.add_argument("--give-up-after", type=int, default=None, metavar="N",
                   help="stop after this many rounds in a row without a real gain, 1-100 (default 2)")
    g.add_argument("--min-gain", type=float, default=None, metavar="POINTS",
                   help="a real gain beats the best score so far by more than this, 0-100 points (default: one "
                   "standard error of the gain, paired question by question)")
    g.add_argument("--no-reclaim-storage", action="store_true",
                   help="keep what finished rounds made beside their adapter (merged exports, checkpoints); "
                   "by default it is deleted between rounds")
    g.add_argument("--best-step", action="store_true",
                   help="each round is its job's best evaluated step's adapter, by held-out accuracy (needs "
                   "--eval-every and --checkpoint-every, eval-every a multiple of checkpoint-every); by default "
                   "its final adapter")
    g.add_argument("--benchmark-limit", type=int, default=0, metavar="N",
                   help="benchmark questions per evaluation (default 0: all)")
    g.add_argument("--benchmark-dataset", default="", metavar="DATASET",
                   help="a benchmark that takes a dataset only: the dataset to score on (default: the job's --dataset)")
    g.add_argument("--benchmark-split", default="", metavar="SPLIT", help="with --benchmark-dataset: its split (default test)")


def loop_spec_from_args(args: argparse.Namespace) -> S.LoopSpec:
    """The LoopSpec of `rlvr loops start`'s flags: the job spec from `train_cmd.spec_from_args`
    (its name left empty: rounds are named after the loop), unset flags left unset (the scheduler
    fills the name, the benchmark and the rest in)."""
    job = train_cmd.spec_from_args(args)
    job.name = ""
    spec = S.LoopSpec(name=args.name.strip(), job=job, benchmark=args.benchmark or "",
                      score_column=args.score_column, target=args.target,
                      benchmark_limit=args.benchmark_limit, benchmark_dataset=args.benchmark_dataset,
                      benchmark_dataset_split=args.benchmark_split)
    for field in ("max_rounds", "give_up_after", "min_gain"):
        value = getattr(args, field)
        if value is not None:
            setattr(spec, field, value)
    if args.no_reclaim_storage:
        spec.reclaim_storage = False
    spec.best_step = bool(getattr(args, "best_step", False))
    return spec


# ---------------------------------------------------------------- watching


def watch_loop(client, loop_id: str, out: TextIO | None = None) -> S.Loop | None:  # noqa: ANN001 (SDK client)
    """Follows the loop until it ends and returns the last Loop seen (None if none came). On a
    terminal the whole view redraws in place at every change; on a pipe one progress line per
    change, then the final view. KeyboardInterrupt propagates (the caller detaches)."""
    from rlvr.clients.commands.jobs import terminal_width
    from rlvr.clients.views.jobs import supports_unicode

    out = out or sys.stdout
    width, unicode = terminal_width(out), supports_unicode(out)
    last: S.Loop | None = None
    if out.isatty():
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(file=out, highlight=False)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for loop in client.watch_loop_updates(loop_id):
                last = loop
                live.update(Text(loops_view.render(loop, width=width, unicode=unicode)), refresh=True)
        return last
    previous = ""
    for loop in client.watch_loop_updates(loop_id):
        last = loop
        line = loops_view.progress_line(loop)
        if line != previous:
            print(line, file=out, flush=True)
            previous = line
    if last is not None:
        print("\n" + loops_view.render(last, width=width, unicode=unicode), file=out, flush=True)
    return last


def _watch(client, loop_id: str) -> int:  # noqa: ANN001 (SDK client)
    try:
        last = watch_loop(client, loop_id)
    except KeyboardInterrupt:
        print(f"\ndetached; the loop goes on: `rlvr loops watch {loop_id}` re-attaches, `rlvr loops stop {loop_id}` "
              "stops it", file=sys.stderr)
        return EXIT_DETACHED
    if last is None or not loops_view.is_final(last.status):
        last = client.get_loop(S.GetLoopRequest(id=loop_id))
        if not loops_view.is_final(last.status):
            print(f"error: the watch ended before loop {loop_id} did; `rlvr loops watch {loop_id}` re-attaches",
                  file=sys.stderr)
            return EXIT_FAILED
    return exit_code(last)


# ---------------------------------------------------------------- commands


def _width_unicode() -> tuple[int, bool]:
    from rlvr.clients.commands.jobs import terminal_width
    from rlvr.clients.views.jobs import supports_unicode

    return terminal_width(sys.stdout), supports_unicode(sys.stdout)


def cmd_start(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    resp = client.create_loop(S.CreateLoopRequest(spec=loop_spec_from_args(args), dry_run=args.dry_run))
    spec = resp.resolved_spec if resp.HasField("resolved_spec") else resp.loop.spec
    summary = resp.summary if resp.HasField("summary") else resp.loop.summary
    width, _ = _width_unicode()
    print("\n".join(loops_view.plan_lines(spec, summary, list(resp.warnings), width=width)))
    if args.dry_run:
        print("dry run: the loop is valid; nothing was created")
        return 0
    loop_id = resp.loop.id
    print(f"loop {loop_id} started (`rlvr loops watch {loop_id}` follows it, `rlvr loops stop {loop_id}` stops it)",
          flush=True)
    if args.detach:
        return 0
    return _watch(client, loop_id)


def cmd_list(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    request = S.ListLoopsRequest(limit=args.limit, status=STATUS_CHOICES[args.status] if args.status else 0)
    resp = client.list_loops(request)
    print(loops_view.list_header())
    for loop in resp.loops:
        print(loops_view.list_line(loop))
    shown = f"{len(resp.loops)} of {resp.total}" if resp.total > len(resp.loops) else str(len(resp.loops))
    print(f"{shown} loop(s)")
    return 0


def cmd_show(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    loop = client.get_loop(S.GetLoopRequest(id=args.id))
    width, unicode = _width_unicode()
    print(loops_view.render(loop, width=width, unicode=unicode))
    if loop.spec.benchmark or loop.HasField("summary"):
        print()
        print("\n".join(loops_view.settings_lines(loop.spec, loop.summary, width=width)))
    return 0


def cmd_watch(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    return _watch(client, args.id)


def cmd_stop(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    loop = client.stop_loop(S.StopLoopRequest(id=args.id))
    scored = sum(r.HasField("score") for r in loop.rounds)
    line = f"loop {loop.id} {loops_view.status_word(loop.status).lower()}"
    line += f": {loop.message}" if loop.message else ""
    print(line)
    best = loops_view.best_round(loop)
    kept = f"{scored} scored round(s) kept"
    if best is not None and best.HasField("score"):
        kept += f"; best R{best.index} {loops_view.pct(best.score)}"
        if best.adapter.name:
            kept += f", adapter {best.adapter.name} v{best.adapter.version}"
    print(kept)
    return 0


def cmd_report(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    from rlvr.clients.loop_report import write_loop_report

    loop = client.get_loop(S.GetLoopRequest(id=args.id))
    print(write_loop_report(loop, args.output or f"rlvr-loop-report-{args.id}"))
    return 0


def cmd_export(args: argparse.Namespace, client) -> int:  # noqa: ANN001
    if not args.output or args.output == "-":
        loop = client.get_loop(S.GetLoopRequest(id=args.id))
        sys.stdout.write(loops_view.export_text(loop, args.format))
        return 0
    path = client.export_loop(args.id, args.format, args.output)
    print(f"wrote the rounds of loop {args.id} ({args.format}) to {path}")
    return 0


COMMANDS = {"start": cmd_start, "list": cmd_list, "show": cmd_show, "watch": cmd_watch, "stop": cmd_stop,
            "report": cmd_report, "export": cmd_export}


def cmd_loops(args: argparse.Namespace) -> int:
    from rlvr.clients.errors import explain
    from rlvr.peers.base import RlvrError

    try:
        return COMMANDS[args.loops_command](args, jobs_cmd.scheduler_client(args))
    except RlvrError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 2 if e.code.name == "INVALID_ARGUMENT" else 1
    except (OSError, ValueError) as e:  # a file we cannot write
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted; `rlvr loops {args.loops_command}` can be run again", file=sys.stderr)
        return EXIT_DETACHED


def register(subparsers: argparse._SubParsersAction) -> None:
    loops = subparsers.add_parser("loops", help="automated training loops: train, benchmark, retrain the winner",
                                  description="Automated training loops: each round trains a fresh GRPO adapter on "
                                  "top of the best round so far, benchmarks it, and stops at the target, after the "
                                  "max rounds, or when it plateaus.")
    sub = loops.add_subparsers(dest="loops_command", metavar="COMMAND", required=True)
    start = sub.add_parser("start", help="start a loop (rlvr train's flags plus the loop's) and watch it",
                           description="Start an automated loop: the job spec's flags, as `rlvr train` takes them, "
                           "plus the loop's own. Prints the loop settings beside the Training Summary, then "
                           "watches the loop until it ends.", epilog=EXIT_HELP + ".")
    train_cmd.add_spec_arguments(start, name_help="the loop's name, e.g. 'math-pairs to 35%%'; each round's job "
                                 "is named '<name> R<k>' (default: '<benchmark> to <target>%%')")
    add_loop_arguments(start)
    start.add_argument("--dry-run", action="store_true",
                       help="validate; print the loop settings, the Training Summary and the warnings; create nothing")
    start.add_argument("--detach", action="store_true", help="start the loop and return without watching")
    ls = sub.add_parser("list", help="recent loops, newest first")
    ls.add_argument("--limit", type=int, default=50, help="at most N (default 50)")
    ls.add_argument("--status", choices=sorted(STATUS_CHOICES), default=None, help="only loops in this status")
    show = sub.add_parser("show", help="a loop's header stats, score chart and rounds")
    watch = sub.add_parser("watch", help="follow a loop live until it ends (Ctrl-C detaches)",
                           epilog=EXIT_HELP + ".")
    stop = sub.add_parser("stop", help="stop a loop (its running round's job is cancelled; finished rounds kept)")
    report = sub.add_parser("report", help="write a self-contained HTML report (and the PNG chart) of a loop",
                            description="Writes DIR/report.html (no network needed: inline CSS, the chart "
                            "embedded as PNG) and scores.png next to it; prints the report's path.")
    report.add_argument("-o", "--output", metavar="DIR", default=None,
                        help="output folder (default ./rlvr-loop-report-ID)")
    export = sub.add_parser("export", help="export the rounds as CSV or JSONL, one row per round",
                            description="One row per round: " + ", ".join(loops_view.EXPORT_COLUMNS) + ".")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="csv", help="csv (default) or jsonl")
    export.add_argument("-o", "--output", metavar="PATH", default=None,
                        help="file (or folder) to write; default: standard output")
    for p in (show, watch, stop, report, export):
        p.add_argument("id", help="loop id")
    for p in (start, ls, show, watch, stop, report, export):
        p.add_argument("--address", default=None, help="scheduler HOST:PORT (default RLVR_SCHEDULER_ADDRESS)")
        p.set_defaults(handler=cmd_loops)
