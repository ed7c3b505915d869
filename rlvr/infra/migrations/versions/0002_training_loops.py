"""Loops and rounds in their final shape (commit 532ba1a): training_loops and loop_rounds.

The first release's loops and rounds tables were never written by a service; they are dropped
when empty and kept, unused, otherwise (helpers.drop_table_if_empty).

Revision ID: 0002_training_loops
Revises: 0001_baseline
Create Date: 2026-12-01
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import LEGACY_TABLES, create_table, drop_table_if_empty

revision: str = "0002_training_loops"
down_revision: str | None = "0001_baseline"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    create_table(
        "training_loops",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.String(), nullable=False),
        sa.Column("message", sa.String(), nullable=False),
        sa.Column("warnings_json", sa.Text(), nullable=False),
        sa.Column("baseline_evaluation_id", sa.String(), nullable=False),
        sa.Column("baseline_score", sa.Float(), nullable=True),
        sa.Column("baseline_questions", sa.Integer(), nullable=False),
        sa.Column("baseline_seconds", sa.Float(), nullable=False),
        sa.Column("evaluation_attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        indexes=("created_at", "status"),
    )
    create_table(
        "loop_rounds",
        sa.Column("loop_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("evaluation_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("base_round", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("questions", sa.Integer(), nullable=False),
        sa.Column("gain_threshold", sa.Float(), nullable=False),
        sa.Column("real_gain", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("training_seconds", sa.Float(), nullable=False),
        sa.Column("benchmarking_seconds", sa.Float(), nullable=False),
        sa.Column("reclaimed_bytes", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["loop_id"], ["training_loops.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("loop_id", "index"),
    )
    for name in LEGACY_TABLES:  # rounds first: it points at loops
        drop_table_if_empty(name)


def downgrade() -> None:
    raise NotImplementedError("not undone: restore the database from a backup instead")
