"""jobs.queue_reason: why a QUEUED job has no worker yet (commit 834bacb).

Stored jobs read an empty reason.

Revision ID: 0004_queue_reason
Revises: 0003_policy_lag
Create Date: 2026-12-01
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0004_queue_reason"
down_revision: str | None = "0003_policy_lag"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_column("jobs", sa.Column("queue_reason", sa.Text(), server_default=sa.text("''"), nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
