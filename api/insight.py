"""What the API shows about the fleet, the queue and the tenants (SPEC R7), read from the store.

The same views feed ``/v1/fleet``, ``/v1/queue``, ``/v1/tenants``, ``/metrics`` and the
dashboard, so that they always agree; the API answers them from ``api.views`` (computed by a
view worker process, cached with the time they were computed). Queue-wait estimates (R7.2) come from
``simulator.estimate``: forward simulations of the current queue with the production core (one
``Scheduler`` across the forward steps) and the run times the snapshot reader learned
(``scheduler.runtimes``: the placement service's predictor): one raw forward simulation, calibrated by
the outcomes of earlier estimates (``api.estimates``), else (too few of them) once per error quantile of
that predictor (p10, p50, p90): a median start and an interval per waiting job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import ColumnClause, literal_column, select
from sqlmodel import col

from fairgang.liveness import RETIRED, node_schedulable
from fairgang.settings import Settings
from scheduler.core import Scheduler, Snapshot
from scheduler.core.cycle import build_cycle, queue_order
from scheduler.core.order import dominant_share
from scheduler.snapshot import SnapshotReader, build_snapshot, service_config
from simulator.calibrate import WaitCalibrator, calibrate_starts
from simulator.estimate import INTERVAL_QUANTILES, Policy, estimate_intervals, estimate_starts, scaled
from store.db import Database
from store.models import Allocation, AllocationGpu, Gpu, HealthEvent, Node

#: The forward simulation's grid (seconds between two policy calls) and its limits.
ESTIMATE_STEP_S = 30.0
ESTIMATE_MAX_STEPS = 400
#: The grid of the interval's low and high forward simulations (coarser: three simulations cost about two).
ESTIMATE_BOUND_STEP_S = 120.0
#: How far ahead the queue view looks.
ESTIMATE_HORIZON_S = 7 * 24 * 3600.0
#: A running job already past its expected end is taken to end this long from now.
OVERDUE_S = 60.0


@dataclass(frozen=True)
class QueueView:
    """The queue in scheduling order, with predicted starts."""

    #: Job id -> position in the scheduler's order (1 = next).
    position: dict[str, int]
    #: Job id -> predicted start (UNIX seconds), the median; absent: not within the estimator's horizon.
    estimated_start: dict[str, float]
    #: Job id -> the predicted start's interval (p10 and p90 of the run-time errors); absent: beyond the horizon.
    estimated_start_low: dict[str, float] = dataclasses.field(default_factory=dict)
    estimated_start_high: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Job id -> the raw forward-simulated start (learned run times, uncalibrated); absent: beyond the horizon.
    raw_start: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The jobs whose start was calibrated from earlier estimates' outcomes (the others': run-time quantiles).
    calibrated: frozenset[str] = frozenset()


async def snapshot_now(db: Database, settings: Settings, now: float, *, reader: SnapshotReader | None = None) -> Snapshot:
    """The snapshot the placement service would read now, under its policy (``service_config``) and with learned run
    times; a kept ``reader`` reads only what changed since its last read."""
    config = service_config(settings)
    if reader is None:
        snapshot = await build_snapshot(db, now=now, stale_after_s=settings.node_stale_after_s, config=config)
    else:
        snapshot = await reader.read(db, now=now, stale_after_s=settings.node_stale_after_s, config=config)
    return dataclasses.replace(snapshot, topology_levels=settings.topology_level_names() or snapshot.topology_levels)


async def queue_view(db: Database, settings: Settings, *, now: float | None = None) -> QueueView:
    """Positions and estimated starts of every waiting job (the forward simulation runs in a worker thread).

    Uncached: the API answers from ``api.views``, whose worker computes the queue itself (with a kept snapshot reader).
    """
    now = time.time() if now is None else now
    reader = SnapshotReader()
    snapshot = await snapshot_now(db, settings, now, reader=reader)
    return await asyncio.to_thread(estimate_queue, snapshot, reader.runtimes.predictor.quantiles(INTERVAL_QUANTILES), now)


def _policy() -> Policy:
    # One Scheduler across the forward steps of a simulation: each step changes a few jobs, not the fleet.
    return Scheduler().run_cycle


def raw_starts(
    snapshot: Snapshot, now: float, *, horizon_s: float = ESTIMATE_HORIZON_S, max_steps: int = ESTIMATE_MAX_STEPS
) -> dict[str, float]:
    """The raw forward simulation: each waiting job's first start with the learned run times as they are (a running
    job already past its expected end ends ``OVERDUE_S`` from now), on the queue view's grid (pure)."""
    return estimate_starts(
        scaled(snapshot, now, 1.0, overdue_s=OVERDUE_S),
        now,
        _policy(),
        step_s=ESTIMATE_STEP_S,
        horizon_s=horizon_s,
        max_steps=max_steps,
        overdue_s=OVERDUE_S,
    )


def estimate_queue(snapshot: Snapshot, ratios: tuple[float, ...], now: float, calibrator: WaitCalibrator | None = None) -> QueueView:
    """The queue's order and its predicted starts (pure; CPU-heavy at scale).

    ``snapshot`` carries the learned run times; ``ratios`` are the run-time predictor's error ratios at
    ``INTERVAL_QUANTILES`` (low, median, high). One raw forward simulation (:func:`raw_starts`); a job's median
    and interval are that start calibrated by ``calibrator`` (``simulator.calibrate.calibrated_start``: the earlier estimates'
    outcomes, as the simulator's estimator probe does) where it has samples enough for the job's band, else
    (cold start) the three forward simulations of ``estimate_intervals``, with remaining run times scaled by the
    run-time predictor's error quantiles (run only when some job needs them).
    """
    position = {job_id: pos for pos, job_id in enumerate(queue_order(snapshot, now), start=1)}
    raw = raw_starts(snapshot, now)
    done, rest = calibrate_starts(snapshot.pending, raw, now, calibrator)
    low = {job_id: lo for job_id, (lo, _, _) in done.items()}
    median = {job_id: m for job_id, (_, m, _) in done.items()}
    high = {job_id: hi for job_id, (_, _, hi) in done.items()}
    calibrated = set(done)
    if rest:
        intervals = estimate_intervals(
            snapshot,
            now,
            _policy,
            ratios=ratios,
            step_s=ESTIMATE_STEP_S,
            bound_step_s=ESTIMATE_BOUND_STEP_S,
            horizon_s=ESTIMATE_HORIZON_S,
            max_steps=ESTIMATE_MAX_STEPS,
            overdue_s=OVERDUE_S,
        )
        for job_id, (lo, m, hi) in intervals.items():
            if job_id in calibrated:
                continue
            if m is not None:
                median[job_id] = m
            if lo is not None:
                low[job_id] = lo
            if hi is not None:
                high[job_id] = hi
    return QueueView(
        position=position,
        estimated_start=median,
        estimated_start_low=low,
        estimated_start_high=high,
        raw_start={job_id: max(start, now) for job_id, start in raw.items()},
        calibrated=frozenset(calibrated),
    )


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
    levels = [level for level in settings.topology_level_names() if level != "node"]
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
