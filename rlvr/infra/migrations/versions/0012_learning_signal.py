"""metric_points.clip_fraction, groups_with_signal and heldout_accuracy.

clip_fraction: the share of a step's completion tokens whose importance ratio the loss clipped (above
0 only when a step makes several optimizer steps on its batch: advanced.num_iterations,
advanced.mini_batches). groups_with_signal: the step's groups whose rewards differ, the only ones
that move the adapter; the scheduler warns when several steps in a row have none. heldout_accuracy:
evaluation while training (advanced.eval_every), at the steps it ran.

Stored points read NULL (a loss that does not clip; a step stored before the counts).

Revision ID: 0012_learning_signal
Revises: 0011_episode_splits
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0012_learning_signal"
down_revision: str | None = "0011_episode_splits"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0011 are: a database made before migrations got it from create_all already
    add_column("metric_points", sa.Column("clip_fraction", sa.Float(), nullable=True))
    add_column("metric_points", sa.Column("groups_with_signal", sa.Integer(), nullable=True))
    add_column("metric_points", sa.Column("heldout_accuracy", sa.Float(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
