"""Job processes forked from a process that has imported the job's libraries once.

A job process that starts as a fresh interpreter imports torch, transformers, peft and TRL (and,
through TRL, vLLM, mlflow, wandb and trackio) before its first step: about 10 s of CPU on this
project's 2-core hosts, paid again by every job, and by every resume of one. The worker instead
starts this module when the service starts (`ForkServer`, `JobSupervisor.warm`): it imports those
libraries while the worker waits for work, then forks each job process from itself on request, so
a job starts with them in memory (shared copy-on-write). A job that comes before the imports are
done waits for them, which is no longer than its own import would take.

A forked job process is what a fresh one is: `python -m rlvr.services.trainer.process.job_process ...`
run as `__main__` in a session of its own, stdout and stderr into its job.log, the worker's
environment and working folder as of the request, and the same command line in /proc/PID/cmdline
(written over this process's own, for which it starts with room to spare), so `ps` and a
restarted worker (`worker._end_orphan`) know it by it. Its parent is this process, which dies with
the worker (PR_SET_PDEATHSIG) and ignores SIGTERM and SIGINT (a stop of the worker's process group
must leave the job to the worker's own cancel); each job process dies with this process.

Fork safety: this process forks from its one thread, having run no torch operation (no OpenMP
pool, no CUDA context); the native threads some libraries start on import (OpenBLAS, jemalloc's)
have their own fork handlers. `job_start = "auto"` (settings.py) forks only on a host without a GPU
driver: CUDA state must not cross a fork, and there a job starts as a fresh interpreter.

Protocol, one JSON object a line: the worker writes requests on stdin (`{"id", "module", "args",
"log", "env", "cwd"}`); this process answers on the stdout it was given (`{"ready": true,
"failed": {module: error}}` once, `{"id", "pid"}` or `{"id", "error"}` for a request, `{"exited":
pid, "code": c}` for each job process that ended, c negative for a signal as in subprocess), and
exits at the end of its stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import json
import logging
import os
import runpy
import selectors
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from rlvr.infra import reaper
from rlvr.services.trainer.capabilities import GPU_DRIVER_FILES

log = logging.getLogger("rlvr.trainer.forkserver")

# What a job process imports before its first step (job_process.run, runner.run_job, engine.py).
JOB_LIBRARIES = (
    "torch", "transformers", "peft", "accelerate", "datasets", "trl",
    "rlvr.services.trainer.job.runner", "rlvr.services.trainer.job.engine", "rlvr.services.trainer.job.scorers",
    "rlvr.services.trainer.process.publisher", "rlvr.services.trainer.job.replicas",
)
# Names inside those libraries that import the rest on first use (transformers' and TRL's lazy modules).
_LAZY_NAMES = {"transformers": ("AutoModelForCausalLM", "AutoTokenizer", "TrainerCallback"),
               "peft": ("LoraConfig", "PeftModel", "get_peft_model"), "trl": ("GRPOConfig", "GRPOTrainer"),
               "datasets": ("Dataset",)}
TITLE_ROOM = 4096  # bytes of command line kept free for a job process's own (its job folder's path)


def forks_jobs(job_start: str, driver_files: Sequence[str] = GPU_DRIVER_FILES) -> bool:
    """Whether a worker forks its job processes (TrainerSettings.job_start)."""
    return job_start == "fork" or (job_start == "auto" and not any(Path(f).exists() for f in driver_files))


class ForkServerError(Exception):
    """The fork server could not start a job process (or could not itself start)."""


# ---------------------------------------------------------------------------- the fork server

@dataclass
class _Request:
    id: int
    module: str
    args: list[str]
    log: str
    env: dict[str, str]
    cwd: str


def _preload(modules: Sequence[str]) -> dict[str, str]:
    """Imports `modules` (and the names their lazy modules resolve on use); {module: error} for
    those that failed: a job then imports what it needs itself."""
    failed = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
            for attr in _LAZY_NAMES.get(name, ()):
                getattr(module, attr)
        except Exception as e:  # noqa: BLE001 - any failure only costs the job its own import
            failed[name] = f"{type(e).__name__}: {e}"
    return failed


def set_title(argv: Sequence[str]) -> bool:
    """Writes `argv` (NUL-separated) over this process's command line, as /proc/PID/cmdline and ps
    show it; False where it does not fit (or off Linux). The rest of the area is NUL-padded, which
    keeps the kernel reading the area's arguments as separate ones."""
    fields = reaper.stat_fields() or []
    try:
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (stat fields 48, 49)
    except (ValueError, IndexError):  # no /proc, or a kernel without them
        return False
    title = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    if not start or len(title) > end - start:
        return False
    ctypes.memmove(start, title.ljust(end - start, b"\0"), end - start)
    return True


