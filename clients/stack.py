"""The local stack: `rlvr up` runs an embedded NATS and all five services as child processes on
one machine, and the web console (`rlvr web`) beside them on its own port; `rlvr status` prints
each service's health.

Processes: every service runs in its own process group (so vLLM's engine subprocess goes with
it) and gets SIGTERM if `rlvr up` itself dies (PR_SET_PDEATHSIG), so no orphan is left behind.
On Ctrl-C or SIGTERM the services stop in reverse start order (scheduler first, NATS last), each
with a grace period, then SIGKILL for whatever is left. A service that dies is reported with the
tail of its log, and the stack stops: a half stack is not hidden behind a green banner.

Auth, zero-config: each start makes two random tokens, a service token (the services present it to
each other; it may call the internal RPCs) and a user token (the stack's own clients: the web
console, `rlvr` commands, `local_stack`'s SDK client), and writes them to `<home>/tokens.json`
(0600), which the services read as their tokens file and stack.json names for the SDK
(`ClientSettings`, `ClientSettings.for_stack`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlvr.common.settings import DEFAULT_PORTS
from rlvr.peers.base import check_health

# Start order: the services others depend on come first.
SERVICES = ("reward", "rollout", "trainer", "benchmark", "scheduler")
WEB = "web"  # the web console's process (clients/web): HTTP, not gRPC; started last, stopped first
DEFAULT_WEB_PORT = 8050
NATS_SERVICES = ("scheduler", "trainer", "benchmark")  # the services that publish or read events
NATS_USER = "rlvr"  # the embedded NATS's one user; its password is made at each start
RESTART_WINDOW = 600.0  # seconds over which StackConfig.max_restarts counts a service's restarts
GRPC_NAMES = {
    "scheduler": "rlvr.v1.SchedulerService",
    "trainer": "rlvr.v1.TrainerService",
    "reward": "rlvr.v1.RewardService",
    "rollout": "rlvr.v1.RolloutService",
    "benchmark": "rlvr.v1.BenchmarkService",
}


def replica_name(k: int) -> str:
    """The process name of rollout replica k (1 is "rollout" itself)."""
    return "rollout" if k == 1 else f"rollout-{k}"


def service_of(name: str) -> str:
    """The service a process name runs ("rollout-2" runs the rollout service)."""
    return "rollout" if name.startswith("rollout-") else name


def _home() -> Path:
    from rlvr.common.settings import rlvr_home

    return rlvr_home() / "stack"


# Ports this process has handed out: not handed out again, as a caller picks several before any
# of its services binds one.
_handed_out: set[int] = set()
_PICK_RANGE = (15000, 30000)  # below Linux's ephemeral range (32768-60999 by default)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _listenable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a service to bind later: picked at random below the
    kernel's ephemeral range, and never one this process handed out before.

    The kernel's own pick (bind to port 0) comes from the ephemeral range, which every outgoing
    connection on the machine also draws its local port from. A port picked there and bound a
    few seconds later can be taken in between by any connection, such as another service's link
    to NATS, and the service then fails to start. Below that range only a listener that chose its
    port can clash, and the bind check sees those. Falls back to the kernel's pick when the
    ephemeral range leaves no room below it."""
    low = min(_PICK_RANGE[1], _ephemeral_range()[0])
    if low - _PICK_RANGE[0] >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_PICK_RANGE[0], low)
            if port not in _handed_out and _listenable(host, port):
                _handed_out.add(port)
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@dataclass
class StackConfig:
    home: Path = field(default_factory=_home)
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    nats_port: int = 0
    database_url: str = ""
    model: str = "rlvr-tiny"
    rollout_backend: str = "vllm"
    memory_fraction: float = 0.3
    start_timeout: float = 300.0
    log_format: str = "json"
    web_port: int | None = None  # the web console's port; None: no console
    web_host: str = "127.0.0.1"  # loopback unless asked (--web-host); beyond it the console asks for a login
    # `rlvr up` starts a service that dies again, at most this many times in RESTART_WINDOW seconds
    # (then it stops everything, as a stack that keeps crashing is not serving anyone).
    max_restarts: int = 5
    # Rollout servers: "rollout", then "rollout-2" ... (ports[name] each); the trainer and the
    # benchmark get all their addresses (rollout_addresses).
    rollout_replicas: int = 1
    # Each service process's Prometheus /metrics port (`rlvr up --metrics`: free ones); empty: none served.
    metrics_ports: dict[str, int] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The services' process names in start order, the extra rollout replicas after "rollout"."""
        extra = tuple(replica_name(k) for k in range(2, self.rollout_replicas + 1))
        return tuple(n for name in SERVICES for n in ((name, *extra) if name == "rollout" else (name,)))

    @property
    def addresses(self) -> dict[str, str]:
        return {name: f"{self.host}:{port}" for name, port in self.ports.items()}

    @property
    def web_url(self) -> str:
        from rlvr.clients.web.server import url

        return url(self.web_host, self.web_port) if self.web_port is not None else ""


