"""metric_points.logprob_gap, logprob_gap_max and sampler_correction.

The sampler/trainer logprob gap of a step (mean and largest |Δlogp| between the rollout engine's
logprobs and the trainer's on the same tokens) and the reasons the step was importance-corrected.

Stored points read NULL (no logprobs reported) and "" (no correction).

Revision ID: 0008_sampler_gap
Revises: 0007_reward_components
Create Date: 2026-12-02
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0008_sampler_gap"
down_revision: str | None = "0007_reward_components"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0007 are: these columns were briefly added by the pre-migration create_all too
    add_column("metric_points", sa.Column("logprob_gap", sa.Float(), nullable=True))
    add_column("metric_points", sa.Column("logprob_gap_max", sa.Float(), nullable=True))
    add_column("metric_points", sa.Column("sampler_correction", sa.Text(), server_default=sa.text("''"),
                                          nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
