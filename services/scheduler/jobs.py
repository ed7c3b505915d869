"""The scheduler's job API: create, get, list, cancel and delete jobs. No gRPC here (server.py
translates). The parts behind it:

- lifecycle.py: a job's states and transitions, and the one writer of its status (`transition`);
- dispatch.py: reconciles the trainer workers, gives queued jobs to them, settles the starts in
  doubt and resumes a job whose trainer was lost;
- ingest.py: the ordered consumer of every job's events, and `watch`.

State flows one way: a job row is the record. Transitions the scheduler makes itself (queued,
dispatched, cancelled, a worker found dead or done) are written to the store first and then
published as status events; transitions the trainer's job process makes (running, completed,
failed) arrive as status events on NATS (ingest.py).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from rlvr.common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, check_page, shown
from rlvr.common.settings import rlvr_home
from rlvr.heads import head_key
from rlvr.infra.events import DurableSubscription, Event, EventBus, cancel_and_wait
from rlvr.infra.schema import LOOP_FINAL_STATUSES, JobRow, MetricPointRow, RoundRow
from rlvr.infra.store import Store
from rlvr.jobspec import (
    EnvironmentCatalog,
    ResolvedJob,
    environment_info,
    is_head,
    is_sft,
    job_status_name,
    resolve_spec,
)
from rlvr.models import check_base_model
from rlvr.rewards.registry import Catalog
from rlvr.services.scheduler.convert import TERMINAL, job_to_proto, spec_from_json
from rlvr.services.scheduler.datasets import check_dataset, check_head_dataset, check_sft_dataset
from rlvr.services.scheduler.dispatch import (
    MAX_RESUMES,
    NODE_LOST_SECONDS,
    NODE_WAIT_SECONDS,
    RENDEZVOUS_PORT,
    Dispatcher,
    nodes_of,
    num_nodes,
)
from rlvr.services.scheduler.ingest import STORE_GRACE_S, STREAM_GRACE_S, Ingest, events_consumer
from rlvr.services.scheduler.lifecycle import CANCELLED, JobLifecycle, Move
from rlvr.services.scheduler.rewards import LocalRewards, RewardCatalogs, reward_keys
from rlvr.services.scheduler.workers import JobNotOnWorker, Workers, WorkerState, WorkerUnavailable
from rlvr.v1 import common_pb2

__all__ = ["MAX_RESUMES", "STORE_GRACE_S", "STREAM_GRACE_S", "JobManager", "WorkerState", "Workers",
           "events_consumer"]

log = logging.getLogger("rlvr.scheduler.jobs")


class JobManager:
    def __init__(self, store: Store, bus: EventBus | None, workers: Workers, poll_seconds: float = 1.0,
                 data_roots: Sequence[Path] = (), model_roots: Sequence[Path] | None = None,
                 rewards: RewardCatalogs | None = None, rendezvous_port: int = RENDEZVOUS_PORT,
                 node_lost_seconds: float = NODE_LOST_SECONDS, node_wait_seconds: float = NODE_WAIT_SECONDS,
                 environments: EnvironmentCatalog | None = None) -> None:
        self.store = store
        self.rewards = rewards or LocalRewards()  # what a job's reward is checked against (rewards.py)
        # what a job's environment is checked against (None: this process's registry, rlvr/jobspec/)
        self.environments = environments
        self.data_roots = tuple(data_roots)  # where a Boxed-answer job's local data may be read at submit
        # where a local base model may be named from (rlvr.models.check_base_model)
        self.model_roots = tuple(model_roots) if model_roots is not None else (rlvr_home() / "models",)
        self.workers = workers
        self.poll_seconds = poll_seconds
        self.lifecycle = JobLifecycle(store, bus)
        self.dispatcher = Dispatcher(self.lifecycle, workers, poll_seconds, rendezvous_port, node_lost_seconds,
                                     node_wait_seconds)
        self.ingest = Ingest(self.lifecycle, poll_seconds)
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[DurableSubscription] = []

    @property
    def bus(self) -> EventBus | None:
        """Where status events go (None: nowhere); set here, it is the lifecycle's."""
        return self.lifecycle.bus

    @bus.setter
    def bus(self, bus: EventBus | None) -> None:
        self.lifecycle.bus = bus

    # ------------------------------------------------------------------ running

    async def start(self) -> None:
        sub = await self.ingest.subscribe()
        if sub is not None:
            self._subs.append(sub)
        self._tasks.append(asyncio.create_task(self.dispatcher.run(), name="dispatch"))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.stop()

    async def dispatch_once(self) -> None:
        """One dispatch round (dispatch.py)."""
        await self.dispatcher.dispatch_once()

    async def _on_event(self, event: Event) -> None:
        await self.ingest.on_event(event)

    # ------------------------------------------------------------------ API

    async def create(self, spec: common_pb2.JobSpec, dry_run: bool) -> tuple[ResolvedJob, common_pb2.Job | None]:
        catalog = await self.rewards.catalog(reward_keys(spec))
        environments = await self.environments_for(spec)
        resolved = resolve_spec(spec, catalog=catalog, environments=environments)
        nodes, configured = num_nodes(resolved.spec), len(self.workers.addresses)
        if nodes > configured:
            raise InvalidArgument(f"advanced.num_nodes: {nodes} nodes need {nodes} trainer workers, but this "
                                  f"scheduler has {configured} (trainer_addresses); a job never starts on fewer")
        await self.check_data(resolved.spec, catalog, environments)
        if resolved.spec.HasField("init_adapter") and (resolved.spec.init_adapter.name or resolved.spec.init_adapter.path):
            resolved.spec.init_adapter.CopyFrom(await self.resolve_adapter(resolved.spec.init_adapter))
        if dry_run:
            return resolved, None
        row = await self.lifecycle.create(resolved)
        return resolved, job_to_proto(row)

    async def create_for_round(self, resolved: ResolvedJob, round_row: RoundRow) -> JobRow:
        """Queues a loop round's job: the job and the round row are stored in one transaction."""
        return await self.lifecycle.create(resolved, round_row)

    async def check_data(self, spec: common_pb2.JobSpec, catalog: Catalog | None = None,
                         environments: EnvironmentCatalog | None = None) -> None:
        """INVALID_ARGUMENT now for a base model no worker may load (a malformed hub id, a path outside
        the model roots, a bare name that is no folder under them while the hub is unreachable:
        rlvr.models.check_base_model), or a dataset the trainer could not read or that lacks a column
        the job's rewards or its environment read (services/scheduler/datasets.py). A bare name found
        under the model roots is replaced in `spec` by that folder's path."""
        spec.base_model = await asyncio.to_thread(check_base_model, spec.base_model, self.model_roots)
        if is_sft(spec):  # no reward's data, no environment: the labeled dataset
            await asyncio.to_thread(check_sft_dataset, spec.sft, self.data_roots)
            return
        if is_head(spec):
            await asyncio.to_thread(check_head_dataset, spec.head, self.data_roots)
            return
        environment = environment_info(spec.environment.key, environments or await self.environments_for(spec))
        await asyncio.to_thread(check_dataset, spec.reward, self.data_roots, catalog, environment)

    async def environments_for(self, spec: common_pb2.JobSpec) -> EnvironmentCatalog | None:
        """What a spec naming an environment is checked against: this process's registry, loaded in a
        thread, never on the event loop (a remote environment's server that is down is waited for,
        up to its wait_seconds, at every load); None when the spec names none (nothing to load)."""
        if self.environments is not None or not spec.environment.key.strip():
            return self.environments
        from rlvr.environments.registry import load_registry

        return await asyncio.to_thread(load_registry)

    async def resolve_adapter(self, ref: common_pb2.AdapterRef) -> common_pb2.AdapterRef:
        """A job's adapter named in a spec (`init_adapter`), with the folder the trainer reads.

        A name must be a job's adapter name ("job-<id>"), of a job that has one; version 0 means
        its final version, any other version must be that one (older versions are not kept).
        A bare path is passed on as given: the trainer checks it is a PEFT folder under its
        artifact root."""
        if not ref.name:
            return ref
        job_id = ref.name.removeprefix("job-")
        row = await asyncio.to_thread(self.store.get_job, job_id) if ref.name.startswith("job-") else None
        if row is None or not row.adapter_name:
            raise InvalidArgument(f"init_adapter.name: {shown(ref.name)} is not the adapter of a job; use a job's "
                                  "adapter name, job-<id>, as `rlvr jobs show` prints it")
        if spec_from_json(row.spec_json).method == common_pb2.TRAINING_METHOD_HEAD:
            raise InvalidArgument(f"init_adapter.name: job {row.id} is a Head job: its adapter is a classification "
                                  f"or regression head, not a policy to train on; score with it as the reward "
                                  f"{head_key(row.id)} instead")
        if not row.adapter_path:
            raise FailedPrecondition(f"init_adapter.name: job {row.id}'s adapter {ref.name} has no stored folder "
                                     "(it was never saved, or a loop reclaimed it); train on another job's adapter")
        if ref.version not in (0, row.adapter_version):
            raise InvalidArgument(f"init_adapter.version: {ref.version} is not kept; job {row.id} keeps its "
                                  f"final version {row.adapter_version} (0 = that one)")
        return common_pb2.AdapterRef(name=row.adapter_name, version=row.adapter_version, path=row.adapter_path)

    async def adapter_rank(self, ref: common_pb2.AdapterRef) -> int:
        """The LoRA rank of a resolved job adapter: its adapter_config.json's `r` where this scheduler
        can read the folder, else its job's card (a stacked RLVR job's rank plus its own start's)."""
        def from_config() -> int | None:
            try:
                return int(json.loads((Path(ref.path) / "adapter_config.json").read_text())["r"])
            except (OSError, ValueError, KeyError, TypeError):
                return None

        rank = await asyncio.to_thread(from_config)
        if rank is not None:
            return rank
        row = await asyncio.to_thread(self.store.get_job, ref.name.removeprefix("job-"))
        if row is None:
            return 0
        spec = spec_from_json(row.spec_json)
        own = spec.sft.lora_rank if spec.method == common_pb2.TRAINING_METHOD_SFT else spec.grpo.lora_rank
        below = await self.adapter_rank(spec.init_adapter) if spec.init_adapter.name else 0
        return own + below

    # ------------------------------------------------------------------ watchers (lifecycle.py)

    @property
    def generation(self) -> int:
        return self.lifecycle.generation

    async def wait_job(self, job_id: str, until: Callable[[JobRow], bool], recheck_seconds: float = 5.0) -> JobRow:
        return await self.lifecycle.wait_job(job_id, until, recheck_seconds)

    async def wait_change(self, seen: int, timeout: float) -> None:
        await self.lifecycle.wait_change(seen, timeout)

    async def notify(self) -> None:
        await self.lifecycle.notify()

    def watch(self, job_id: str, from_start: bool) -> AsyncIterator[common_pb2.JobEvent]:
        """Status and metric events until the job ends (ingest.py)."""
        return self.ingest.watch(job_id, from_start)

    # ------------------------------------------------------------------ reads and changes

    async def get(self, job_id: str) -> common_pb2.Job:
        return job_to_proto(await self.lifecycle.row(job_id))

    async def list(self, status: int, limit: int, offset: int) -> tuple[builtins.list[common_pb2.Job], int]:
        check_page(limit, offset)
        if status and status not in common_pb2.JobStatus.values():
            raise InvalidArgument(f"status: {status} is not a JobStatus; allowed: "
                                  f"{', '.join(common_pb2.JobStatus.keys()[1:])} or unset for all")
        name = job_status_name(status) if status else None
        rows = await asyncio.to_thread(self.store.list_jobs, name, limit or 100, offset)
        total = await asyncio.to_thread(self.store.count_jobs, name)
        return [job_to_proto(r) for r in rows], total

    async def cancel(self, job_id: str) -> common_pb2.Job:
        """CANCELLED, the job's process stopped first on the worker it runs on (or is in doubt on)."""

        async def stop_there(row: JobRow) -> Move:
            move = Move("cancel", CANCELLED, "cancelled by request")
            # Node 0 first (its cancel stops every node's part at the same step: distributed.py).
            for i, worker in enumerate(nodes_of(row.worker)):
                if worker not in self.workers.addresses:
                    raise Unavailable(f"job {job_id} is not cancelled: it runs on trainer {worker}, which is not "
                                      "one of this scheduler's trainer_addresses; add it back to cancel the job there")
                try:
                    adapter = await self.workers.cancel(worker, job_id)
                    if i == 0:
                        move.adapter = adapter  # node 0's: the job's
                except JobNotOnWorker:
                    pass  # not there (never started, or the worker restarted): nothing to stop
                except WorkerUnavailable as e:
                    raise Unavailable(f"job {job_id} is not cancelled: {e}; try again") from None
            return move

        outcome = await self.lifecycle.transition(job_id, Move("cancel", CANCELLED), stop_there)
        if outcome.row is None:
            raise NotFound(f"job {job_id!r} not found")
        if not outcome.done:
            raise FailedPrecondition(f"job {job_id} has already ended ({outcome.row.status}); nothing to cancel")
        return job_to_proto(outcome.row)

    async def delete(self, job_id: str, remove_files: Callable[[JobRow], int]) -> int:
        """Deletes a finished job: `remove_files(row)` first (its files; returns the bytes freed),
        then its rows. Under the job lock, so no status lands in between. FailedPrecondition for a
        job that has not ended, that an open loop uses as a round, or whose adapter a job that has
        not ended starts from."""
        async with self.lifecycle.lock:
            row = await self.lifecycle.row(job_id)
            if row.status not in TERMINAL:
                raise FailedPrecondition(f"job {job_id} is {row.status}; cancel it first "
                                         f"(rlvr jobs cancel {job_id}), then delete it")
            await self._check_unused(row)
            freed = await asyncio.to_thread(remove_files, row)
            await asyncio.to_thread(self.store.delete_job, job_id)
        log.info("job %s deleted (%d bytes of files freed)", job_id, freed)
        await self.notify()
        return freed

    async def _check_unused(self, row: JobRow) -> None:
        for round_ in await asyncio.to_thread(self.store.rounds_of_job, row.id):
            loop = await asyncio.to_thread(self.store.get_loop, round_.loop_id)
            if loop is not None and loop.status not in LOOP_FINAL_STATUSES:
                raise FailedPrecondition(f"job {row.id} is round {round_.index} of loop {loop.id}, which is "
                                         f"{loop.status}; stop the loop first (rlvr loops stop {loop.id}) "
                                         "or delete the job once the loop has ended")
        if not row.adapter_name:
            return
        for other in await asyncio.to_thread(self.store.list_jobs, ["QUEUED", "RUNNING"], 100_000, 0):
            ref = spec_from_json(other.spec_json).init_adapter
            if ref.name == row.adapter_name or (row.adapter_path and ref.path == row.adapter_path):
                raise FailedPrecondition(f"job {other.id} ({other.status}) starts from the adapter of job "
                                         f"{row.id}; delete it once that job has ended")

    async def job_row(self, job_id: str) -> JobRow:
        """The stored row of a job; NotFound naming the id when there is none."""
        return await self.lifecycle.row(job_id)

    async def metric_points(self, job_id: str) -> builtins.list[MetricPointRow]:
        """The job's stored steps, in step order."""
        return await asyncio.to_thread(self.store.metric_points, job_id)
