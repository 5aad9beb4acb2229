"""The placement service's long-lived snapshot path decides exactly as a snapshot built from scratch.

From scratch is the way the service used to build every cycle's snapshot: every row as an ORM object
and decayed usage integrated from every allocation row.

Random walks over a real store (SQLite and PostgreSQL) through the store's own functions: arrivals,
binds (committed as the service commits them), runs, checkpoints, ends, requeues, GPU faults and
returns, cordons, quota and weight changes, time passing (the usage ledger re-anchors), and restarts of
the service (a new reader and core). At every cycle the long-lived reader and core, and the from-scratch build with a fresh core,
must give equal snapshots
(usage to rounding) and equal decisions; and the ledger must equal the integral.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random

import pytest
from sqlalchemy import delete, select
from sqlmodel import col

from fairgang.cluster import ClusterConfig
from fairgang.members import PlacedMember
from fairgang.spec import JobState
from scheduler.core import (
    Member,
    NodeView,
    PendingJob,
    Quota,
    RunningJob,
    RuntimePredictor,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    TenantView,
)
from scheduler.runtimes import LearnedRuntimes
from scheduler.service import LEASE_NAME, commit
from scheduler.snapshot import SnapshotReader
from store import common, health, jobs, placement, usage
from store import nodes as stored_nodes
from store import tenants as stored_tenants
from store.db import Database
from store.models import Allocation, Gpu, Job, JobEvent
from tests.builders import job_spec
from tests.conftest import small_cluster

HALF_LIFE = 600.0
CONFIG = SchedulerConfig(
    usage_half_life_s=HALF_LIFE, min_runtime_before_preempt_s=60.0, elastic_grow_idle_s=60.0, elastic_resize_interval_s=120.0
)
STALE = 1e12


#: Resizes each walk committed (the walks as a whole must commit some: see the last test).
WALK_RESIZES: list[int] = []


async def _from_scratch(db: Database, *, now: float, stale_after_s: float, config: SchedulerConfig) -> Snapshot:
    """The snapshot as the placement service used to build it every cycle: every row as an ORM object, usage
    integrated from every allocation (here without the old 8-half-life horizon, which the ledger does not have),
    and run times predicted by a predictor fed every successful run afresh."""
    predictor = RuntimePredictor()
    async with db.sessions() as session:
        ended = select(JobEvent, Job).join(Job, col(Job.id) == col(JobEvent.job_id)).where(col(JobEvent.kind) == "SUCCEEDED")
        for _, done in (await session.execute(ended.order_by(col(JobEvent.id)))).all():
            if done.state == "SUCCEEDED" and done.started_at is not None and done.finished_at is not None:
                limit = float(done.spec["max_runtime"])
                predictor.observe(((done.tenant, done.name), (done.tenant,)), done.finished_at - done.started_at, limit)
    used = {(g.node_id, g.gpu_index) for g in await placement.live_allocation_gpus(db)}
    healthy: dict[str, set[int]] = {}
    for gpu in await stored_nodes.list_gpus(db):
        if gpu.healthy:
            healthy.setdefault(gpu.node_id, set()).add(gpu.index)
    nodes = []
    for node in await stored_nodes.list_nodes(db):
        fresh = node.last_heartbeat is not None and now - node.last_heartbeat <= stale_after_s
        free = frozenset(i for i in healthy.get(node.id, set()) if (node.id, i) not in used and i < node.gpu_count)
        labels = tuple(sorted(node.labels.items()))
        schedulable = node.state == "READY" and fresh
        nodes.append(
            NodeView(
                id=node.id,
                gpu_type=node.gpu_type,
                gpu_count=node.gpu_count,
                labels=labels,
                free=free,
                schedulable=schedulable,
                free_since=node.freed_at if node.freed_at is not None else node.registered_at,
            )
        )
    pending = []
    for job in await jobs.queued_jobs(db):
        topology = job.spec.get("topology") or {}
        pending.append(
            PendingJob(
                id=job.id,
                tenant=job.tenant,
                attempt=job.attempt,
                gpu_type=job.gpu_type,
                gpu_count=job.gpu_count,
                priority=job.priority,
                queued_at=job.queued_at,
                topology_level=topology.get("level", "any"),
                topology_required=topology.get("mode", "required") == "required",
                max_runtime_s=float(job.spec.get("max_runtime") or 3600.0),
                # The attempt's stored prediction; until one is stored, the predictor's.
                expected_runtime_s=job.predicted_runtime_s
                if job.predicted_attempt == job.attempt and job.predicted_runtime_s is not None
                else predictor.predict(((job.tenant, job.name), (job.tenant,)), float(job.spec["max_runtime"])),
                preemptible=bool(job.spec.get("preemptible", True)),
                submitted_at=job.created_at,
                gpu_max=job.gpu_max,
            )
        )
    async with db.sessions() as session:
        query = select(Allocation, Job).join(Job, col(Job.id) == col(Allocation.job_id)).order_by(col(Allocation.id))
        alloc_rows = (await session.execute(query)).all()
    decayed: dict[str, dict[str, float]] = {}
    running = []
    half_life = config.usage_half_life_s
    for alloc, job in alloc_rows:
        gpus = sum(len(m["gpu_indices"]) for m in alloc.members)
        end = now if alloc.released_at is None else min(alloc.released_at, now)
        start = min(alloc.created_at, end)
        weight = half_life / math.log(2) * (2 ** (-(now - end) / half_life) - 2 ** (-(now - start) / half_life))
        if gpus and weight > 0:
            per_type = decayed.setdefault(job.tenant, {})
            per_type[job.gpu_type] = per_type.get(job.gpu_type, 0.0) + gpus * weight
        if alloc.state not in common.LIVE_ALLOCATION_STATES:
            continue
        started = job.started_at if job.started_at is not None and job.attempt == alloc.attempt else alloc.created_at
        members = tuple(Member(node_id=m["node_id"], gpu_indices=tuple(m["gpu_indices"]), rank=m["rank"]) for m in alloc.members)
        count = job.spec["gpu_count"]
        topology = job.spec.get("topology") or {}
        limit = float(job.spec["max_runtime"])
        running.append(
            RunningJob(
                id=job.id,
                tenant=job.tenant,
                attempt=alloc.attempt,
                gpu_type=job.gpu_type,
                gpu_count=gpus,
                priority=job.priority,
                members=members,
                started_at=started,
                expected_end=started + predictor.predict(((job.tenant, job.name), (job.tenant,)), limit, max(0.0, now - started)),
                max_end=started + limit,
                last_checkpoint_at=job.latest_checkpoint_at if job.attempt == alloc.attempt else None,
                preemptible=bool(job.spec.get("preemptible", True)),
                gpu_min=count["min"] if isinstance(count, dict) else None,
                gpu_max=count["max"] if isinstance(count, dict) else None,
                topology_level=topology.get("level", "any"),
                topology_required=topology.get("mode", "required") == "required",
                resized_at=alloc.created_at if alloc.resized_from is not None else None,
            )
        )
    tenants = tuple(
        TenantView(
            name=t.name,
            weight=t.weight,
            cohort=t.cohort,
            quotas=tuple(
                (gpu_type, Quota(nominal=int(q.get("nominal") or 0), borrow_limit=q.get("borrow_limit"), lend_limit=q.get("lend_limit")))
                for gpu_type, q in sorted(t.quotas.items())
            ),
            decayed_usage=tuple(sorted(decayed.get(t.name, {}).items())),
        )
        for t in await stored_tenants.list_tenants(db)
    )
    return Snapshot(nodes=tuple(nodes), pending=tuple(pending), tenants=tenants, running=tuple(running), config=config)


def _without_usage(snapshot: Snapshot) -> Snapshot:
    return dataclasses.replace(snapshot, tenants=tuple(dataclasses.replace(t, decayed_usage=()) for t in snapshot.tenants))


def _assert_usage_close(a: Snapshot, b: Snapshot) -> None:
    for ta, tb in zip(a.tenants, b.tenants, strict=True):
        da, db_ = dict(ta.decayed_usage), dict(tb.decayed_usage)
        for gpu_type in set(da) | set(db_):
            assert math.isclose(da.get(gpu_type, 0.0), db_.get(gpu_type, 0.0), rel_tol=1e-9, abs_tol=1e-6), (ta.name, gpu_type)


def _changed_cluster(rng: random.Random) -> ClusterConfig:
    raw = small_cluster().model_dump(mode="json")
    for tenant in raw["tenants"]:
        tenant["weight"] = rng.choice([0.5, 1.0, 2.0])
        tenant["quotas"]["H100-80GB"]["nominal"] = rng.choice([0, 4, 8, 12])
        tenant["max_runtime"] = int(tenant["max_runtime"])
    return ClusterConfig.model_validate(raw)


async def _walk(db: Database, seed: int, steps: int) -> int:
    rng = random.Random(seed)
    now = 1_000_000.0
    for node_id, gpu_type, count in (("h1", "H100-80GB", 8), ("h2", "H100-80GB", 8), ("g1", "L40S", 4)):
        await stored_nodes.register_node(db, node_id=node_id, gpu_type=gpu_type, gpu_count=count, labels={}, boot_id="b", gpus=[], now=now)
    # A node whose GPU rows are not 0..n-1 (a store from before registration checked the inventory).
    await stored_nodes.enrol_node(db, node_id="x1", gpu_type="L40S", gpu_count=4, labels={}, now=now)
    async with db.transaction() as session:
        await session.execute(delete(Gpu).where(col(Gpu.node_id) == "x1", col(Gpu.index).in_([1, 3])))
    await stored_nodes.register_node(
        db, node_id="x1", gpu_type="L40S", gpu_count=4, labels={"leaf": "l2"}, boot_id="b", gpus=[{"index": 0}, {"index": 2}], now=now
    )
    reader, core = SnapshotReader(runtimes=LearnedRuntimes(refresh_s=0.0)), Scheduler()
    compared = 0
    serial = 0
    resized = 0
    for _ in range(steps):
        action = rng.choices(
            ["arrive", "cycle", "run", "checkpoint", "end", "revoke", "requeue", "fault", "cordon", "quota", "restart", "wait"],
            weights=[5, 6, 3, 2, 3, 1, 1, 1, 1, 1, 1, 2],
        )[0]
        now += rng.uniform(1.0, 3 * HALF_LIFE if action == "wait" else 120.0)
        if action == "arrive":
            for _ in range(rng.randint(1, 3)):
                serial += 1
                gpu_type, counts = rng.choice(
                    [("H100-80GB", [1, 2, 4, 8, 16, {"min": 8, "max": 16}]), ("L40S", [1, 2, 4, {"min": 1, "max": 4}])]
                )
                spec = job_spec(
                    name=f"j{serial}",
                    gpu_type=gpu_type,
                    gpu_count=rng.choice(counts),
                    priority_class=rng.choice(["low", "normal", "high"]),
                    max_runtime=rng.choice(["10m", "1h", "4h"]),
                    preemptible=rng.random() < 0.8,
                )
                job, _ = await jobs.create_job(db, spec=spec, tenant=rng.choice(["alpha", "beta"]), now=now)
                await jobs.mark_queued(db, job_id=job.id, attempt=1, now=now)
        elif action == "cycle":
            kept = await reader.read(db, now=now, stale_after_s=STALE, config=CONFIG)
            fresh = await _from_scratch(db, now=now, stale_after_s=STALE, config=CONFIG)
            assert _without_usage(kept) == _without_usage(fresh)
            _assert_usage_close(kept, fresh)
            decided = core.run_cycle(kept, now)
            assert decided == Scheduler().run_cycle(fresh, now)
            compared += 1
            epoch = await placement.acquire_lease(db, name=LEASE_NAME, holder="walk", ttl_s=1e9, now=now)
            assert epoch is not None
            await commit(db, decided, reader, epoch=epoch, now=now)  # as the placement service commits
            for resize in decided.resizes:  # as the workflow commits a resize once its members stopped
                if rng.random() < 0.7:
                    members = [PlacedMember(node_id=m.node_id, gpu_indices=list(m.gpu_indices), rank=m.rank) for m in resize.members]
                    alloc_id = reader.allocation_ids[resize.job_id]
                    with contextlib.suppress(placement.ResizeRefused):
                        await placement.resize_allocation(
                            db,
                            job_id=resize.job_id,
                            attempt=resize.attempt,
                            allocation_id=alloc_id,
                            members=members,
                            reason="walk",
                            now=now,
                        )
                        resized += 1
        else:
            running = [j for j in await jobs.list_jobs(db, limit=1000) if j.state in ("PLACED", "RUNNING")]
            if action == "run" and running:
                job = rng.choice(running)
                await jobs.record_transition(
                    db, job_id=job.id, attempt=job.attempt, state=JobState.RUNNING, event_key=f"r{job.attempt}", now=now
                )
            elif action == "checkpoint" and running:
                job = rng.choice(running)
                await jobs.set_latest_checkpoint(db, job_id=job.id, checkpoint=f"/ckpt/{job.id}/{now}", now=now)
            elif action == "end" and running:
                job = rng.choice(running)
                state = rng.choice([JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
                await jobs.record_transition(db, job_id=job.id, attempt=job.attempt, state=state, event_key="end", now=now)
            elif action == "revoke" and running:
                job = rng.choice(running)
                live = [a for a in await jobs.job_allocations(db, job.id) if a.state in common.LIVE_ALLOCATION_STATES]
                if live:
                    await placement.revoke_allocation(db, job_id=job.id, allocation_id=live[-1].id, reason="walk", now=now)
            elif action == "requeue" and running:
                job = rng.choice(running)
                await jobs.requeue_job(db, job_id=job.id, from_attempt=job.attempt, reason="preempted: walk", now=now)
            elif action == "fault":
                node_id = rng.choice(["h1", "h2", "g1"])
                await health.set_gpu_health(db, node_id=node_id, index=rng.randrange(4), healthy=rng.random() < 0.5)
            elif action == "cordon":
                await stored_nodes.set_node_state(db, node_id=rng.choice(["h1", "h2", "g1"]), state=rng.choice(["CORDONED", "READY"]))
            elif action == "quota":
                await stored_tenants.seed_cluster(db, _changed_cluster(rng), now=now)
            elif action == "restart":
                reader, core = SnapshotReader(runtimes=LearnedRuntimes(refresh_s=0.0)), Scheduler()
        # The ledger equals the integral over every allocation at any moment.
        await _assert_ledger_is_the_integral(db, HALF_LIFE, now)
    WALK_RESIZES.append(resized)
    return compared


async def _assert_ledger_is_the_integral(db: Database, half_life: float, now: float) -> None:
    ledger = await usage.usage(db, half_life=half_life, now=now)
    history = await usage.from_history(db, half_life=half_life, now=now)
    for tenant in set(ledger) | set(history):
        for gpu_type in set(ledger.get(tenant, {})) | set(history.get(tenant, {})):
            a, b = ledger.get(tenant, {}).get(gpu_type, 0.0), history.get(tenant, {}).get(gpu_type, 0.0)
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6), (tenant, gpu_type, a, b)


@pytest.mark.parametrize("seed", range(5))
async def test_the_long_lived_snapshot_path_decides_as_one_built_from_scratch(
    seeded: Database, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage, "REANCHOR_AFTER_HALF_LIVES", 4.0)  # re-anchor often, so the walk crosses many
    compared = await _walk(seeded, seed, steps=80)
    assert compared >= 10


async def test_a_ledger_built_late_from_the_history_equals_the_integral(seeded: Database) -> None:
    """A half-life first asked for after allocations came and went is built from the rows, then kept."""
    await _walk(seeded, 7, steps=30)
    later = 1_000_000.0 + 40 * HALF_LIFE
    assert await usage.from_history(seeded, half_life=3600.0, now=later), "the walk made no usage to compare"
    for half_life in (300.0, 3600.0):
        await _assert_ledger_is_the_integral(seeded, half_life, later)
    await usage.rebuild(seeded, now=later)
    await _assert_ledger_is_the_integral(seeded, 300.0, later + 1)


async def test_the_walks_resize_elastic_jobs(seeded: Database) -> None:
    """The walk commits the resizes the core decides, as the workflows do: this one does some."""
    WALK_RESIZES.clear()
    await _walk(seeded, 5, steps=120)
    assert sum(WALK_RESIZES) > 0
