"""Decayed GPU usage per tenant and GPU type, kept as running sums (no history scan).

A tenant's decayed usage of a GPU type at time ``T`` with half-life ``h`` is the integral over its
allocations of ``g * 2^(-(T - s) / h)`` for every second ``s`` an allocation of ``g`` GPUs was held.
Anchored at a reference time ``R``, with ``E(x) = 2^((x - R) / h)``, it is

    U(T) = h / ln 2 * (2^(-(T - R) / h) * (closed - live_start) + live_gpus)

where ``closed`` sums ``g * (E(end) - E(start))`` over released allocations, ``live_start`` sums
``g * E(start)`` and ``live_gpus`` sums ``g`` over allocations still holding GPUs. Each term only
ever grows or shrinks by one allocation's amount, in the transaction that creates or releases it,
so the three sums stay exact whatever order allocations start and end in. ``R`` moves forward
(every sum rescaled) before ``E`` could grow large.

One ledger per half-life in use (``usage_ledger``), one account per (half-life, tenant, GPU type)
(``usage_account``). A half-life met for the first time is built from the allocation rows once
(:func:`ensure_ledger`); from then on the store keeps it current (:func:`allocation_started`,
:func:`allocation_released`). :func:`from_history` is the same number integrated from every
allocation row, for the tests that hold the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from store.db import Database
from store.models import Allocation, ChangeFeed, Job, UsageAccount, UsageLedger

#: Move the reference time forward once the newest events are this many half-lives past it.
REANCHOR_AFTER_HALF_LIVES = 64.0


@dataclass(frozen=True)
class Held:
    """One allocation as the ledger sees it: whose, which type, how many GPUs, from when to when (None: still held)."""

    tenant: str
    gpu_type: str
    gpus: int
    start: float
    end: float | None


def _e(x: float, ref: float, half_life: float) -> float:
    return 2.0 ** ((x - ref) / half_life)


def decayed(*, closed: float, live_start: float, live_gpus: int, ref: float, half_life: float, now: float) -> float:
    """An account's decayed GPU-seconds at ``now``."""
    if half_life <= 0:
        return 0.0
    value = half_life / math.log(2) * (2.0 ** (-(now - ref) / half_life) * (closed - live_start) + live_gpus)
    return max(0.0, value)


def integrate(rows: Iterable[Held], *, half_life: float, now: float) -> dict[str, dict[str, float]]:
    """Tenant -> GPU type -> decayed GPU-seconds at ``now``, integrated allocation by allocation (the reference)."""
    out: dict[str, dict[str, float]] = {}
    if half_life <= 0:
        return out
    for row in rows:
        if not row.gpus:
            continue
        end = now if row.end is None else min(row.end, now)
        start = min(row.start, end)
        weight = half_life / math.log(2) * (2 ** (-(now - end) / half_life) - 2 ** (-(now - start) / half_life))
        per_type = out.setdefault(row.tenant, {})
        per_type[row.gpu_type] = per_type.get(row.gpu_type, 0.0) + row.gpus * weight
    return out


async def held_allocations(session: AsyncSession) -> list[Held]:
    """Every allocation ever made, with its job's tenant and GPU type (one pass over the history)."""
    query = select(
        col(Job.tenant), col(Job.gpu_type), col(Allocation.members), col(Allocation.created_at), col(Allocation.released_at)
    ).join(Job, col(Job.id) == col(Allocation.job_id))
    rows = (await session.execute(query)).all()
    return [Held(t, g, gpus_of(m), float(c), None if r is None else float(r)) for t, g, m, c, r in rows]


def gpus_of(members: Sequence[dict[str, Any]]) -> int:
    return sum(len(m["gpu_indices"]) for m in members)


async def from_history(db: Database, *, half_life: float, now: float) -> dict[str, dict[str, float]]:
    """Decayed usage integrated from every allocation row (what the ledger must equal)."""
    async with db.sessions() as session:
        rows = await held_allocations(session)
    return integrate(rows, half_life=half_life, now=now)


async def _ledgers(session: AsyncSession) -> list[UsageLedger]:
    """The ledgers kept, read under the change feed's row lock.

    Every writer of allocations and :func:`ensure_ledger` take that lock first, so a ledger being built
    and an allocation being written are ordered: the allocation is either in the rows the build reads
    or applied to the built ledger.
    """
    await session.execute(select(col(ChangeFeed.version)).where(col(ChangeFeed.id) == 1).with_for_update())
    return list((await session.execute(select(UsageLedger))).scalars().all())


async def _account(session: AsyncSession, half_life: float, tenant: str, gpu_type: str) -> UsageAccount:
    account = await session.get(UsageAccount, (half_life, tenant, gpu_type))
    if account is None:
        account = UsageAccount(half_life_s=half_life, tenant=tenant, gpu_type=gpu_type)
        session.add(account)
    return account


