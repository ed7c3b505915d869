"""TensorBoard: event files written with tensorboardX's SummaryWriter into `<log dir>/<run name>`.

Each step's numbers are scalars under their names (`reward_mean`, `reward_components/gsm8k`, ...)
at the step; the spec is a text (`config`, JSON); the final tiles are
scalars under `summary/` at the last step; a step's completions are a markdown table (`completions`),
which TensorBoard's text tab draws as a table. `tensorboard --logdir <log dir>` shows every job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlvr.tracking.base import RunInfo, Tracker
from rlvr.tracking.values import SUMMARY_PREFIX, safe_name


def markdown_table(rows: Sequence[Mapping[str, object]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    kind = "tensorboard"

    def __init__(self, log_dir: Path, run: RunInfo) -> None:
        from tensorboardX import SummaryWriter

        folder = log_dir / safe_name(run.run_name)
        folder.mkdir(parents=True, exist_ok=True)
        self.location = str(folder)
        self.writer = SummaryWriter(logdir=str(folder), flush_secs=5)
        self.writer.add_text("config", "```json\n" + json.dumps(run.config, indent=2) + "\n```", 0)
        self.writer.add_text("job", f"rlvr job {run.job_id} ({run.job_name})", 0)
        self.writer.flush()

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        if rows:
            self.writer.add_text("completions", markdown_table(rows), step)
            self.writer.flush()

    def log_summary(self, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(SUMMARY_PREFIX + name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
