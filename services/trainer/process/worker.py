"""The worker: at most one job at a time, each in its own process, and the record of the last one.

`JobSupervisor` is what the gRPC servicer calls; it knows processes and files, not gRPC. It starts
`rlvr.services.trainer.process.job_process` in a new process group, follows it through the files that process
writes (progress.json after every step, result.json at the end), cancels it (SIGTERM, then SIGKILL
after `cancel_grace_seconds`), and turns its exit into the last job's outcome. When the process
died without a result (killed, out of memory, a crash in native code) and not on a cancel, the job
is lost, not failed: the worker publishes no final status and reports it in GetWorkerStatus
(`last_job_lost`, with the adapter of its last finished step), and the scheduler resumes it from
its last checkpoint (StartJobRequest.resume: the job's folder is kept) or fails it. The job process
dies with this service (job_process.die_with_parent); a worker started again reports the job it
was running as lost and kills its process should it still run.

StartJob is idempotent by job id: asked to start the job it runs (or is starting) the supervisor
starts nothing and answers as the first call did, so a caller whose first call went unanswered may
ask again. Another job while one runs is refused with `WorkerBusy`. A start runs to its end even
when its caller goes away (a deadline), so the worker never runs a job it does not know of.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil

from rlvr.common import paths
from rlvr.common.errors import FailedPrecondition, NotFound, shown
from rlvr.common.nodes import peer_lost_error
from rlvr.objectstore import StoreError, object_store, store_key
from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.job.config import JobConfig, job_config_from_request
from rlvr.services.trainer.job.quantization import check_precision, check_quantization
from rlvr.services.trainer.process.forkserver import ForkServer, ForkServerError, forks_jobs
from rlvr.services.trainer.process.job_process import STATUS_BY_OUTCOME, adapter_ref, status_event
from rlvr.services.trainer.process.launch import JOB_MODULE
from rlvr.services.trainer.settings import TrainerSettings
from rlvr.v1 import common_pb2, trainer_pb2

if TYPE_CHECKING:  # imported when first needed
    from rlvr.infra.events import EventBus

log = logging.getLogger("rlvr.trainer.worker")


class WorkerBusy(Exception):
    """StartJob of a job while this worker runs or starts another one (the servicer answers
    RESOURCE_EXHAUSTED, which the scheduler tells apart from a refusal by its code)."""


class JobProcess(Protocol):
    """What the worker uses of a job's process: a fresh one (asyncio.subprocess.Process) or a
    forked one (forkserver.ForkedProcess)."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...


@dataclass
class RunningJob:
    config: JobConfig
    process: JobProcess
    started: float = field(default_factory=time.monotonic)
    cancel_requested: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class LastJob:
    job_id: str
    status: common_pb2.JobStatus
    error: str = ""
    adapter: common_pb2.AdapterRef | None = None
    lost: bool = False  # its process died without a result, not on a cancel (WorkerStatus.last_job_lost)


