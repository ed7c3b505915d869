"""jobs.resumes: the times a job was queued again after its trainer was lost (commit d20d7e8).

Stored jobs read 0, so a restarted scheduler counts their resumes from there.

Revision ID: 0006_resumes
Revises: 0005_store_meta
Create Date: 2026-12-02
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0006_resumes"
down_revision: str | None = "0005_store_meta"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_column("jobs", sa.Column("resumes", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
