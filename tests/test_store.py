"""The store on both databases: a temporary SQLite file and this machine's PostgreSQL (a throwaway
schema per test). The `store` and `store_url` fixtures come from fixtures_infra via conftest.py."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.infra.schema import (
    ArtifactRow,
    EvaluationRow,
    JobRow,
    LoopRow,
    MetricPointRow,
    QuestionResultRow,
    RoundRow,
    metric_point_from_event,
)
from rlvr.infra.store import ConflictError, NotFoundError, Store, StoreError


def _metric(job_id: str, step: int, **values: float) -> MetricPointRow:
    return MetricPointRow(job_id=job_id, step=step, total_steps=10, reward_mean=0.5, **values)


def test_sqlite_is_durable_and_concurrent(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'sub' / 'rlvr.db'}")  # the folder is created
    with store, store.engine.connect() as conn:
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    # synchronous: 2 = FULL. The settings are per connection, so this is a pooled one.
    assert pragma == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1, "busy_timeout": 10000}


def test_jobs_round_trip(store: Store) -> None:
    started = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    job = store.add_job(
        JobRow(name="math", spec_json='{"name": "math"}', worker="w1", total_steps=100, started_at=started)
    )
    got = store.get_job(job.id)
    assert got is not None and got.model_dump() == job.model_dump()
    assert got.started_at == started and got.started_at.tzinfo == UTC  # stored and returned as UTC
    assert got.created_at.tzinfo == UTC
    assert store.get_job("nope") is None

    done = datetime.now(UTC)
    updated = store.update_job(
        job.id, status="FAILED", finished_at=done, error="boom\n  at line 3", adapter_version=2**40
    )
    assert (updated.status, updated.finished_at, updated.error) == ("FAILED", done, "boom at line 3")
    assert store.get_job(job.id).adapter_version == 2**40  # type: ignore[union-attr]

    with pytest.raises(NotFoundError, match="nope"):
        store.update_job("nope", status="RUNNING")
    with pytest.raises(ValueError, match="colour"):
        store.update_job(job.id, colour="red")
    with pytest.raises(ValueError, match="primary key"):
        store.update_job(job.id, id="other")
    with pytest.raises(ConflictError):
        store.add_job(JobRow(id=job.id, name="again"))
    with pytest.raises(ValueError, match="naive"):
        store.update_job(job.id, started_at=datetime(2026, 1, 1))


def test_list_jobs_filters_and_pages(store: Store) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i, status in enumerate(["QUEUED", "RUNNING", "COMPLETED", "RUNNING", "FAILED"]):
        store.add_job(JobRow(id=f"job{i}", name=f"j{i}", status=status, created_at=t0 + timedelta(minutes=i)))
    assert [j.id for j in store.list_jobs()] == ["job4", "job3", "job2", "job1", "job0"]  # newest first
    assert [j.id for j in store.list_jobs(status="RUNNING")] == ["job3", "job1"]
    assert [j.id for j in store.list_jobs(status=["QUEUED", "FAILED"])] == ["job4", "job0"]
    assert [j.id for j in store.list_jobs(limit=2, offset=1)] == ["job3", "job2"]
    assert store.count_jobs() == 5 and store.count_jobs("RUNNING") == 2


def test_metric_point_is_stored_once(store: Store) -> None:
    job = store.add_job(JobRow(name="m"))
    assert store.add_metric_point(_metric(job.id, 1, loss=0.25))
    assert not store.add_metric_point(_metric(job.id, 1, loss=9.0))  # a redelivered event
    assert store.add_metric_point(_metric(job.id, 2, kl=0.01, entropy=1.5))
    points = store.metric_points(job.id)
    assert [(p.step, p.loss, p.kl, p.entropy) for p in points] == [(1, 0.25, None, None), (2, 0.0, 0.01, 1.5)]
    assert [p.step for p in store.metric_points(job.id, after_step=1)] == [2]
    with pytest.raises(StoreError, match="MetricPointRow"):
        store.add_metric_point(_metric("no-such-job", 1))  # foreign keys are enforced


def test_metric_point_race_stores_one(store_url: str) -> None:
    """Eight writers on two engines (as two scheduler processes would be) insert the same step
    at the same moment: the database keeps one, and exactly one writer is told it was new."""
    stores = [Store(store_url), Store(store_url)]
    stores[0].create_all()
    job = stores[0].add_job(JobRow(name="race"))
    barrier = threading.Barrier(8)

    def insert(i: int) -> bool:
        barrier.wait()
        return stores[i % 2].add_metric_point(_metric(job.id, 7, loss=float(i)))

    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(insert, range(8)))
        assert results.count(True) == 1
        assert len(stores[1].metric_points(job.id)) == 1
    finally:
        for s in stores:
            s.close()


def test_store_id_is_the_databases_own(store_url: str, tmp_path: Path) -> None:
    """Every engine on one database reads the same id, made once even when they race for it and
    kept across a reopen; another database has another."""
    stores = [Store(store_url) for _ in range(2)]
    stores[0].create_all()
    barrier = threading.Barrier(6)

    def read(i: int) -> str:
        barrier.wait()
        return stores[i % 2].store_id()

    try:
        with ThreadPoolExecutor(6) as pool:
            ids = set(pool.map(read, range(6)))
        assert len(ids) == 1 and len(next(iter(ids))) == 32
    finally:
        for s in stores:
            s.close()
    with Store(store_url) as again:
        assert again.store_id() in ids
    with Store(f"sqlite:///{tmp_path / 'other.db'}") as other:
        other.create_all()
        assert other.store_id() not in ids


def test_loops_and_rounds_round_trip(store: Store) -> None:
    loop = store.add_loop(LoopRow(name="math-pairs to 35%", spec_json="{}"))
    job = store.add_job(JobRow(name="r1"))
    assert store.get_loop(loop.id) == loop
    for index in (2, 1):
        store.add_round(RoundRow(loop_id=loop.id, index=index))
    with pytest.raises(ConflictError):
        store.add_round(RoundRow(loop_id=loop.id, index=1))
    with pytest.raises(StoreError):
        store.add_round(RoundRow(loop_id="no-such-loop", index=1))
    finished = datetime.now(UTC)
    got = store.update_round(loop.id, 1, job_id=job.id, evaluation_id="e1", status="SCORED", score=34.0,
                             questions=500, real_gain=True, finished_at=finished)
    assert (got.job_id, got.evaluation_id, got.score, got.real_gain, got.finished_at) == (
        job.id, "e1", 34.0, True, finished)
    assert store.get_round(loop.id, 1) == got
    assert [r.index for r in store.rounds(loop.id)] == [1, 2]
    assert store.update_loop(loop.id, status="TARGET_REACHED", baseline_score=12.6).baseline_score == 12.6
    assert [lp.id for lp in store.list_loops(status="TARGET_REACHED")] == [loop.id]
    assert store.count_loops("TARGET_REACHED") == 1 and store.count_loops("QUEUED") == 0
    with pytest.raises(NotFoundError):
        store.update_round(loop.id, 9, score=1.0)


def test_a_round_and_its_job_are_stored_together_or_not_at_all(store: Store) -> None:
    loop = store.add_loop(LoopRow(name="l", status="TRAINING"))
    round_, job = store.add_round_with_job(RoundRow(loop_id=loop.id, index=1), JobRow(name="l R1"))
    assert store.get_round(loop.id, 1).job_id == job.id and store.get_job(job.id) is not None
    # The same round again: neither the round nor a second job is stored.
    jobs_before = store.count_jobs()
    with pytest.raises(ConflictError):
        store.add_round_with_job(RoundRow(loop_id=loop.id, index=1), JobRow(name="l R1 again"))
    assert store.count_jobs() == jobs_before
    # An ended loop gets no new round (a stop racing with the round's creation).
    store.update_loop(loop.id, status="STOPPED")
    with pytest.raises(ConflictError, match="has ended"):
        store.add_round_with_job(RoundRow(loop_id=loop.id, index=2), JobRow(name="l R2"))
    assert store.count_jobs() == jobs_before and [r.index for r in store.rounds(loop.id)] == [1]
    with pytest.raises(ConflictError):
        store.add_round_with_job(RoundRow(loop_id="no-such-loop", index=1), JobRow(name="x"))


def test_evaluations_and_question_results(store: Store) -> None:
    evaluation = store.add_evaluation(
        EvaluationRow(
            model="tiny", adapter_name="a", adapter_version=3, benchmark="gsm8k", limit=50, seed=2**63 - 1
        )
    )
    got = store.get_evaluation(evaluation.id)
    assert got is not None and got.model_dump() == evaluation.model_dump()

    def result(i: int) -> QuestionResultRow:
        return QuestionResultRow(
            evaluation_id=evaluation.id,
            index=i,
            prompt=f"q{i}",
            ground_truth="4",
            completion="<think>2+2</think><answer>4</answer>",
            extracted_answer="4",
            reward=1.1,
            accuracy=1.0,
            format=1.0,
            strict=True,
            finish_reason="STOP",
        )

    assert store.add_question_results([result(i) for i in range(3)]) == 3
    assert store.add_question_results([result(i) for i in range(2, 5)]) == 2  # a resumed batch
    assert store.add_question_results([]) == 0
    rows = store.question_results(evaluation.id)
    assert [r.index for r in rows] == [0, 1, 2, 3, 4] and rows[0] == result(0)
    assert [r.index for r in store.question_results(evaluation.id, limit=2, offset=3)] == [3, 4]

    store.update_evaluation(
        evaluation.id, status="COMPLETED", score=0.7, accuracy=0.7, accuracy_strict=0.7, n_done=5
    )
    assert [e.id for e in store.list_evaluations(status="COMPLETED")] == [evaluation.id]


def test_artifacts(store: Store) -> None:
    job = store.add_job(JobRow(name="a"))
    adapter = store.add_artifact(
        ArtifactRow(job_id=job.id, kind="adapter", path="adapters/x/v1", size_bytes=3 << 33)
    )
    store.add_artifact(ArtifactRow(job_id=job.id, kind="merged", path="merged/x"))
    assert store.get_artifact(adapter.id) == adapter
    assert [a.kind for a in store.artifacts(job.id)] == ["adapter", "merged"]
    assert [a.id for a in store.artifacts(job.id, kind="adapter")] == [adapter.id]
    with pytest.raises(ValueError, match="kind"):
        store.add_artifact(ArtifactRow(job_id=job.id, kind="zip"))


def test_metric_event_maps_field_for_field(store: Store) -> None:
    common_pb2 = pytest.importorskip("rlvr.v1.common_pb2", reason="generated stubs absent: run `make protos`")
    event_fields = set(common_pb2.MetricEvent.DESCRIPTOR.fields_by_name) - {"time"}
    assert event_fields == set(MetricPointRow.model_fields) - {"created_at"}, "schema and contract drifted"

    job = store.add_job(JobRow(name="e"))
    when = Timestamp()
    when.FromDatetime(datetime(2026, 3, 1, 12, tzinfo=UTC))
    event = common_pb2.MetricEvent(job_id=job.id, step=1, loss=0.5, entropy=0.0, adapter_version=4, time=when,
                                   policy_lag=1)
    row = metric_point_from_event(event)
    assert (row.kl, row.entropy, row.loss, row.adapter_version, row.policy_lag) == (None, 0.0, 0.5, 4, 1)
    assert row.created_at == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert store.add_metric_point(row) and not store.add_metric_point(metric_point_from_event(event))


async def test_called_from_worker_threads() -> None:
    """Services call the store through asyncio.to_thread; in-memory SQLite must be one database
    across those threads, not one per thread."""
    with Store("sqlite://") as store:
        await asyncio.to_thread(store.create_all)
        job = await asyncio.to_thread(store.add_job, JobRow(name="t"))
        got = await asyncio.gather(*(asyncio.to_thread(store.get_job, job.id) for _ in range(4)))
        assert all(g is not None and g.id == job.id for g in got)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql+psycopg://postgres:secret@127.0.0.1:1/test", "cannot reach the database"),
        ("not a url", "is not a database URL"),
        ("mysql://u@localhost/db", "only sqlite"),
        ("postgresql+nodriver://u@localhost/db", "store url"),
    ],
)
def test_bad_url_is_one_clear_line(url: str, needle: str) -> None:
    with pytest.raises(StoreError, match=needle) as err:
        Store(url, connect_timeout_s=2)
    message = str(err.value)
    assert "\n" not in message and "secret" not in message and "store url" in message


def test_sqlite_in_unusable_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="store url"):
        Store(f"sqlite:///{tmp_path / 'file' / 'rlvr.db'}")


def test_concurrent_create_all_on_one_database(store_url: str) -> None:
    """The scheduler and the benchmark create the same tables at the same moment at stack start."""
    import threading

    stores = [Store(store_url) for _ in range(4)]
    errors: list[BaseException] = []

    def create(s: Store) -> None:
        try:
            s.create_all()
        except BaseException as e:  # collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert not errors, errors


def test_a_database_made_before_policy_lag_gains_the_column(store_url: str) -> None:
    """A metric_points table of the earlier shape (no policy_lag) takes the column, default 0, when
    a service creates the tables; its stored points stay, and new points store their lag. (The
    database is one made before migrations: no alembic_version. tests/test_migrations.py upgrades
    the databases of earlier commits.)"""
    with Store(store_url) as old:
        old.create_all()
        job = old.add_job(JobRow(name="before"))
        assert old.add_metric_point(_metric(job.id, 1))
        with old.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE metric_points DROP COLUMN policy_lag")
            conn.exec_driver_sql("DROP TABLE alembic_version")
    with Store(store_url) as new:
        new.create_all()
        new.create_all()  # a second start finds the column there
        assert new.add_metric_point(_metric(job.id, 2, policy_lag=1))
        assert [(p.step, p.policy_lag) for p in new.metric_points(job.id)] == [(1, 0), (2, 1)]


def test_a_database_made_before_queue_reason_and_resumes_gains_the_columns(store_url: str) -> None:
    """A jobs table without queue_reason and resumes takes them, default empty and 0, when a service
    creates the tables; its rows stay, and both are stored from then on."""
    with Store(store_url) as old:
        old.create_all()
        job = old.add_job(JobRow(name="before"))
        with old.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE jobs DROP COLUMN queue_reason")
            conn.exec_driver_sql("ALTER TABLE jobs DROP COLUMN resumes")
            conn.exec_driver_sql("DROP TABLE alembic_version")  # made before migrations
    with Store(store_url) as new:
        new.create_all()
        new.create_all()
        assert (new.get_job(job.id).queue_reason, new.get_job(job.id).resumes) == ("", 0)
        new.update_job(job.id, queue_reason="waiting for a free worker", resumes=2)
        assert (new.get_job(job.id).queue_reason, new.get_job(job.id).resumes) == ("waiting for a free worker", 2)
