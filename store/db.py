"""Engine, sessions and migrations for SQLite (default) and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from fairgang.settings import normalise_database_url

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
NOTIFY_CHANNEL = "fairgang_wake"


def make_engine(url: str, *, immediate: bool = True, busy_timeout_s: float = 30.0, **kwargs: Any) -> AsyncEngine:
    """Create the async engine with the settings each backend needs to be shared safely.

    SQLite is shared by several local processes: WAL lets readers run beside a writer and
    the busy timeout (``busy_timeout_s``) makes a writer wait for the lock instead of failing at once;
    past it the statement fails with "database is locked" (the API answers 503). With ``immediate`` every
    transaction starts with BEGIN IMMEDIATE, so that a read-then-write transaction never
    fails on lock upgrade (SQLITE_BUSY_SNAPSHOT) under contention; without it (the read
    engine) a plain BEGIN reads one consistent snapshot and never waits for the write lock,
    so readers cannot queue behind, or starve, the writers.
    """
    url = normalise_database_url(url)
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": busy_timeout_s}, **kwargs)

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    # Per process. A heartbeat holds a connection for a few milliseconds, so 10 serve hundreds a second;
    # the overflow absorbs bursts (a view's longer reads beside the heartbeats), and a request that still
    # finds none fails within 10 s (an agent's own timeout) rather than wait 30. More connections would
    # not help a process short of CPU, and several API workers (`fairgang api --workers N`) each have their
    # own pool: N x 20 plus the other processes' pools must fit PostgreSQL's max_connections.
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("pool_timeout", 10.0)
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)


class Database:
    """The engines and session factories: ``sessions()`` for reads, ``transaction()`` for writes.

    On PostgreSQL both use one engine. On SQLite reads go through their own engine, whose
    transactions do not take the write lock (see :func:`make_engine`).
    """

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, **kwargs: Any) -> None:
        self.url = normalise_database_url(url)
        self.engine = make_engine(self.url, busy_timeout_s=busy_timeout_s, **kwargs)
        sqlite = self.url.startswith("sqlite")
        self.read_engine = make_engine(self.url, immediate=False, busy_timeout_s=busy_timeout_s, **kwargs) if sqlite else self.engine
        #: Read-only work; on SQLite a write here may fail with "database is locked" under contention.
        self.sessions = async_sessionmaker(self.read_engine, expire_on_commit=False)
        self._writes = async_sessionmaker(self.engine, expire_on_commit=False)

    @property
    def sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction: committed on success, rolled back on error."""
        async with self._writes() as session, session.begin():
            yield session

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()


def store_busy(err: BaseException) -> bool:
    """Did the store turn a statement away for contention: SQLite's lock wait or the pool's ran out?"""
    if isinstance(err, PoolTimeout):
        return True
    if isinstance(err, OperationalError):
        message = str(err.orig).lower()
        return "database is locked" in message or "database is busy" in message
    return False


def alembic_config(url: str) -> Config:
    """Alembic's config for the store at ``url`` (alembic is imported only by what migrates: the parts that
    only read and write the store start without it)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalise_database_url(url).replace("%", "%%"))
    return cfg


def migrate_sync(url: str) -> None:
    """Bring the schema to the newest migration (blocking; safe to repeat)."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


async def migrate(url: str) -> None:
    """Bring the schema to the newest migration from async code."""
    await asyncio.to_thread(migrate_sync, url)


async def bump_change_feed(session: AsyncSession | AsyncConnection) -> None:
    """Tell the placement service that the queue or the free capacity changed.

    Runs inside the caller's transaction (a session's or a connection's), so the wake-up is as durable as the change.
    """
    await session.execute(text("UPDATE change_feed SET version = version + 1 WHERE id = 1"))
    bind = session.bind if isinstance(session, AsyncSession) else session
    if bind is not None and bind.dialect.name == "postgresql":
        await session.execute(text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', '')"))
