"""metric_points.heldout_f1 and class_f1: a Head job's evaluations (classification).

heldout_f1: the held-out macro F1, NULL at the steps that did not evaluate and at other jobs' steps;
class_f1: each class's held-out F1 as a JSON object (as reward_components is stored), '{}' otherwise.

Revision ID: 0014_head_metrics
Revises: 0013_sft_metrics
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0014_head_metrics"
down_revision: str | None = "0013_sft_metrics"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0013 are: a database made before migrations got it from create_all already
    add_column("metric_points", sa.Column("heldout_f1", sa.Float(), nullable=True))
    add_column("metric_points", sa.Column("class_f1", sa.Text(), nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
