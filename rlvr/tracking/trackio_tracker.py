"""trackio: one run per job in trackio's local store (a SQLite file per project under the target).

The target is a trackio store folder (what TRACKIO_DIR names; `TRACKIO_DIR=<target> trackio show`
opens its dashboard). The run is named after the job, in the tracker's `project`; its config is
the spec (with `rlvr.job_id`), each step's numbers are one row at that step, and the final tiles
one last row at the last step under `summary/<tile>`. A step's completions are a `trackio.Table`
under `completions`.

trackio keeps its store folder in one module global (read from TRACKIO_DIR at import), and its
`trackio.init` keeps one current run per process; the scheduler has many jobs' runs open at once,
each in its own folder. So this writes through trackio's storage layer (`SQLiteStorage.bulk_log`,
what `trackio.init`'s run calls for a local project) with that global set to the run's folder
for the call, under one lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.tracking.base import RunInfo, Tracker
from rlvr.tracking.values import SUMMARY_PREFIX

_LOCK = threading.Lock()


@contextlib.contextmanager
def store_at(folder: Path) -> Iterator[Any]:
    """trackio's SQLiteStorage, writing to (and reading from) `folder` for the block."""
    from trackio import sqlite_storage

    with _LOCK:
        saved = sqlite_storage.TRACKIO_DIR
        sqlite_storage.TRACKIO_DIR = folder
        try:
            yield sqlite_storage.SQLiteStorage
        finally:
            sqlite_storage.TRACKIO_DIR = saved


class TrackioTracker(Tracker):
    kind = "trackio"

    def __init__(self, target: Path, run: RunInfo) -> None:
        target.mkdir(parents=True, exist_ok=True)
        self.folder = target
        self.project = run.project
        self.run_name = run.run_name
        self.config: dict[str, Any] | None = {**run.config, "rlvr.job_id": run.job_id}
        with store_at(self.folder) as storage:
            storage.validate_project_name(self.project)
            storage.init_db(self.project)
        self.location = f"{target} (project {self.project}, run {self.run_name})"

    def _log(self, rows: list[dict[str, Any]], steps: list[int]) -> None:
        with store_at(self.folder) as storage:
            storage.bulk_log(self.project, self.run_name, rows, steps=steps, config=self.config)
        self.config = None  # stored with the first row

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        self._log([dict(values)], [step])

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        import pandas as pd
        from trackio.table import Table

        if rows:
            table = Table(dataframe=pd.DataFrame([dict(r) for r in rows]))
            self._log([{"completions": table._to_dict(project=self.project, run=self.run_name, step=step)}], [step])

    def log_summary(self, values: Mapping[str, float], step: int) -> None:
        self._log([{SUMMARY_PREFIX + k: v for k, v in values.items()}], [step])

    def close(self) -> None:
        pass  # every call is committed; nothing stays open
