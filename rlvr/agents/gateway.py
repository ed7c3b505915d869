"""The OpenAI-compatible endpoint that agent programs call: one per process, started on first use.

`Gateway.shared()` starts an HTTP server on 127.0.0.1 (a free port) in a daemon thread the first
time an agent episode runs in the process (the trainer's job process, the benchmark service), and
keeps it for the process's life: no agent, no endpoint. Each episode opens a session
(`Gateway.open(recorder, loop)`) and gets a key; its base URL names the key
(``http://127.0.0.1:PORT/episodes/KEY/v1``) and the key is also its API key, so an OpenAI client
made with either reaches that episode and no other. A key is refused once its episode has ended
("expired") and when unknown (401, OpenAI's error form).

Routes: ``POST /v1/chat/completions`` (or under the episode's base URL) and ``GET /v1/models``.
A call is answered by the episode's `EpisodeRecorder` on the episode's own event loop (the loop
the agent runs on): the HTTP thread hands it over and waits.

The endpoint listens on the loopback interface only: the agent runs in the same process as the
episode, and nothing outside the host can reach its sessions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from rlvr.agents.recorder import EpisodeRecorder, RequestError

log = logging.getLogger("rlvr.agents.gateway")

__all__ = ["Gateway"]

MAX_BODY_BYTES = 16 * 1024 * 1024
CALL_TIMEOUT_SECONDS = 3600.0  # a call waits at most this long for its episode's loop
EXPIRED_KEPT = 4096  # ended episodes' keys remembered, to say "expired" rather than "unknown"


@dataclass
class _Session:
    recorder: EpisodeRecorder
    loop: asyncio.AbstractEventLoop
    calls: set[concurrent.futures.Future[Any]] = field(default_factory=set)  # being answered now


class Gateway:
    """The process's endpoint: sessions by key, served by a threading HTTP server."""

    _shared: ClassVar[Gateway | None] = None
    _shared_pid: ClassVar[int] = 0
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, bind: str = "127.0.0.1", port: int = 0) -> None:
        self._sessions: dict[str, _Session] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        gateway = self

        class Handler(_Handler):
            pass

        Handler.gateway = gateway
        self.server = _Server((bind, port), Handler)
        bound = self.server.server_address
        self.host: str = bound[0].decode() if isinstance(bound[0], bytes | bytearray) else str(bound[0])
        self.port: int = int(bound[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="rlvr-agent-gateway", daemon=True)
        self._thread.start()
        log.info("agent endpoint listening on http://%s:%d/v1", self.host, self.port)

    @classmethod
    def shared(cls) -> Gateway:
        """The process's gateway, started on first use (again in a forked child: its server thread
        stayed in the parent)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared_pid != os.getpid():
                cls._shared, cls._shared_pid = cls(), os.getpid()
            return cls._shared

    def base_url(self, key: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{key}/v1"

    def open(self, recorder: EpisodeRecorder, loop: asyncio.AbstractEventLoop) -> str:
        key = "rlvr-ep-" + secrets.token_urlsafe(24)
        with self._lock:
            self._sessions[key] = _Session(recorder, loop)
        return key

    def close(self, key: str) -> None:
        """Ends the episode's session: its key is refused from now on, and a call still being
        answered is cancelled (its caller gets a 503) and its answer not recorded."""
        with self._lock:
            session = self._sessions.pop(key, None)
            if session is not None:
                self._expired[key] = None
                while len(self._expired) > EXPIRED_KEPT:
                    self._expired.popitem(last=False)
        if session is not None:
            session.recorder.closed = True
            for call in list(session.calls):
                call.cancel()

    def session(self, key: str | None) -> _Session:
        with self._lock:
            found = self._sessions.get(key or "")
            expired = key in self._expired
        if found is None:
            what = ("the episode of this key has ended (expired)" if expired else
                    "no API key given" if not key else "unknown API key")
            raise RequestError(f"{what}: each agent episode has its own key and base URL", status=401,
                               code="invalid_api_key", type_="authentication_error")
        return found

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Every episode of a step or an evaluation batch connects at once (hundreds): the listen backlog
    # must hold them all, or connections beyond socketserver's default of 5 are refused or retried
    # seconds later, and those agents fail with a connection error.
    request_queue_size = 4096


class _Handler(BaseHTTPRequestHandler):
    gateway: ClassVar[Gateway]
    protocol_version = "HTTP/1.1"  # keep-alive: the agent's client reuses its connection
    # TCP_NODELAY: an answer goes out as its headers, then its body; with Nagle's algorithm the body
    # waits for the client to acknowledge the headers, which it delays (up to 40 ms on Linux) once its
    # calls come back to back on a kept-alive connection, as an agent's do: 45 ms a call, measured
    # (bench/agent_gateway.py, docs/measurements/episodes.md).
    disable_nagle_algorithm = True
    server_version = "rlvr-agent-gateway"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def _key_and_route(self) -> tuple[str | None, str]:
        """The episode key (the path's, else the bearer token's) and the route under /v1."""
        path = self.path.split("?", 1)[0]
        key = None
        if path.startswith("/episodes/"):
            _, _, rest = path.partition("/episodes/")
            key, _, path = rest.partition("/")
            path = "/" + path
        auth = self.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if key is not None and bearer and bearer != key:
            raise RequestError("the API key is not the key of the base URL's episode", status=401,
                               code="invalid_api_key", type_="authentication_error")
        return key or bearer, path

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            key, route = self._key_and_route()
            self.gateway.session(key)
            if route.rstrip("/") != "/v1/models":
                raise RequestError(f"no route GET {route}", status=404, code="not_found")
            self._send(200, {"object": "list", "data": [
                {"id": "rlvr-policy", "object": "model", "created": 0, "owned_by": "rlvr"}]})
        except RequestError as e:
            self._send(e.status, e.body())

    def do_POST(self) -> None:  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True  # the body is not read: the connection cannot carry another request
                raise RequestError(f"the request body has {length} bytes; at most {MAX_BODY_BYTES}", status=413)
            raw = self.rfile.read(length) if length else b""
            key, route = self._key_and_route()
            session = self.gateway.session(key)
            if route.rstrip("/") != "/v1/chat/completions":
                raise RequestError(f"no route POST {route}; the endpoint serves /v1/chat/completions",
                                   status=404, code="not_found")
            try:
                body = json.loads(raw or b"null")
            except json.JSONDecodeError as e:
                raise RequestError(f"the request body is not JSON ({e.msg} at character {e.pos})") from None
            future = asyncio.run_coroutine_threadsafe(session.recorder.complete(body), session.loop)
            session.calls.add(future)
            try:
                answer = future.result(CALL_TIMEOUT_SECONDS)
            finally:
                session.calls.discard(future)
            self._send(200, answer)
        except RequestError as e:
            self._send(e.status, e.body())
        except (asyncio.CancelledError, concurrent.futures.CancelledError):  # the episode was cancelled
            self._send(503, RequestError("the episode has ended or was cancelled; this call's answer is not recorded",
                                         status=503, type_="server_error").body())
        except Exception as e:  # noqa: BLE001 - the sampler failed (the rollout service gone): the agent sees a 500
            log.warning("agent call failed: %s: %s", type(e).__name__, e)
            self._send(500, RequestError(f"the policy could not answer: {type(e).__name__}: {e}", status=500,
                                         type_="server_error").body())
