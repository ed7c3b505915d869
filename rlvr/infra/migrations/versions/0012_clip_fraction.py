"""metric_points.clip_fraction.

The share of a step's completion tokens whose importance ratio the loss clipped: above 0 only when a
step makes several optimizer steps on its batch (advanced.num_iterations, advanced.mini_batches).

Stored points read NULL (a loss that does not clip, or a step stored before the count).

Revision ID: 0012_clip_fraction
Revises: 0011_episode_splits
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0012_clip_fraction"
down_revision: str | None = "0011_episode_splits"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0011 are: a database made before migrations got it from create_all already
    add_column("metric_points", sa.Column("clip_fraction", sa.Float(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
