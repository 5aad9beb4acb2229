"""The cluster config's tenants, tokens and nodes, loaded into the store, what admission reads of them, and a
tenant's policy changed live by an admin (audited: store/audit.py).

Admission (:func:`fairgang.admission.check_admission`) takes a tenant's policy (:func:`tenant_policy`) and the
fleet's shape (:func:`fleet_shape`); the jobs API and the sweep activities both read them here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, cast, delete, func, select
from sqlmodel import col

from fairgang.admission import FleetShape, TenantPolicy
from fairgang.cluster import ClusterConfig, TenantConfig, node_credential
from fairgang.liveness import RETIRED
from store import audit
from store.auth import digests, set_node_credential
from store.db import Database, bump_change_feed
from store.models import ApiToken, Gpu, Node, Tenant

#: A tenant's policy columns: what an admin may change live (PATCH /v1/tenants/{name}) and the audit log records.
POLICY = (
    "weight", "cohort", "quotas", "max_gpus_per_job", "max_runtime_s", "max_concurrent_jobs", "checkpoint_prefix",
    "submissions_per_minute", "submission_burst", "allowed_images",
)  # fmt: skip


def policy_of(row: Tenant) -> dict[str, Any]:
    """The tenant's policy as plain data (the audit log's before and after)."""
    return {key: getattr(row, key) for key in POLICY}


def tenant_config(row: Tenant) -> TenantConfig:
    """The stored tenant as the cluster config's model (which validates every field of a change)."""
    policy = policy_of(row)
    policy["max_runtime"] = policy.pop("max_runtime_s")
    return TenantConfig.model_validate({"name": row.name, **policy})


def policy_values(config: TenantConfig) -> dict[str, Any]:
    """The policy columns of a tenant as the cluster config's model gives it (the inverse of :func:`tenant_config`)."""
    data = config.model_dump()
    data["max_runtime_s"] = data.pop("max_runtime")
    return {key: data[key] for key in POLICY}


async def update_tenant(
    db: Database, name: str, values: dict[str, Any], *, actor: str, now: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Apply policy ``values`` (columns of :data:`POLICY`, already validated) to the tenant, with its audit event,
    and wake the placement service (the next cycle reads it). None: no such tenant."""
    assert set(values) <= set(POLICY), set(values) - set(POLICY)
    async with db.transaction() as session:
        row = (await session.execute(select(Tenant).where(col(Tenant.name) == name).with_for_update())).scalar_one_or_none()
        if row is None:
            return None
        before = policy_of(row)
        for key, value in values.items():
            setattr(row, key, value)
        after = policy_of(row)
        if after != before:
            audit.record(session, actor=actor, action="tenant.update", target=f"tenant:{name}", before=before, after=after, now=now)
            await bump_change_feed(session)
        return before, after


async def gpu_capacity(db: Database) -> dict[str, int]:
    """GPUs per type in the fleet."""
    shape = await fleet_shape(db)
    return {gpu_type: sum(per_node * nodes for per_node, nodes in shapes.items()) for gpu_type, shapes in shape.shapes.items()}


async def seed_cluster(db: Database, config: ClusterConfig, *, now: float | None = None) -> None:
    """Load tenants, tokens and nodes from a cluster config (safe to repeat).

    Existing rows are updated in place; node state, boot id and heartbeats are kept.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        for t in config.tenants:
            row = await session.get(Tenant, t.name)
            values = policy_values(t)
            if row is None:
                row = Tenant(name=t.name, **values)
                session.add(row)
                audit.record(
                    session, actor="seed", action="tenant.create", target=f"tenant:{t.name}", before=None, after=policy_of(row), now=now
                )
            else:
                before = policy_of(row)
                for key, value in values.items():
                    setattr(row, key, value)
                if policy_of(row) != before:
                    audit.record(
                        session,
                        actor="seed",
                        action="tenant.update",
                        target=f"tenant:{t.name}",
                        before=before,
                        after=policy_of(row),
                        now=now,
                    )
        await session.flush()
        wanted: list[tuple[str, str, str | None]] = [(tok, "admin", None) for tok in config.admin_tokens]
        wanted += [(tok, "tenant", t.name) for t in config.tenants for tok in t.tokens]
        wanted += [(tok, "tenant_admin", t.name) for t in config.tenants for tok in t.admin_tokens]
        for token, role, tenant in wanted:
            known = digests(token)
            existing = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash).in_(known)))).scalars().first()
            if existing is None:
                session.add(ApiToken(token_hash=known[0], role=role, tenant=tenant, created_at=now))
            else:
                existing.token_hash, existing.role, existing.tenant = known[0], role, tenant
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
            await set_node_credential(session, n.id, node_credential(config.node_token, n.id), now=now)
        # Node tokens of earlier versions named no node (one for all): they no longer authenticate.
        await session.execute(delete(ApiToken).where(col(ApiToken.role) == "node", col(ApiToken.node_id).is_(None)))
        await bump_change_feed(session)


async def get_tenant(db: Database, name: str) -> Tenant | None:
    async with db.sessions() as session:
        return await session.get(Tenant, name)


async def list_tenants(db: Database) -> Sequence[Tenant]:
    async with db.sessions() as session:
        return (await session.execute(select(Tenant).order_by(col(Tenant.name)))).scalars().all()


def tenant_policy(tenant: Tenant) -> TenantPolicy:
    """The tenant's limits as admission reads them; the GPU types it may use are those it has a quota of."""
    return TenantPolicy(
        name=tenant.name,
        allowed_gpu_types=frozenset(tenant.quotas),
        max_gpus_per_job=tenant.max_gpus_per_job,
        max_runtime_s=tenant.max_runtime_s,
        checkpoint_prefix=tenant.checkpoint_prefix,
        allowed_images=None if tenant.allowed_images is None else tuple(tenant.allowed_images),
    )


async def fleet_shape(db: Database) -> FleetShape:
    """GPU type -> {GPUs per node: nodes}, and the topology levels the nodes' labels use (for admission).

    Counted in SQL: a submission reads a row per node shape and per distinct label set, not every node.
    Retired nodes are no part of it.
    """
    async with db.sessions() as session:
        in_fleet = col(Node.state) != RETIRED
        shape_query = (
            select(col(Node.gpu_type), col(Node.gpu_count), func.count()).where(in_fleet).group_by(col(Node.gpu_type), col(Node.gpu_count))
        )
        counts = (await session.execute(shape_query)).all()
        label_sets = (await session.execute(select(cast(col(Node.labels), String)).where(in_fleet).distinct())).scalars().all()
    shapes: dict[str, dict[int, int]] = {}
    for gpu_type, per_node, nodes in counts:
        shapes.setdefault(gpu_type, {})[per_node] = nodes
    levels = {"node"}
    for raw in label_sets:
        levels.update(json.loads(raw) if raw else {})
    return FleetShape(shapes=shapes, levels=frozenset(levels))
