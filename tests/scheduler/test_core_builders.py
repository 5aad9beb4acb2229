"""Builders for the core's tests (no tests here): nodes, jobs, tenants, snapshots, and a virtual-time loop."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scheduler.core import (
    Decisions,
    Member,
    NodeView,
    PendingJob,
    Quota,
    Reservation,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantView,
    run_cycle,
)

H = 3600.0


def node(
    node_id: str,
    gpus: int = 8,
    *,
    leaf: str = "l1",
    spine: str = "s1",
    gpu_type: str = "H100",
    free: set[int] | None = None,
    schedulable: bool = True,
) -> NodeView:
    """A node; ``free`` defaults to all its GPUs (``snap`` removes those of running jobs)."""
    return NodeView(
        id=node_id,
        gpu_type=gpu_type,
        gpu_count=gpus,
        labels=(("leaf", leaf), ("spine", spine)),
        free=frozenset(range(gpus) if free is None else free),
        schedulable=schedulable,
    )


def leaf_nodes(
    leaf: str, count: int, *, spine: str = "s1", gpus: int = 8, gpu_type: str = "H100", prefix: str | None = None
) -> list[NodeView]:
    return [node(f"{prefix or leaf}-n{i}", gpus, leaf=leaf, spine=spine, gpu_type=gpu_type) for i in range(count)]


def job(
    job_id: str,
    count: int = 1,
    *,
    tenant: str = "a",
    priority: int = 100,
    queued_at: float = 0.0,
    submitted_at: float | None = None,
    level: str = "any",
    required: bool = True,
    runtime: float = H,
    gpu_type: str = "H100",
    preemptible: bool = True,
    attempt: int = 1,
) -> PendingJob:
    return PendingJob(
        id=job_id,
        tenant=tenant,
        attempt=attempt,
        gpu_type=gpu_type,
        gpu_count=count,
        priority=priority,
        queued_at=queued_at,
        topology_level=level,
        topology_required=required,
        max_runtime_s=runtime,
        preemptible=preemptible,
        submitted_at=submitted_at,
    )


def running(
    job_id: str,
    placement: dict[str, tuple[int, ...]],
    *,
    tenant: str = "a",
    priority: int = 100,
    started_at: float = -H,
    end: float = H,
    checkpoint: float | None = None,
    preemptible: bool = True,
    gpu_type: str = "H100",
) -> RunningJob:
    """A running job holding ``placement`` = {node id: GPU indices}."""
    members = tuple(Member(node_id=n, gpu_indices=tuple(g), rank=r) for r, (n, g) in enumerate(placement.items()))
    return RunningJob(
        id=job_id,
        tenant=tenant,
        attempt=1,
        gpu_type=gpu_type,
        gpu_count=sum(len(g) for g in placement.values()),
        priority=priority,
        members=members,
        started_at=started_at,
        expected_end=end,
        last_checkpoint_at=checkpoint,
        preemptible=preemptible,
    )


def tenant(
    name: str, *, cohort: str | None = None, weight: float = 1.0, decayed: float = 0.0, gpu_type: str = "H100", **quota: int | None
) -> TenantView:
    """A tenant with one GPU type's quota: ``tenant("a", nominal=8, borrow_limit=None, lend_limit=4)``."""
    return TenantView(
        name=name,
        weight=weight,
        cohort=cohort,
        quotas=((gpu_type, Quota(**quota)),),  # type: ignore[arg-type]
        decayed_usage=((gpu_type, decayed),) if decayed else (),
    )


def snap(
    nodes: list[NodeView] | tuple[NodeView, ...],
    pending: list[PendingJob] | tuple[PendingJob, ...] = (),
    *,
    running_jobs: list[RunningJob] | tuple[RunningJob, ...] = (),
    tenants: list[TenantView] | tuple[TenantView, ...] = (),
    config: SchedulerConfig | None = None,
    reservations: tuple[Reservation, ...] = (),
    levels: tuple[str, ...] = ("node", "leaf", "spine"),
) -> Snapshot:
    """A snapshot whose node views already exclude the running jobs' GPUs (as the service builds them)."""
    held: dict[str, set[int]] = {}
    for r in running_jobs:
        for m in r.members:
            held.setdefault(m.node_id, set()).update(m.gpu_indices)
    views = tuple(replace(n, free=n.free - held.get(n.id, set())) for n in nodes)
    return Snapshot(
        nodes=views,
        pending=tuple(pending),
        topology_levels=levels,
        tenants=tuple(tenants),
        running=tuple(running_jobs),
        config=config or SchedulerConfig(),
        reservations=reservations,
    )


def placed(decisions: Decisions) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """job id -> [(node id, GPU indices)] in rank order."""
    return {b.job_id: [(m.node_id, m.gpu_indices) for m in b.members] for b in decisions.binds}


@dataclass
class Sim:
    """A virtual-time loop around ``run_cycle``: binds start at once, jobs end at their actual run time,
    preempted jobs stop before the next cycle and queue again (new attempt, same submission time)."""

    nodes: list[NodeView]
    tenants: tuple[TenantView, ...] = ()
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    now: float = 0.0
    pending: dict[str, PendingJob] = field(default_factory=dict)
    running: dict[str, RunningJob] = field(default_factory=dict)
    #: job id -> actual run time (<= its max runtime).
    actual: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    submitted: dict[str, float] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    preempted: list[str] = field(default_factory=list)
    last: Decisions | None = None

    def submit(self, pending: PendingJob, actual: float | None = None) -> None:
        pending = replace(pending, queued_at=self.now, submitted_at=self.now)
        self.pending[pending.id] = pending
        self.actual[pending.id] = pending.max_runtime_s if actual is None else actual
        self.submitted[pending.id] = self.now

    def step(self) -> Decisions:
        for job_id in sorted(self.running):
            r = self.running[job_id]
            if r.started_at + self.actual[job_id] <= self.now:
                del self.running[job_id]
        snapshot = snap(
            self.nodes,
            list(self.pending.values()),
            running_jobs=list(self.running.values()),
            tenants=self.tenants,
            config=self.config,
            reservations=self.reservations,
        )
        decisions = run_cycle(snapshot, self.now)
        for b in decisions.binds:
            p = self.pending.pop(b.job_id)
            self.started.setdefault(b.job_id, self.now)
            self.running[b.job_id] = RunningJob.started(p, b.members, self.now)
        for pre in decisions.preemptions:
            victim = self.running.pop(pre.job_id, None)
            if victim is not None:
                self.preempted.append(victim.id)
                self.started.pop(victim.id, None)
                self.pending[victim.id] = job(
                    victim.id,
                    victim.gpu_count,
                    tenant=victim.tenant,
                    priority=victim.priority,
                    queued_at=self.now,
                    submitted_at=self.submitted[victim.id],
                    runtime=victim.expected_end - victim.started_at,
                    gpu_type=victim.gpu_type,
                    preemptible=victim.preemptible,
                    attempt=victim.attempt + 1,
                )
        self.reservations = decisions.reservations
        self.last = decisions
        return decisions

    def wait_of(self, job_id: str) -> float | None:
        start = self.started.get(job_id)
        return None if start is None else start - self.submitted[job_id]
