"""store_meta: facts about the database itself, such as its random store id (commit 9a60920).

Revision ID: 0005_store_meta
Revises: 0004_queue_reason
Create Date: 2026-12-01
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import create_table

revision: str = "0005_store_meta"
down_revision: str | None = "0004_queue_reason"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    create_table(
        "store_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
