"""The experiment trackers (rlvr/tracking) and the scheduler's bridge, against the real libraries,
offline: a job stored in a real SQLite store is mirrored into TensorBoard, MLflow (file store),
W&B (offline) and trackio (local store), and each tracker's own files, read back with its own
library (tests/tracking_readers.py), equal the stored series step for step. A tracker that is
down (an MLflow server nobody answers) is recorded in the job's link and said in its events, and
the other trackers and the job go on. No stack: the bridge runs over the store directly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from pathlib import Path

import pytest
import tracking_readers as read

from rlvr.common.errors import InvalidArgument
from rlvr.infra.schema import JobRow, metric_point_from_event
from rlvr.infra.store import Store
from rlvr.jobspec import resolve_spec
from rlvr.services.scheduler.convert import job_to_proto, spec_to_json
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.tracking import TrackingBridge
from rlvr.tracking import config as tc
from rlvr.tracking.values import STEP_FIELDS, step_values
from rlvr.v1 import common_pb2 as C

STEPS = 5


def f32(x: float) -> float:
    """TensorBoard keeps a scalar as a 32-bit float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _event(step: int) -> C.MetricEvent:
    e = C.MetricEvent(step=step, total_steps=STEPS, reward_mean=0.1 * step + 1 / 3, reward_std=0.01 * step,
                      accuracy=step / 7, format=0.5, loss=0.2 - step / 30, completion_length_mean=20.5 + step,
                      completion_length_max=30 + step, clipped_ratio=0.125, learning_rate=1e-5,
                      adapter_version=step - 1, generate_seconds=1.25, score_seconds=0.01 * step,
                      train_seconds=2.5, sync_seconds=0.3, step_seconds=4.0 + step, policy_lag=step % 2,
                      reward_errors=step // 3, logprob_gap=0.01 * step, logprob_gap_max=0.1 * step,
                      sampler_correction="precision" if step % 2 else "",
                      # a job with an environment's episode metrics: series like any other number
                      turns_mean=1.5 + step / 10, turns_max=3, tool_calls=2 * step, tool_errors=step // 4,
                      tool_seconds=0.05 * step, observation_tokens_mean=12.5, episode_tokens_mean=40.25 + step,
                      truncated_episodes=step % 2, failed_episodes=step // 5, episode_splits=step % 3,
                      clip_fraction=0.02 * step, groups_with_signal=step % 4)
    if step % 2 == 0:
        e.heldout_accuracy = step / 11  # evaluation while training: at the steps it ran
        e.heldout_loss = 2.0 - step / 13  # (a Supervised (SFT) job's; any number is mirrored alike)
        e.heldout_f1 = step / 12  # (a Head job's, with each class's F1)
        e.class_f1["correct"], e.class_f1["wrong"] = step / 12, 1 - step / 12
    e.token_accuracy, e.tokens_per_second = step / 9, 1000.0 + step
    e.reward_components["math_pairs"] = step / 7
    e.reward_components["length.short"] = 1 - step / 9
    if step % 2:
        e.entropy = 0.7 / step  # a field some steps lack
    e.kl = 0.001 * step
    return e


class FakeWorkers:
    addresses: list[str] = []


class Bus:
    """Records what the bridge publishes (the job's events)."""

    def __init__(self) -> None:
        self.events: list[C.JobStatusEvent] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.events.append(C.JobStatusEvent.FromString(payload))

    async def last_message(self, subject: str) -> bytes | None:
        return None  # no completions samples on this stream


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(tmp_path: Path):
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.create_all()
    yield s
    s.close()


def _job(store: Store, status: str, steps: int = STEPS, tracking: list[C.TrackerConfig] | None = None) -> JobRow:
    spec = C.JobSpec(name="track-test")
    spec.grpo.max_steps = STEPS
    spec.tracking.extend(tracking or [])
    resolved = resolve_spec(spec)
    row = store.add_job(JobRow(name=resolved.spec.name, spec_json=spec_to_json(resolved.spec), status=status,
                               total_steps=STEPS))
    _add_points(store, row.id, range(1, steps + 1))
    return row


def _add_points(store: Store, job_id: str, steps: range) -> None:
    for step in steps:
        e = _event(step)
        e.job_id = job_id
        store.add_metric_point(metric_point_from_event(e))


def _stored(store: Store, job_id: str) -> dict[str, dict[int, float]]:
    """The stored series by the trackers' names: name -> {step: value}."""
    from rlvr.services.scheduler.convert import metric_event_from_row

    out: dict[str, dict[int, float]] = {}
    for p in store.metric_points(job_id):
        for name, value in step_values(metric_event_from_row(p, job_id)).items():
            out.setdefault(name, {})[p.step] = value
    return out


