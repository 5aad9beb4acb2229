"""job events are append-only

The job event log is the job's history: rows are only ever inserted. A trigger refuses
any UPDATE or DELETE of a row (and, on PostgreSQL, a TRUNCATE), on both backends.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

MESSAGE = "job_event is append-only"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE FUNCTION job_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER job_event_append_only BEFORE UPDATE OR DELETE ON job_event "
            "FOR EACH ROW EXECUTE PROCEDURE job_event_append_only()"
        )
        op.execute(
            "CREATE TRIGGER job_event_no_truncate BEFORE TRUNCATE ON job_event "
            "FOR EACH STATEMENT EXECUTE PROCEDURE job_event_append_only()"
        )
        return
    for verb in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER job_event_no_{verb.lower()} BEFORE {verb} ON job_event "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS job_event_no_truncate ON job_event")
        op.execute("DROP TRIGGER IF EXISTS job_event_append_only ON job_event")
        op.execute("DROP FUNCTION IF EXISTS job_event_append_only()")
        return
    for verb in ("update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS job_event_no_{verb}")
