"""Nodes and their GPUs: registration, heartbeats, the agents' reports of what they run, lost nodes, cordons.

A heartbeat is the hottest write of the platform: :func:`record_heartbeat` runs prepared core statements over the
node's own rows only, in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, delete, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlmodel import col

from fairgang.fencing import FENCED_EVENT, fenced_event_key, store_fences
from fairgang.liveness import LOSABLE_STATES, RETIRED, lost_cutoff
from store import audit
from store.auth import new_node_token, revoke_node_credentials, set_node_credential
from store.common import REVOKED, add_event_once, held, new_event
from store.db import Database, bump_change_feed
from store.health import live_gpu_jobs
from store.models import Allocation, AllocationGpu, Gpu, Node


class NodeRefused(ValueError):
    """A registration or enrolment the store refuses; ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


async def enrol_node(
    db: Database, *, node_id: str, gpu_type: str, gpu_count: int, labels: dict[str, str], actor: str = "admin", now: float | None = None
) -> str:
    """An admin enrols a node, or enrols it again (its GPU type, count or labels change): its new credential.

    The node's earlier credential stops working. Its GPU type or count may change only while nothing is
    placed on it (drain it first). A retired node enrolled again is back in the fleet (DOWN until its agent
    registers).
    """
    now = time.time() if now is None else now
    token = new_node_token()
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        before: dict[str, Any] | None = None
        if node is not None:
            before = {"gpu_type": node.gpu_type, "gpu_count": node.gpu_count, "labels": dict(node.labels)}
        after: dict[str, Any] = {"gpu_type": gpu_type, "gpu_count": gpu_count, "labels": dict(labels)}
        if node is not None and node.state == RETIRED:
            before = (before or {}) | {"state": RETIRED}
            after["state"] = "DOWN"
        audit.record(session, actor=actor, action="node.enrol", target=f"node:{node_id}", before=before, after=after, now=now)
        if node is None:
            node = Node(id=node_id, gpu_type=gpu_type, gpu_count=gpu_count, labels=labels)
            session.add(node)
        else:
            if (node.gpu_type, node.gpu_count) != (gpu_type, gpu_count) and await _live_allocations_on(session, node_id):
                raise NodeRefused("gpu_count", f"node {node_id} has live allocations: drain it before its GPUs change")
            node.gpu_type, node.gpu_count, node.labels = gpu_type, gpu_count, labels
            if node.state == RETIRED:
                node.state, node.boot_id = "DOWN", None
        await session.flush()
        for index in range(gpu_count):
            if await session.get(Gpu, (node_id, index)) is None:
                session.add(Gpu(node_id=node_id, index=index))
        await session.execute(delete(Gpu).where(col(Gpu.node_id) == node_id, col(Gpu.index) >= gpu_count))
        await set_node_credential(session, node_id, token, now=now)
        await bump_change_feed(session)
    return token


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

    Raises:
        NodeRefused: the node was never enrolled, or its agent reports another GPU type or count than
            its enrolment (those change only through an admin's enrolment).
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        if node is None:
            raise NodeRefused("node_id", f"node {node_id} is not enrolled (an admin enrols it: fairgang node enrol)")
        if node.state == RETIRED:
            raise NodeRefused("node_id", f"node {node_id} is retired (an admin enrols it again to bring it back)")
        if node.gpu_type != gpu_type:
            raise NodeRefused("gpu_type", f"node {node_id} is enrolled with {node.gpu_type}, not {gpu_type}: an admin re-enrols it")
        if node.gpu_count != gpu_count:
            raise NodeRefused("gpu_count", f"node {node_id} is enrolled with {node.gpu_count} GPUs, not {gpu_count}: an admin re-enrols it")
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


#: Built once: at hundreds of heartbeats a second, building a statement costs as much as running it.
_LIVE_ON_NODE = (
    select(col(AllocationGpu.allocation_id))
    .join(Allocation, col(Allocation.id) == col(AllocationGpu.allocation_id))
    .where(col(AllocationGpu.node_id) == bindparam("b_node"), held(), col(Allocation.state) != REVOKED)
    .distinct()
)


async def _live_allocations_on(session: AsyncSession | AsyncConnection, node_id: str) -> list[str]:
    """The allocations the store holds on the node (a REVOKED one keeps its GPUs but is not held)."""
    return sorted(r for (r,) in (await session.execute(_LIVE_ON_NODE, {"b_node": node_id})).all())


async def report_running(db: Database, *, node_id: str, running: Sequence[str], live: Sequence[str], now: float | None = None) -> list[str]:
    """An agent's report of the allocations it runs: returns those the store no longer holds there.

    The agent kills their members; each is logged once per node as a ``FENCED`` event of its job
    (the verdict and the event's key: :mod:`fairgang.fencing`).
    """
    stale = store_fences(running, live)
    if not stale:
        return []
    now = time.time() if now is None else now
    async with db.transaction() as session:
        for allocation_id in stale:
            alloc = await session.get(Allocation, allocation_id)
            if alloc is None:
                continue
            message = f"node {node_id} still ran allocation {allocation_id} ({alloc.state.lower()}): its agent kills it"
            key = fenced_event_key(allocation_id, node_id)
            await add_event_once(
                session, new_event(alloc.job_id, alloc.attempt, FENCED_EVENT, message, key, now, allocation_id=allocation_id)
            )
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
    .where(_NODE.c.id == bindparam("b_node"), _NODE.c.boot_id == bindparam("b_boot"), _NODE.c.state.not_in(("LOST", RETIRED)))
    .values(last_heartbeat=bindparam("b_now"))
    .returning(_NODE.c.state, _NODE.c.gpu_count)
)


