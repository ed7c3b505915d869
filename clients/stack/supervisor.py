"""The local stack's process supervisor: `Stack` runs an embedded NATS and all five services (and
the web console) as child processes on one machine; `supervise` starts a service, or NATS, that dies
again.

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

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.clients.stack.config import (
    NATS,
    NATS_SERVICES,
    NATS_USER,
    RESTART_WINDOW,
    SERVICES,
    WEB,
    StackConfig,
    service_command,
    service_of,
    web_command,
)
from rlvr.peers.base import check_health

if TYPE_CHECKING:
    from rlvr.infra.nats_server import EmbeddedNats


def check_web(url: str, timeout: float = 2.0) -> str:
    """"SERVING" when the console answers its /healthz, else "UNREACHABLE"."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as resp:  # noqa: S310 (our own URL)
            return "SERVING" if resp.status == 200 else "UNREACHABLE"
    except OSError:
        return "UNREACHABLE"


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
    reaped, do not count)."""
    import psutil

    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
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
        self.nats: EmbeddedNats | None = None
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
        self.cfg.home.mkdir(parents=True, exist_ok=True)
        self._lock_home()  # before anything is written: another stack's tokens and state stay its own
        self.logs.mkdir(parents=True, exist_ok=True)
        self._make_tokens()
        self.prepare_model()
        self.start_nats()
        for name in self.cfg.names:
            self._launch(name)
        if self.cfg.web_port is not None:
            self._launch(WEB)
        self._write_state()

    def start_nats(self) -> None:
        """The embedded NATS, its URL with the password in nats.json (0600)."""
        from rlvr.infra.nats_server import EmbeddedNats

        nats = EmbeddedNats(self.cfg.home / "nats", port=self.cfg.nats_port, host=self.cfg.host,
                            user=NATS_USER, password=self.nats_password)
        nats.start()
        self.nats = nats
        _write_private(self.nats_file, json.dumps({"url": nats.url_with_credentials}))
        self.say(f"{NATS:<10} {nats.url:<24} pid {nats.pid}")

    def _launch(self, name: str) -> None:
        from rlvr.infra.reaper import parent_death_command

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
            env[f"RLVR_{name.upper()}_NATS_URL"] = self.nats.url_with_credentials
            for key in (f"RLVR_{name.upper()}_NATS_URL_FILE", f"RLVR_{name.upper()}_NATS_CA_FILE",
                        "RLVR_NATS_URL_FILE", "RLVR_NATS_CA_FILE"):
                env.pop(key, None)  # the caller's would replace the stack's NATS (see NatsFields)
        log_file = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (held by the child)
        command = web_command(self.cfg) if name == WEB else service_command(name, self.cfg)
        self.procs[name] = subprocess.Popen(
            parent_death_command(command),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
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
        """Installs the shipped tiny model (rlvr-tiny-headroom) or builds another here, with progress on
        the console, rather than silently inside the rollout server's start (a first build takes
        minutes; later ones are reused); a shipped model whose bits differ stops the start here."""
        from rlvr.models import is_tiny, resolve_model

        if is_tiny(self.cfg.model):
            path = resolve_model(self.cfg.model, progress=lambda m: self.say(f"  {m}"))
            self.say(f"model      {self.cfg.model} -> {path}")

    def _write_state(self) -> None:
        from rlvr.infra.events import redact_url

        assert self.nats is not None
        config = {**asdict(self.cfg), "database_url": redact_url(self.cfg.database_url)}
        state = {"pid": os.getpid(), "nats_url": self.nats.url, "nats_pid": self.nats.pid,
                 "addresses": self.cfg.addresses, "web_url": self.cfg.web_url,
                 "tokens_file": str(self.tokens_file), "nats_file": str(self.nats_file),
                 "pids": {n: p.pid for n, p in self.procs.items()}, "config": config,
                 "metrics": {n: f"http://{self.cfg.host}:{p}/metrics" for n, p in self.cfg.metrics_ports.items()}}
        (self.cfg.home / "stack.json").write_text(json.dumps(state, indent=2, default=str))

    def dead(self) -> list[tuple[str, int]]:
        """The processes that died, (name, exit status): the services, the console and NATS."""
        dead = [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]
        code = self.nats.returncode if self.nats is not None else None
        return dead if code is None else [(NATS, code), *dead]

    def pid(self, name: str) -> int | None:
        if name == NATS:
            return self.nats.pid if self.nats is not None else None
        return self.procs[name].pid

    def revive(self, name: str) -> None:
        """Starts a dead process again. A service with its command line (same port, same NATS,
        same store): what it ran picks up from the store; its process group goes first, so that an
        engine subprocess of the dead one holds neither its port nor its memory. NATS on its port
        with its data folder and password: the services' clients reconnect by themselves, and
        JetStream finds the stream and the durable consumers it had (NatsStartError when it cannot
        start, e.g. its port was taken meanwhile)."""
        if name == NATS:
            assert self.nats is not None
            self.nats.start()
            self._write_state()
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        self._relaunch(name)

    def _relaunch(self, name: str) -> None:
        """A service started again, and stack.json naming its new pid."""
        self._launch(name)
        if self.nats is not None:
            self._write_state()

    def log_path(self, name: str) -> Path:
        if name == NATS and self.nats is not None:
            return Path(self.nats.log_path)
        return self.logs / f"{name}.log"

    def report_dead(self, name: str, code: int) -> None:
        what = "" if name == NATS else "service "
        self.say(f"\n{what}{name} exited with code {code}; last lines of {self.log_path(name)}:")
        self.say(_tail(self.log_path(name)))

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
            self.nats.stop()
            self.nats = None
        with contextlib.suppress(OSError):
            (self.cfg.home / "stack.json").unlink()
        for secret in (self.tokens_file, self.nats_file):
            with contextlib.suppress(OSError):
                secret.unlink()  # this run's tokens and NATS password end with it
        os.close(self._lock_fd)  # the home is free for the next stack
        self._lock_fd = None


def supervise(stack: Stack, poll: float = 1.0, stop: threading.Event | None = None) -> int:
    """Watches a SERVING stack until it is stopped (the caller's signal handler raises, or `stop` is
    set: then 0): a process that dies, a service or NATS, is reported with the end of its log and
    started again after a back-off (1, 2, 4 ... 30 s), so one crash does not take the others down:
    what a service ran resumes from the store, and NATS comes back on its port with its JetStream
    files, where the services' clients reconnect by themselves. One that died more than
    `max_restarts` times in RESTART_WINDOW seconds (a NATS that cannot start again counts as a
    death) stops the stack: 1."""
    from rlvr.infra.nats_server import NatsStartError

    restarts: dict[str, list[float]] = {}
    due: dict[str, float] = {}  # name -> when to start it again

    def died(name: str, now: float) -> bool:
        """Schedules the restart; False when the restarts are spent."""
        recent = [t for t in restarts.get(name, []) if now - t < RESTART_WINDOW]
        what = "" if name == NATS else "service "
        if len(recent) >= stack.cfg.max_restarts:
            stack.say(f"{what}{name} died {len(recent) + 1} times in {RESTART_WINDOW:.0f} s "
                      f"(at most {stack.cfg.max_restarts} restarts); stopping the stack")
            return False
        delay = min(30.0, 2.0 ** len(recent))
        restarts[name] = [*recent, now]
        due[name] = now + delay
        stack.say(f"restarting {name} in {delay:.0f} s (restart {len(recent) + 1} of at most "
                  f"{stack.cfg.max_restarts} in {RESTART_WINDOW:.0f} s)")
        return True

    while stop is None or not stop.is_set():
        now = time.monotonic()
        for name, rc in stack.dead():
            if name in due:
                continue
            stack.report_dead(name, rc)
            if not died(name, now):
                return 1
        for name, when in list(due.items()):
            if now >= when:
                del due[name]
                try:
                    stack.revive(name)
                except NatsStartError as e:
                    stack.say(f"{name} did not start again: {e}")
                    if not died(name, now):
                        return 1
                    continue
                stack.say(f"{name:<10} restarted, pid {stack.pid(name)}")
        if stop is None:
            time.sleep(poll)
        else:
            stop.wait(poll)
    return 0
