"""Frozen dataclasses at the boundary of the scheduling core.

Fields may be added (with defaults); none is renamed or removed, because the placement
service, the simulator and the tests all build these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.reasons import Pending


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler sees it at snapshot time."""

    id: str
    gpu_type: str
    gpu_count: int
    #: Topology domain per level, e.g. (("leaf", "l1"), ("spine", "s1")).
    labels: tuple[tuple[str, str], ...]
    #: Indices of GPUs that are healthy and held by no live allocation.
    free: frozenset[int]
    #: False when the node is cordoned, lost or silent: it gets no new work.
    schedulable: bool = True
    #: Since when its free GPUs have been free (the latest release on it); None: unknown, taken as now.
    #: Elastic jobs grow only onto GPUs idle for ``SchedulerConfig.elastic_grow_idle_s``.
    free_since: float | None = None

    def domain(self, level: str) -> str | None:
        """The node's domain at ``level`` (its own id at level ``node``)."""
        if level == "node":
            return self.id
        for name, value in self.labels:
            if name == level:
                return value
        return None


@dataclass(frozen=True)
class PendingJob:
    """A queued job waiting for GPUs."""

    id: str
    tenant: str
    attempt: int
    gpu_type: str
    gpu_count: int
    priority: int
    #: When this attempt entered the queue.
    queued_at: float
    #: Topology level the gang must (or should) stay within; "any" for none.
    topology_level: str = "any"
    topology_required: bool = True
    #: The spec's limit; the job is stopped when it elapses.
    max_runtime_s: float = 3600.0
    #: A better guess of the run time when one is known (learned from history, or an oracle in the simulator).
    #: Backfill and reservations plan with it; the limit stays ``max_runtime_s``.
    expected_runtime_s: float | None = None
    preemptible: bool = True
    #: When the job was first submitted (aging counts from here, across attempts).
    submitted_at: float | None = None
    #: An elastic job's most GPUs; ``gpu_count`` is its minimum, what it starts with and is entitled to.
    #: None (or not above ``gpu_count``): a fixed job.
    gpu_max: int | None = None

    @property
    def expected_s(self) -> float:
        """How long it is expected to run: ``expected_runtime_s`` when known (never above the limit), else its limit."""
        if self.expected_runtime_s is None:
            return self.max_runtime_s
        return min(self.expected_runtime_s, self.max_runtime_s)


@dataclass(frozen=True)
class Quota:
    """A tenant's share of one GPU type (SPEC R4.1)."""

    #: Guaranteed GPUs.
    nominal: int = 0
    #: Most GPUs it may use beyond nominal, borrowed from its cohort; None: no limit.
    borrow_limit: int | None = None
    #: Most of its idle nominal GPUs others may borrow; None: all of them.
    lend_limit: int | None = None


