"""Bringing a store's database to this rlvr's schema: alembic, run from code.

docs/design.md, Store; docs/migrations.md. Every service that opens the store (`Store.upgrade`, at its
start) and `rlvr db upgrade` call `upgrade`, which decides from the database itself:

- no table of the store yet: `create_all` from `rlvr.infra.schema` and stamp the newest revision
  (alembic's recipe for a new database: one step, not the whole history);
- the store's tables but no `alembic_version` (made before the store had migrations): every
  revision from the baseline, each skipping what the tables already have (migrations/helpers.py);
- a revision this rlvr knows: the revisions after it;
- a revision this rlvr does not know: `DatabaseTooNewError`, nothing touched, since a newer rlvr
  migrated the database and this one would misread its tables.

One upgrade at a time per database: the scheduler and the benchmark start together on one. On
PostgreSQL a transaction-level advisory lock serializes them, and the whole upgrade is one
transaction (PostgreSQL's DDL is transactional); on SQLite a file lock beside the database file.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from rlvr.infra.schema import TABLES, SQLModel

log = logging.getLogger(__name__)
# alembic says at INFO which backend it found on every connection it configures: a line per start
# of every service, of no use to anyone reading its log. `upgrade` logs what it did in one line.
logging.getLogger("alembic").setLevel(logging.WARNING)

MIGRATIONS = Path(__file__).with_name("migrations")
# pg_advisory_xact_lock's key: any fixed 64-bit number; this one is derived from a name so it says whose.
_PG_LOCK_KEY = zlib.crc32(b"rlvr.infra.migrate")


class DatabaseTooNewError(RuntimeError):
    """The database is at a revision this rlvr does not know: a newer rlvr upgraded it."""

    def __init__(self, revision: str, head: str) -> None:
        self.revision, self.head = revision, head
        super().__init__(
            f"the database's schema is at revision {revision!r}, newer than this rlvr's newest ({head!r}): "
            "a newer rlvr upgraded it; run that version (or upgrade this installation), never an older one "
            "on its database"
        )


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade` did: the revision found (None: unversioned), the one left, and how."""

    before: str | None
    after: str
    created: bool  # a new database: tables created and stamped

    @property
    def changed(self) -> bool:
        return self.created or self.before != self.after


def config(connection: Connection | None = None) -> Config:
    """alembic's configuration of the packaged script directory (no alembic.ini), on `connection`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("file_template", "%%(rev)s")  # versions/0008_what_changed.py: the id says it
    cfg.attributes["connection"] = connection
    return cfg


def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(config())


def head() -> str:
    """This rlvr's newest revision."""
    newest = script().get_current_head()
    assert newest is not None  # the package ships its revisions
    return newest


def current(connection: Connection) -> str | None:
    """The database's revision; None when alembic never versioned it."""
    return MigrationContext.configure(connection).get_current_revision()


def _check_known(revision: str | None, scripts: ScriptDirectory) -> None:
    known = {r.revision for r in scripts.walk_revisions()}
    if revision is not None and revision not in known:
        raise DatabaseTooNewError(revision, scripts.get_current_head() or "")


@contextlib.contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the database's migration lock."""
    database = engine.url.database
    with contextlib.ExitStack() as stack:
        if engine.dialect.name == "sqlite" and database not in (None, "", ":memory:"):
            from filelock import FileLock

            stack.enter_context(FileLock(f"{Path(database).expanduser()}.migrate.lock"))
        connection = stack.enter_context(engine.begin())
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        yield connection


def upgrade(engine: Engine) -> Upgrade:
    """Brings the database to this rlvr's newest revision (see the module docstring).

    Raises DatabaseTooNewError before changing anything when the database is newer than this rlvr.
    """
    scripts = script()
    newest = head()
    with _locked(engine) as connection:
        before = current(connection)
        _check_known(before, scripts)
        cfg = config(connection)
        tables = [t.__table__ for t in TABLES]  # type: ignore[attr-defined]  # set on table=True models only
        if before is None and not any(inspect(connection).has_table(table.name) for table in tables):
            SQLModel.metadata.create_all(connection, tables=tables)
            command.stamp(cfg, "head")
            log.info("store: new database, tables created at schema revision %s", newest)
            return Upgrade(before=None, after=newest, created=True)
        if before != newest:
            command.upgrade(cfg, "head")
            log.info("store: schema upgraded from revision %s to %s", before or "(none: made before migrations)",
                     newest)
        return Upgrade(before=before, after=newest, created=False)


def check(engine: Engine) -> None:
    """alembic check: raises alembic.util.AutogenerateDiffsDetected when the database's tables differ
    from the models (the migrations and `rlvr.infra.schema` disagree)."""
    with engine.connect() as connection:
        command.check(config(connection))


def revision_of(engine: Engine) -> str | None:
    """The database's revision (`rlvr db current`)."""
    with engine.connect() as connection:
        return current(connection)
