"""Tables. Timestamps are UNIX seconds (float) so SQLite and PostgreSQL agree.

Invariant 1 lives here: ``allocation_gpu`` has a partial unique index on
(node_id, gpu_index) over live rows, so no GPU can be held by two live allocations,
whatever the code above does.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Float, Index, UniqueConstraint, text
from sqlmodel import Field, SQLModel


class Tenant(SQLModel, table=True):
    name: str = Field(primary_key=True, max_length=64)
    weight: float = 1.0
    cohort: str | None = Field(default=None, max_length=64)
    #: {gpu_type: {"nominal": int, "borrow_limit": int|None, "lend_limit": int|None}}
    quotas: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    max_gpus_per_job: int = 64
    max_runtime_s: float = 48 * 3600.0
    max_concurrent_jobs: int = 100
    checkpoint_prefix: str | None = Field(default=None, max_length=1024)
    #: Job submissions through the API: a token bucket refilled at this rate, holding at most the burst.
    submissions_per_minute: float = 600.0
    submission_burst: int = 100
    #: Glob patterns of the images its jobs may use; None: any.
    allowed_images: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_token"

    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(unique=True, max_length=64)
    #: "admin" (the platform's), "tenant_admin" (its tenant's tokens too), "tenant" (a member) or "node".
    role: str = Field(max_length=16)
    tenant: str | None = Field(default=None, foreign_key="tenant.name", max_length=64)
    #: A node token's node: the only node it may register or heartbeat as.
    node_id: str | None = Field(default=None, max_length=64)
    created_at: float = 0.0
    #: Tokens made through the API: a name, who made it, when it stops working; revoked ones stay, refused.
    name: str | None = Field(default=None, max_length=64)
    created_by: str | None = Field(default=None, max_length=128)
    expires_at: float | None = None
    revoked_at: float | None = None


class Node(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=64)
    gpu_type: str = Field(max_length=64)
    gpu_count: int
    #: Topology domains by level, e.g. {"leaf": "l1", "spine": "s1"}.
    labels: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    #: "DOWN" (never seen), "READY", "CORDONED", "LOST", "RETIRED" (taken out of the fleet by an admin).
    state: str = Field(default="DOWN", max_length=16)
    boot_id: str | None = Field(default=None, max_length=64)
    last_heartbeat: float | None = None
    registered_at: float | None = None
    address: str | None = Field(default=None, max_length=256)
    #: When GPUs of the node were last released (None: never since it was enrolled).
    freed_at: float | None = None


class Gpu(SQLModel, table=True):
    node_id: str = Field(primary_key=True, foreign_key="node.id", max_length=64)
    index: int = Field(primary_key=True)
    uuid: str | None = Field(default=None, max_length=128)
    healthy: bool = True
    #: Latest health report from the agent (temperature, ECC, Xid, ...).
    health: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class Job(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_job_tenant_idempotency_key"),
        Index("ix_job_state", "state"),
        Index("ix_job_tenant_state", "tenant", "state"),
        #: The fleet rollup reads the jobs that started in a minute (store/rollup.py).
        Index("ix_job_started_at", "started_at"),
        Index(
            "ix_job_without_workflow",
            "created_at",
            sqlite_where=text("NOT workflow_started"),
            postgresql_where=text("NOT workflow_started"),
        ),
    )

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(foreign_key="tenant.name", max_length=64)
    name: str = Field(max_length=64)
    idempotency_key: str = Field(max_length=160)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    gpu_type: str = Field(max_length=64)
    #: GPUs it asks for; an elastic job's minimum.
    gpu_count: int
    #: An elastic job's most GPUs (None: a fixed job).
    gpu_max: int | None = None
    priority: int = 100
    state: str = Field(default="QUEUED", max_length=16)
    attempt: int = 1
    pending_reason: str | None = Field(default=None, max_length=512)
    #: The scheduler's code for ``pending_reason`` (scheduler.core.Pending); None when the text is not the scheduler's.
    pending_code: str | None = Field(default=None, max_length=32)
    end_reason: str | None = Field(default=None, max_length=1024)
    exit_code: int | None = None
    latest_checkpoint: str | None = Field(default=None, max_length=1024)
    latest_checkpoint_at: float | None = None
    #: The run time predicted for attempt ``predicted_attempt`` when the placement service first saw it waiting
    #: (scheduler/snapshot.py): kept while that attempt waits, so its place in the queue does not move each time
    #: its tenant's runs teach the predictor something new. None: not predicted yet for any attempt.
    predicted_runtime_s: float | None = None
    predicted_attempt: int | None = None
    workflow_started: bool = False
    created_at: float
    updated_at: float
    queued_at: float
    started_at: float | None = None
    finished_at: float | None = None


class Allocation(SQLModel, table=True):
    __table_args__ = (
        Index("ix_allocation_job_attempt", "job_id", "attempt"),
        Index("ix_allocation_state", "state"),
    )

    id: str = Field(primary_key=True, max_length=40)
    job_id: str = Field(foreign_key="job.id", max_length=40)
    attempt: int
    #: "BOUND" (committed, workflow not told yet), "ACKED", "REVOKED" (GPUs held, agents told it is gone), "RELEASED".
    state: str = Field(default="BOUND", max_length=16)
    #: The placement service's leader epoch that committed it.
    epoch: int = 0
    #: [{"node_id": ..., "gpu_indices": [...], "rank": int}] in rank order.
    members: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: float
    acked_at: float | None = None
    released_at: float | None = None
    signalled_at: float | None = None
    #: The allocation of the same attempt that a resize replaced (None: made by a placement).
    resized_from: str | None = Field(default=None, max_length=40)


class AllocationGpu(SQLModel, table=True):
    """One GPU held by one allocation; ``live`` turns false when it is released."""

    __tablename__ = "allocation_gpu"
    __table_args__ = (
        Index(
            "uq_allocation_gpu_live",
            "node_id",
            "gpu_index",
            unique=True,
            sqlite_where=text("live"),
            postgresql_where=text("live"),
        ),
    )

    allocation_id: str = Field(primary_key=True, foreign_key="allocation.id", max_length=40)
    node_id: str = Field(primary_key=True, foreign_key="node.id", max_length=64)
    gpu_index: int = Field(primary_key=True)
    live: bool = True


class JobEvent(SQLModel, table=True):
    """Append-only log of what happened to a job. ``dedupe_key`` makes writes idempotent."""

    __tablename__ = "job_event"
    __table_args__ = (
        UniqueConstraint("job_id", "dedupe_key", name="uq_job_event_dedupe"),
        Index("ix_job_event_job", "job_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", max_length=40)
    ts: float
    attempt: int
    kind: str = Field(max_length=32)
    message: str = Field(default="", max_length=2048)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    dedupe_key: str = Field(max_length=160)


class ChangeFeed(SQLModel, table=True):
    """One row whose version moves whenever the queue or the free capacity changes.

    The placement service short-polls it (SQLite) or LISTENs for its NOTIFY
    (PostgreSQL) to wake at once instead of waiting for its tick.
    """

    __tablename__ = "change_feed"

    id: int = Field(default=1, primary_key=True)
    version: int = 0


class SchedulerLease(SQLModel, table=True):
    """The placement service's leader lease; ``epoch`` fences stale leaders."""

    __tablename__ = "scheduler_lease"

    name: str = Field(primary_key=True, max_length=32)
    holder: str = Field(max_length=128)
    epoch: int = 0
    expires_at: float = 0.0