async def _reanchor(session: AsyncSession, ledger: UsageLedger, at: float) -> None:
    """Move the ledger's reference time to ``at`` if events have drifted far past it (all sums rescaled)."""
    if (at - ledger.ref_t) / ledger.half_life_s < REANCHOR_AFTER_HALF_LIVES:
        return
    factor = 2.0 ** (-(at - ledger.ref_t) / ledger.half_life_s)
    query = select(UsageAccount).where(col(UsageAccount.half_life_s) == ledger.half_life_s)
    for account in (await session.execute(query)).scalars().all():
        account.closed *= factor
        account.live_start *= factor
    ledger.ref_t = at


async def allocation_started(session: AsyncSession, *, tenant: str, gpu_type: str, gpus: int, start: float) -> None:
    """Count a new allocation in every ledger, inside the transaction that creates it."""
    if not gpus:
        return
    for ledger in await _ledgers(session):
        await _reanchor(session, ledger, start)
        account = await _account(session, ledger.half_life_s, tenant, gpu_type)
        account.live_start = (account.live_start or 0.0) + gpus * _e(start, ledger.ref_t, ledger.half_life_s)
        account.live_gpus = (account.live_gpus or 0) + gpus


async def allocation_released(session: AsyncSession, *, tenant: str, gpu_type: str, gpus: int, start: float, end: float) -> None:
    """Move a released allocation from live to closed in every ledger, inside the transaction that releases it."""
    if not gpus:
        return
    start = min(start, end)
    for ledger in await _ledgers(session):
        await _reanchor(session, ledger, end)
        account = await _account(session, ledger.half_life_s, tenant, gpu_type)
        e_start = _e(start, ledger.ref_t, ledger.half_life_s)
        account.live_start = (account.live_start or 0.0) - gpus * e_start
        account.live_gpus = (account.live_gpus or 0) - gpus
        account.closed = (account.closed or 0.0) + gpus * (_e(end, ledger.ref_t, ledger.half_life_s) - e_start)


async def ensure_ledger(db: Database, *, half_life: float, now: float) -> None:
    """Start keeping a ledger for ``half_life`` if none is kept yet: built once from the allocation rows.

    Done under the change feed's row lock (see :func:`_ledgers`), so an allocation created or released
    meanwhile is either in the rows read here or applied to the ledger after it exists, never both,
    never neither.
    """
    if half_life <= 0:
        return
    async with db.sessions() as session:
        if await session.get(UsageLedger, half_life) is not None:
            return
    async with db.transaction() as session:
        await _ledgers(session)  # takes the lock: writers of allocations wait for this build
        if await session.get(UsageLedger, half_life) is not None:
            return
        ledger = UsageLedger(half_life_s=half_life, ref_t=now)
        session.add(ledger)
        accounts: dict[tuple[str, str], UsageAccount] = {}
        for row in await held_allocations(session):
            if not row.gpus:
                continue
            account = accounts.get((row.tenant, row.gpu_type))
            if account is None:
                account = accounts[(row.tenant, row.gpu_type)] = UsageAccount(
                    half_life_s=half_life, tenant=row.tenant, gpu_type=row.gpu_type
                )
            e_start = _e(min(row.start, row.end if row.end is not None else row.start), now, half_life)
            if row.end is None:
                account.live_start += row.gpus * e_start
                account.live_gpus += row.gpus
            else:
                account.closed += row.gpus * (_e(row.end, now, half_life) - e_start)
        session.add_all(accounts.values())


async def rebuild(db: Database, *, now: float) -> None:
    """Rebuild every ledger kept from the allocation rows (after rows were written around the store's functions)."""
    async with db.transaction() as session:
        ledgers = await _ledgers(session)
        half_lives = [ledger.half_life_s for ledger in ledgers]
        for ledger in ledgers:
            await session.delete(ledger)
        for account in (await session.execute(select(UsageAccount))).scalars().all():
            await session.delete(account)
    for half_life in half_lives:
        await ensure_ledger(db, half_life=half_life, now=now)


async def usage(db: Database, *, half_life: float, now: float) -> dict[str, dict[str, float]]:
    """Tenant -> GPU type -> decayed GPU-seconds at ``now``, from the ledger (built first if this half-life is new)."""
    if half_life <= 0:
        return {}
    query = select(
        col(UsageAccount.tenant),
        col(UsageAccount.gpu_type),
        col(UsageAccount.closed),
        col(UsageAccount.live_start),
        col(UsageAccount.live_gpus),
    ).where(col(UsageAccount.half_life_s) == half_life)
    async with db.sessions() as session:
        ledger = await session.get(UsageLedger, half_life)
        rows = (await session.execute(query)).all() if ledger is not None else []
    if ledger is None:  # a half-life met for the first time: build its ledger from the history, then read it
        await ensure_ledger(db, half_life=half_life, now=now)
        return await usage(db, half_life=half_life, now=now)
    out: dict[str, dict[str, float]] = {}
    for tenant, gpu_type, closed, live_start, live_gpus in rows:
        value = decayed(closed=closed, live_start=live_start, live_gpus=live_gpus, ref=ledger.ref_t, half_life=half_life, now=now)
        if value > 0.0:
            out.setdefault(tenant, {})[gpu_type] = value
    return out
