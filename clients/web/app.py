"""The console's Starlette application: routes of every page, the error pages, static files, CSRF.

`create_app(sdk)` takes the SDK's clients (`rlvr.clients.sdk.connect(...)`, or fakes with the same
methods in tests) and owns nothing else: every page is read from the scheduler and the benchmark
service when it is asked for, every action is one of their RPCs. A failed call becomes a page that
says what the server said (NOT_FOUND: 404; INVALID_ARGUMENT / FAILED_PRECONDITION: 400 / 409, e.g.
"the job has no adapter yet"; UNAVAILABLE: 503 naming the address that did not answer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from rlvr.clients import loop_report, report
from rlvr.clients.web import evals, jobs, loops, train
from rlvr.clients.web.console import HERE, Console, see_other
from rlvr.clients.web.csrf import CsrfMiddleware
from rlvr.clients.web.login import Login, LoginMiddleware
from rlvr.clients.web.login import routes as login_routes
from rlvr.peers.base import RlvrError

STATUS_FOR_CODE = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 409, "UNAVAILABLE": 503,
                   "DEADLINE_EXCEEDED": 504, "ALREADY_EXISTS": 409}
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="7" '
           'fill="#1e40af"/><path d="M8 23 L14 15 L18 19 L24 9" stroke="#fff" stroke-width="3" fill="none"/></svg>')


def stylesheet() -> str:
    """The reports' CSS (so the console and `rlvr jobs report` look alike), then the console's own."""
    return "\n".join([report.CSS, loop_report.CSS.replace(report.BASE_CSS, ""),
                      (HERE / "static" / "console.css").read_text(encoding="utf-8")])


def create_app(sdk: Any, *, stream_client: Callable[[], Any] | None = None, secret: bytes | None = None,
               addresses: Mapping[str, str] | None = None, bind: str = "", login: Login | None = None) -> Starlette:
    """The console over `sdk` (`.scheduler`, `.benchmark`). `stream_client()` gives each live stream
    a scheduler client of its own (default: a new SchedulerClient at the SDK's scheduler address).
    `login`: whether pages need a signed-in session first (clients/web/login.py; default: none)."""
    if stream_client is None:
        from rlvr.clients.sdk import SchedulerClient

        address = sdk.settings.scheduler_address
        auth = sdk.settings.auth("scheduler") if hasattr(sdk.settings, "auth") else None
        stream_client = lambda: SchedulerClient(address, auth=auth)  # noqa: E731
    env_secret = os.environ.get("RLVR_WEB_SECRET", "").encode()
    console = Console(sdk=sdk, stream_client=stream_client, addresses=dict(addresses or {}), bind=bind,
                      login=login or Login(), **({"secret": secret or env_secret} if secret or env_secret else {}))
    css = stylesheet()
    script = (HERE / "static" / "console.js").read_text(encoding="utf-8")

    def static(body: str, media: str) -> Callable[[Request], Response]:
        return lambda request: Response(body, media_type=media, headers={"cache-control": "no-cache"})

    async def rlvr_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RlvrError)
        status = STATUS_FOR_CODE.get(exc.code.name, 502)
        where = ""
        if exc.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            service = "benchmark" if "BenchmarkService" in exc.method else "scheduler"
            where = f"the {service} service at {console.addresses.get(service, '?')} did not answer"
        return error_page(request, status, f"{exc.code.name}: {exc.details}", where)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_page(request, exc.status_code, str(exc.detail), "")

    def error_page(request: Request, status: int, message: str, where: str) -> Response:
        if request.url.path.endswith("/events") or "text/event-stream" in request.headers.get("accept", ""):
            return PlainTextResponse(message, status_code=status)
        if not hasattr(request.state, "csrf_token"):
            return PlainTextResponse(message, status_code=status)
        titles = {404: "Not found", 403: "Refused", 503: "Service unavailable", 409: "Not possible now",
                  429: "Too many attempts"}
        return console.page(request, "error.html", {"title": titles.get(status, "Error"), "message": message,
                                                    "where": where, "status": status}, status_code=status)

    routes = [
        Route("/", lambda request: see_other("/jobs")),
        Route("/healthz", lambda request: PlainTextResponse("ok")),
        Route("/favicon.ico", static(FAVICON, "image/svg+xml")),
        Route("/static/console.css", static(css, "text/css")),
        Route("/static/console.js", static(script, "text/javascript")),
        *login_routes(console),
        *train.routes(console),  # before loops: /loops (POST) and /loops/new
        *jobs.routes(console),
        *loops.routes(console),
        *evals.routes(console),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(CsrfMiddleware, secret=console.secret),
                                               Middleware(LoginMiddleware, login=console.login, secret=console.secret)],
                    exception_handlers={RlvrError: rlvr_error, HTTPException: http_error})
    app.state.console = console
    return app