class JobSupervisor:
    def __init__(self, settings: TrainerSettings,
                 capabilities: trainer_pb2.WorkerCapabilities | None = None) -> None:
        self.settings = settings
        self.capabilities = capabilities  # reported in every status (capabilities.py)
        self.root = Path(settings.artifact_root)
        # Where each job's final adapter is also put, when one is configured (rlvr/objectstore.py).
        self.store = object_store(settings.artifact_store, settings.artifact_store_endpoint)
        self.current: RunningJob | None = None
        self.last: LastJob | None = self._lost_before_restart()
        self._starting: tuple[str, asyncio.Task[None]] | None = None  # the job being started
        self._bus: EventBus | None = None  # connected on first need (a crashed job's final status)
        self._finals: set[asyncio.Task[None]] = set()  # final statuses still being published
        # Steps run by the jobs that ended here, and their seconds (rlvr_trainer_step_seconds).
        self._ended_steps, self._ended_seconds = 0, 0.0
        # Job processes forked with their libraries imported (forkserver.py): started by `warm` when
        # the service starts, else (or again, after it ended) by the first job that needs it.
        self.forks = ForkServer() if forks_jobs(settings.job_start) else None

    def _lost_before_restart(self) -> LastJob | None:
        """After a restart of the service: the job it ran when it went away (the newest job folder
        without a result; its process died with the service), reported lost with the adapter of its
        last finished step, so that the scheduler resumes it, or records that adapter if it fails it."""
        jobs = self.root / "jobs"
        if not jobs.is_dir():
            return None  # a new artifact root
        try:
            started = [d for d in jobs.iterdir() if (d / "config.json").is_file()]
            newest = max(started, key=lambda d: (d / "config.json").stat().st_mtime, default=None)
            if newest is None or (newest / "result.json").exists():
                return None
            config = JobConfig.from_json(json.loads((newest / "config.json").read_text()))
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("could not read the job folders under %s: %s", jobs, e)
            return None
        _end_orphan(newest)
        step, _ = self._progress(config.job_id)
        adapter = adapter_ref(config.adapter_name, step, str(artifacts.adapter_dir(self.root, config.job_id).resolve()))
        # Node 0 alone counts a job's steps (progress.json): another node's part knows no step. The
        # scheduler's resume message names the step (the stored one or this adapter's, once).
        at = f" (at step {step})" if config.node_rank == 0 else f" (its part of node {config.node_rank})"
        part = "" if config.node_rank == 0 else at
        log.info("job %s was running when this worker stopped%s: reported lost", config.job_id, at)
        return LastJob(config.job_id, common_pb2.JOB_STATUS_FAILED,
                       f"the trainer service {self.settings.worker_name} was restarted while the job ran{part}",
                       adapter, lost=True)

    # ------------------------------------------------------------------ start

    async def start(self, request: trainer_pb2.StartJobRequest) -> bool:
        """Starts the job in a process of its own: True when started now, False when this job runs
        here already (or an earlier call is starting it: this one shares its outcome). Raises
        WorkerBusy while another job runs, InvalidArgument or FailedPrecondition for a job that
        cannot run here."""
        if self.current is not None and self.current.config.job_id == request.job_id:
            return False
        if self._starting is not None:
            starting_id, starting = self._starting
            if starting_id != request.job_id:
                raise WorkerBusy(f"worker {self.settings.worker_name} is busy starting job {starting_id}; "
                                 "one job per worker")
            await asyncio.shield(starting)
            return False
        asked, request = request, self._localized(request)
        job = job_config_from_request(request, self.root, tuple(self.settings.data_roots))
        self._check_idle()
        task = asyncio.get_running_loop().create_task(self._launch(job, request, asked), name=f"start-{job.job_id}")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a lone failure is logged in _launch
        self._starting = (job.job_id, task)
        await asyncio.shield(task)  # a caller that goes away does not stop the start half way
        return True

    async def _launch(self, job: JobConfig, request: trainer_pb2.StartJobRequest,
                      asked: trainer_pb2.StartJobRequest) -> None:
        """Starts the job process; `request` is `asked` as this worker runs it (`_localized`)."""
        try:
            await asyncio.to_thread(check_quantization, job.quantization, job.gpu_selection)
            await asyncio.to_thread(check_precision, job.precision, job.gpu_selection)
            job_dir = artifacts.job_dir(self.root, job.job_id)
            await self._fetch_sources(asked, job_dir)
            await asyncio.to_thread(self._resumed_job_dir if job.resume else self._fresh_job_dir, job_dir)
            (job_dir / "request.pb").write_bytes(request.SerializeToString())
            (job_dir / "config.json").write_text(json.dumps(job.to_json()))
            # 0600: the settings carry the service token the job process calls its peers with.
            fd = os.open(job_dir / "settings.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.settings.model_dump_json())
            process = await self._job_process(job)
            (job_dir / "pid").write_text(str(process.pid))  # for a restarted worker (`_lost_before_restart`)
            running = RunningJob(job, process)
            self.current = running
            log.info("job %s started (pid %d), log %s", job.job_id, process.pid, job_dir / "job.log")
            asyncio.get_running_loop().create_task(self._follow(running))
        except Exception as e:
            # Also the outcome the worker reports, for a caller that went away before this answer.
            log.warning("job %s did not start: %s", job.job_id, e)
            self.last = LastJob(job.job_id, common_pb2.JOB_STATUS_FAILED, str(e) or type(e).__name__)
            raise
        finally:
            self._starting = None

    async def _job_process(self, job: JobConfig) -> JobProcess:
        """`python -m rlvr.services.trainer.process.job_process` for `job`, in a session of its own (a cancel
        reaches its children too), writing into its job.log: forked from the fork server where this
        worker has one (forkserver.py), else a fresh interpreter. A job of several processes forked
        so forks its ranks from itself (job_process.launch)."""
        job_dir = artifacts.job_dir(self.root, job.job_id)
        args = ["--job-dir", str(job_dir)]
        if self.forks is not None:
            try:
                await self.forks.start()
                # It dies with the fork server, which dies with this service (job_process.die_with_parent).
                return await self.forks.spawn(JOB_MODULE, [*args, "--parent-pid", str(self.forks.pid)],
                                              job_dir / "job.log")
            except ForkServerError as e:
                log.warning("job %s: %s; starting it as a fresh process", job.job_id, e)
        with open(job_dir / "job.log", "ab") as job_log:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", JOB_MODULE, *args, "--parent-pid", str(os.getpid()),
                stdin=asyncio.subprocess.DEVNULL, stdout=job_log, stderr=job_log, start_new_session=True,
            )

    async def warm(self) -> None:
        """Starts the fork server in the background (the service's start), so that the first job
        does not wait for its imports."""
        if self.forks is not None:
            task = asyncio.get_running_loop().create_task(self.forks.start(), name="fork-server")
            task.add_done_callback(_log_failed_start)

    def _localized(self, request: trainer_pb2.StartJobRequest) -> trainer_pb2.StartJobRequest:
        """The request as this worker runs it: an init_adapter held by another worker
        (`init_adapter_source`) is read from this job's folder, where `_fetch_sources` puts it."""
        if not self._fetches_init_adapter(request):
            return request
        local = trainer_pb2.StartJobRequest()
        local.CopyFrom(request)
        local.spec.init_adapter.path = str(artifacts.fetched_init_adapter_dir(self.root, request.job_id))
        return local

    def _fetches_init_adapter(self, request: trainer_pb2.StartJobRequest) -> bool:
        """Whether the init_adapter comes from its source worker: named one, and the folder is not
        under this worker's own root already (a root the workers share)."""
        path = request.spec.init_adapter.path
        if not (request.init_adapter_source and path):
            return False
        resolved = paths.resolve(path)
        return not (paths.is_under(resolved, [self.root.resolve()]) and resolved.is_dir())

    async def _fetch_sources(self, request: trainer_pb2.StartJobRequest, job_dir: Path) -> None:
        """What the job needs from other workers, fetched into this worker's root before it starts
        (TrainerService.FetchFolder; no shared disk): a resumed job's folder from the worker that
        ran it before (`resume_source`; unreachable, the job goes on from what is here, else from
        step 0), and an init_adapter from the worker that holds it (`init_adapter_source`, by its
        path there; FailedPrecondition when it cannot be had: the job cannot start without it)."""
        from rlvr.common.auth import peer_auth
        from rlvr.peers.base import RlvrError
        from rlvr.peers.clients import AsyncTrainerClient
        from rlvr.peers.folders import fetch_folder

        if request.resume and request.resume_source:
            try:
                async with AsyncTrainerClient(request.resume_source, auth=peer_auth(self.settings)) as client:
                    fetched = await fetch_folder(client, f"jobs/{request.job_id}", job_dir)
                log.info("job %s: fetched %d of its %d files from %s to resume", request.job_id,
                         len(fetched.received), len(fetched.listing), request.resume_source)
            except (RlvrError, ValueError, OSError) as e:
                log.warning("job %s: could not fetch its folder from %s (%s); resuming from what this worker holds",
                            request.job_id, request.resume_source, e)
        original = request.spec.init_adapter.path
        if self._fetches_init_adapter(request):
            dest = artifacts.fetched_init_adapter_dir(self.root, request.job_id)
            try:
                async with AsyncTrainerClient(request.init_adapter_source, auth=peer_auth(self.settings)) as client:
                    await fetch_folder(client, original, dest, artifacts.ADAPTER_FILES)
            except (RlvrError, ValueError, OSError) as e:
                label = request.spec.init_adapter.name or original
                raise FailedPrecondition(f"init_adapter: could not fetch {shown(label)} from trainer "
                                         f"{request.init_adapter_source}, which holds it: {e}") from None
            log.info("job %s: init_adapter fetched from %s into %s", request.job_id, request.init_adapter_source, dest)

    def _check_idle(self) -> None:
        if self.current is not None:
            step, total = self._progress(self.current.config.job_id)
            raise WorkerBusy(
                f"worker {self.settings.worker_name} is busy with job {self.current.config.job_id} "
                f"(step {step} of {total or '?'}); one job per worker"
            )

    @staticmethod
    def _fresh_job_dir(job_dir: Path) -> None:
        """A job id started again without `resume` starts from nothing: no stale result or adapter."""
        for name in ("result.json", "progress.json", artifacts.CANCEL_FILE, artifacts.PEER_LOST_FILE):
            (job_dir / name).unlink(missing_ok=True)
        artifacts.unlink_rank_results(job_dir)
        for name in ("adapter", "checkpoints", "trl"):
            shutil.rmtree(job_dir / name, ignore_errors=True)
        job_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _resumed_job_dir(job_dir: Path) -> None:
        """A resume (StartJobRequest.resume) keeps the checkpoints, the adapter of the last finished
        step and progress.json (the step that adapter is of, until the resumed run finishes one);
        only a stale result goes. The job process picks the checkpoint (resume.resume_point)."""
        for name in ("result.json", artifacts.CANCEL_FILE, artifacts.PEER_LOST_FILE):
            (job_dir / name).unlink(missing_ok=True)
        artifacts.unlink_rank_results(job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)

    def _progress(self, job_id: str) -> tuple[int, int]:
        data = artifacts.read_json(artifacts.job_dir(self.root, job_id) / "progress.json") or {}
        return int(data.get("step", 0)), int(data.get("total_steps", 0))

    def _timed(self, job_id: str) -> tuple[int, float]:
        data = artifacts.read_json(artifacts.job_dir(self.root, job_id) / "progress.json") or {}
        return int(data.get("steps_timed", 0)), float(data.get("step_seconds_sum", 0.0))

    def step_time(self) -> tuple[int, float]:
        """(steps, their seconds) of every job this worker ran since it started, the running one's so far."""
        steps, seconds = self._ended_steps, self._ended_seconds
        running = self.current
        if running is not None:
            more = self._timed(running.config.job_id)
            steps, seconds = steps + more[0], seconds + more[1]
        return steps, seconds

    # ------------------------------------------------------------------ the end of a job

    async def _follow(self, running: RunningJob) -> None:
        code = await running.process.wait()
        job_id = running.config.job_id
        try:
            self.last = await self._outcome(running, code)
            await self._put_adapter(self.last)
        except Exception:  # never leave the worker busy forever
            log.exception("could not read the outcome of job %s", job_id)
            self.last = LastJob(job_id, common_pb2.JOB_STATUS_FAILED, "the worker could not read the job's result")
        finally:
            steps, seconds = self._timed(job_id)
            self._ended_steps, self._ended_seconds = self._ended_steps + steps, self._ended_seconds + seconds
            self.current = None
            running.done.set()
        log.info("job %s ended: %s %s", job_id, common_pb2.JobStatus.Name(self.last.status), self.last.error)

    async def _outcome(self, running: RunningJob, code: int) -> LastJob:
        job = running.config
        job_dir = artifacts.job_dir(self.root, job.job_id)
        result = artifacts.read_json(job_dir / "result.json")
        if result is not None:
            adapter = adapter_ref(result["adapter_name"], int(result["adapter_version"]), result["adapter_path"])
            return LastJob(job.job_id, STATUS_BY_OUTCOME[result["status"]], result.get("error", ""), adapter)
        # No result: the process was killed (our SIGKILL on cancel) or died. The adapter of its
        # last finished step is on disk; progress.json says which step that was.
        step, _ = self._progress(job.job_id)
        adapter = adapter_ref(job.adapter_name, step, str(artifacts.adapter_dir(self.root, job.job_id).resolve()))
        if running.cancel_requested:
            last = LastJob(job.job_id, common_pb2.JOB_STATUS_CANCELLED, "", adapter)
            self._publish_final_soon(last, step)
            return last
        failed_rank = artifacts.rank_failure(job_dir)
        if failed_rank is not None:  # a job of several processes whose rank other than 0 failed
            last = LastJob(job.job_id, common_pb2.JOB_STATUS_FAILED, failed_rank, adapter)
            self._publish_final_soon(last, step)
            return last
        # Lost, not failed: no final status is published (a FAILED on the stream would be final in
        # the store). The scheduler reads `lost` in GetWorkerStatus and resumes the job from its
        # last checkpoint, or fails it itself once its resumes are spent.
        peer = artifacts.read_json(job_dir / artifacts.PEER_LOST_FILE)
        if peer is not None:  # node 0 of a job of several nodes whose peer's part went away
            return LastJob(job.job_id, common_pb2.JOB_STATUS_FAILED, peer_lost_error(str(peer.get("error", ""))),
                           adapter, lost=True)
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return LastJob(job.job_id, common_pb2.JOB_STATUS_FAILED,
                       f"the job process {how} without a result{_log_tail(job_dir / 'job.log')}", adapter, lost=True)

    async def _put_adapter(self, last: LastJob) -> None:
        """The job's final adapter into the object store (when one is configured), so that it can
        be downloaded without this worker; a store that fails is logged, the job's outcome stands."""
        folder = artifacts.adapter_dir(self.root, last.job_id)
        if self.store is None or last.adapter is None or not (folder / artifacts.ADAPTER_FILES[-1]).is_file():
            return
        try:
            await asyncio.to_thread(self.store.put_folder, folder, store_key(self.root, folder), artifacts.ADAPTER_FILES)
        except (StoreError, OSError, ImportError) as e:
            log.error("could not put the adapter of job %s into %s: %s", last.job_id, self.store.url, e)

    def _publish_final_soon(self, last: LastJob, step: int) -> None:
        """`_publish_final` in the background: through a NATS outage it may take minutes
        (nats_outage_seconds), and the worker is free (a cancel answered) once the job has ended."""
        task = asyncio.get_running_loop().create_task(self._publish_final(last, step))
        self._finals.add(task)
        task.add_done_callback(self._finals.discard)

    async def _publish_final(self, last: LastJob, step: int) -> None:
        if not self.settings.nats_url and self.settings.nats_url_file is None:
            return
        from rlvr.infra.events import EventBus, EventBusError
        from rlvr.infra.subjects import job_status_subject, status_msg_id
        from rlvr.jobspec import job_status_name

        event = status_event(last.job_id, last.status, last.error or "cancelled", last.adapter, step)
        try:
            if self._bus is None:
                url, ca_file = self.settings.nats_connection()
                self._bus = await EventBus.connect(url, name=f"rlvr-{self.settings.worker_name}", tls_ca_file=ca_file,
                                                   connect_timeout_s=self.settings.nats_outage_seconds)
            await self._bus.publish(job_status_subject(last.job_id), event.SerializeToString(),
                                    status_msg_id(last.job_id, job_status_name(last.status)),
                                    within_s=self.settings.nats_outage_seconds)
        except EventBusError as e:
            log.error("could not publish the final status of job %s: %s", last.job_id, e)

    # ------------------------------------------------------------------ cancel, status, shutdown

    async def cancel(self, job_id: str) -> common_pb2.AdapterRef | None:
        if self._starting is not None and self._starting[0] == job_id:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting[1])  # started (then stopped below) or failed
        running = self.current
        if running is None or running.config.job_id != job_id:
            if self.last is not None and self.last.job_id == job_id:
                return self.last.adapter  # already over: cancelling again changes nothing
            raise NotFound(f"job_id: {job_id!r} is not running on worker {self.settings.worker_name}")
        running.cancel_requested = True
        # The mark that this SIGTERM is a cancel: a job's rank 0 also gets one from torchrun when
        # another rank failed, which must read as that failure (job_process.settle_ranks).
        with contextlib.suppress(OSError):
            (artifacts.job_dir(self.root, job_id) / artifacts.CANCEL_FILE).touch()
        self._signal(running, signal.SIGTERM)
        try:
            await asyncio.wait_for(running.done.wait(), self.settings.cancel_grace_seconds)
        except TimeoutError:
            log.warning("job %s did not stop within %.1f s of SIGTERM: SIGKILL", job_id,
                        self.settings.cancel_grace_seconds)
            self._signal(running, signal.SIGKILL)
            await running.done.wait()
        return self.last.adapter if self.last is not None else None

    @staticmethod
    def _signal(running: RunningJob, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, sig)

    def status(self) -> trainer_pb2.WorkerStatus:
        status = trainer_pb2.WorkerStatus(worker=self.settings.worker_name, busy=self.current is not None)
        if self.capabilities is not None:
            status.capabilities.CopyFrom(self.capabilities)
        if self.current is not None:
            status.job_id = self.current.config.job_id
            status.current_step, status.total_steps = self._progress(status.job_id)
        elif self._starting is not None:  # being started: already this job's worker
            status.busy, status.job_id = True, self._starting[0]
        if self.last is not None:
            status.last_job_id = self.last.job_id
            status.last_job_status = self.last.status
            status.last_job_error = self.last.error
            status.last_job_lost = self.last.lost
            if self.last.adapter is not None:
                status.last_job_adapter.CopyFrom(self.last.adapter)
        return status

    async def close(self) -> None:
        """Service shutdown: a running job is cancelled (its adapter kept), then NATS closed."""
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting[1])
        if self.current is not None:
            await self.cancel(self.current.config.job_id)
        if self.forks is not None:
            await self.forks.close()
        if self._finals:  # a job's final status still on its way (the cancel above): a moment for it
            await asyncio.wait(set(self._finals), timeout=10)
        if self._bus is not None:
            await self._bus.close()
            self._bus = None


