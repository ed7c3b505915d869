"""The jobs pages: the list (status, progress, a reward/accuracy sparkline) and an RLVR job's detail
page (the RL Metrics card above the Actions panel and the Completions card, a few sampled
completions of the latest steps with episodes turn by turn; the Training Summary beside them), live while
the job runs, with the actions: Download Adapter (a zip), Merge Model (with progress), Export
History (CSV / JSONL) and Cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rlvr.clients.errors import explain
from rlvr.clients.views.jobs import no_reward
from rlvr.clients.web import live, views
from rlvr.clients.web.console import Console, see_other
from rlvr.clients.web.downloads import zip_stream
from rlvr.peers.base import RlvrError
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

PAGE_SIZE = 20
REGIONS = ("job-status", "rl-metrics", "actions", "completions", "job-details")
SAMPLE_STEPS = 3  # the Completions card's steps (GetJobSamples' latest)


def tracking_rows(job: C.Job) -> list[dict[str, Any]]:
    """The Details card's "Tracked in" rows: each tracker, where it logs (a link when that is a
    web address: an MLflow server's run page), and how far it got or why it is not logging."""
    from rlvr.tracking.config import kind_name

    rows = []
    for link in job.tracking:
        state = f"not logging: {link.error}" if link.error else \
            f"{link.steps_logged} step{'' if link.steps_logged == 1 else 's'} logged{', finished' if link.finished else ''}"
        url = link.location if link.location.startswith(("http://", "https://")) else ""
        rows.append({"kind": kind_name(link.kind), "location": link.location, "url": url, "state": state,
                     "error": bool(link.error)})
    return rows


