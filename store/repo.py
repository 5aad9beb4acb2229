"""Data access: every state change of the platform is one short transaction here.

Functions take keyword-only arguments and a :class:`~store.db.Database` or an open
session. Each write is idempotent: repeating it (a retried activity, a re-sent signal)
changes nothing the second time.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, String, bindparam, case, cast, func, literal, literal_column, not_, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlmodel import col

from fairgang.admission import FleetShape
from fairgang.cluster import ClusterConfig
from fairgang.spec import TERMINAL_STATES, JobSpec, JobState
from store import usage
from store.db import Database, bump_change_feed
from store.models import (
    Allocation,
    AllocationGpu,
    ApiToken,
    ChangeFeed,
    Gpu,
    HealthEvent,
    Job,
    JobEvent,
    Node,
    SchedulerLease,
    Sweep,
    SweepTrial,
    Tenant,
)

TERMINAL = {s.value for s in TERMINAL_STATES}
LIVE_ALLOCATION_STATES = ("BOUND", "ACKED")
#: An allocation whose attempt ended without its members' end being confirmed (a lost node): its GPUs stay
#: held, but agents are told it is no longer held, so they (and their shims) kill what still runs of it.
REVOKED = "REVOKED"


def hash_token(token: str) -> str:
    """Tokens are stored as SHA-256 digests only."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, a tenant, or a node agent."""

    role: str
    tenant: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


# ---------------------------------------------------------------- config and auth


async def seed_cluster(db: Database, config: ClusterConfig, *, now: float | None = None) -> None:
    """Load tenants, tokens and nodes from a cluster config (safe to repeat).

    Existing rows are updated in place; node state, boot id and heartbeats are kept.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        for t in config.tenants:
            row = await session.get(Tenant, t.name)
            values: dict[str, Any] = dict(
                weight=t.weight,
                cohort=t.cohort,
                quotas={k: v.model_dump() for k, v in t.quotas.items()},
                max_gpus_per_job=t.max_gpus_per_job,
                max_runtime_s=t.max_runtime,
                max_concurrent_jobs=t.max_concurrent_jobs,
                checkpoint_prefix=t.checkpoint_prefix,
            )
            if row is None:
                session.add(Tenant(name=t.name, **values))
            else:
                for key, value in values.items():
                    setattr(row, key, value)
        await session.flush()
        wanted: list[tuple[str, str, str | None]] = [(tok, "admin", None) for tok in config.admin_tokens]
        wanted += [(config.node_token, "node", None)]
        wanted += [(tok, "tenant", t.name) for t in config.tenants for tok in t.tokens]
        for token, role, tenant in wanted:
            digest = hash_token(token)
            existing = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash) == digest))).scalar_one_or_none()
            if existing is None:
                session.add(ApiToken(token_hash=digest, role=role, tenant=tenant, created_at=now))
            else:
                existing.role, existing.tenant = role, tenant
        for n in config.nodes:
            node = await session.get(Node, n.id)
            if node is None:
                session.add(Node(id=n.id, gpu_type=n.gpu_type, gpu_count=n.gpus, labels=dict(n.labels)))
            else:
                node.gpu_type, node.gpu_count, node.labels = n.gpu_type, n.gpus, dict(n.labels)
            await session.flush()
            for index in range(n.gpus):
                if await session.get(Gpu, (n.id, index)) is None:
                    session.add(Gpu(node_id=n.id, index=index))
        await bump_change_feed(session)


async def authenticate(db: Database, token: str) -> Principal | None:
    async with db.sessions() as session:
        row = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash) == hash_token(token)))).scalar_one_or_none()
    if row is None:
        return None
    return Principal(role=row.role, tenant=row.tenant)


async def get_tenant(db: Database, name: str) -> Tenant | None:
    async with db.sessions() as session:
        return await session.get(Tenant, name)


async def fleet_shape(db: Database) -> FleetShape:
    """GPU type -> {GPUs per node: nodes}, and the topology levels the nodes' labels use (for admission).

    Counted in SQL: a submission reads a row per node shape and per distinct label set, not every node.
    """
    async with db.sessions() as session:
        shape_query = select(col(Node.gpu_type), col(Node.gpu_count), func.count()).group_by(col(Node.gpu_type), col(Node.gpu_count))
        counts = (await session.execute(shape_query)).all()
        label_sets = (await session.execute(select(cast(col(Node.labels), String)).distinct())).scalars().all()
    shapes: dict[str, dict[int, int]] = {}
    for gpu_type, per_node, nodes in counts:
        shapes.setdefault(gpu_type, {})[per_node] = nodes
    levels = {"node"}
    for raw in label_sets:
        levels.update(json.loads(raw) if raw else {})
    return FleetShape(shapes=shapes, levels=frozenset(levels))


# ---------------------------------------------------------------- jobs


def _event(job_id: str, attempt: int, kind: str, message: str, key: str, now: float, **data: Any) -> JobEvent:
    return JobEvent(job_id=job_id, ts=now, attempt=attempt, kind=kind, message=message, data=data, dedupe_key=key)


async def create_job(
    db: Database,
    *,
    spec: JobSpec,
    tenant: str,
    max_concurrent_jobs: int | None = None,
    now: float | None = None,
    job_id: str | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job, or return the one already submitted with the same key.

    The idempotency key is the client's, else the job name (SPEC R1.3). The concurrent
    job cap is checked in the same transaction as the insert. ``job_id`` gives the job a
    caller-chosen id (a sweep's trials: sweep id + trial index) instead of a random one.

    Returns:
        (job, created): created is False when the key was already used.

    Raises:
        AdmissionRefused: when the tenant is at its concurrent-job cap.
    """
    now = time.time() if now is None else now
    key = spec.idempotency_key or f"name:{spec.name}"
    existing = await find_job_by_key(db, tenant=tenant, key=key)
    if existing is not None:
        return existing, False
    job = Job(
        id=job_id or new_id("j"),
        tenant=tenant,
        name=spec.name,
        idempotency_key=key,
        spec=spec.model_dump(mode="json", exclude={"idempotency_key"}) | {"tenant": tenant},
        gpu_type=spec.gpu_type,
        gpu_count=spec.gpu_count,
        priority=spec.priority,
        state=JobState.QUEUED.value,
        attempt=1,
        pending_reason="waiting for its workflow to start",
        created_at=now,
        updated_at=now,
        queued_at=now,
    )
    try:
        async with db.transaction() as session:
            if max_concurrent_jobs is not None:
                active = (
                    await session.execute(
                        select(func.count()).select_from(Job).where(col(Job.tenant) == tenant, col(Job.state).not_in(TERMINAL))
                    )
                ).scalar_one()
                if active >= max_concurrent_jobs:
                    raise AdmissionRefused(
                        "tenant",
                        f"tenant '{tenant}' already has {active} unfinished jobs (limit {max_concurrent_jobs})",
                    )
            session.add(job)
            await session.flush()
            session.add(_event(job.id, 1, "SUBMITTED", f"submitted by tenant {tenant}", "submitted", now))
    except IntegrityError:
        # A concurrent submit with the same key won the race: return its job.
        existing = await find_job_by_key(db, tenant=tenant, key=key)
        if existing is None:
            raise
        return existing, False
    return job, True


