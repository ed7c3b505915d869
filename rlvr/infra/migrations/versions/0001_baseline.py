"""Baseline: the store of the first release (commit 33bc860).

jobs, metric_points, evaluations, question_results, artifacts, and the first loop tables (loops,
rounds), which 0002 replaces. Each table is created only when missing (helpers.py): a database made
before migrations runs this too.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa

from rlvr.infra.migrations.helpers import create_table

revision: str = "0001_baseline"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _when(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        _when("created_at", nullable=False),
        _when("started_at"),
        _when("finished_at"),
        sa.Column("error", sa.String(), nullable=False),
        sa.Column("adapter_name", sa.String(), nullable=False),
        sa.Column("adapter_version", sa.BigInteger(), nullable=False),
        sa.Column("adapter_path", sa.String(), nullable=False),
        sa.Column("warnings_json", sa.Text(), nullable=False),
        sa.Column("worker", sa.String(), nullable=False),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        indexes=("created_at", "status"),
    )
    create_table(
        "metric_points",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in ("reward_mean", "reward_std", "accuracy",
                                                                   "format", "loss")),
        sa.Column("kl", sa.Float(), nullable=True),
        sa.Column("entropy", sa.Float(), nullable=True),
        sa.Column("completion_length_mean", sa.Float(), nullable=False),
        sa.Column("completion_length_max", sa.Integer(), nullable=False),
        sa.Column("clipped_ratio", sa.Float(), nullable=False),
        sa.Column("learning_rate", sa.Float(), nullable=False),
        sa.Column("adapter_version", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in ("generate_seconds", "score_seconds",
                                                                   "train_seconds", "sync_seconds",
                                                                   "step_seconds")),
        _when("created_at", nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )
    create_table(
        "loops",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        _when("created_at", nullable=False),
        _when("started_at"),
        _when("finished_at"),
        sa.Column("best_score", sa.Float(), nullable=True),
        sa.Column("best_round", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        indexes=("created_at", "status"),
    )
    create_table(
        "evaluations",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("adapter_name", sa.String(), nullable=False),
        sa.Column("adapter_version", sa.BigInteger(), nullable=False),
        sa.Column("benchmark", sa.String(), nullable=False),
        sa.Column("limit", sa.Integer(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("sampling_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        _when("created_at", nullable=False),
        _when("started_at"),
        _when("finished_at"),
        sa.Column("error", sa.String(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in ("score", "accuracy", "accuracy_strict",
                                                                  "format")),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in ("answered", "n_questions", "n_done")),
        sa.Column("score_column", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        indexes=("created_at", "status"),
    )
    create_table(
        "rounds",
        sa.Column("loop_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("evaluation_id", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        _when("started_at"),
        _when("finished_at"),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["loop_id"], ["loops.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("loop_id", "index"),
    )
    create_table(
        "question_results",
        sa.Column("evaluation_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Text(), nullable=False) for name in ("prompt", "ground_truth", "completion",
                                                                  "extracted_answer")),
        *(sa.Column(name, sa.Float(), nullable=False) for name in ("reward", "accuracy", "format")),
        sa.Column("strict", sa.Boolean(), nullable=False),
        sa.Column("finish_reason", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("evaluation_id", "index"),
    )
    create_table(
        "artifacts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        _when("created_at", nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        indexes=("created_at", "job_id"),
    )


def downgrade() -> None:
    raise NotImplementedError("the baseline is not undone: drop the database instead")
