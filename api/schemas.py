"""Request and response models: what clients send (validated, typed) and see (converted explicitly from store rows)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fairgang.spec import Seconds
from store.auth import TokenInfo
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
    #: GPUs it asks for: an elastic job's minimum (what it starts with and is entitled to).
    gpu_count: int
    #: An elastic job's most GPUs (None: a fixed job).
    gpu_max: int | None = None
    priority: int
    pending_reason: str | None
    #: The scheduler's code for ``pending_reason`` (scheduler.core.Pending, e.g. "no_free_node"); None for other texts.
    pending_code: str | None
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
            gpu_max=j.gpu_max,
            priority=j.priority,
            pending_reason=j.pending_reason,
            pending_code=j.pending_code,
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
    #: While QUEUED: the job's place in the scheduler's order (1 = next) and its predicted start (SPEC R7.2): the
    #: median, and the interval from the p10 to the p90 of the run-time predictor's errors.
    queue_position: int | None = None
    estimated_start: float | None = None
    estimated_start_low: float | None = None
    estimated_start_high: float | None = None
    #: GPUs its live allocation holds now (an elastic job's current size); None while it holds none.
    gpus_now: int | None = None


class JobUpdate(BaseModel):
    """What may change in a job that waits: both only downwards."""

    model_config = ConfigDict(extra="forbid")

    #: A lower priority class (low, normal, high, urgent).
    priority_class: str | None = None
    #: A shorter max runtime: seconds, or a duration such as "30m".
    max_runtime: Seconds | None = None


class SubmitResult(BaseModel):
    created: bool
    job: JobPublic


class PreemptResult(BaseModel):
    accepted: bool
    message: str


class QueueEntry(BaseModel):
    position: int
    job: JobPublic
    #: Predicted start (UNIX seconds) from a forward simulation of the queue with learned run times (the median);
    #: None: beyond the estimator's horizon.
    estimated_start: float | None = None
    #: Its interval: the starts with every remaining run time scaled by the p10 and the p90 of the run-time
    #: predictor's error ratios (low <= estimated_start <= high; None: beyond the horizon).
    estimated_start_low: float | None = None
    estimated_start_high: float | None = None


#: Most GPUs one node may have, and most allocations one agent may report running.
MAX_NODE_GPUS = 64
MAX_RUNNING = 1024
NodeId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Labels = Annotated[dict[str, Annotated[str, Field(max_length=256)]], Field(max_length=32)]


class NodeEnrolment(BaseModel):
    """An admin enrols a node (or enrols it again to change its GPUs or labels)."""

    model_config = ConfigDict(extra="forbid")

    node_id: NodeId
    gpu_type: str = Field(min_length=1, max_length=64)
    gpu_count: int = Field(ge=1, le=MAX_NODE_GPUS)
    labels: Labels = {}


class NodeCredential(BaseModel):
    """The enrolled node's credential, shown once: its agent's FAIRGANG_NODE_TOKEN."""

    node_id: str
    token: str


class GpuInventoryItem(BaseModel):
    index: int = Field(ge=0, lt=MAX_NODE_GPUS)
    uuid: str | None = Field(default=None, max_length=128)
    name: str | None = Field(default=None, max_length=128)
    health: dict[str, Any] = {}


class GpuReport(BaseModel):
    index: int = Field(ge=0, lt=MAX_NODE_GPUS)
    #: The GPU's latest health report (fairgang.health.REPORT_KEYS).
    health: dict[str, Any] = {}


def _indices_unique(gpus: list[Any]) -> None:
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise ValueError(f"GPU indices repeat: {sorted(indices)}")


class NodeRegistration(BaseModel):
    node_id: NodeId
    gpu_type: str = Field(min_length=1, max_length=64)
    gpu_count: int = Field(ge=1, le=MAX_NODE_GPUS)
    labels: Labels = {}
    boot_id: str = Field(min_length=1, max_length=64)
    #: The node's GPUs: indices 0 .. gpu_count - 1, each once (or none: the GPU rows stay as they are).
    gpus: list[GpuInventoryItem] = Field(default=[], max_length=MAX_NODE_GPUS)
    address: str | None = Field(default=None, max_length=256)
    #: Allocation ids the agent runs members of; the answer's ``fence`` lists those the store no longer holds.
    running: list[Annotated[str, Field(max_length=64)]] = Field(default=[], max_length=MAX_RUNNING)

    @field_validator("gpus")
    @classmethod
    def _inventory(cls, gpus: list[GpuInventoryItem], info: ValidationInfo) -> list[GpuInventoryItem]:
        _indices_unique(gpus)
        count = info.data.get("gpu_count")
        if gpus and count is not None and sorted(g.index for g in gpus) != list(range(count)):
            raise ValueError(f"the indices must be 0..{count - 1}, each once (got {sorted(g.index for g in gpus)})")
        return gpus


class NodeHeartbeat(BaseModel):
    boot_id: str = Field(min_length=1, max_length=64)
    running: list[Annotated[str, Field(max_length=64)]] = Field(default=[], max_length=MAX_RUNNING)
    #: Each GPU's latest health report, this node's GPUs only.
    gpus: list[GpuReport] = Field(default=[], max_length=MAX_NODE_GPUS)

    @field_validator("gpus")
    @classmethod
    def _unique(cls, gpus: list[GpuReport]) -> list[GpuReport]:
        _indices_unique(gpus)
        return gpus


class NodeAnswer(BaseModel):
    accepted: bool
    #: The allocations the store holds on the node: the agent renews its members' leases with them.
    live_allocations: list[str]
    #: Of the reported ``running`` allocations, those the store no longer holds there: the agent kills them.
    fence: list[str] = []
    #: GPU index -> faults the simulated backend should report (injected by an admin).
    faults: dict[int, list[dict[str, Any]]] = {}


class CheckpointReportIn(BaseModel):
    """An agent's report of the newest checkpoint of the rank 0 member it runs."""

    allocation_id: str = Field(min_length=1, max_length=64)
    #: The path the job's LATEST marker names, as the job sees it.
    path: str = Field(min_length=1, max_length=1024)
    #: The report's number within its attempt (1, 2, ...): a lower one than the newest recorded comes late.
    seq: int = Field(ge=1)