_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")


_NODE_GPUS = select(_GPU.c.index, _GPU.c.healthy, _GPU.c.health).where(_GPU.c.node_id == bindparam("b_node")).with_for_update()


async def record_heartbeat(
    db: Database, *, node_id: str, boot_id: str, policy: HealthPolicy | None = None, now: float | None = None
) -> Heartbeat:
    """Record a heartbeat and, with ``policy``, its GPUs' health: one transaction over the node's own rows only.

    A heartbeat from another boot of the node, or from a node declared lost or retired, is refused: the agent
    must register again, and a lost node's allocations stay lost. The node's GPU rows are read locked, so the
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
        jobs = await live_gpu_jobs(conn, node_id) if taken_out else []
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
    and then it gets back no allocation (see :func:`register_node`). The rule is
    :func:`fairgang.liveness.node_lost`, asked in SQL.
    """
    now = time.time() if now is None else now
    lost: dict[str, list[str]] = {}
    async with db.transaction() as session:
        query = select(Node).where(
            col(Node.state).in_(LOSABLE_STATES),
            col(Node.last_heartbeat).is_not(None),
            col(Node.last_heartbeat) < lost_cutoff(now, lost_after_s),
        )
        for node in (await session.execute(query)).scalars().all():
            node.state = "LOST"
            jobs = (
                await session.execute(
                    select(col(Allocation.job_id))
                    .join(AllocationGpu, col(AllocationGpu.allocation_id) == col(Allocation.id))
                    .where(col(AllocationGpu.node_id) == node.id, held())
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


async def set_node_state(db: Database, *, node_id: str, state: str, now: float | None = None) -> Node | None:
    """Cordon (``CORDONED``) or uncordon (``READY``) a node; a LOST or DOWN node stays as it is for READY.

    Raises:
        NodeRefused: the node is retired (it comes back only through an admin's enrolment).
    """
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        if node is None:
            return None
        if node.state == RETIRED:
            raise NodeRefused("node_id", f"node {node_id} is retired (an admin enrols it again to bring it back)")
        if state == "READY" and node.state != "CORDONED":
            return node
        node.state = state
        await bump_change_feed(session)
        return node


async def retire_node(db: Database, *, node_id: str, actor: str = "admin", now: float | None = None) -> Node | None:
    """Take a node out of the fleet for good (None: no such node); retiring a retired node changes nothing.

    A retired node is no capacity (placement, fair shares and admission leave it out), is never declared
    lost, and its credential is gone: its agent's heartbeats and registrations are refused. Its rows and its
    allocations' history stay. Enrolling it again brings it back.

    Raises:
        NodeRefused: something is still placed on the node (drain it first).
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        node = await session.get(Node, node_id)
        if node is None or node.state == RETIRED:
            return node
        if await _live_allocations_on(session, node_id):
            raise NodeRefused("node_id", f"node {node_id} has live allocations: drain it before it is retired")
        before, after = {"state": node.state}, {"state": RETIRED}
        audit.record(session, actor=actor, action="node.retire", target=f"node:{node_id}", before=before, after=after, now=now)
        node.state, node.boot_id = RETIRED, None
        await revoke_node_credentials(session, node_id)
        await bump_change_feed(session)
        return node


async def node_jobs(db: Database, node_id: str) -> list[tuple[str, int]]:
    """(job id, attempt) of the live allocations holding GPUs on the node."""
    async with db.sessions() as session:
        query = (
            select(col(Allocation.job_id), col(Allocation.attempt))
            .join(AllocationGpu, col(AllocationGpu.allocation_id) == col(Allocation.id))
            .where(col(AllocationGpu.node_id) == node_id, held())
            .distinct()
        )
        return sorted((j, a) for j, a in (await session.execute(query)).all())


async def node_address(db: Database, node_id: str) -> str | None:
    """The address the node's agent registered (where a gang whose rank 0 runs there meets), or None."""
    async with db.sessions() as session:
        node = await session.get(Node, node_id)
        return node.address if node is not None else None
