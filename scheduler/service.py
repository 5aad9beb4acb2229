"""The placement service: the I/O around the pure core.

Each cycle: 1. hold the leader lease, 2. snapshot the store, 3. the core (``Scheduler.run_cycle``),
4. commit the bindings in one transaction fenced by the lease epoch, 5. signal each
bound job's workflow (only after the commit: invariant 3), then the preemptions and the
elastic jobs' resizes, 6. reconcile (re-signal unacknowledged bindings, start workflows the
API failed to start), 7. once per rollup bucket, write the fleet rollup row (``store.rollup``:
the dashboard's charts), as the one leader.

A resize is committed by the job's workflow once its members have stopped (the store replaces its
allocation). Until then the service keeps it in flight: it asks once, and the GPUs a growth will take
are kept out of the snapshot's free GPUs so that no other job is bound onto them meanwhile.

It wakes at once when the queue or the free capacity changes (PostgreSQL
LISTEN/NOTIFY, or a short poll of the change-feed row on SQLite) and on a tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio.client import Client

from fairgang import metrics
from fairgang.members import PlacedMember, members_of
from fairgang.settings import Settings
from scheduler.core import Decisions, NodeView, Preempt, Reservation, Resize, Scheduler, Snapshot
from scheduler.snapshot import SnapshotReader, build_snapshot, service_config
from store import jobs as stored_jobs
from store import nodes, placement, rollup
from store.db import NOTIFY_CHANNEL, Database
from workflows import starter
from workflows.messages import ResizeRequest

__all__ = ["LEASE_NAME", "CycleReport", "PlacementService", "build_snapshot"]

log = logging.getLogger("fairgang.scheduler")
T = TypeVar("T")
LEASE_NAME = "placement"


#: Workflows the reconciler starts (and bindings it signals again) in one cycle at most, and Temporal calls a
#: cycle has in flight at once.
RECONCILE_BATCH = 200
TEMPORAL_CONCURRENCY = 32


async def _bounded(calls: Sequence[Coroutine[Any, Any, T]], limit: int = TEMPORAL_CONCURRENCY) -> list[T]:
    """Run the calls concurrently, at most ``limit`` at a time; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def commit(db: Database, decisions: Decisions, reader: SnapshotReader, *, epoch: int, now: float) -> list[Any]:
    """Commit a cycle's bindings, fenced by the lease epoch, with the pending reasons that changed since ``reader``'s read
    and the run times it predicted for waiting jobs that had none stored for their attempt.

    Raises:
        placement.LeaseLost: when ``epoch`` is no longer the lease's.
    """
    rows = [
        placement.BindingRow(
            job_id=b.job_id,
            attempt=b.attempt,
            members=[PlacedMember(node_id=m.node_id, gpu_indices=list(m.gpu_indices), rank=m.rank) for m in b.members],
        )
        for b in decisions.binds
    ]
    texts, codes = reader.pending_reasons, reader.pending_codes
    changed = {
        job_id: reason
        for job_id, reason in decisions.pending_reasons.items()
        if texts.get(job_id) != reason or codes.get(job_id) != decisions.pending_codes[job_id]
    }
    return list(
        await placement.commit_bindings(
            db,
            bindings=rows,
            pending_reasons=changed,
            pending_codes={job_id: decisions.pending_codes[job_id].value for job_id in changed},
            predictions=reader.new_predictions,
            lease_name=LEASE_NAME,
            epoch=epoch,
            now=now,
        )
    )


@dataclass
class CycleReport:
    leader: bool
    bound: int = 0
    pending: int = 0
    resignalled: int = 0
    started_workflows: int = 0
    preempted: int = 0
    resized: int = 0


