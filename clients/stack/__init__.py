"""The local stack's commands: `rlvr up` runs an embedded NATS and all five services as child
processes on one machine, and the web console (`rlvr web`) beside them on its own port; `rlvr status`
prints each service's health and NATS's; `local_stack` is the same stack inside a `with` block.

The parts: ports (rlvr.clients.stack.ports), what runs where (rlvr.clients.stack.config), the process
supervisor (rlvr.clients.stack.supervisor). Their public names are re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlvr.clients.stack.config import (
    DEFAULT_WEB_PORT,
    GRPC_NAMES,
    NATS,
    NATS_SERVICES,
    NATS_USER,
    RESTART_WINDOW,
    SERVICES,
    WEB,
    StackConfig,
    default_home,
    replica_name,
    service_command,
    service_of,
    web_command,
)
from rlvr.clients.stack.ports import free_port
from rlvr.clients.stack.supervisor import Stack, StackBusy, check_web, group_alive, supervise
from rlvr.common.settings import DEFAULT_PORTS
from rlvr.peers.base import check_health

__all__ = [
    "add_arguments", "add_up_arguments", "check_web", "config_from_args", "default_home",
    "DEFAULT_WEB_PORT", "free_port", "group_alive", "GRPC_NAMES", "local_stack",
    "NATS_SERVICES", "NATS_USER", "replica_name", "RESTART_WINDOW", "service_command",
    "service_of", "SERVICES", "Stack", "StackBusy", "StackConfig", "status", "supervise", "up", "WEB",
    "web_command",
]


@contextlib.contextmanager
def local_stack(home: Path, model: str, *, web: bool = False) -> Iterator[tuple[Stack, Any]]:
    """The whole stack on free ports under `home` serving `model`, started and SERVING, with an SDK
    client for it (`rlvr.clients.sdk.Rlvr`); stopped however the block ends. What `rlvr demo` and the
    bench scripts run on. RuntimeError naming the logs when it does not come up."""
    from rlvr.clients.sdk import connect
    from rlvr.models import is_tiny

    if is_tiny(model):  # a tiny model trains several times faster on one torch thread here
        os.environ.setdefault("RLVR_TRAINER_TORCH_THREADS", "1")
    cfg = StackConfig(home=home.resolve(), model=model, ports={name: free_port() for name in SERVICES},
                      web_port=free_port() if web else None)
    stack = Stack(cfg)
    try:
        stack.start()
        if not stack.wait_serving():
            raise RuntimeError(f"the stack did not come up; logs in {cfg.home / 'logs'}")
        client = connect(stack.client_settings())
        try:
            yield stack, client
        finally:
            client.close()
    finally:
        stack.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", type=Path, default=None, help="state folder (default $RLVR_HOME/stack)")
    parser.add_argument("--host", default="127.0.0.1", help="address every service binds to")
    parser.add_argument("--base-port", type=int, default=None,
                        help="scheduler port; the others follow (default "
                        f"{min(DEFAULT_PORTS.values())}..{max(DEFAULT_PORTS.values())}; 0 = free ports)")
    parser.add_argument("--nats-port", type=int, default=0, help="embedded NATS port (0 = a free one)")
    parser.add_argument("--database-url", default="", help="store URL (default SQLite under --home)")
    parser.add_argument("--model", default="rlvr-tiny", help="base model of the rollout server")
    parser.add_argument("--rollout-backend", choices=("vllm", "transformers"), default="vllm")
    parser.add_argument("--memory-fraction", type=float, default=0.3, help="vLLM memory fraction")
    parser.add_argument("--rollout-replicas", type=int, default=1,
                        help="rollout servers to start (1-8), each with the model; the trainer and the benchmark "
                             "spread their generation across them (each vLLM one takes --memory-fraction)")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for SERVING")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument("--metrics", action="store_true",
                        help="every service serves Prometheus /metrics on a free port (stack.json lists them; "
                             "docs/metrics.md)")


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    """`rlvr up`'s options: the stack's, and where the web console listens."""
    add_arguments(parser)
    parser.add_argument("--web-port", type=int, default=None,
                        help=f"the web console's port (default {DEFAULT_WEB_PORT}, a free one with --base-port 0; "
                             "0 = a free one)")
    parser.add_argument("--web-host", default="127.0.0.1",
                        help="address the web console binds to (default 127.0.0.1; any other: the console asks for "
                             "a login, the stack's user token)")
    parser.add_argument("--no-web", action="store_true", help="do not start the web console")
    parser.add_argument("--max-restarts", type=int, default=5,
                        help="start a service (or NATS) that dies again, at most this many times in "
                             f"{RESTART_WINDOW:.0f} s (then stop everything; 0 = never restart)")


def _check_options(args: argparse.Namespace) -> None:
    """The numbers `rlvr up` takes, each against its range, naming the option (a service would
    otherwise fail later naming its own setting, or the wait end at once)."""
    def bad(option: str, value: object, allowed: str) -> SystemExit:
        return SystemExit(f"rlvr up: error: {option}: {value} is out of range; allowed: {allowed}")

    replicas = getattr(args, "rollout_replicas", 1)
    if not 1 <= replicas <= 8:
        raise bad("--rollout-replicas", replicas, "1-8")
    if getattr(args, "max_restarts", None) is not None and args.max_restarts < 0:
        raise bad("--max-restarts", args.max_restarts, ">= 0")
    names = len(DEFAULT_PORTS) + replicas - 1  # ports from --base-port on
    if args.base_port is not None and args.base_port != 0 and not 1 <= args.base_port <= 65536 - names:
        raise bad("--base-port", args.base_port, f"0 (free ports) or 1-{65536 - names} (it and the next "
                  f"{names - 1} ports)")
    if not 0 <= args.nats_port <= 65535:
        raise bad("--nats-port", args.nats_port, "0 (a free one) or 1-65535")
    if getattr(args, "web_port", None) is not None and not 0 <= args.web_port <= 65535:
        raise bad("--web-port", args.web_port, "0 (a free one) or 1-65535")
    if not args.start_timeout > 0:
        raise bad("--start-timeout", args.start_timeout, "> 0 seconds")
    if not 0 < args.memory_fraction <= 1:
        raise bad("--memory-fraction", args.memory_fraction, "0 < f <= 1")


def config_from_args(args: argparse.Namespace) -> StackConfig:
    _check_options(args)
    cfg = StackConfig(host=args.host, nats_port=args.nats_port, database_url=args.database_url,
                      model=args.model, rollout_backend=args.rollout_backend,
                      memory_fraction=args.memory_fraction, start_timeout=args.start_timeout,
                      log_format=args.log_format)
    replicas = cfg.rollout_replicas = getattr(args, "rollout_replicas", 1)
    if getattr(args, "max_restarts", None) is not None:
        cfg.max_restarts = args.max_restarts
    if not getattr(args, "no_web", True):
        cfg.web_host = args.web_host
        port = args.web_port if args.web_port is not None else 0 if args.base_port == 0 else DEFAULT_WEB_PORT
        cfg.web_port = port or free_port(args.web_host)
    if args.home is not None:
        cfg.home = args.home.expanduser().resolve()
    if args.base_port == 0:
        cfg.ports = {name: free_port(args.host) for name in DEFAULT_PORTS}
    elif args.base_port is not None:
        cfg.ports = {name: args.base_port + i for i, name in enumerate(DEFAULT_PORTS)}
    last = max(cfg.ports.values()) if args.base_port != 0 else 0
    for k in range(2, replicas + 1):  # after the five services' ports (free ones with --base-port 0)
        cfg.ports[replica_name(k)] = last + k - 1 if last else free_port(args.host)
    if getattr(args, "metrics", False):
        cfg.metrics_ports = {name: free_port(args.host) for name in cfg.names}
    return cfg


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


def up(args: argparse.Namespace) -> int:
    """`rlvr up`: start everything, wait for SERVING, run until Ctrl-C/SIGTERM, starting a service
    that dies again (`supervise`)."""
    from rlvr.infra.nats_server import NatsStartError

    stack = Stack(config_from_args(args))
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    code = 0
    try:
        stack.start()
        if not stack.wait_serving():
            code = 1
        else:
            stack.say(f"\nrlvr is up (state in {stack.cfg.home}); Ctrl-C stops every service.")
            stack.say(f"auth: on, with this run's tokens in {stack.tokens_file} (the SDK and the CLI use its user "
                      "token for this stack)")
            if stack.cfg.web_port is not None:
                from rlvr.clients.web.server import is_loopback

                login = ("" if is_loopback(stack.cfg.web_host) else
                         f" (sign in with the user token of {stack.tokens_file})")
                stack.say(f"web console: {stack.cfg.web_url}{login}")
            code = supervise(stack)
    except (StackBusy, NatsStartError) as e:
        stack.say(f"rlvr up: error: {e}")
        code = 2
    except _Stop:
        stack.say("\nstopping ...")
    finally:
        # A second Ctrl-C or SIGTERM must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if stack.holds_home:  # else it never started (refused: the home is another stack's)
            stack.stop()
            stack.say("stopped.")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


def _nats_credentials(home: Path) -> str:
    """The stack's NATS URL with its password (nats.json, readable by the stack's user only), or ""."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads((home / "nats.json").read_text())["url"])
    return ""