@dataclass(frozen=True)
class TenantView:
    name: str
    weight: float = 1.0
    cohort: str | None = None
    #: Per GPU type, sorted by type.
    quotas: tuple[tuple[str, Quota], ...] = ()
    #: Past usage in GPU-seconds per GPU type, already decayed to snapshot time.
    decayed_usage: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Member:
    """One node's share of a gang: which GPUs, and the member's rank."""

    node_id: str
    gpu_indices: tuple[int, ...]
    rank: int


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs now (bound or running)."""

    id: str
    tenant: str
    attempt: int
    gpu_type: str
    gpu_count: int
    priority: int
    members: tuple[Member, ...]
    #: When this attempt started (or was bound, if it has not started yet).
    started_at: float
    #: When it is expected to end at the latest: start + max runtime (or a better estimate).
    expected_end: float
    #: When its latest checkpoint was written; None: never (all work since start is at risk).
    last_checkpoint_at: float | None = None
    preemptible: bool = True
    #: An elastic job's range: it holds ``gpu_count`` GPUs now, never fewer than ``gpu_min`` (unless
    #: preempted whole) nor more than ``gpu_max``. None: a fixed job.
    gpu_min: int | None = None
    gpu_max: int | None = None
    #: The topology level its gang must (or should) stay within; growth keeps it there.
    topology_level: str = "any"
    topology_required: bool = True
    #: When its size last changed; None: never since it started.
    resized_at: float | None = None
    #: When it is stopped at the latest (start + max runtime); None: ``expected_end`` is that limit.
    max_end: float | None = None

    @property
    def elastic(self) -> bool:
        return self.gpu_min is not None and self.gpu_max is not None and self.gpu_max > self.gpu_min

    @property
    def entitled_gpus(self) -> int:
        """What counts against its tenant's quota: an elastic job's minimum (its GPUs above are borrowed
        whatever the quota, and are the first taken back), a fixed job's count."""
        return min(self.gpu_count, self.gpu_min) if self.gpu_min is not None else self.gpu_count

    @classmethod
    def started(cls, job: PendingJob, members: tuple[Member, ...], at: float, runtime_s: float | None = None) -> RunningJob:
        """``job`` bound to ``members`` and started at ``at``, expected to run ``runtime_s`` (default: its limit)."""
        elastic = job.gpu_max is not None and job.gpu_max > job.gpu_count
        return cls(
            id=job.id,
            tenant=job.tenant,
            attempt=job.attempt,
            gpu_type=job.gpu_type,
            gpu_count=job.gpu_count,
            priority=job.priority,
            members=members,
            started_at=at,
            expected_end=at + (job.max_runtime_s if runtime_s is None else runtime_s),
            preemptible=job.preemptible,
            gpu_min=job.gpu_count if elastic else None,
            gpu_max=job.gpu_max if elastic else None,
            topology_level=job.topology_level,
            topology_required=job.topology_required,
            max_end=at + job.max_runtime_s,
        )


@dataclass(frozen=True)
class SchedulerConfig:
    """Policy knobs, from the service's settings (or the simulator's)."""

    #: Past usage loses half its weight in this time (fair share forgives). Three hours: a tenant that used
    #: more than its share yields for about as long as the queue's waits last, not for days (on the Philly
    #: evaluation a day's half-life held the smallest tenant's one gang back for days; docs/scheduler.md).
    usage_half_life_s: float = 3 * 3600.0
    #: A waiting job gains this much priority per hour waited.
    aging_per_hour: float = 10.0
    #: Within a tenant's queue, a job expected to use at most one GPU-hour gains this much priority; less for
    #: bigger jobs, none from ``short_job_ref_gpu_h`` (log scale). 0 turns it off. Below one priority class
    #: (100), so it orders jobs within a class (short first) and never lifts a fresh job over a higher class.
    short_job_boost: float = 90.0
    short_job_ref_gpu_h: float = 64.0
    #: Fast lane: jobs expected to use at most this many GPU-hours (GPUs x expected run time: learned, else the
    #: limit) are ordered before all others, in the same per-type fair-share order among themselves; then the rest.
    #: Quotas, the first pass for jobs within their guarantee, and reservations still apply. 0 turns it off.
    fast_lane_gpu_h: float = 8.0
    #: The lane's bound: its jobs (running ones expected to use at most ``fast_lane_gpu_h`` GPU-hours, counted with
    #: those it binds this cycle) hold at most this share of a GPU type's GPUs; past it, further short jobs of the
    #: type queue in the fair order with the rest, so a flood of short jobs cannot take a type from longer ones.
    fast_lane_max_share: float = 0.25
    #: After this long waiting a job may preempt to start.
    max_wait_s: float = 6 * 3600.0
    #: A blocked job that has waited this long competes for its GPU type's reservation by age alone (the longest
    #: waiter first, whatever its tenant's share; younger ones by fair share, as before). A burst that offers a type
    #: more than its GPUs for a day leaves a backlog; this drains its oldest jobs in arrival order instead of
    #: leaving them last because their tenants are busy (docs/evaluation.md). 0 turns it off.
    reservation_by_age_after_s: float = 24 * 3600.0
    #: A job is not preempted before it has run this long since it last started (on its first attempt).
    min_runtime_before_preempt_s: float = 600.0
    #: Each restart (preemption or failure) multiplies that time by this, up to ``max(min_runtime_before_preempt_s,
    #: max_wait_s)``: a job preempted again and again runs longer each time, so it makes progress (1: no backoff).
    preempt_backoff: float = 2.0
    #: EASY backfill behind the head job's reservation.
    backfill: bool = True
    #: Most new preemption plans (one per preemptor) one cycle makes; bounds the cycle's cost.
    max_preemption_plans: int = 8
    #: An elastic job grows only onto GPUs that have been free this long, with no job of the type waiting.
    elastic_grow_idle_s: float = 300.0
    #: An elastic job grows only once it has run this long since it started or was last resized: no thrashing.
    #: Shrinking to let a waiting job start is never delayed.
    elastic_resize_interval_s: float = 600.0


