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

from sqlalchemy import func, not_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from fairgang.liveness import RETIRED
from fairgang.members import PlacedMember, members_of
from fairgang.spec import JobState
from store.common import LIVE_ALLOCATION_STATES, REVOKED
from store.models import Allocation, Gpu, Job, Node, Tenant


@dataclass(frozen=True)
class Rows:
    """One consistent read of what a cycle needs (each field a list of rows that unpack as plain tuples)."""

    #: (id, gpu_type, gpu_count, labels, state, last_heartbeat), by id.
    nodes: Sequence[Any]
    #: (node id, GPU rows, lowest index, highest index) per node with GPU rows.
    gpu_rows: Sequence[Any]
    #: (node id, index) of the GPUs out of service.
    unhealthy: Sequence[Any]
    #: (id, tenant, attempt, gpu_type, gpu_count, priority, queued_at, created_at, pending_reason, pending_code, gpu_max,
    #: predicted_attempt, predicted_runtime_s) by (queued_at, id).
    queued: Sequence[Any]
    #: (allocation id, job id, allocation attempt, created_at, tenant, gpu_type, priority, job attempt, started_at,
    #: latest_checkpoint_at) of the live (bound or acknowledged) allocations, by allocation id.
    live: Sequence[Any]
    #: Ids of the revoked allocations: no longer held for their agents, but their GPUs are not free yet.
    revoked: Sequence[str]
    #: (name, weight, cohort, quotas) by name.
    tenants: Sequence[Any]


NODE_COLUMNS = (
    col(Node.id),
    col(Node.gpu_type),
    col(Node.gpu_count),
    col(Node.labels),
    col(Node.state),
    col(Node.last_heartbeat),
    col(Node.freed_at),
    col(Node.registered_at),
    col(Node.address),
)
QUEUED_COLUMNS = (
    col(Job.id),
    col(Job.tenant),
    col(Job.attempt),
    col(Job.gpu_type),
    col(Job.gpu_count),
    col(Job.priority),
    col(Job.queued_at),
    col(Job.created_at),
    col(Job.pending_reason),
    col(Job.pending_code),
    col(Job.gpu_max),
    col(Job.predicted_attempt),
    col(Job.predicted_runtime_s),
)
LIVE_COLUMNS = (
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
    col(Allocation.resized_from),
)
TENANT_COLUMNS = (col(Tenant.name), col(Tenant.weight), col(Tenant.cohort), col(Tenant.quotas))


async def read_rows(session: AsyncSession) -> Rows:
    """Every row a cycle needs. The GPUs a live allocation holds are its members (``allocation_gpu`` holds the
    same GPUs, written in the same transaction), so the caller derives them from the members it keeps."""
    conn = await session.connection()  # Core execution: no ORM layer over plain column rows
    # A retired node is no part of the fleet: no capacity, not even in the fair shares' denominators.
    nodes = (await conn.execute(select(*NODE_COLUMNS).where(col(Node.state) != RETIRED).order_by(col(Node.id)))).all()
    gpu_rows = (
        await conn.execute(
            select(col(Gpu.node_id), func.count(), func.min(col(Gpu.index)), func.max(col(Gpu.index))).group_by(col(Gpu.node_id))
        )
    ).all()
    unhealthy = (await conn.execute(select(col(Gpu.node_id), col(Gpu.index)).where(not_(col(Gpu.healthy))))).all()
    queued_filter = (col(Job.state) == JobState.QUEUED.value, col(Job.workflow_started))
    queued = (await conn.execute(select(*QUEUED_COLUMNS).where(*queued_filter).order_by(col(Job.queued_at), col(Job.id)))).all()
    live_query = select(*LIVE_COLUMNS).join(Job, col(Job.id) == col(Allocation.job_id))
    live = (await conn.execute(live_query.where(col(Allocation.state).in_(LIVE_ALLOCATION_STATES)).order_by(col(Allocation.id)))).all()
    revoked = (await conn.execute(select(col(Allocation.id)).where(col(Allocation.state) == REVOKED))).scalars().all()
    tenants = (await conn.execute(select(*TENANT_COLUMNS).order_by(col(Tenant.name)))).all()
    return Rows(nodes=nodes, gpu_rows=gpu_rows, unhealthy=unhealthy, queued=queued, live=live, revoked=revoked, tenants=tenants)


async def gpu_indices(session: AsyncSession, node_ids: Sequence[str]) -> dict[str, list[int]]:
    """Node id -> indices of its GPU rows (for the rare node whose rows are not exactly 0..n-1)."""
    out: dict[str, list[int]] = {}
    query = select(col(Gpu.node_id), col(Gpu.index)).where(col(Gpu.node_id).in_(list(node_ids)))
    for node_id, index in (await session.execute(query)).all():
        out.setdefault(node_id, []).append(index)
    return out


async def job_specs(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Job id -> spec, for the given ids (read once per job by the caller, which keeps them)."""
    out: dict[str, dict[str, Any]] = {}
    ids = list(job_ids)
    for i in range(0, len(ids), 500):
        rows = (await session.execute(select(col(Job.id), col(Job.spec)).where(col(Job.id).in_(ids[i : i + 500])))).all()
        out.update({job_id: spec for job_id, spec in rows})
    return out


async def allocation_members(session: AsyncSession, allocation_ids: Sequence[str]) -> dict[str, list[PlacedMember]]:
    """Allocation id -> members (fixed once committed; read once per allocation by the caller)."""
    out: dict[str, list[PlacedMember]] = {}
    ids = list(allocation_ids)
    for i in range(0, len(ids), 500):
        query = select(col(Allocation.id), col(Allocation.members)).where(col(Allocation.id).in_(ids[i : i + 500]))
        out.update({alloc_id: members_of(members) for alloc_id, members in (await session.execute(query)).all()})
    return out
