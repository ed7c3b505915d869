"""The console's login: off loopback, every page but the login page needs a signed-in session.

The console calls the services with its own user token, so whoever reaches it can start, cancel
and stop jobs and loops. On 127.0.0.1 only this machine reaches it; bound wider (`rlvr web --host
0.0.0.0`, `rlvr up --web-host 0.0.0.0`) it asks for a login first: the user token it calls the
services with (RLVR_TOKEN, or the local stack's), or a console password (`--password-file`,
RLVR_WEB_PASSWORD). `rlvr web` refuses to bind wider with nothing to check a login against unless
`--allow-insecure` says so, as the services refuse to serve beyond loopback without auth.

A signed-in browser holds the `rlvr_session` cookie: its issue time, a random nonce and an
HMAC-SHA256 of both under the console's secret (RLVR_WEB_SECRET, else random per process), valid
for `SESSION_SECONDS`. It is HttpOnly (no script reads it), SameSite=Lax (another site's requests do
not carry it, links to the console still work) and Secure when the console serves TLS. The login
form carries the CSRF token like every other form. A wrong secret costs a pause, and after
`MAX_FAILURES` in `FAILURE_WINDOW_S` from one address logins are refused (429) for the rest of that
window. Secrets are compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "rlvr_session"
SESSION_SECONDS = 12 * 3600
MAX_FAILURES = 10
FAILURE_WINDOW_S = 300.0
FAILURE_PAUSE_S = 0.5
OPEN_PATHS = ("/login", "/healthz", "/favicon.ico", "/static/")  # what a browser reaches before signing in


@dataclass
class Login:
    """Whether the console asks for a login, and what a login may present (`accepted`)."""

    required: bool = False
    accepted: Sequence[bytes] = ()
    insecure: bool = False  # bound beyond loopback without a login: --allow-insecure
    _failures: dict[str, list[float]] = field(default_factory=dict)

    def matches(self, given: str) -> bool:
        """Whether `given` is one of the accepted secrets (every one compared, in constant time)."""
        sent = given.encode()
        found = False
        for secret in self.accepted:
            found |= hmac.compare_digest(sent, secret)
        return found and bool(given)

    def failed_recently(self, client: str, now: float) -> int:
        recent = [t for t in self._failures.get(client, []) if now - t < FAILURE_WINDOW_S]
        self._failures[client] = recent
        return len(recent)

    def fail(self, client: str, now: float) -> None:
        self._failures.setdefault(client, []).append(now)


def _sign(secret: bytes, issued: int, nonce: str) -> str:
    return hmac.new(secret, f"session:{issued}:{nonce}".encode(), hashlib.sha256).hexdigest()


def new_session(secret: bytes, now: float | None = None) -> str:
    issued = int(time.time() if now is None else now)
    nonce = secrets.token_urlsafe(16)
    return f"{issued}.{nonce}.{_sign(secret, issued, nonce)}"


def valid_session(secret: bytes, value: str, now: float | None = None) -> bool:
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isdigit():
        return False
    issued, nonce, signature = int(parts[0]), parts[1], parts[2]
    age = (time.time() if now is None else now) - issued
    return 0 <= age <= SESSION_SECONDS and hmac.compare_digest(signature, _sign(secret, issued, nonce))


def session_cookie(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 (a malformed Cookie header: no session)
                return ""
            morsel = jar.get(COOKIE)
            return morsel.value if morsel is not None and len(morsel.value) <= 256 else ""
    return ""


def is_signed_in(scope: Scope, secret: bytes) -> bool:
    value = session_cookie(scope)
    return bool(value) and valid_session(secret, value)


def _local_path(target: str) -> str:
    """`target` when it is a path of this console, else "/jobs" (no redirect to another site)."""
    parts = urlsplit(target)
    if not target.startswith("/") or target.startswith("//") or parts.scheme or parts.netloc or "\\" in target:
        return "/jobs"
    return target


class LoginMiddleware:
    """Sends a browser without a valid session to /login (pages) or answers 401 (event streams,
    downloads, scripts); lets the login page, the health check and the static files through."""

    def __init__(self, app: ASGIApp, login: Login, secret: bytes) -> None:
        self.app = app
        self.login = login
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.login.required:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        signed_in = is_signed_in(scope, self.secret)
        scope.setdefault("state", {})["signed_in"] = signed_in
        if signed_in or any(path == p or p.endswith("/") and path.startswith(p) for p in OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        accept = request.headers.get("accept", "")
        if request.method == "GET" and "text/html" in accept and not path.endswith("/events"):
            target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
            response: Response = Response(status_code=303, headers={"location": f"/login?next={quote(target)}"})
        else:
            response = PlainTextResponse("Sign in first: this console needs a login (/login).", status_code=401)
        await response(scope, receive, send)


def cookie_header(value: str, request: Request, max_age: int) -> str:
    secure = "; Secure" if request.url.scheme == "https" else ""
    return f"{COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"


def _see_other(url: str) -> Response:
    return Response(status_code=303, headers={"location": url})


def routes(console: Any) -> list[Route]:
    """GET and POST /login, POST /logout (`console`: the app's `rlvr.clients.web.console.Console`)."""
    login: Login = console.login
    see_other = _see_other

    def page(request: Request, message: str = "", status_code: int = 200, target: str = "") -> Response:
        target = _local_path(target or request.query_params.get("next", "/jobs"))
        return console.page(request, "login.html", {"title": "Sign in", "message": message, "next": target,
                                                    "required": login.required}, status_code=status_code)

    async def show(request: Request) -> Response:
        if not login.required or is_signed_in(request.scope, console.secret):
            return see_other(_local_path(request.query_params.get("next", "/jobs")))
        return page(request)

    async def sign_in(request: Request) -> Response:
        form = await console.form(request)  # the CSRF check, as for every form
        if not login.required:
            return see_other("/jobs")
        client = request.client.host if request.client else "?"
        now = time.monotonic()
        if login.failed_recently(client, now) >= MAX_FAILURES:
            raise HTTPException(429, f"Too many failed sign-ins from {client}; wait {FAILURE_WINDOW_S / 60:.0f} "
                                     "minutes and try again.")
        if not login.matches(form.get("secret", "")):
            login.fail(client, now)
            await asyncio.sleep(FAILURE_PAUSE_S)
            return page(request, "That is not the console's password or user token.", status_code=403,
                        target=form.get("next", ""))
        response = see_other(_local_path(form.get("next", "/jobs")))
        response.headers.append("set-cookie", cookie_header(new_session(console.secret), request, SESSION_SECONDS))
        return response

    async def sign_out(request: Request) -> Response:
        await console.form(request)
        response = see_other("/login" if login.required else "/jobs")
        response.headers.append("set-cookie", cookie_header("", request, 0))
        return response

    return [Route("/login", show, methods=["GET"]), Route("/login", sign_in, methods=["POST"]),
            Route("/logout", sign_out, methods=["POST"])]
