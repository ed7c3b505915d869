"""The code sandbox's zygote: a pre-started interpreter that forks one locked-down child per run.

Standalone, standard library only, never imported by rlvr: :class:`rlvr.rewards.sandbox.Sandbox` (runner.py)
starts it as ``python -I -S -B zygote.py CONFIG`` with an empty environment, stdin and
stdout as pipes (frames of a 4-byte big-endian length and a JSON object; see ``Zygote``) and the
configuration as a JSON argument. docs/code-reward.md describes the layers; in order:

1. the zygote dies with the thread that started it (``PR_SET_PDEATHSIG``) or when its stdin closes;
2. it unshares new network, mount, PID and IPC namespaces (directly as root, inside a new user
   namespace otherwise; just a network namespace, or nothing, where the host refuses) and forks an
   inner zygote that is PID 1 of the new PID namespace, so killing it kills every run;
3. in the mount namespace the whole tree is made read-only, a size-capped tmpfs on ``/tmp`` holds
   the runs' directories, and a fresh ``/proc`` shows only the sandbox's own processes;
4. each run is a fork: its own session and process group, a fresh directory, stdout/stderr into a
   file there (so the file-size limit caps them), setrlimit (CPU, address space, file size,
   processes, open files, no core), uid ``nobody`` (or no capabilities in a user namespace),
   ``no_new_privs`` (set once in the zygote, inherited); then (``harness``) an audit hook and an import allowlist;
5. a wall-time deadline kills the run's process group; every child of the zygote that is not a live
   run is killed after each run, so nothing outlives it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import struct
import sys
import time
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Any


def _load(name: str) -> ModuleType:
    """A sibling module, by path: this script runs with ``-I -S``, outside any package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from rlvr.rewards.sandbox import harness, setup
else:
    setup, harness = _load("setup"), _load("harness")

MAX_RESULT_BYTES = 1 << 20  # a child's report; more is treated as the output limit
FD_RESULT = 3  # the child's end of its report pipe
SETTLE_S = 5.0  # how long after a run ends, or a stray was found, strays are still looked for (every 50 ms)
# Loaded on first use by allowed modules (datetime.strptime, str.encode): preloaded with them, for
# hosts where a run's user cannot read the standard library.
LAZY_IMPORTS = ("_strptime", "locale", "encodings.idna", "encodings.cp1252", "encodings.latin_1",
                "encodings.ascii", "encodings.utf_16", "encodings.utf_32", "encodings.unicode_escape")
NOBODY = setup.NOBODY


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


class Run:
    __slots__ = ("id", "code", "tests", "pid", "pidfd", "rfd", "dir", "start", "deadline", "buf", "killed", "eof")

    def __init__(self, request: dict[str, Any]) -> None:
        self.id = request["id"]
        self.code: str = request["code"]
        self.tests: list[list[str]] = request["tests"]
        self.pid = self.pidfd = self.rfd = -1
        self.dir = ""
        self.start = self.deadline = 0.0
        self.buf = bytearray()
        self.killed = ""
        self.eof = False


