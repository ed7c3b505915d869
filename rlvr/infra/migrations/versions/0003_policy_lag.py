"""metric_points.policy_lag: how stale a step's training data was, in adapter versions (commit 75f49f9).

Stored points read 0 (synchronous steps).

Revision ID: 0003_policy_lag
Revises: 0002_training_loops
Create Date: 2026-12-01
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0003_policy_lag"
down_revision: str | None = "0002_training_loops"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_column("metric_points", sa.Column("policy_lag", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