class StalePlacement(Exception):
    """A placement names an allocation the store does not hold for that job and attempt."""


class AdmissionRefused(Exception):
    """The job is valid but this tenant may not run it (SPEC R2.1)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


async def find_job_by_key(db: Database, *, tenant: str, key: str) -> Job | None:
    async with db.sessions() as session:
        return (await session.execute(select(Job).where(col(Job.tenant) == tenant, col(Job.idempotency_key) == key))).scalar_one_or_none()


async def get_job(db: Database, job_id: str) -> Job | None:
    async with db.sessions() as session:
        return await session.get(Job, job_id)


async def list_jobs(db: Database, *, tenant: str | None = None, state: str | None = None, limit: int = 200) -> Sequence[Job]:
    query = select(Job).order_by(col(Job.created_at).desc(), col(Job.id)).limit(limit)
    if tenant is not None:
        query = query.where(col(Job.tenant) == tenant)
    if state is not None:
        query = query.where(col(Job.state) == state)
    async with db.sessions() as session:
        return (await session.execute(query)).scalars().all()


async def job_events(db: Database, job_id: str) -> Sequence[JobEvent]:
    async with db.sessions() as session:
        query = select(JobEvent).where(col(JobEvent.job_id) == job_id).order_by(col(JobEvent.id))
        return (await session.execute(query)).scalars().all()


async def job_allocations(db: Database, job_id: str) -> Sequence[Allocation]:
    async with db.sessions() as session:
        query = select(Allocation).where(col(Allocation.job_id) == job_id).order_by(col(Allocation.attempt))
        return (await session.execute(query)).scalars().all()


async def jobs_without_workflow(db: Database, *, older_than: float, limit: int | None = None) -> Sequence[Job]:
    """Jobs whose workflow start may have been lost (the API died in between), oldest first (at most ``limit``)."""
    async with db.sessions() as session:
        query = (
            select(Job)
            .where(
                not_(col(Job.workflow_started)),  # matches the partial index ix_job_without_workflow
                col(Job.state).not_in(TERMINAL),
                col(Job.created_at) < older_than,
            )
            .order_by(col(Job.created_at), col(Job.id))
            .limit(limit)
        )
        return (await session.execute(query)).scalars().all()


async def mark_workflow_started(db: Database, job_id: str) -> None:
    await mark_workflows_started(db, [job_id])


async def mark_workflows_started(db: Database, job_ids: Sequence[str]) -> None:
    """Record that these jobs' workflows exist (one statement)."""
    if not job_ids:
        return
    async with db.transaction() as session:
        await session.execute(update(Job).where(col(Job.id).in_(list(job_ids))).values(workflow_started=True))


async def _add_event_once(session: AsyncSession, event: JobEvent) -> bool:
    """Append an event unless one with its dedupe key exists. Returns True if added."""
    exists = (
        await session.execute(
            select(col(JobEvent.id)).where(col(JobEvent.job_id) == event.job_id, col(JobEvent.dedupe_key) == event.dedupe_key)
        )
    ).first()
    if exists is not None:
        return False
    session.add(event)
    return True


async def _release_live(session: AsyncSession, job_id: str, now: float, *, only: str | None = None) -> list[str]:
    """Release the job's live allocations (all, or just ``only``); returns their ids."""
    query = select(Allocation).where(col(Allocation.job_id) == job_id, col(Allocation.state).in_((*LIVE_ALLOCATION_STATES, REVOKED)))
    if only is not None:
        query = query.where(col(Allocation.id) == only)
    released = []
    owner: tuple[str, str] | None = None
    for alloc in (await session.execute(query)).scalars().all():
        alloc.state, alloc.released_at = "RELEASED", now
        await session.execute(update(AllocationGpu).where(col(AllocationGpu.allocation_id) == alloc.id).values(live=False))
        if owner is None:
            row = (await session.execute(select(col(Job.tenant), col(Job.gpu_type)).where(col(Job.id) == job_id))).one()
            owner = (row[0], row[1])
        await usage.allocation_released(
            session, tenant=owner[0], gpu_type=owner[1], gpus=usage.gpus_of(alloc.members), start=alloc.created_at, end=now
        )
        released.append(alloc.id)
    if released:
        await bump_change_feed(session)
    return released


