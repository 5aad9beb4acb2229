"""tenant allowed images: glob patterns of the images a tenant's jobs may use

Null (every existing tenant) allows any image, as before.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.add_column(sa.Column("allowed_images", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.drop_column("allowed_images")
