"""tenant submission rate: each tenant's token bucket for job submissions

A tenant's submissions through the API are limited by a token bucket from its policy: refilled at
``submissions_per_minute``, holding at most ``submission_burst``. Existing tenants get the
defaults (600 a minute, bursts of 100).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.add_column(sa.Column("submissions_per_minute", sa.Float(), nullable=False, server_default="600"))
        batch.add_column(sa.Column("submission_burst", sa.Integer(), nullable=False, server_default="100"))


def downgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.drop_column("submission_burst")
        batch.drop_column("submissions_per_minute")