def _bridge(store: Store, tmp_path: Path, bus: Bus | None = None) -> TrackingBridge:
    jobs = JobManager(store, None, FakeWorkers())  # type: ignore[arg-type]  # never dispatches here
    return TrackingBridge(jobs, bus, [tmp_path], tmp_path / "mlruns")  # type: ignore[arg-type]


def _four(tmp_path: Path) -> list[C.TrackerConfig]:
    return [tc.parse_tracker(f"tensorboard:{tmp_path / 'tb'}"),
            tc.parse_tracker(f"mlflow:{tmp_path / 'mlruns'},project=rlvr-tests"),
            tc.parse_tracker(f"wandb:{tmp_path / 'wandb'},project=rlvr-tests"),
            tc.parse_tracker(f"trackio:{tmp_path / 'trackio'},project=rlvr-tests")]


def check_all_four(store: Store, job_id: str, run: str, tmp_path: Path, links: list[C.TrackingLink]) -> None:
    """Each of the four trackers' own files equal the stored series, step for step, name for name."""
    stored = _stored(store, job_id)
    row = store.get_job(job_id)
    spec = json.loads(row.spec_json)  # the resolved spec, as the trackers' config
    steps = sorted({s for series in stored.values() for s in series})
    assert {"reward_mean", "loss", "policy_lag", "step_seconds", "adapter_version"} <= set(stored)
    assert any(name.startswith("reward_components/") for name in stored)
    assert [link.error for link in links] == [""] * 4
    assert [link.steps_logged for link in links] == [steps[-1]] * 4

    tb = read.tensorboard_scalars(Path(links[0].location))
    assert Path(links[0].location) == tmp_path / "tb" / run
    for name, series in stored.items():
        assert tb[name] == {s: f32(v) for s, v in series.items()}, name
    assert tb["summary/final_reward"] == {steps[-1]: f32(stored["reward_mean"][steps[-1]])}
    assert json.loads(read.tensorboard_texts(Path(links[0].location))["config"][0].strip("`json\n"))[
        "name"] == row.name

    client, mrun = read.mlflow_run((tmp_path / "mlruns").as_uri(), "rlvr-tests", run)
    assert mrun.info.status == "FINISHED" and mrun.data.tags["rlvr.job_id"] == job_id
    assert links[1].location.endswith(mrun.info.run_id)
    for name, series in stored.items():
        assert read.mlflow_series(client, mrun.info.run_id, name) == series, name
    assert mrun.data.metrics["summary/best_reward"] == max(stored["reward_mean"].values())
    assert mrun.data.params["grpo.max_steps"] == str(spec["grpo"]["max_steps"])
    assert mrun.data.params["name"] == row.name

    wb = read.wandb_run(Path(links[2].location))
    for name, series in stored.items():
        assert wb["history"][name] == series, name
    assert wb["summary"]["final_loss"] == stored["loss"][steps[-1]]
    assert wb["summary"]["steps"] == steps[-1]
    assert wb["config"]["grpo"]["max_steps"] == spec["grpo"]["max_steps"]

    rows, config = read.trackio_logs(tmp_path / "trackio", "rlvr-tests", run)
    by_step: dict[str, dict[int, float]] = {}
    for row in rows:
        for name, value in row.items():
            if name not in ("step", "timestamp", "completions") and not name.startswith("summary/"):
                by_step.setdefault(name, {})[row["step"]] = value
    assert by_step == stored
    assert any(row.get("summary/best_accuracy") == max(stored["accuracy"].values()) for row in rows)
    assert config is not None and config["rlvr.job_id"] == job_id and config["grpo"]["max_steps"] == spec["grpo"]["max_steps"]


async def test_a_finished_job_is_mirrored_into_all_four_trackers_equal_to_the_store(store, tmp_path, monkeypatch):
    from rlvr.services.scheduler import tracking

    # TrackJob answers after CATCH_UP_S whatever its trackers took: on a loaded 2-core host wandb's and
    # trackio's first import alone has taken longer (a run answered steps_logged 0 for both), and this
    # test is about what they write, so it waits for all of it.
    monkeypatch.setattr(tracking, "CATCH_UP_S", 120.0)
    row = _job(store, "COMPLETED")
    bridge = _bridge(store, tmp_path)
    try:
        links = await bridge.track(row.id, _four(tmp_path))
    finally:
        await bridge.stop()
    stored = _stored(store, row.id)
    assert "entropy" in stored and len(stored["entropy"]) < STEPS  # a series some steps lack: left out there
    check_all_four(store, row.id, f"track-test-{row.id}", tmp_path, links)
    assert set(STEP_FIELDS) <= set(_stored(store, row.id))  # every number of the MetricEvent is a series


