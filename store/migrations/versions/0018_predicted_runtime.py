"""a waiting job's predicted run time, kept for the attempt it was made for

- ``job.predicted_runtime_s`` and ``job.predicted_attempt``: the run time the placement service predicted for the
  job's attempt when it first saw it waiting. The attempt keeps it while it waits (its place in the queue no longer
  moves each time its tenant's runs teach the predictor something), and a restarted service reads it back.
  NULL: none predicted yet; a job queued before this revision gets one at the next cycle.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("predicted_runtime_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("predicted_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("predicted_attempt")
        batch.drop_column("predicted_runtime_s")
