"""What the API shows about the fleet, the queue and the tenants (SPEC R7), read from the store.

The same views feed ``/v1/fleet``, ``/v1/queue``, ``/v1/tenants``, ``/metrics`` and the
dashboard, so that they always agree; the API answers them from ``api.views`` (computed by a
view worker process, cached with the time they were computed). Queue-wait estimates (R7.2) come from
``simulator.estimate``: a forward simulation of the current queue with the production
core (one ``Scheduler`` across the forward steps) and expected run times learned per tenant and job name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import ColumnClause, literal_column, select
from sqlmodel import col

from fairgang.liveness import RETIRED, node_schedulable
from fairgang.settings import Settings
from scheduler.core import Scheduler, SchedulerConfig, Snapshot
from scheduler.core.cycle import build_cycle, queue_order
from scheduler.core.order import dominant_share
from scheduler.snapshot import SnapshotReader, build_snapshot
from simulator.estimate import queue_estimates
from store import jobs, observability
from store.db import Database
from store.models import Allocation, AllocationGpu, Gpu, HealthEvent, Node

#: How many of a (tenant, job name)'s latest successful runs its expected run time is learned from.
HISTORY_PER_KEY = 20
#: The forward simulation's grid (seconds between two policy calls) and its limits.
ESTIMATE_STEP_S = 30.0
ESTIMATE_MAX_STEPS = 400


def size_class(gpu_count: int) -> str:
    """A job's size class for metrics: one GPU, up to one node (8), or several nodes."""
    if gpu_count <= 1:
        return "1"
    return "2-8" if gpu_count <= 8 else "9+"


