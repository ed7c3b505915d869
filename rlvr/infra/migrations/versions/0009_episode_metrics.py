"""metric_points: the episode metrics of a job with an environment (MetricEvent.turns_mean ...
failed_episodes).

Turns per episode (mean, largest), tool calls, their errors and seconds, observation and episode
tokens per episode, and the truncated and failed episodes of each step. Every one is NULL at a step
of a single-answer job, and at every step stored before this revision.

Revision ID: 0009_episode_metrics
Revises: 0008_sampler_gap
Create Date: 2026-12-07
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import add_column

revision: str = "0009_episode_metrics"
down_revision: str | None = "0008_sampler_gap"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = (("turns_mean", sa.Float()), ("turns_max", sa.Integer()), ("tool_calls", sa.Integer()),
           ("tool_errors", sa.Integer()), ("tool_seconds", sa.Float()), ("observation_tokens_mean", sa.Float()),
           ("episode_tokens_mean", sa.Float()), ("truncated_episodes", sa.Integer()),
           ("failed_episodes", sa.Integer()))


def upgrade() -> None:
    # guarded as 0002-0008 are: a database made before migrations got them from create_all already
    for name, kind in COLUMNS:
        add_column("metric_points", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
