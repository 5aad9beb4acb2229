"""Shared fixtures: a fresh store on each backend (SQLite, and PostgreSQL when it answers).

PostgreSQL comes from DATABASE_URL (or 127.0.0.1:5432/test). Each test gets a database
of its own, created from that one. Where PostgreSQL is down, its tests are skipped,
unless FAIRGANG_REQUIRE_POSTGRES is set (CI), where they fail.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from hypothesis import settings

from api import views
from api.app import create_app
from api.deps import AppState
from fairgang.cluster import ClusterConfig
from fairgang.settings import Settings
from store import tenants
from store.db import Database, migrate

PG_URL = os.environ.get("DATABASE_URL") or "postgresql://root@127.0.0.1:5432/test"
if not PG_URL.startswith("postgres"):
    PG_URL = "postgresql://root@127.0.0.1:5432/test"
PG_DSN = PG_URL.replace("postgresql+asyncpg://", "postgresql://")


def _pg_available() -> str | None:
    async def probe() -> None:
        conn = await asyncpg.connect(PG_DSN, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
        return None
    except Exception as err:  # noqa: BLE001 - any failure means "not here"
        return f"PostgreSQL at {PG_DSN} is not reachable: {err}"


_PG_PROBLEM = _pg_available()


async def create_pg_database() -> str:
    """A fresh, empty PostgreSQL database; returns its URL."""
    name = f"fg_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = PG_DSN.rsplit("/", 1)[0]
    return f"{base}/{name}"


async def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres" and _PG_PROBLEM:
        if os.environ.get("FAIRGANG_REQUIRE_POSTGRES"):
            pytest.fail(_PG_PROBLEM)
        pytest.skip(_PG_PROBLEM)
    return str(request.param)


@pytest.fixture
async def db_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A migrated, empty store on the backend under test."""
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'fairgang.db'}"
        await migrate(url)
        yield url
        return
    url = await create_pg_database()
    try:
        await migrate(url)
        yield url
    finally:
        await drop_pg_database(url)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


def small_cluster() -> ClusterConfig:
    """Two tenants in one cohort (each guaranteed half the H100s, free to borrow the other half), an
    admin, two 8-GPU H100 nodes on one leaf and a 4-GPU L40S node."""
    return ClusterConfig.model_validate(
        {
            "admin_tokens": ["admin-token"],
            "node_token": "node-token",
            "tenants": [
                {
                    "name": "alpha",
                    "cohort": "research",
                    "tokens": ["alpha-token"],
                    "admin_tokens": ["alpha-admin-token"],
                    "quotas": {"H100-80GB": {"nominal": 8}, "L40S": {"nominal": 4}},
                    "max_gpus_per_job": 16,
                    "max_runtime": "24h",
                    "checkpoint_prefix": "/ckpt/alpha",
                },
                {
                    "name": "beta",
                    "cohort": "research",
                    "tokens": ["beta-token"],
                    "quotas": {"H100-80GB": {"nominal": 8}},
                    "max_gpus_per_job": 8,
                    "max_runtime": "2h",
                    "checkpoint_prefix": "/ckpt/beta",
                },
            ],
            "nodes": [
                {"id": "h1", "gpu_type": "H100-80GB", "gpus": 8, "labels": {"leaf": "l1", "spine": "s1"}},
                {"id": "h2", "gpu_type": "H100-80GB", "gpus": 8, "labels": {"leaf": "l1", "spine": "s1"}},
                {"id": "g1", "gpu_type": "L40S", "gpus": 4, "labels": {"leaf": "l2", "spine": "s1"}},
            ],
        }
    )


@pytest.fixture
async def seeded(db: Database) -> Database:
    await tenants.seed_cluster(db, small_cluster())
    return db


# Property tests explore new examples locally; in CI they replay a fixed set, so a run is repeatable.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
async def api(
    seeded: Database, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[httpx.AsyncClient]:
    """The API app in process, on the seeded store (no Temporal: it points at a closed port); a test's
    ``@pytest.mark.settings(name=value)`` sets more of its settings.

    Its views count as cheap whatever the machine's load, so a test reads its own writes (the rule that decides
    it on a real fleet is tested in tests/api/test_views.py, with its own thresholds)."""
    monkeypatch.setattr(views, "QUICK_CPU_S", 60.0)
    marker = request.node.get_closest_marker("settings")
    more = marker.kwargs if marker else {}
    settings = Settings(database_url=db_url, temporal_address="127.0.0.1:1", log_dir=tmp_path / "logs", **more)
    app = create_app(settings)
    app.state.fairgang = AppState(settings=settings, db=seeded)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client


#: The files that take longest (whole platforms as processes), run first: pytest-xdist hands each worker a whole
#: file at a time in collection order, so a long file collected late would run alone at the end of the suite.
LONGEST_FIRST = (
    "tests/e2e/test_lifecycle.py",
    "tests/e2e/test_sweeps.py",
    "tests/e2e/test_platform.py",
    "tests/e2e/test_health.py",
    "tests/benchmarks/test_live_bench_smoke.py",
    "tests/e2e/test_scheduling.py",
    "tests/e2e/test_containers.py",
    "tests/e2e/test_isolation.py",
    "tests/workflows/test_sweep_workflow.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first; within a file, the tests of one store's platform together (a module's platform is
    made once per store: tests that alternate stores would stop and start it at each change)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], index)

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int, int, int]:
        index, item = pair
        path = item.nodeid.split("::")[0]
        params = getattr(item, "callspec", None)
        store = params.params.get("platform_factory") if params is not None else None
        return (rank.get(path, len(rank)), first[path], 1 if store == "postgres" else 0, index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