async def record_transition(
    db: Database,
    *,
    job_id: str,
    attempt: int,
    state: JobState,
    event_key: str,
    message: str = "",
    allocation_id: str | None = None,
    exit_code: int | None = None,
    end_reason: str | None = None,
    pending_reason: str | None = None,
    now: float | None = None,
) -> Job:
    """Move a job to ``state`` for ``attempt`` and log it, once.

    Idempotent by ``event_key``: a repeat returns the job unchanged. A terminal job, or
    a transition for an older attempt, changes nothing. Moving to a terminal state
    releases the job's live allocations in the same transaction; moving to LAUNCHING
    acknowledges ``allocation_id``.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        if job.state in TERMINAL or attempt < job.attempt:
            return job
        if not await _add_event_once(
            session,
            _event(job_id, attempt, state.value, message, event_key, now, allocation_id=allocation_id, exit_code=exit_code),
        ):
            return job
        job.state, job.updated_at = state.value, now
        if state is JobState.LAUNCHING and allocation_id is not None:
            alloc = await session.get(Allocation, allocation_id)
            if alloc is None or alloc.job_id != job_id or alloc.attempt != attempt or alloc.state not in LIVE_ALLOCATION_STATES:
                raise StalePlacement(f"allocation {allocation_id} is not a live binding of {job_id} attempt {attempt}")
            job.pending_reason = None
            if alloc.state == "BOUND":
                alloc.state, alloc.acked_at = "ACKED", now
        if state is JobState.RUNNING and job.started_at is None:
            job.started_at = now
        if pending_reason is not None:
            job.pending_reason = pending_reason
        if state.terminal:
            job.finished_at, job.exit_code, job.end_reason = now, exit_code, end_reason or message
            job.pending_reason = None
            await _release_live(session, job_id, now)
        return job


async def requeue_job(db: Database, *, job_id: str, from_attempt: int, reason: str, now: float | None = None) -> Job:
    """Release the attempt's GPUs and queue the job again as attempt + 1 (idempotent)."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        if job.state in TERMINAL or job.attempt != from_attempt:
            return job
        await _release_live(session, job_id, now)
        job.attempt = from_attempt + 1
        job.state, job.updated_at, job.queued_at = JobState.QUEUED.value, now, now
        job.pending_reason = f"requeued: {reason}"
        session.add(_event(job_id, job.attempt, "REQUEUED", reason, f"requeue-{from_attempt}", now))
        await bump_change_feed(session)
        return job


async def release_allocation(db: Database, *, job_id: str, allocation_id: str, now: float | None = None) -> bool:
    """Release one allocation (idempotent). Returns True when it was live."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        return bool(await _release_live(session, job_id, now, only=allocation_id))


async def mark_queued(db: Database, *, job_id: str, attempt: int, now: float | None = None) -> Job:
    """The workflow is waiting for placement: make the job visible to the scheduler."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        changed = False
        if not job.workflow_started:
            job.workflow_started, changed = True, True
        if job.state == JobState.QUEUED.value and job.pending_reason == "waiting for its workflow to start":
            job.pending_reason, changed = "waiting for placement", True
        if changed:
            job.updated_at = now
            await bump_change_feed(session)
        return job


async def set_latest_checkpoint(
    db: Database, *, job_id: str, checkpoint: str, attempt: int | None = None, now: float | None = None
) -> None:
    """Record the job's newest checkpoint (idempotent per path)."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None or job.latest_checkpoint == checkpoint:
            return
        job.latest_checkpoint, job.latest_checkpoint_at = checkpoint, now
        key = f"checkpoint:{checkpoint}"[:160]
        await _add_event_once(session, _event(job_id, attempt or job.attempt, "CHECKPOINT", checkpoint, key, now))


# ---------------------------------------------------------------- nodes


async def register_node(
    db: Database,
    *,
    node_id: str,
    gpu_type: str,
    gpu_count: int,
    labels: dict[str, str],
    boot_id: str,
    gpus: list[dict[str, Any]],
    address: str | None = None,
    now: float | None = None,
) -> tuple[Node, list[str]]:
    """An agent (re)registers its node. Returns the node and its live allocation ids.

    A node that comes back with a new boot id keeps its live allocations in the store
    (their workflows decide what became of them); the agent kills any process whose
    allocation is not in the returned list (invariant 4).
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        if node is None:
            node = Node(id=node_id, gpu_type=gpu_type, gpu_count=gpu_count, labels=labels)
            session.add(node)
        else:
            node.gpu_type, node.gpu_count = gpu_type, gpu_count
            if labels:
                node.labels = labels
        was_lost = node.state == "LOST"
        node.boot_id, node.last_heartbeat, node.registered_at, node.address = boot_id, now, now, address
        if node.state in ("DOWN", "LOST"):
            node.state = "READY"
        await session.flush()
        for gpu in gpus:
            row = await session.get(Gpu, (node_id, gpu["index"]))
            if row is None:
                session.add(Gpu(node_id=node_id, index=gpu["index"], uuid=gpu.get("uuid"), health=gpu.get("health", {})))
            else:
                row.uuid, row.health = gpu.get("uuid"), gpu.get("health", {})
        await bump_change_feed(session)
        # A node declared lost comes back empty-handed: whatever it still runs is fenced.
        live = [] if was_lost else await _live_allocations_on(session, node_id)
        return node, live


def _held() -> ColumnElement[Any]:
    """``allocation_gpu.live`` as a bare term: SQLite uses the partial index ``uq_allocation_gpu_live`` (WHERE live)
    only for a query whose WHERE holds that very term, and SQLAlchemy writes ``live = 1`` for the column on SQLite."""
    return literal_column(f"{AllocationGpu.__tablename__}.live")


#: Built once: at hundreds of heartbeats a second, building a statement costs as much as running it.
_LIVE_ON_NODE = (
    select(col(AllocationGpu.allocation_id))
    .join(Allocation, col(Allocation.id) == col(AllocationGpu.allocation_id))
    .where(col(AllocationGpu.node_id) == bindparam("b_node"), _held(), col(Allocation.state) != REVOKED)
    .distinct()
)


async def _live_allocations_on(session: AsyncSession | AsyncConnection, node_id: str) -> list[str]:
    """The allocations the store holds on the node (a REVOKED one keeps its GPUs but is not held)."""
    return sorted(r for (r,) in (await session.execute(_LIVE_ON_NODE, {"b_node": node_id})).all())


