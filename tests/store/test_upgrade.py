"""An upgrade from the schema before the usage ledger (revision 0005) keeps every job, the ledger built
from the upgraded history equals the integral over every allocation, and the node token all nodes shared
stops authenticating (each node gets its own credential)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, insert
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel import SQLModel

from fairgang.cluster import node_credential
from fairgang.settings import normalise_database_url
from fairgang.spec import JobState
from store import auth, tenants, usage
from store import jobs as stored_jobs
from store.auth import hash_token
from store.db import Database, alembic_config, migrate
from store.models import Allocation, AllocationGpu, ApiToken, Gpu, Job, Node, Tenant
from tests.builders import job_spec
from tests.conftest import create_pg_database, drop_pg_database, small_cluster


@pytest.fixture
async def old_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A store at revision 0005."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}" if backend == "sqlite" else await create_pg_database()
    await asyncio.to_thread(command.upgrade, alembic_config(url), "0005")
    try:
        yield url
    finally:
        if backend != "sqlite":
            await drop_pg_database(url)


async def _insert_as_the_old_schema(url: str, rows: list[SQLModel]) -> None:
    """Insert rows as code of the old schema wrote them: only the columns the store has at that revision."""
    engine = create_async_engine(normalise_database_url(url))
    try:
        async with engine.begin() as conn:
            meta = MetaData()
            await conn.run_sync(meta.reflect)
            for row in rows:
                table = meta.tables[str(type(row).__tablename__)]
                values = {k: v for k, v in row.model_dump().items() if k in table.c and v is not None}
                await conn.execute(insert(table).values(**values))
    finally:
        await engine.dispose()


def _old_fleet() -> list[SQLModel]:
    """The small cluster's tenants, nodes and GPUs, and the one node token every node shared before."""
    config = small_cluster()
    rows: list[SQLModel] = [
        Tenant(name=t.name, weight=t.weight, cohort=t.cohort, quotas={k: v.model_dump() for k, v in t.quotas.items()})
        for t in config.tenants
    ]
    for n in config.nodes:
        rows.append(Node(id=n.id, gpu_type=n.gpu_type, gpu_count=n.gpus, labels=dict(n.labels), state="READY"))
        rows += [Gpu(node_id=n.id, index=i) for i in range(n.gpus)]
    rows.append(ApiToken(token_hash=hash_token(config.node_token), role="node", created_at=1000.0))
    return rows


async def test_an_upgrade_keeps_every_job_and_builds_the_usage_ledger_from_the_history(old_url: str) -> None:
    # Rows as the old schema's code wrote them (its commit and release knew no ledger).
    rows = _old_fleet()
    for i in range(12):
        spec = job_spec(name=f"old-{i}")
        released = 1500.0 + 100 * i if i < 8 else None
        node = "h1" if i % 2 else "h2"
        indices = (2 * (i // 2) % 8, 2 * (i // 2) % 8 + 1)
        rows.append(
            Job(
                id=f"j-old-{i}",
                tenant="alpha" if i % 2 else "beta",
                name=spec.name,
                idempotency_key=f"name:{spec.name}",
                spec=spec.model_dump(mode="json") | {"tenant": "alpha"},
                gpu_type="H100-80GB",
                gpu_count=2,
                state=JobState.SUCCEEDED.value if i < 8 else JobState.RUNNING.value,
                workflow_started=True,
                created_at=1000.0 + i,
                updated_at=1000.0 + i,
                queued_at=1000.0 + i,
            )
        )
        rows.append(
            Allocation(
                id=f"a-old-{i}",
                job_id=f"j-old-{i}",
                attempt=1,
                state="RELEASED" if released else "ACKED",
                members=[{"node_id": node, "gpu_indices": list(indices), "rank": 0}],
                created_at=1010.0 + i,
                released_at=released,
            )
        )
        rows += [AllocationGpu(allocation_id=f"a-old-{i}", node_id=node, gpu_index=index, live=released is None) for index in indices]
    await _insert_as_the_old_schema(old_url, rows)

    await migrate(old_url)
    db = Database(old_url)
    try:
        # The shared node token of old no longer authenticates; seeding gives each node its own credential.
        assert await auth.authenticate(db, small_cluster().node_token) is None
        await tenants.seed_cluster(db, small_cluster(), now=4000.0)
        principal = await auth.authenticate(db, node_credential(small_cluster().node_token, "h1"))
        assert principal is not None and (principal.role, principal.node_id) == ("node", "h1")
        jobs = await stored_jobs.list_jobs(db, limit=100)
        assert sorted(j.id for j in jobs) == sorted(f"j-old-{i}" for i in range(12))
        assert {j.state for j in jobs} == {"SUCCEEDED", "RUNNING"}
        now = 5000.0
        ledger = await usage.usage(db, half_life=3600.0, now=now)
        history = await usage.from_history(db, half_life=3600.0, now=now)
        assert set(ledger) == set(history) == {"alpha", "beta"}
        for tenant in history:
            assert ledger[tenant] == pytest.approx(history[tenant], rel=1e-9)
        # From here on the store keeps it: a running job's end moves its GPUs from live to closed.
        await stored_jobs.record_transition(db, job_id="j-old-9", attempt=1, state=JobState.SUCCEEDED, event_key="end", now=now)
        later = now + 600.0
        ledger = await usage.usage(db, half_life=3600.0, now=later)
        history = await usage.from_history(db, half_life=3600.0, now=later)
        for tenant in history:
            assert ledger[tenant] == pytest.approx(history[tenant], rel=1e-9)
    finally:
        await db.dispose()
