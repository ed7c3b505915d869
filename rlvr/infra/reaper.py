"""Processes that must not outlive this one, however it ends.

A child we start ourselves gets a parent-death signal from the kernel (PR_SET_PDEATHSIG):
`parent_death_command` prefixes its command line with a few lines of Python that set it and then
exec the command (NATS, the stack's services), and `die_with_parent` sets it in a process for itself
(a trainer's job process). Not a `preexec_fn`: Python forks (instead of vfork) to run one, and the
fork runs gRPC's fork handlers in the child, whose restarted poller dies on the epoll descriptor that
`close_fds` closes before the exec (grpc/grpc#43055: about 1 start in 100 aborted with "epoll_wait
error: Bad file descriptor" in a process with a gRPC channel, such as `rlvr up` or a test).

A library may start processes of its own that we cannot give a parent-death signal: vLLM's engine
core (and its worker under it) is one, started by `AsyncLLM` in the rollout server. Killed with
`kill -9` alone, the server left them running (a 6 GB worker here), holding memory the restarted
server then needs. `reap_with_this_process` starts a small watcher that holds the read end of a
pipe whose write end only this process has: when this process is gone, for any reason, the pipe
closes, and the watcher SIGKILLs the processes it was given and every descendant of theirs, then
exits. A process that ended by itself meanwhile is recognised by its start time and left alone (its
pid may belong to another process by then). Process trees and command lines are psutil's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import psutil

__all__ = ["children", "die_with_parent", "exit_without_teardown", "parent_death_command", "reap_with_this_process",
           "stat_fields", "stop_process_groups"]

_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


# argv: PARENT_PID SIGNAL COMMAND...; libc's prctl through the interpreter's own symbols (no library
# search, which would start a process); a parent gone already (re-parented) exits at once.
_PDEATH = (f"import ctypes, os, sys; ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, int(sys.argv[2]), 0, 0, 0); "
           "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[3], sys.argv[3:])")


def parent_death_command(command: Sequence[str], sig: int = signal.SIGTERM) -> list[str]:
    """`command` started so that the kernel sends it `sig` when this process dies: a Python without
    `site` (a few milliseconds) sets PR_SET_PDEATHSIG and execs it, which keeps the pid and the
    signal. `command` unchanged off Linux.

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so start the child from a thread
    that lives as long as this process (the main thread, or the event loop's thread).
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-S", "-c", _PDEATH, str(os.getpid()), str(int(sig)), *command]


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> str | None:
    """Has the kernel send this process `sig` when its parent dies (PR_SET_PDEATHSIG; Linux only);
    a parent other than `parent_pid` (gone already: this process was re-parented) ends it now.
    Returns why the signal could not be set, or None."""
    problem = None
    if sys.platform.startswith("linux"):
        libc = _libc()
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            problem = f"prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()})"
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)
    return problem

def exit_without_teardown(code: int) -> NoReturn:
    """Ends this process as a normal exit would, less the interpreter's teardown of its modules: waits
    for the other non-daemon threads, runs the atexit functions (logging's flush, the removal of
    temporary folders, ...), flushes Python's and C's buffered output, then `os._exit(code)`.

    With torch, transformers and TRL imported the teardown alone took 1.8 s of CPU on an idle 2-core
    host, 2-5 s after a job under load, during which the job's worker still counted as busy."""
    shutdown = getattr(threading, "_shutdown", None)  # CPython's first step of an exit
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()  # threading's own exit functions (idle executors' workers told to end), then the joins
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)  # what a library printf-ed into a file
    os._exit(code)


def stat_fields(pid: int | str = "self") -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first: stat(5)'s
    field N is at index N - 3); None for a process that is gone (or no /proc). For what psutil does
    not tell: where a process's command line lies in its memory (forkserver.set_title)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """When a live process started, in clock ticks since boot (/proc/PID/stat's field 22): with its
    pid, which process it is. Not psutil's create_time, which adds the boot time as the wall clock
    has it now: a clock stepped between two readings would make the same process look like another.
    None for a process that is gone."""
    fields = stat_fields(pid)
    return None if fields is None else fields[19]


def children(pid: int | None = None) -> list[int]:
    """The direct children of `pid` (default: this process)."""
    try:
        return sorted(child.pid for child in psutil.Process(pid).children())
    except psutil.Error:
        return []


def is_resource_tracker(pid: int) -> bool:
    """Whether `pid` is multiprocessing's resource tracker: this process's own helper, which the first
    spawn of a process starts as a direct child. It exits by itself when this process does, after
    freeing the semaphores and shared memory left behind; SIGKILL would skip that."""
    try:
        return any("multiprocessing.resource_tracker" in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _watch(targets: list[str]) -> None:
    """The watcher's body (`python -m rlvr.infra.reaper PID:START ...`): wait for EOF on stdin, then
    SIGKILL the targets still alive (same start time) and all their descendants."""
    wanted = {int(p): s for p, s in (a.split(":", 1) for a in targets)}
    sys.stdin.buffer.read()  # until the process that started us is gone: EOF
    doomed: dict[int, psutil.Process] = {}
    for pid, started in wanted.items():
        try:
            process = psutil.Process(pid)
            if _started(pid) != started:
                continue  # ended by itself; the pid is another process's now
            doomed.update({p.pid: p for p in (process, *process.children(recursive=True))})
        except psutil.Error:
            continue
    for process in doomed.values():
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks that the pid is still the process it found


def stop_process_groups(procs: Iterable[subprocess.Popen[Any]], grace: float = 20.0) -> None:
    """Stops processes each started in a session of its own (`start_new_session=True`), with
    everything they started: SIGTERM to every group first (in the order given), then up to `grace`
    seconds for each to end, and SIGKILL to a group that has not."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def reap_with_this_process(pids: Iterable[int]) -> subprocess.Popen[bytes] | None:
    """Starts the watcher for `pids` (see the module docstring); None where there is no /proc or
    nothing to watch. Keep the returned handle referenced for as long as this process lives: its
    stdin is the pipe."""
    targets = [f"{pid}:{started}" for pid in pids if (started := _started(pid)) is not None]
    if not targets or not Path("/proc/self/stat").exists():
        return None
    return subprocess.Popen([sys.executable, "-m", "rlvr.infra.reaper", *targets], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


if __name__ == "__main__":
    _watch(sys.argv[1:])
