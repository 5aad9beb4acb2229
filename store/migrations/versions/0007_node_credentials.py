"""node credentials: a node token belongs to one node

Every node agent used to share one node token, and any of them could register or heartbeat as any
node. A node token now names its node (``api_token.node_id``); one without a node (the shared token
of earlier versions) no longer authenticates and is removed here. Seeding a cluster config issues
each configured node its own credential (fairgang.cluster.node_credential); an admin enrols any
other node through the API.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_token') as batch:
        batch.add_column(sa.Column('node_id', sa.String(length=64), nullable=True))
    op.execute("DELETE FROM api_token WHERE role = 'node' AND node_id IS NULL")


def downgrade() -> None:
    with op.batch_alter_table('api_token') as batch:
        batch.drop_column('node_id')
