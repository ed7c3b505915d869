"""The `tracking` field of a JobSpec (and of TrackJobRequest): which trackers, each one's settings.

`validate_tracking` is what rlvr/jobspec/'s validation calls: it checks the trackers only as
values (kinds, names, URIs); the scheduler checks that a local target lies under its
`tracking_roots` (services/scheduler/tracking.py), since only it knows them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlvr.common.errors import InvalidArgument, shown
from rlvr.v1 import common_pb2

MAX_TRACKERS = 8
MAX_TARGET_CHARS = 1024
DEFAULT_PROJECT = "rlvr"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ %-]{0,127}$")
URL_RE = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)

KINDS: dict[str, common_pb2.TrackerKind] = {
    "tensorboard": common_pb2.TRACKER_KIND_TENSORBOARD,
    "mlflow": common_pb2.TRACKER_KIND_MLFLOW,
    "wandb": common_pb2.TRACKER_KIND_WANDB,
    "trackio": common_pb2.TRACKER_KIND_TRACKIO,
}
"""The kinds by the name the CLI and the docs use (`--track KIND:TARGET`)."""
MLFLOW_SCHEMES = ("file", "http", "https")


def kind_name(kind: int) -> str:
    """"tensorboard", "mlflow", "wandb" or "trackio" (the CLI's spelling)."""
    names: dict[int, str] = {int(v): k for k, v in KINDS.items()}
    return names.get(kind, f"kind {kind}")


def is_url(target: str) -> bool:
    return bool(URL_RE.match(target))


def parse_tracker(text: str) -> common_pb2.TrackerConfig:
    """`KIND:TARGET` (the CLI's `--track`, `rlvr jobs track --to`) as a TrackerConfig; `KIND` alone
    for MLflow's default target. Optional `,project=P`, `,run=NAME` and `,online` follow the target."""
    kind, _, rest = text.strip().partition(":")
    if kind.strip().lower() not in KINDS:
        raise ValueError(f"{text!r}: the tracker must be one of {', '.join(KINDS)} (KIND:TARGET)")
    target, *options = rest.split(",") if rest else ("",)
    config = common_pb2.TrackerConfig(kind=KINDS[kind.strip().lower()], target=target.strip())
    for option in options:
        key, eq, value = option.partition("=")
        key = key.strip()
        if key == "online" and not eq:
            config.online = True
        elif key == "project" and eq:
            config.project = value.strip()
        elif key == "run" and eq:
            config.run_name = value.strip()
        else:
            raise ValueError(f"{text!r}: unknown option {option!r}; allowed: project=NAME, run=NAME, online")
    return config


def validate_tracker(config: common_pb2.TrackerConfig, field: str) -> None:
    """InvalidArgument naming `field` (e.g. "tracking[0]") for a tracker that cannot be opened."""
    if config.kind not in KINDS.values():
        raise InvalidArgument(f"{field}.kind: {config.kind} is not a tracker; allowed: "
                              + ", ".join(common_pb2.TrackerKind.Name(v) for v in KINDS.values()))
    name = kind_name(config.kind)
    target = config.target
    if len(target) > MAX_TARGET_CHARS:
        raise InvalidArgument(f"{field}.target: {len(target)} characters; at most {MAX_TARGET_CHARS}")
    if any(c in target for c in "\0\n\r"):
        raise InvalidArgument(f"{field}.target: {shown(target)} holds a control character")
    if config.kind == common_pb2.TRACKER_KIND_MLFLOW:
        if is_url(target) and target.split(":", 1)[0].lower() not in MLFLOW_SCHEMES:
            raise InvalidArgument(f"{field}.target: {shown(target)} is not an MLflow tracking URI this "
                                  f"scheduler writes to; use a folder, file:PATH, http:// or https://")
    elif not target:
        raise InvalidArgument(f"{field}.target: {name} needs a folder (--track {name}:DIR)")
    elif is_url(target):
        raise InvalidArgument(f"{field}.target: {shown(target)} is a URL; {name} writes to a folder")
    for sub, value in (("project", config.project), ("run_name", config.run_name)):
        if value and not NAME_RE.match(value):
            raise InvalidArgument(f"{field}.{sub}: {shown(value)} is not allowed; use 1-128 letters, digits, "
                                  "spaces and . _ - %, starting with a letter or digit")
    if config.online and config.kind != common_pb2.TRACKER_KIND_WANDB:
        raise InvalidArgument(f"{field}.online: only a wandb tracker syncs online; {name} has no such mode")


def validate_trackers(configs: Sequence[common_pb2.TrackerConfig], field: str = "tracking") -> None:
    if len(configs) > MAX_TRACKERS:
        raise InvalidArgument(f"{field}: {len(configs)} trackers; at most {MAX_TRACKERS}")
    seen: set[tuple[int, str, str, str]] = set()
    for i, config in enumerate(configs):
        validate_tracker(config, f"{field}[{i}]")
        key = (config.kind, config.target, config.project, config.run_name)
        if key in seen:
            raise InvalidArgument(f"{field}[{i}]: the same {kind_name(config.kind)} tracker twice")
        seen.add(key)


def validate_tracking(spec: common_pb2.JobSpec) -> None:
    """The JobSpec's `tracking` (rlvr/jobspec/'s validation calls this)."""
    validate_trackers(spec.tracking)


def run_name(config: common_pb2.TrackerConfig, job_name: str, job_id: str) -> str:
    """The run's name: the tracker's own, else "<job name>-<job id>"."""
    return config.run_name or f"{job_name or 'job'}-{job_id}"


def project(config: common_pb2.TrackerConfig) -> str:
    return config.project or DEFAULT_PROJECT
