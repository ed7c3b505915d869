"""CSRF protection for the console's POSTs (start a job or a loop, cancel, stop, merge).

On loopback the console has no login (it calls the services with its user token), so whoever
reaches the console can act through it (off loopback it asks for one: clients/web/login.py); what
this stops is another web site making a visitor's browser act (a form on evil.example posting to
127.0.0.1:8050). Every browser gets a random `rlvr_csrf` cookie (HttpOnly, SameSite=Strict, Secure under TLS); every
form carries `csrf_token` = HMAC-SHA256(the console's secret, that cookie). A POST passes only
with the cookie and the matching token, and, where the browser says where it comes from
(`Origin`, `Sec-Fetch-Site`), only from this console's own origin. Another site can neither read
the cookie nor compute the token without the secret (random per process unless RLVR_WEB_SECRET is
set; a restart makes open forms stale, which says so).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "rlvr_csrf"
FIELD = "csrf_token"
HEADER = "x-csrf-token"


def token_for(secret: bytes, cookie: str) -> str:
    return hmac.new(secret, cookie.encode(), hashlib.sha256).hexdigest()


def _cookie(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 (a malformed Cookie header: treat as none)
                return ""
            morsel = jar.get(COOKIE)
            if morsel is not None and 16 <= len(morsel.value) <= 128:
                return morsel.value
    return ""


class CsrfMiddleware:
    """Gives every browser its cookie and every request its token (`request.state.csrf_token`)."""

    def __init__(self, app: ASGIApp, secret: bytes) -> None:
        self.app = app
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookie = _cookie(scope)
        new = not cookie
        if new:
            cookie = secrets.token_urlsafe(32)
        state = scope.setdefault("state", {})
        state["csrf_cookie"] = cookie
        state["csrf_token"] = token_for(self.secret, cookie)

        async def send_with_cookie(message: Message) -> None:
            if new and message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                secure = "; Secure" if scope.get("scheme") == "https" else ""  # TLS: never sent in the clear
                headers.append("set-cookie", f"{COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Strict{secure}")
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def _same_origin(request: Request) -> bool:
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != host:
        return False
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


def check(request: Request, form: Mapping[str, object], secret: bytes) -> None:
    """Raises 403 unless the POST carries this browser's token and comes from this origin."""
    cookie = _cookie(request.scope)
    sent = form.get(FIELD) or request.headers.get(HEADER, "")
    if not cookie or not isinstance(sent, str) or not hmac.compare_digest(sent, token_for(secret, cookie)):
        raise HTTPException(403, "This form is stale or did not come from this console (CSRF check failed). "
                                 "Reload the page and try again.")
    if not _same_origin(request):
        raise HTTPException(403, "Cross-site request refused (CSRF check failed).")
