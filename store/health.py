"""GPU health: health events, a GPU's stored report and in-service flag, injected faults, and the jobs on a GPU."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlmodel import col

from store.common import held
from store.db import Database, bump_change_feed
from store.models import Allocation, AllocationGpu, Gpu, HealthEvent


async def health_event_counts(db: Database) -> dict[str, int]:
    """How many health events of each kind were recorded (for counters), counted in SQL."""
    async with db.sessions() as session:
        query = select(col(HealthEvent.kind), func.count()).group_by(col(HealthEvent.kind))
        return {k: int(n) for k, n in (await session.execute(query)).all()}


async def add_health_event(
    db: Database,
    *,
    node_id: str,
    kind: str,
    key: str,
    gpu_index: int | None = None,
    severity: str = "info",
    message: str = "",
    data: dict[str, Any] | None = None,
    now: float | None = None,
) -> bool:
    """Record a health event once per (node, key); returns whether it is new."""
    now = time.time() if now is None else now
    event = HealthEvent(
        ts=now, node_id=node_id, gpu_index=gpu_index, kind=kind, severity=severity, message=message, data=data or {}, dedupe_key=key
    )
    try:
        async with db.transaction() as session:
            session.add(event)
        return True
    except IntegrityError:
        return False


async def recent_health_events(db: Database, *, limit: int = 50) -> Sequence[HealthEvent]:
    async with db.sessions() as session:
        return (await session.execute(select(HealthEvent).order_by(col(HealthEvent.id).desc()).limit(limit))).scalars().all()


async def set_gpu_health(
    db: Database,
    *,
    node_id: str,
    index: int,
    healthy: bool | None = None,
    health: dict[str, Any] | None = None,
    keep_injected: bool = False,
) -> Gpu | None:
    """Update a GPU's health report and/or its in-service flag; taking one out or returning it wakes the scheduler.

    ``keep_injected``: the stored ``injected`` faults are the row's own at the time of writing (a fault an admin
    injected, or cleared, while the caller was assessing a report is neither lost nor brought back).
    """
    async with db.transaction() as session:
        gpu = await session.get(Gpu, (node_id, index), with_for_update=True)
        if gpu is None:
            return None
        if health is not None:
            if keep_injected:
                current = (gpu.health or {}).get("injected")
                health = {k: v for k, v in health.items() if k != "injected"} | ({"injected": current} if current else {})
            gpu.health = health
        if healthy is not None and healthy != gpu.healthy:
            gpu.healthy = healthy
            await bump_change_feed(session)
        return gpu


async def inject_gpu_fault(db: Database, *, node_id: str, index: int, fault: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Add a simulated fault to a GPU's ``injected`` list, in one transaction; the list after it, or None for no such GPU."""
    async with db.transaction() as session:
        gpu = await session.get(Gpu, (node_id, index), with_for_update=True)
        if gpu is None:
            return None
        injected = [*(gpu.health or {}).get("injected", []), fault]
        gpu.health = {**(gpu.health or {}), "injected": injected}
        return injected


async def gpu_jobs(db: Database, node_id: str) -> list[tuple[int, str, int]]:
    """(GPU index, job id, attempt) of every live allocation GPU on the node."""
    async with db.sessions() as session:
        return await live_gpu_jobs(session, node_id)


async def live_gpu_jobs(session: AsyncSession | AsyncConnection, node_id: str) -> list[tuple[int, str, int]]:
    query = (
        select(col(AllocationGpu.gpu_index), col(Allocation.job_id), col(Allocation.attempt))
        .join(Allocation, col(AllocationGpu.allocation_id) == col(Allocation.id))
        .where(col(AllocationGpu.node_id) == node_id, held())
    )
    return sorted((i, j, a) for i, j, a in (await session.execute(query)).all())


async def degraded_since(db: Database, node_id: str) -> float | None:
    """When the node was cordoned for degradation, unless an admin uncordoned it since."""
    async with db.sessions() as session:
        query = (
            select(HealthEvent)
            .where(col(HealthEvent.node_id) == node_id, or_(col(HealthEvent.severity) == "degraded", col(HealthEvent.kind) == "uncordon"))
            .order_by(col(HealthEvent.id).desc())
            .limit(1)
        )
        event = (await session.execute(query)).scalars().first()
    return event.ts if event is not None and event.severity == "degraded" else None
