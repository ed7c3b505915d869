"""`rlvr eval ...`: run a benchmark on the base model or an adapter with a live progress bar, show an
evaluation's score tiles and per-question results, export them, list, cancel or delete evaluations,
the leaderboard of a benchmark, and compare two evaluations of the same questions (paired). Talks to
the benchmark service through the SDK (address from RLVR_BENCHMARK_ADDRESS or --address).

Flags left out stay unset in the request, so the service applies its documented defaults (greedy,
256 tokens, the whole benchmark) in one place.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.clients.compare import results
from rlvr.jobspec import MAX_COMPLETION
from rlvr.scores import DEFINITIONS, SCORE_COLUMNS, TITLES
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C

if TYPE_CHECKING:  # imported lazily at run time: `rlvr --help` must not pay for rich and grpc
    from rich.console import Console, RenderableType

    from rlvr.clients.sdk import BenchmarkClient

TILES = [(column, TITLES[column]) for column in SCORE_COLUMNS]  # rlvr/scores.py: the one definition
EXPORT_FIELDS = ["index", "prompt", "ground_truth", "completion", "extracted_answer", "reward", "accuracy",
                 "format", "strict", "finish_reason", "episode"]
BAD_INPUT = ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION")
FINAL = (B.EVALUATION_STATUS_COMPLETED, B.EVALUATION_STATUS_FAILED, B.EVALUATION_STATUS_CANCELLED)


def _client(args: argparse.Namespace) -> BenchmarkClient:
    from rlvr.clients.sdk import BenchmarkClient, ClientSettings

    settings = ClientSettings(benchmark_address=args.address) if args.address else ClientSettings()
    return BenchmarkClient(settings.benchmark_address, auth=settings.auth("benchmark"))


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def status_name(value: int) -> str:
    return B.EvaluationStatus.Name(value).removeprefix("EVALUATION_STATUS_").lower()


def parse_adapter(text: str) -> C.AdapterSelector:
    """NAME or NAME:VERSION (the version must be the live one; 0 or none = live)."""
    name, _, version = text.rpartition(":")
    if name and version.isdigit():
        return C.AdapterSelector(name=name, version=int(version))
    return C.AdapterSelector(name=text)


def run_request(args: argparse.Namespace) -> B.RunEvaluationRequest:
    request = B.RunEvaluationRequest(benchmark=args.benchmark, model=args.model, limit=args.limit, seed=args.seed,
                                     dataset=args.dataset, dataset_split=args.split, label=args.label,
                                     adapter_path=str(Path(args.adapter_path).resolve()) if args.adapter_path else "")
    if args.adapter:
        request.adapter.CopyFrom(parse_adapter(args.adapter))
    if args.temperature is not None:
        request.sampling.temperature = args.temperature
    if args.top_p is not None:
        request.sampling.top_p = args.top_p
    for control in ("top_k", "min_p", "repetition_penalty"):
        if getattr(args, control) is not None:
            setattr(request.sampling, control, getattr(args, control))
    if args.max_tokens is not None:
        request.sampling.max_tokens = args.max_tokens
    if args.environment:
        request.environment.key = args.environment
        request.environment.max_turns = args.max_turns
        request.environment.max_episode_tokens = args.max_episode_tokens
        for pair in args.environment_setting:
            key, sep, value = pair.partition("=")
            if not sep:
                raise SystemExit(f"error: --environment-setting {pair!r}: want KEY=VALUE")
            request.environment.settings[key] = value
    return request


def episodes_line(ev: B.Evaluation) -> str:
    """An evaluation with an environment: its environment and its episodes' counters, in one line."""
    if not ev.HasField("environment"):
        return ""
    e, n = ev.environment, ev.episodes
    return (f"environment {e.key} v{e.version} (max {e.max_turns} turns, {e.max_episode_tokens} tokens an episode): "
            f"{n.episodes} episodes, {n.turns_mean:.2f} turns each, {n.tool_calls} tool calls ({n.tool_errors} "
            f"errors), {n.failed_episodes} failed, {n.truncated_episodes} cut short")


