"""job pending code: the scheduler's code for a queued job's pending reason

The placement service writes a code of scheduler.core.Pending (``no_free_node``, ``over_quota``, ...)
beside the text of every pending reason it writes; the API shows both. Jobs queued before the
upgrade have no code until the next cycle writes their reason again.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job') as batch:
        batch.add_column(sa.Column('pending_code', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job') as batch:
        batch.drop_column('pending_code')
