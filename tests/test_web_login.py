"""The console's login off loopback (clients/web/login.py): every page but the login page needs a
signed-in session, the login takes the console password or the user token, the session cookie is
HttpOnly, SameSite and (under TLS) Secure; `rlvr web` beyond loopback refuses to start with nothing
to check a login against unless --allow-insecure. First against the in-memory twins of the
services (tests/web_fakes.py), then in headless chromium: the real `rlvr web --host 0.0.0.0`, over
HTTP and HTTPS, and the leaderboard's number headers over their numbers."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from web_fakes import app_over_fakes

from rlvr.clients.web import login as login_mod
from rlvr.clients.web.login import Login
from rlvr.clients.web.server import WebStartError, add_arguments, login_for

PASSWORD = "correct horse battery"
TOKEN = "the-user-token-of-the-console"


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


@pytest.fixture
def guarded() -> TestClient:
    login = Login(required=True, accepted=[PASSWORD.encode(), TOKEN.encode()])
    return TestClient(app_over_fakes(login=login, bind="0.0.0.0:8050"), base_url="http://192.0.2.7:8050",
                      follow_redirects=False)


def _sign_in(client: TestClient, secret: str, next_page: str = "/jobs"):  # noqa: ANN202 (httpx.Response)
    page = client.get(f"/login?next={next_page}")
    return client.post("/login", data={"csrf_token": _csrf(page.text), "secret": secret, "next": next_page})


def test_every_page_asks_for_a_login_first(guarded: TestClient) -> None:
    for path in ("/jobs", "/jobs/job0001", "/train", "/loops", "/evals", "/leaderboard?benchmark=gsm8k"):
        resp = guarded.get(path, headers={"accept": "text/html"})
        assert resp.status_code == 303 and resp.headers["location"].startswith("/login?next="), path
    for path in ("/jobs/job0001/events", "/jobs/job0001/adapter.zip", "/jobs"):  # streams, downloads, scripts
        assert guarded.get(path, headers={"accept": "*/*"}).status_code == 401, path
    assert guarded.post("/jobs/job0001/cancel", data={}).status_code == 401
    assert guarded.get("/healthz").status_code == 200 and guarded.get("/static/console.css").status_code == 200
    page = guarded.get("/login?next=/train")
    assert page.status_code == 200 and 'type="password"' in page.text and 'value="/train"' in page.text
    assert "sign in with the console's password or its user token" in page.text


@pytest.mark.parametrize("secret", [PASSWORD, TOKEN])
def test_the_password_or_the_user_token_signs_in_with_an_httponly_samesite_cookie(guarded: TestClient,
                                                                                  secret: str) -> None:
    resp = _sign_in(guarded, secret, "/train")
    assert resp.status_code == 303 and resp.headers["location"] == "/train"
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith(f"{login_mod.COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie and f"Max-Age={login_mod.SESSION_SECONDS}" in cookie  # plain HTTP here
    assert guarded.get("/jobs").status_code == 200 and "Signed in" in guarded.get("/jobs").text
    # Sign out: the cookie is cleared and the pages ask again.
    out = guarded.post("/logout", data={"csrf_token": _csrf(guarded.get("/jobs").text)})
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    guarded.cookies.delete(login_mod.COOKIE)
    assert guarded.get("/jobs", headers={"accept": "text/html"}).status_code == 303


def test_a_wrong_secret_a_forged_cookie_and_a_foreign_next_are_refused(guarded: TestClient) -> None:
    wrong = _sign_in(guarded, "not it", "/evals")
    assert wrong.status_code == 403 and "not the console&#39;s password or user token" in wrong.text
    assert 'name="next" value="/evals"' in wrong.text  # the page asked for first, kept for the next try
    assert "set-cookie" not in wrong.headers or login_mod.COOKIE not in wrong.headers["set-cookie"]
    guarded.cookies.set(login_mod.COOKIE, f"{int(time.time())}.nonce.{'0' * 64}")  # not signed by the console
    assert guarded.get("/jobs", headers={"accept": "text/html"}).status_code == 303
    stale = login_mod.new_session(b"test-secret", now=time.time() - login_mod.SESSION_SECONDS - 5)
    guarded.cookies.set(login_mod.COOKIE, stale)
    assert guarded.get("/jobs", headers={"accept": "text/html"}).status_code == 303
    guarded.cookies.clear()
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        guarded.cookies.clear()
        assert _sign_in(guarded, PASSWORD, target).headers["location"] == "/jobs", target
    no_csrf = guarded.post("/login", data={"secret": PASSWORD})
    assert no_csrf.status_code == 403  # the login form carries the CSRF token like every form


def test_repeated_failures_are_refused_for_a_while(guarded: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login_mod, "FAILURE_PAUSE_S", 0.0)
    for _ in range(login_mod.MAX_FAILURES):
        assert _sign_in(guarded, "guess").status_code == 403
    assert _sign_in(guarded, PASSWORD).status_code == 429  # even the right one, until the window passes


def test_the_session_cookie_is_secure_under_tls() -> None:
    login = Login(required=True, accepted=[PASSWORD.encode()])
    client = TestClient(app_over_fakes(login=login), base_url="https://console.example:8443", follow_redirects=False)
    resp = _sign_in(client, PASSWORD)
    assert resp.status_code == 303 and "; Secure" in resp.headers["set-cookie"]
    assert "; Secure" in client.get("/login").headers.get("set-cookie", "; Secure")  # the CSRF cookie too


def test_the_footer_says_how_the_console_is_reached() -> None:
    """Not "the services have no token auth yet": on loopback, signed in, or --allow-insecure."""
    loopback = TestClient(app_over_fakes(bind="127.0.0.1:8050")).get("/jobs").text
    assert "no token auth yet" not in loopback
    assert "No login: it listens on 127.0.0.1:8050, so only this machine reaches it" in loopback
    insecure = TestClient(app_over_fakes(login=Login(insecure=True), bind="0.0.0.0:8050")).get("/jobs").text
    assert "No login (--allow-insecure): whoever reaches 0.0.0.0:8050 can start and stop jobs" in insecure


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_rlvr_web_beyond_loopback_needs_something_to_check_a_login_against(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLVR_WEB_PASSWORD", raising=False)
    assert not login_for(_args(), None).required  # loopback: no login, as before
    assert login_for(_args("--host", "0.0.0.0"), TOKEN).required  # the user token
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    wide = login_for(_args("--host", "0.0.0.0", "--password-file", str(secret)), None)
    assert wide.required and wide.matches(PASSWORD) and not wide.matches(TOKEN)
    monkeypatch.setenv("RLVR_WEB_PASSWORD", PASSWORD)
    assert login_for(_args("--host", "::"), None).matches(PASSWORD)
    monkeypatch.delenv("RLVR_WEB_PASSWORD")
    with pytest.raises(WebStartError, match="--host 0.0.0.0 serves job control beyond this machine"):
        login_for(_args("--host", "0.0.0.0"), None)
    insecure = login_for(_args("--host", "0.0.0.0", "--allow-insecure"), None)
    assert insecure.insecure and not insecure.required
    assert login_for(_args("--host", "0.0.0.0", "--allow-insecure"), TOKEN).required  # never weakens a login
    assert login_for(_args("--require-login"), TOKEN).required
    secret.write_text("short")
    with pytest.raises(WebStartError, match="shorter than 8"):
        login_for(_args("--host", "0.0.0.0", "--password-file", str(secret)), None)


def test_rlvr_web_refuses_to_serve_the_network_without_a_login(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RLVR_TOKEN", "RLVR_WEB_PASSWORD")}
    env["RLVR_HOME"] = str(tmp_path)  # no local stack, so no stack token either
    out = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "web", "--host", "0.0.0.0", "--port", "1"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("rlvr web: error: --host 0.0.0.0 serves job control beyond this machine")
    assert "--allow-insecure" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- in headless chromium

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = next((p for n in (os.environ.get("RLVR_CHROMIUM", ""), "chromium", "chromium-browser",
                                   "google-chrome") if n and (p := shutil.which(n))), None)
    if executable is None:
        _missing("headless chromium is not installed: `make chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: `make install`")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[str] | None = None, timeout: float = 60.0) -> None:
    import ssl
    import urllib.request

    context = ssl._create_unverified_context()  # noqa: S323 (the test's own self-signed console)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"rlvr web exited: {proc.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2, context=context):  # noqa: S310
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not come up")


@pytest.fixture
def real_console(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """`rlvr web --host 0.0.0.0` as a user runs it, with its user token (RLVR_TOKEN); the services'
    addresses lead nowhere, so a signed-in page says the scheduler is unreachable."""
    tls: list[str] = []
    scheme = "http"
    if getattr(request, "param", "") == "tls":
        from fixtures_tls import make_pki

        pki = make_pki(tmp_path / "tls")
        tls, scheme = ["--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key)], "https"
    port = _free_port()
    env = {**os.environ, "RLVR_HOME": str(tmp_path), "RLVR_TOKEN": TOKEN,
           "RLVR_SCHEDULER_ADDRESS": f"127.0.0.1:{_free_port()}", "RLVR_BENCHMARK_ADDRESS": f"127.0.0.1:{_free_port()}"}
    env.pop("RLVR_WEB_PASSWORD", None)
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.clients.cli", "web", "--host", "0.0.0.0", "--port", str(port),
                             *tls], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"{scheme}://127.0.0.1:{port}"
        _wait_up(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("real_console", ["http", "tls"], indirect=True)
def test_rlvr_web_on_0000_asks_chromium_for_a_login(browser, real_console: str) -> None:  # noqa: ANN001
    context = browser.new_context(ignore_https_errors=True)  # type: ignore[attr-defined]
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{real_console}/jobs?limit=5")
        assert page.url == f"{real_console}/login?next=/jobs%3Flimit%3D5" and page.inner_text("h1") == "Sign in"
        page.fill("#login-secret", "a wrong guess")
        page.click("#sign-in")
        assert "not the console's password or user token" in page.inner_text("#login-error")
        assert not [c for c in context.cookies() if c["name"] == login_mod.COOKIE]
        page.fill("#login-secret", TOKEN)
        with page.expect_response(lambda r: r.request.method == "GET" and "/jobs" in r.url) as landed:
            page.click("#sign-in")
        # Signed in, on the page asked for first (the scheduler it points at is down, so it says so).
        assert landed.value.url == f"{real_console}/jobs?limit=5" and landed.value.status == 503
        page.wait_for_selector("#sign-out")
        assert "Service unavailable" in page.inner_text("h1") and "Signed in" in page.inner_text("footer")
        session = next(c for c in context.cookies() if c["name"] == login_mod.COOKIE)
        assert session["httpOnly"] and session["sameSite"] == "Lax"
        assert session["secure"] == real_console.startswith("https")
        assert page.evaluate("document.cookie") == ""  # no script reads either cookie
        with page.expect_response(lambda r: r.request.method == "GET" and "/login" in r.url) as out:
            page.click("#sign-out")
        assert out.value.status == 200 and not [c for c in context.cookies() if c["name"] == login_mod.COOKIE]
        page.goto(f"{real_console}/evals")
        assert page.url.startswith(f"{real_console}/login?next=/evals")
        assert not errors, errors
    finally:
        context.close()


@pytest.fixture
def fake_console() -> Iterator[str]:
    """The console over the in-memory twins, served by uvicorn on a free loopback port."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app_over_fakes(bind=f"127.0.0.1:{port}"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_leaderboards_number_headers_sit_over_their_numbers(browser, fake_console: str) -> None:  # noqa: ANN001
    """ACCURACY STRICT (and every number column) ends where its numbers end: the headers were
    left-aligned over right-aligned numbers, far from them in a wide column."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    try:
        page.goto(f"{fake_console}/leaderboard?benchmark=rlvr-math-pairs-heldout")
        edges = page.evaluate("""() => Array.from(document.querySelectorAll('table.leaderboard')).map(table => {
            const heads = Array.from(table.querySelectorAll('thead th'));
            const cells = Array.from(table.querySelectorAll('tbody tr:first-child td'));
            return heads.map((th, i) => {
              if (!th.classList.contains('num')) return null;
              const range = document.createRange();
              range.selectNodeContents(th);
              const text = range.getBoundingClientRect();
              const cellRange = document.createRange();
              cellRange.selectNodeContents(cells[i]);
              return {name: th.innerText, head: text.right, cell: cellRange.getBoundingClientRect().right};
            }).filter(Boolean);
        })""")
        assert len(edges) == 2  # one table per question set
        for table in edges:
            names = [e["name"].upper() for e in table]
            assert "ACCURACY STRICT" in names, names
            for e in table:
                assert abs(e["head"] - e["cell"]) <= 2, e
    finally:
        page.close()
