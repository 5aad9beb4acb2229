"""An upgrade to the pending code (revision 0008) keeps every queued job's reason, with no code until one is written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from api.schemas import JobPublic, QueueEntry
from store import jobs as stored_jobs
from store import placement, tenants
from store.db import Database, alembic_config, migrate
from tests.builders import job_spec
from tests.conftest import create_pg_database, drop_pg_database, small_cluster

REVISION = "0008"


@pytest.fixture
async def old_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A store at the revision before the pending code."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}" if backend == "sqlite" else await create_pg_database()
    config = alembic_config(url)
    before = ScriptDirectory.from_config(config).get_revision(REVISION).down_revision
    assert isinstance(before, str)
    await asyncio.to_thread(command.upgrade, config, before)
    try:
        yield url
    finally:
        if backend != "sqlite":
            await drop_pg_database(url)


async def test_an_upgrade_keeps_queued_reasons_and_the_next_write_adds_the_code(old_url: str) -> None:
    db = Database(old_url)
    try:
        # A tenant and a queued job as the old schema's code left them (plain SQL: today's models hold columns
        # added since): a scheduler's reason, and no code column yet.
        spec = job_spec(name="old")
        async with db.transaction() as session:
            await session.execute(
                sa.text(
                    "INSERT INTO tenant (name, weight, quotas, max_gpus_per_job, max_runtime_s, max_concurrent_jobs)"
                    " VALUES ('alpha', 1.0, '{}', 64, 172800.0, 100)"
                )
            )
            await session.execute(
                sa.text(
                    "INSERT INTO job (id, tenant, name, idempotency_key, spec, gpu_type, gpu_count, priority, state, attempt,"
                    " pending_reason, workflow_started, created_at, updated_at, queued_at)"
                    " VALUES ('j-old', 'alpha', 'old', 'name:old', :spec, 'H100-80GB', 8, 100, 'QUEUED', 1,"
                    " 'no H100-80GB node has 8 free GPUs', :started, 1000.0, 1000.0, 1000.0)"
                ),
                {"spec": spec.model_dump_json(), "started": True},
            )
    finally:
        await db.dispose()

    await migrate(old_url)
    db = Database(old_url)
    try:
        await tenants.seed_cluster(db, small_cluster(), now=2000.0)
        job = await stored_jobs.get_job(db, "j-old")
        assert job is not None and (job.pending_reason, job.pending_code) == ("no H100-80GB node has 8 free GPUs", None)
        epoch = await placement.acquire_lease(db, name="placement", holder="me", ttl_s=30)
        assert epoch is not None
        await placement.commit_bindings(
            db,
            bindings=[],
            pending_reasons={"j-old": "no H100-80GB node has 8 free GPUs"},
            pending_codes={"j-old": "no_free_node"},
            lease_name="placement",
            epoch=epoch,
        )
        job = await stored_jobs.get_job(db, "j-old")
        assert job is not None
        shown = JobPublic.of(job)
        assert (shown.pending_reason, shown.pending_code) == ("no H100-80GB node has 8 free GPUs", "no_free_node")
        entry = QueueEntry(position=1, job=shown).model_dump()
        assert entry["job"]["pending_code"] == "no_free_node"
    finally:
        await db.dispose()
