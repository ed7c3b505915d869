"""The job Actions of the scheduler, and the RL Metrics card over the store: Download Adapter,
Merge Model (with Download Merged Model) and Export History. No gRPC here: the servicer maps calls
onto `JobActions` and the errors of rlvr.common.errors onto status codes, and the trainer workers
are reached through services/scheduler/workers.py, whose failures arrive as its domain exceptions.

Files are read from the paths the store records: a job's adapter folder (`JobRow.adapter_path`,
written by the trainer) and its merged checkpoint (an `ArtifactRow` of kind "merged"). Where the
scheduler shares the trainers' artifact root (one machine, or one volume, as in docker-compose) it
streams them from its own disk; a folder not on its disk is relayed from the worker that ran the
job (`JobRow.worker`, TrainerService.FetchFolder, resumed across a broken stream), so hosts need
share no disk. Such a job's merge runs on that worker too (it holds the adapter), and so does
its merged checkpoint.

Merge Model runs on a trainer worker (TrainerService.MergeAdapter, in a child process there), its
progress relayed as it comes. The checkpoint is named `job-<id>-v<adapter version>` under
`<artifact_root>/merged/` and recorded once done (before the client sees `done`), so a second
MergeModel on the same job answers at once with the existing checkpoint, and two concurrent ones
for a job merge once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Protocol, TypeVar, cast

from rlvr.adapters import ADAPTER_FILES
from rlvr.common import paths
from rlvr.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from rlvr.infra.schema import ArtifactRow, JobRow
from rlvr.jobspec import MERGE_DTYPES, merge_dtype
from rlvr.objectstore import ObjectStore, StoreError
from rlvr.services.scheduler.convert import spec_from_json
from rlvr.services.scheduler.dispatch import holder_of
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.metrics_card import export_history, job_metrics
from rlvr.services.scheduler.reclaim import delete_job_files
from rlvr.services.scheduler.workers import (
    FolderNotOnWorker,
    MergeOutputExists,
    WorkerError,
    WorkerRejected,
    WorkerState,
    WorkerUnavailable,
)
from rlvr.transfer import directory_chunks, directory_size
from rlvr.v1 import common_pb2, scheduler_pb2, trainer_pb2

log = logging.getLogger("rlvr.scheduler.actions")

T = TypeVar("T")


class MergeWorkers(Protocol):
    """What Merge Model and the downloads need of the trainer workers (`GrpcWorkers` is the real one)."""

    @property
    def addresses(self) -> Sequence[str]: ...

    async def status(self, address: str) -> WorkerState | None: ...
    def merge(self, address: str, request: trainer_pb2.MergeAdapterRequest
              ) -> AsyncGenerator[trainer_pb2.MergeProgress, None]:
        """The merge's progress; a failure raises MergeOutputExists, WorkerUnavailable,
        WorkerRejected or WorkerFailed. Closing the iterator (`aclose`) stops the merge there."""
        ...

    def fetch(self, address: str, path: str, files: Sequence[str] | None = None
              ) -> AsyncGenerator[common_pb2.FileChunk, None]:
        """A folder under that worker's artifact root (TrainerService.FetchFolder), resumed across a
        broken stream; a failure raises FolderNotOnWorker, WorkerUnavailable, WorkerRejected or
        WorkerFailed."""
        ...


def merged_name(row: JobRow, dtype: str = "auto") -> str:
    """The merged checkpoint's folder name (a valid artifact name: ids are hex), one per dtype asked
    ("auto", the base model's own, has no suffix)."""
    return f"job-{row.id}-v{row.adapter_version}" + ("" if dtype == "auto" else f"-{dtype}")


async def _in_thread(chunks: Iterator[T]) -> AsyncIterator[T]:
    """A blocking iterator (file reads) consumed off the event loop, one item at a time."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, chunks, done)
        if item is done:
            return
        yield cast(T, item)  # not the sentinel: checked above


class JobActions:
    def __init__(self, jobs: JobManager, artifact_root: Path, store: ObjectStore | None = None) -> None:
        self.jobs = jobs
        self.root = Path(artifact_root)
        self.store = store  # an object store the trainers put adapters and merged models into
        self._merge_locks: dict[str, asyncio.Lock] = {}

    async def _row(self, job_id: str) -> JobRow:
        if not job_id:
            raise InvalidArgument("job_id: required (the id CreateJob returned)")
        return await self.jobs.job_row(job_id)

    # ------------------------------------------------------------------ Delete

    async def delete(self, job_id: str) -> scheduler_pb2.DeleteJobResponse:
        """DeleteJob: the job's files and rows (JobManager.delete). Refused while the job is being
        merged; a merge asked for while the delete runs waits for it, then finds no job."""
        if not job_id:
            raise InvalidArgument("id: required (the id CreateJob returned)")
        lock = self._merge_locks.setdefault(job_id, asyncio.Lock())
        if lock.locked():
            raise FailedPrecondition(f"job {job_id} is being merged; delete it once the merge has ended")
        async with lock:
            freed = await self.jobs.delete(job_id, lambda row: delete_job_files(self.jobs.store, self.root, row))
        self._merge_locks.pop(job_id, None)
        return scheduler_pb2.DeleteJobResponse(id=job_id, freed_bytes=freed)

    # ------------------------------------------------------------------ RL Metrics and export

    async def metrics(self, job_id: str) -> scheduler_pb2.JobMetrics:
        row = await self._row(job_id)
        return job_metrics(row, await self.jobs.metric_points(job_id))

    async def export(self, job_id: str, fmt: int) -> scheduler_pb2.ExportHistoryResponse:
        row = await self._row(job_id)
        return export_history(row, await self.jobs.metric_points(job_id), fmt)

    # ------------------------------------------------------------------ Download Adapter

    async def adapter_chunks(self, job_id: str) -> AsyncIterator[common_pb2.FileChunk]:
        row = await self._row(job_id)
        folder = self._adapter_folder(row)
        if not self._local(folder):  # in the object store, else on the worker that wrote it
            async for chunk in self._remote(row, str(folder), 3, ADAPTER_FILES, "adapter folder"):
                yield chunk
            return
        try:
            chunks = await asyncio.to_thread(directory_chunks, folder, ADAPTER_FILES)
        except FileNotFoundError as e:
            log.warning("the adapter of job %s is incomplete: %s", job_id, e)
            raise FailedPrecondition(f"the adapter of job {job_id} is incomplete on disk (a file of "
                                     f"{', '.join(ADAPTER_FILES)} is missing)") from None
        async for chunk in _in_thread(chunks):
            yield chunk

    def _adapter_folder(self, row: JobRow) -> Path:
        """The job's adapter folder as the store records it: on this scheduler's disk (a shared
        artifact root) or on the worker that ran the job (`row.worker`), which relays it."""
        if not row.adapter_path:
            if row.status == "QUEUED":
                why = "it is queued and has not trained a step"
            elif row.status == "RUNNING":
                why = "it is running; its adapter is published when it ends (or is cancelled)"
            else:
                why = f"it ended ({row.status}) before its first step finished"
            raise FailedPrecondition(f"job {row.id} has no adapter yet: {why}")
        folder = Path(row.adapter_path)
        if not self._local(folder) and self._holder(row) is None and self.store is None:
            log.warning("the adapter folder of job %s is missing on this scheduler's disk and its worker %r is not "
                        "one of --trainer-addresses: %s", row.id, row.worker, folder)
            raise FailedPrecondition(f"the adapter folder of job {row.id} is missing on the scheduler's disk, and no "
                                     f"trainer worker it knows holds it (the job ran on {row.worker or 'no worker'})")
        return folder

    def _local(self, folder: Path) -> bool:
        """Whether the folder is on this scheduler's disk: under its own artifact root (a root it
        shares with the workers) and there. The scheduler reads no folder outside its root."""
        return paths.is_under(paths.resolve(folder), [paths.resolve(self.root)]) and folder.is_dir()

    def _holder(self, row: JobRow) -> str | None:
        """The worker whose artifact root holds the job's folders: the one that ran it (node 0 of a
        job of several nodes, `holder_of`), if the scheduler still reaches it (one of its
        --trainer-addresses)."""
        address = holder_of(row.worker)
        return address if address and address in self._workers().addresses else None

    async def _remote(self, row: JobRow, path: str, depth: int, files: Sequence[str] | None, what: str
                      ) -> AsyncIterator[common_pb2.FileChunk]:
        """A folder not on this disk: from the object store when one is configured and holds it
        whole (its key: the last `depth` parts of the path, "jobs/<id>/adapter", "merged/<name>"),
        else relayed from the worker."""
        if self.store is not None:
            key = "/".join(Path(path).parts[-depth:])
            try:
                chunks = await asyncio.to_thread(self.store.chunks, key, files)
            except (StoreError, ImportError) as e:
                log.info("the %s of job %s is not in the object store (%s): asking its worker", what, row.id, e)
            else:
                log.info("streaming the %s of job %s from %s", what, row.id, self.store.url)
                try:
                    async for chunk in _in_thread(chunks):
                        yield chunk
                except StoreError as e:
                    raise Unavailable(f"the object store failed while sending the {what} of job {row.id}: "
                                      f"{e}") from None
                return
        async for chunk in self._relay(row, path, files, what):
            yield chunk

    async def _relay(self, row: JobRow, path: str, files: Sequence[str] | None, what: str
                     ) -> AsyncIterator[common_pb2.FileChunk]:
        """The folder `path` relayed from the worker that holds the job's folders."""
        address = self._holder(row)
        if address is None:
            raise FailedPrecondition(f"the {what} of job {row.id} is not on the scheduler's disk, and the worker that "
                                     f"ran the job ({row.worker or 'none recorded'}) is not one it knows")
        log.info("relaying the %s of job %s from trainer %s", what, row.id, address)
        try:
            async with contextlib.aclosing(self._workers().fetch(address, path, files)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except FolderNotOnWorker as e:
            raise FailedPrecondition(f"the {what} of job {row.id} is gone from trainer {address}: {e}") from None
        except WorkerUnavailable as e:
            raise Unavailable(f"trainer {address}, which holds the {what} of job {row.id}, cannot be reached: "
                              f"{e}") from None
        except WorkerError as e:
            raise RuntimeError(f"trainer {address} could not send the {what} of job {row.id}: {e}") from None

    # ------------------------------------------------------------------ Merge Model

    async def merge(self, job_id: str, dtype: str = "") -> AsyncIterator[scheduler_pb2.MergeModelProgress]:
        dtype = merge_dtype(dtype)
        row = await self._row(job_id)
        folder = self._adapter_folder(row)
        lock = self._merge_locks.setdefault(job_id, asyncio.Lock())
        async with lock:
            existing = await self._current_merge(row, dtype=dtype)
            if existing is not None:
                yield _done(existing)
                return
            # An adapter on this disk (a shared root) merges on any worker; else on the one that holds it.
            address = await self._pick_worker() if self._local(folder) else await self._holding_worker(row)
            yield scheduler_pb2.MergeModelProgress(stage="starting", fraction=0.0)
            request = trainer_pb2.MergeAdapterRequest(base_model=spec_from_json(row.spec_json).base_model,
                                                      adapter_path=str(folder), output_name=merged_name(row, dtype),
                                                      dtype=dtype)
            log.info("merging job %s on trainer %s as %s", job_id, address, request.output_name)
            try:
                # Closed however this ends (done, or our client went away): the trainer stops its merge.
                async with contextlib.aclosing(self._workers().merge(address, request)) as progress:
                    async for p in progress:
                        if p.done:
                            artifact = await self._record(row, p.path, p.size_bytes)
                            yield _done(artifact)
                            return
                        yield scheduler_pb2.MergeModelProgress(stage=p.stage, fraction=p.fraction)
            except MergeOutputExists as e:
                adopted = await self._adopt_existing(row, dtype)
                if adopted is None:
                    raise FailedPrecondition(f"trainer {address} refused the merge: {e}") from None
                yield _done(adopted)
                return
            except WorkerUnavailable as e:
                raise Unavailable(f"trainer {address} did not finish the merge: {e}") from None
            except WorkerRejected as e:
                raise FailedPrecondition(f"trainer {address} refused the merge: {e}") from None
            except WorkerError as e:
                raise RuntimeError(f"merge on trainer {address} failed: {e}") from None
            raise RuntimeError(f"trainer {address} ended the merge of job {job_id} without a result")

    async def merged_chunks(self, job_id: str, dtype: str = "") -> AsyncIterator[common_pb2.FileChunk]:
        """The job's newest merge in its base model's dtype, else its newest in any ("" dtype), or its
        current adapter's merge in `dtype`."""
        asked = merge_dtype(dtype) if dtype else None
        row = await self._row(job_id)
        artifact = await self._current_merge(row, any_version=asked is None, dtype=asked or "auto")
        if artifact is None:
            what = f"no merged model in {asked}" if asked else "no merged model"
            raise FailedPrecondition(f"job {job_id} has {what} yet; run MergeModel first"
                                     + (f" with dtype {asked!r}" if asked else ""))
        if not self._local(Path(artifact.path)):  # merged on the worker that holds the job's folders
            async for chunk in self._remote(row, artifact.path, 2, None, "merged model"):
                yield chunk
            return
        try:
            chunks = await asyncio.to_thread(directory_chunks, artifact.path)
        except FileNotFoundError as e:  # removed since the check above
            raise FailedPrecondition(f"the merged model of job {job_id} is gone from disk ({e}); "
                                     "run MergeModel again") from None
        async for chunk in _in_thread(chunks):
            yield chunk

    def _workers(self) -> MergeWorkers:
        return cast(MergeWorkers, self.jobs.workers)  # the manager's Workers: GrpcWorkers also merges

    async def _pick_worker(self) -> str:
        """An idle reachable trainer if there is one (a merge loads the whole base model), else
        any reachable one (the merge runs beside its job, in a process of its own)."""
        workers = self._workers()
        states = [await workers.status(a) for a in workers.addresses]
        reachable = [s for s in states if s is not None]
        if not reachable:
            raise Unavailable(f"no trainer worker is reachable ({', '.join(workers.addresses)}) to run the merge")
        idle = [s for s in reachable if not s.busy]
        return (idle or reachable)[0].address

    async def _holding_worker(self, row: JobRow) -> str:
        """The worker that holds the job's adapter (not on this disk), for its merge: it must be reachable."""
        address = self._holder(row)
        if address is None or await self._workers().status(address) is None:
            raise Unavailable(f"trainer {holder_of(row.worker) or 'none recorded'}, which holds the adapter of job "
                              f"{row.id}, cannot be reached to run the merge")
        return address

    async def _current_merge(self, row: JobRow, any_version: bool = False, dtype: str = "auto"
                             ) -> ArtifactRow | None:
        """The newest recorded merge of the job's current adapter in `dtype` (of any adapter and
        dtype when `any_version`) whose folder still exists: on this disk, or (not here) on the worker that
        holds the job's folders, whose record is taken as it is (DownloadMergedModel says when that
        worker no longer has it)."""
        rows = await asyncio.to_thread(self.jobs.store.artifacts, row.id, "merged")
        usable = [a for a in reversed(rows) if self._local(Path(a.path)) or self._holder(row) is not None
                  or self.store is not None]
        if any_version:  # the base model's dtype first (what a merge without a dtype makes), else any
            own = [a for a in usable if not Path(a.path).name.endswith(tuple(f"-{d}" for d in MERGE_DTYPES))]
            return own[0] if own else usable[0] if usable else None
        return next((a for a in usable if Path(a.path).name == merged_name(row, dtype)), None)

    async def _record(self, row: JobRow, path: str, size_bytes: int) -> ArtifactRow:
        artifact = ArtifactRow(job_id=row.id, kind="merged", path=path, size_bytes=size_bytes)
        return await asyncio.to_thread(self.jobs.store.add_artifact, artifact)

    async def _adopt_existing(self, row: JobRow, dtype: str = "auto") -> ArtifactRow | None:
        """The trainer refuses to overwrite a merged folder; one left by a merge whose end the
        scheduler never recorded (a restart) is complete (the trainer renames it into place) and
        is recorded now."""
        folder = self.root / "merged" / merged_name(row, dtype)
        if not (folder / "config.json").is_file():
            return None
        size = await asyncio.to_thread(directory_size, folder)
        return await self._record(row, str(folder.resolve()), size)


def _done(artifact: ArtifactRow) -> scheduler_pb2.MergeModelProgress:
    return scheduler_pb2.MergeModelProgress(stage="done", fraction=1.0, done=True, path=artifact.path,
                                            size_bytes=artifact.size_bytes)

