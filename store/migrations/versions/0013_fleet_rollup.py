"""fleet rollup: one sample of the fleet per minute for the dashboard's charts

``fleet_rollup`` holds, per time bucket, the GPUs in the fleet, allocated and unhealthy, the queue's length
and the waits of the jobs that started in the bucket before (read through the new index on
``job.started_at``). The placement service's leader writes it; the bucket is the primary key, so a bucket
is written once.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_rollup",
        sa.Column("bucket", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("span_s", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("gpus_total", sa.Integer(), nullable=False),
        sa.Column("gpus_allocated", sa.Integer(), nullable=False),
        sa.Column("gpus_unhealthy", sa.Integer(), nullable=False),
        sa.Column("queue_length", sa.Integer(), nullable=False),
        sa.Column("jobs_started", sa.Integer(), nullable=False),
        sa.Column("wait_p50_s", sa.Float(), nullable=True),
        sa.Column("wait_p90_s", sa.Float(), nullable=True),
        sa.Column("wait_p99_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_job_started_at", "job", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_job_started_at", table_name="job")
    op.drop_table("fleet_rollup")
