"""eta_record: waiting jobs' estimated starts, scored once they start (the queue view's live accuracy)

One row per job and slot: slot 0 is the job's first estimate, a later sample's slot is the UNIX hour it was
made in (at most one an hour). The primary key makes the view worker's writes idempotent.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eta_record",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("slot", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("size_class", sa.String(length=8), nullable=False),
        sa.Column("made_at", sa.Float(), nullable=False),
        sa.Column("raw_start", sa.Float(), nullable=False),
        sa.Column("median", sa.Float(), nullable=False),
        sa.Column("low", sa.Float(), nullable=False),
        sa.Column("high", sa.Float(), nullable=False),
        sa.Column("calibrated", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("scored_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "slot"),
    )
    op.create_index("ix_eta_record_started_at", "eta_record", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_eta_record_started_at", table_name="eta_record")
    op.drop_table("eta_record")
