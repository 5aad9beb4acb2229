"""audit log: every administrative change, append-only

``audit_event`` records who changed what and when, with the thing before and after (tenants' policies,
node enrolments, tokens made and revoked). Like ``job_event``, a trigger refuses any UPDATE or DELETE of a
row (and, on PostgreSQL, a TRUNCATE), on both backends.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

MESSAGE = "audit_event is append-only"


def upgrade() -> None:
    op.create_table(
        "audit_event",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
    )
    op.create_index("ix_audit_event_target", "audit_event", ["target"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE FUNCTION audit_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON audit_event "
            "FOR EACH ROW EXECUTE PROCEDURE audit_event_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON audit_event "
            "FOR EACH STATEMENT EXECUTE PROCEDURE audit_event_append_only()"
        )
        return
    for verb in ("UPDATE", "DELETE"):
        op.execute(f"CREATE TRIGGER audit_event_no_{verb.lower()} BEFORE {verb} ON audit_event BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_event_no_truncate ON audit_event")
        op.execute("DROP TRIGGER IF EXISTS audit_event_append_only ON audit_event")
        op.execute("DROP FUNCTION IF EXISTS audit_event_append_only()")
    op.drop_index("ix_audit_event_target", table_name="audit_event")
    op.drop_table("audit_event")
