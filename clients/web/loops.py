"""Training Loops: the list and the Training Loop detail page as the spec describes it (header stats:
best score with its gain over round 1, target, rounds run of the max, elapsed; a bar chart per
round; one row per round with its job link, duration, score, the delta arrow against the previous
scored round and the BEST badge), live while the loop runs, with Stop and the rounds' export; once
it ends, the best round against the baseline question by question (the paired test).
Every figure is the scheduler's, shown through clients/views/loops.py and clients/loop_report.py.
"""

from __future__ import annotations

from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlvr.clients.compare import NotComparable, compare_evaluations
from rlvr.clients.views import loops as loops_view
from rlvr.clients.web import live, views
from rlvr.clients.web.console import Console, see_other
from rlvr.peers.base import RlvrError
from rlvr.v1 import scheduler_pb2 as S

PAGE_SIZE = 20
REGIONS = ("loop-status", "loop-tiles", "loop-chart", "loop-rounds")


def routes(console: Console) -> list[Route]:
    scheduler = console.sdk.scheduler

    def context(loop: S.Loop, csrf_token: str) -> dict[str, Any]:
        return {"loop": loop, "status_word": loops_view.status_word(loop.status),
                "status_key": loops_view.status_key(loop.status), "final": loops_view.is_final(loop.status),
                "tiles": views.loop_tiles(loop), "chart": views.loop_chart(loop), "rounds": views.round_views(loop),
                "settings": views.loop_settings(loop), "summary": views.summary(loop.summary),
                "csrf_token": csrf_token}

    def regions(loop: S.Loop, csrf_token: str) -> dict[str, str]:
        ctx = context(loop, csrf_token)
        return {region: console.fragment(f"loop/_{region.replace('-', '_')}.html", ctx) for region in REGIONS}

    def list_page(request: Request) -> Response:
        page = max(1, int(request.query_params.get("page", "1") or 1))
        resp = scheduler.list_loops(S.ListLoopsRequest(limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE))
        rows = [{"loop": loop, "status_word": loops_view.status_word(loop.status),
                 "status_key": loops_view.status_key(loop.status),
                 "best": loops_view.pct(loop.best_score) if loop.HasField("best_score") else "–",
                 "target": loops_view.target_text(loop.spec.target) if loop.spec.target else "–",
                 "rounds": f"{len(loop.rounds)} of {loop.spec.max_rounds}" if loop.spec.max_rounds
                 else str(len(loop.rounds)),
                 "elapsed": loops_view.duration(loop.elapsed_seconds)} for loop in resp.loops]
        running = any(not loops_view.is_final(loop.status) for loop in resp.loops)
        return console.page(request, "loops.html", {
            "rows": rows, "total": resp.total, "page": page, "pages": max(1, -(-resp.total // PAGE_SIZE)),
            "reload": 10 if running else 0}, active="loops")

    def best_against_baseline(loop: S.Loop) -> dict[str, Any] | None:
        """The best round's evaluation against the baseline's, question by question (a finished loop)."""
        best = next((r for r in loop.rounds if r.index == loop.best_round), None)
        if best is None or not best.evaluation_id or not loop.baseline_evaluation_id:
            return None
        try:
            _, _, comparison = compare_evaluations(console.sdk.benchmark, loop.baseline_evaluation_id,
                                                   best.evaluation_id)
        except (NotComparable, RlvrError) as e:
            return {"round": best.index, "evaluation_id": best.evaluation_id, "c": None, "error": str(e)}
        return {"round": best.index, "evaluation_id": best.evaluation_id, "c": comparison, "error": ""}

    def loop_page(request: Request) -> Response:
        loop_id = request.path_params["loop_id"]
        loop = scheduler.get_loop(S.GetLoopRequest(id=loop_id))
        ctx = context(loop, request.state.csrf_token)
        ctx["paired"] = best_against_baseline(loop) if ctx["final"] else None
        if not ctx["final"]:
            ctx["live_url"] = f"/loops/{loop_id}/events"
            ctx["refresh"] = 10
        return console.page(request, "loop.html", ctx, active="loops")

    async def loop_events(request: Request) -> Response:
        loop_id = request.path_params["loop_id"]
        token = request.state.csrf_token
        await run_in_threadpool(scheduler.get_loop, S.GetLoopRequest(id=loop_id))  # NOT_FOUND first
        events = live.loop_events(loop_id, console.stream_client,
                                  read=lambda: scheduler.get_loop(S.GetLoopRequest(id=loop_id)),
                                  render=lambda loop: regions(loop, token), is_final=loops_view.is_final)
        return EventSourceResponse(events, ping=15)

    def export(request: Request) -> Response:
        loop_id, fmt = request.path_params["loop_id"], request.path_params["fmt"]
        if fmt not in ("csv", "jsonl"):
            raise HTTPException(404, f"no export format {fmt!r}; csv or jsonl")
        loop = scheduler.get_loop(S.GetLoopRequest(id=loop_id))
        media = "text/csv" if fmt == "csv" else "application/x-ndjson"
        return Response(loops_view.export_text(loop, fmt), media_type=media,
                        headers={"content-disposition": f'attachment; filename="loop-{loop_id}-rounds.{fmt}"'})

    async def stop(request: Request) -> Response:
        await console.form(request)
        loop_id = request.path_params["loop_id"]
        await run_in_threadpool(scheduler.stop_loop, S.StopLoopRequest(id=loop_id))
        return see_other(f"/loops/{loop_id}")

    return [
        Route("/loops", list_page),
        Route("/loops/{loop_id}", loop_page),
        Route("/loops/{loop_id}/events", loop_events),
        Route("/loops/{loop_id}/rounds.{fmt}", export),
        Route("/loops/{loop_id}/stop", stop, methods=["POST"]),
    ]
