"""rlvr.infra.reaper on real processes: what a process hands the reaper dies with it, kill -9
included, down to the grandchildren; a clean exit that closes the pipe leaves nothing behind."""

from __future__ import annotations

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