class CheckpointRecorded(BaseModel):
    #: False when a newer report was recorded already (this one came late and changed nothing).
    latest: bool


class FaultInjection(BaseModel):
    #: One of fairgang.health.FAULT_KINDS: xid, ecc_uncorrectable, ecc_correctable, retired_pages, thermal, power.
    kind: str
    xid: int | None = None
    count: int = 1


TokenRole = Literal["admin", "tenant_admin", "tenant"]


class TokenRequest(BaseModel):
    """A new token: its role, its tenant (a tenant admin's own by default; none for a platform admin's), a name
    and, optionally, how long it lives (``30d``, ``12h``; none: until revoked)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@-]*$")
    role: TokenRole = "tenant"
    tenant: str | None = Field(default=None, min_length=1, max_length=64)
    expires_in: Seconds | None = Field(
        default=None, gt=0, le=10 * 365 * 86400, description="How long the token works (e.g. 30d); none: until revoked."
    )


class TokenCreated(BaseModel):
    """The new token and its secret: shown once, never again."""

    token: str
    info: TokenInfo


class QuotaChange(BaseModel):
    """A tenant's share of one GPU type (as in the cluster config)."""

    model_config = ConfigDict(extra="forbid")

    nominal: int = Field(default=0, ge=0)
    borrow_limit: int | None = Field(default=None, ge=0)
    lend_limit: int | None = Field(default=None, ge=0)


class TenantChange(BaseModel):
    """An admin's change of a tenant's policy: only the fields given change. ``quotas`` names the GPU types whose
    share changes (null: the type is taken away); ``cohort`` or ``checkpoint_prefix`` null clears it."""

    model_config = ConfigDict(extra="forbid")

    weight: float | None = Field(default=None, gt=0)
    cohort: str | None = Field(default=None, min_length=1, max_length=64)
    quotas: dict[Annotated[str, Field(min_length=1, max_length=64)], QuotaChange | None] | None = Field(default=None, max_length=64)
    max_gpus_per_job: int | None = Field(default=None, ge=1)
    max_runtime: Seconds | None = Field(default=None, gt=0)
    max_concurrent_jobs: int | None = Field(default=None, ge=1)
    checkpoint_prefix: str | None = Field(default=None, min_length=1, max_length=1024)
    submissions_per_minute: float | None = Field(default=None, gt=0)
    submission_burst: int | None = Field(default=None, ge=1)
    #: Glob patterns of the images its jobs may use; null: any.
    allowed_images: list[Annotated[str, Field(min_length=1, max_length=512)]] | None = Field(default=None, max_length=64)


class TenantChanged(BaseModel):
    """The tenant's policy after the change (the next scheduling cycle uses it), and what the change left overcommitted."""

    tenant: str
    before: dict[str, Any]
    after: dict[str, Any]
    warnings: list[str]


class AuditEventPublic(BaseModel):
    id: int
    at: float
    actor: str
    action: str
    target: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class ProblemField(BaseModel):
    """One thing wrong with a request: the field (dotted path) and why."""

    field: str
    reason: str


class Problem(BaseModel):
    """Every error the API answers (RFC 9457 problem details, ``application/problem+json``); a refusal that names
    fields lists them in ``problems``."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    problems: list[ProblemField] | None = None


def _error(description: str) -> dict[str, Any]:
    return {
        "model": Problem,
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


#: The errors any route may answer, declared on every route of the OpenAPI spec.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("The body is not the JSON it claims to be."),
    401: _error("No token, or one unknown, revoked or expired."),
    403: _error("The caller's role may not do this."),
    404: _error("No such thing, or another tenant's."),
    409: _error("The thing's state does not allow this now."),
    413: _error("The request body is over the API's limit."),
    422: _error("The request is invalid; ``problems`` names each field."),
    429: _error("Too many requests (a tenant's submission rate, or refused tokens); see Retry-After."),
    503: _error("The store is busy or Temporal unreachable; see Retry-After."),
}
