"""Usage over a time window, per tenant and GPU type (what Slurm's sreport gives): GPU-hours used against
those guaranteed, the share of the fleet, jobs, waits, preemptions and GPU-hours lost, all from the store.

- GPU-hours used: every allocation's GPUs for the part of its life (commit to release; still held: to now)
  inside the window.
- Guaranteed: the tenant's nominal quota of the type (as configured now) for the window's length.
- Share of the fleet: used over the type's GPUs (the fleet's nodes now, retired ones left out) for the window.
- Jobs: submitted in the window. Waits: from submission to the first RUNNING, of jobs first RUNNING in it.
- Preemptions: PREEMPTING events in the window.
- GPU-hours lost: for each attempt that was queued again (preempted, its node lost, a retried failure), its
  GPUs from its last checkpoint (or its start, with none) to its release: the work its next attempt redoes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlmodel import col

from store.db import Database
from store.models import Allocation, Job, JobEvent, Node, Tenant
from store.usage import gpus_of

#: What a report can be grouped by.
GROUPS = ("tenant", "gpu_type")


@dataclass
class UsageRow:
    tenant: str | None
    gpu_type: str | None
    gpu_hours: float = 0.0
    guaranteed_gpu_hours: float = 0.0
    #: gpu_hours over the fleet's GPU-hours of the type(s) in the window (None: no such GPUs).
    fleet_share: float | None = None
    jobs: int = 0
    wait_p50_s: float | None = None
    wait_p90_s: float | None = None
    preemptions: int = 0
    gpu_hours_lost: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _overlap(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between the closest ranks (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def usage_report(
    db: Database, *, since: float, until: float, by: Sequence[str] = GROUPS, tenant: str | None = None, now: float | None = None
) -> list[UsageRow]:
    """One row per group (``by``: "tenant", "gpu_type", both, or neither for the total) with any use, quota,
    job or fleet share in [``since``, ``until``), of ``tenant`` only if given."""
    now = time.time() if now is None else now
    if until <= since:
        raise ValueError("until must be after since")
    unknown = set(by) - set(GROUPS)
    if unknown:
        raise ValueError(f"cannot group by {', '.join(sorted(unknown))} (one of {', '.join(GROUPS)})")
    hours = (until - since) / 3600.0
    async with db.sessions() as session:
        alloc_rows = (
            await session.execute(
                select(Allocation, col(Job.tenant), col(Job.gpu_type))
                .join(Job, col(Job.id) == col(Allocation.job_id))
                .where(col(Allocation.created_at) < until)
                .where((col(Allocation.released_at).is_(None)) | (col(Allocation.released_at) > since))
            )
        ).all()
        job_rows = (
            await session.execute(
                select(col(Job.tenant), col(Job.gpu_type), col(Job.created_at), col(Job.started_at)).where(
                    ((col(Job.created_at) >= since) & (col(Job.created_at) < until))
                    | ((col(Job.started_at) >= since) & (col(Job.started_at) < until))
                )
            )
        ).all()
        job_ids = sorted({a.job_id for a, _, _ in alloc_rows})
        events = (
            (
                await session.execute(
                    select(col(JobEvent.job_id), col(JobEvent.attempt), col(JobEvent.kind), col(JobEvent.ts)).where(
                        col(JobEvent.job_id).in_(job_ids), col(JobEvent.kind).in_(("CHECKPOINT", "REQUEUED", "PREEMPTING"))
                    )
                )
            ).all()
            if job_ids
            else []
        )
        quotas = (await session.execute(select(col(Tenant.name), col(Tenant.quotas)))).all()
        fleet = (await session.execute(select(col(Node.gpu_type), col(Node.gpu_count)).where(col(Node.state) != "RETIRED"))).all()

    def key(t: str, g: str) -> tuple[str | None, str | None]:
        return (t if "tenant" in by else None, g if "gpu_type" in by else None)

    rows: dict[tuple[str | None, str | None], UsageRow] = {}
    waits: dict[tuple[str | None, str | None], list[float]] = {}
    fleet_hours: dict[tuple[str | None, str | None], float] = {}

    def row(t: str, g: str) -> UsageRow:
        k = key(t, g)
        if k not in rows:
            rows[k] = UsageRow(tenant=k[0], gpu_type=k[1])
        return rows[k]

    def wanted(t: str) -> bool:
        return tenant is None or t == tenant

    requeued = {(job_id, attempt) for job_id, attempt, kind, _ in events if kind == "REQUEUED"}
    last_checkpoint: dict[tuple[str, int], float] = {}
    for job_id, attempt, kind, ts in events:
        if kind == "CHECKPOINT":
            last_checkpoint[(job_id, attempt)] = max(ts, last_checkpoint.get((job_id, attempt), ts))
    job_tenant: dict[str, tuple[str, str]] = {}
    for alloc, t, g in alloc_rows:
        job_tenant[alloc.job_id] = (t, g)
        if not wanted(t):
            continue
        gpus = gpus_of(alloc.members)
        end = now if alloc.released_at is None else alloc.released_at
        row(t, g).gpu_hours += gpus * _overlap(alloc.created_at, end, since, until) / 3600.0
        if (alloc.job_id, alloc.attempt) in requeued and alloc.released_at is not None:
            lost_from = max(alloc.created_at, last_checkpoint.get((alloc.job_id, alloc.attempt), alloc.created_at))
            row(t, g).gpu_hours_lost += gpus * _overlap(lost_from, alloc.released_at, since, until) / 3600.0
    for job_id, _, kind, ts in events:
        if kind == "PREEMPTING" and since <= ts < until and job_id in job_tenant and wanted(job_tenant[job_id][0]):
            row(*job_tenant[job_id]).preemptions += 1
    for t, g, created, started in job_rows:
        if not wanted(t):
            continue
        if since <= created < until:
            row(t, g).jobs += 1
        if started is not None and since <= started < until:
            waits.setdefault(key(t, g), []).append(started - created)
            row(t, g)
    for name, by_type in quotas:
        for g, quota in sorted((by_type or {}).items()):
            nominal = int((quota or {}).get("nominal") or 0)
            if wanted(name) and nominal:
                row(name, g).guaranteed_gpu_hours += nominal * hours
    capacity: dict[str, int] = {}
    for g, count in fleet:
        capacity[g] = capacity.get(g, 0) + count
    for k, r in rows.items():
        types = [k[1]] if k[1] is not None else sorted(capacity)
        fleet_hours[k] = sum(capacity.get(g, 0) for g in types if g is not None) * hours
        r.fleet_share = r.gpu_hours / fleet_hours[k] if fleet_hours[k] else None
        r.wait_p50_s, r.wait_p90_s = _quantile(waits.get(k, []), 0.5), _quantile(waits.get(k, []), 0.9)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0] or "", k[1] or ""))]
