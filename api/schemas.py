"""Response models (what clients see), converted explicitly from store rows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from store.models import Allocation, Job, JobEvent


class EventPublic(BaseModel):
    ts: float
    attempt: int
    kind: str
    message: str
    data: dict[str, Any]

    @classmethod
    def of(cls, e: JobEvent) -> EventPublic:
        return cls(ts=e.ts, attempt=e.attempt, kind=e.kind, message=e.message, data=e.data)


class RecentEvent(EventPublic):
    """A job event with its job (GET /v1/events/recent)."""

    job_id: str
    tenant: str
    name: str
    temporal_url: str


class AllocationPublic(BaseModel):
    id: str
    attempt: int
    state: str
    members: list[dict[str, Any]]
    created_at: float
    released_at: float | None

    @classmethod
    def of(cls, a: Allocation) -> AllocationPublic:
        return cls(id=a.id, attempt=a.attempt, state=a.state, members=a.members, created_at=a.created_at, released_at=a.released_at)


class JobPublic(BaseModel):
    id: str
    tenant: str
    name: str
    state: str
    attempt: int
    gpu_type: str
    gpu_count: int
    priority: int
    pending_reason: str | None
    end_reason: str | None
    exit_code: int | None
    latest_checkpoint: str | None
    latest_checkpoint_at: float | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, j: Job) -> JobPublic:
        return cls(
            id=j.id,
            tenant=j.tenant,
            name=j.name,
            state=j.state,
            attempt=j.attempt,
            gpu_type=j.gpu_type,
            gpu_count=j.gpu_count,
            priority=j.priority,
            pending_reason=j.pending_reason,
            end_reason=j.end_reason,
            exit_code=j.exit_code,
            latest_checkpoint=j.latest_checkpoint,
            latest_checkpoint_at=j.latest_checkpoint_at,
            created_at=j.created_at,
            updated_at=j.updated_at,
            started_at=j.started_at,
            finished_at=j.finished_at,
            spec=j.spec,
        )


class JobDetail(JobPublic):
    allocation: AllocationPublic | None
    allocations: list[AllocationPublic]
    events: list[EventPublic]
    temporal_url: str
    #: While QUEUED: the job's place in the scheduler's order (1 = next) and its predicted start (SPEC R7.2).
    queue_position: int | None = None
    estimated_start: float | None = None


class SubmitResult(BaseModel):
    created: bool
    job: JobPublic


class PreemptResult(BaseModel):
    accepted: bool
    message: str


class QueueEntry(BaseModel):
    position: int
    job: JobPublic
    #: Predicted start (UNIX seconds) from a forward simulation of the queue; None: beyond the estimator's horizon.
    estimated_start: float | None = None


class NodeRegistration(BaseModel):
    node_id: str
    gpu_type: str
    gpu_count: int
    labels: dict[str, str] = {}
    boot_id: str
    gpus: list[dict[str, Any]] = []
    address: str | None = None
    #: Allocation ids the agent runs members of; the answer's ``fence`` lists those the store no longer holds.
    running: list[str] = []


class NodeHeartbeat(BaseModel):
    boot_id: str
    running: list[str] = []
    #: [{"index": int, "health": {...}}]: each GPU's latest health report (fairgang.health.REPORT_KEYS).
    gpus: list[dict[str, Any]] = []


class NodeAnswer(BaseModel):
    accepted: bool
    #: The allocations the store holds on the node: the agent renews its members' leases with them.
    live_allocations: list[str]
    #: Of the reported ``running`` allocations, those the store no longer holds there: the agent kills them.
    fence: list[str] = []
    #: GPU index -> faults the simulated backend should report (injected by an admin).
    faults: dict[int, list[dict[str, Any]]] = {}


class FaultInjection(BaseModel):
    #: One of fairgang.health.FAULT_KINDS: xid, ecc_uncorrectable, ecc_correctable, retired_pages, thermal, power.
    kind: str
    xid: int | None = None
    count: int = 1
