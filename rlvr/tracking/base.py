"""The interface every tracker module implements, and the RunInfo a run is named from
(`rlvr.tracking.open.open_tracker` picks the module).

A tracker is opened for one job's run and fed in order: the spec as config once, then each stored
step (`log_step`, step order, each step once), a sample of completions where there is one, the
final tiles (`log_summary`) and `close`. Every call may raise (a tracker down, a folder not
writable): the scheduler's bridge catches it, says so in the job's events and tries again later;
a tracker never sees a step twice from one bridge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.tracking import config as tc
from rlvr.v1 import common_pb2


@dataclass(frozen=True)
class RunInfo:
    """What a tracker names its run after."""

    job_id: str
    job_name: str
    project: str
    run_name: str
    config: Mapping[str, Any]  # the job spec (values.spec_config)


class Tracker(ABC):
    kind: str = ""
    location: str = ""
    """Where to look: a folder, a run's URL or URI."""

    @abstractmethod
    def log_step(self, step: int, values: Mapping[str, float]) -> None: ...

    def log_samples(self, step: int, rows: Sequence[Mapping[str, object]]) -> None:  # noqa: B027 (optional)
        """A sample of the step's completions (values.SAMPLE_COLUMNS) as a table, where there are tables."""

    @abstractmethod
    def log_summary(self, values: Mapping[str, float], step: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


def run_info(config: common_pb2.TrackerConfig, job_id: str, job_name: str, spec_config: Mapping[str, Any]) -> RunInfo:
    return RunInfo(job_id=job_id, job_name=job_name, project=tc.project(config),
                   run_name=tc.run_name(config, job_name, job_id), config=spec_config)