class _Server:
    def __init__(self, out_fd: int) -> None:
        self.out_fd = out_fd
        self.buffer = b""
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()  # non-inheritable, as os.pipe makes them
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def send(self, message: Mapping[str, object]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.out_fd, data):]

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> _Request | None:
        """Forks a job process per request; returns the request in the forked process, None in this
        one at the end of stdin."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the wakeup fd
        self.selector.register(0, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    self.reap()
                    continue
                chunk = os.read(0, 65536)
                if not chunk:
                    return None
                self.buffer += chunk
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    request = _Request(**json.loads(line))
                    if self.fork(request):
                        return request
            self.reap()

    def fork(self, request: _Request) -> bool:
        """True in the forked process; in this one, answers the request with the pid or the error."""
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            log_fd = os.open(request.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            self.send({"id": request.id, "error": f"cannot open the job log {request.log}: {e}"})
            return False
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(log_fd)
            self.send({"id": request.id, "error": f"fork failed: {e}"})
            return False
        if pid == 0:
            self._become_job(request, log_fd, server_pid)
            return True
        os.close(log_fd)
        self.send({"id": request.id, "pid": pid})
        return False

    def _become_job(self, request: _Request, log_fd: int, server_pid: int) -> None:
        """In the forked process: what `python -m MODULE ARGS` started by the worker would have."""
        reaper.die_with_parent(server_pid)  # SIGKILL when this server dies, whatever the module does
        os.setsid()  # a session of its own: a cancel (killpg) reaches its children too
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (null, log_fd, self.wake_r, self.wake_w, self.out_fd):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request.env)
        os.chdir(request.cwd)
        set_title([sys.executable, "-m", request.module, *request.args])
        logging.root.handlers.clear()  # the job configures its own


def main(argv: list[str] | None = None) -> int:
    """`python -m rlvr.services.trainer.process.forkserver PARENT_PID MODULES ROOM`: MODULES comma-separated,
    ROOM spaces that only reserve command-line room for the job processes' own."""
    args = sys.argv[1:] if argv is None else argv
    parent_pid, modules = int(args[0]), [m for m in args[1].split(",") if m]
    problem = reaper.die_with_parent(parent_pid)  # exits now if the worker is gone already
    if problem:
        print(f"rlvr fork server: {problem}: its job processes may outlive the worker", file=sys.stderr)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the worker stops its jobs, then closes stdin
    out_fd = os.dup(1)
    os.dup2(2, 1)  # what a library prints goes to the log, never into the answers
    failed = _preload(modules)
    server = _Server(out_fd)
    server.send({"ready": True, "failed": failed})
    request = server.serve()
    if request is None:
        return 0
    # The forked job process: the module as `python -m` runs it; its exit is this process's.
    sys.argv = [request.module, *request.args]
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)
    return 0


# ---------------------------------------------------------------------------- the worker's side