class Zygote:
    """The event loop: requests on stdin, a child per run, one reply frame per run on stdout.

    Request ``{"op": "run", "id", "code", "tests": [[kind, source], ...]}`` (kind ``v``: an
    expression whose value is reported, ``a``: statements that must not raise) or
    ``{"op": "shutdown"}``. Reply ``{"id", "reason", "payload", "cpu", "wall"}``: ``reason`` is a
    code (``wall``, ``cpu``, ``memory``, ``output``, ``blocked:...``, ``crash:...``, ...) or ""
    with ``payload`` the child's JSON report.
    """

    def __init__(self, cfg: dict[str, Any], base: str, private_base: bool, creds: str, pid_namespace: bool) -> None:
        self.cfg, self.base, self.private_base, self.creds = cfg, base, private_base, creds
        self.pid_namespace = pid_namespace
        self.runs: dict[int, Run] = {}  # by pid
        self.queue: deque[Run] = deque()
        self.strays: set[int] = set()
        # Until when the children are swept every 50 ms after a run ended: the processes of a killed
        # run's group reach the zygote (reparented, as the PID namespace's init) only as their own
        # parents die, which on a loaded host can be a while after the run's end and its sweep.
        self.sweep_until = 0.0
        self.sel = selectors.DefaultSelector()
        self.inbuf = bytearray()
        self.me = os.getpid()
        self.children_file = f"/proc/self/task/{self.me}/children"

    def serve(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        while True:
            deadlines = [r.deadline for r in self.runs.values() if not r.killed]
            polled = [r for r in self.runs.values() if r.pidfd < 0]  # no pidfd (Linux < 5.3): polled
            if self.strays or polled or time.monotonic() < self.sweep_until:
                deadlines.append(time.monotonic() + (0.01 if polled else 0.05))
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            for key, _ in self.sel.select(timeout):
                if key.data is None:
                    if not self._read_requests():
                        return self.shutdown()
                else:
                    kind, target = key.data
                    current = self.runs.get(target.pid)
                    if current is None or current is not target:
                        continue  # finished earlier in this batch of events
                    self._on_exit(current) if kind == "exit" else self._on_report(current)
            for run in polled:
                exited = os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if exited is not None and self.runs.get(run.pid) is run:
                    self._on_exit(run)
            if self.strays or time.monotonic() < self.sweep_until:
                self._sweep()
            now = time.monotonic()
            for run in list(self.runs.values()):
                if not run.killed and now >= run.deadline:
                    self._kill(run, "wall")

    def _read_requests(self) -> bool:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.inbuf += data
        while len(self.inbuf) >= 4:
            (size,) = struct.unpack(">I", self.inbuf[:4])
            if len(self.inbuf) < 4 + size:
                break
            request = json.loads(bytes(self.inbuf[4 : 4 + size]))
            del self.inbuf[: 4 + size]
            if request.get("op") == "shutdown":
                return False
            self.queue.append(Run(request))
        self._start_queued()
        return True

    def _start_queued(self) -> None:
        while self.queue and len(self.runs) < self.cfg["workers"]:
            run = self.queue.popleft()
            try:
                self._start(run)
            except OSError as exc:  # the host's fault (no memory, no space, no pids), not the code's
                if run.pid > 0:
                    self.runs.pop(run.pid, None)
                    self._kill(run, "error")
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(run.pid, 0)
                for fd in (run.rfd, run.pidfd):
                    if fd >= 0:
                        if fd in self.sel.get_map():
                            self.sel.unregister(fd)
                        os.close(fd)
                shutil.rmtree(run.dir, ignore_errors=True)
                os.write(1, _frame({"id": run.id, "error": f"cannot start the run: {exc}"}))

    def _start(self, run: Run) -> None:
        run.dir = os.path.join(self.base, "run-" + secrets.token_hex(8))
        os.mkdir(run.dir, 0o700)
        if self.creds == "nobody":
            os.chown(run.dir, NOBODY, NOBODY)
        rfd, wfd = os.pipe()
        run.start = time.monotonic()
        run.deadline = run.start + self.cfg["wall"]
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            raise
        if pid == 0:
            self._child(run, wfd)  # never returns
        os.close(wfd)
        run.pid, run.rfd = pid, rfd
        os.set_blocking(rfd, False)
        self.runs[pid] = run
        self.sel.register(rfd, selectors.EVENT_READ, ("report", run))
        try:
            run.pidfd = os.pidfd_open(pid)
        except OSError:
            return  # the event loop polls it
        self.sel.register(run.pidfd, selectors.EVENT_READ, ("exit", run))

    def _child(self, run: Run, wfd: int) -> None:
        try:
            os.setsid()
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: exceeding the file size kills
            out = os.open(os.path.join(run.dir, ".output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.dup2(wfd, FD_RESULT)
            os.closerange(FD_RESULT + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            os.chdir(run.dir)
            cfg = self.cfg
            cpu = max(1, int(-(-cfg["cpu"] // 1)))  # whole seconds, rounded up
            for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                                 (resource.RLIMIT_AS, (cfg["memory"],) * 2),
                                 (resource.RLIMIT_FSIZE, (cfg["file"],) * 2),
                                 (resource.RLIMIT_NPROC, (cfg["processes"],) * 2),
                                 (resource.RLIMIT_NOFILE, (cfg["open_files"],) * 2),
                                 (resource.RLIMIT_CORE, (0, 0)),
                                 (resource.RLIMIT_MEMLOCK, (0, 0)),
                                 (resource.RLIMIT_MSGQUEUE, (0, 0))):
                resource.setrlimit(limit, value)
            if self.creds == "nobody":
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            elif self.creds == "caps":
                setup.drop_capabilities()
            if not self.pid_namespace:  # (in one, the zygote's death ends every process in it)
                setup.prctl(setup.PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
            if os.getppid() != self.me:
                os._exit(71)
            harness.run(run.code, run.tests, run.dir, cfg, FD_RESULT)
        except BaseException:
            pass
        os._exit(70)

    def _kill(self, run: Run, why: str) -> None:
        """SIGKILL the run's process group (its id is the run's pid: the child made itself a session
        leader) and the run itself; only while it is not reaped, so its pid cannot be reused yet."""
        run.killed = run.killed or why
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(run.pid, signal.SIGKILL)

    def _on_report(self, run: Run) -> None:
        while not run.eof:
            try:
                data = os.read(run.rfd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                run.eof = True
                self.sel.unregister(run.rfd)
                return
            run.buf += data
            if len(run.buf) > MAX_RESULT_BYTES and not run.killed:
                self._kill(run, "output")
                return

    def _on_exit(self, run: Run) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)  # the rest of its group; the leader is a zombie until reaped
        _, status, usage = os.wait4(run.pid, 0)
        wall = time.monotonic() - run.start
        cpu = usage.ru_utime + usage.ru_stime
        self._on_report(run)
        for fd in (run.rfd, run.pidfd):
            if fd >= 0:
                if fd in self.sel.get_map():
                    self.sel.unregister(fd)
                os.close(fd)
        del self.runs[run.pid]
        shutil.rmtree(run.dir, ignore_errors=True)
        self._sweep()
        self.sweep_until = time.monotonic() + SETTLE_S
        reason, payload = self._verdict(run, status, cpu)
        os.write(1, _frame({"id": run.id, "reason": reason, "payload": payload, "cpu": cpu, "wall": wall}))
        self._start_queued()

    def _verdict(self, run: Run, status: int, cpu: float) -> tuple[str, str | None]:
        if run.killed:
            return run.killed, None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= self.cfg["cpu"]):
                return "cpu", None
            if sig == signal.SIGXFSZ:
                return "output", None
            try:
                return "crash:" + signal.Signals(sig).name, None
            except ValueError:
                return f"crash:{sig}", None
        buf = bytes(run.buf)
        if not buf:
            return f"noresult:{os.waitstatus_to_exitcode(status)}", None
        kind, text = buf[:1], buf[1:].decode("utf-8", "replace")
        if kind == b"V":
            return "blocked:" + text[:300], None
        if kind == b"M":
            return "memory", None
        if kind == b"R":
            return "", text
        return "malformed", None

    def _sweep(self) -> None:
        """Kill every child of the zygote that is not a live run (an orphan reparented to it)."""
        try:
            with open(self.children_file) as f:
                children = {int(p) for p in f.read().split()}
        except OSError:
            children = set()
        strays = (children - set(self.runs)) | self.strays
        if strays:  # their own children reach the zygote as they die: go on looking a while
            self.sweep_until = max(self.sweep_until, time.monotonic() + SETTLE_S)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        give_up = time.monotonic() + 0.1  # SIGKILL takes effect within microseconds to milliseconds
        while strays:
            for pid in list(strays):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    strays.discard(pid)
            if strays and time.monotonic() < give_up:
                time.sleep(0.002)
            else:
                break
        self.strays = strays  # retried on the next sweep (the event loop comes back within 50 ms)

    def shutdown(self) -> None:
        for run in list(self.runs.values()):
            self._kill(run, "shutdown")
        for run in list(self.runs.values()):
            os.waitpid(run.pid, 0)
            shutil.rmtree(run.dir, ignore_errors=True)
        self.runs.clear()
        self._sweep()
        if not self.private_base:
            shutil.rmtree(self.base, ignore_errors=True)


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    setup.prctl(setup.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:
        return 1
    os.environ.clear()
    iso: dict[str, str] = {"network": "audit hook only", "pid": "process group + child subreaper",
                           "proc": "host /proc", "environment": "empty (started with no variables)"}
    try:
        if cfg["namespaces"]:
            ns = setup.enter_namespaces(iso)
        else:
            iso["namespaces"] = "turned off"
            ns = {"pid_ns": False, "mount_ns": False, "creds": "nobody" if os.geteuid() == 0 else "none"}
        if ns["pid_ns"]:
            inner = os.fork()
            if inner:
                null = os.open("/dev/null", os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)  # the parent sees EOF as soon as the inner zygote is gone
                _, status = os.waitpid(inner, 0)
                return os.waitstatus_to_exitcode(status)
            setup.prctl(setup.PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != 0:  # the outer zygote, outside this PID namespace, died already
                return 1
        else:
            setup.prctl(setup.PR_SET_CHILD_SUBREAPER, 1)
        base, private = setup.setup_filesystem(iso, ns["mount_ns"], ns["pid_ns"], cfg["disk"])
        if ns["creds"] == "nobody":
            iso["user"] = f"nobody (uid {NOBODY})"
        iso.setdefault("user", "same user (no user namespace, not root)")
        for name in (*cfg["allowed"], *LAZY_IMPORTS):  # warm: a run's import is a dictionary lookup
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        if ns["creds"] == "nobody" and not setup.others_can_read(os.path.dirname(os.__file__)):
            iso["imports"] = (f"preloaded modules only: nobody cannot read the standard library "
                              f"({os.path.dirname(os.__file__)})")
        # Inherited by every run: no execve can gain privileges (setuid binaries), fixed for good.
        setup.prctl(setup.PR_SET_NO_NEW_PRIVS, 1)
        zygote = Zygote(cfg, base, private, ns["creds"], ns["pid_ns"])
        gc.collect()
        gc.freeze()  # a run's garbage collections leave the zygote's objects (and their pages) alone
    except Exception as exc:
        os.write(1, _frame({"error": f"{type(exc).__name__}: {exc}", "isolation": iso}))
        return 1
    os.write(1, _frame({"ready": True, "isolation": iso, "base": base, "private_base": private}))
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
