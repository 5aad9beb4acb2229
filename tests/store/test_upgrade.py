"""An upgrade from the schema before the usage ledger (revision 0005) keeps every job, and the ledger built
from the upgraded history equals the integral over every allocation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic import command

from fairgang.spec import JobState
from store import jobs as stored_jobs
from store import tenants, usage
from store.db import Database, alembic_config, migrate
from store.models import Allocation, AllocationGpu, Job
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


async def test_an_upgrade_keeps_every_job_and_builds_the_usage_ledger_from_the_history(old_url: str) -> None:
    db = Database(old_url)
    try:
        await tenants.seed_cluster(db, small_cluster(), now=1000.0)
        # Rows as the old schema's code wrote them (its commit and release knew no ledger).
        async with db.transaction() as session:
            for i in range(12):
                spec = job_spec(name=f"old-{i}")
                job = Job(
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
                session.add(job)
                await session.flush()
                released = 1500.0 + 100 * i if i < 8 else None
                session.add(
                    Allocation(
                        id=f"a-old-{i}",
                        job_id=job.id,
                        attempt=1,
                        state="RELEASED" if released else "ACKED",
                        members=[{"node_id": "h1" if i % 2 else "h2", "gpu_indices": [2 * (i // 2) % 8, 2 * (i // 2) % 8 + 1], "rank": 0}],
                        created_at=1010.0 + i,
                        released_at=released,
                    )
                )
                await session.flush()
                for index in (2 * (i // 2) % 8, 2 * (i // 2) % 8 + 1):
                    node = "h1" if i % 2 else "h2"
                    session.add(AllocationGpu(allocation_id=f"a-old-{i}", node_id=node, gpu_index=index, live=released is None))
    finally:
        await db.dispose()

    await migrate(old_url)
    db = Database(old_url)
    try:
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