def web_command(cfg: StackConfig) -> list[str]:
    """The web console's command line: a client of the stack's scheduler and benchmark service."""
    a = cfg.addresses
    return [sys.executable, "-m", "rlvr.clients.web", "--host", cfg.web_host, "--port", str(cfg.web_port),
            "--scheduler-address", a["scheduler"], "--benchmark-address", a["benchmark"]]


def check_web(url: str, timeout: float = 2.0) -> str:
    """"SERVING" when the console answers its /healthz, else "UNREACHABLE"."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as resp:  # noqa: S310 (our own URL)
            return "SERVING" if resp.status == 200 else "UNREACHABLE"
    except OSError:
        return "UNREACHABLE"


def service_command(name: str, cfg: StackConfig) -> list[str]:
    """The child process's command line: the service's own module with explicit flags (the NATS
    URL, which holds the embedded server's password, and the database URL, which may hold one, go
    in the environment: see Stack._launch)."""
    a = cfg.addresses
    artifacts = str(cfg.home / "artifacts")
    port, replica, name = cfg.ports[name], name.removeprefix("rollout"), service_of(name)  # replica: "", "-2" ...
    cmd = [sys.executable, "-m", f"rlvr.services.{name}.main", "--host", cfg.host, "--port", str(port),
           "--log-format", cfg.log_format]
    if name in ("scheduler", "trainer"):
        cmd += ["--artifact-root", artifacts]
    if name in ("trainer", "benchmark"):
        cmd += ["--rollout-address", a["rollout"], "--reward-address", a["reward"]]
        if cfg.rollout_replicas > 1:
            cmd += ["--rollout-addresses", ",".join(a[n] for n in cfg.names if service_of(n) == "rollout")]
    if name == "scheduler":
        cmd += ["--trainer-addresses", a["trainer"], "--benchmark-address", a["benchmark"],
                "--reward-address", a["reward"]]
    if name == "benchmark":  # trained adapters it may upload for an evaluation: the stack's own
        cmd += ["--adapter-roots", artifacts]
    if name == "rollout":
        cmd += ["--model", cfg.model, "--backend", cfg.rollout_backend,
                "--memory-fraction", str(cfg.memory_fraction),
                "--adapter-root", str(cfg.home / f"rollout-adapters{replica}")]
    return cmd


def _write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by this user only (0600), replaced atomically."""
    temp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(temp, path)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still runs (zombies, which only wait to be
    reaped, do not count). Reads /proc; False where there is none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp, ...
            return True
    return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class StackBusy(RuntimeError):
    """Another `rlvr up` (or demo) holds this home: starting here would overwrite its tokens and state."""


