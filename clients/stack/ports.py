"""Port picking for the local stack: a free port for each service that `rlvr up --base-port 0`,
`local_stack` and the tests start, picked before any of them binds it."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

# Ports this process has handed out: not handed out again, as a caller picks several before any
# of its services binds one.
_handed_out: set[int] = set()
_PICK_RANGE = (15000, 30000)  # below Linux's ephemeral range (32768-60999 by default)
# Ports any process of this machine's user handed out lately, one file each: two processes that
# pick at the same time (two `rlvr up`, two test workers starting stacks) never pick the same port,
# which the bind check alone cannot see while neither has bound it yet. A claim older than this is
# stale: its service bound the port long ago (the bind check sees it) or never will.
CLAIMS = Path(tempfile.gettempdir()) / f"rlvr-ports-{os.getuid()}"
CLAIM_S = 600.0


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


def _claim(port: int) -> bool:
    """True when this process is the one to hand `port` out: no other process claimed it in the
    last CLAIM_S seconds. Without a claims folder (read-only temp), this process's own record."""
    if port in _handed_out:
        return False
    try:
        CLAIMS.mkdir(exist_ok=True)
        path = CLAIMS / str(port)
        for _ in range(2):
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                break
            except FileExistsError:
                try:
                    if time.time() - path.stat().st_mtime < CLAIM_S:
                        return False
                    path.unlink()  # stale: whoever unlinks and creates first takes it
                except FileNotFoundError:
                    pass
        else:
            return False
    except OSError:
        pass
    _handed_out.add(port)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a service to bind later: picked at random below the
    kernel's ephemeral range, and never one this process handed out before.

    The kernel's own pick (bind to port 0) comes from the ephemeral range, which every outgoing
    connection on the machine also draws its local port from. A port picked there and bound a
    few seconds later can be taken in between by any connection, such as another service's link
    to NATS, and the service then fails to start. Below that range only a listener that chose its
    port can clash, and the bind check sees those. Falls back to the kernel's pick when the
    ephemeral range leaves no room below it. A port another process picked in the last ten minutes
    is not picked again (CLAIMS)."""
    low = min(_PICK_RANGE[1], _ephemeral_range()[0])
    if low - _PICK_RANGE[0] >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_PICK_RANGE[0], low)
            if _listenable(host, port) and _claim(port):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if _claim(port):
            return port
