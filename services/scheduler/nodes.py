"""The node failure rule of a job of several nodes (advanced.num_nodes), as pure functions of what
the workers answer and since when they have not: no store, no gRPC, no clock of its own.

Each dispatch round (dispatch.py) asks every worker its state; `Outages` keeps, per worker, since
when it has not answered (wall-clock seconds). `judge` then reads a running job's nodes:

- node 0 reports the job ended (not lost): that is the job's outcome (`ENDED`);
- a node whose worker has not answered for `lost_after_s` (the scheduler's node_lost_seconds) is
  lost, whatever the others do (`LOST`): the job is queued again to resume, and the survivors
  are released for other work while it waits;
- a node that cannot be reached yet, or still runs its part: the job stays RUNNING (`AT_WORK`);
- no node runs the job any more: it is queued again to resume (`LOST`), naming the nodes whose
  part went away of its own (killed, a worker restarted), not those that only lost their peer
  (rlvr.common.nodes.ended_by_peer), which are the consequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rlvr.common.nodes import ended_by_peer
from rlvr.services.scheduler.convert import TERMINAL
from rlvr.services.scheduler.workers import WorkerState

ENDED, AT_WORK, LOST = "ended", "at work", "lost"


def clock_time(t: float) -> str:
    """A wall-clock time as a status message gives it: "2026-12-02 14:03:07 UTC"."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Outages:
    """Since when each worker has not answered: `observe` every round with what each answered
    (None: not reached)."""

    def __init__(self) -> None:
        self.down_since: dict[str, float] = {}

    def observe(self, states: Mapping[str, WorkerState | None], now: float) -> None:
        for address, state in states.items():
            if state is None:
                self.down_since.setdefault(address, now)
            else:
                self.down_since.pop(address, None)


@dataclass(frozen=True)
class LostNode:
    rank: int
    address: str
    cause: str
    since: float | None = None  # not answering since (wall-clock seconds); None: its worker answered

    def describe(self) -> str:
        return f"node {self.rank} ({self.address}): {self.cause}"


@dataclass(frozen=True)
class Verdict:
    kind: str  # ENDED, AT_WORK or LOST
    lost: tuple[LostNode, ...] = ()
    stop: tuple[str, ...] = ()  # nodes other than 0 that still run their part: stopped before the resume

    @property
    def since(self) -> float | None:
        """The earliest outage among the lost nodes (None: every lost node answered)."""
        times = [n.since for n in self.lost if n.since is not None]
        return min(times) if times else None

    def what(self) -> str:
        """The lost nodes: "node 1 (HOST:PORT)", or "nodes 0 and 1" (`why` gives their addresses)."""
        if len(self.lost) == 1:
            return f"node {self.lost[0].rank} ({self.lost[0].address})"
        ranks = [str(n.rank) for n in self.lost]
        return f"nodes {', '.join(ranks[:-1])} and {ranks[-1]}" if ranks else "a node"

    def was(self) -> str:
        return "were" if len(self.lost) > 1 else "was"

    def why(self) -> str:
        """Their causes, in one line."""
        if len(self.lost) == 1:
            return self.lost[0].cause
        return "; ".join(n.describe() for n in self.lost) or "no node runs the job any more"


def judge(job_id: str, addresses: Sequence[str], states: Mapping[str, WorkerState | None],
          down_since: Mapping[str, float], now: float, lost_after_s: float) -> Verdict:
    """What a RUNNING job of several nodes (`addresses`, node 0 first) has come to (the module's doc)."""
    parts = [states.get(a) for a in addresses]
    node0 = parts[0]
    if node0 is not None and node0.job_id != job_id and node0.last_job_id == job_id \
            and node0.last_status in TERMINAL and not node0.last_lost:
        return Verdict(ENDED)
    gone = [LostNode(rank, a, f"its worker has not answered since {clock_time(down_since.get(a, now))}",
                     down_since.get(a, now))
            for rank, (a, p) in enumerate(zip(addresses, parts, strict=True))
            if p is None and now - down_since.get(a, now) >= lost_after_s]
    if gone:
        stop = tuple(a for rank, (a, p) in enumerate(zip(addresses, parts, strict=True))
                     if rank > 0 and p is not None and p.job_id == job_id)
        ended = [n for n in _causes(job_id, addresses, parts) if not _by_peer(n)]
        return Verdict(LOST, tuple(sorted([*gone, *ended], key=lambda n: n.rank)), stop)
    if any(p is None or p.job_id == job_id for p in parts):
        return Verdict(AT_WORK)  # at work, not reached yet, or a part still ending (it loses its peer)
    causes = _causes(job_id, addresses, parts)
    own = [n for n in causes if not _by_peer(n)]
    return Verdict(LOST, tuple(own or causes))


def _by_peer(node: LostNode) -> bool:
    return ended_by_peer(node.cause)


def _causes(job_id: str, addresses: Sequence[str], parts: Sequence[WorkerState | None]) -> list[LostNode]:
    """Each answering node whose part no longer runs and did not complete, with its worker's word."""
    causes = []
    for rank, (a, p) in enumerate(zip(addresses, parts, strict=True)):
        if p is None or p.job_id == job_id:
            continue
        if p.last_job_id != job_id:
            causes.append(LostNode(rank, a, "its worker no longer knows the job (restarted?)"))
        elif p.last_status != "COMPLETED":
            causes.append(LostNode(rank, a, p.last_error or p.last_status or "its part ended"))
    return causes
