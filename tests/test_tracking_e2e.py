"""A real job logged to all four experiment trackers through a real stack: a scheduler and a trainer
service in this process over real gRPC, the trainer's job in its own process, a real embedded NATS
and SQLite (as tests/test_job_actions.py). The job names TensorBoard, MLflow (file store), W&B
(offline) and trackio (local store) in its spec (`rlvr train --track`'s field), and an MLflow
server that is down; the job completes, the down tracker is said in its events, and once it has
ended, each tracker's own files equal the store's series step for step (tests/test_tracking.py's
check), `GetJob` and `rlvr jobs show` say where it is tracked, and `rlvr jobs track ID --to
tensorboard:DIR` mirrors it again after the fact.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import pytest_asyncio
import tracking_readers as read
from test_tracking import check_all_four, f32

from rlvr.clients import cli
from rlvr.clients.sdk import SchedulerClient
from rlvr.infra.store import Store
from rlvr.services.common.server import ServiceRunner
from rlvr.tracking import config as tc
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

MODEL = "rlvr-tiny-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def _spec(home: Path) -> C.JobSpec:
    spec = C.JobSpec(name="tracked", base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, 3
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 128, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.tracking.extend([tc.parse_tracker(f"tensorboard:{home / 'tb'}"),
                          tc.parse_tracker(f"mlflow:{home / 'mlruns'},project=rlvr-tests"),
                          tc.parse_tracker(f"wandb:{home / 'wandb'},project=rlvr-tests"),
                          tc.parse_tracker(f"trackio:{home / 'trackio'},project=rlvr-tests"),
                          # an MLflow server nobody answers: said in the job's events, the job goes on
                          tc.parse_tracker(f"mlflow:http://127.0.0.1:{_free_port()},run=down")])
    return spec


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tracked(nats_server, tmp_path_factory: pytest.TempPathFactory):
    from rlvr.services.scheduler.server import build_service as build_scheduler
    from rlvr.services.scheduler.settings import SchedulerSettings
    from rlvr.services.trainer.server import build_service as build_trainer
    from rlvr.services.trainer.settings import TrainerSettings

    home = tmp_path_factory.mktemp("tracked")
    root = home / "artifacts"
    trainer_settings = TrainerSettings(port=0, artifact_root=root, nats_url=nats_server.url, scorer="local",
                                       torch_threads=1, worker_name="tracking-trainer")
    async with ServiceRunner(build_trainer(trainer_settings), trainer_settings) as trainer:
        settings = SchedulerSettings(port=0, database_url=f"sqlite:///{home / 'db.sqlite'}",
                                     nats_url=nats_server.url, artifact_root=root,
                                     trainer_addresses=[trainer.address], tracking_roots=[home])
        async with ServiceRunner(build_scheduler(settings), settings) as scheduler:
            client = SchedulerClient(scheduler.address)
            store = Store(settings.database_url)
            created = await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=_spec(home)))
            job_id = created.job.id
            events = await asyncio.to_thread(lambda: list(client.watch(job_id, timeout=240)))
            for _ in range(600):  # the bridge closes the runs just after the job's end is stored
                job = await asyncio.to_thread(client.get_job, S.GetJobRequest(id=job_id))
                if all(link.finished or link.error for link in job.tracking):
                    break
                await asyncio.sleep(0.1)
            assert job.status == C.JOB_STATUS_COMPLETED, job.error
            said = [e.status.message for e in events if e.HasField("status")]
            yield home, scheduler.address, store, job, said
            client.close()
            store.close()


async def test_a_job_logged_to_all_four_trackers_reads_back_equal_to_the_store(tracked) -> None:
    home, _, store, job, _ = tracked
    assert [link.kind for link in job.tracking] == [c.kind for c in job.spec.tracking]
    assert all(link.finished for link in job.tracking[:4]), job.tracking
    assert len(store.metric_points(job.id)) == job.current_step == 3
    check_all_four(store, job.id, f"tracked-{job.id}", home, list(job.tracking[:4]))


async def test_a_tracker_that_is_down_leaves_the_job_alone_and_is_said_in_its_events(tracked) -> None:
    _, _, _, job, said = tracked
    assert job.status == C.JOB_STATUS_COMPLETED and job.current_step == 3
    down = job.tracking[4]
    assert down.error and not down.finished and down.steps_logged == 0
    assert any(m.startswith("not logged to the mlflow tracker (http://127.0.0.1:") and "the job goes on" in m
               for m in said), said


async def test_jobs_show_says_where_and_jobs_track_mirrors_after_the_fact(tracked, capsys) -> None:
    home, address, store, job, _ = tracked
    code = await asyncio.to_thread(cli.main, ["jobs", "show", job.id, "--address", address])
    out = capsys.readouterr().out
    assert code == 0
    assert f"Tracked in tensorboard: {home / 'tb' / f'tracked-{job.id}'} (3 step(s) logged, finished)" in out
    assert "Tracked in mlflow: http://127.0.0.1:" in out and "(not logging: " in out
    assert "Tracked in mlflow: " in out and "Tracked in wandb: " in out and "Tracked in trackio: " in out

    later = home / "later"
    code = await asyncio.to_thread(cli.main, ["jobs", "track", job.id, "--to", f"tensorboard:{later},run=again",
                                              "--address", address])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"tensorboard: 3 step(s) of job {job.id} logged to {later / 'again'}" in out
    stored = {p.step: p.reward_mean for p in store.metric_points(job.id)}
    assert read.tensorboard_scalars(later / "again")["reward_mean"] == {s: f32(v) for s, v in stored.items()}

    code = await asyncio.to_thread(cli.main, ["jobs", "track", job.id, "--to", "tensorboard:/proc/nope",
                                              "--address", address])
    err = capsys.readouterr().err
    assert code == 1 and "outside the scheduler's tracking roots" in err


async def test_each_step_s_completions_are_a_table_in_each_tracker(tracked) -> None:
    """The trainer publishes a few completions per step (CompletionSamples); the bridge reads them
    off the stream and every tracker gets them as a table at that step."""
    import json

    home, _, _, job, _ = tracked
    run = f"tracked-{job.id}"
    texts = read.tensorboard_texts(Path(job.tracking[0].location))["completions"]
    assert sorted(texts) == [1, 2, 3] and all("| step | prompt | completion | reward | accuracy |" in t
                                              for t in texts.values())
    client, mrun = read.mlflow_run((home / "mlruns").as_uri(), "rlvr-tests", run)
    files = [f.path for f in client.list_artifacts(mrun.info.run_id, "completions")]
    assert files == [f"completions/step_0000{s}.json" for s in (1, 2, 3)]
    table = json.loads(Path(client.download_artifacts(mrun.info.run_id, files[0], str(home / "dl"))).read_text())
    assert table["columns"] == ["step", "prompt", "completion", "reward", "accuracy"]
    assert 1 <= len(table["data"]) <= 4 and all(row[0] == 1 and row[1] for row in table["data"])
    wb = read.wandb_run(Path(job.tracking[2].location))
    assert wb["history"]["completions/_type"] == {1: "table-file", 2: "table-file", 3: "table-file"}
    rows, _ = read.trackio_logs(home / "trackio", "rlvr-tests", run)
    assert sorted(r["step"] for r in rows if "completions" in r) == [1, 2, 3]