class PlacementService:
    def __init__(self, settings: Settings, db: Database, client: Client, *, holder: str | None = None) -> None:
        self.settings = settings
        self.db = db
        self.client = client
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_ttl_s = max(3.0, settings.scheduler_tick_s * 2)
        #: When this service started (wall clock, as the nodes' heartbeats): see _declare_lost_nodes.
        self.started_at = time.time()
        self._wake = asyncio.Event()
        self.config = service_config(settings)
        self.topology_levels = settings.topology_level_names()
        #: The last committed cycle's reservations, fed back so nominations hold across cycles.
        #: Kept in memory: after a failover the new leader recomputes them in its first cycle.
        self.reservations: tuple[Reservation, ...] = ()
        #: Preemptions already asked for, by (job id, attempt): each is asked once.
        self.preempting: set[tuple[str, int]] = set()
        #: Resizes asked for and not yet committed, by job id: (the resize, when it was asked).
        self.resizing: dict[str, tuple[Resize, float]] = {}
        #: The core, kept across cycles: it decides as ``run_cycle`` does, bringing its working copy of
        #: the fleet up to date instead of building it from the whole snapshot every cycle.
        self.scheduler = Scheduler()
        #: The store's reader, kept across cycles: it reads each job's and allocation's fixed parts once.
        self.reader = SnapshotReader()
        #: The last rollup bucket this service wrote, or found written.
        self.rolled_bucket: int | None = None

    async def cycle(self, now: float | None = None) -> CycleReport:
        """One scheduling cycle (see the module docstring for its phases), timed into ``fairgang_scheduling_cycle_seconds``."""
        started = time.perf_counter()
        report = await self._cycle(now)
        if report.leader:
            metrics.SCHEDULING_CYCLE.observe(time.perf_counter() - started)
            metrics.BINDINGS.inc(report.bound)
            metrics.PENDING.set(report.pending)
        metrics.LEADER.set(1 if report.leader else 0)
        return report

    async def _cycle(self, now: float | None) -> CycleReport:
        clock = now is None
        now = time.time() if now is None else now
        # 1. Leader lease.
        epoch = await placement.acquire_lease(self.db, name=LEASE_NAME, holder=self.holder, ttl_s=self.lease_ttl_s, now=now)
        if epoch is None:
            return CycleReport(leader=False)
        # 1b. Node liveness: silent nodes are declared lost and their jobs told at once.
        await self._declare_lost_nodes(now)
        # 2. Snapshot, 3. decide.
        read = time.perf_counter()
        snapshot = await self.reader.read(
            self.db, now=now, stale_after_s=self.settings.node_stale_after_s, config=self.config, reservations=self.reservations
        )
        snapshot = self._without_growth_targets(dataclasses.replace(snapshot, topology_levels=self.topology_levels), now)
        decided = time.perf_counter()
        metrics.SCHEDULING_PHASE.labels(phase="snapshot").observe(decided - read)
        decisions = self.scheduler.run_cycle(snapshot, now)
        committing = time.perf_counter()
        metrics.SCHEDULING_DECISION.observe(committing - decided)
        metrics.SCHEDULING_PHASE.labels(phase="core").observe(committing - decided)
        # 4. Commit, fenced by the epoch.
        try:
            # Stamped when committed, not when the cycle began: the snapshot may have been read after a release
            # that came in between, and the allocation history must never show a GPU held twice at one instant.
            allocations = await commit(self.db, decisions, self.reader, epoch=epoch, now=time.time() if clock else now)
        except placement.LeaseLost as err:
            log.warning("%s", err)
            return CycleReport(leader=False)
        metrics.SCHEDULING_PHASE.labels(phase="commit").observe(time.perf_counter() - committing)
        self.reservations = decisions.reservations
        # 5. Tell the workflows: bindings, then preemptions (victims checkpoint and stop; their GPUs are nominated).
        await self._signal(allocations, now)
        preempted = await self._preempt(decisions.preemptions, {r.id for r in snapshot.running})
        resized = await self._resize(decisions.resizes, now)
        report = CycleReport(
            leader=True, bound=len(allocations), pending=len(decisions.pending_reasons), preempted=preempted, resized=resized
        )
        # 6. Reconcile.
        stale = await placement.unacked_allocations(
            self.db, older_than=now - self.settings.scheduler_resignal_after_s, now=now, limit=RECONCILE_BATCH
        )
        await self._signal(stale, now)
        report.resignalled = len(stale)
        report.started_workflows = await self._start_missing_workflows(now)
        # 7. The fleet rollup.
        await self._rollup(now)
        return report

    async def _rollup(self, now: float) -> None:
        """Write this bucket's fleet rollup row, once per bucket (a row written already is left as it is)."""
        bucket = rollup.bucket_of(now, self.settings.rollup_bucket_s)
        if bucket == self.rolled_bucket:
            return
        try:
            await rollup.record_rollup(self.db, now=now, span_s=self.settings.rollup_bucket_s, retention_s=self.settings.rollup_retention_s)
        except Exception as err:  # noqa: BLE001 - a missed sample is a gap in a chart, not a reason to stop placing
            log.warning("fleet rollup not written: %s", err)
            return
        self.rolled_bucket = bucket

    async def _preempt(self, preemptions: Sequence[Preempt], running: set[str]) -> int:
        self.preempting = {key for key in self.preempting if key[0] in running}
        asked = 0
        for p in preemptions:
            if (p.job_id, p.attempt) in self.preempting:
                continue
            self.preempting.add((p.job_id, p.attempt))
            try:
                await starter.preempt(self.client, job_id=p.job_id, reason=f"{p.reason}: its GPUs go to {p.for_job}", for_job=p.for_job)
                asked += 1
                metrics.PREEMPTIONS_ASKED.labels(reason=p.reason).inc()
            except Exception as err:  # noqa: BLE001 - refused (not running yet, already stopping) or unreachable
                log.info("preemption of %s not sent: %s", p.job_id, err)
        return asked

    def _without_growth_targets(self, snapshot: Snapshot, now: float) -> Snapshot:
        """Forget the resizes that are done (the job runs on the new members, or no longer at that attempt) or
        timed out; keep the GPUs that growths in flight will take out of the snapshot's free GPUs."""
        running = {r.id: r for r in snapshot.running}
        timeout = self.settings.elastic_resize_timeout_s
        for job_id, (resize, asked) in list(self.resizing.items()):
            job = running.get(job_id)
            if job is None or job.attempt != resize.attempt or job.members == resize.members or now - asked > timeout:
                del self.resizing[job_id]
        taken: dict[str, set[int]] = {}
        for resize, _ in self.resizing.values():
            if resize.direction == "grow":
                for m in resize.members:
                    taken.setdefault(m.node_id, set()).update(m.gpu_indices)
        if not taken:
            return snapshot
        nodes: list[NodeView] = [
            dataclasses.replace(n, free=n.free - taken[n.id]) if n.id in taken and n.free & taken[n.id] else n for n in snapshot.nodes
        ]
        return dataclasses.replace(snapshot, nodes=tuple(nodes))

    async def _resize(self, resizes: Sequence[Resize], now: float) -> int:
        """Ask each elastic job's workflow for its resize, once while it is in flight."""
        asked = 0
        for r in resizes:
            if r.job_id in self.resizing:
                continue
            self.resizing[r.job_id] = (r, now)
            request = ResizeRequest(
                attempt=r.attempt,
                allocation_id=self.reader.allocation_ids.get(r.job_id, ""),
                members=[PlacedMember(node_id=m.node_id, gpu_indices=list(m.gpu_indices), rank=m.rank) for m in r.members],
                from_gpus=r.from_gpus,
                to_gpus=r.to_gpus,
                reason=r.reason,
                for_job=r.for_job,
            )
            try:
                await starter.signal_resize(self.client, job_id=r.job_id, request=request)
                asked += 1
                metrics.RESIZES_ASKED.labels(direction=r.direction, reason=r.reason).inc()
            except Exception as err:  # noqa: BLE001 - asked again once the resize times out
                log.info("resize of %s not sent: %s", r.job_id, err)
        return asked

    async def _declare_lost_nodes(self, now: float) -> None:
        # Silence from before this service started may be the control plane's own (a restart of the whole
        # platform, when no agent could reach the API): a node is lost only once silent for the whole timeout
        # with this service up.
        if now - self.started_at < self.settings.node_lost_after_s:
            return
        lost = await nodes.mark_lost_nodes(self.db, lost_after_s=self.settings.node_lost_after_s, now=now)
        for node_id, job_ids in sorted(lost.items()):
            log.warning("node %s declared lost; telling %d job(s)", node_id, len(job_ids))
            for job_id in job_ids:
                try:
                    await starter.signal_node_lost(self.client, job_id=job_id, node_id=node_id)
                except Exception as err:  # noqa: BLE001 - the member's heartbeat timeout catches it anyway
                    log.warning("node-lost signal to %s failed: %s", job_id, err)

    async def _signal(self, allocations: Sequence[Any], now: float) -> None:
        async def signal(alloc: Any) -> str | None:
            try:
                members = members_of(alloc.members)
                first = min(members, key=lambda m: m.rank).node_id if members else ""
                await starter.signal_placement(
                    self.client,
                    job_id=alloc.job_id,
                    allocation_id=alloc.id,
                    attempt=alloc.attempt,
                    members=members,
                    master_addr=self.reader.addresses.get(first, ""),
                )
                return str(alloc.id)
            except Exception as err:  # noqa: BLE001 - the reconciler retries
                log.warning("signal to %s failed: %s", alloc.job_id, err)
                return None

        sent = [alloc_id for alloc_id in await _bounded([signal(a) for a in allocations]) if alloc_id is not None]
        await placement.mark_signalled(self.db, sent, now)

    async def _start_missing_workflows(self, now: float) -> int:
        """Start the workflows the API did not (a burst, a crash): a bounded batch per cycle, started concurrently,
        so a backlog of thousands is absorbed over a few cycles without holding placement back."""
        jobs = await stored_jobs.jobs_without_workflow(self.db, older_than=now - 5.0, limit=RECONCILE_BATCH)

        async def start(job: Any) -> str | None:
            try:
                await starter.start_job_workflow(self.client, job, self.settings)
                return str(job.id)
            except Exception as err:  # noqa: BLE001 - retried next cycle
                log.warning("could not start workflow for %s: %s", job.id, err)
                return None

        started = [job_id for job_id in await _bounded([start(job) for job in jobs]) if job_id is not None]
        await stored_jobs.mark_workflows_started(self.db, started)
        return len(started)

    # ------------------------------------------------------------ wake-ups

    def wake(self) -> None:
        self._wake.set()

    async def _poll_changes(self) -> None:
        """Wake on any change of the change-feed version (works on every store)."""
        last = await placement.change_version(self.db)
        while True:
            await asyncio.sleep(self.settings.scheduler_poll_s)
            try:
                version = await placement.change_version(self.db)
            except Exception as err:  # noqa: BLE001 - keep polling through store hiccups
                log.warning("change poll failed: %s", err)
                continue
            if version != last:
                last = version
                self.wake()

    async def _listen(self) -> None:
        """PostgreSQL: LISTEN for the change feed's NOTIFY."""
        import asyncpg

        dsn = self.db.url.replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        await conn.add_listener(NOTIFY_CHANNEL, lambda *_: self.wake())
        try:
            await asyncio.Event().wait()
        finally:
            await conn.close()

    async def serve(self) -> None:
        """Run cycles until cancelled."""
        watcher = asyncio.create_task(self._listen() if not self.db.sqlite else self._poll_changes())
        try:
            while True:
                self._wake.clear()
                try:
                    report = await self.cycle()
                    if report.bound or report.resignalled or report.started_workflows or report.preempted:
                        log.info("cycle: %s", report)
                except Exception:
                    log.exception("scheduling cycle failed")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.scheduler_tick_s)
        finally:
            watcher.cancel()
            # A leader that stops hands over at once: its standby need not wait out the lease.
            with contextlib.suppress(Exception):
                await asyncio.shield(placement.release_lease(self.db, name=LEASE_NAME, holder=self.holder))
