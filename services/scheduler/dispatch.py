"""The scheduler's dispatcher: each round reconciles the running jobs with their trainer workers,
settles the starts in doubt, and gives each queued job to an idle worker that fits it. Every
change of a job's status goes through the lifecycle (lifecycle.py); the workers are reached
through the `Workers` interface (workers.py).

A job whose trainer was lost resumes. When the worker that runs a job answers that it no longer
does (its job process died without a result: `last_lost`; or the trainer service was restarted and
knows nothing of it), the job goes back to the queue and is started again, on an idle worker that fits,
as a resume (StartJobRequest.resume): the trainer goes on from the job's last checkpoint, or from
step 0 when it has none (with the same seed, the same run again). A job is resumed at most
`MAX_RESUMES` times, counted in its row (`JobRow.resumes`, so a restarted scheduler goes on with the
count); then it fails with the cause and the adapter the worker reports. While the worker cannot be
reached at all the job stays RUNNING there: its job process may still be training.

A job of several nodes (advanced.num_nodes = N) runs on N workers at once, recorded in `worker` as
their addresses joined by commas, node 0 first (`nodes_of`). It waits QUEUED until N idle workers
fit it, then is started on all of them or on none (`_start_nodes`): nodes 1..N-1 first, node 0
last, each with its node rank and the rendezvous endpoint on node 0's host (port
`rendezvous_port` + node 0's index in the trainer addresses, so that two jobs whose node 0 share a
host do not collide); a node that refuses or is busy has the parts already started stopped (they
publish nothing: only node 0 speaks), and the job waits for the next round. Node 0's outcome is the
job's. The node failure rule: when some node's part is gone (its process died, its worker
restarted) the others end by themselves (their collective loses its peer: distributed.py; node
0's then ends lost, publishing no final status), and once no node runs it the job is queued again
as a resume, like a lost job of one node: it starts again when N workers are idle, from node 0's
last checkpoint (under node 0's artifact root: the resume prefers the workers it ran on), within
the same MAX_RESUMES. While a node cannot be reached the job stays RUNNING, for up to
`node_lost_seconds`: a node whose worker has not answered that long is lost (nodes.py, `judge`),
and the job is queued again at once, its status message naming the node and since when, its
surviving workers free for other jobs while it waits. It resumes on the returning worker or on any
N idle workers that fit it, or fails naming the lost node once it has waited `node_wait_seconds`
(kept in memory: a restarted scheduler starts that wait again). A resume's message names the lost
node and its cause, not the nodes that only lost their peer (rlvr.common.nodes).

Dispatch cannot start a job twice. StartJob is idempotent by job id on the trainer; when its
outcome is unknown (no answer in time, or the worker unreachable) the scheduler asks the worker
whether it runs the job before anything else may be tried, and while the worker cannot be asked
the job stays QUEUED with that worker recorded in `worker` ("in doubt": lifecycle.IN_DOUBT): it is
given to no other worker until that one answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.infra.schema import JobRow
from rlvr.services.scheduler.convert import TERMINAL, spec_from_json
from rlvr.services.scheduler.fit import fit, queue_reason
from rlvr.services.scheduler.lifecycle import FAILED, IN_DOUBT, QUEUED, RUNNING, JobLifecycle, Move
from rlvr.services.scheduler.nodes import AT_WORK, ENDED, Outages, clock_time, judge
from rlvr.services.scheduler.workers import WorkerBusy, WorkerError, Workers, WorkerState, WorkerUnavailable
from rlvr.v1 import common_pb2

log = logging.getLogger("rlvr.scheduler.jobs")

MAX_RESUMES = 3
"""How many times a job whose trainer was lost is resumed before it fails (see the module's doc)."""
STREAM_CATCH_UP_S = 10.0
"""A job its worker reports ended while the store lacks steps of it (a restarted scheduler whose
consumer is still reading the events published while it was away): how long those events are
waited for (the ingest stores the steps, then the end) before the worker's word ends the job."""
RENDEZVOUS_PORT = 29400
"""torchrun's c10d port of a job of several nodes, plus node 0's index in the trainer addresses."""
NODE_LOST_SECONDS = 120.0
"""How long a node's worker of a running job of several nodes may not answer before it is lost."""
NODE_WAIT_SECONDS = 1800.0
"""How long a job that lost a node waits QUEUED for workers to resume on before it fails."""


@dataclass(frozen=True)
class NodeLoss:
    """A job of several nodes queued again after it lost a node, while it waits to resume."""

    what: str  # "node 1 (HOST:PORT)", "nodes 0 and 1"
    was: str  # "was" or "were"
    why: str  # its cause
    since: float  # wall-clock seconds: the node's outage began, or the loss was seen
    until: float  # the job fails when it has not resumed by then


def nodes_of(worker: str) -> list[str]:
    """The workers a job runs on (its row's `worker`), node 0 first; [] when none."""
    return [a for a in worker.split(",") if a] if worker else []


def holder_of(worker: str) -> str:
    """The worker whose artifact root holds a job's folders (adapter, checkpoints, merged model):
    node 0 of the job's workers (its row's `worker`); "" when none is recorded."""
    nodes = nodes_of(worker)
    return nodes[0] if nodes else ""


def num_nodes(spec: object) -> int:
    a = spec.advanced  # type: ignore[attr-defined]
    return a.num_nodes if a.HasField("num_nodes") and a.num_nodes > 1 else 1


class Dispatcher:
    def __init__(self, lifecycle: JobLifecycle, workers: Workers, poll_seconds: float = 1.0,
                 rendezvous_port: int = RENDEZVOUS_PORT, node_lost_seconds: float = NODE_LOST_SECONDS,
                 node_wait_seconds: float = NODE_WAIT_SECONDS, clock: Callable[[], float] = time.time) -> None:
        self.lifecycle = lifecycle
        self.node_lost_seconds = node_lost_seconds
        self.node_wait_seconds = node_wait_seconds
        self.clock = clock  # wall-clock seconds: an outage's start is shown as a time of day
        self.outages = Outages()  # since when each worker has not answered
        self.node_losses: dict[str, NodeLoss] = {}  # a queued job of several nodes that lost one -> that loss
        self.rendezvous_port = rendezvous_port
        self.store = lifecycle.store
        self.workers = workers
        self.poll_seconds = poll_seconds
        # queued job id -> (the live workers' names and capabilities, why each cannot run it), fit.py's
        self.fits: dict[str, tuple[tuple[object, ...], dict[str, str | None]]] = {}
        # job id -> the worker it ran on when it was lost and queued again (the queued row records
        # none): a resume elsewhere fetches the job's folder from there (StartJobRequest.resume_source).
        # In memory: after a scheduler restart the resume goes on from what its new worker holds.
        self.ran_on: dict[str, str] = {}
        self._nodes: dict[str, int] = {}  # queued job id -> its advanced.num_nodes
        # A job of several nodes queued again to resume -> the workers it ran on, node 0 first: given
        # them again when they are idle (node 0's artifact root holds its checkpoints).
        self.last_nodes: dict[str, list[str]] = {}
        self._behind: dict[str, float] = {}  # job id -> when its worker was first seen to report it ended ahead of the store

    def _stream_behind(self, row: JobRow, state: WorkerState) -> bool:
        """True while the worker reports `row`'s job ended at a step the store has not stored yet,
        for up to STREAM_CATCH_UP_S: the ingest (ingest.py) stores a job's steps before its end, so
        a row that reads ended has every step the stream brought."""
        reported = state.last_adapter.version if state.last_adapter is not None else 0
        if row.current_step >= reported:
            self._behind.pop(row.id, None)
            return False
        since = self._behind.setdefault(row.id, time.monotonic())
        if time.monotonic() - since < STREAM_CATCH_UP_S:
            return True
        del self._behind[row.id]
        log.warning("job %s: worker %s reports it %s at step %d, the stream brought step %d in %.0f s: "
                    "ending it on the worker's word", row.id, row.worker, state.last_status, reported,
                    row.current_step, STREAM_CATCH_UP_S)
        return False

    async def run(self) -> None:
        """A round now, then again on every wake (a job queued or ended) or every poll_seconds."""
        wake = self.lifecycle.wake
        while True:
            try:
                await self.dispatch_once()
            except Exception:
                log.exception("dispatch round failed")
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.poll_seconds)

    async def dispatch_once(self) -> None:
        """Reconciles running jobs with their workers, settles the starts in doubt, then gives each
        queued job (oldest first) to an idle worker that can run it (fit.py). A job that no idle
        worker fits stays queued with the reason stored (`queue_reason`), and does not hold back
        the younger jobs behind it."""
        running = await asyncio.to_thread(self.store.list_jobs, "RUNNING", 1000, 0)
        busy_workers = {a for r in running for a in nodes_of(r.worker)}
        # A job whose end came off the stream while it waited in `_behind` is no longer running.
        running_ids = {r.id for r in running}
        self._behind = {job_id: since for job_id, since in self._behind.items() if job_id in running_ids}
        states = {a: await self.workers.status(a) for a in self.workers.addresses}
        self.outages.observe(states, self.clock())
        for row in running:
            if len(nodes_of(row.worker)) > 1:
                if await self._reconcile_nodes(row, states):
                    busy_workers.difference_update(nodes_of(row.worker))
                continue
            state = states.get(row.worker)
            if state is None or state.job_id == row.id:
                continue  # unreachable (keep waiting) or still at work
            if state.last_job_id == row.id and state.last_status in TERMINAL and not state.last_lost:
                if self._stream_behind(row, state):
                    continue  # the worker stays taken: the job's end comes off the stream after its steps
                await self.lifecycle.report(row.id, state.last_status, state.last_error, state.last_adapter, publish=True)
            else:
                await self._lost(row, state)
            busy_workers.discard(row.worker)
        # The store lists newest first; the queue is served oldest first.
        queued = await asyncio.to_thread(self.store.list_jobs, "QUEUED", 10_000, 0)
        queued.sort(key=lambda r: r.created_at)
        free: list[JobRow] = []
        for row in queued:
            if not row.worker:
                free.append(row)
            elif len(nodes_of(row.worker)) > 1:
                if await self._settle_nodes(row, states):
                    busy_workers.update(nodes_of(row.worker))
                else:
                    free.append(row)
            elif await self._settle_doubt(row, states.get(row.worker)):
                busy_workers.add(row.worker)  # running there, or still in doubt: that worker is taken
            else:
                free.append(row)
        live = {a: s for a, s in states.items() if s is not None}
        idle = [a for a, s in live.items() if not s.busy and a not in busy_workers]
        # What each worker can run changes rarely: a job's fit is worked out again only when it does.
        workers_seen = tuple((a, s.name, s.capabilities.SerializeToString(deterministic=True)
                              if s.capabilities is not None else None) for a, s in sorted(live.items()))
        self.fits = {row.id: self.fits[row.id] for row in free if row.id in self.fits}
        self._nodes = {row.id: self._nodes[row.id] for row in free if row.id in self._nodes}
        self.node_losses = {row.id: self.node_losses[row.id] for row in free if row.id in self.node_losses}
        for row in free:
            seen, reasons = self.fits.get(row.id, (None, {}))
            if seen != workers_seen:
                spec = spec_from_json(row.spec_json)
                reasons = {a: fit(spec, s.capabilities, s.name or a) for a, s in live.items()}
                self.fits[row.id] = (workers_seen, reasons)
            if row.id not in self._nodes:
                self._nodes[row.id] = num_nodes(spec_from_json(row.spec_json))
            nodes = self._nodes[row.id]
            if nodes > 1:
                before = self.last_nodes.get(row.id, [])  # a resume: node 0's root has the checkpoint
                fitting = sorted((a for a in idle if reasons[a] is None),
                                 key=lambda a: before.index(a) if a in before else len(before))
                if len(fitting) >= nodes:
                    chosen = fitting[:nodes]
                    for a in chosen:
                        idle.remove(a)  # taken, even if a StartJob is refused: next round
                    await self._start_nodes(row, chosen)
                else:
                    fit_reason = queue_reason(reasons, len(self.workers.addresses)) if not fitting else ""
                    waits = (f"waits for {nodes} idle trainer workers that fit it (advanced.num_nodes {nodes}); "
                             f"{len(fitting)} now" + (f": {fit_reason}" if fit_reason else ""))
                    loss = self.node_losses.get(row.id)
                    if loss is None:
                        await self._set_queue_reason(row, waits)
                    elif self.clock() >= loss.until:
                        await self._give_up(row, loss, nodes)
                    else:
                        await self._set_queue_reason(
                            row, f"{loss.what} lost since {clock_time(loss.since)} ({loss.why}); {waits}; fails at "
                            f"{clock_time(loss.until)} unless it resumes by then")
                continue
            address = next((a for a in idle if reasons[a] is None), None)
            if address is not None:
                idle.remove(address)  # taken, even if StartJob is refused: next round
                await self._start_on(row, address)
            else:
                await self._set_queue_reason(row, queue_reason(reasons, len(self.workers.addresses)))

    async def _set_queue_reason(self, row: JobRow, reason: str) -> None:
        """Stores why a queued job waits, and publishes it as a QUEUED status message, only when it
        changed (a dispatch round runs every poll_seconds). Each change its own event id (a reason
        can come back within the stream's duplicate window: a worker restarting and answering
        again); the store's reason keeps a restart from repeating it."""
        if reason == row.queue_reason:
            return
        move = Move("wait", QUEUED, reason, again=f"waits-{time.time_ns()}")
        if (await self.lifecycle.transition(row.id, move)).done:
            log.info("job %s waits: %s", row.id, reason)

    async def _lost(self, row: JobRow, state: WorkerState, why: str = "", what: str = "the trainer was") -> bool:
        """A running job its worker no longer runs, though it did not end there: queued again to
        be resumed (True), or failed once its resumes are spent (see the module's doc). `what` was
        lost ("node 1 (HOST:PORT) was" of a job of several nodes), for `why`."""
        reported = state.last_job_id == row.id
        why = why or (state.last_error if reported and state.last_error else
                      f"trainer {row.worker} no longer runs this job (worker restarted?)")
        done = row.resumes
        # The step it was lost at: the worker's last finished step (its adapter's version) may be one
        # the store has not got the event of yet.
        lost_at = max(row.current_step, state.last_adapter.version if reported and state.last_adapter else 0)
        if done >= MAX_RESUMES:
            message = why if what == "the trainer was" else f"{what} lost at step {lost_at}: {why}"
            message = f"{message}; not resumed again after {done} resumes" if done else message
            await self.lifecycle.report(row.id, FAILED, message, state.last_adapter if reported else None, publish=True)
            return False

        async def requeue(current: JobRow) -> Move:
            n = current.resumes + 1
            step = max(current.current_step, lost_at)
            return Move("resume", QUEUED, f"resuming from the last checkpoint after {what} lost at step "
                        f"{step} ({why}); resume {n} of {MAX_RESUMES}", worker=row.worker,
                        again=f"resume-{n}")

        outcome = await self.lifecycle.transition(row.id, Move("resume", QUEUED, worker=row.worker), requeue)
        if outcome.move is None:
            return False  # ended or moved meanwhile
        self.ran_on[row.id] = holder_of(row.worker)
        log.warning("job %s: %s", row.id, outcome.move.message)
        return True

    async def _give_up(self, row: JobRow, loss: NodeLoss, nodes: int) -> None:
        """A job that lost a node and found no workers to resume on within node_wait_seconds:
        FAILED, naming the node."""
        message = (f"{loss.what} {loss.was} lost at step {row.current_step} ({loss.why}), and no {nodes} idle trainer "
                   f"workers that fit the job were found to resume it within node_wait_seconds "
                   f"({self.node_wait_seconds:g} s, by {clock_time(loss.until)})")
        if (await self.lifecycle.transition(row.id, Move("give_up", FAILED, message))).done:
            self.node_losses.pop(row.id, None)
            self.last_nodes.pop(row.id, None)
            log.warning("job %s failed: %s", row.id, message)

    async def _settle_doubt(self, row: JobRow, state: WorkerState | None) -> bool:
        """A queued job whose StartJob on `row.worker` had no answer: True when it runs there (now
        RUNNING) or that worker still cannot say; False when the worker does not have it (the job
        is free to be dispatched again)."""
        if state is None and row.worker in self.workers.addresses:
            return True  # still unreachable: try no other worker

        async def settle(current: JobRow) -> Move:
            if state is not None and state.has_job(row.id):
                return Move("settle", RUNNING, f"started on {row.worker}", worker=row.worker)
            log.info("job %s did not start on %s; it is queued again", row.id, row.worker)
            return Move("settle", QUEUED, worker=row.worker, publish=False)

        outcome = await self.lifecycle.transition(row.id, Move("settle", RUNNING, worker=row.worker), settle)
        if outcome.move is None:  # not in doubt there any more
            return outcome.row is not None and outcome.row.status == RUNNING
        if outcome.move.to == RUNNING:
            log.info("dispatched job %s to %s", row.id, row.worker)
            return True
        return False

    async def _sources(self, row: JobRow, spec: common_pb2.JobSpec, address: str, resume: bool) -> dict[str, str]:
        """The other workers whose artifact roots hold what the job needs (StartJobRequest
        init_adapter_source and resume_source): the worker that ran the job before (a resume), and
        the one that ran the job whose adapter is its init_adapter ("job-<id>"). Only those other
        than `address` and known to this scheduler; the worker fetches from them (no shared disk)."""
        known = set(self.workers.addresses) - {address}
        sources: dict[str, str] = {}
        if resume and self.ran_on.get(row.id) in known:
            sources["resume_source"] = self.ran_on[row.id]
        name = spec.init_adapter.name if spec.HasField("init_adapter") else ""
        if name.startswith("job-") and spec.init_adapter.path:
            holder = await asyncio.to_thread(self.store.get_job, name.removeprefix("job-"))
            if holder is not None and holder_of(holder.worker) in known and holder.adapter_path == spec.init_adapter.path:
                sources["init_adapter_source"] = holder_of(holder.worker)
        return sources

    async def _start_on(self, row: JobRow, address: str) -> None:
        """StartJob on `address`; every outcome is handled here (see the module docstring)."""

        async def start(current: JobRow) -> Move | None:
            # A job that ran before (queued again after its trainer was lost) goes on from its checkpoint.
            resume = current.started_at is not None or current.resumes > 0
            spec = spec_from_json(row.spec_json)
            sources = await self._sources(current, spec, address, resume)
            try:
                await self.workers.start(address, row.id, spec, row.total_steps, resume=resume,
                                         stored_steps=current.current_step,
                                         init_adapter_source=sources.get("init_adapter_source", ""),
                                         resume_source=sources.get("resume_source", ""))
            except WorkerBusy:
                return None  # another job holds the worker: next round
            except WorkerUnavailable as e:
                state = await self.workers.status(address)
                if state is None:
                    log.warning("StartJob of %s on %s has no answer (%s) and the worker cannot be asked: "
                                "the job waits for it", row.id, address, e)
                    return Move("start", IN_DOUBT, worker=address, publish=False)
                if not state.has_job(row.id):
                    log.warning("job %s did not start on %s (%s); next round tries again", row.id, address, e)
                    return None
                log.info("job %s runs on %s although StartJob had no answer (%s)", row.id, address, e)
            except WorkerError as e:
                return Move("start", FAILED, str(e) or type(e).__name__)
            if resume:
                return Move("start", RUNNING, f"resumed on {address}", worker=address,
                            again=f"resume-{current.resumes}")
            return Move("start", RUNNING, f"started on {address}", worker=address)

        outcome = await self.lifecycle.transition(row.id, Move("start", RUNNING, worker=address), start)
        if outcome.move is not None and outcome.move.to == RUNNING:
            self.ran_on.pop(row.id, None)  # its folder is on `address` now
            log.info("dispatched job %s to %s%s", row.id, address, " to resume" if outcome.move.again else "")

    # ------------------------------------------------------------------ a job of several nodes

    def _endpoint(self, node0: str) -> str:
        """The rendezvous of a job whose node 0 is `node0`: on its host, a port of its own."""
        host = node0.rpartition(":")[0] or node0
        index = list(self.workers.addresses).index(node0) if node0 in self.workers.addresses else 0
        return f"{host}:{self.rendezvous_port + index}"

    async def _reconcile_nodes(self, row: JobRow, states: dict[str, WorkerState | None]) -> bool:
        """A running job of several nodes against its workers; True when it left them (ended, or
        queued again to resume: the module's node failure rule, nodes.py)."""
        addresses = nodes_of(row.worker)
        now = self.clock()
        verdict = judge(row.id, addresses, states, self.outages.down_since, now, self.node_lost_seconds)
        node0 = states.get(addresses[0])
        if verdict.kind == ENDED:
            assert node0 is not None
            await self.lifecycle.report(row.id, node0.last_status, node0.last_error, node0.last_adapter, publish=True)
            return True
        if verdict.kind == AT_WORK:
            return False  # at work, not reached yet, or a part still ending (it loses its peers: it will)
        if verdict.stop and not await self._stop_parts(row.id, list(verdict.stop)):
            return False  # a part that still runs could not be stopped: next round
        self.last_nodes[row.id] = addresses
        what, why = verdict.what(), verdict.why()[:1000]
        # Node 0 not answering: no adapter of its to record should the job fail here.
        state = node0 or WorkerState(address=addresses[0], name="", busy=False, job_id="")
        if await self._lost(row, state, why, f"{what} {verdict.was()}"):
            since = verdict.since if verdict.since is not None else now
            self.node_losses[row.id] = NodeLoss(what, verdict.was(), why, since, now + self.node_wait_seconds)
        return True

    async def _settle_nodes(self, row: JobRow, states: dict[str, WorkerState | None]) -> bool:
        """A queued job of several nodes whose StartJob on node 0 had no answer (nodes 1.. had
        started): True when it runs (node 0 has it: now RUNNING) or a node cannot be asked yet;
        False when node 0 does not have it (the other parts are stopped, the job is free again)."""
        addresses = nodes_of(row.worker)
        if any(states.get(a) is None for a in addresses):
            return True
        node0 = states[addresses[0]]
        assert node0 is not None
        if not node0.has_job(row.id) and not await self._stop_parts(row.id, addresses[1:]):
            return True

        async def settle(current: JobRow) -> Move:
            if node0.has_job(row.id):
                return Move("settle", RUNNING, f"started on {row.worker}", worker=row.worker)
            log.info("job %s did not start on %s; it is queued again", row.id, row.worker)
            return Move("settle", QUEUED, worker=row.worker, publish=False)

        outcome = await self.lifecycle.transition(row.id, Move("settle", RUNNING, worker=row.worker), settle)
        if outcome.move is None:
            return outcome.row is not None and outcome.row.status == RUNNING
        return outcome.move.to == RUNNING

    async def _stop_parts(self, job_id: str, addresses: list[str]) -> bool:
        """Stops the job's parts on `addresses` (nodes other than 0: they publish nothing); False
        when a worker could not be reached to do so."""
        from rlvr.services.scheduler.workers import JobNotOnWorker

        whole = True
        for address in addresses:
            try:
                await self.workers.cancel(address, job_id)
            except JobNotOnWorker:
                pass
            except WorkerError as e:
                log.warning("job %s: could not stop its part on %s: %s", job_id, address, e)
                whole = whole and not isinstance(e, WorkerUnavailable)
        return whole

    async def _start_nodes(self, row: JobRow, addresses: list[str]) -> None:
        """StartJob on every node, all or none: nodes 1.. first (they wait in the rendezvous and
        publish nothing), node 0 last (it speaks for the job); see the module's doc."""
        joined, endpoint = ",".join(addresses), self._endpoint(addresses[0])

        async def start(current: JobRow) -> Move | None:
            resume = current.started_at is not None or current.resumes > 0
            spec = spec_from_json(row.spec_json)
            started: list[str] = []
            for rank in [*range(1, len(addresses)), 0]:
                address = addresses[rank]
                try:
                    await self.workers.start(address, row.id, spec, row.total_steps, resume=resume,
                                             stored_steps=current.current_step, node_rank=rank,
                                             rendezvous_endpoint=endpoint)
                except WorkerError as e:
                    if rank == 0 and isinstance(e, WorkerUnavailable):
                        state = await self.workers.status(address)
                        if state is None:
                            log.warning("StartJob of %s on node 0 %s has no answer (%s): the job waits for it",
                                        row.id, address, e)
                            return Move("start", IN_DOUBT, worker=joined, publish=False)
                        if state.has_job(row.id):
                            break  # it runs there although the answer was lost
                    unknown = isinstance(e, WorkerUnavailable)
                    if not await self._stop_parts(row.id, started + ([address] if unknown else [])):
                        log.warning("job %s: a part may still run; the job waits until it can be stopped", row.id)
                    if isinstance(e, (WorkerBusy, WorkerUnavailable)):
                        log.info("job %s did not start on node %d %s (%s); next round tries again", row.id, rank,
                                 address, e)
                        return None
                    return Move("start", FAILED, f"node {rank} ({address}): {e or type(e).__name__}")
                started.append(address)
            where = f"{len(addresses)} nodes: {joined}"
            if resume:
                return Move("start", RUNNING, f"resumed on {where}", worker=joined, again=f"resume-{current.resumes}")
            return Move("start", RUNNING, f"started on {where}", worker=joined)

        outcome = await self.lifecycle.transition(row.id, Move("start", RUNNING, worker=joined), start)
        if outcome.move is not None and outcome.move.to == RUNNING:
            self.last_nodes.pop(row.id, None)
            self.node_losses.pop(row.id, None)
            log.info("dispatched job %s to %s", row.id, joined)