@dataclass(frozen=True)
class Snapshot:
    """Everything one cycle decides on; the core never looks anywhere else."""

    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]
    topology_levels: tuple[str, ...] = ("node", "leaf", "spine")
    tenants: tuple[TenantView, ...] = ()
    running: tuple[RunningJob, ...] = ()
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: The previous committed cycle's ``Decisions.reservations``, fed back unchanged. Holders of
    #: standing reservations go first, and a nomination (a reservation with victims) keeps its
    #: GPUs while its victims stop. Empty: every reservation is made afresh (in-cycle EASY only).
    reservations: tuple[Reservation, ...] = ()


@dataclass(frozen=True)
class Bind:
    """Bind a job's attempt to concrete GPUs (the whole gang)."""

    job_id: str
    attempt: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Preempt:
    """Stop a running job gracefully (checkpoint, then requeue) to make room."""

    job_id: str
    attempt: int
    #: Who the GPUs go to.
    for_job: str
    #: "priority", "reclaim" or "max_wait".
    reason: str


@dataclass(frozen=True)
class Resize:
    """Change a running elastic job's size: stop every member, change the allocation, restart at the new size.

    ``members`` is the whole allocation afterwards; the GPUs it keeps stay held throughout.
    """

    job_id: str
    attempt: int
    members: tuple[Member, ...]
    from_gpus: int
    to_gpus: int
    #: "grow" (onto idle GPUs) or "shrink" (GPUs above its minimum, for a waiting job).
    reason: str
    #: For a shrink, the job that gets the GPUs.
    for_job: str = ""

    @property
    def direction(self) -> str:
        return "grow" if self.to_gpus > self.from_gpus else "shrink"


@dataclass(frozen=True)
class Reservation:
    """GPUs held for a job that cannot start yet; nobody else may take them (EASY backfill)."""

    job_id: str
    node_ids: tuple[str, ...]
    #: When the reserved nodes are expected to be free (the shadow time).
    start_at: float
    #: A nomination: the running jobs being preempted so that this job gets their GPUs.
    victims: tuple[str, ...] = ()
    #: For a nomination, the exact GPUs the job will be bound to once the victims stop.
    members: tuple[Member, ...] = ()
    #: For a nomination, the preemption reason ("priority", "reclaim" or "max_wait").
    reason: str = ""
    #: For a nomination, the elastic jobs shrinking to give back the GPUs above their minimum that it needs.
    shrinks: tuple[Resize, ...] = ()


@dataclass(frozen=True)
class Fragmentation:
    """Free GPUs stranded in partly used nodes, and the largest gang placeable now, per GPU type."""

    stranded_gpus: tuple[tuple[str, int], ...] = ()
    largest_placeable: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Decisions:
    """What a cycle decided: bindings in commit order, and why the others wait."""

    binds: tuple[Bind, ...] = ()
    #: Job id -> why it waits, as shown (``reason_text`` of its code); every pending job not bound has one.
    pending_reasons: dict[str, str] = field(default_factory=dict)
    #: Job id -> the code of its pending reason (the same jobs as ``pending_reasons``).
    pending_codes: dict[str, Pending] = field(default_factory=dict)
    preemptions: tuple[Preempt, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    fragmentation: Fragmentation | None = None
    #: Elastic jobs to resize (grow onto idle GPUs, or shrink for a waiting job), at most one per job.
    resizes: tuple[Resize, ...] = ()