def learned_runtimes(history: Iterable[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    """(tenant, job name) -> the median run time of its latest successful runs (newest first in ``history``)."""
    runs: dict[tuple[str, str], list[float]] = {}
    for tenant, name, seconds in history:
        bucket = runs.setdefault((tenant, name), [])
        if len(bucket) < HISTORY_PER_KEY:
            bucket.append(seconds)
    return {key: float(statistics.median(values)) for key, values in runs.items()}


def with_expected_runtimes(snapshot: Snapshot, names: dict[str, tuple[str, str]], learned: dict[tuple[str, str], float]) -> Snapshot:
    """The snapshot with learned run times (capped by each job's max runtime) for waiting and running jobs."""
    pending = []
    for job in snapshot.pending:
        expected = learned.get(names.get(job.id, ("", "")))
        pending.append(job if expected is None else dataclasses.replace(job, expected_runtime_s=min(expected, job.max_runtime_s)))
    running = []
    for run in snapshot.running:
        expected = learned.get(names.get(run.id, ("", "")))
        end = run.expected_end if expected is None else min(run.expected_end, run.started_at + expected)
        running.append(dataclasses.replace(run, expected_end=end))
    return dataclasses.replace(snapshot, pending=tuple(pending), running=tuple(running))


@dataclass(frozen=True)
class QueueView:
    """The queue in scheduling order, with predicted starts."""

    #: Job id -> position in the scheduler's order (1 = next).
    position: dict[str, int]
    #: Job id -> predicted start (UNIX seconds); absent: not within the estimator's horizon.
    estimated_start: dict[str, float]


async def snapshot_now(db: Database, settings: Settings, now: float, *, reader: SnapshotReader | None = None) -> Snapshot:
    """The snapshot the placement service would read now; a kept ``reader`` reads only what changed since its last read."""
    if reader is None:
        snapshot = await build_snapshot(db, now=now, stale_after_s=settings.node_stale_after_s)
    else:
        snapshot = await reader.read(db, now=now, stale_after_s=settings.node_stale_after_s, config=SchedulerConfig())
    levels = tuple(level.strip() for level in settings.topology_levels.split(",") if level.strip())
    return dataclasses.replace(snapshot, topology_levels=levels or snapshot.topology_levels)


async def queue_view(db: Database, settings: Settings, *, now: float | None = None, snapshot: Snapshot | None = None) -> QueueView:
    """Positions and estimated starts of every waiting job (the forward simulation runs in a worker thread).

    Uncached: the API answers from ``api.views``, whose worker computes the queue itself (with a kept snapshot reader).
    """
    now = time.time() if now is None else now
    snapshot = snapshot or await snapshot_now(db, settings, now)
    names = await jobs.job_names(db, [j.id for j in snapshot.pending] + [r.id for r in snapshot.running])
    learned = learned_runtimes(await observability.finished_runtimes(db))
    return await asyncio.to_thread(estimate_queue, snapshot, names, learned, now)


def estimate_queue(snapshot: Snapshot, names: dict[str, tuple[str, str]], learned: dict[tuple[str, str], float], now: float) -> QueueView:
    """The queue's order and the forward simulation's predicted starts (pure; CPU-heavy at scale)."""
    snapshot = with_expected_runtimes(snapshot, names, learned)
    position = {job_id: pos for pos, job_id in enumerate(queue_order(snapshot, now), start=1)}
    # One Scheduler across the forward steps: each step changes a few jobs, not the fleet.
    estimates = queue_estimates(snapshot, now, Scheduler().run_cycle, step_s=ESTIMATE_STEP_S, max_steps=ESTIMATE_MAX_STEPS)
    return QueueView(position=position, estimated_start={e.job_id: max(e.start_at, now) for e in estimates if e.start_at is not None})


# ---------------------------------------------------------------- tenants


async def tenant_usage(
    db: Database, settings: Settings, *, now: float | None = None, snapshot: Snapshot | None = None
) -> list[dict[str, Any]]:
    """Per tenant: weight, cohort, per-type quota with used and borrowed GPUs, dominant share, running and waiting jobs."""
    now = time.time() if now is None else now
    snapshot = snapshot or await snapshot_now(db, settings, now)
    return tenant_usage_of(snapshot, settings, now)


def tenant_usage_of(snapshot: Snapshot, settings: Settings, now: float) -> list[dict[str, Any]]:
    """``tenant_usage`` of a snapshot (pure)."""
    cycle = build_cycle(snapshot, now)
    half_life = settings.usage_half_life_s
    waiting: dict[str, list[str]] = {}
    for job in sorted(snapshot.pending, key=lambda j: (j.queued_at, j.id)):
        waiting.setdefault(job.tenant, []).append(job.id)
    running: dict[str, list[str]] = {}
    for run in sorted(snapshot.running, key=lambda r: r.id):
        running.setdefault(run.tenant, []).append(run.id)
    out = []
    for tenant in snapshot.tenants:
        types = sorted({t for t, _ in tenant.quotas} | {r.gpu_type for r in snapshot.running if r.tenant == tenant.name})
        quotas: dict[str, dict[str, Any]] = {}
        for gpu_type in types:
            quota = dict(tenant.quotas).get(gpu_type)
            nominal = quota.nominal if quota else 0
            used = cycle.book.used(tenant.name, gpu_type)
            quotas[gpu_type] = {
                "guaranteed": nominal,
                "borrow_limit": quota.borrow_limit if quota else None,
                "used": used,
                "borrowed": max(0, used - nominal),
            }
        out.append(
            {
                "name": tenant.name,
                "weight": tenant.weight,
                "cohort": tenant.cohort,
                "quotas": quotas,
                "used_gpus": sum(q["used"] for q in quotas.values()),
                "guaranteed_gpus": sum(q["guaranteed"] for q in quotas.values()),
                "borrowed_gpus": sum(q["borrowed"] for q in quotas.values()),
                "dominant_share": round(dominant_share(cycle.book, tenant.name, cycle.capacity, half_life), 6),
                "running_jobs": running.get(tenant.name, []),
                "waiting_jobs": waiting.get(tenant.name, []),
            }
        )
    return out


# ---------------------------------------------------------------- fleet


#: ``allocation_gpu.live`` as a bare term, so that SQLite uses its partial index (as ``store.common.held`` does).
_LIVE: ColumnClause[Any] = literal_column(f"{AllocationGpu.__tablename__}.live")


class _GpuRow(NamedTuple):
    number: int
    healthy: bool
    health: dict[str, Any]


class _NodeRow(NamedTuple):
    id: str
    gpu_type: str
    gpu_count: int
    labels: dict[str, str]
    state: str
    last_heartbeat: float | None


#: The health event kinds of an admin's change of a node's state.
ADMIN_KINDS = ("cordon", "uncordon", "drain")


def _blank() -> dict[str, int]:
    return {"total": 0, "used": 0, "free": 0, "unhealthy": 0, "nodes": 0, "whole_nodes_free": 0, "stranded": 0}


async def fleet_view(db: Database, settings: Settings, *, now: float | None = None) -> dict[str, Any]:
    """Nodes with their GPUs, and per GPU type and per topology domain: total, used, free, unhealthy, fragmentation.

    Fragmentation of a group of nodes: ``stranded`` free GPUs sit on partly used nodes (no whole-node
    gang can use them), ``whole_nodes_free`` nodes are entirely free, and ``fragmentation`` is
    stranded / free (0: every free GPU is on a whole free node; 1: none is). Each node lists the jobs on it (and
    each GPU the job holding it), and is ``draining`` while it is cordoned by a drain with jobs still on it. Retired nodes are no part of
    the fleet: only their ids are listed (``retired``). Read as plain columns (no ORM objects: thousands of
    GPU rows).
    """
    now = time.time() if now is None else now
    async with db.sessions() as session:
        held = (
            select(col(AllocationGpu.node_id), col(AllocationGpu.gpu_index), col(AllocationGpu.allocation_id), col(Allocation.job_id))
            .join(Allocation, col(Allocation.id) == col(AllocationGpu.allocation_id))
            .where(_LIVE)
        )
        used: dict[tuple[str, int], str] = {}
        job_on: dict[tuple[str, int], str] = {}
        for n, i, a, j in (await session.execute(held)).all():
            used[(n, i)], job_on[(n, i)] = a, j
        # The latest of each node's admin state changes: a cordoned node whose latest was a drain is draining.
        admin = (
            select(col(HealthEvent.node_id), col(HealthEvent.kind))
            .where(col(HealthEvent.kind).in_(ADMIN_KINDS))
            .order_by(col(HealthEvent.id))
        )
        last_admin: dict[str, str] = {node_id: kind for node_id, kind in (await session.execute(admin)).all()}
        gpu_rows = select(col(Gpu.node_id), col(Gpu.index), col(Gpu.healthy), col(Gpu.health)).order_by(col(Gpu.node_id), col(Gpu.index))
        gpus_by_node: dict[str, list[_GpuRow]] = {}
        for node_id, index, healthy, health in (await session.execute(gpu_rows)).all():
            gpus_by_node.setdefault(node_id, []).append(_GpuRow(index, bool(healthy), health or {}))
        node_rows = select(
            col(Node.id), col(Node.gpu_type), col(Node.gpu_count), col(Node.labels), col(Node.state), col(Node.last_heartbeat)
        ).order_by(col(Node.id))
        node_list = [_NodeRow(*row) for row in (await session.execute(node_rows)).all()]
    nodes = []
    totals: dict[str, dict[str, int]] = {}
    domains: dict[str, dict[str, dict[str, Any]]] = {}
    levels = [level.strip() for level in settings.topology_levels.split(",") if level.strip() and level.strip() != "node"]
    retired = []
    for node in node_list:
        if node.state == RETIRED:
            retired.append(node.id)
            continue
        gpus = gpus_by_node.get(node.id, [])
        n_used = sum(1 for g in gpus if (node.id, g.number) in used)
        n_unhealthy = sum(1 for g in gpus if not g.healthy)
        schedulable = node_schedulable(node.state, node.last_heartbeat, now, settings.node_stale_after_s)
        n_free = sum(1 for g in gpus if g.healthy and (node.id, g.number) not in used) if schedulable else 0
        utilisation = [float(g.health["utilization_pct"]) for g in gpus if isinstance(g.health.get("utilization_pct"), int | float)]
        nodes.append(
            {
                "id": node.id,
                "gpu_type": node.gpu_type,
                "gpu_count": node.gpu_count,
                "labels": node.labels,
                "state": node.state,
                "schedulable": schedulable,
                "last_heartbeat": node.last_heartbeat,
                "gpus": {"used": n_used, "free": n_free, "unhealthy": n_unhealthy},
                "utilization_pct": round(sum(utilisation) / len(utilisation), 1) if utilisation else None,
                "draining": node.state == "CORDONED" and last_admin.get(node.id) == "drain" and n_used > 0,
                "allocations": sorted({used[(node.id, g.number)] for g in gpus if (node.id, g.number) in used}),
                "jobs": sorted({job_on[(node.id, g.number)] for g in gpus if (node.id, g.number) in job_on}),
                "gpu_health": [
                    {"index": g.number, "healthy": g.healthy, **g.health, "job_id": job_on.get((node.id, g.number))} for g in gpus
                ],
            }
        )
        groups = [totals.setdefault(node.gpu_type, _blank())]
        for level in levels:
            domain = node.labels.get(level)
            if domain is not None:
                entry = domains.setdefault(level, {}).setdefault(domain, {"gpu_types": [], **_blank()})
                if node.gpu_type not in entry["gpu_types"]:
                    entry["gpu_types"].append(node.gpu_type)
                groups.append(entry)
        for t in groups:
            t["total"] += node.gpu_count
            t["used"] += n_used
            t["free"] += n_free
            t["unhealthy"] += n_unhealthy
            t["nodes"] += 1
            t["whole_nodes_free"] += int(n_free == node.gpu_count and n_free > 0)
            t["stranded"] += n_free if 0 < n_free < node.gpu_count else 0
    for group in [*totals.values(), *(d for per_level in domains.values() for d in per_level.values())]:
        group["fragmentation"] = round(group["stranded"] / group["free"], 4) if group["free"] else 0.0
    for per_level in domains.values():
        for entry in per_level.values():
            entry["gpu_types"].sort()
    return {
        "gpu_types": totals,
        "domains": {lvl: dict(sorted(d.items())) for lvl, d in sorted(domains.items())},
        "nodes": nodes,
        "retired": retired,
    }
