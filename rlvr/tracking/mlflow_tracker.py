"""MLflow: one run per job, written with mlflow-skinny's MlflowClient.

The target is a tracking URI: a folder or file:PATH (MLflow's file store, which `mlflow ui
--backend-store-uri PATH` serves) or an MLflow server's http(s):// address. The run is in the
experiment named by the tracker's `project` (created when missing) and named after the job; its
tags say the job (`rlvr.job_id`). Each step's numbers are metrics at that step (one log_batch per
step), the spec is the run's params (flattened, "grpo.learning_rate") and the artifact
`spec.json`, the final tiles are metrics `summary/<tile>`, and a step's completions a table
artifact (`completions/step_00001.json`, MLflow's log_table; completions_artifact). The run is
FINISHED at the end.

A server that does not answer fails fast: MLflow's HTTP retries and timeout are bounded here
(MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT), and the file store is allowed
(MLFLOW_ALLOW_FILE_STORE); the environment's own values win.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlvr.tracking.base import RunInfo, Tracker
from rlvr.tracking.config import is_url
from rlvr.tracking.values import SUMMARY_PREFIX, flat_params

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
# MLflow 3 keeps its file store (a folder, no database) behind this switch; rlvr's default MLflow
# target is such a folder under the artifact root, which needs no server and no database.
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param's value


def completions_artifact(step: int) -> str:
    """The artifact a step's completions table is logged as: the step zero-padded to five digits,
    as MLflow lists a run's artifacts by name (step_00002 before step_00010, not after)."""
    return f"completions/step_{step:05d}.json"


def tracking_uri(target: str) -> str:
    """A folder as a file: URI (MLflow wants an absolute one); a URI as given."""
    return target if is_url(target) or target.startswith("file:") else Path(target).resolve().as_uri()


class MlflowTracker(Tracker):
    kind = "mlflow"

    def __init__(self, target: str, run: RunInfo) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(target)
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(run.project)
        experiment_id = experiment.experiment_id if experiment is not None else \
            self.client.create_experiment(run.project)
        created = self.client.create_run(experiment_id, run_name=run.run_name,
                                         tags={"rlvr.job_id": run.job_id, "rlvr.job_name": run.job_name})
        self.run_id = created.info.run_id
        self.experiment_id = experiment_id
        base = self.uri.rstrip("/")
        self.location = (f"{base}/#/experiments/{experiment_id}/runs/{self.run_id}" if base.startswith("http")
                         else f"{base}/{experiment_id}/{self.run_id}")
        params = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in sorted(flat_params(run.config).items())]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params a call
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", f"rlvr job {run.job_id}")])
        self.client.log_dict(self.run_id, dict(run.config), "spec.json")

    def _metrics(self, values: Mapping[str, float], step: int, prefix: str = "") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(prefix + k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        self._metrics(values, step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:
        if rows:
            columns = list(rows[0])
            self.client.log_table(self.run_id, data={c: [r.get(c) for r in rows] for c in columns},
                                  artifact_file=completions_artifact(step))

    def log_summary(self, values: Mapping[str, float], step: int) -> None:
        self._metrics(values, step, SUMMARY_PREFIX)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
