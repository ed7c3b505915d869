"""Fixtures the trainer's model tests share: one torch thread for a module, and the test-size tiny
model built once under its own name. conftest.py imports them; a module takes the thread setting
with `pytestmark = pytest.mark.usefixtures("one_thread")`. Also `job_events`, the trainer service
tests' reader of a job's NATS events (imported by name)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlvr.infra.events import EventBus
from rlvr.infra.subjects import job_events_subject
from rlvr.v1 import common_pb2 as C

TERMINAL = {C.JOB_STATUS_COMPLETED, C.JOB_STATUS_FAILED, C.JOB_STATUS_CANCELLED}


async def job_events(bus: EventBus, job_id: str, timeout_s: float, until_terminal: bool = True,
                     metrics_wanted: int = 0) -> tuple[list[C.MetricEvent], list[C.JobStatusEvent]]:
    """A job's metric and status events from the start of its stream, until it ends (a terminal
    status, with `until_terminal`) or `metrics_wanted` metric events have come; TimeoutError after
    `timeout_s`."""
    metrics: list[C.MetricEvent] = []
    statuses: list[C.JobStatusEvent] = []

    async def collect() -> None:
        async for event in bus.watch(job_events_subject(job_id)):
            if event.subject.endswith(".metrics"):
                metrics.append(C.MetricEvent.FromString(event.data))
            else:
                statuses.append(C.JobStatusEvent.FromString(event.data))
            if until_terminal and statuses and statuses[-1].status in TERMINAL:
                return
            if metrics_wanted and len(metrics) >= metrics_wanted:
                return

    await asyncio.wait_for(collect(), timeout_s)
    return metrics, statuses

__all__ = ["build_trainer_test_model", "one_thread", "tiny_model"]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread: the "test" model's matrices are tiny, and on a shared 2-core machine a
    second thread made generation 4-15x slower (measured: 0.08 s vs 0.3-1.3 s for 8 x 32 tokens)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_trainer_test_model() -> str:
    """The test-size tiny model under $RLVR_HOME, built once: `make test` runs two pytest workers
    (pytest-xdist), and both may ask for it at once, so the build holds the lock rlvr.models takes
    for its own tiny models (two builds would share one staging folder)."""
    from filelock import FileLock

    from rlvr.tiny.build import build_tiny_model, default_model_dir

    out = default_model_dir("trainer-tests-tiny-test")
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        return build_tiny_model(out, size="test").path


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return build_trainer_test_model()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A dataset file of `rows`, one JSON object a line (the SFT and Head tests' data)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def local_deps(events: list[C.MetricEvent], **kw: Any) -> Any:  # noqa: ANN401 (a JobDeps: torch stays unimported here)
    """An in-process job's dependencies: the local Math Pairs scorer, each MetricEvent into `events`."""
    from rlvr.services.trainer.job.runner import JobDeps
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings

    return JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append, **kw)
