"""Sweeps and their trials (a trial's job is a plain job, see store/jobs.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col

from store.db import Database
from store.models import Job, Sweep, SweepTrial

SWEEP_TERMINAL = ("COMPLETED", "CANCELLED", "FAILED")


async def create_sweep(
    db: Database,
    *,
    sweep_id: str,
    tenant: str,
    name: str,
    idempotency_key: str,
    spec: dict[str, Any],
    trial_count: int,
    max_concurrent: int,
    schedule_id: str | None = None,
    state: str = "SUBMITTED",
    reason: str | None = None,
    now: float | None = None,
) -> tuple[Sweep, bool]:
    """Insert a sweep, or return the one already stored under the same (tenant, key).

    Returns:
        (sweep, created): created is False when the key was already used.
    """
    now = time.time() if now is None else now
    existing = await find_sweep_by_key(db, tenant=tenant, key=idempotency_key)
    if existing is not None:
        return existing, False
    sweep = Sweep(
        id=sweep_id,
        tenant=tenant,
        name=name,
        idempotency_key=idempotency_key,
        spec=spec,
        state=state,
        trial_count=trial_count,
        max_concurrent=max_concurrent,
        schedule_id=schedule_id,
        reason=reason,
        created_at=now,
        updated_at=now,
        finished_at=now if state in SWEEP_TERMINAL else None,
    )
    try:
        async with db.transaction() as session:
            session.add(sweep)
    except IntegrityError:
        existing = await find_sweep_by_key(db, tenant=tenant, key=idempotency_key)
        if existing is None:
            raise
        return existing, False
    return sweep, True


async def find_sweep_by_key(db: Database, *, tenant: str, key: str) -> Sweep | None:
    async with db.sessions() as session:
        query = select(Sweep).where(col(Sweep.tenant) == tenant, col(Sweep.idempotency_key) == key)
        return (await session.execute(query)).scalar_one_or_none()


async def get_sweep(db: Database, sweep_id: str) -> Sweep | None:
    async with db.sessions() as session:
        return await session.get(Sweep, sweep_id)


async def list_sweeps(
    db: Database, *, tenant: str | None = None, schedule_id: str | None = None, state: str | None = None, limit: int = 200
) -> Sequence[Sweep]:
    query = select(Sweep).order_by(col(Sweep.created_at).desc(), col(Sweep.id)).limit(limit)
    if tenant is not None:
        query = query.where(col(Sweep.tenant) == tenant)
    if schedule_id is not None:
        query = query.where(col(Sweep.schedule_id) == schedule_id)
    if state is not None:
        query = query.where(col(Sweep.state) == state)
    async with db.sessions() as session:
        return (await session.execute(query)).scalars().all()


async def set_sweep_state(
    db: Database,
    *,
    sweep_id: str,
    state: str,
    summary: dict[str, Any] | None = None,
    reason: str | None = None,
    now: float | None = None,
) -> Sweep | None:
    """Move a sweep to ``state``; a finished sweep never moves again, and CANCELLING never goes back to RUNNING."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        sweep = await session.get(Sweep, sweep_id)
        if sweep is None or sweep.state in SWEEP_TERMINAL:
            return sweep
        if not (state == "RUNNING" and sweep.state == "CANCELLING"):
            sweep.state = state
        if summary is not None:
            sweep.summary = summary
        if reason is not None:
            sweep.reason = reason
        sweep.updated_at = now
        if state in SWEEP_TERMINAL:
            sweep.finished_at = now
        return sweep


async def get_trial(db: Database, *, sweep_id: str, index: int) -> SweepTrial | None:
    async with db.sessions() as session:
        return await session.get(SweepTrial, (sweep_id, index))


async def add_trial(
    db: Database,
    *,
    sweep_id: str,
    index: int,
    params: dict[str, Any],
    job_id: str | None,
    state: str = "CREATED",
    reason: str | None = None,
    now: float | None = None,
) -> SweepTrial:
    """Record a trial once (a repeat returns the first record)."""
    now = time.time() if now is None else now
    try:
        async with db.transaction() as session:
            row = await session.get(SweepTrial, (sweep_id, index))
            if row is not None:
                return row
            row = SweepTrial(sweep_id=sweep_id, index=index, params=params, job_id=job_id, state=state, reason=reason, created_at=now)
            session.add(row)
            return row
    except IntegrityError:
        again = await get_trial(db, sweep_id=sweep_id, index=index)
        if again is None:
            raise
        return again


async def sweep_trials(db: Database, sweep_id: str) -> list[tuple[SweepTrial, Job | None]]:
    """The sweep's recorded trials in index order, each with its job (None when refused)."""
    query = (
        select(SweepTrial, Job)
        .join(Job, col(Job.id) == col(SweepTrial.job_id), isouter=True)
        .where(col(SweepTrial.sweep_id) == sweep_id)
        .order_by(col(SweepTrial.index))
    )
    async with db.sessions() as session:
        return [(trial, job) for trial, job in (await session.execute(query)).all()]


async def set_trial_metrics(db: Database, *, sweep_id: str, index: int, metrics: dict[str, Any]) -> None:
    async with db.transaction() as session:
        await session.execute(
            update(SweepTrial).where(col(SweepTrial.sweep_id) == sweep_id, col(SweepTrial.index) == index).values(metrics=metrics)
        )
