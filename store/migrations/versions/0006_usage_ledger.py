"""usage ledger: decayed usage per tenant and GPU type as running sums; index for the reconciler

Decayed usage was integrated from every allocation of the usage horizon in every scheduling
cycle. The ledger (store/usage.py) keeps it as running sums updated when an allocation is
created or released. It is built from the allocation rows the first time a half-life is
asked for, so an upgrade keeps every tenant's usage. A partial index makes the reconciler's
look for jobs whose workflow has not started read only those jobs.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'usage_ledger',
        sa.Column('half_life_s', sa.Float(), autoincrement=False, nullable=False),
        sa.Column('ref_t', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('half_life_s'),
    )
    op.create_table(
        'usage_account',
        sa.Column('half_life_s', sa.Float(), nullable=False),
        sa.Column('tenant', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column('gpu_type', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column('closed', sa.Float(), nullable=False),
        sa.Column('live_start', sa.Float(), nullable=False),
        sa.Column('live_gpus', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('half_life_s', 'tenant', 'gpu_type'),
    )
    op.create_index(
        'ix_job_without_workflow',
        'job',
        ['created_at'],
        unique=False,
        sqlite_where=sa.text('NOT workflow_started'),
        postgresql_where=sa.text('NOT workflow_started'),
    )


def downgrade() -> None:
    op.drop_index('ix_job_without_workflow', table_name='job')
    op.drop_table('usage_account')
    op.drop_table('usage_ledger')
