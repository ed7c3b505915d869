"""Evaluations: the list, an evaluation's detail page (the overall score and the four tiles:
accuracy, accuracy strict, format, answered; the per-question Detailed Results, filtered to the
wrong answers on request, a page at a time, an episode's turn by turn; against another evaluation of the same questions, the
gain with its paired test) and the leaderboard of a benchmark, from the benchmark service; the one
action is Cancel, on a queued or running evaluation's page. Every page works without JavaScript (a
running evaluation reloads itself)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlvr.clients.commands.eval import episodes_line
from rlvr.clients.compare import NotComparable, compare_evaluations
from rlvr.clients.views import episodes as episodes_view
from rlvr.clients.web import views
from rlvr.clients.web.console import Console, see_other
from rlvr.scores import DEFINITIONS
from rlvr.v1 import benchmark_pb2 as B

RESULTS_PAGE = 20


def _int(request: Request, name: str, default: int) -> int:
    try:
        return max(1, int(request.query_params.get(name, default)))
    except ValueError:
        return default


def routes(console: Console) -> list[Route]:
    benchmark = console.sdk.benchmark

    def list_page(request: Request) -> Response:
        name = request.query_params.get("benchmark", "")
        evaluations = benchmark.list_evaluations(B.ListEvaluationsRequest(benchmark=name, limit=100)).evaluations
        benchmarks = benchmark.list_benchmarks().benchmarks
        rows = [{"ev": ev, "status": views.eval_status(ev.status), "policy": views.policy(ev),
                 "created": views.when(ev.created_at)} for ev in evaluations]
        running = any(ev.status not in views.FINAL_EVAL for ev in evaluations)
        return console.page(request, "evals.html", {"rows": rows, "benchmarks": benchmarks, "chosen": name,
                                                    "reload": 10 if running else 0}, active="evals")

    def paired(ev: B.Evaluation, chosen: str) -> dict[str, object] | None:
        """The Compare section: the other completed evaluations of the same questions, and this one
        against the chosen (default: the newest base-model one, when this is an adapter's)."""
        if ev.status != B.EVALUATION_STATUS_COMPLETED or not ev.question_set:
            return None
        listed = benchmark.list_evaluations(B.ListEvaluationsRequest(benchmark=ev.benchmark, limit=500)).evaluations
        peers = [e for e in listed if e.id != ev.id and e.question_set == ev.question_set
                 and e.status == B.EVALUATION_STATUS_COMPLETED]
        if not peers:
            return None
        if not chosen and ev.adapter_name:
            chosen = next((e.id for e in peers if not e.adapter_name), "")
        section: dict[str, object] = {"peers": [(e.id, f"{views.policy(e)}{' · ' + e.label if e.label else ''} "
                                                        f"({e.scores.accuracy:.1%}, {e.id})") for e in peers],
                                      "chosen": chosen, "error": "", "c": None, "other": None, "other_policy": ""}
        if chosen:
            try:
                other, _, comparison = compare_evaluations(benchmark, chosen, ev.id)
            except NotComparable as e:
                section["error"] = str(e)
            else:
                section.update(other=other, other_policy=views.policy(other), c=comparison)
        return section

    def eval_page(request: Request) -> Response:
        eval_id = request.path_params["eval_id"]
        ev = benchmark.get_evaluation(B.GetEvaluationRequest(id=eval_id))
        wrong = request.query_params.get("wrong", "") in ("1", "true", "on")
        page = _int(request, "page", 1)
        resp = benchmark.get_evaluation_results(B.GetEvaluationResultsRequest(
            id=eval_id, only_wrong=wrong, offset=(page - 1) * RESULTS_PAGE, limit=RESULTS_PAGE))
        infos = {b.name: b for b in benchmark.list_benchmarks().benchmarks}
        info = infos.get(ev.benchmark)
        final = ev.status in views.FINAL_EVAL
        episodes = ev.HasField("environment")  # each row an episode: shown turn by turn
        turns_of = [views.completion_turns(r.completion, episodes, r.episode) for r in resp.results]
        return console.page(request, "eval.html", {
            "ev": ev, "status": views.eval_status(ev.status), "policy": views.policy(ev), "final": final,
            "display_name": info.display_name if info else ev.benchmark, "tiles": views.eval_tiles(ev.scores),
            "results": resp.results, "total": resp.total, "wrong": wrong, "page": page,
            "pages": max(1, -(-resp.total // RESULTS_PAGE)), "first": (page - 1) * RESULTS_PAGE + 1,
            "finish_reason": views.finish_reason, "when": views.when, "reload": 0 if final else 5,
            "definitions": [(title, DEFINITIONS[key]) for key, title in views.EVAL_TILES],
            "paired": paired(ev, request.query_params.get("compare", "")),
            "episodes_line": episodes_line(ev),  # an evaluation with an environment: its counters
            "turns_of": turns_of, "entry_heading": views.entry_heading,
            "endings": [episodes_view.ending(r.episode) for r in resp.results],
        }, active="evals")

    def leaderboard(request: Request) -> Response:
        benchmarks = list(benchmark.list_benchmarks().benchmarks)
        name = request.query_params.get("benchmark") or (benchmarks[0].name if benchmarks else "")
        column = request.query_params.get("column", "")
        resp = benchmark.get_leaderboard(B.GetLeaderboardRequest(benchmark=name, score_column=column, limit=50))
        info = next((b for b in benchmarks if b.name == resp.benchmark), None)
        columns = list(info.score_columns) if info else [k for k, _ in views.EVAL_TILES]
        titles = dict(views.EVAL_TILES)
        return console.page(request, "leaderboard.html", {
            "benchmarks": benchmarks, "resp": resp, "columns": columns, "titles": titles,
            "display_name": info.display_name if info else resp.benchmark, "policy": views.policy,
            "when": views.when}, active="leaderboard")

    async def cancel(request: Request) -> Response:
        await console.form(request)
        eval_id = request.path_params["eval_id"]
        await run_in_threadpool(benchmark.cancel_evaluation, B.CancelEvaluationRequest(id=eval_id))
        return see_other(f"/evals/{eval_id}")

    return [
        Route("/evals", list_page),
        Route("/evals/{eval_id}", eval_page),
        Route("/evals/{eval_id}/cancel", cancel, methods=["POST"]),
        Route("/leaderboard", leaderboard),
    ]
