"""loop_rounds.adapter_step and adapter_path: a loop that reads each round's best step (LoopSpec.best_step).

adapter_step: the step whose checkpoint is the round's adapter (0: its job's final adapter, as every
stored round reads); adapter_path: that checkpoint's folder ('' otherwise).

Revision ID: 0015_round_adapter_step
Revises: 0014_head_metrics
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0015_round_adapter_step"
down_revision: str | None = "0014_head_metrics"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0014 are: a database made before migrations got it from create_all already
    add_column("loop_rounds", sa.Column("adapter_step", sa.Integer(), nullable=False, server_default="0"))
    add_column("loop_rounds", sa.Column("adapter_path", sa.Text(), nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
