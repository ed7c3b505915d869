"""NATS subjects and message ids of rlvr's events: which subject carries what, and the ids that let
the stream drop a duplicate (rlvr/infra/events.py publishes and reads them).

Subjects: `rlvr.jobs.<id>.metrics` (one MetricEvent per step), `rlvr.jobs.<id>.status`,
`rlvr.jobs.<id>.samples.<step>`, `rlvr.loops.<id>.status`, `rlvr.evals.<id>.status`; an id is one
subject token (letters, digits, '_' or '-').
"""

from __future__ import annotations

import re

# A subject token must not contain the separator or wildcards, or one job could read another's. Job,
# evaluation and loop ids are tokens (the trainer checks a job id with it: it is a folder name too).
SUBJECT_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _token(kind: str, value: str) -> str:
    if not SUBJECT_TOKEN_RE.match(value):
        raise ValueError(
            f"{kind} {value!r} cannot be a subject token: use letters, digits, '_' or '-' (1-128)"
        )
    return value


def job_metrics_subject(job_id: str) -> str:
    return f"rlvr.jobs.{_token('job_id', job_id)}.metrics"


def job_status_subject(job_id: str) -> str:
    return f"rlvr.jobs.{_token('job_id', job_id)}.status"


def job_events_subject(job_id: str) -> str:
    """Both of a job's subjects (metrics and status): what a live watch of one job reads."""
    return f"rlvr.jobs.{_token('job_id', job_id)}.*"


def job_samples_subject(job_id: str, step: int) -> str:
    """A step's sample of completions (CompletionSamples): a subject of its own per step, so the
    experiment trackers' bridge reads one step's with `EventBus.last_message`, and a job's watch
    (`job_events_subject`) does not carry them."""
    return f"rlvr.jobs.{_token('job_id', job_id)}.samples.{int(step)}"


def loop_status_subject(loop_id: str) -> str:
    return f"rlvr.loops.{_token('loop_id', loop_id)}.status"


def eval_status_subject(evaluation_id: str) -> str:
    return f"rlvr.evals.{_token('evaluation_id', evaluation_id)}.status"


ALL_JOB_METRICS = "rlvr.jobs.*.metrics"
ALL_JOB_EVENTS = "rlvr.jobs.>"
"""Every event of every job (metrics and status): read as one stream, the order between them holds."""
ALL_STATUS = "rlvr.*.*.status"


def metric_msg_id(job_id: str, step: int) -> str:
    """The dedup id of a job's step: the same step published twice is stored once."""
    return f"{job_id}:{step}"


def samples_msg_id(job_id: str, step: int) -> str:
    return f"{job_id}:samples:{step}"


def status_msg_id(job_id: str, status: str, again: str = "") -> str:
    """The dedup id of a job's status event, `<job>:status:<STATUS>` in the store's spelling
    (QUEUED, RUNNING, COMPLETED, ...), whoever publishes it: when the scheduler and the trainer
    publish the same transition, the stream keeps one. `again` names a repeat of a status the job
    had before, with news (a resume, a wait for a peer, a new queue reason): an id of its own, or
    the stream would drop it as the first one's duplicate."""
    return f"{job_id}:status:{status}" + (f":{again}" if again else "")
