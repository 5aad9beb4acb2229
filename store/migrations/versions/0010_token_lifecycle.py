"""token lifecycle: API tokens get a name, who created them, an expiry and a revocation time

Tokens made through the API (``POST /v1/tokens``) are named, may expire, and are revoked by setting
``revoked_at`` (the row stays, for the record). Existing tokens keep working: no expiry, not revoked.
The ``tenant_admin`` role needs no schema change (``role`` is free text of at most 16 characters).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_token") as batch:
        batch.add_column(sa.Column("name", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("created_by", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_token") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("expires_at")
        batch.drop_column("created_by")
        batch.drop_column("name")