class Stack:
    """NATS plus the five services as child processes. One stack per home folder: `start` locks
    `<home>/stack.lock` for this process's life, and a second stack on that home is refused
    (StackBusy) before it writes anything there."""

    def __init__(self, cfg: StackConfig, out: object = sys.stdout) -> None:
        self.cfg = cfg
        self.out = out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.nats: object | None = None
        self.logs = cfg.home / "logs"
        self.service_token = ""
        self.user_token = ""
        self.nats_password = ""
        self._lock_fd: int | None = None  # <home>/stack.lock, held (flock) from start to stop

    @property
    def holds_home(self) -> bool:
        """Started (its home locked), and not stopped yet."""
        return self._lock_fd is not None

    @property
    def tokens_file(self) -> Path:
        return self.cfg.home / "tokens.json"

    @property
    def nats_file(self) -> Path:
        return self.cfg.home / "nats.json"

    def _make_tokens(self) -> None:
        """Fresh tokens for this run, and the embedded NATS's password, in files only this user can
        read (tokens.json; nats.json, written once NATS runs: its URL with the credentials)."""
        import secrets

        self.service_token, self.user_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.nats_password = secrets.token_urlsafe(24)
        _write_private(self.tokens_file, json.dumps({self.service_token: "service", self.user_token: "user"},
                                                    indent=2))

    def client_settings(self, *, service: bool = False) -> Any:
        """SDK settings (`rlvr.clients.sdk.ClientSettings`) for this stack: its addresses and its user
        token (`service=True`: the service token, which may also call the internal RPCs, e.g.
        RolloutService/LoadAdapter, as an operator would)."""
        from rlvr.clients.sdk import ClientSettings

        return ClientSettings(**{f"{name}_address": self.cfg.addresses[name] for name in SERVICES},
                              token=self.service_token if service else self.user_token)

    def say(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)  # type: ignore[call-overload]

    def _lock_home(self) -> None:
        """Takes `<home>/stack.lock` (an flock: the kernel drops it when this process ends, however
        it ends), or raises StackBusy naming the home."""
        import fcntl

        fd = os.open(self.cfg.home / "stack.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StackBusy(f"a stack already runs with its state in {self.cfg.home} (`rlvr status --home "
                            f"{self.cfg.home}` shows it): stop it first, or start this one with another --home"
                            ) from None
        self._lock_fd = fd

    def start(self) -> None:
        from rlvr.infra.nats_server import EmbeddedNats

        self.cfg.home.mkdir(parents=True, exist_ok=True)
        self._lock_home()  # before anything is written: another stack's tokens and state stay its own
        self.logs.mkdir(parents=True, exist_ok=True)
        self._make_tokens()
        self.prepare_model()
        nats = EmbeddedNats(self.cfg.home / "nats", port=self.cfg.nats_port, host=self.cfg.host,
                            user=NATS_USER, password=self.nats_password)
        nats.start()
        self.nats = nats
        _write_private(self.nats_file, json.dumps({"url": nats.url_with_credentials}))
        self.say(f"nats       {nats.url:<24} pid {nats.pid}")
        for name in self.cfg.names:
            self._launch(name)
        if self.cfg.web_port is not None:
            self._launch(WEB)
        self._write_state(nats.url)

    def _launch(self, name: str) -> None:
        from rlvr.infra.reaper import parent_death_hook

        assert self.nats is not None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if name == WEB:  # a client of the stack, with the user token
            env["RLVR_TOKEN"] = self.user_token
        else:  # a service: accepts the tokens file's tokens, calls its peers with the service token
            env["RLVR_AUTH_TOKEN"] = self.service_token
            env["RLVR_AUTH_TOKENS_FILE"] = str(self.tokens_file)
            service = service_of(name).upper()
            for key in ("RLVR_AUTH_TOKEN_FILE", f"RLVR_{service}_AUTH_TOKEN",
                        f"RLVR_{service}_AUTH_TOKEN_FILE", f"RLVR_{service}_AUTH_TOKENS_FILE"):
                env.pop(key, None)  # the stack's own tokens, not ones the caller's environment had
        for key in ("RLVR_METRICS_PORT", f"RLVR_{service_of(name).upper()}_METRICS_PORT"):
            env.pop(key, None)  # one port for five processes would clash: the stack's own, or none
        if name in self.cfg.metrics_ports:
            env[f"RLVR_{service_of(name).upper()}_METRICS_PORT"] = str(self.cfg.metrics_ports[name])
        if name in ("scheduler", "benchmark"):  # a URL that may hold a password: never on a command line
            env[f"RLVR_{name.upper()}_DATABASE_URL"] = self.cfg.database_url or f"sqlite:///{self.cfg.home / 'rlvr.db'}"
        if name in NATS_SERVICES:  # the URL with the password: in the environment, never on a command line
            env[f"RLVR_{name.upper()}_NATS_URL"] = self.nats.url_with_credentials  # type: ignore[attr-defined]
            for key in (f"RLVR_{name.upper()}_NATS_URL_FILE", f"RLVR_{name.upper()}_NATS_CA_FILE",
                        "RLVR_NATS_URL_FILE", "RLVR_NATS_CA_FILE"):
                env.pop(key, None)  # the caller's would replace the stack's NATS (see NatsFields)
        log_file = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (held by the child)
        command = web_command(self.cfg) if name == WEB else service_command(name, self.cfg)
        self.procs[name] = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, preexec_fn=parent_death_hook(),
        )
        log_file.close()

    def restart(self, name: str, sig: signal.Signals = signal.SIGKILL, timeout: float = 120.0,
                group: bool = True) -> bool:
        """Kills one service's process group (`group`; else its main process alone) with `sig`
        (SIGKILL: a crash, no clean-up), starts it again with the same command line and waits
        until it is SERVING again; False on timeout."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        self._relaunch(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                return False
            if check_health(self.cfg.addresses[name], timeout=1.0) == "SERVING":
                return True
            time.sleep(0.3)
        return False

    def prepare_model(self) -> None:
        """Builds the bundled tiny model here, with progress on the console, rather than silently
        inside the rollout server's start (the first build takes minutes; later ones are reused)."""
        from rlvr.models import is_tiny, resolve_model

        if is_tiny(self.cfg.model):
            path = resolve_model(self.cfg.model, progress=lambda m: self.say(f"  {m}"))
            self.say(f"model      {self.cfg.model} -> {path}")

    def _write_state(self, nats_url: str) -> None:
        from rlvr.infra.events import redact_url

        config = {**asdict(self.cfg), "database_url": redact_url(self.cfg.database_url)}
        state = {"pid": os.getpid(), "nats_url": nats_url, "addresses": self.cfg.addresses, "web_url": self.cfg.web_url,
                 "tokens_file": str(self.tokens_file), "nats_file": str(self.nats_file),
                 "pids": {n: p.pid for n, p in self.procs.items()}, "config": config,
                 "metrics": {n: f"http://{self.cfg.host}:{p}/metrics" for n, p in self.cfg.metrics_ports.items()}}
        (self.cfg.home / "stack.json").write_text(json.dumps(state, indent=2, default=str))

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]

    def revive(self, name: str) -> None:
        """Starts a dead service again with its command line (same port, same NATS, same store);
        what it ran picks up from the store. Its process group goes first: an engine subprocess
        of the dead one must not hold its port or memory."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        self._relaunch(name)

    def _relaunch(self, name: str) -> None:
        """A service started again, and stack.json naming its new pid."""
        self._launch(name)
        if self.nats is not None:
            self._write_state(self.nats.url)  # type: ignore[attr-defined]

    def report_dead(self, name: str, code: int) -> None:
        self.say(f"\nservice {name} exited with code {code}; last lines of {self.logs / (name + '.log')}:")
        self.say(_tail(self.logs / f"{name}.log"))

    def wait_serving(self) -> bool:
        """Waits until every health check answers SERVING; False if a service died or time ran out."""
        deadline = time.monotonic() + self.cfg.start_timeout
        pending = set(self.cfg.names) | ({WEB} if WEB in self.procs else set())
        while pending and time.monotonic() < deadline:
            for name, code in self.dead():
                self.report_dead(name, code)
                return False
            for name in sorted(pending):
                if name == WEB:
                    if check_web(self.cfg.web_url, timeout=1.0) == "SERVING":
                        pending.discard(name)
                        self.say(f"{name:<10} {self.cfg.web_url:<24} pid {self.procs[name].pid}  SERVING "
                                 "(the web console)")
                elif check_health(self.cfg.addresses[name], timeout=1.0) == "SERVING":
                    pending.discard(name)
                    metrics = self.cfg.metrics_ports.get(name)
                    self.say(f"{name:<10} {self.cfg.addresses[name]:<24} pid {self.procs[name].pid}  SERVING"
                             + (f"  metrics :{metrics}" if metrics else ""))
            if pending:
                time.sleep(0.5)
        if pending:
            self.say(f"\nnot SERVING after {self.cfg.start_timeout:.0f} s: {', '.join(sorted(pending))} "
                     f"(logs in {self.logs})")
            return False
        return True

    def stop(self, grace: float = 15.0) -> None:
        if not self.holds_home:
            return  # never started (or refused: the home is another stack's), or stopped already
        for name in (WEB, *reversed(self.cfg.names)):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            # The group too: an engine subprocess that outlived its service goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (state D)
                    proc.wait(timeout=5)
        # Back only once every process of every group is gone: a killed multi-GB engine takes a
        # moment to give its memory back, and a caller may start the next stack at once.
        deadline = time.monotonic() + 10
        while any(group_alive(proc.pid) for proc in self.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.nats is not None:
            self.nats.stop()  # type: ignore[attr-defined]
            self.nats = None
        with contextlib.suppress(OSError):
            (self.cfg.home / "stack.json").unlink()
        for secret in (self.tokens_file, self.nats_file):
            with contextlib.suppress(OSError):
                secret.unlink()  # this run's tokens and NATS password end with it
        os.close(self._lock_fd)  # the home is free for the next stack
        self._lock_fd = None


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
                        help=f"start a service that dies again, at most this many times in {RESTART_WINDOW:.0f} s "
                             "(then stop everything; 0 = never restart)")


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


def supervise(stack: Stack, poll: float = 1.0) -> int:
    """Watches a SERVING stack until it is stopped (the caller's signal handler raises): a service
    that dies is reported with the end of its log and started again after a back-off (1, 2, 4 ...
    30 s), so one crash does not take the others down and what it ran resumes from the store. A
    service that died more than `max_restarts` times in RESTART_WINDOW seconds stops the stack: 1."""
    restarts: dict[str, list[float]] = {}
    due: dict[str, float] = {}  # name -> when to start it again
    while True:
        now = time.monotonic()
        for name, rc in stack.dead():
            if name in due:
                continue
            stack.report_dead(name, rc)
            recent = [t for t in restarts.get(name, []) if now - t < RESTART_WINDOW]
            if len(recent) >= stack.cfg.max_restarts:
                stack.say(f"service {name} died {len(recent) + 1} times in {RESTART_WINDOW:.0f} s "
                          f"(at most {stack.cfg.max_restarts} restarts); stopping the stack")
                return 1
            delay = min(30.0, 2.0 ** len(recent))
            restarts[name] = [*recent, now]
            due[name] = now + delay
            stack.say(f"restarting {name} in {delay:.0f} s (restart {len(recent) + 1} of at most "
                      f"{stack.cfg.max_restarts} in {RESTART_WINDOW:.0f} s)")
        for name, when in list(due.items()):
            if now >= when:
                del due[name]
                stack.revive(name)
                stack.say(f"{name:<10} restarted, pid {stack.procs[name].pid}")
        time.sleep(poll)


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


def status(args: argparse.Namespace) -> int:
    """`rlvr status`: each service's health, from a running `rlvr up` (its stack.json) or the
    configured addresses."""
    home = args.home.expanduser() if getattr(args, "home", None) else _home()
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
    if nats_url:
        print(f"{'nats':<10} {nats_url}")
    if web_url:
        print(f"{WEB:<10} {web_url:<24} {check_web(web_url)}")
    return 0 if ok else 1
