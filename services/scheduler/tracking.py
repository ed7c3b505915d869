"""The tracking bridge: a job's stored steps mirrored into its experiment trackers.

Where the logging runs, and why here (docs/tracking.md): the scheduler already stores every step
exactly once, in order (ingest.py's one durable consumer); the bridge reads what the store holds
and writes it to the trackers. So a tracker sees exactly what the store saw, step for step; the
trainer's step never waits on a tracker (the writes run on the bridge's own threads, never the
step's or the store's); a tracker that is down only falls behind, and catches up from the store
when it answers again; and a job can be mirrored after the fact into more trackers (`TrackJob`,
`rlvr jobs track ID --to KIND:TARGET`) with the same code.

For each tracked job one task follows the store (woken by every stored change, JobManager's
`generation`): each tracker of the job (a `Mirror`) is opened on the job's first look (run created,
the spec logged as its config), fed every stored step after the last it took (with the step's
sample of completions, read off the stream: CompletionSamples, which the trainer publishes just
before the step's metrics), and once the job has ended given the final tiles and closed. A tracker call that fails is recorded (the job's link says
why: `Job.tracking[i].error`), said once in the job's events (a status event of the job's current
status whose message names the tracker), and tried again after a back-off; once the job has ended,
a tracker is given up after `MAX_ATTEMPTS` failures in a row. The job itself is never failed or
held by a tracker.

What a scheduler restart keeps: the trackers of every queued or running job are taken up again
(from the store) and log the steps stored so far into a new run; a job that ended is mirrored
again only by `TrackJob`. Links of trackers this process has not opened are derived from the spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from rlvr.common import paths
from rlvr.common.errors import InvalidArgument, NotFound, shown
from rlvr.infra.events import EventBus, cancel_and_wait
from rlvr.infra.schema import JobRow, MetricPointRow
from rlvr.infra.subjects import job_status_subject, status_msg_id
from rlvr.jobspec import job_status_value
from rlvr.services.scheduler.convert import TERMINAL, metric_event_from_row, now_ts, spec_from_json
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.metrics_card import job_metrics
from rlvr.services.scheduler.samples import sample_rows, samples_by_step
from rlvr.tracking import config as tc
from rlvr.tracking.base import Tracker, run_info
from rlvr.tracking.open import open_tracker
from rlvr.tracking.values import safe_name, spec_config, step_values, summary_values
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.scheduler.tracking")

RECHECK_S = 5.0
"""How often a job's task looks at the store when no change woke it."""
BACKOFF_S = (2.0, 10.0, 30.0, 60.0)
"""The waits after a tracker's 1st, 2nd, ... failure in a row (the last repeats)."""
MAX_ATTEMPTS = 5
"""Failures in a row after which a tracker of an ended job is given up."""
CATCH_UP_S = 20.0
"""How long TrackJob waits for its trackers to take the stored steps before it answers (inside the
SDK's 30 s deadline of a unary call); the rest is logged after the answer, as `steps_logged` shows."""


@dataclass
class Mirror:
    """One tracker of one job: its config, the tracker once opened, how far it got."""

    config: common_pb2.TrackerConfig
    from_spec: bool = False  # one of the job spec's trackers (else added by TrackJob)
    tracker: Tracker | None = None  # while open; let go once closed
    location: str = ""  # the tracker's own word, once opened
    logged: int = 0  # the last step the tracker took
    done: bool = False  # summary given and closed, or given up
    error: str = ""
    failures: int = 0
    retry_at: float = 0.0
    said: str = ""  # the error last said in the job's events
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)

    def link(self, job_name: str, job_id: str, default_mlflow: Path) -> common_pb2.TrackingLink:
        location = self.location or planned_location(self.config, job_name, job_id, default_mlflow)
        return common_pb2.TrackingLink(kind=self.config.kind, location=location, steps_logged=self.logged,
                                       error=self.error, finished=self.done and not self.error)


def planned_location(config: common_pb2.TrackerConfig, job_name: str, job_id: str, default_mlflow: Path) -> str:
    """Where a tracker logs the job, said before it is opened (or by a scheduler that did not open it)."""
    name = tc.run_name(config, job_name, job_id)
    if config.kind == common_pb2.TRACKER_KIND_TENSORBOARD:
        return str(Path(config.target) / safe_name(name))
    if config.kind == common_pb2.TRACKER_KIND_MLFLOW:
        return f"{config.target or default_mlflow.as_uri()} (experiment {tc.project(config)}, run {name})"
    if config.kind == common_pb2.TRACKER_KIND_WANDB:
        return f"{Path(config.target) / 'wandb'} (project {tc.project(config)}, run {name})"
    return f"{config.target} (trackio project {tc.project(config)}, run {name})"