class ForkedProcess:
    """A job process forked by the fork server: the part of asyncio.subprocess.Process the worker
    uses (pid, returncode, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = asyncio.get_running_loop().create_future()

    def _end(self, code: int) -> None:
        if not self._ended.done():
            self.returncode = code
            self._ended.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)


class ForkServer:
    """The worker's handle on its fork server: started on `start()` (or the first `spawn`, and
    again after it ended), which returns once it has imported `modules`; `spawn` forks a job
    process from it."""

    def __init__(self, modules: Sequence[str] = JOB_LIBRARIES, room: int = TITLE_ROOM) -> None:
        self.modules, self.room = tuple(modules), room
        self._process: asyncio.subprocess.Process | None = None
        self._ready: asyncio.Future[dict[str, str]] | None = None
        self._answers: dict[int, asyncio.Future[ForkedProcess]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._next_id = 0
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def start(self) -> None:
        """Starts the server if it is not running, and waits until it has imported its modules."""
        if self._starting is None or (self._starting.done() and self.pid is None):
            self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        # The event loop's thread starts it: PR_SET_PDEATHSIG follows the thread that forked.
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, str(os.getpid()), ",".join(self.modules), " " * self.room,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None,
            limit=1 << 20,
        )
        self._reader = loop.create_task(self._read(self._process))
        failed = await self._ready
        for module, error in failed.items():
            log.warning("fork server (pid %d): could not preload %s (%s); each job imports it itself",
                        self._process.pid, module, error)
        log.info("fork server (pid %d) ready: job processes start with %s imported", self._process.pid,
                 ", ".join(m for m in self.modules if m not in failed) or "nothing")

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            async for line in process.stdout:
                message = json.loads(line)
                if "ready" in message:
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(message.get("failed", {}))
                elif "exited" in message:
                    child = self._children.pop(message["exited"], None)
                    if child is not None:
                        child._end(int(message["code"]))
                elif (answer := self._answers.pop(message["id"], None)) is not None and not answer.done():
                    if "pid" in message:  # registered here: its "exited" may be the next line
                        child = self._children[message["pid"]] = ForkedProcess(int(message["pid"]))
                        answer.set_result(child)
                    else:
                        answer.set_exception(ForkServerError(message["error"]))
        finally:
            await self._gone(process)

    async def _gone(self, process: asyncio.subprocess.Process) -> None:
        """The server ended: requests in flight fail; its job processes die with it (SIGKILL),
        each reported once it is gone."""
        code = await process.wait()
        error = ForkServerError(f"the fork server (pid {process.pid}) ended with code {code}")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        for answer in self._answers.values():
            if not answer.done():
                answer.set_exception(error)
        self._answers.clear()
        children, self._children = self._children, {}
        for child in children.values():
            await _gone_pid(child.pid)
            child._end(-signal.SIGKILL)

    async def spawn(self, module: str, args: Sequence[str], log_path: Path,
                    env: Mapping[str, str] | None = None, cwd: str | None = None) -> ForkedProcess:
        """Forks `python -m module args` with stdout and stderr appended to `log_path`."""
        await self.start()
        process = self._process
        if process is None or process.returncode is not None or process.stdin is None:
            raise ForkServerError("the fork server is not running")
        self._next_id += 1
        request_id = self._next_id
        answer: asyncio.Future[ForkedProcess] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        request = {"id": request_id, "module": module, "args": list(args), "log": str(log_path),
                   "env": dict(os.environ if env is None else env), "cwd": cwd or os.getcwd()}
        process.stdin.write((json.dumps(request) + "\n").encode())
        await process.stdin.drain()
        return await answer

    async def close(self) -> None:
        """Ends the server (the end of its stdin, SIGKILL if it is still importing a second later:
        it holds nothing to save); job processes still running die with it."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 1)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._starting is not None and not self._starting.done():
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def _running(pid: int) -> bool:
    """Whether `pid` is still running (neither gone nor a zombie)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _gone_pid(pid: int) -> None:
    """Waits until `pid` (no child of this process) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while _running(pid):
            await asyncio.sleep(0.1)
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    def done() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, done)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


if __name__ == "__main__":
    reaper.exit_without_teardown(main())  # the server, or a job module that returned: nothing to tear down