def routes(console: Console) -> list[Route]:
    scheduler = console.sdk.scheduler

    def read(job_id: str) -> tuple[C.Job, S.JobMetrics]:
        return (scheduler.get_job(S.GetJobRequest(id=job_id)),
                scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job_id)))

    def samples(job: C.Job, metrics: S.JobMetrics) -> dict[str, Any]:
        """The Completions card: the latest steps' samples (none asked before a step is stored); a
        failed read is said in the card, the rest of the page shows as ever."""
        if not metrics.has_steps or no_reward(metrics):  # an SFT or Head job samples no completions
            return {"samples": [], "samples_error": "", "environment": job.spec.environment.key}
        try:
            resp = scheduler.get_job_samples(S.GetJobSamplesRequest(job_id=job.id, limit=SAMPLE_STEPS))
        except RlvrError as e:
            return {"samples": [], "samples_error": explain(e), "environment": job.spec.environment.key}
        return {"samples": views.samples_view(resp), "samples_error": "",
                "environment": resp.environment or job.spec.environment.key}

    def context(job: C.Job, metrics: S.JobMetrics, csrf_token: str) -> dict[str, Any]:
        current, total = views.progress(job)
        return {"job": job, "status": views.job_status(job.status), "final": views.is_final_job(job),
                "current": current, "total": total, "metrics": views.metrics_view(metrics),
                "has_steps": metrics.has_steps, "summary": views.summary(job.summary), "when": views.when,
                "csrf_token": csrf_token, "tracking": tracking_rows(job), "entry_heading": views.entry_heading,
                **samples(job, metrics)}

    def regions(job: C.Job, metrics: S.JobMetrics, csrf_token: str) -> dict[str, str]:
        ctx = context(job, metrics, csrf_token)
        return {region: console.fragment(f"job/_{region.replace('-', '_')}.html", ctx) for region in REGIONS}

    def list_page(request: Request) -> Response:
        page = max(1, int(request.query_params.get("page", "1") or 1))
        resp = scheduler.list_jobs(S.ListJobsRequest(limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE))

        def metrics_of(job: C.Job) -> S.JobMetrics | None:
            try:
                return scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job.id))
            except RlvrError:
                return None

        with ThreadPoolExecutor(max_workers=8) as pool:
            sparks = list(pool.map(lambda job: views.sparkline(metrics_of(job)), resp.jobs))
        rows = [{"job": job, "status": views.job_status(job.status), "spark": spark,
                 "current": job.current_step, "total": max(job.total_steps, 0), "created": views.when(job.created_at)}
                for job, spark in zip(resp.jobs, sparks, strict=True)]
        running = any(not views.is_final_job(job) for job in resp.jobs)
        return console.page(request, "jobs.html", {
            "rows": rows, "total": resp.total, "page": page, "pages": max(1, -(-resp.total // PAGE_SIZE)),
            "reload": 10 if running else 0}, active="jobs")

    def job_page(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job, metrics = read(job_id)
        ctx = context(job, metrics, request.state.csrf_token)
        if not ctx["final"]:
            ctx["live_url"] = f"/jobs/{job_id}/events?since={views.job_fingerprint(job, metrics)}"
            ctx["refresh"] = 10  # without JavaScript: <noscript> reloads the page
        return console.page(request, "job.html", ctx, active="jobs")

    async def job_events(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        token = request.state.csrf_token
        await run_in_threadpool(scheduler.get_job, S.GetJobRequest(id=job_id))  # NOT_FOUND before streaming
        events = live.job_events(
            job_id, request.query_params.get("since", ""), console.stream_client,
            read=lambda: read(job_id), render=lambda job, metrics: regions(job, metrics, token),
            fingerprint=views.job_fingerprint, is_final=views.is_final_job)
        return EventSourceResponse(events, ping=15)

    def _zip(request: Request, stream_of: Any, what: str) -> Response:
        job_id = request.path_params["job_id"]
        chunks = stream_of(job_id)
        try:
            first = next(chunks)  # FAILED_PRECONDITION / NOT_FOUND now, as a page, not mid-download
        except StopIteration:
            raise HTTPException(404, f"the server sent no {what} files for job {job_id}") from None

        def all_chunks() -> Iterator[C.FileChunk]:
            yield first
            yield from chunks

        folder = f"job-{job_id}-{what}"
        return StreamingResponse(zip_stream(all_chunks(), folder), media_type="application/zip",
                                 headers={"content-disposition": f'attachment; filename="{folder}.zip"'})

    def adapter_zip(request: Request) -> Response:
        return _zip(request, lambda job_id: scheduler.download_adapter(S.DownloadAdapterRequest(job_id=job_id)),
                    "adapter")

    def merged_zip(request: Request) -> Response:
        dtype = request.query_params.get("dtype", "")  # "": the job's newest merge
        return _zip(request, lambda job_id: scheduler.download_merged_model(
            S.DownloadMergedModelRequest(job_id=job_id, dtype=dtype)), "merged")

    def export(request: Request) -> Response:
        job_id, fmt = request.path_params["job_id"], request.path_params["fmt"]
        formats = {"csv": S.EXPORT_FORMAT_CSV, "jsonl": S.EXPORT_FORMAT_JSONL}
        if fmt not in formats:
            raise HTTPException(404, f"no export format {fmt!r}; csv or jsonl")
        resp = scheduler.export_history(S.ExportHistoryRequest(job_id=job_id, format=formats[fmt]))
        name = resp.filename or f"job-{job_id}-history.{fmt}"
        return Response(resp.content, media_type=resp.content_type or "text/plain",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    async def merge(request: Request) -> Response:
        dtype = (await console.form(request)).get("dtype", "")  # "" or "auto": the base model's
        job_id = request.path_params["job_id"]
        if "text/event-stream" in request.headers.get("accept", ""):
            return EventSourceResponse(_merge_events(job_id, dtype))
        last = await run_in_threadpool(lambda: scheduler.merge(job_id, dtype=dtype))
        return console.page(request, "merged.html", {"job_id": job_id, "progress": last, "dtype": dtype or "auto",
                                                     "size": views.human_size(last.size_bytes)}, active="jobs")

    async def _merge_events(job_id: str, dtype: str) -> AsyncIterator[dict[str, str]]:
        stream = live.StreamThread(console.stream_client(),
                                   lambda c: c.merge_model(S.MergeModelRequest(job_id=job_id, dtype=dtype)))
        try:
            while True:
                items, ended = await stream.next_batch(None)
                for p in items:
                    yield {"event": "progress", "data": json.dumps({
                        "stage": p.stage, "fraction": p.fraction, "done": p.done, "path": p.path,
                        "size": views.human_size(p.size_bytes) if p.size_bytes else ""})}
                if ended:
                    if stream.error is not None:
                        yield {"event": "failed", "data": f"{stream.error.code.name}: {stream.error.details}"}
                    return
        finally:
            stream.close()

    async def cancel(request: Request) -> Response:
        await console.form(request)
        job_id = request.path_params["job_id"]
        await run_in_threadpool(scheduler.cancel_job, S.CancelJobRequest(id=job_id))
        return see_other(f"/jobs/{job_id}")

    async def delete(request: Request) -> Response:
        form = await console.form(request)
        job_id = request.path_params["job_id"]
        if form.get("confirm") != "yes":  # the form's required box, for a client that skipped it
            return see_other(f"/jobs/{job_id}")
        await run_in_threadpool(scheduler.delete_job, S.DeleteJobRequest(id=job_id))
        return see_other("/jobs")

    return [
        Route("/jobs", list_page),
        Route("/jobs/{job_id}", job_page),
        Route("/jobs/{job_id}/events", job_events),
        Route("/jobs/{job_id}/adapter.zip", adapter_zip),
        Route("/jobs/{job_id}/merged.zip", merged_zip),
        Route("/jobs/{job_id}/history.{fmt}", export),
        Route("/jobs/{job_id}/merge", merge, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/jobs/{job_id}/delete", delete, methods=["POST"]),
    ]
