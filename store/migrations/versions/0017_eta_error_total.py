"""eta_error_total: scored estimates past the retention, folded into totals before they are deleted

The live accuracy's records (``eta_record``) grow by every waiting job's estimates; scored ones older than the
retention are folded into these totals per (GPU type, size class, kind) and deleted in the same transaction, so
the Prometheus counters made of both never go down.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eta_error_total",
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("size_class", sa.String(length=8), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("sum_abs_s", sa.Float(), nullable=False),
        sa.Column("covered", sa.BigInteger(), nullable=False),
        sa.Column("late", sa.BigInteger(), nullable=False),
        sa.Column("at_most", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("gpu_type", "size_class", "kind"),
    )


def downgrade() -> None:
    op.drop_table("eta_error_total")
