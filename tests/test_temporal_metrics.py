"""The workflow worker exports the Temporal SDK's own metrics where FAIRGANG_TEMPORAL_METRICS_BIND says."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from benchmarks.ports import free_port
from cli.platform import temporal_binary
from fairgang.settings import SEARCH_ATTRIBUTES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def temporal() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=[SearchAttributeKey.for_keyword(n) for n in SEARCH_ATTRIBUTES]
    )
    yield env
    await env.shutdown()


async def test_worker_serves_the_sdk_metrics(temporal: WorkflowEnvironment, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "FAIRGANG_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'w.db'}",
        "FAIRGANG_TEMPORAL_ADDRESS": temporal.client.service_client.config.target_host,
        "FAIRGANG_TEMPORAL_METRICS_BIND": f"127.0.0.1:{port}",
    }
    env.pop("DATABASE_URL", None)
    worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", "worker", cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 60
        text = ""
        async with httpx.AsyncClient(timeout=2) as http:
            while "temporal_worker_task_slots_available" not in text:
                assert time.monotonic() < deadline, text[-500:]
                assert worker.returncode is None, "the worker exited"
                try:
                    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                except httpx.HTTPError:
                    await asyncio.sleep(0.3)
        assert 'task_queue="fairgang-control"' in text
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 30)