def _log_failed_start(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("the fork server did not start (%s); jobs start as fresh processes until it does",
                    task.exception())


def _end_orphan(job_dir: Path) -> None:
    """Kills the job process of `job_dir` if it still runs (its process group): a job process dies
    with its service (job_process.die_with_parent), but where that did not happen a restarted worker
    must still never have two jobs training."""
    try:
        pid = int((job_dir / "pid").read_text())
        argv = psutil.Process(pid).cmdline()
    except (OSError, ValueError, psutil.Error):
        return  # no such process: nothing to end
    if JOB_MODULE in argv and str(job_dir) in argv:
        log.warning("job process %d of %s outlived its worker: killing it", pid, job_dir.name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


# Lines of torchrun's failure report that read like errors but name none ("traceback : To enable
# traceback see: https://pytorch.org/docs/stable/elastic/errors.html", "error_file: <N/A>").
_TORCHRUN_BOILERPLATE = ("To enable traceback see", "error_file:")


def _log_tail(path: Path) -> str:
    """The last error-looking line of the job log, to name the cause in one line."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return ""
    for line in reversed(lines):
        if any(text in line for text in _TORCHRUN_BOILERPLATE):
            continue
        if "Error" in line or "error" in line or "Killed" in line:
            return f": {line.strip()[:300]}"
    return ""
