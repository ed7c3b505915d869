"""metric_points.reward_components and reward_errors (commit 7a8075d).

Each reward component's mean per step (a JSON object), and the step's completions whose reward
raised, hung or returned no number in 0-1.

Stored points read {} and 0.

Revision ID: 0007_reward_components
Revises: 0006_resumes
Create Date: 2026-12-02
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0007_reward_components"
down_revision: str | None = "0006_resumes"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_column("metric_points", sa.Column("reward_components", sa.Text(), server_default=sa.text("'{}'"),
                                          nullable=False))
    add_column("metric_points", sa.Column("reward_errors", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