def tiles_dict(row: JobRow, points: Sequence[MetricPointRow]) -> dict[str, float]:
    """The final summary tiles (StatTiles) of the job, by field name."""
    metrics = job_metrics(row, points)
    if not metrics.has_steps:
        return {}
    tiles = MessageToDict(metrics.tiles, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return summary_values({k: v for k, v in tiles.items() if k != "max_policy_lag" or metrics.tiles.max_policy_lag})


class TrackingBridge:
    def __init__(self, jobs: JobManager, bus: EventBus | None, roots: Sequence[Path], default_mlflow: Path,
                 threads: int = 4) -> None:
        self.jobs = jobs
        self.bus = bus
        self.roots = tuple(paths.resolve_all(roots))
        self.default_mlflow = default_mlflow
        self._mirrors: dict[str, list[Mirror]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._scan: asyncio.Task[None] | None = None
        self._seen: set[str] = set()  # queued or running jobs whose spec's trackers were taken up
        # The trackers' own threads: a hung tracker holds these, never the store's or the event loop's.
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tracker")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._scan = asyncio.create_task(self._scan_loop(), name="tracking-scan")

    async def stop(self) -> None:
        if self._scan is not None:
            await cancel_and_wait(self._scan)
        for task in list(self._tasks.values()):
            await cancel_and_wait(task)
        for mirrors in self._mirrors.values():
            for m in mirrors:
                if m.tracker is not None:
                    with contextlib.suppress(Exception):
                        await self._call(m.tracker.close)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ API

    def check_targets(self, configs: Sequence[common_pb2.TrackerConfig], field: str = "tracking") -> None:
        """InvalidArgument for a tracker the store-side check cannot pass: a bad config, or a local
        target outside the scheduler's tracking_roots."""
        tc.validate_trackers(configs, field)
        for i, config in enumerate(configs):
            target = config.target
            if not target or (tc.is_url(target) and not target.startswith("file:")):
                continue  # MLflow's default folder, or a server
            path = Path(target.removeprefix("file://").removeprefix("file:"))
            if not path.is_absolute():
                raise InvalidArgument(f"{field}[{i}].target: {shown(target)} is not an absolute path; the "
                                      "scheduler writes it on its own host (the CLI makes a relative path absolute)")
            if not paths.is_under(paths.resolve(path), self.roots):
                raise InvalidArgument(f"{field}[{i}].target: {shown(target)} is outside the scheduler's tracking "
                                      f"roots ({', '.join(map(str, self.roots))}; RLVR_SCHEDULER_TRACKING_ROOTS)")

    def links(self, job: common_pb2.Job) -> list[common_pb2.TrackingLink]:
        """Job.tracking: the live trackers of the job, else those its spec names (not opened here)."""
        mirrors = self._mirrors.get(job.id, [])
        if not any(m.from_spec for m in mirrors):  # the spec's trackers were not taken up by this process
            mirrors = [Mirror(config=c, from_spec=True) for c in job.spec.tracking] + mirrors
        return [m.link(job.spec.name, job.id, self.default_mlflow) for m in mirrors]

    async def job_created(self, job: common_pb2.Job) -> None:
        if job.spec.tracking and job.id not in self._seen:
            self._seen.add(job.id)
            self._add(job.id, list(job.spec.tracking), from_spec=True)

    async def track(self, job_id: str, configs: Sequence[common_pb2.TrackerConfig]) -> list[common_pb2.TrackingLink]:
        """TrackJob: more trackers for a job; answers once they took every stored step (or failed)."""
        if not configs:
            raise InvalidArgument("trackers: name at least one (--to KIND:TARGET)")
        self.check_targets(configs, "trackers")
        row = await self.jobs.job_row(job_id)
        added = self._add(job_id, list(configs))
        await self.jobs.notify()  # wakes the job's task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(m.caught_up.wait() for m in added)), CATCH_UP_S)
        return [m.link(row.name, job_id, self.default_mlflow) for m in added]

    # ------------------------------------------------------------------ internals

    def _add(self, job_id: str, configs: list[common_pb2.TrackerConfig], from_spec: bool = False) -> list[Mirror]:
        added = [Mirror(config=c, from_spec=from_spec) for c in configs]
        self._mirrors.setdefault(job_id, []).extend(added)
        task = self._tasks.get(job_id)
        if task is None or task.done():
            self._tasks[job_id] = asyncio.create_task(self._follow(job_id), name=f"tracking-{job_id}")
        return added

    async def _scan_loop(self) -> None:
        """Takes up the trackers of queued and running jobs the servicer did not hand over (a loop's
        rounds, and every tracked job after a restart)."""
        while True:
            seen = self.jobs.generation
            try:
                rows = await asyncio.to_thread(self.jobs.store.list_jobs, ["QUEUED", "RUNNING"], 10_000, 0)
                active = {r.id for r in rows}
                for row in rows:
                    if row.id in self._seen:
                        continue
                    self._seen.add(row.id)
                    spec = spec_from_json(row.spec_json)
                    if spec.tracking and not any(m.from_spec for m in self._mirrors.get(row.id, [])):
                        self._add(row.id, list(spec.tracking), from_spec=True)
                self._seen &= active | set(self._tasks)
            except Exception:
                log.exception("tracking: listing the jobs failed")
            await self.jobs.wait_change(seen, RECHECK_S)

    async def _call(self, fn, *args):  # noqa: ANN001, ANN202
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _follow(self, job_id: str) -> None:
        try:
            while True:
                seen = self.jobs.generation
                try:
                    row: JobRow | None = await self.jobs.job_row(job_id)
                except NotFound:  # deleted: nothing more to mirror
                    row = None
                except Exception as e:  # a store hiccup: the next look tries again
                    log.warning("tracking of job %s: reading the store failed (%s); trying again", job_id, e)
                    await asyncio.sleep(RECHECK_S)
                    continue
                if row is not None:
                    await self._advance(row)
                mirrors = self._mirrors.get(job_id, [])
                if row is None or all(m.done for m in mirrors):
                    if row is None:
                        for m in mirrors:
                            m.caught_up.set()
                    return
                waits = [m.retry_at - time.monotonic() for m in mirrors if not m.done and m.error]
                await self.jobs.wait_change(seen, max(0.2, min([RECHECK_S, *waits])))
        finally:
            self._tasks.pop(job_id, None)

    async def _advance(self, row: JobRow) -> None:
        mirrors = [m for m in self._mirrors.get(row.id, []) if not m.done]
        if not mirrors:
            return
        ended = row.status in TERMINAL
        after = min(m.logged for m in mirrors)
        points = await asyncio.to_thread(self.jobs.store.metric_points, row.id, after)
        samples = await self._samples(row.id, [p.step for p in points])
        tiles: dict[str, float] | None = None
        if ended:
            tiles = tiles_dict(row, await asyncio.to_thread(self.jobs.store.metric_points, row.id))
        for m in mirrors:
            if m.error and time.monotonic() < m.retry_at:
                continue
            try:
                await self._feed(row, m, points, samples, tiles)
                m.error, m.failures = "", 0
            except Exception as e:  # any tracker fault: recorded and said, never raised into the job
                m.failures += 1
                m.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")[:500]
                m.retry_at = time.monotonic() + BACKOFF_S[min(m.failures, len(BACKOFF_S)) - 1]
                log.warning("job %s: %s tracker failed (%d in a row): %s", row.id, tc.kind_name(m.config.kind),
                            m.failures, m.error)
                if ended and m.failures >= MAX_ATTEMPTS:
                    m.done = True
                    m.error = f"given up after {m.failures} failures: {m.error}"
                await self._say(row, m)
            m.caught_up.set()

    async def _samples(self, job_id: str, steps: Sequence[int]) -> dict[int, list[dict[str, object]]]:
        """Each step's sample of completions, off the stream (samples.py); none for a step it no
        longer keeps."""
        return {step: sample_rows(step, event)
                for step, event in (await samples_by_step(self.bus, job_id, steps)).items()}

    async def _feed(self, row: JobRow, m: Mirror, points: Sequence[MetricPointRow],
                    samples: dict[int, list[dict[str, object]]], tiles: dict[str, float] | None) -> None:
        if m.tracker is None:
            info = run_info(m.config, row.id, row.name, spec_config(spec_from_json(row.spec_json)))
            m.tracker = await self._call(open_tracker, m.config, info, self.default_mlflow)
            m.location = m.tracker.location
            log.info("job %s: %s tracker logs to %s", row.id, m.tracker.kind, m.location)
        for point in points:
            if point.step <= m.logged:
                continue
            values = step_values(metric_event_from_row(point, row.id))
            await self._call(m.tracker.log_step, point.step, values)
            if samples.get(point.step):
                await self._call(m.tracker.log_samples, point.step, samples[point.step])
            m.logged = point.step
        if tiles is not None:
            if tiles:
                await self._call(m.tracker.log_summary, tiles, m.logged)
            await self._call(m.tracker.close)
            m.done, m.tracker = True, None

    async def _say(self, row: JobRow, m: Mirror) -> None:
        """The tracker's error, once per distinct error, as a status event of the job's current status."""
        if m.error == m.said or self.bus is None or row.status in TERMINAL:
            return
        m.said = m.error
        message = (f"not logged to the {tc.kind_name(m.config.kind)} tracker "
                   f"({planned_location(m.config, row.name, row.id, self.default_mlflow)}): {m.error}; "
                   "the job goes on, the tracker catches up when it answers")
        event = common_pb2.JobStatusEvent(job_id=row.id, status=job_status_value(row.status), message=message,
                                          current_step=row.current_step, time=now_ts())
        try:
            await self.bus.publish(job_status_subject(row.id), event.SerializeToString(),
                                   status_msg_id(row.id, row.status, f"tracking-{time.time_ns()}"))
        except Exception as e:
            log.warning("job %s: could not publish the tracker's error: %s", row.id, e)
