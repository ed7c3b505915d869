"""Reading each experiment tracker's own files back with its own library (tests/test_tracking*.py).

TensorBoard's event files with its EventAccumulator; an MLflow store with MlflowClient; a W&B
offline run's `.wandb` file (the LevelDB log format wandb writes: a 7-byte file header, then 32 KiB
blocks of records of 7-byte headers, each record one `wandb_internal_pb2.Record`) parsed with
wandb's own protobuf; trackio's local store with its SQLiteStorage.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # checksum (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every scalar in `folder`'s event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tensorboard_texts(folder: Path) -> dict[str, dict[int, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[str, dict[int, str]] = {}
    for tag in acc.Tags()["tensors"]:
        out[tag.removesuffix("/text_summary")] = {e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)}
    return out


def mlflow_run(uri: str, experiment: str, run_name: str) -> tuple[Any, Any]:
    """(client, run) of the one run named `run_name` in `experiment`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} at {uri}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def mlflow_series(client: Any, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def wandb_records(path: Path) -> list[Any]:
    """Every Record of a `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1 and version == 0, (ident, magic, version)
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left  # the block's tail is padding
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        elif kind == LAST:
            pending += chunk
        else:
            break  # zeros past the last record
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        records.append(record)
        pending = b""
    return records


def wandb_run(run_dir: Path) -> dict[str, Any]:
    """history {key: {step: value}}, summary {key: value}, config {key: value} of an offline run."""
    (path,) = run_dir.glob("run-*.wandb")
    history: dict[str, dict[int, Any]] = {}
    summary: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            step = record.history.step.num if record.history.HasField("step") else items.get("_step")
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, {})[int(step)] = value
        elif kind == "summary":
            for i in record.summary.update:
                summary[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
        elif kind == "config":
            for i in record.config.update:
                config[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
        elif kind == "run":
            for i in record.run.config.update:
                config[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return {"history": history, "summary": summary, "config": config}


def trackio_logs(folder: Path, project: str, run: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(rows, config) of a trackio run in the store at `folder`."""
    from rlvr.tracking.trackio_tracker import store_at

    with store_at(folder) as storage:
        return storage.get_logs(project, run), storage.get_run_config(project, run)
