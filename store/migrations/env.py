"""Alembic environment: runs migrations over the async engine."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import store.models  # noqa: F401  (registers the tables)
from store.db import make_engine

config = context.config
target_metadata = SQLModel.metadata


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # A batch migration recreates a table (copy, drop, rename); with foreign keys on, dropping a table other
        # tables point at fails. Off for this connection only (before its first write opens the transaction),
        # and every reference is checked before the migrations commit.
        cursor = connection.connection.cursor()  # the DBAPI connection: no transaction begun yet
        cursor.execute("PRAGMA foreign_keys=OFF")
        cursor.close()
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
        if sqlite:
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"the migrations left rows that point at nothing: {broken[:5]}")


async def _run_async() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    async with engine.connect() as connection:
        await connection.run_sync(_run)
        await connection.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