def status(args: argparse.Namespace) -> int:
    """`rlvr status`: each service's health, and the embedded NATS's (a client's handshake), from a
    running `rlvr up` (its stack.json) or the configured addresses; 1 when any is not SERVING."""
    from rlvr.infra.nats_server import check_nats

    home = args.home.expanduser() if getattr(args, "home", None) else default_home()
    addresses = {name: f"127.0.0.1:{port}" for name, port in DEFAULT_PORTS.items()}
    nats_url = web_url = ""
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((home / "stack.json").read_text())
        addresses.update(state["addresses"])
        nats_url = state.get("nats_url", "")
        web_url = state.get("web_url", "")
    for name in DEFAULT_PORTS:
        env = os.environ.get(f"RLVR_{name.upper()}_ADDRESS")
        if env:
            addresses[name] = env
    ok = True
    replicas = sorted((n for n in addresses if n.startswith("rollout-")), key=lambda n: int(n.split("-")[1]))
    for name in (*SERVICES, *replicas):
        st = check_health(addresses[name])
        ok &= st == "SERVING"
        print(f"{name:<10} {addresses[name]:<24} {st}")
    if nats_url:  # the stack's own NATS: the services' events stop while it is down
        st = check_nats(_nats_credentials(home) or nats_url)
        ok &= st == "SERVING"
        print(f"{NATS:<10} {nats_url:<24} {st}")
    if web_url:
        print(f"{WEB:<10} {web_url:<24} {check_web(web_url)}")
    return 0 if ok else 1
