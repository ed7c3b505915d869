"""The store: the scheduler's record of jobs, metric series, loops, evaluations and artifacts.

docs/design.md, Store: SQLite by default (WAL, `synchronous=FULL`), PostgreSQL by URL, one schema
(`rlvr.infra.schema`), kept up to date by alembic migrations (`Store.upgrade`, `rlvr.infra.migrate`).
The scheduler turns NATS metric events into rows here, exactly once: the
consumer may deliver an event twice, `add_metric_point` stores it once.

Why synchronous SQLAlchemy under asyncio services: every query here is small and short, SQLite
serializes writers anyway, and the sync engine works with the stdlib `sqlite3` and `psycopg`
without extra async drivers (aiosqlite) or greenlet plumbing. Services call these methods through
`asyncio.to_thread`, so the event loop never blocks; the engine's pool is thread-safe and each
method uses its own short session. The same API serves the CLI, scripts and tests unchanged.

Write methods issue their write first (INSERT, UPDATE) and read afterwards, never
read-then-write: a SQLite transaction that starts as a reader and then wants to write can fail at
once with "database is locked" instead of waiting out `busy_timeout`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from alembic.util import CommandError
from sqlalchemy import Engine, Table, create_engine, delete, event, func, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, col, select

from rlvr.infra import migrate
from rlvr.infra.migrate import Upgrade
from rlvr.infra.schema import (
    ARTIFACT_KINDS,
    LOOP_FINAL_STATUSES,
    ArtifactRow,
    EvaluationRow,
    JobRow,
    LoopRow,
    MetricPointRow,
    QuestionResultRow,
    RoundRow,
    StoreMetaRow,
)

Row = TypeVar("Row", bound=SQLModel)
# `Any` below stands for column values of mixed types (a row's fields, a composite key) and for SQL
# expressions, which SQLModel types as plain Python values (`JobRow.status == "x"` is a `bool` to a
# type checker), so no narrower annotation would be true.

BUSY_TIMEOUT_MS = 10_000


class StoreError(RuntimeError):
    """The database is unreachable or refused a write; the message is one readable line."""


class DatabaseTooNewError(StoreError):
    """The database's schema is newer than this rlvr's: a newer rlvr migrated it."""


class NotFoundError(StoreError, LookupError):
    """No row with that id (maps to NOT_FOUND)."""


class ConflictError(StoreError):
    """A row with that id already exists (maps to ALREADY_EXISTS / FAILED_PRECONDITION)."""


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)


def _first_line(e: BaseException) -> str:
    cause = getattr(e, "orig", None) or e
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


def _one_line(text: str) -> str:
    """Errors are shown in one line (Job.error): keep them so whatever the caller passed."""
    return " ".join(text.split())[:2000]


def _table(model: type[SQLModel]) -> Table:
    return model.__table__  # type: ignore[attr-defined]  # set by SQLModel's metaclass on table=True models only


def _check_aware(model: type[SQLModel], values: dict[str, Any]) -> None:
    """Refuse naive datetimes up front, naming the field (the column type refuses them too, but
    deep inside SQLAlchemy's statement error)."""
    for name, value in values.items():
        if isinstance(value, datetime) and value.tzinfo is None:
            raise ValueError(
                f"{model.__name__}.{name}: naive datetime {value.isoformat()} refused, pass aware UTC"
            )


def _set_sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Per connection, because SQLite settings other than journal_mode do not persist. WAL lets
    # readers (the API) run during a write (the metric consumer); FULL syncs the WAL on every
    # commit, so an acked event's row survives a power cut; foreign keys are off by default.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.close()


class Store:
    """Jobs, metric points, loops and rounds, evaluations and question results, artifacts.

    `Store(url)` connects at once and raises `StoreError` naming the store URL when the database
    cannot be reached, so a bad setting fails at start, not at the first request. A SQLite file
    that is not there is created (with its folder), unless `create` is False (a command that only
    reads, such as `rlvr db current`): then it is a StoreError naming the file.
    """

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0, echo: bool = False, create: bool = True) -> None:
        self.url = url
        shown = _redact(url)
        try:
            parsed = make_url(url)
            backend = parsed.get_backend_name()
        except ArgumentError as e:
            raise StoreError(f"store url {shown!r} is not a database URL: {_first_line(e)}") from None
        if backend not in ("sqlite", "postgresql"):
            raise StoreError(f"store url {shown!r}: only sqlite:/// and postgresql+psycopg:// are supported")
        self.dialect = backend
        kwargs: dict[str, Any] = {"echo": echo}
        if backend == "sqlite":
            # Services call in from worker threads (asyncio.to_thread); a pooled connection is
            # used by one thread at a time, which is what check_same_thread guards against.
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}
            if parsed.database in (None, "", ":memory:"):
                kwargs["poolclass"] = StaticPool  # one shared in-memory database, not one per thread
            elif not create and not (file := Path(parsed.database).expanduser().absolute()).is_file():
                raise StoreError(f"store url {shown!r}: no database file at {file} (`rlvr db upgrade` creates one)")
            else:
                try:
                    Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise StoreError(f"store url {shown!r}: cannot create its folder: {e.strerror}") from None
        else:
            kwargs["pool_pre_ping"] = True  # a PostgreSQL restart must not fail the next request
            if "connect_timeout" not in parsed.query:
                kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout_s))}
        try:
            self.engine: Engine = create_engine(parsed, **kwargs)
        except (ArgumentError, NoSuchModuleError, ImportError) as e:
            raise StoreError(f"store url {shown!r}: {_first_line(e)}") from None
        if backend == "sqlite":
            event.listen(self.engine, "connect", _set_sqlite_pragmas)
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except (SQLAlchemyError, OSError) as e:
            self.engine.dispose()
            raise StoreError(f"cannot reach the database at store url {shown!r}: {_first_line(e)}") from None

    def upgrade(self) -> Upgrade:
        """Brings the database to this rlvr's schema (every service calls it at its start): creates
        the tables of a new database, runs the migrations an older one lacks, and refuses, with
        `DatabaseTooNewError` and nothing changed, a database a newer rlvr has migrated
        (`rlvr.infra.migrate`, docs/migrations.md). Concurrent starts on one database take turns.
        """
        shown = _redact(self.url)
        try:
            return migrate.upgrade(self.engine)
        except migrate.DatabaseTooNewError as e:
            raise DatabaseTooNewError(f"store url {shown!r}: {e}") from None
        except (SQLAlchemyError, CommandError) as e:
            raise StoreError(f"cannot upgrade the database at store url {shown!r}: {_first_line(e)}") from None

    def create_all(self) -> None:
        """`upgrade`, under the name scripts and tests call before using a new database."""
        self.upgrade()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ generic helpers

    def _session(self) -> Session:
        # Rows stay readable after the session closes: they are handed to other threads.
        return Session(self.engine, expire_on_commit=False)

    def _add(self, row: Row) -> Row:
        _check_aware(type(row), row.model_dump())
        if hasattr(row, "error"):
            row.error = _one_line(row.error)
        with self._session() as session:
            session.add(row)
            try:
                session.commit()
            except IntegrityError as e:
                text = _first_line(e)
                # A duplicate key is the caller's conflict; a dangling foreign key is a bad reference.
                duplicate = "unique" in text.lower() or "duplicate key" in text.lower()
                raise (ConflictError if duplicate else StoreError)(
                    f"{type(row).__name__} not added: {text}"
                ) from None
            return row

    def _get(self, model: type[Row], key: Any) -> Row | None:
        with self._session() as session:
            return session.get(model, key)

    def _update(self, model: type[Row], key: dict[str, Any], fields: dict[str, Any]) -> Row:
        unknown = set(fields) - set(model.model_fields)
        if unknown:
            raise ValueError(f"{model.__name__} has no field(s) {', '.join(sorted(unknown))}")
        if set(fields) & set(key):
            raise ValueError(f"{model.__name__}: the primary key ({', '.join(key)}) cannot be updated")
        _check_aware(model, fields)
        if "error" in fields and fields["error"] is not None:
            fields["error"] = _one_line(fields["error"])
        where = [getattr(model, name) == value for name, value in key.items()]
        with self._session() as session:
            if fields:
                result = session.exec(update(model).where(*where).values(**fields))
                if result.rowcount == 0:
                    raise NotFoundError(f"{model.__name__} {_key_text(key)} not found")
            row = session.exec(select(model).where(*where)).first()
            if row is None:
                raise NotFoundError(f"{model.__name__} {_key_text(key)} not found")
            session.commit()
            return row

    def _list(
        self,
        model: type[Row],
        *where: Any,
        order: Sequence[Any],
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Row]:
        stmt = select(model).where(*where).order_by(*order).offset(offset)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._session() as session:
            return list(session.exec(stmt).all())

    def _count(self, model: type[Row], *where: Any) -> int:
        with self._session() as session:
            return int(session.exec(select(func.count()).select_from(model).where(*where)).one())

    def _insert_ignore(self, model: type[Row], rows: Iterable[Row]) -> int:
        """INSERT .. ON CONFLICT (primary key) DO NOTHING; returns how many rows were new.

        The database decides, not a prior SELECT, so two writers racing on the same key still
        store it once. RETURNING counts the inserted rows exactly on both dialects.
        """
        values = [row.model_dump() for row in rows]
        if not values:
            return 0
        for value in values:
            _check_aware(model, value)
        table = _table(model)
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        keys = [c.name for c in table.primary_key.columns]
        stmt = insert(table).on_conflict_do_nothing(index_elements=keys).returning(*table.primary_key.columns)
        try:
            with self.engine.begin() as conn:
                return len(conn.execute(stmt, values).all())
        except IntegrityError as e:
            # Not the key (that one is ignored): a foreign key or a NOT NULL column.
            raise StoreError(f"{model.__name__} not stored: {_first_line(e)}") from None

    # ------------------------------------------------------------------ the database itself

    def store_id(self) -> str:
        """This database's own random id, made by the first caller and the same for every later one
        (the database decides a race), whatever URL or host reaches it: the scheduler names its
        NATS consumer after it, so two deployments on one NATS never share one."""
        self._insert_ignore(StoreMetaRow, [StoreMetaRow(key="store_id", value=uuid.uuid4().hex)])
        row = self._get(StoreMetaRow, "store_id")
        assert row is not None  # inserted above, or by the writer that won the race; never deleted
        return row.value

    # ------------------------------------------------------------------ jobs and metrics

    def add_job(self, job: JobRow) -> JobRow:
        return self._add(job)

    def get_job(self, job_id: str) -> JobRow | None:
        return self._get(JobRow, job_id)

    def list_jobs(
        self, status: str | Iterable[str] | None = None, limit: int = 100, offset: int = 0
    ) -> list[JobRow]:
        """Newest first."""
        return self._list(
            JobRow,
            *_status_filter(JobRow, status),
            order=[col(JobRow.created_at).desc(), JobRow.id],
            limit=limit,
            offset=offset,
        )

    def count_jobs(self, status: str | Iterable[str] | None = None) -> int:
        return self._count(JobRow, *_status_filter(JobRow, status))

    def status_counts(self, model: type[JobRow] | type[LoopRow] | type[EvaluationRow]) -> dict[str, int]:
        """How many jobs, loops or evaluations are in each status (a status with none is absent)."""
        column = col(model.status)
        with self._session() as session:
            rows = session.exec(select(column, func.count()).group_by(column)).all()
        return {str(status): int(n) for status, n in rows}

    def update_job(self, job_id: str, **fields: Any) -> JobRow:
        """Set the given fields; raises NotFoundError for an unknown id, ValueError for an unknown field."""
        return self._update(JobRow, {"id": job_id}, fields)

    def add_metric_point(self, point: MetricPointRow) -> bool:
        """Store one step's metrics; False when that (job_id, step) is already stored."""
        return self._insert_ignore(MetricPointRow, [point]) == 1

    def metric_points(self, job_id: str, after_step: int = 0) -> list[MetricPointRow]:
        """The job's series in step order; `after_step` returns only later steps (polling)."""
        return self._list(
            MetricPointRow,
            MetricPointRow.job_id == job_id,
            MetricPointRow.step > after_step,
            order=[MetricPointRow.step],
        )

    def delete_job(self, job_id: str) -> bool:
        """Removes a job with its metric points and artifact records, in one transaction; a loop
        round that named it keeps its place without a job (job_id NULL). The rows are deleted
        explicitly rather than left to ON DELETE, so a database made without those clauses is
        cleaned the same. Files are the caller's. False when there is no such job."""
        with self._session() as session:
            session.exec(delete(MetricPointRow).where(col(MetricPointRow.job_id) == job_id))
            session.exec(delete(ArtifactRow).where(col(ArtifactRow.job_id) == job_id))
            session.exec(update(RoundRow).where(col(RoundRow.job_id) == job_id).values(job_id=None))
            deleted = session.exec(delete(JobRow).where(col(JobRow.id) == job_id)).rowcount
            session.commit()
            return deleted == 1

    def rounds_of_job(self, job_id: str) -> list[RoundRow]:
        """The loop rounds that trained with this job (at most one, in practice)."""
        return self._list(RoundRow, RoundRow.job_id == job_id, order=[RoundRow.loop_id, RoundRow.index])

    # ------------------------------------------------------------------ loops and rounds

    def add_loop(self, loop: LoopRow) -> LoopRow:
        return self._add(loop)

    def get_loop(self, loop_id: str) -> LoopRow | None:
        return self._get(LoopRow, loop_id)

    def list_loops(
        self, status: str | Iterable[str] | None = None, limit: int = 100, offset: int = 0
    ) -> list[LoopRow]:
        return self._list(
            LoopRow,
            *_status_filter(LoopRow, status),
            order=[col(LoopRow.created_at).desc(), LoopRow.id],
            limit=limit,
            offset=offset,
        )

    def count_loops(self, status: str | Iterable[str] | None = None) -> int:
        return self._count(LoopRow, *_status_filter(LoopRow, status))

    def update_loop(self, loop_id: str, **fields: Any) -> LoopRow:
        return self._update(LoopRow, {"id": loop_id}, fields)

    def add_round(self, round_: RoundRow) -> RoundRow:
        return self._add(round_)

    def add_round_with_job(self, round_: RoundRow, job: JobRow) -> tuple[RoundRow, JobRow]:
        """A loop round and its training job in one transaction: both are stored or neither, so a
        scheduler that dies while starting a round can never leave a job without its round (which
        a restart would start a second time) or a round pointing at no job."""
        for row in (job, round_):
            _check_aware(type(row), row.model_dump())
        round_.job_id = job.id
        with self._session() as session:
            # Locks the loop's row for this transaction and checks it is still open, so a loop
            # stopped concurrently gets no new round.
            still_open = session.exec(
                update(LoopRow)
                .where(col(LoopRow.id) == round_.loop_id, col(LoopRow.status).not_in(list(LOOP_FINAL_STATUSES)))
                .values(status=LoopRow.status)
            )
            if still_open.rowcount == 0:
                raise ConflictError(f"loop {round_.loop_id!r} is unknown or has ended: no round added")
            try:
                session.add(job)
                session.flush()  # the job first: the round's foreign key points at it
                session.add(round_)
                session.commit()
            except IntegrityError as e:
                text = _first_line(e)
                duplicate = "unique" in text.lower() or "duplicate key" in text.lower()
                raise (ConflictError if duplicate else StoreError)(f"round not added: {text}") from None
            return round_, job

    def get_round(self, loop_id: str, index: int) -> RoundRow | None:
        return self._get(RoundRow, (loop_id, index))

    def rounds(self, loop_id: str) -> list[RoundRow]:
        return self._list(RoundRow, RoundRow.loop_id == loop_id, order=[RoundRow.index])

    def update_round(self, loop_id: str, index: int, **fields: Any) -> RoundRow:
        return self._update(RoundRow, {"loop_id": loop_id, "index": index}, fields)

    # ------------------------------------------------------------------ evaluations

    def add_evaluation(self, evaluation: EvaluationRow) -> EvaluationRow:
        return self._add(evaluation)

    def get_evaluation(self, evaluation_id: str) -> EvaluationRow | None:
        return self._get(EvaluationRow, evaluation_id)

    def list_evaluations(
        self, status: str | Iterable[str] | None = None, limit: int = 100, offset: int = 0
    ) -> list[EvaluationRow]:
        return self._list(
            EvaluationRow,
            *_status_filter(EvaluationRow, status),
            order=[col(EvaluationRow.created_at).desc(), EvaluationRow.id],
            limit=limit,
            offset=offset,
        )

    def update_evaluation(self, evaluation_id: str, **fields: Any) -> EvaluationRow:
        return self._update(EvaluationRow, {"id": evaluation_id}, fields)

    def delete_evaluation(self, evaluation_id: str) -> int | None:
        """Removes an evaluation and its question results in one transaction; returns how many
        results went with it, None when there is no such evaluation."""
        with self._session() as session:
            results = session.exec(
                delete(QuestionResultRow).where(col(QuestionResultRow.evaluation_id) == evaluation_id)
            ).rowcount
            deleted = session.exec(delete(EvaluationRow).where(col(EvaluationRow.id) == evaluation_id)).rowcount
            if deleted != 1:
                session.rollback()
                return None
            session.commit()
            return int(results)

    def add_question_results(self, results: Iterable[QuestionResultRow]) -> int:
        """Bulk insert; a result already stored (same evaluation_id, index) is skipped, so a
        benchmark that resumes can resend its last batch. Returns how many were new."""
        return self._insert_ignore(QuestionResultRow, results)

    def question_results(
        self, evaluation_id: str, limit: int | None = None, offset: int = 0
    ) -> list[QuestionResultRow]:
        return self._list(
            QuestionResultRow,
            QuestionResultRow.evaluation_id == evaluation_id,
            order=[QuestionResultRow.index],
            limit=limit,
            offset=offset,
        )

    # ------------------------------------------------------------------ artifacts

    def add_artifact(self, artifact: ArtifactRow) -> ArtifactRow:
        if artifact.kind not in ARTIFACT_KINDS:
            raise ValueError(
                f"artifact kind {artifact.kind!r} is not one of {', '.join(sorted(ARTIFACT_KINDS))}"
            )
        return self._add(artifact)

    def get_artifact(self, artifact_id: str) -> ArtifactRow | None:
        return self._get(ArtifactRow, artifact_id)

    def artifacts(self, job_id: str, kind: str | None = None) -> list[ArtifactRow]:
        where = [ArtifactRow.job_id == job_id] + ([ArtifactRow.kind == kind] if kind else [])
        return self._list(ArtifactRow, *where, order=[ArtifactRow.created_at, ArtifactRow.id])

    def delete_artifact(self, artifact_id: str) -> bool:
        """Removes the record of an artifact (its files are the caller's); False when unknown."""
        with self._session() as session:
            row = session.get(ArtifactRow, artifact_id)
            if row is None:
                return False
            session.delete(row)
            session.commit()
            return True


def _status_filter(
    model: type[JobRow] | type[LoopRow] | type[EvaluationRow], status: str | Iterable[str] | None
) -> list[Any]:
    if status is None:
        return []
    column = col(model.status)
    if isinstance(status, str):
        return [column == status]
    return [column.in_(list(status))]


def _key_text(key: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in key.items())
