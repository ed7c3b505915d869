"""Operations the revisions up to 0008 use: each one does nothing when its change is already there.

Databases made before the store had migrations were built by `create_all`, which also added late
columns to older tables (the ADDED_COLUMNS list it had then), so such a database may hold any
prefix of the changes 0002-0007 make, with no record of which. `rlvr.infra.migrate` runs every
revision on it from the baseline, and these guards skip what its tables already have (0008's
columns were briefly in that list too). A revision after 0008 meets only databases that alembic
has versioned, and uses plain `op` calls.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from alembic import op

log = logging.getLogger(__name__)

# The first release's loop tables, of another shape than today's (training_loops, loop_rounds)
# and never written by a service: 0002 drops them when empty, and keeps them (unused) otherwise.
LEGACY_TABLES = ("rounds", "loops")


def has_table(name: str) -> bool:
    return sa.inspect(op.get_bind()).has_table(name)


def has_column(table: str, column: str) -> bool:
    return column in {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}


def create_table(name: str, *columns: Any, indexes: tuple[str, ...] = ()) -> None:
    """CREATE TABLE with an index `ix_<table>_<column>` on each of `indexes`, unless it exists."""
    if has_table(name):
        return
    op.create_table(name, *columns)
    for column in indexes:
        op.create_index(op.f(f"ix_{name}_{column}"), name, [column], unique=False)


def add_column(table: str, column: sa.Column[Any]) -> None:
    """ALTER TABLE .. ADD COLUMN unless the table has it (a NOT NULL column needs a server default)."""
    if not has_column(table, column.name):
        op.add_column(table, column)


def drop_table_if_empty(name: str) -> None:
    if not has_table(name):
        return
    rows = op.get_bind().execute(sa.text(f'SELECT COUNT(*) FROM "{name}"')).scalar_one()
    if rows:
        log.warning("table %s holds %d rows of the first release's loops: kept, unused", name, rows)
        return
    op.drop_table(name)
