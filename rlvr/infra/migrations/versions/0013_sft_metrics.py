"""metric_points.token_accuracy, tokens_per_second and heldout_loss: a Supervised (SFT) job's steps.

token_accuracy: the share of the trained tokens whose most likely next token was the label;
tokens_per_second: tokens trained per second at the step; heldout_loss: the loss on the held-out
split, at the steps that evaluated. An RLVR job's steps and stored points read NULL.

Revision ID: 0013_sft_metrics
Revises: 0012_learning_signal
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0013_sft_metrics"
down_revision: str | None = "0012_learning_signal"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0012 are: a database made before migrations got it from create_all already
    for name in ("token_accuracy", "tokens_per_second", "heldout_loss"):
        add_column("metric_points", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