async def revoke_allocation(db: Database, *, job_id: str, allocation_id: str, reason: str, now: float | None = None) -> bool:
    """Stop holding a live allocation for its agents, keeping its GPUs until it is released (idempotent).

    From then on no heartbeat answer holds it, so its agents stop renewing its members' leases and kill
    them (see worker_agent/shim.py); the workflow waits out the lease before it queues the job again.
    Returns True when it was live.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        alloc = await session.get(Allocation, allocation_id)
        if alloc is None or alloc.job_id != job_id or alloc.state not in LIVE_ALLOCATION_STATES:
            return False
        alloc.state = REVOKED
        session.add(_event(job_id, alloc.attempt, "REVOKED", reason, f"revoke-{allocation_id}", now, allocation_id=allocation_id))
        return True


async def report_running(db: Database, *, node_id: str, running: Sequence[str], live: Sequence[str], now: float | None = None) -> list[str]:
    """An agent's report of the allocations it runs: returns those the store no longer holds there.

    The agent kills their members; each is logged once per node as a ``FENCED`` event of its job.
    """
    stale = sorted(set(running) - set(live))
    if not stale:
        return []
    now = time.time() if now is None else now
    async with db.transaction() as session:
        for allocation_id in stale:
            alloc = await session.get(Allocation, allocation_id)
            if alloc is None:
                continue
            message = f"node {node_id} still ran allocation {allocation_id} ({alloc.state.lower()}): its agent kills it"
            key = f"fenced-{allocation_id}-{node_id}"[:160]
            await _add_event_once(session, _event(alloc.job_id, alloc.attempt, "FENCED", message, key, now, allocation_id=allocation_id))
    return stale


@dataclass(frozen=True)
class GpuHealth:
    """One GPU of a node as its heartbeat reads it (locked until the heartbeat's transaction ends)."""

    index: int
    healthy: bool
    health: dict[str, Any]


#: The health policy a heartbeat applies inside its transaction: the node's GPUs as stored in; out, for each
#: GPU whose report is to be stored, (health to store, take the GPU out of service).
HealthPolicy = Callable[[dict[int, GpuHealth]], dict[int, tuple[dict[str, Any], bool]]]


@dataclass(frozen=True)
class Heartbeat:
    """What :func:`record_heartbeat` did."""

    accepted: bool
    #: The allocations the store holds on the node.
    live: list[str]
    #: The node's state ("READY", "CORDONED").
    state: str = ""
    gpu_count: int = 0
    #: The node's GPUs as read, before the heartbeat's health was written (empty without a policy).
    gpus: dict[int, GpuHealth] = field(default_factory=dict)
    #: Indices of the GPUs this heartbeat took out of service.
    taken_out: list[int] = field(default_factory=list)
    #: (GPU index, job id, attempt) of the live allocations on the node, when a GPU was taken out.
    gpu_jobs: list[tuple[int, str, int]] = field(default_factory=list)


_NODE = Node.__table__  # type: ignore[attr-defined]
_GPU = Gpu.__table__  # type: ignore[attr-defined]
_WRITE_GPU_HEALTH = (
    update(_GPU)
    .where(_GPU.c.node_id == bindparam("b_node"), _GPU.c.index == bindparam("b_index"))
    .values(health=bindparam("b_health"), healthy=bindparam("b_healthy"))
)
_BEAT = (
    update(_NODE)
    .where(_NODE.c.id == bindparam("b_node"), _NODE.c.boot_id == bindparam("b_boot"), _NODE.c.state != "LOST")
    .values(last_heartbeat=bindparam("b_now"))
    .returning(_NODE.c.state, _NODE.c.gpu_count)
)
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")
_NODE_GPUS = select(_GPU.c.index, _GPU.c.healthy, _GPU.c.health).where(_GPU.c.node_id == bindparam("b_node")).with_for_update()


async def record_heartbeat(
    db: Database, *, node_id: str, boot_id: str, policy: HealthPolicy | None = None, now: float | None = None
) -> Heartbeat:
    """Record a heartbeat and, with ``policy``, its GPUs' health: one transaction over the node's own rows only.

    A heartbeat from another boot of the node, or from a node declared lost, is refused: the agent must
    register again, and a lost node's allocations stay lost. The node's GPU rows are read locked, so the
    ``injected`` faults written back are the row's own (an admin's injection or return is never lost to a
    report assessed meanwhile); every GPU's health is written in one statement, and only the GPUs whose
    health or in-service flag changed. Taking a GPU out wakes the placement service.
    """
    now = time.time() if now is None else now
    # Core statements on one connection: at hundreds of heartbeats a second the ORM session's cost per
    # statement is most of a heartbeat's. register_node sets the boot id and the first heartbeat together,
    # so a heartbeat that passes the boot check always finds the node heard from already.
    async with db.engine.begin() as conn:
        node = (await conn.execute(_BEAT, {"b_node": node_id, "b_boot": boot_id, "b_now": now})).first()
        if node is None:
            return Heartbeat(accepted=False, live=[])
        gpus: dict[int, GpuHealth] = {}
        taken_out: list[int] = []
        if policy is not None:
            rows = (await conn.execute(_NODE_GPUS, {"b_node": node_id})).all()
            gpus = {i: GpuHealth(index=i, healthy=bool(ok), health=h or {}) for i, ok, h in rows}
            writes = []
            for index, (health, out) in sorted(policy(gpus).items()):
                gpu = gpus.get(index)
                if gpu is None:
                    continue
                injected = gpu.health.get("injected")
                health = {k: v for k, v in health.items() if k != "injected"} | ({"injected": injected} if injected else {})
                healthy = gpu.healthy and not out
                if health == gpu.health and healthy == gpu.healthy:
                    continue
                writes.append({"b_node": node_id, "b_index": index, "b_health": health, "b_healthy": healthy})
                if healthy != gpu.healthy:
                    taken_out.append(index)
            if writes:
                await conn.execute(_WRITE_GPU_HEALTH, writes)
        if taken_out:
            await bump_change_feed(conn)
        elif conn.dialect.name == "postgresql":
            # Nothing here the next heartbeat, 2 s on, would not write again: the commit need not wait
            # for its WAL flush (still atomic; a server crash may lose only the last moment's beats).
            await conn.execute(_ASYNC_COMMIT)
        live = await _live_allocations_on(conn, node_id)
        jobs = await _gpu_jobs(conn, node_id) if taken_out else []
        return Heartbeat(
            accepted=True, live=live, state=node.state, gpu_count=node.gpu_count, gpus=gpus, taken_out=taken_out, gpu_jobs=jobs
        )


async def node_heartbeat(db: Database, *, node_id: str, boot_id: str, now: float | None = None) -> tuple[bool, list[str]]:
    """Record a heartbeat without health reports. Returns (accepted, live allocation ids on the node)."""
    beat = await record_heartbeat(db, node_id=node_id, boot_id=boot_id, now=now)
    return beat.accepted, beat.live


async def mark_lost_nodes(db: Database, *, lost_after_s: float, now: float | None = None) -> dict[str, list[str]]:
    """Declare nodes silent for ``lost_after_s`` LOST. Returns {node id: ids of jobs with live allocations there}.

    A lost node gets no new work; its heartbeats are refused until its agent registers again,
    and then it gets back no allocation (see :func:`register_node`).
    """
    now = time.time() if now is None else now
    lost: dict[str, list[str]] = {}
    async with db.transaction() as session:
        query = select(Node).where(
            col(Node.state).in_(("READY", "CORDONED")),
            col(Node.last_heartbeat).is_not(None),
            col(Node.last_heartbeat) < now - lost_after_s,
        )
        for node in (await session.execute(query)).scalars().all():
            node.state = "LOST"
            jobs = (
                await session.execute(
                    select(col(Allocation.job_id))
                    .join(AllocationGpu, col(AllocationGpu.allocation_id) == col(Allocation.id))
                    .where(col(AllocationGpu.node_id) == node.id, _held())
                    .distinct()
                )
            ).all()
            lost[node.id] = sorted(j for (j,) in jobs)
        if lost:
            await bump_change_feed(session)
    return lost


async def list_nodes(db: Database) -> Sequence[Node]:
    async with db.sessions() as session:
        return (await session.execute(select(Node).order_by(col(Node.id)))).scalars().all()


async def get_node(db: Database, node_id: str) -> Node | None:
    async with db.sessions() as session:
        return await session.get(Node, node_id)


async def get_gpu(db: Database, *, node_id: str, index: int) -> Gpu | None:
    async with db.sessions() as session:
        return await session.get(Gpu, (node_id, index))


async def list_gpus(db: Database) -> Sequence[Gpu]:
    async with db.sessions() as session:
        return (await session.execute(select(Gpu).order_by(col(Gpu.node_id), col(Gpu.index)))).scalars().all()


async def live_allocation_gpus(db: Database) -> Sequence[AllocationGpu]:
    async with db.sessions() as session:
        return (await session.execute(select(AllocationGpu).where(_held()))).scalars().all()


async def queued_jobs(db: Database) -> Sequence[Job]:
    async with db.sessions() as session:
        query = (
            select(Job)
            .where(col(Job.state) == JobState.QUEUED.value, col(Job.workflow_started) == True)  # noqa: E712
            .order_by(col(Job.queued_at), col(Job.id))
        )
        return (await session.execute(query)).scalars().all()


async def change_version(db: Database) -> int:
    async with db.sessions() as session:
        row = await session.get(ChangeFeed, 1)
        return row.version if row else 0


# ---------------------------------------------------------------- placement


@dataclass(frozen=True)
class BindingRow:
    """A binding the placement service wants to commit."""

    job_id: str
    attempt: int
    members: list[dict[str, Any]]


class LeaseLost(Exception):
    """The caller no longer holds the leader lease; nothing was committed."""


async def acquire_lease(db: Database, *, name: str, holder: str, ttl_s: float, now: float | None = None) -> int | None:
    """Take or renew the leader lease. Returns the epoch held, or None if another holds it.

    The epoch grows each time the lease changes hands, so a stale leader's commits
    (checked against the epoch) fail.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        lease = await session.get(SchedulerLease, name, with_for_update=True)
        if lease is None:
            session.add(SchedulerLease(name=name, holder=holder, epoch=1, expires_at=now + ttl_s))
            return 1
        if lease.holder == holder and lease.expires_at >= now:
            lease.expires_at = now + ttl_s
            return lease.epoch
        if lease.expires_at < now:
            lease.holder, lease.epoch, lease.expires_at = holder, lease.epoch + 1, now + ttl_s
            return lease.epoch
        return None


async def commit_bindings(
    db: Database,
    *,
    bindings: Sequence[BindingRow],
    pending_reasons: dict[str, str],
    lease_name: str,
    epoch: int,
    now: float | None = None,
) -> list[Allocation]:
    """Commit a cycle's bindings in one transaction guarded by the lease epoch.

    Each binding is a compare-and-set on the job (still QUEUED at that attempt) plus one
    ``allocation_gpu`` row per GPU; a binding that lost a race (job cancelled, GPU taken)
    is skipped through a savepoint and the rest commit. Each binding's GPUs start counting in the
    usage ledgers (store/usage.py) in the same transaction. ``pending_reasons`` are written in one
    statement to the jobs still queued: pass only those that changed.

    Raises:
        LeaseLost: when ``epoch`` is no longer the lease's epoch.
    """
    now = time.time() if now is None else now
    committed: list[Allocation] = []
    async with db.transaction() as session:
        lease = await session.get(SchedulerLease, lease_name, with_for_update=True)
        if lease is None or lease.epoch != epoch or lease.expires_at < now:
            raise LeaseLost(f"lease {lease_name} epoch {epoch} is no longer held")
        for binding in bindings:
            alloc = Allocation(
                id=new_id("a"),
                job_id=binding.job_id,
                attempt=binding.attempt,
                epoch=epoch,
                members=binding.members,
                created_at=now,
            )
            try:
                async with session.begin_nested():
                    owner = (
                        await session.execute(
                            update(Job)
                            .where(
                                col(Job.id) == binding.job_id, col(Job.state) == JobState.QUEUED.value, col(Job.attempt) == binding.attempt
                            )
                            .values(state=JobState.PLACED.value, pending_reason=None, updated_at=now)
                            .returning(col(Job.tenant), col(Job.gpu_type))
                        )
                    ).first()
                    if owner is None:
                        raise _SkipBinding
                    session.add(alloc)
                    await session.flush()
                    for member in binding.members:
                        for index in member["gpu_indices"]:
                            session.add(AllocationGpu(allocation_id=alloc.id, node_id=member["node_id"], gpu_index=index))
                    await session.flush()
                    await usage.allocation_started(
                        session, tenant=owner[0], gpu_type=owner[1], gpus=usage.gpus_of(binding.members), start=now
                    )
                    nodes = ", ".join(f"{m['node_id']}[{','.join(map(str, m['gpu_indices']))}]" for m in binding.members)
                    session.add(
                        _event(
                            binding.job_id,
                            binding.attempt,
                            "PLACED",
                            f"placed on {nodes}",
                            f"placed-{binding.attempt}",
                            now,
                            allocation_id=alloc.id,
                        )
                    )
                    await session.flush()
                committed.append(alloc)
            except (_SkipBinding, IntegrityError):
                continue
        if pending_reasons:
            # One statement for all of them; the caller passes only the reasons that changed.
            table = Job.__table__  # type: ignore[attr-defined]
            await session.execute(
                update(table)
                .where(table.c.id == bindparam("job"), table.c.state == JobState.QUEUED.value)
                .values(pending_reason=bindparam("reason")),
                [{"job": job_id, "reason": reason} for job_id, reason in sorted(pending_reasons.items())],
            )
    return committed


class _SkipBinding(Exception):
    pass


async def unacked_allocations(
    db: Database, *, older_than: float, now: float | None = None, limit: int | None = None
) -> Sequence[Allocation]:
    """Bindings committed but not acknowledged by their workflow, last signalled before ``older_than``.

    With ``now``, each is signalled again with backoff: only once it has waited since its last signal at
    least as long as it had waited before that signal (so the gaps double while Temporal lags). Oldest
    first, at most ``limit``.
    """
    last = func.coalesce(col(Allocation.signalled_at), col(Allocation.created_at))
    query = select(Allocation).where(col(Allocation.state) == "BOUND", last < older_than)
    if now is not None:
        signalled = col(Allocation.signalled_at)
        query = query.where(or_(signalled.is_(None), now - signalled >= signalled - col(Allocation.created_at)))
    async with db.sessions() as session:
        return (await session.execute(query.order_by(last, col(Allocation.id)).limit(limit))).scalars().all()


async def mark_signalled(db: Database, allocation_ids: Sequence[str], now: float | None = None) -> None:
    if not allocation_ids:
        return
    now = time.time() if now is None else now
    async with db.transaction() as session:
        await session.execute(update(Allocation).where(col(Allocation.id).in_(allocation_ids)).values(signalled_at=now))


# ---------------------------------------------------------------- sweeps

SWEEP_TERMINAL = ("COMPLETED", "CANCELLED", "FAILED")


async def create_sweep(
    db: Database,
    *,
    sweep_id: str,
    tenant: str,
    name: str,
    idempotency_key: str,
    spec: dict[str, Any],
    trial_count: int,
    max_concurrent: int,
    schedule_id: str | None = None,
    state: str = "SUBMITTED",
    reason: str | None = None,
    now: float | None = None,
) -> tuple[Sweep, bool]:
    """Insert a sweep, or return the one already stored under the same (tenant, key).

    Returns:
        (sweep, created): created is False when the key was already used.
    """
    now = time.time() if now is None else now
    existing = await find_sweep_by_key(db, tenant=tenant, key=idempotency_key)
    if existing is not None:
        return existing, False
    sweep = Sweep(
        id=sweep_id,
        tenant=tenant,
        name=name,
        idempotency_key=idempotency_key,
        spec=spec,
        state=state,
        trial_count=trial_count,
        max_concurrent=max_concurrent,
        schedule_id=schedule_id,
        reason=reason,
        created_at=now,
        updated_at=now,
        finished_at=now if state in SWEEP_TERMINAL else None,
    )
    try:
        async with db.transaction() as session:
            session.add(sweep)
    except IntegrityError:
        existing = await find_sweep_by_key(db, tenant=tenant, key=idempotency_key)
        if existing is None:
            raise
        return existing, False
    return sweep, True


async def find_sweep_by_key(db: Database, *, tenant: str, key: str) -> Sweep | None:
    async with db.sessions() as session:
        query = select(Sweep).where(col(Sweep.tenant) == tenant, col(Sweep.idempotency_key) == key)
        return (await session.execute(query)).scalar_one_or_none()


async def get_sweep(db: Database, sweep_id: str) -> Sweep | None:
    async with db.sessions() as session:
        return await session.get(Sweep, sweep_id)


async def list_sweeps(
    db: Database, *, tenant: str | None = None, schedule_id: str | None = None, state: str | None = None, limit: int = 200
) -> Sequence[Sweep]:
    query = select(Sweep).order_by(col(Sweep.created_at).desc(), col(Sweep.id)).limit(limit)
    if tenant is not None:
        query = query.where(col(Sweep.tenant) == tenant)
    if schedule_id is not None:
        query = query.where(col(Sweep.schedule_id) == schedule_id)
    if state is not None:
        query = query.where(col(Sweep.state) == state)
    async with db.sessions() as session:
        return (await session.execute(query)).scalars().all()


async def set_sweep_state(
    db: Database,
    *,
    sweep_id: str,
    state: str,
    summary: dict[str, Any] | None = None,
    reason: str | None = None,
    now: float | None = None,
) -> Sweep | None:
    """Move a sweep to ``state``; a finished sweep never moves again, and CANCELLING never goes back to RUNNING."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        sweep = await session.get(Sweep, sweep_id)
        if sweep is None or sweep.state in SWEEP_TERMINAL:
            return sweep
        if not (state == "RUNNING" and sweep.state == "CANCELLING"):
            sweep.state = state
        if summary is not None:
            sweep.summary = summary
        if reason is not None:
            sweep.reason = reason
        sweep.updated_at = now
        if state in SWEEP_TERMINAL:
            sweep.finished_at = now
        return sweep


async def get_trial(db: Database, *, sweep_id: str, index: int) -> SweepTrial | None:
    async with db.sessions() as session:
        return await session.get(SweepTrial, (sweep_id, index))


async def add_trial(
    db: Database,
    *,
    sweep_id: str,
    index: int,
    params: dict[str, Any],
    job_id: str | None,
    state: str = "CREATED",
    reason: str | None = None,
    now: float | None = None,
) -> SweepTrial:
    """Record a trial once (a repeat returns the first record)."""
    now = time.time() if now is None else now
    try:
        async with db.transaction() as session:
            row = await session.get(SweepTrial, (sweep_id, index))
            if row is not None:
                return row
            row = SweepTrial(sweep_id=sweep_id, index=index, params=params, job_id=job_id, state=state, reason=reason, created_at=now)
            session.add(row)
            return row
    except IntegrityError:
        again = await get_trial(db, sweep_id=sweep_id, index=index)
        if again is None:
            raise
        return again


async def sweep_trials(db: Database, sweep_id: str) -> list[tuple[SweepTrial, Job | None]]:
    """The sweep's recorded trials in index order, each with its job (None when refused)."""
    query = (
        select(SweepTrial, Job)
        .join(Job, col(Job.id) == col(SweepTrial.job_id), isouter=True)
        .where(col(SweepTrial.sweep_id) == sweep_id)
        .order_by(col(SweepTrial.index))
    )
    async with db.sessions() as session:
        return [(trial, job) for trial, job in (await session.execute(query)).all()]


async def job_states(db: Database, job_ids: Sequence[str]) -> dict[str, str]:
    """Job id -> state, for the ids that exist."""
    if not job_ids:
        return {}
    async with db.sessions() as session:
        rows = (await session.execute(select(col(Job.id), col(Job.state)).where(col(Job.id).in_(list(job_ids))))).all()
    return {job_id: state for job_id, state in rows}


async def set_trial_metrics(db: Database, *, sweep_id: str, index: int, metrics: dict[str, Any]) -> None:
    async with db.transaction() as session:
        await session.execute(
            update(SweepTrial).where(col(SweepTrial.sweep_id) == sweep_id, col(SweepTrial.index) == index).values(metrics=metrics)
        )


# ---------------------------------------------------------------- observability (metrics, estimates)


@dataclass(frozen=True)
class StartedWaits:
    """Jobs of one (tenant, GPU type, GPU count) whose current attempt started: how long those attempts waited in the queue."""

    tenant: str
    gpu_type: str
    gpu_count: int
    count: int
    sum_s: float
    #: How many waited at most each of the given bounds (cumulative, as a histogram's buckets).
    at_most: tuple[int, ...]


async def started_attempt_waits(db: Database, bounds: Sequence[float]) -> list[StartedWaits]:
    """The queue waits of every job whose current attempt started (RUNNING or ended after running), counted in SQL."""
    wait = col(Job.started_at) - col(Job.queued_at)
    buckets = [func.sum(case((wait <= bound, 1), else_=0)) for bound in bounds]
    async with db.sessions() as session:
        query = (
            select(col(Job.tenant), col(Job.gpu_type), col(Job.gpu_count), func.count(), func.sum(wait), *buckets)
            .where(col(Job.started_at).is_not(None), col(Job.started_at) >= col(Job.queued_at))
            .group_by(col(Job.tenant), col(Job.gpu_type), col(Job.gpu_count))
        )
        rows = (await session.execute(query)).all()
    return [
        StartedWaits(tenant=t, gpu_type=g, gpu_count=n, count=int(c), sum_s=float(total or 0.0), at_most=tuple(int(b or 0) for b in rest))
        for t, g, n, c, total, *rest in rows
    ]


def _before_colon(db: Database, text_: Any) -> Any:
    """SQL for Python's ``text.split(":", 1)[0]``."""
    if db.sqlite:
        at = func.instr(text_, ":")
        return case((at > 0, func.substr(text_, 1, at - 1)), else_=text_)
    return func.split_part(text_, ":", 1)


async def event_message_heads(db: Database, kinds: Sequence[str]) -> list[tuple[str, str, int]]:
    """(kind, head, count) of the job events of these kinds, counted in SQL.

    The head is the part of the message that names its reason: for PREEMPTING the text before the
    first ``:``; for other kinds ``"preempted: "`` and the text up to the next ``:`` after it, else
    ``"job failed"``, else ``""``. ``api.metrics.preemption_reason`` and ``requeue_reason`` give the
    same answer for the head as for the whole message.
    """
    message = col(JobEvent.message)
    prefix = "preempted: "
    head = case(
        (col(JobEvent.kind) == "PREEMPTING", _before_colon(db, message)),
        (func.substr(message, 1, len(prefix)) == prefix, literal(prefix) + _before_colon(db, func.substr(message, len(prefix) + 1))),
        (func.substr(message, 1, len("job failed")) == "job failed", literal("job failed")),
        else_=literal(""),
    ).label("head")
    async with db.sessions() as session:
        query = select(col(JobEvent.kind), head, func.count()).where(col(JobEvent.kind).in_(list(kinds))).group_by(col(JobEvent.kind), head)
        return [(k, h, int(n)) for k, h, n in (await session.execute(query)).all()]


async def view_version(db: Database) -> tuple[int, int, int]:
    """What the API's cached views are keyed on: the change feed's version and the newest job and health event ids.

    Every one only grows, and one of them moves with every submission, state change, binding, cordon
    or health event (heartbeats' measurements and timestamps move none; views also expire by age).
    """
    async with db.sessions() as session:
        version = select(col(ChangeFeed.version)).where(col(ChangeFeed.id) == 1).scalar_subquery()
        events = select(func.max(col(JobEvent.id))).scalar_subquery()
        health = select(func.max(col(HealthEvent.id))).scalar_subquery()
        row = (await session.execute(select(version, events, health))).one()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


async def job_names(db: Database, job_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Job id -> (tenant, name), plain columns."""
    out: dict[str, tuple[str, str]] = {}
    ids = list(job_ids)
    async with db.sessions() as session:
        for start in range(0, len(ids), 5000):
            query = select(col(Job.id), col(Job.tenant), col(Job.name)).where(col(Job.id).in_(ids[start : start + 5000]))
            out.update({i: (t, n) for i, t, n in (await session.execute(query)).all()})
    return out


async def recent_events(db: Database, kinds: Sequence[str], *, tenant: str | None = None, limit: int = 50) -> list[tuple[JobEvent, Job]]:
    """The latest job events of these kinds with their jobs, newest first (one tenant's, if given)."""
    async with db.sessions() as session:
        query = select(JobEvent, Job).join(Job, col(Job.id) == col(JobEvent.job_id)).where(col(JobEvent.kind).in_(list(kinds)))
        if tenant is not None:
            query = query.where(col(Job.tenant) == tenant)
        rows = (await session.execute(query.order_by(col(JobEvent.id).desc()).limit(limit))).all()
    return [(e, j) for e, j in rows]


async def finished_runtimes(db: Database, *, limit: int = 5000) -> list[tuple[str, str, float]]:
    """(tenant, job name, run time of the final attempt) of the latest jobs that SUCCEEDED."""
    async with db.sessions() as session:
        query = (
            select(col(Job.tenant), col(Job.name), col(Job.started_at), col(Job.finished_at))
            .where(col(Job.state) == JobState.SUCCEEDED.value, col(Job.started_at).is_not(None), col(Job.finished_at).is_not(None))
            .order_by(col(Job.finished_at).desc())
            .limit(limit)
        )
        rows = (await session.execute(query)).all()
    return [(t, n, max(0.0, float(f or 0.0) - float(s or 0.0))) for t, n, s, f in rows]


async def list_tenants(db: Database) -> Sequence[Tenant]:
    async with db.sessions() as session:
        return (await session.execute(select(Tenant).order_by(col(Tenant.name)))).scalars().all()


async def set_node_state(db: Database, *, node_id: str, state: str, now: float | None = None) -> Node | None:
    """Cordon (``CORDONED``) or uncordon (``READY``) a node; a LOST or DOWN node stays as it is for READY."""
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        if node is None:
            return None
        if state == "READY" and node.state != "CORDONED":
            return node
        node.state = state
        await bump_change_feed(session)
        return node


async def node_jobs(db: Database, node_id: str) -> list[tuple[str, int]]:
    """(job id, attempt) of the live allocations holding GPUs on the node."""
    async with db.sessions() as session:
        query = (
            select(col(Allocation.job_id), col(Allocation.attempt))
            .join(AllocationGpu, col(AllocationGpu.allocation_id) == col(Allocation.id))
            .where(col(AllocationGpu.node_id) == node_id, _held())
            .distinct()
        )
        return sorted((j, a) for j, a in (await session.execute(query)).all())


async def jobs_by_ids(db: Database, job_ids: Sequence[str]) -> dict[str, Job]:
    if not job_ids:
        return {}
    async with db.sessions() as session:
        rows = (await session.execute(select(Job).where(col(Job.id).in_(list(job_ids))))).scalars().all()
    return {j.id: j for j in rows}


async def health_event_counts(db: Database) -> dict[str, int]:
    """How many health events of each kind were recorded (for counters), counted in SQL."""
    async with db.sessions() as session:
        query = select(col(HealthEvent.kind), func.count()).group_by(col(HealthEvent.kind))
        return {k: int(n) for k, n in (await session.execute(query)).all()}


async def add_health_event(
    db: Database,
    *,
    node_id: str,
    kind: str,
    key: str,
    gpu_index: int | None = None,
    severity: str = "info",
    message: str = "",
    data: dict[str, Any] | None = None,
    now: float | None = None,
) -> bool:
    """Record a health event once per (node, key); returns whether it is new."""
    now = time.time() if now is None else now
    event = HealthEvent(
        ts=now, node_id=node_id, gpu_index=gpu_index, kind=kind, severity=severity, message=message, data=data or {}, dedupe_key=key
    )
    try:
        async with db.transaction() as session:
            session.add(event)
        return True
    except IntegrityError:
        return False


async def recent_health_events(db: Database, *, limit: int = 50) -> Sequence[HealthEvent]:
    async with db.sessions() as session:
        return (await session.execute(select(HealthEvent).order_by(col(HealthEvent.id).desc()).limit(limit))).scalars().all()


async def set_gpu_health(
    db: Database,
    *,
    node_id: str,
    index: int,
    healthy: bool | None = None,
    health: dict[str, Any] | None = None,
    keep_injected: bool = False,
) -> Gpu | None:
    """Update a GPU's health report and/or its in-service flag; taking one out or returning it wakes the scheduler.

    ``keep_injected``: the stored ``injected`` faults are the row's own at the time of writing (a fault an admin
    injected, or cleared, while the caller was assessing a report is neither lost nor brought back).
    """
    async with db.transaction() as session:
        gpu = await session.get(Gpu, (node_id, index), with_for_update=True)
        if gpu is None:
            return None
        if health is not None:
            if keep_injected:
                current = (gpu.health or {}).get("injected")
                health = {k: v for k, v in health.items() if k != "injected"} | ({"injected": current} if current else {})
            gpu.health = health
        if healthy is not None and healthy != gpu.healthy:
            gpu.healthy = healthy
            await bump_change_feed(session)
        return gpu


async def inject_gpu_fault(db: Database, *, node_id: str, index: int, fault: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Add a simulated fault to a GPU's ``injected`` list, in one transaction; the list after it, or None for no such GPU."""
    async with db.transaction() as session:
        gpu = await session.get(Gpu, (node_id, index), with_for_update=True)
        if gpu is None:
            return None
        injected = [*(gpu.health or {}).get("injected", []), fault]
        gpu.health = {**(gpu.health or {}), "injected": injected}
        return injected


async def gpu_jobs(db: Database, node_id: str) -> list[tuple[int, str, int]]:
    """(GPU index, job id, attempt) of every live allocation GPU on the node."""
    async with db.sessions() as session:
        return await _gpu_jobs(session, node_id)


async def _gpu_jobs(session: AsyncSession | AsyncConnection, node_id: str) -> list[tuple[int, str, int]]:
    query = (
        select(col(AllocationGpu.gpu_index), col(Allocation.job_id), col(Allocation.attempt))
        .join(Allocation, col(AllocationGpu.allocation_id) == col(Allocation.id))
        .where(col(AllocationGpu.node_id) == node_id, _held())
    )
    return sorted((i, j, a) for i, j, a in (await session.execute(query)).all())


async def degraded_since(db: Database, node_id: str) -> float | None:
    """When the node was cordoned for degradation, unless an admin uncordoned it since."""
    async with db.sessions() as session:
        query = (
            select(HealthEvent)
            .where(col(HealthEvent.node_id) == node_id, or_(col(HealthEvent.severity) == "degraded", col(HealthEvent.kind) == "uncordon"))
            .order_by(col(HealthEvent.id).desc())
            .limit(1)
        )
        event = (await session.execute(query)).scalars().first()
    return event.ts if event is not None and event.severity == "degraded" else None
