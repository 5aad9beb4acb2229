"""SQLite under concurrency (the embedded default): concurrent submissions and heartbeats wait for the
write lock within the API's bound; past it the API answers 503 with Retry-After, never a 500, and
nothing is half-written."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from api.app import STORE_BUSY_RETRY_S, create_app
from fairgang.cluster import node_credential
from fairgang.settings import Settings
from store.db import Database
from tests.builders import spec_dict

ALPHA = {"Authorization": "Bearer alpha-token"}
NODE = {"Authorization": f"Bearer {node_credential('node-token', 'h1')}"}


@contextlib.asynccontextmanager
async def _client(db_url: str, tmp_path: Path, busy_s: float) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its own lifespan (its store opened from the settings, as `fairgang api` opens it)."""
    settings = Settings(database_url=db_url, temporal_address="127.0.0.1:1", log_dir=tmp_path / "logs", api_store_busy_timeout_s=busy_s)
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://api", timeout=60) as client:
        yield client


@pytest.fixture
async def sqlite_url(seeded: Database, backend: str, db_url: str) -> AsyncIterator[str]:
    if backend != "sqlite":
        pytest.skip("the write lock is SQLite's")
    yield db_url


def _hold_write_lock(db_url: str, seconds: float, held: threading.Event) -> threading.Thread:
    """Another process's writer: BEGIN IMMEDIATE on the same file, held for ``seconds``."""

    def run() -> None:
        conn = sqlite3.connect(db_url.split(":///", 1)[1], isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def _register(api: httpx.AsyncClient) -> None:
    body = {"node_id": "h1", "gpu_type": "H100-80GB", "gpu_count": 8, "boot_id": "b1", "labels": {"leaf": "l1", "spine": "s1"}}
    assert (await api.post("/v1/nodes/register", json=body, headers=NODE)).json()["accepted"]


async def test_concurrent_writes_wait_for_the_lock_within_the_bound(sqlite_url: str, tmp_path: Path) -> None:
    async with _client(sqlite_url, tmp_path, busy_s=10.0) as api:
        await _register(api)
        held = threading.Event()
        locker = _hold_write_lock(sqlite_url, 1.0, held)
        await asyncio.to_thread(held.wait, 5)
        submits = [api.post("/v1/jobs", json=spec_dict(name=f"j{i}"), headers=ALPHA) for i in range(20)]
        beats = [api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "b1"}, headers=NODE) for _ in range(10)]
        answers = await asyncio.gather(*submits, *beats)
        locker.join()
        assert [r.status_code for r in answers] == [201] * 20 + [200] * 10, [r.text for r in answers if r.status_code >= 300]
        assert len((await api.get("/v1/jobs", headers=ALPHA)).json()) == 20


async def test_past_the_bound_a_write_is_answered_503_with_retry_after_and_nothing_is_stored(sqlite_url: str, tmp_path: Path) -> None:
    async with _client(sqlite_url, tmp_path, busy_s=0.3) as api:
        await _register(api)
        held = threading.Event()
        locker = _hold_write_lock(sqlite_url, 3.0, held)
        await asyncio.to_thread(held.wait, 5)
        submit, beat = await asyncio.gather(
            api.post("/v1/jobs", json=spec_dict(name="late"), headers=ALPHA),
            api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "b1"}, headers=NODE),
        )
        for resp in (submit, beat):
            assert resp.status_code == 503, resp.text
            assert resp.headers["Retry-After"] == str(STORE_BUSY_RETRY_S)
            assert resp.json()["status"] == 503 and "store is busy" in resp.json()["detail"]
        locker.join()
        assert (await api.get("/v1/jobs", headers=ALPHA)).json() == []
        # Once the lock is free the same submission goes through.
        assert (await api.post("/v1/jobs", json=spec_dict(name="late"), headers=ALPHA)).status_code == 201
