"""What every page of the console shares: the SDK clients, the templates, the CSRF secret and the
form limits, in one `Console` object the route modules (jobs, train, loops, evals) take."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates

from rlvr.clients.web import csrf
from rlvr.clients.web.limits import LimitsCache
from rlvr.clients.web.login import Login

HERE = Path(__file__).resolve().parent
NAV = [("jobs", "/jobs", "Jobs"), ("train", "/train", "New Training"), ("loops", "/loops", "Training Loops"),
       ("evals", "/evals", "Evaluations"), ("leaderboard", "/leaderboard", "Leaderboards")]


@dataclass
class Console:
    """`sdk` has `.scheduler` and `.benchmark` (rlvr.clients.sdk.Rlvr, or fakes in tests);
    `stream_client()` returns a new scheduler client for one live stream (closed when it ends)."""

    sdk: Any
    stream_client: Callable[[], Any]
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    addresses: Mapping[str, str] = field(default_factory=dict)
    bind: str = ""
    login: Login = field(default_factory=Login)  # off loopback: a login first (clients/web/login.py)
    templates: Jinja2Templates = field(init=False)
    limits: LimitsCache = field(init=False)

    def __post_init__(self) -> None:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                 autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
                                 trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.globals.update(nav=NAV)
        self.templates = Jinja2Templates(env=env)
        self.limits = LimitsCache(self.sdk.scheduler, self.sdk.benchmark)

    def page(self, request: Request, name: str, context: dict[str, Any], *, status_code: int = 200,
             active: str = "") -> HTMLResponse:
        access = {"required": self.login.required, "insecure": self.login.insecure,
                  "signed_in": bool(getattr(request.state, "signed_in", False))}
        ctx = {"request": request, "csrf_token": request.state.csrf_token, "active": active,
               "addresses": self.addresses, "bind": self.bind, "access": access, "live_url": "", "refresh": 0,
               "reload": 0, **context}
        return self.templates.TemplateResponse(request, name, ctx, status_code=status_code)

    def fragment(self, name: str, context: dict[str, Any]) -> str:
        """A partial template rendered alone (a live update, the form's summary preview)."""
        return self.templates.get_template(name).render(**context)

    async def form(self, request: Request) -> dict[str, str]:
        """The POSTed form as a dict, after the CSRF check (403 otherwise)."""
        data = await request.form()
        csrf.check(request, data, self.secret)
        return {k: v for k, v in data.items() if isinstance(v, str)}


def see_other(url: str) -> Response:
    return Response(status_code=303, headers={"location": url})
