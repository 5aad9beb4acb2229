"""elastic jobs: a job's GPU range, an allocation replaced by a resize, when a node's GPUs were last freed

- ``job.gpu_max``: an elastic job's most GPUs (``gpu_count`` is its minimum); NULL for a fixed job.
- ``allocation.resized_from``: the allocation a resize replaced. A resize ends the job's allocation and
  makes a new one for the same attempt in one transaction (the GPUs kept stay held throughout), so one
  attempt may now have several allocations, one after another: the unique (job_id, attempt) constraint
  becomes a plain index.
- ``node.freed_at``: when GPUs of the node were last released (elastic jobs grow only onto GPUs idle a while).

Revision ID: 0015
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("gpu_max", sa.Integer(), nullable=True))
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("freed_at", sa.Float(), nullable=True))
    with op.batch_alter_table("allocation") as batch:
        batch.add_column(sa.Column("resized_from", sa.String(length=40), nullable=True))
        batch.drop_constraint("uq_allocation_job_attempt", type_="unique")
        batch.create_index("ix_allocation_job_attempt", ["job_id", "attempt"])


def downgrade() -> None:
    with op.batch_alter_table("allocation") as batch:
        batch.drop_index("ix_allocation_job_attempt")
        batch.create_unique_constraint("uq_allocation_job_attempt", ["job_id", "attempt"])
        batch.drop_column("resized_from")
    with op.batch_alter_table("node") as batch:
        batch.drop_column("freed_at")
    with op.batch_alter_table("job") as batch:
        batch.drop_column("gpu_max")