def tiles(scores: B.ScoreBreakdown) -> RenderableType:
    """The spec's score tiles: the overall score (the benchmark's default column), then each column."""
    from rich.columns import Columns
    from rich.panel import Panel

    cards = [Panel(f"[bold]{scores.score:.1%}[/bold]", title=f"Score ({scores.score_column})", expand=False)]
    cards += [Panel(f"[bold]{getattr(scores, key):.1%}[/bold]", title=title, expand=False) for key, title in TILES]
    return Columns(cards)


def headline(ev: B.Evaluation) -> str:
    policy = f"{ev.model} + {ev.adapter_name} v{ev.adapter_version}" if ev.adapter_name else ev.model
    label = f"  label {ev.label!r}" if ev.label else ""
    environment = f"  environment {ev.environment.key} v{ev.environment.version}" if ev.environment.key else ""
    return (f"evaluation {ev.id}  {ev.benchmark}  {policy}  {status_name(ev.status)}  "
            f"{ev.questions_done}/{ev.questions_total} questions{environment}{label}")


def watch(client: BenchmarkClient, evaluation_id: str) -> B.Evaluation:
    """A progress bar following WatchEvaluation to the end; returns the final evaluation."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    with Progress(*columns, console=_console()) as bar:
        task = bar.add_task(f"evaluation {evaluation_id}", total=None, stats="queued")
        for event in client.watch_evaluation(B.WatchEvaluationRequest(id=evaluation_id)):
            stats = status_name(event.status)
            if event.questions_done:
                stats += f"  accuracy {event.scores.accuracy:.1%}"
            bar.update(task, completed=event.questions_done, total=event.questions_total or None, stats=stats)
            if event.status in FINAL:
                break
    return client.get_evaluation(B.GetEvaluationRequest(id=evaluation_id))


def cmd_run(args: argparse.Namespace, client: BenchmarkClient) -> int:
    ev = client.run_evaluation(run_request(args))
    console = _console()
    console.print(headline(ev))
    if args.detach:
        return 0
    try:
        ev = watch(client, ev.id)
    except KeyboardInterrupt:
        console.print(f"detached; the evaluation goes on (`rlvr eval show {ev.id}`)")
        return 130
    console.print(headline(ev))
    if ev.status == B.EVALUATION_STATUS_FAILED:
        print(f"error: evaluation failed: {ev.error}", file=sys.stderr)
        return 1
    if ev.status == B.EVALUATION_STATUS_CANCELLED:
        print(f"error: evaluation cancelled after {ev.questions_done} of {ev.questions_total} questions",
              file=sys.stderr)
        return 1
    console.print(tiles(ev.scores))
    if ev.HasField("environment"):
        console.print(episodes_line(ev))
    console.print(f"generate {ev.generate_seconds:.1f} s, score {ev.score_seconds:.1f} s")
    return 0


def _short(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def cmd_show(args: argparse.Namespace, client: BenchmarkClient) -> int:
    from rich.table import Table

    ev = client.get_evaluation(B.GetEvaluationRequest(id=args.id))
    console = _console()
    console.print(headline(ev))
    if ev.error:
        console.print(f"error: {ev.error}")
    console.print(tiles(ev.scores))
    if ev.HasField("environment"):
        console.print(episodes_line(ev))
    resp = client.get_evaluation_results(B.GetEvaluationResultsRequest(id=args.id, only_wrong=args.wrong,
                                                                       limit=args.rows))
    title = "Detailed Results" + (" (wrong answers)" if args.wrong else "")
    legend = "  ".join(f"{short}: {DEFINITIONS[key]}" for short, key in
                       (("Ok", "accuracy"), ("Strict", "accuracy_strict"), ("Fmt", "format"), ("End", "answered")))
    table = Table(title=title, title_justify="left", caption=legend, caption_justify="left")
    for name in ("#", "Prompt", "Truth", "Answer", "Ok", "Strict", "Fmt", "End", "Completion"):
        table.add_column(name, overflow="fold")
    for r in resp.results:
        table.add_row(str(r.index), _short(r.prompt, 60), _short(r.ground_truth, 16), _short(r.extracted_answer, 16),
                      "✓" if r.accuracy >= 1 else "✗", "✓" if r.strict else "", "✓" if r.format >= 1 else "",
                      C.FinishReason.Name(r.finish_reason).removeprefix("FINISH_REASON_").lower(),
                      _short(r.completion, 120))
    console.print(table)
    if args.turns:  # each episode turn by turn: every assistant turn, tool call and reply in full
        from rich.markup import escape

        for r in resp.results:
            console.print(f"\n[bold]question {r.index}[/bold] (truth {escape(r.ground_truth)}, answer "
                          f"{escape(r.extracted_answer) or '-'}, {'right' if r.accuracy >= 1 else 'wrong'})")
            console.print(escape(r.completion))
    elif ev.HasField("environment"):
        console.print("--turns shows each episode turn by turn")
    if resp.total > len(resp.results):
        console.print(f"{resp.total - len(resp.results)} more; --rows 0 shows all, `rlvr eval export` writes them")
    return 0


def export_row(r: B.QuestionResult) -> dict[str, str | int | float | bool]:
    row: dict[str, str | int | float | bool] = {name: getattr(r, name) for name in EXPORT_FIELDS}
    row["finish_reason"] = C.FinishReason.Name(r.finish_reason).removeprefix("FINISH_REASON_")
    return row


def cmd_export(args: argparse.Namespace, client: BenchmarkClient) -> int:
    client.get_evaluation(B.GetEvaluationRequest(id=args.id))  # NOT_FOUND before a file is created
    target = Path(args.output)
    fmt = args.format or ("jsonl" if target.suffix.lower() in (".jsonl", ".json") else "csv")
    count = 0
    with target.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=EXPORT_FIELDS) if fmt == "csv" else None
        if writer is not None:
            writer.writeheader()
        for result in results(client, args.id, args.wrong):
            row = export_row(result)
            if writer is not None:
                writer.writerow(row)
            else:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    print(f"wrote {count} result(s) of evaluation {args.id} to {target} ({fmt})")
    return 0


def cmd_list(args: argparse.Namespace, client: BenchmarkClient) -> int:
    from rich.table import Table

    resp = client.list_evaluations(B.ListEvaluationsRequest(benchmark=args.benchmark, limit=args.limit,
                                                            offset=args.offset))
    table = Table(title="Evaluations", title_justify="left")
    table.add_column("ID", no_wrap=True, min_width=12)  # ids are what the other commands take: never cut
    for name in ("Benchmark", "Policy", "Status", "Score", "Done", "Created", "Label"):
        table.add_column(name, overflow="fold")
    for ev in resp.evaluations:
        policy = f"{ev.adapter_name} v{ev.adapter_version}" if ev.adapter_name else Path(ev.model).name or ev.model
        created = ev.created_at.ToDatetime().strftime("%m-%d %H:%M")
        table.add_row(ev.id, ev.benchmark, policy, status_name(ev.status), f"{ev.scores.score:.1%}",
                      f"{ev.questions_done}/{ev.questions_total}", created, ev.label)
    _console().print(table)
    shown = f"{args.offset + 1}-{args.offset + len(resp.evaluations)} of " if resp.evaluations else ""
    print(f"{shown}{resp.total} evaluation(s)")
    return 0


def cmd_cancel(args: argparse.Namespace, client: BenchmarkClient) -> int:
    ev = client.cancel_evaluation(B.CancelEvaluationRequest(id=args.id))
    if ev.status != B.EVALUATION_STATUS_CANCELLED:  # its end not stored within the service's wait
        print(f"evaluation {ev.id} is being cancelled ({status_name(ev.status)} still); "
              f"`rlvr eval show {ev.id}` follows it")
        return 0
    print(f"evaluation {ev.id} cancelled after {ev.questions_done} of {ev.questions_total} questions; "
          f"their results are kept (`rlvr eval delete {ev.id}` removes them)")
    return 0


def cmd_delete(args: argparse.Namespace, client: BenchmarkClient) -> int:
    resp = client.delete_evaluation(B.DeleteEvaluationRequest(id=args.id))
    print(f"evaluation {resp.id} deleted with its {resp.results_deleted} per-question result(s)")
    return 0


def cmd_leaderboard(args: argparse.Namespace, client: BenchmarkClient) -> int:
    """One table per question set (GetLeaderboard ranks only evaluations over the same questions),
    the score with its standard error, the numbers right-aligned under their headers."""
    from rich.table import Table

    resp = client.get_leaderboard(B.GetLeaderboardRequest(benchmark=args.benchmark, score_column=args.column,
                                                          limit=args.limit, question_set=args.question_set))
    titles = dict(TILES)
    console = _console()
    if not resp.entries:
        console.print(f"No completed evaluation of {resp.benchmark} yet.")
        return 0
    for question_set in resp.question_sets:
        table = Table(title=f"Leaderboard: {resp.benchmark}, by {resp.score_column}: {question_set.description} "
                            f"(n = {question_set.questions}, set {question_set.id})", title_justify="left")
        table.add_column("Rank", justify="right", no_wrap=True)
        table.add_column(f"{titles[resp.score_column]} ± SE", justify="right", no_wrap=True)
        for key, title in TILES:
            if key != resp.score_column:
                table.add_column(title, justify="right", no_wrap=True)
        table.add_column("Adapter", overflow="fold")
        table.add_column("Label", overflow="fold")
        table.add_column("Evaluation", no_wrap=True, min_width=12)
        for e in (e for e in resp.entries if e.question_set == question_set.id):
            others = [f"{getattr(e.scores, k):.1%}" for k, _ in TILES if k != resp.score_column]
            adapter = f"{e.adapter_name} v{e.adapter_version}" if e.adapter_name else "(base)"
            score = f"{getattr(e.scores, resp.score_column):.1%} ± {100 * e.standard_error:.1f}"
            table.add_row(str(e.rank), score, *others, adapter, e.label, e.evaluation_id)
        console.print(table)
    if len(resp.question_sets) > 1:
        console.print("Scores are ranked only against evaluations over the same questions; ± is one standard "
                      "error in points.")
    return 0


def cmd_compare(args: argparse.Namespace, client: BenchmarkClient) -> int:
    from rlvr.clients.compare import NotComparable, compare_evaluations, summary_lines

    try:
        before, after, comparison = compare_evaluations(client, args.before, args.after)
    except NotComparable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(before, after, comparison)))
    return 0


def cmd_benchmarks(args: argparse.Namespace, client: BenchmarkClient) -> int:
    for b in client.list_benchmarks().benchmarks:
        size = f"{b.size} questions" if b.size else "size of the dataset"
        print(f"{b.name:<26}{b.display_name} ({size}; score = {b.default_score_column})\n{'':<26}{b.description}")
    return 0


def _handler(command: Callable[[argparse.Namespace, BenchmarkClient], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from rlvr.clients.errors import explain
        from rlvr.clients.sdk import RlvrError

        client = _client(args)
        try:
            return command(args, client)
        except RlvrError as e:
            print(f"error: {explain(e)}", file=sys.stderr)
            return 2 if e.code.name in BAD_INPUT else 1
        except OSError as e:  # export: the output file
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            client.close()

    return handler


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("eval", help="evaluations: run a benchmark, show, export, list, cancel, delete, "
                                               "leaderboard")

    def usage(args: argparse.Namespace) -> int:
        group.print_help(sys.stderr)
        return 2

    group.set_defaults(handler=usage)
    sub = group.add_subparsers(title="commands", metavar="COMMAND")
    run = sub.add_parser("run", help="evaluate the base model or an adapter on a benchmark, with a progress bar")
    run.add_argument("--benchmark", required=True, help="rlvr-math-pairs-heldout, gsm8k, boxed, or any reward's "
                                                        "benchmark (`rlvr eval benchmarks` lists them)")
    run.add_argument("--model", default="", help="base model; must be the rollout service's (default: that one)")
    run.add_argument("--adapter", default="", metavar="NAME[:VERSION]", help="an adapter on the rollout service")
    run.add_argument("--adapter-path", default="", help="a local PEFT folder to upload as --adapter's next version")
    run.add_argument("--limit", type=int, default=0, help="the first N questions (default: all)")
    run.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    run.add_argument("--temperature", type=float, default=None, help="0-2 (default 0: greedy)")
    run.add_argument("--top-p", type=float, default=None, help="(0, 1] (default 1)")
    run.add_argument("--top-k", type=int, default=None, help="0-1000 (default 0: off)")
    run.add_argument("--min-p", type=float, default=None, help="0-1 (default 0: off)")
    run.add_argument("--repetition-penalty", type=float, default=None, help="(0, 2] (default 1: off)")
    run.add_argument("--max-tokens", type=int, default=None, help=f"{MAX_COMPLETION.text()} (default {MAX_COMPLETION.default})")
    run.add_argument("--dataset", default="", help="a benchmark that takes a dataset (boxed, a plugin's): hub "
                                                   "dataset or local file (prompt, ground_truth, its columns); "
                                                   "reasoning_gym: a task name")
    run.add_argument("--split", default="", help="with --dataset: its split (default test)")
    run.add_argument("--label", default="", help="a label shown on the leaderboard")
    run.add_argument("--detach", action="store_true", help="start it and return without watching")
    run.add_argument("--environment", default="", metavar="KEY", help="run each question as an episode in this "
                     "environment (its tools and replies; `rlvr environments` lists them); --max-tokens caps each turn")
    run.add_argument("--environment-setting", action="append", default=[], metavar="KEY=VALUE",
                     help="with --environment: one of its settings (repeat for more)")
    run.add_argument("--max-turns", type=int, default=0, help="with --environment: assistant turns per episode, "
                     "1-64 (default: the environment's own)")
    run.add_argument("--max-episode-tokens", type=int, default=0, help="with --environment: a whole episode's tokens, "
                     "64-32768 (default 4 x --max-tokens)")
    run.set_defaults(handler=_handler(cmd_run))
    show = sub.add_parser("show", help="an evaluation's score tiles and per-question results")
    show.add_argument("id")
    show.add_argument("--wrong", action="store_true", help="only the questions answered wrong")
    show.add_argument("--rows", type=int, default=50, help="rows of the results table (0 = all; default 50)")
    show.add_argument("--turns", action="store_true", help="an evaluation with an environment: each question's "
                      "episode turn by turn (assistant turns, tool calls and results, the environment's replies)")
    show.set_defaults(handler=_handler(cmd_show))
    export = sub.add_parser("export", help="write the per-question results as CSV or JSONL")
    export.add_argument("id")
    export.add_argument("-o", "--output", required=True, help="the file to write")
    export.add_argument("--format", choices=["csv", "jsonl"], default=None, help="default: from the file suffix")
    export.add_argument("--wrong", action="store_true", help="only the questions answered wrong")
    export.set_defaults(handler=_handler(cmd_export))
    ls = sub.add_parser("list", help="recent evaluations")
    ls.add_argument("--benchmark", default="", help="only this benchmark")
    ls.add_argument("--limit", type=int, default=0, help="at most N, up to 500 (default 100)")
    ls.add_argument("--offset", type=int, default=0, help="skip the N newest (paging; default 0)")
    ls.set_defaults(handler=_handler(cmd_list))
    cancel = sub.add_parser("cancel", help="cancel a queued or running evaluation (the results scored so far are "
                                           "kept)")
    cancel.add_argument("id")
    cancel.set_defaults(handler=_handler(cmd_cancel))
    delete = sub.add_parser("delete", help="delete a finished evaluation and its per-question results")
    delete.add_argument("id")
    delete.set_defaults(handler=_handler(cmd_delete))
    board = sub.add_parser("leaderboard", help="completed evaluations of a benchmark, best first")
    board.add_argument("benchmark")
    board.add_argument("--column", default="", help="accuracy, accuracy_strict, format or answered")
    board.add_argument("--limit", type=int, default=0, help="at most N per question set (default 50)")
    board.add_argument("--question-set", default="", help="only this question set (an id the tables show)")
    board.set_defaults(handler=_handler(cmd_leaderboard))
    benchmarks = sub.add_parser("benchmarks", help="the benchmarks, their sizes and score columns")
    benchmarks.set_defaults(handler=_handler(cmd_benchmarks))
    comp = sub.add_parser("compare", help="two evaluations of the same questions: the gain, its standard error and "
                                          "a paired test (McNemar's) of whether it is real")
    comp.add_argument("before", help="the evaluation to compare against (e.g. the base model's)")
    comp.add_argument("after", help="the evaluation compared (e.g. the trained adapter's)")
    comp.set_defaults(handler=_handler(cmd_compare))
    for parser in (run, show, export, ls, cancel, delete, board, benchmarks, comp):
        parser.add_argument("--address", default=None, help="benchmark HOST:PORT (default RLVR_BENCHMARK_ADDRESS)")
