"""What several store modules share: the job and allocation states they test, ids, and the job event log's writes."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from fairgang.spec import TERMINAL_STATES
from store.models import AllocationGpu, JobEvent

TERMINAL = {s.value for s in TERMINAL_STATES}
LIVE_ALLOCATION_STATES = ("BOUND", "ACKED")
#: An allocation whose attempt ended without its members' end being confirmed (a lost node): its GPUs stay
#: held, but agents are told it is no longer held, so they (and their shims) kill what still runs of it.
REVOKED = "REVOKED"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def new_event(job_id: str, attempt: int, kind: str, message: str, key: str, now: float, **data: Any) -> JobEvent:
    return JobEvent(job_id=job_id, ts=now, attempt=attempt, kind=kind, message=message, data=data, dedupe_key=key)


async def add_event_once(session: AsyncSession, event: JobEvent) -> bool:
    """Append an event unless one with its dedupe key exists. Returns True if added."""
    exists = (
        await session.execute(
            select(col(JobEvent.id)).where(col(JobEvent.job_id) == event.job_id, col(JobEvent.dedupe_key) == event.dedupe_key)
        )
    ).first()
    if exists is not None:
        return False
    session.add(event)
    return True


def held() -> ColumnElement[Any]:
    """``allocation_gpu.live`` as a bare term: SQLite uses the partial index ``uq_allocation_gpu_live`` (WHERE live)
    only for a query whose WHERE holds that very term, and SQLAlchemy writes ``live = 1`` for the column on SQLite."""
    return literal_column(f"{AllocationGpu.__tablename__}.live")
