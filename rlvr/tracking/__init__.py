"""Experiment trackers a job's metrics are mirrored into (docs/tracking.md).

One small module per tracker, each driving the tracker's own library: `tensorboard_tracker`
(tensorboardX's SummaryWriter), `mlflow_tracker` (mlflow-skinny's MlflowClient), `wandb_tracker`
(a wandb run, offline by default), `trackio_tracker` (trackio's local store). `config` checks a
job's `tracking` field; `values` turns a MetricEvent and a job's tiles into the names every tracker
logs; `open.open_tracker` opens the right one. Nothing here knows the store or the bus: the
scheduler's bridge (services/scheduler/tracking.py) reads the stored steps and calls these.

The libraries are imported only when a tracker of their kind is opened.
"""