class Sweep(SQLModel, table=True):
    """A sweep (SPEC R9.3): trials of one job template, run by the ``Sweep`` workflow (id = sweep id)."""

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_sweep_tenant_idempotency_key"),
        Index("ix_sweep_tenant_created", "tenant", "created_at"),
        Index("ix_sweep_schedule", "schedule_id"),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(foreign_key="tenant.name", max_length=64)
    name: str = Field(max_length=64)
    idempotency_key: str = Field(max_length=300)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    #: "SUBMITTED" (workflow not started yet), "RUNNING", "CANCELLING", "COMPLETED", "CANCELLED", "FAILED".
    state: str = Field(default="SUBMITTED", max_length=16)
    trial_count: int
    max_concurrent: int
    #: The Temporal Schedule that started it, if any.
    schedule_id: str | None = Field(default=None, max_length=200)
    #: Written when it ends: trials by outcome and the best trial by the spec's metric.
    summary: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    reason: str | None = Field(default=None, max_length=1024)
    created_at: float
    updated_at: float
    finished_at: float | None = None


class SweepTrial(SQLModel, table=True):
    """One trial of a sweep once the sweep has tried to create it: its job, or why admission refused it."""

    __tablename__ = "sweep_trial"

    sweep_id: str = Field(primary_key=True, foreign_key="sweep.id", max_length=32)
    index: int = Field(primary_key=True)
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    job_id: str | None = Field(default=None, foreign_key="job.id", max_length=40)
    #: "CREATED" (its job exists) or "REFUSED" (admission refused it; see reason).
    state: str = Field(default="CREATED", max_length=16)
    reason: str | None = Field(default=None, max_length=1024)
    #: Metrics the job reported (FAIRGANG_METRIC lines), read when the sweep ends.
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: float


