"""`open_tracker`: the tracker module a TrackerConfig names, opened for one run."""

from __future__ import annotations

from pathlib import Path

from rlvr.tracking.base import RunInfo, Tracker
from rlvr.v1 import common_pb2


def open_tracker(config: common_pb2.TrackerConfig, run: RunInfo, default_mlflow_uri: Path | None = None) -> Tracker:
    """The tracker `config` names, opened for `run` (its run created, the config logged)."""
    if config.kind == common_pb2.TRACKER_KIND_TENSORBOARD:
        from rlvr.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(Path(config.target), run)
    if config.kind == common_pb2.TRACKER_KIND_MLFLOW:
        from rlvr.tracking.mlflow_tracker import MlflowTracker

        uri = config.target or (default_mlflow_uri.as_uri() if default_mlflow_uri is not None else "")
        return MlflowTracker(uri, run)
    if config.kind == common_pb2.TRACKER_KIND_WANDB:
        from rlvr.tracking.wandb_tracker import WandbTracker

        return WandbTracker(Path(config.target), run, online=config.online)
    if config.kind == common_pb2.TRACKER_KIND_TRACKIO:
        from rlvr.tracking.trackio_tracker import TrackioTracker

        return TrackioTracker(Path(config.target), run)
    raise ValueError(f"not a tracker kind: {config.kind}")
