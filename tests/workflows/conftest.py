"""Fixtures of the workflow tests: a seeded SQLite store with nodes h1 and h2 registered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from store import nodes, tenants
from store.db import Database, migrate
from tests.conftest import small_cluster


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Database]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'wf.db'}"
    await migrate(url)
    db = Database(url)
    await tenants.seed_cluster(db, small_cluster())
    for node_id in ("h1", "h2"):
        await nodes.register_node(db, node_id=node_id, gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b", gpus=[], now=1e12)
    yield db
    await db.dispose()
