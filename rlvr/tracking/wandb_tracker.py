"""Weights & Biases: one run per job, offline by default (the run stays in its folder).

The target is the run's `dir`: wandb writes `<dir>/wandb/offline-run-<time>-<id>/` (with `online`,
`run-<time>-<id>/`, synced to the W&B server with WANDB_API_KEY). The run's id is `rlvr-<job id>`
(a second run for the same job gets a suffix), its project the tracker's `project`, its config the
spec. Each step's numbers are logged at that step (`run.log(..., step=step)`), a step's completions
as a `wandb.Table` under `completions`, the final tiles as the run's summary. `wandb sync
<run folder>` uploads an offline run later.

Several jobs' runs are open at once in the scheduler: each is its own `wandb.init(reinit=
"create_new")` run object, never the module's global run.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.tracking.base import RunInfo, Tracker
from rlvr.tracking.values import safe_name


class WandbTracker(Tracker):
    kind = "wandb"

    def __init__(self, target: Path, run: RunInfo, online: bool = False) -> None:
        import wandb

        target.mkdir(parents=True, exist_ok=True)
        self.run: Any = wandb.init(
            dir=str(target), project=run.project, name=run.run_name,
            id=safe_name(f"rlvr-{run.job_id}-{uuid.uuid4().hex[:6]}"), config=dict(run.config),
            mode="online" if online else "offline", reinit="create_new",
            tags=["rlvr"], notes=f"rlvr job {run.job_id}",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True))
        self.location = str(Path(self.run.dir).parent)  # the run folder (its files/ is run.dir)

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        import wandb

        if rows:
            columns: list[str | int] = list(rows[0])
            table = wandb.Table(columns=columns, data=[[r.get(str(c)) for c in columns] for r in rows])
            self.run.log({"completions": table}, step=step)

    def log_summary(self, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self.run.summary[name] = value

    def close(self) -> None:
        self.run.finish()