class HealthEvent(SQLModel, table=True):
    """Append-only log of GPU health: faults the agents report, what the policy did, and admin actions."""

    __tablename__ = "health_event"
    __table_args__ = (
        UniqueConstraint("node_id", "dedupe_key", name="uq_health_event_dedupe"),
        Index("ix_health_event_node", "node_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    ts: float
    node_id: str = Field(foreign_key="node.id", max_length=64)
    #: The GPU's index, or None for a node-wide event (cordon, drain).
    gpu_index: int | None = None
    #: "xid", "ecc_uncorrectable", "ecc_correctable", "retired_pages", "thermal", "power", "gpu_unhealthy",
    #: "gpu_returned", "cordon", "uncordon", "drain".
    kind: str = Field(max_length=32)
    #: "fatal", "degraded" or "info".
    severity: str = Field(default="info", max_length=16)
    message: str = Field(default="", max_length=2048)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    dedupe_key: str = Field(max_length=160)


class UsageLedger(SQLModel, table=True):
    """A decayed-usage ledger kept for one half-life (see store/usage.py); ``ref_t`` anchors its sums."""

    __tablename__ = "usage_ledger"

    half_life_s: float = Field(sa_column=Column(Float, primary_key=True, autoincrement=False))
    ref_t: float


class UsageAccount(SQLModel, table=True):
    """One tenant's running sums for one GPU type in one ledger (see store/usage.py)."""

    __tablename__ = "usage_account"

    half_life_s: float = Field(sa_column=Column(Float, primary_key=True))
    tenant: str = Field(primary_key=True, max_length=64)
    gpu_type: str = Field(primary_key=True, max_length=64)
    closed: float = 0.0
    live_start: float = 0.0
    live_gpus: int = 0


class AuditEvent(SQLModel, table=True):
    """Append-only record of an administrative change: who, when, what, and the thing before and after."""

    __tablename__ = "audit_event"
    __table_args__ = (Index("ix_audit_event_target", "target"),)

    id: int | None = Field(default=None, primary_key=True)
    at: float
    #: Who made it (store.auth.Principal.name, or "seed" for the cluster config).
    actor: str = Field(max_length=128)
    #: What was done: tenant.create, tenant.update, node.enrol, token.create, token.revoke.
    action: str = Field(max_length=64)
    #: What it was done to: "tenant:alpha", "node:h1", "token:12".
    target: str = Field(max_length=128)
    before: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    after: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class FleetRollup(SQLModel, table=True):
    """One sample of the fleet per time bucket (a minute by default), kept for the dashboard's 24-hour charts.

    Written by the placement service's leader; the bucket is the primary key, so a second write for the same
    bucket (a new leader in the same minute) changes nothing. Pruned past a retention (store/rollup.py).
    """

    __tablename__ = "fleet_rollup"

    #: The bucket's start (UNIX seconds, a multiple of ``span_s``).
    bucket: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    #: The bucket's length in seconds.
    span_s: float
    #: When the sample was taken (within the bucket).
    at: float
    #: GPUs of the nodes in the fleet (retired nodes aside), those held by live allocations, and those unhealthy.
    gpus_total: int
    gpus_allocated: int
    gpus_unhealthy: int
    #: Jobs in state QUEUED when the sample was taken.
    queue_length: int
    #: Jobs whose current attempt started in the bucket before this one, [bucket - span_s, bucket), and the
    #: percentiles (nearest rank) of how long those attempts waited in the queue; None when none started.
    jobs_started: int
    wait_p50_s: float | None = None
    wait_p90_s: float | None = None
    wait_p99_s: float | None = None


class EtaRecord(SQLModel, table=True):
    """A waiting job's estimated start, kept to be scored once the job starts (the live accuracy of the queue view).

    Written by the API's view worker that computes the queue view (``api.eta``): each job's first estimate
    (``slot`` 0) and at most one later sample per clock hour while it waits (``slot``: the UNIX hour of the
    sample), ``MAX_SAMPLES`` at most; the key (job_id, slot) makes a second write of the same estimate (a retry,
    a worker of another API process) change nothing. ``started_at`` is the job's first start, filled in from the
    job's row once it started (``store.eta.record_starts``).
    """

    __tablename__ = "eta_record"
    __table_args__ = (Index("ix_eta_record_started_at", "started_at"),)

    job_id: str = Field(primary_key=True, max_length=40)
    #: 0: the job's first estimate; else the UNIX hour (made_at // 3600) of a later sample.
    slot: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    #: "first" or "sample".
    kind: str = Field(max_length=8)
    tenant: str = Field(max_length=64)
    gpu_type: str = Field(max_length=64)
    gpu_count: int
    #: The job's size class (simulator.workload.size_class: 1, 2-8, 9-32, 33+).
    size_class: str = Field(max_length=8)
    made_at: float
    #: The forward simulation's start with learned run times (uncalibrated): what the calibrator learns from.
    raw_start: float
    #: The start shown: the most likely, and the p10-p90 interval.
    median: float
    low: float
    high: float
    #: Whether the shown start was calibrated from earlier records (else: the run-time quantiles' interval).
    calibrated: bool = False
    #: The job's first start (None while it has not started), and when it was filled in.
    started_at: float | None = None
    scored_at: float | None = None


class EtaErrorTotal(SQLModel, table=True):
    """Scored ``eta_record`` rows past the retention, folded into totals per (GPU type, size class, kind) before they
    are deleted (``store.eta.prune_scored``), so that the ``fairgang_eta_*`` counters never go down."""

    __tablename__ = "eta_error_total"

    gpu_type: str = Field(primary_key=True, max_length=64)
    size_class: str = Field(primary_key=True, max_length=8)
    kind: str = Field(primary_key=True, max_length=8)
    count: int = Field(sa_column=Column(BigInteger, nullable=False))
    sum_abs_s: float
    covered: int = Field(sa_column=Column(BigInteger, nullable=False))
    late: int = Field(sa_column=Column(BigInteger, nullable=False))
    #: An absolute-error bound (seconds, as ``repr(float)``) -> how many erred by at most it.
    at_most: dict[str, int] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
