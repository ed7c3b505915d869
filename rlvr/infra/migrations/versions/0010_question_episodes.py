"""question_results.episode.

An evaluation with an environment keeps each question's episode turn by turn (every assistant
turn, tool call, result and error) as JSON beside its transcript in `completion`.

Stored rows read "" (a single answer, no episode).

Revision ID: 0010_question_episodes
Revises: 0009_episode_metrics
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0010_question_episodes"
down_revision: str | None = "0009_episode_metrics"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # guarded as 0002-0009 are: a database made before migrations got it from create_all already
    add_column("question_results", sa.Column("episode", sa.Text(), server_default=sa.text("''"), nullable=False))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