async def test_a_running_job_is_followed_step_by_step_and_closed_at_its_end(store, tmp_path):
    tb = tc.parse_tracker(f"tensorboard:{tmp_path / 'tb'}")
    row = _job(store, "RUNNING", steps=0, tracking=[tb])
    bridge = _bridge(store, tmp_path)
    await bridge.start()  # the scan takes up the spec's trackers of a running job
    try:
        _add_points(store, row.id, range(1, 3))
        await bridge.jobs.notify()
        for _ in range(100):
            (link,) = bridge.links(job_to_proto(store.get_job(row.id)))
            if link.steps_logged == 2:
                break
            await asyncio.sleep(0.05)
        assert link.steps_logged == 2 and link.error == ""
        _add_points(store, row.id, range(3, STEPS + 1))
        store.update_job(row.id, status="COMPLETED")
        await bridge.jobs.notify()
        for _ in range(100):
            if row.id not in bridge._tasks:
                break
            await asyncio.sleep(0.05)
    finally:
        await bridge.stop()
    (link,) = bridge.links(job_to_proto(store.get_job(row.id)))
    assert link.steps_logged == STEPS
    scalars = read.tensorboard_scalars(Path(link.location))
    assert scalars["loss"] == {s: f32(v) for s, v in _stored(store, row.id)["loss"].items()}
    assert "summary/final_loss" in scalars


async def test_a_tracker_that_is_down_is_said_and_never_holds_the_others(store, tmp_path):
    down = tc.parse_tracker(f"mlflow:http://127.0.0.1:{_free_port()}")
    tb = tc.parse_tracker(f"tensorboard:{tmp_path / 'tb'}")
    row = _job(store, "RUNNING", steps=0, tracking=[down, tb])
    _add_points(store, row.id, range(1, 4))
    bus = Bus()
    bridge = _bridge(store, tmp_path, bus)
    try:
        await bridge.job_created(job_to_proto(row))
        for _ in range(400):
            links = bridge.links(job_to_proto(store.get_job(row.id)))
            if links[1].steps_logged == 3 and links[0].error:
                break
            await asyncio.sleep(0.05)
    finally:
        await bridge.stop()
    assert links[0].error and links[0].steps_logged == 0, links[0]
    assert "127.0.0.1" in links[0].location
    assert links[1].error == "" and links[1].steps_logged == 3
    (said,) = bus.events  # once, not once per retry
    assert said.status == C.JOB_STATUS_RUNNING and said.job_id == row.id
    assert "not logged to the mlflow tracker" in said.message and "the job goes on" in said.message
    assert store.get_job(row.id).status == "RUNNING"  # the job is untouched


async def test_track_refuses_targets_outside_the_roots_and_bad_trackers(store, tmp_path):
    row = _job(store, "COMPLETED", steps=0)
    bridge = _bridge(store, tmp_path)
    try:
        with pytest.raises(InvalidArgument, match="outside the scheduler's tracking roots"):
            await bridge.track(row.id, [tc.parse_tracker("tensorboard:/etc/rlvr-tb")])
        with pytest.raises(InvalidArgument, match="not an absolute path"):
            await bridge.track(row.id, [tc.parse_tracker("tensorboard:runs")])
        with pytest.raises(InvalidArgument, match="at least one"):
            await bridge.track(row.id, [])
    finally:
        await bridge.stop()


def test_tracker_configs_parse_and_validate() -> None:
    c = tc.parse_tracker("wandb:/tmp/w,project=p1,run=r1,online")
    assert (c.kind, c.target, c.project, c.run_name, c.online) == (C.TRACKER_KIND_WANDB, "/tmp/w", "p1", "r1", True)
    assert tc.parse_tracker("mlflow").target == ""
    with pytest.raises(ValueError, match="must be one of"):
        tc.parse_tracker("comet:/x")
    with pytest.raises(ValueError, match="unknown option"):
        tc.parse_tracker("tensorboard:/x,colour=red")
    bad = {
        "tensorboard needs a folder": C.TrackerConfig(kind=C.TRACKER_KIND_TENSORBOARD),
        "is a URL": C.TrackerConfig(kind=C.TRACKER_KIND_TRACKIO, target="http://x"),
        "only a wandb tracker syncs online": C.TrackerConfig(kind=C.TRACKER_KIND_TENSORBOARD, target="/x",
                                                             online=True),
        "not an MLflow tracking URI": C.TrackerConfig(kind=C.TRACKER_KIND_MLFLOW, target="databricks://x"),
        "is not a tracker": C.TrackerConfig(kind=9, target="/x"),
        "project: .* is not allowed": C.TrackerConfig(kind=C.TRACKER_KIND_WANDB, target="/x", project="a/b"),
    }
    for message, config in bad.items():
        spec = C.JobSpec()
        spec.tracking.append(config)
        with pytest.raises(InvalidArgument, match=f"tracking\\[0\\].*{message}"):
            resolve_spec(spec)
    spec = C.JobSpec()
    spec.tracking.extend([C.TrackerConfig(kind=C.TRACKER_KIND_TENSORBOARD, target=f"/x{i}") for i in range(9)])
    with pytest.raises(InvalidArgument, match="at most 8"):
        resolve_spec(spec)
    spec.ClearField("tracking")
    spec.tracking.extend([C.TrackerConfig(kind=C.TRACKER_KIND_TENSORBOARD, target="/x")] * 2)
    with pytest.raises(InvalidArgument, match="the same tensorboard tracker twice"):
        resolve_spec(spec)


