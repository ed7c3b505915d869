"""`rlvr web`: serves the web console (clients/web/app.py) with uvicorn.

It binds to 127.0.0.1 unless told otherwise. It calls the services with its user token
(RLVR_TOKEN, or the local stack's), so whoever reaches it can start, cancel and stop jobs and loops
through it: bound beyond loopback it asks for a login first (the user token, or a console password:
`--password-file`, RLVR_WEB_PASSWORD; clients/web/login.py), and with nothing to check a login
against it refuses to start unless `--allow-insecure` says so. `--tls-cert-file` and
`--tls-key-file` serve it over HTTPS (its cookies are then Secure). `rlvr up` starts it beside the
services, on its own port, with the stack's addresses and token.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

DEFAULT_PORT = 8050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; any other asks for a login first)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--scheduler-address", default=None,
                        help="scheduler HOST:PORT (default RLVR_SCHEDULER_ADDRESS, else the local stack's)")
    parser.add_argument("--benchmark-address", default=None,
                        help="benchmark service HOST:PORT (default RLVR_BENCHMARK_ADDRESS, else the local stack's)")
    parser.add_argument("--password-file", type=Path, default=None,
                        help="a file holding the console password a login may give (default RLVR_WEB_PASSWORD); "
                             "the user token is accepted too")
    parser.add_argument("--require-login", action="store_true",
                        help="ask for a login on loopback too (beyond loopback it is always asked)")
    parser.add_argument("--allow-insecure", action="store_true",
                        help="bind beyond loopback without a login when there is neither a password nor a token")
    parser.add_argument("--tls-cert-file", type=Path, default=None, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key-file", type=Path, default=None, help="the key of --tls-cert-file (PEM)")
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url(host: str, port: int, scheme: str = "http") -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"{scheme}://[{shown}]:{port}" if ":" in shown else f"{scheme}://{shown}:{port}"


class WebStartError(RuntimeError):
    """A setting that keeps the console from starting: one line naming it."""


def console_password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        try:
            text = args.password_file.expanduser().read_text().strip()
        except OSError as e:
            raise WebStartError(f"--password-file {args.password_file}: cannot read it ({e.strerror})") from None
        if not text:
            raise WebStartError(f"--password-file {args.password_file}: the file is empty")
        return text
    return os.environ.get("RLVR_WEB_PASSWORD", "").strip()


def login_for(args: argparse.Namespace, token: str | None):  # -> Login
    """What the console asks of a browser (see the module's doc); WebStartError when it may not
    start: beyond loopback, nothing to check a login against and no --allow-insecure."""
    from rlvr.clients.web.login import Login

    password = console_password(args)
    accepted = [s.encode() for s in (password, token or "") if s]
    if password and len(password) < 8:
        raise WebStartError("the console password is shorter than 8 characters: choose a longer one")
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise WebStartError("--tls-cert-file and --tls-key-file go together")
    wide = not is_loopback(args.host)
    if not (wide or args.require_login):
        return Login()
    if accepted:
        return Login(required=True, accepted=accepted)
    if args.allow_insecure and not args.require_login:
        return Login(insecure=True)
    raise WebStartError(
        f"--host {args.host} serves job control beyond this machine, and the console has nothing to check a login "
        "against: give it a console password (--password-file FILE or RLVR_WEB_PASSWORD) or a user token "
        "(RLVR_TOKEN), or pass --allow-insecure to serve it without a login")


def web(args: argparse.Namespace) -> int:
    from rlvr.clients.sdk import ClientSettings, connect

    overrides = {k: v for k, v in (("scheduler_address", args.scheduler_address),
                                   ("benchmark_address", args.benchmark_address)) if v}
    settings = ClientSettings(**overrides)
    try:
        login = login_for(args, settings.auth("scheduler").token)
    except WebStartError as e:
        print(f"rlvr web: error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from rlvr.clients.web.app import create_app

    sdk = connect(settings)
    addresses = {"scheduler": settings.scheduler_address, "benchmark": settings.benchmark_address}
    app = create_app(sdk, addresses=addresses, bind=f"{args.host}:{args.port}", login=login)
    if login.insecure:
        print(f"warning: the console on {args.host}:{args.port} has no login (--allow-insecure): anyone who can reach "
              "it can start and stop jobs", file=sys.stderr)
    scheme = "https" if args.tls_cert_file else "http"
    how = "a login first" if login.required else "no login"
    print(f"rlvr web console on {url(args.host, args.port, scheme)} (scheduler {settings.scheduler_address}, "
          f"benchmark {settings.benchmark_address}; {how}); Ctrl-C stops it", flush=True)
    tls = ({"ssl_certfile": str(args.tls_cert_file), "ssl_keyfile": str(args.tls_key_file)}
           if args.tls_cert_file else {})
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, **tls)
    finally:
        sdk.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr web", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return web(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
