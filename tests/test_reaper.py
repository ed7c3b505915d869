"""rlvr.infra.reaper on real processes: what a process hands the reaper dies with it, kill -9
included, down to the grandchildren; a clean exit that closes the pipe leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlvr.infra.reaper import children, stop_process_groups

PARENT = r"""
import subprocess, sys, time
from rlvr.infra.reaper import children, reap_with_this_process

# A child with a grandchild of its own, as vLLM's engine core has its worker.
child = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"])
time.sleep(1.0)
reaper = reap_with_this_process(children())
print(child.pid, reaper.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_what_a_killed_process_started_dies_with_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1], start_new_session=True)
    try:
        child, reaper = (int(x) for x in parent.stdout.readline().split())  # type: ignore[union-attr]
        grandchildren = children(child)
        assert grandchildren and _alive(child) and _alive(reaper)
        os.kill(parent.pid, signal.SIGKILL)  # the parent alone, as an OOM killer or kill -9 does
        parent.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in (child, reaper, *grandchildren)):
            assert time.monotonic() < deadline, "the child, its child or the reaper outlived the parent"
            time.sleep(0.1)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)


def test_a_pid_that_is_another_process_now_is_left_alone() -> None:
    """The watcher kills a target only if it is still the process it was given (its start time): a
    target that ended and whose pid another process took is not killed, nor its children."""
    from rlvr.infra.reaper import stat_fields

    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    started = int(stat_fields(other.pid)[19])  # type: ignore[index]  # clock ticks since boot
    watcher = subprocess.Popen([sys.executable, "-m", "rlvr.infra.reaper", f"{other.pid}:{started - 500}"],
                               stdin=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    try:
        watcher.stdin.close()  # type: ignore[union-attr]  # as when the process that started it dies
        assert watcher.wait(30) == 0
        assert _alive(other.pid)  # started 500 ticks after the process the watcher was given: another one
        watched = subprocess.Popen([sys.executable, "-m", "rlvr.infra.reaper", f"{other.pid}:{started!r}"],
                                   stdin=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
        watched.stdin.close()  # type: ignore[union-attr]
        assert watched.wait(30) == 0 and other.wait(10) == -signal.SIGKILL  # the same one: killed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(other.pid, signal.SIGKILL)


def test_stop_process_groups_terms_each_group_then_kills_what_stays() -> None:
    """A group that ends on SIGTERM ends with its child; one that ignores it is killed after the grace."""
    polite = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & wait; sleep 60"], start_new_session=True)
    time.sleep(0.5)  # both shells have started their sleeps
    sleeps = children(polite.pid) + children(stubborn.pid)
    assert len(sleeps) == 2
    started = time.monotonic()
    stop_process_groups([polite, stubborn], grace=1.0)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    assert not [p for p in sleeps if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]]


def test_children_started_beside_a_grpc_channel_all_start_and_die_with_the_parent() -> None:
    """gRPC's fork handlers (grpc/grpc#43055) aborted about 1 in 100 children forked to run a
    `preexec_fn` in a process with a channel ("epoll_wait error: Bad file descriptor") before they
    could exec: a stack's service or NATS that never started. `parent_death_command` needs no
    `preexec_fn`: 300 starts beside a live channel all run their command, and the signal still
    reaches the child when its parent is killed."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rlvr.infra.reaper import parent_death_command

    with grpc.insecure_channel("127.0.0.1:1") as channel:  # a refused call starts gRPC's poller
        with contextlib.suppress(grpc.RpcError):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.2)
        failed = []
        for _ in range(300):
            child = subprocess.run(parent_death_command(["/bin/sh", "-c", "echo ran"]), capture_output=True,
                                   text=True, start_new_session=True, timeout=30)
            if child.returncode != 0 or child.stdout != "ran\n":
                failed.append((child.returncode, child.stderr[-300:]))
        assert not failed, failed

    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; from rlvr.infra.reaper import parent_death_command; "
        "c = subprocess.Popen(parent_death_command(['sleep', '600'])); print(c.pid, flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}/cmdline").read_bytes() != b"sleep\x00600\x00":  # exec'd: the command keeps the pid
        assert time.monotonic() < deadline, Path(f"/proc/{child}/cmdline").read_bytes()
        time.sleep(0.01)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"{child} outlived its parent"


def test_an_exit_without_teardown_keeps_what_a_normal_exit_does(tmp_path: Path) -> None:
    """The job process's end: its threads finish (an idle executor's too), atexit functions run, what Python and C buffered
    reaches the file, the code is the process's; only the modules' teardown is skipped (an object
    that would speak from its finalizer there stays silent)."""
    script = """
import atexit, ctypes, sys, threading, time
from pathlib import Path
from rlvr.infra.reaper import exit_without_teardown

out = Path(sys.argv[1])
class Loud:
    def __del__(self, path=out / "teardown"):
        path.write_text("ran")
keep = Loud()
atexit.register(lambda: (out / "atexit").write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("ran"))).start()
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(1)  # left idle, never shut down: its worker must not hold the exit
pool.submit(lambda: None).result()
print("python's buffer", end="")
ctypes.CDLL(None).printf(b"C's buffer")
exit_without_teardown(3) if sys.argv[2] == "fast" else sys.exit(3)
"""
    for mode in ("fast", "normal"):
        out = tmp_path / mode
        out.mkdir()
        with open(out / "out.log", "wb") as log:
            code = subprocess.run([sys.executable, "-c", script, str(out), mode], stdout=log, stderr=subprocess.STDOUT,
                                  cwd=Path(__file__).resolve().parents[1], timeout=60).returncode
        assert code == 3
        assert (out / "out.log").read_text() in ("python's bufferC's buffer", "C's bufferpython's buffer")
        assert (out / "atexit").read_text() == (out / "thread").read_text() == "ran"
    assert not (tmp_path / "fast" / "teardown").exists()
    assert (tmp_path / "normal" / "teardown").read_text() == "ran"  # the teardown that was skipped
