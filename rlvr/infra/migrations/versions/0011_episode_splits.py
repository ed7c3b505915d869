"""metric_points.episode_splits.

A job with an environment or an agent counts, per step, the training samples its episodes started
afresh (an agent that rewrote its history, a template that re-renders earlier turns).

Stored points read NULL (a single-answer step, or a step stored before the count).

Revision ID: 0011_episode_splits
Revises: 0010_question_episodes
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0011_episode_splits"
down_revision: str | None = "0010_question_episodes"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0010 are: a database made before migrations got it from create_all already
    add_column("metric_points", sa.Column("episode_splits", sa.Integer(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
