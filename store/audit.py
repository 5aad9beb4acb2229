"""The audit log: who changed what, when, and the thing before and after (append-only; migration 0011).

Every administrative change writes its event inside its own transaction, so a change is never without its
record, nor a record without its change."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from store.db import Database
from store.models import AuditEvent


def record(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    target: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    now: float | None = None,
) -> None:
    """Add the event to the caller's transaction."""
    session.add(AuditEvent(at=time.time() if now is None else now, actor=actor, action=action, target=target, before=before, after=after))


async def events(db: Database, *, target: str | None = None, limit: int = 100, before_id: int | None = None) -> Sequence[AuditEvent]:
    """The newest events first (those older than ``before_id``, to page back), of one target or all."""
    query = select(AuditEvent).order_by(col(AuditEvent.id).desc()).limit(limit)
    if target is not None:
        query = query.where(col(AuditEvent.target) == target)
    if before_id is not None:
        query = query.where(col(AuditEvent.id) < before_id)
    async with db.sessions() as session:
        return (await session.execute(query)).scalars().all()
