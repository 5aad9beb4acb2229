"""Weighted Dominant Resource Fairness over GPU types, without aging, reservations or preemption."""

from __future__ import annotations

import heapq

from scheduler.core.types import Bind, Decisions, PendingJob, Snapshot
from simulator.policies.placement import FreeIndex, submitted


def _within_tenant(job: PendingJob) -> tuple[int, float, str]:
    """1. higher priority, 2. first submitted, 3. job id."""
    return (-job.priority, submitted(job), job.id)


class Drf:
    """Repeatedly offer GPUs to the tenant with the smallest weighted dominant share.

    A tenant's dominant share is its largest fraction of any one GPU type's schedulable
    GPUs (held now), divided by its weight. Ties: tenant name. A job that does not fit is
    skipped; the tenant's next job is tried.
    """

    def __init__(self) -> None:
        self.index = FreeIndex()

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        del now
        self.index.sync(snapshot)
        return _drf(snapshot, self.index)


def _drf(snapshot: Snapshot, index: FreeIndex) -> Decisions:
    capacity: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.schedulable:
            capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpu_count
    weight = {t.name: t.weight for t in snapshot.tenants}
    held: dict[str, dict[str, int]] = {}
    for r in snapshot.running:
        per = held.setdefault(r.tenant, {})
        per[r.gpu_type] = per.get(r.gpu_type, 0) + r.gpu_count
    queues: dict[str, list[PendingJob]] = {}
    for job in snapshot.pending:
        queues.setdefault(job.tenant, []).append(job)

    def share(tenant: str) -> float:
        per = held.get(tenant, {})
        dom = max((g / capacity[t] for t, g in per.items() if capacity.get(t)), default=0.0)
        return dom / weight.get(tenant, 1.0)

    heap = []
    for tenant, jobs in queues.items():
        jobs.sort(key=_within_tenant, reverse=True)
        heap.append((share(tenant), tenant))
    heapq.heapify(heap)
    binds: list[Bind] = []
    while heap:
        _, tenant = heapq.heappop(heap)
        jobs = queues[tenant]
        while jobs:
            job = jobs.pop()
            members = index.place(job)
            if members is not None:
                binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
                per = held.setdefault(tenant, {})
                per[job.gpu_type] = per.get(job.gpu_type, 0) + job.gpu_count
                break
        if jobs:
            heapq.heappush(heap, (share(tenant), tenant))
    return Decisions(binds=tuple(binds))