def test_each_tracker_writes_a_step_s_completions_as_a_table(tmp_path: Path) -> None:
    from rlvr.tracking.base import run_info
    from rlvr.tracking.open import open_tracker

    rows = [{"step": 1, "prompt": "2+2=", "completion": "4 | four\nmore", "reward": 1.0, "accuracy": 1.0},
            {"step": 1, "prompt": "3+3=", "completion": "7", "reward": 0.0, "accuracy": 0.0}]
    opened = {}
    for config in _four(tmp_path):
        tracker = open_tracker(config, run_info(config, "jobsamples1", "samples", {"name": "samples"}))
        tracker.log_step(1, {"reward_mean": 0.5})
        tracker.log_samples(1, rows)
        tracker.log_summary({"steps": 1.0}, 1)
        tracker.close()
        opened[tracker.kind] = tracker

    text = read.tensorboard_texts(Path(opened["tensorboard"].location))["completions"][1]
    assert "| prompt |" in text and "4 \\| four<br>more" in text and "| 3+3= | 7 |" in text

    client, run = read.mlflow_run((tmp_path / "mlruns").as_uri(), "rlvr-tests", "samples-jobsamples1")
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "completions/step_00001.json",
                                                     str(tmp_path / "dl"))).read_text())
    assert table["columns"] == list(rows[0]) and [r[2] for r in table["data"]] == ["4 | four\nmore", "7"]

    wb = read.wandb_run(Path(opened["wandb"].location))
    assert wb["history"]["completions/_type"] == {1: "table-file"} and wb["history"]["completions/nrows"] == {1: 2}
    (table_file,) = (Path(opened["wandb"].location) / "files").glob(f"{wb['history']['completions/path'][1]}")
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(rows[0]) and [r[2] for r in table["data"]] == ["4 | four\nmore", "7"]

    logged, _ = read.trackio_logs(tmp_path / "trackio", "rlvr-tests", "samples-jobsamples1")
    (with_table,) = [r for r in logged if "completions" in r]
    assert with_table["step"] == 1 and with_table["completions"]["_type"] == "trackio.table"


def test_rlvr_train_track_flags_fill_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from rlvr.clients.commands.train import add_train_arguments, spec_from_args

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--track", "tensorboard:runs/tb", "--track", "mlflow:http://mlflow:5000,project=x",
                              "--track", "wandb:~/w,online"])
    spec = spec_from_args(args)
    assert [(t.kind, t.target) for t in spec.tracking] == [
        (C.TRACKER_KIND_TENSORBOARD, str(tmp_path / "runs" / "tb")),  # made absolute here
        (C.TRACKER_KIND_MLFLOW, "http://mlflow:5000"), (C.TRACKER_KIND_WANDB, str(Path("~/w").expanduser()))]
    assert spec.tracking[1].project == "x" and spec.tracking[2].online
    with pytest.raises(SystemExit):
        parser.parse_args(["--track", "neptune:/x"])


async def test_links_of_a_job_this_scheduler_did_not_mirror_come_from_its_spec(store, tmp_path):
    tb = tc.parse_tracker(f"tensorboard:{tmp_path / 'tb'},run=r1")
    row = _job(store, "COMPLETED", tracking=[tb])
    bridge = _bridge(store, tmp_path)
    try:
        (link,) = bridge.links(job_to_proto(row))
        assert (link.location, link.steps_logged, link.finished) == (str(tmp_path / "tb" / "r1"), 0, False)
        await bridge.track(row.id, [tc.parse_tracker(f"tensorboard:{tmp_path / 'again'}")])
        spec_link, added = bridge.links(job_to_proto(row))
    finally:
        await bridge.stop()
    assert spec_link.location == str(tmp_path / "tb" / "r1") and spec_link.steps_logged == 0
    assert added.location == str(tmp_path / "again" / f"track-test-{row.id}") and added.finished
    assert added.steps_logged == STEPS
