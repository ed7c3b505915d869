"""`rlvr web`: serves the web console (clients/web/app.py) with uvicorn.

It binds to 127.0.0.1 unless told otherwise: it has no login of its own and calls the services
with its user token (RLVR_TOKEN), so anyone who can reach the console can start, cancel and stop
jobs and loops through it (the CSRF check only
stops other web sites from doing so through a visitor's browser). `rlvr up` starts it beside the
services, on its own port, with the stack's addresses.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

DEFAULT_PORT = 8050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; the console has no login: bind wider only on a "
                             "network you trust)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--scheduler-address", default=None,
                        help="scheduler HOST:PORT (default RLVR_SCHEDULER_ADDRESS, else the local stack's)")
    parser.add_argument("--benchmark-address", default=None,
                        help="benchmark service HOST:PORT (default RLVR_BENCHMARK_ADDRESS, else the local stack's)")
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def web(args: argparse.Namespace) -> int:
    import uvicorn

    from rlvr.clients.sdk import ClientSettings, connect
    from rlvr.clients.web.app import create_app

    overrides = {k: v for k, v in (("scheduler_address", args.scheduler_address),
                                   ("benchmark_address", args.benchmark_address)) if v}
    settings = ClientSettings(**overrides)
    sdk = connect(settings)
    addresses = {"scheduler": settings.scheduler_address, "benchmark": settings.benchmark_address}
    app = create_app(sdk, addresses=addresses, bind=f"{args.host}:{args.port}")
    if not is_loopback(args.host):
        print(f"warning: the console on {args.host}:{args.port} has no login of its own (it calls the services "
              "with its token): anyone who can reach it can start and stop jobs", file=sys.stderr)
    print(f"rlvr web console on {url(args.host, args.port)} (scheduler {settings.scheduler_address}, "
          f"benchmark {settings.benchmark_address}); Ctrl-C stops it", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    finally:
        sdk.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr web", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return web(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
