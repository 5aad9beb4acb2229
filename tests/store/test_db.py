"""The database on both backends: migrations that build the models' schema, reads that never wait for a writer."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlmodel import SQLModel

from store import nodes as stored_nodes
from store.db import Database, migrate


async def test_migrations_match_the_models(db: Database, db_url: str) -> None:
    await migrate(db_url)  # a second run is a no-op
    async with db.engine.connect() as conn:
        diff = await conn.run_sync(lambda sync: compare_metadata(MigrationContext.configure(sync), SQLModel.metadata))
    assert diff == []


async def test_reads_do_not_wait_for_a_writer(seeded: Database) -> None:
    """A read never queues behind a write transaction (on SQLite: readers take no write lock)."""
    import asyncio

    holding, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with seeded.transaction() as session:
            await session.execute(text("UPDATE change_feed SET version = version + 1 WHERE id = 1"))
            holding.set()
            await release.wait()

    task = asyncio.create_task(writer())
    await holding.wait()
    try:
        # Another connection reads while the write transaction is open; it would block on a held lock.
        nodes = await asyncio.wait_for(stored_nodes.list_nodes(seeded), timeout=20)
        assert len(nodes) == 3
        assert not task.done()
    finally:
        release.set()
        await task
