"""alembic's environment for the store: migrations run on the connection the caller hands over.

`rlvr.infra.migrate` opens the connection (holding the migration lock) and puts it in
`config.attributes["connection"]`; this module never builds an engine of its own, so the same
migrations serve every service's start, `rlvr db upgrade` and the tests, with no alembic.ini.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel.sql.sqltypes import AutoString

from rlvr.infra.migrations.helpers import LEGACY_TABLES
from rlvr.infra.schema import TABLES, SQLModel, UTCDateTime

# The metadata of exactly the store's tables (SQLModel's is global: a test's own table must not count).
target_metadata = SQLModel.metadata
_OURS = {str(t.__tablename__) for t in TABLES}


def _include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate compares the store's tables only: a table in the database that the models do not
    declare is someone else's, or one of the first release's unused loop tables (LEGACY_TABLES)
    when it held rows and so was kept."""
    if type_ == "table":
        return name in _OURS or (not reflected and name not in LEGACY_TABLES)
    return True


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    """A drafted revision spells the models' column types in plain SQLAlchemy, as the revisions
    do: a revision must not import the models, which change after it."""
    if type_ == "type" and isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})" if obj.length else "sa.String()"
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=_include_object,
        compare_type=True,
        compare_server_default=True,
        render_item=_render_item,
        # SQLite alters a table by copying it: a revision made by autogenerate says so itself.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the store's migrations run through rlvr.infra.migrate (rlvr db upgrade), not the "
                       "alembic command line: they need the connection it opens")
_run(connection)
