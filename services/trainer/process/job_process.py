"""The process one job runs in: `python -m rlvr.services.trainer.process.job_process --job-dir DIR`.

The worker (worker.py) writes `request.pb` (the StartJobRequest, for the record), `config.json` (the
JobConfig it validated, which this process reads as is) and `settings.json` into the job
folder and starts this module in a new process group, so that a cancel is immediate (SIGTERM asks
for a stop at the next step boundary, SIGKILL after a grace period ends it outright), a crash
fails this job only, and all its memory goes back to the system when it exits.

It publishes its own events to NATS (RUNNING, one MetricEvent per step, the final status), keeps
`progress.json` current after every step (the worker's GetWorkerStatus reads it), and writes
`result.json` last, into room taken when it started (a job failed for a full artifact root still
reports so: artifacts.py). A process that dies without writing the result is reported by the worker.

A job of several processes (advanced.num_processes, services/trainer/job/distributed.py): this process
execs torchrun over N ranks of this module (`--rank-of`); rank 0 does all of the above, the other
ranks train their share of each step, and a rank other than 0 that fails writes
`result-rank<N>.json`, which the worker reports when rank 0 could not write its result.

A job of several nodes (advanced.num_nodes): each worker's job process execs torchrun into one
rendezvous (distributed.py); node 0's first process speaks for the job as above, and the first
process of every other node writes that node's `result.json` (its part's outcome, no adapter: the
adapter is node 0's), so that its worker reports the part as ended rather than lost.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.common.auth import peer_auth
from rlvr.common.logs import quiet_optional_kernels
from rlvr.common.nodes import peer_lost_error
from rlvr.common.settings import setting_label
from rlvr.infra import reaper
from rlvr.services.trainer.job import artifacts
from rlvr.services.trainer.job.distributed import NODE_RANK_ENV, Group, peer_lost
from rlvr.services.trainer.process.forkserver import forks_jobs, set_title
from rlvr.services.trainer.process.launch import (
    JOB_MODULE,
    Nodes,
    launch_command,
    rank_arguments,
    torchrun_arguments,
    visible_devices,
)
from rlvr.services.trainer.settings import TrainerSettings
from rlvr.v1 import common_pb2

if TYPE_CHECKING:
    from rlvr.services.trainer.job.config import JobConfig
    from rlvr.services.trainer.job.runner import JobDeps, JobResult
    from rlvr.services.trainer.process.publisher import EventPublisher

log = logging.getLogger("rlvr.trainer.job")

STOP_SIGNALS: list[int] = []  # the SIGTERMs and SIGINTs this process received (run(): a cancel)

STATUS_BY_OUTCOME = {
    "completed": common_pb2.JOB_STATUS_COMPLETED,
    "cancelled": common_pb2.JOB_STATUS_CANCELLED,
    "failed": common_pb2.JOB_STATUS_FAILED,
}


def status_event(
    job_id: str, status: common_pb2.JobStatus, message: str = "", adapter: common_pb2.AdapterRef | None = None,
    step: int = 0,
) -> common_pb2.JobStatusEvent:
    now = Timestamp()
    now.GetCurrentTime()
    event = common_pb2.JobStatusEvent(job_id=job_id, status=status, message=message, time=now, current_step=step)
    if adapter is not None:
        event.adapter.CopyFrom(adapter)
    return event


def adapter_ref(name: str, version: int, path: str) -> common_pb2.AdapterRef | None:
    return common_pb2.AdapterRef(name=name, version=version, path=path) if version > 0 else None


def _set_threads(threads: int, processes: int = 1) -> None:
    import torch

    from rlvr.services.trainer.capabilities import cpu_cores

    torch.set_num_threads(threads or max(1, cpu_cores() // processes))  # the cores shared by the job's processes


def die_with_parent(parent_pid: int) -> None:
    """A job process must not outlive its trainer service: killed with it (kill -9 included), it
    would train on unseen and publish beside the run the scheduler resumes. Linux delivers SIGKILL
    to this process when its parent dies; a parent gone already ends it now."""
    if parent_pid and os.getppid() != parent_pid:
        log.error("the trainer service (pid %d) is gone already; not starting", parent_pid)
    problem = reaper.die_with_parent(parent_pid, signal.SIGKILL)
    if problem:
        log.warning("%s: this job may outlive its trainer", problem)


def _read_job(job_dir: Path) -> JobConfig:
    from rlvr.services.trainer.job.config import JobConfig

    # The worker validated the request and wrote its JobConfig: nothing is resolved twice.
    return JobConfig.from_json(json.loads((job_dir / "config.json").read_text()))


def launch(job_dir: Path) -> int:
    """The job process the worker started: runs the job, or for a job of several processes starts
    torchrun over its ranks, keeping this pid (the worker's handle on the whole group): torchrun's
    agent in this process with the ranks forked from it where the worker forks its job processes
    (this process has imported the ranks' libraries: forkserver.py), else torchrun exec'd."""
    job = _read_job(job_dir)
    visible = visible_devices(job.gpu_selection, job.num_processes, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible  # before torch is imported, or it is too late
    if job.num_processes == 1 and job.num_nodes == 1:
        return run(job_dir)
    settings = TrainerSettings.model_validate_json((job_dir / "settings.json").read_text())
    nodes = None
    if job.num_nodes > 1:
        nodes = Nodes(job.num_nodes, job.node_rank, job.rendezvous_endpoint, job.job_id, settings.rendezvous_address)
        os.environ[NODE_RANK_ENV] = str(job.node_rank)  # torchrun passes it on to the ranks
        if "OMP_NUM_THREADS" not in os.environ:
            # torchrun sets 1 only for several processes per node; unset, one rank per node ran its
            # steps 10-30x slower here (2 cores: bench/multinode.py, docs/measurements/multinode.md).
            from rlvr.services.trainer.capabilities import cpu_cores

            threads = settings.torch_threads or max(1, cpu_cores() // job.num_processes)
            os.environ["OMP_NUM_THREADS"] = str(threads)
    where = f" on node {job.node_rank} of {job.num_nodes}" if nodes else ""
    if forks_jobs(settings.job_start):
        arguments = torchrun_arguments(job_dir, job.num_processes, os.getpid(), nodes, forked=True)
        log.info("job %s: %d training processes%s, forked: torchrun %s", job.job_id, job.num_processes, where,
                 " ".join(arguments))
        return _torchrun_here(arguments)
    command = launch_command(job_dir, job.num_processes, os.getpid(), nodes)
    log.info("job %s: %d training processes%s: %s", job.job_id, job.num_processes, where, " ".join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)  # PR_SET_PDEATHSIG is kept: torchrun dies with the worker


def _torchrun_here(arguments: list[str]) -> int:
    """torchrun (torch.distributed.run, its own argument parsing and agent) in this process; its exit
    code as a program: 1 when a rank failed or a signal stopped the agent (which stopped the ranks)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        torchrun.main(arguments)
    except (ChildFailedError, SignalException) as e:
        log.error("the job's training processes ended: %s", e)
        return 1
    return 0


def _become_forked_rank(job_dir: Path, launcher_pid: int) -> None:
    """A rank forked by torchrun's agent in the launcher: the command line a rank started by torchrun
    as a program has (`ps`, a restarted worker's search for its job's processes), and the agent's
    signal handlers, inherited across the fork, back to the defaults (run() sets its own)."""
    set_title([sys.executable, "-m", JOB_MODULE, *rank_arguments(job_dir, launcher_pid)])
    for sig in (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run(job_dir: Path, group: Group | None = None) -> int:
    """Runs the job in this process: the whole job, or rank `group.rank` of it. In order: a SIGTERM
    cancels (`_cancel_on_signals`); the job's events go to NATS (`_publisher`, `_announce_start`: the
    job's speaker only); its scorer, generator and progress files are set up (`_job_deps`) and the job runs
    (runner.run_job); then the result is written and announced (`_finish_rank`, `_finish`)."""
    from rlvr.services.trainer.job.runner import JobResult, one_line, run_job

    group = group or Group()
    settings = TrainerSettings.model_validate_json((job_dir / "settings.json").read_text())
    job = _read_job(job_dir)
    cancel = _cancel_on_signals()
    publisher = None
    result: JobResult
    if group.is_node_main:  # the process that writes this node's result.json: its room, before the disk fills
        artifacts.reserve(job_dir / "result.json")
    try:
        if group.is_main and (settings.nats_url or settings.nats_url_file is not None):
            publisher = _publisher(job, settings)  # before it starts: a failure from here on is reported on it
            publisher.start()
            _announce_start(publisher, job, settings)
        _set_threads(settings.torch_threads, group.world)
        with _job_deps(job, job_dir, settings, group, cancel, publisher) as deps:
            result = run_job(job, deps)
    except Exception as e:  # set-up failed before the job could run (bad request, NATS down)
        log.exception("job set-up failed")
        result = JobResult(job_id=job.job_id, status="failed", error=one_line(e))
    if not group.is_main:
        return _finish_rank(result, job, job_dir, group)
    return _finish(result, job, job_dir, group, publisher)


def _cancel_on_signals() -> threading.Event:
    """SIGTERM (and SIGINT) = cancel: finish the step in flight, save, report CANCELLED (the worker
    SIGKILLs after its grace period if the step takes longer; the last step's adapter is on disk)."""
    cancel = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        STOP_SIGNALS.append(signum)
        cancel.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return cancel


def _publisher(job: JobConfig, settings: TrainerSettings) -> EventPublisher:
    """The job's events to NATS (not started)."""
    from rlvr.services.trainer.process.publisher import EventPublisher

    nats_url, nats_ca = settings.nats_connection()
    return EventPublisher(nats_url, name=f"rlvr-trainer-{job.job_id}", ca_file=nats_ca,
                          outage_s=settings.nats_outage_seconds, setting=setting_label(settings, "nats_outage_seconds"))


def _announce_start(publisher: EventPublisher, job: JobConfig, settings: TrainerSettings) -> None:
    """The job's RUNNING status (a resume's is a status of its own: not the first run's RUNNING,
    which the stream would drop as a duplicate)."""
    running = status_event(job.job_id, common_pb2.JOB_STATUS_RUNNING, f"running on {settings.worker_name}")
    resumed = _resume_step(job)
    if resumed is None:
        publisher.publish_status(running)
    else:
        running.message = (f"resuming from step {resumed} on {settings.worker_name}" if resumed
                           else f"starting again from step 0 on {settings.worker_name} (no checkpoint)")
        running.current_step = resumed
        publisher.publish_again(running, f"resume-{time.time_ns()}")


@contextlib.contextmanager
def _job_deps(job: JobConfig, job_dir: Path, settings: TrainerSettings, group: Group, cancel: threading.Event,
              publisher: EventPublisher | None) -> Iterator[JobDeps]:
    """What run_job is given in a job process: the reward service's scorer (or this process's), the
    rollout service's generator, the progress file and the metric events; the scorer and the
    generator are closed when the job ends."""
    from rlvr.services.trainer.job.runner import JobDeps
    from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings, ServiceProblems, ServiceScorer

    notices = itertools.count(1)

    def on_wait(message: str) -> None:  # a peer the job waits for: the job's status says so
        if publisher is not None:
            publisher.publish_again(status_event(job.job_id, common_pb2.JOB_STATUS_RUNNING, message),
                                    f"notice:{next(notices)}")

    score_settings = ScoreSettings(job.reward_function, job.format_bonus, job.format_bonus_weight,
                                   job.reward_terms, job.accuracy_key)
    problems = None
    if settings.scorer == "local":
        scorer: LocalScorer | ServiceScorer = LocalScorer(score_settings)
    else:
        scorer = ServiceScorer(settings.reward_address, score_settings, auth=peer_auth(settings),
                               wait_s=settings.reward_wait_seconds, on_wait=on_wait)
        problems = ServiceProblems(settings.reward_address, auth=peer_auth(settings))
    generator = None
    try:
        rlvr = job.method == "rlvr"  # a Supervised (SFT) job neither scores nor generates
        if rlvr and group.is_main and isinstance(scorer, ServiceScorer):
            scorer.check()  # the job's rewards can score now: a remote reward is reachable
        if rlvr and job.generation_backend == "vllm":
            from rlvr.services.trainer.job.replicas import rollout_generator

            generator = rollout_generator(settings.rollout_replicas(), wait_s=settings.rollout_wait_seconds,
                                          on_wait=on_wait, auth=peer_auth(settings))
            generator.wait_ready()

        # progress.json: the step reached (GetWorkerStatus), and the steps this process ran with their
        # time (the worker's rlvr_trainer_step_seconds). A step's event comes after its adapter is saved.
        progress: dict[str, float] = {"step": 0, "total_steps": 0, "steps_timed": 0, "step_seconds_sum": 0.0}

        # A full artifact root: the job's writes wait for space, saying so (artifacts.DiskSpace).
        space = artifacts.DiskSpace(job.artifact_root, settings.disk_wait_seconds, on_wait, cancel)

        def publish(event: common_pb2.MetricEvent) -> None:
            progress["steps_timed"] += 1
            progress["step_seconds_sum"] += event.step_seconds
            if group.is_main:
                space.write(f"step {event.step}'s progress.json",
                            lambda: artifacts.write_json_atomic(job_dir / "progress.json", progress))
            if publisher:
                publisher.publish_metric(event)

        def on_step(step: int, total: int) -> None:
            progress.update(step=step, total_steps=total)
            artifacts.write_json_atomic(job_dir / "progress.json", progress)

        yield JobDeps(scorer=scorer, problems=problems, publish=publish,
                      publish_samples=publisher.publish_samples if publisher else (lambda _e: None),
                      cancel=cancel, generator=generator, on_step=on_step if group.is_main else None,
                      colocate_enforce_eager=settings.colocate_enforce_eager, group=group, space=space)
    finally:
        scorer.close()
        if generator is not None:
            generator.close()


def _finish_rank(result: JobResult, job: JobConfig, job_dir: Path, group: Group) -> int:
    """A rank other than the job's speaker: its part's record, and a failure's exit code."""
    log.info("job %s, rank %d: %s %s", result.job_id, group.rank, result.status, result.error)
    if job.num_nodes > 1 and result.status == "failed" and peer_lost(result.error):
        result.error = peer_lost_error(result.error)  # a consequence: the scheduler names the lost node
    if group.node > 0 and group.is_node_main:  # this node's part: its worker's record (no adapter)
        part = {**result.to_json(), "adapter_version": 0, "adapter_path": ""}
        artifacts.write_json_atomic(job_dir / "result.json", part)
    if result.status != "failed":
        return 0
    artifacts.write_json_atomic(job_dir / f"result-rank{group.rank}.json", result.to_json())
    return 1  # torchrun then stops the other ranks rather than leaving them waiting for this one


def _finish(result: JobResult, job: JobConfig, job_dir: Path, group: Group, publisher: EventPublisher | None) -> int:
    """The job's speaker: the job's result.json and its final status event."""
    settle_ranks(result, job_dir, group.world)
    if job.num_nodes > 1 and result.status == "failed" and peer_lost(result.error):
        # Another node's part is gone: not this job's failure. No result and no final status, so
        # that the worker reports the job lost and the scheduler resumes it (dispatch.py's rule).
        log.error("job %s lost a node (%s): ending without a result, to be resumed", job.job_id, result.error)
        artifacts.write_json_atomic(job_dir / artifacts.PEER_LOST_FILE, {"error": result.error})
        if publisher is not None:
            publisher.close()
        return 1
    artifacts.write_json_atomic(job_dir / "result.json", result.to_json())
    if publisher is not None:
        adapter = adapter_ref(result.adapter_name, result.adapter_version, result.adapter_path)
        message = result.error or f"{result.status} after {result.steps_done} of {result.total_steps} steps"
        if publisher.error is None:  # else NATS has been away past its bound: the job failed on it
            publisher.publish_status(status_event(result.job_id, STATUS_BY_OUTCOME[result.status], message,
                                                  adapter, result.steps_done))
        if not publisher.close():  # an outage past its bound: the stream (and so the store) lacks events
            result.status = "failed"
            result.error = str(publisher.error or "some events could not be published to NATS")
            log.error("job %s: %s", result.job_id, result.error)
            artifacts.write_json_atomic(job_dir / "result.json", result.to_json())
    log.info("job %s %s: %s", result.job_id, result.status, result.error or f"{result.steps_done} steps")
    # A failed job of several processes: a nonzero exit makes torchrun stop the other ranks.
    return 1 if group.world > 1 and result.status == "failed" else 0


def settle_ranks(result: JobResult, job_dir: Path, world: int) -> None:
    """Rank 0's result of a job of several processes, with another rank's failure as its cause:
    once a rank has failed (its result-rank<N>.json written), torchrun stops the others with
    SIGTERM, which rank 0 would report as a cancel, or rank 0's collective breaks first. A SIGTERM
    is a cancel only when the worker marked it so (artifacts.CANCEL_FILE)."""
    if world == 1 or result.status == "completed" or (job_dir / artifacts.CANCEL_FILE).exists():
        return
    failure = artifacts.rank_failure(job_dir)
    if failure is not None:
        result.status, result.error = "failed", failure


def _resume_step(job: JobConfig) -> int | None:
    """None for a first run; for a resume the step it goes on from (0: no checkpoint, step 0 again)."""
    if not job.resume:
        return None
    from rlvr.services.trainer.job.engine import resume_checkpoint

    found = resume_checkpoint(job.job_dir)
    return int(found[1]["adapter_step"]) if found is not None else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvr.services.trainer.process.job_process", description=__doc__)
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, default=0, help="the trainer service's pid: this dies with it")
    parser.add_argument("--rank-of", type=int, default=0,
                        help="a rank of a job of several processes, started by torchrun in the job process PID")
    args = parser.parse_args(argv)
    group = Group.from_env() if args.rank_of else None
    where = f" [rank {group.rank}]" if group is not None else ""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,  # a forked rank: not its launcher's
                        format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s")
    quiet_optional_kernels()  # the job imports peft, so bitsandbytes
    if group is not None:
        if _forked_rank():
            _become_forked_rank(args.job_dir, args.rank_of)
        die_with_parent(args.rank_of)  # torchrun, which dies with the worker
        log.info("training process %d of %d started (pid %d)", group.rank, group.world, os.getpid())
        return run(args.job_dir, group)
    die_with_parent(args.parent_pid)
    return launch(args.job_dir)


def _forked_rank() -> bool:
    """Whether this process is a rank that torchrun's agent forked (multiprocessing started it)."""
    return multiprocessing.parent_process() is not None


def _end_forked_rank(code: int) -> NoReturn:
    """A forked rank's end. The agent takes a rank's return as its success (SystemExit(0) is one),
    after which the rank waits until the agent has read it: so the return is kept for a rank that
    ran to its end unsignalled. A rank that was signalled exits at once, 1 if its job did not fail:
    the agent is stopping the ranks (it signalled them, or the worker signalled the job's process
    group) and does not read returns, or else it was this rank alone, and its exit stops the others."""
    if code == 0 and not STOP_SIGNALS:
        sys.exit(0)
    reaper.exit_without_teardown(code or 1)


if __name__ == "__main__":
    code = main()
    if _forked_rank():
        _end_forked_rank(code)
    # Every result is written and every event flushed: the interpreter's teardown of torch & co.
    # would only keep the worker busy for seconds more.
    reaper.exit_without_teardown(code)
