"""A job's samples of completions, read off the event stream: the few completions the trainer
publishes per step (CompletionSamples, on `job_samples_subject(job, step)`, just before the step's
metrics, so there once the step is stored). The store keeps no completions: the stream is where
they live, for as long as it keeps them (its limits), so a step it no longer keeps has none.

Two readers: the tracking bridge (tracking.py, each stored step's table for the trackers) and
`GetJobSamples` (the latest steps, for the console's job page, `rlvr jobs samples` and the SDK).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlvr.common.errors import InvalidArgument, Unavailable
from rlvr.infra.events import EventBus
from rlvr.infra.subjects import job_samples_subject
from rlvr.services.scheduler.convert import spec_from_json
from rlvr.services.scheduler.jobs import JobManager
from rlvr.v1 import common_pb2, scheduler_pb2

log = logging.getLogger("rlvr.scheduler.samples")

DEFAULT_STEPS = 5
"""Steps GetJobSamples answers when the request says none (`limit` 0)."""
MAX_STEPS = 100
"""Steps GetJobSamples answers at most."""


async def step_samples(bus: EventBus, job_id: str, step: int) -> common_pb2.CompletionSamples | None:
    """The step's samples as the trainer published them; None when the stream has none for it.
    A stream that cannot be read raises (the bus's own error)."""
    data = await bus.last_message(job_samples_subject(job_id, step))
    return None if data is None else common_pb2.CompletionSamples.FromString(data)


async def samples_by_step(bus: EventBus | None, job_id: str, steps: Sequence[int]
                          ) -> dict[int, common_pb2.CompletionSamples]:
    """Each step's samples that the stream still has; a step it cannot read is left out (logged at
    debug): the callers that take many steps treat the samples as the optional part."""
    out: dict[int, common_pb2.CompletionSamples] = {}
    if bus is None:
        return out
    for step in steps:
        try:
            event = await step_samples(bus, job_id, step)
        except Exception as e:  # noqa: BLE001 (an optional part: the metrics go on without it)
            log.debug("job %s step %d: no completions sample (%s)", job_id, step, e)
            continue
        if event is not None:
            out[step] = event
    return out


def sample_rows(step: int, event: common_pb2.CompletionSamples) -> list[dict[str, object]]:
    """A step's samples as the trackers' table rows (step, prompt, completion, reward, accuracy)."""
    return [{"step": step, "prompt": s.prompt, "completion": s.completion, "reward": s.reward,
             "accuracy": s.accuracy} for s in event.samples]


async def job_samples(jobs: JobManager, request: scheduler_pb2.GetJobSamplesRequest
                      ) -> scheduler_pb2.GetJobSamplesResponse:
    """GetJobSamples: one step's samples, or those of the latest `limit` stored steps, newest first."""
    if not request.job_id:
        raise InvalidArgument("job_id: required (the id CreateJob returned)")
    if request.step < 0:
        raise InvalidArgument(f"step: {request.step} is out of range; 1 or more, or 0 for the latest steps")
    if not 0 <= request.limit <= MAX_STEPS:
        raise InvalidArgument(f"limit: {request.limit} is out of range; 0-{MAX_STEPS} (0 = {DEFAULT_STEPS})")
    row = await jobs.job_row(request.job_id)  # NotFound naming the id
    resp = scheduler_pb2.GetJobSamplesResponse(job_id=row.id,
                                               environment=spec_from_json(row.spec_json).environment.key)
    if request.step:
        steps = [request.step]
    else:
        stored = [p.step for p in await jobs.metric_points(row.id)]
        steps = sorted(stored, reverse=True)[:request.limit or DEFAULT_STEPS]
    if not steps:
        return resp
    if jobs.bus is None:
        raise Unavailable("the scheduler has no event stream: the samples of completions live there")
    for step in steps:
        try:
            event = await step_samples(jobs.bus, row.id, step)
        except Exception as e:  # noqa: BLE001 (NATS down or slow: the caller may ask again)
            raise Unavailable(f"the event stream could not be read for job {row.id}'s samples (step {step}): "
                              f"{type(e).__name__}: {e}") from None
        if event is not None:
            resp.steps.append(event)
    return resp
