"""The store as the core sees it: a :class:`~scheduler.core.Snapshot`, read cheaply every cycle.

A :class:`SnapshotReader` lives as long as the placement service. Each read is a handful of
plain column selects over the queued jobs, the live allocations, the nodes and GPUs
(store/snapshot.py); decayed usage comes from the usage ledger (store/usage.py), never from
the history. What never changes once written is read once and kept: a job's spec-derived
fields, an allocation's members. Views that did not change are the very objects of the
previous read, so the core's diff (``Scheduler.run_cycle``) costs what changed.

Learned run times (``scheduler.runtimes``): every waiting job gets ``expected_runtime_s`` and every running
job ``expected_end = started_at + predict(keys, max runtime, elapsed)`` (never past its max runtime), from
the reader's predictor. A waiting job's prediction is made once per attempt, when it is first seen waiting, and stored
with the job by the cycle's commit (``new_predictions``): the attempt keeps it while it waits, so its place in the
queue does not move each time its tenant's runs teach the predictor something, and a restarted service reads it back.
A running job's prediction is kept until the predictor learns a new run of the job's tenant or the job outlives
it (the correction steps it up), so unchanged jobs keep their views.

A fresh reader gives the same snapshot as a long-lived one (tests/scheduler/test_snapshot_incremental.py
drives both through the same changes, with usage integrated from every allocation row as the reference).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from fairgang.liveness import node_schedulable
from fairgang.spec import JobSpec, stored_spec
from scheduler.core import Member, NodeView, PendingJob, Quota, Reservation, RunningJob, SchedulerConfig, Snapshot, TenantView
from scheduler.runtimes import LearnedRuntimes, runtime_keys
from store import snapshot as rows_of
from store import usage
from store.db import Database

if TYPE_CHECKING:
    from fairgang.settings import Settings


def service_config(settings: Settings) -> SchedulerConfig:
    """The policy the placement service runs: every ``SchedulerConfig`` field that ``Settings`` has, from it (the
    placement service, the queue view and the what-if all decide under it)."""
    return SchedulerConfig(**{f.name: getattr(settings, f.name) for f in fields(SchedulerConfig) if hasattr(settings, f.name)})


@dataclass(frozen=True)
class JobFacts:
    """A job's fixed parts from its spec."""

    topology_level: str
    topology_required: bool
    max_runtime_s: float
    preemptible: bool
    #: An elastic job's range (None: a fixed job).
    gpu_min: int | None = None
    gpu_max: int | None = None
    #: The job's name (with its tenant, the run-time predictor's keys).
    name: str = ""


def job_facts(spec: JobSpec) -> JobFacts:
    """What the core needs of a job's spec (the rest of a :class:`PendingJob` comes from the job's row)."""
    return JobFacts(
        topology_level=spec.topology.level,
        topology_required=spec.topology.mode == "required",
        max_runtime_s=spec.max_runtime,
        preemptible=spec.preemptible,
        gpu_min=spec.min_gpus if spec.elastic else None,
        gpu_max=spec.max_gpus if spec.elastic else None,
        name=spec.name,
    )


def quota_of(q: dict[str, Any]) -> Quota:
    return Quota(nominal=int(q.get("nominal") or 0), borrow_limit=q.get("borrow_limit"), lend_limit=q.get("lend_limit"))


