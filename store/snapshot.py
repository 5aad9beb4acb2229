"""The placement service's reads: plain column selects over the rows a scheduling cycle needs.

No ORM objects and no job spec in the hot path: a queued job's or an allocation's fixed parts
(its spec's topology and limits, an allocation's members) are read once by id
(:func:`job_specs`, :func:`allocation_members`) and kept by the caller. Every query here reads
one small, indexed slice of its table (queued jobs, live allocations), never the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from fairgang.spec import JobState
from store.models import Allocation, AllocationGpu, Gpu, Job, Node, Tenant
from store.repo import LIVE_ALLOCATION_STATES


@dataclass(frozen=True)
class Rows:
    """One consistent read of what a cycle needs (each field a list of plain tuples)."""

    #: (id, gpu_type, gpu_count, labels, state, last_heartbeat), by id.
    nodes: list[tuple[str, str, int, dict[str, str], str, float | None]]
    #: (node id, index) of the healthy GPUs.
    healthy: list[tuple[str, int]]
    #: (node id, index) held by a live allocation (a revoked one included: its GPUs are still held).
    held: list[tuple[str, int]]
    #: (id, tenant, attempt, gpu_type, gpu_count, priority, queued_at, created_at, pending_reason) by (queued_at, id).
    queued: list[tuple[str, str, int, str, int, int, float, float, str | None]]
    #: (allocation id, job id, allocation attempt, created_at, tenant, gpu_type, priority, job attempt, started_at,
    #: latest_checkpoint_at) of the live (bound or acknowledged) allocations, by allocation id.
    live: list[tuple[str, str, int, float, str, str, int, int, float | None, float | None]]
    #: (name, weight, cohort, quotas) by name.
    tenants: list[tuple[str, float, str | None, dict[str, Any]]]


async def read_rows(session: AsyncSession) -> Rows:
    nodes = (
        await session.execute(
            select(
                col(Node.id), col(Node.gpu_type), col(Node.gpu_count), col(Node.labels), col(Node.state), col(Node.last_heartbeat)
            ).order_by(col(Node.id))
        )
    ).all()
    healthy = (await session.execute(select(col(Gpu.node_id), col(Gpu.index)).where(col(Gpu.healthy)))).all()
    held = (await session.execute(select(col(AllocationGpu.node_id), col(AllocationGpu.gpu_index)).where(col(AllocationGpu.live)))).all()
    queued = (
        await session.execute(
            select(
                col(Job.id),
                col(Job.tenant),
                col(Job.attempt),
                col(Job.gpu_type),
                col(Job.gpu_count),
                col(Job.priority),
                col(Job.queued_at),
                col(Job.created_at),
                col(Job.pending_reason),
            )
            .where(col(Job.state) == JobState.QUEUED.value, col(Job.workflow_started))
            .order_by(col(Job.queued_at), col(Job.id))
        )
    ).all()
    live = (
        await session.execute(
            select(
                col(Allocation.id),
                col(Allocation.job_id),
                col(Allocation.attempt),
                col(Allocation.created_at),
                col(Job.tenant),
                col(Job.gpu_type),
                col(Job.priority),
                col(Job.attempt),
                col(Job.started_at),
                col(Job.latest_checkpoint_at),
            )
            .join(Job, col(Job.id) == col(Allocation.job_id))
            .where(col(Allocation.state).in_(LIVE_ALLOCATION_STATES))
            .order_by(col(Allocation.id))
        )
    ).all()
    tenant_columns = (col(Tenant.name), col(Tenant.weight), col(Tenant.cohort), col(Tenant.quotas))
    tenants = (await session.execute(select(*tenant_columns).order_by(col(Tenant.name)))).all()
    return Rows(
        nodes=[tuple(r) for r in nodes],
        healthy=[tuple(r) for r in healthy],
        held=[tuple(r) for r in held],
        queued=[tuple(r) for r in queued],
        live=[tuple(r) for r in live],
        tenants=[tuple(r) for r in tenants],
    )


async def job_specs(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Job id -> spec, for the given ids (read once per job by the caller, which keeps them)."""
    out: dict[str, dict[str, Any]] = {}
    ids = list(job_ids)
    for i in range(0, len(ids), 500):
        rows = (await session.execute(select(col(Job.id), col(Job.spec)).where(col(Job.id).in_(ids[i : i + 500])))).all()
        out.update({job_id: spec for job_id, spec in rows})
    return out


async def allocation_members(session: AsyncSession, allocation_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Allocation id -> members (fixed once committed; read once per allocation by the caller)."""
    out: dict[str, list[dict[str, Any]]] = {}
    ids = list(allocation_ids)
    for i in range(0, len(ids), 500):
        query = select(col(Allocation.id), col(Allocation.members)).where(col(Allocation.id).in_(ids[i : i + 500]))
        out.update({alloc_id: members for alloc_id, members in (await session.execute(query)).all()})
    return out
