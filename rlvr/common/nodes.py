"""What the trainer and the scheduler agree on about a job of several nodes (advanced.num_nodes):
how a worker says that its part of the job ended because another node's part went away, so that
the scheduler names the node that was lost rather than the ones that lost it."""

from __future__ import annotations

PEER_LOST = "lost its peer node"
"""How a worker's last_job_error begins when its part ended because a peer's part was gone (its
collective failed: services/trainer/job/distributed.py `peer_lost`): a consequence, not a cause."""


def peer_lost_error(cause: str) -> str:
    """The error a part that lost its peer reports: PEER_LOST, then the collective's own error."""
    return f"{PEER_LOST}: {cause}"


def ended_by_peer(error: str) -> bool:
    """True for a part's error that says it lost its peer (`peer_lost_error`)."""
    return error.startswith(PEER_LOST)