class SnapshotReader:
    """Reads snapshots; keeps fixed facts and unchanged views between reads.

    A view is reused when the row it came from is unchanged (compared as a tuple, without building the
    view), so an unchanged fleet costs a tuple comparison per node and per job.
    """

    def __init__(self, *, runtimes: LearnedRuntimes | None = None) -> None:
        #: The learned run times (kept up to date from the store at each read, at most every ``refresh_s``).
        self.runtimes = runtimes or LearnedRuntimes()
        #: Job id -> (its tenant's count of observed runs, its attempt, expected run time) of a waiting job whose
        #: attempt has no prediction stored yet.
        self._expected: dict[str, tuple[int, int, float]] = {}
        #: Job id -> (attempt, predicted run time) made at the last read for waiting jobs that have none stored for
        #: that attempt: the placement service stores them with the cycle's commit, and the attempt keeps it.
        self.new_predictions: dict[str, tuple[int, float]] = {}
        #: Allocation id -> (its tenant's count of observed runs, its limit's end, expected end) of a running job; recomputed once
        #: outlived, or when its start moves (a bound job starts running).
        self._ends: dict[str, tuple[int, float, float]] = {}
        self._facts: dict[str, JobFacts] = {}
        self._members: dict[str, tuple[Member, ...]] = {}
        self._nodes: dict[str, tuple[Any, NodeView]] = {}
        self._pending: dict[str, tuple[Any, PendingJob]] = {}
        self._running: dict[str, tuple[Any, RunningJob]] = {}
        self._tenants: dict[str, TenantView] = {}
        self._ranges: dict[int, frozenset[int]] = {}
        #: Job id -> the pending reason stored with it at the last read (to write only the ones that change).
        self.pending_reasons: dict[str, str | None] = {}
        #: The code stored beside each queued job's pending reason (None: none stored).
        self.pending_codes: dict[str, str | None] = {}
        #: Job id -> its live allocation's id, at the last read.
        self.allocation_ids: dict[str, str] = {}
        #: Node id -> the address its agent registered (where a gang whose rank 0 runs there meets).
        self.addresses: dict[str, str] = {}

    async def read(
        self,
        db: Database,
        *,
        now: float,
        stale_after_s: float,
        config: SchedulerConfig,
        reservations: tuple[Reservation, ...] = (),
        decayed: dict[str, dict[str, float]] | None = None,
    ) -> Snapshot:
        """The store as of now. ``decayed`` replaces the ledger's usage (for a caller that has it already)."""
        if decayed is None:
            decayed = await usage.usage(db, half_life=config.usage_half_life_s, now=now)
        await self.runtimes.refresh(db, now)
        async with db.sessions() as session:
            rows = await rows_of.read_rows(session)
            need = {r[0] for r in rows.queued} | {r[1] for r in rows.live}
            missing = [job_id for job_id in need if job_id not in self._facts]
            if missing:
                for job_id, spec in (await rows_of.job_specs(session, missing)).items():
                    self._facts[job_id] = job_facts(stored_spec(spec))
            holding = [r[0] for r in rows.live] + list(rows.revoked)
            new_allocs = [alloc_id for alloc_id in holding if alloc_id not in self._members]
            if new_allocs:
                for alloc_id, members in (await rows_of.allocation_members(session, new_allocs)).items():
                    self._members[alloc_id] = tuple(
                        Member(node_id=m.node_id, gpu_indices=tuple(m.gpu_indices), rank=m.rank) for m in members
                    )
            irregular = [node_id for node_id, count, low, high in rows.gpu_rows if low != 0 or high != count - 1]
            indices = await rows_of.gpu_indices(session, irregular) if irregular else {}
        if len(self._facts) > len(need):
            self._facts = {k: v for k, v in self._facts.items() if k in need}
        if len(self._members) > len(holding):
            self._members = {alloc_id: self._members[alloc_id] for alloc_id in holding}
        held: dict[str, set[int]] = {}
        for alloc_id in holding:
            for member in self._members[alloc_id]:
                held.setdefault(member.node_id, set()).update(member.gpu_indices)
        return Snapshot(
            nodes=self._node_views(rows, held, indices, now, stale_after_s),
            pending=self._pending_views(rows),
            tenants=self._tenant_views(rows, decayed),
            running=self._running_views(rows, now),
            config=config,
            reservations=reservations,
        )

    def _range(self, n: int) -> frozenset[int]:
        cached = self._ranges.get(n)
        if cached is None:
            cached = self._ranges[n] = frozenset(range(n))
        return cached

    def _node_views(
        self, rows: rows_of.Rows, held: dict[str, set[int]], indices: dict[str, list[int]], now: float, stale_after_s: float
    ) -> tuple[NodeView, ...]:
        present = {node_id: count for node_id, count, _, _ in rows.gpu_rows}
        out: dict[str, set[int]] = {}
        for node_id, index in rows.unhealthy:
            out.setdefault(node_id, set()).add(index)
        views = []
        old = self._nodes
        self._nodes = {}
        for row in rows.nodes:
            node_id, gpu_type, gpu_count, labels, state, last_heartbeat, freed_at, registered_at, address = row
            if address:
                self.addresses[node_id] = address
            schedulable = node_schedulable(state, last_heartbeat, now, stale_after_s)
            # The healthy GPUs with a row, below the node's count, that no allocation holds.
            if node_id in indices:
                base = frozenset(i for i in indices[node_id] if i < gpu_count)
            else:
                base = self._range(min(present.get(node_id, 0), gpu_count))
            taken = held.get(node_id)
            broken = out.get(node_id)
            free = base if not taken and not broken else base - (taken or set()) - (broken or set())
            # Its free GPUs have been free since the last release on it, or since it joined.
            free_since = freed_at if freed_at is not None else registered_at
            key = (gpu_type, gpu_count, labels, free, schedulable, free_since)
            previous = old.get(node_id)
            if previous is not None and previous[0] == key:
                view = previous[1]
            else:
                view = NodeView(
                    id=node_id,
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    labels=tuple(sorted(labels.items())),
                    free=free,
                    schedulable=schedulable,
                    free_since=free_since,
                )
            self._nodes[node_id] = (key, view)
            views.append(view)
        return tuple(views)

    def _pending_views(self, rows: rows_of.Rows) -> tuple[PendingJob, ...]:
        views = []
        old = self._pending
        self._pending = {}
        reasons: dict[str, str | None] = {}
        codes: dict[str, str | None] = {}
        predictor = self.runtimes.predictor
        versions = self.runtimes.tenant_versions
        old_expected = self._expected
        self._expected = {}
        new_predictions: dict[str, tuple[int, float]] = {}
        for row in rows.queued:
            job_id, tenant, attempt, gpu_type, gpu_count, priority, queued_at, created_at, reason, code, gpu_max, kept_for, kept = row
            if kept_for == attempt and kept is not None:
                expected = float(kept)
            else:
                # Not stored yet: the predictor's, until the commit stores it for the attempt.
                known = old_expected.get(job_id)
                version = versions.get(tenant, 0)
                if known is None or known[0] != version or known[1] != attempt:
                    facts = self._facts[job_id]
                    known = (version, attempt, predictor.predict(runtime_keys(tenant, facts.name), facts.max_runtime_s))
                self._expected[job_id] = known
                expected = known[2]
                new_predictions[job_id] = (attempt, expected)
            key = (tenant, attempt, gpu_type, gpu_count, priority, queued_at, created_at, gpu_max, expected)
            previous = old.get(job_id)
            if previous is not None and previous[0] == key:
                view = previous[1]
            else:
                facts = self._facts[job_id]
                view = PendingJob(
                    id=job_id,
                    tenant=tenant,
                    attempt=attempt,
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    priority=priority,
                    queued_at=queued_at,
                    topology_level=facts.topology_level,
                    topology_required=facts.topology_required,
                    max_runtime_s=facts.max_runtime_s,
                    expected_runtime_s=expected,
                    preemptible=facts.preemptible,
                    submitted_at=created_at,
                    gpu_max=gpu_max,
                )
            self._pending[job_id] = (key, view)
            reasons[job_id] = reason
            codes[job_id] = code
            views.append(view)
        self.pending_reasons = reasons
        self.pending_codes = codes
        self.new_predictions = new_predictions
        return tuple(views)

    def _running_views(self, rows: rows_of.Rows, now: float) -> tuple[RunningJob, ...]:
        views = []
        old = self._running
        self._running = {}
        self.allocation_ids = {row[1]: row[0] for row in rows.live}
        predictor = self.runtimes.predictor
        versions = self.runtimes.tenant_versions
        old_ends = self._ends
        self._ends = {}
        for row in rows.live:
            alloc_id, job_id, attempt, created_at, tenant, gpu_type, priority, job_attempt, started_at, checkpoint_at, resized_from = row
            version = versions.get(tenant, 0)
            started = started_at if started_at is not None and job_attempt == attempt else created_at
            known = old_ends.get(alloc_id)
            facts = self._facts[job_id]
            limit = started + facts.max_runtime_s
            # Kept while the predictor learned nothing and the job has not outlived it (or it is the limit).
            if known is None or known[0] != version or known[1] != limit or (now >= known[2] and known[2] < limit):
                elapsed = max(0.0, now - started)
                known = (version, limit, started + predictor.predict(runtime_keys(tenant, facts.name), facts.max_runtime_s, elapsed))
            self._ends[alloc_id] = known
            key = (*row, known[2])
            previous = old.get(alloc_id)
            if previous is not None and previous[0] == key:
                view = previous[1]
            else:
                members = self._members[alloc_id]
                view = RunningJob(
                    id=job_id,
                    tenant=tenant,
                    attempt=attempt,
                    gpu_type=gpu_type,
                    gpu_count=sum(len(m.gpu_indices) for m in members),
                    priority=priority,
                    members=members,
                    started_at=started,
                    expected_end=known[2],
                    max_end=limit,
                    last_checkpoint_at=checkpoint_at if job_attempt == attempt else None,
                    preemptible=facts.preemptible,
                    gpu_min=facts.gpu_min,
                    gpu_max=facts.gpu_max,
                    topology_level=facts.topology_level,
                    topology_required=facts.topology_required,
                    resized_at=created_at if resized_from is not None else None,
                )
            self._running[alloc_id] = (key, view)
            views.append(view)
        return tuple(views)

    def _tenant_views(self, rows: rows_of.Rows, decayed: dict[str, dict[str, float]]) -> tuple[TenantView, ...]:
        views = []
        old = self._tenants
        self._tenants = {}
        for name, weight, cohort, quotas in rows.tenants:
            view = TenantView(
                name=name,
                weight=weight,
                cohort=cohort,
                quotas=tuple((gpu_type, quota_of(q)) for gpu_type, q in sorted(quotas.items())),
                decayed_usage=tuple(sorted((t, v) for t, v in decayed.get(name, {}).items() if v > 0.0)),
            )
            previous = old.get(name)
            if previous is not None and previous == view:
                view = previous
            self._tenants[name] = view
            views.append(view)
        return tuple(views)


async def build_snapshot(
    db: Database,
    *,
    now: float,
    stale_after_s: float,
    config: SchedulerConfig | None = None,
    reservations: tuple[Reservation, ...] = (),
) -> Snapshot:
    """One snapshot from scratch (a fresh reader): for callers that read now and then (the API's views)."""
    return await SnapshotReader().read(
        db, now=now, stale_after_s=stale_after_s, config=config or SchedulerConfig(), reservations=reservations
    )
