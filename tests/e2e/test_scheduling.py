"""The placement service as a real process: leader lease with fencing, and reclaim by preemption."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlmodel import col

from store.db import Database
from store.models import AllocationGpu, SchedulerLease
from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec, only
from tests.e2e.test_lifecycle import training_spec, wait_for_checkpoint

pytestmark = pytest.mark.e2e


def lease(platform: Platform) -> SchedulerLease:
    async def read() -> SchedulerLease:
        db = Database(platform.store_url)
        try:
            async with db.sessions() as session:
                return (await session.execute(select(SchedulerLease))).scalar_one()
        finally:
            await db.dispose()

    return asyncio.run(read())


def live_gpu_rows(platform: Platform) -> list[tuple[str, int]]:
    async def read() -> list[tuple[str, int]]:
        db = Database(platform.store_url)
        try:
            async with db.sessions() as session:
                rows = (await session.execute(select(AllocationGpu).where(col(AllocationGpu.live) == True))).scalars().all()  # noqa: E712
                return [(r.node_id, r.gpu_index) for r in rows]
        finally:
            await db.dispose()

    return asyncio.run(read())


def test_two_schedulers_only_the_leader_commits_and_the_other_takes_over(platform: Platform, tmp_path: Path) -> None:
    log = open(tmp_path / "second-scheduler.log", "ab")  # noqa: SIM115 - closed at the end
    second = subprocess.Popen([sys.executable, "-m", "cli", "scheduler"], cwd=REPO, env=platform.part_env(), stdout=log, stderr=log)
    hold = platform.data_dir / "hold" / "scheduler"
    try:
        first = platform.wait_for(platform.submit(job_spec("before-failover", "print(1)"))["id"], TERMINAL)
        assert first["state"] == "SUCCEEDED"
        before = lease(platform)
        leader_pid = int(before.holder.rsplit(":", 1)[1])
        assert leader_pid in (second.pid, json.loads((platform.data_dir / "pids.json").read_text())["scheduler"])
        assert first["allocation"] is not None
        hold.parent.mkdir(exist_ok=True)
        hold.touch()  # keep the killed one down if it is `fairgang dev`'s own
        os.kill(leader_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        job = platform.submit(job_spec("after-failover", "print(2)"))
        deadline = time.monotonic() + 30
        while platform.job(job["id"])["allocation"] is None:
            assert time.monotonic() < deadline, platform.logs()
            time.sleep(0.1)
        after = lease(platform)
        assert after.holder != before.holder and after.epoch == before.epoch + 1
        print(f"takeover in {time.monotonic() - killed_at:.1f}s (lease TTL 4s, tick 2s)")  # speed is not this test's business
        assert platform.wait_for(job["id"], TERMINAL)["state"] == "SUCCEEDED"
        rows = live_gpu_rows(platform)
        assert len(rows) == len(set(rows))
    finally:
        hold.unlink(missing_ok=True)
        second.kill()
        second.wait()
        log.close()


@only("postgres")
def test_borrowed_gpus_are_reclaimed_by_preemption(platform: Platform) -> None:
    borrower = platform.submit(training_spec("borrows-16", steps=400, every=10, gpu_count=16))
    wait_for_checkpoint(platform, borrower["id"])
    owner = platform.submit(job_spec("owner-8", "print('owner ran')", gpu_count=8, checkpoint_dir="/ckpt/beta/o"), token="beta-token")
    done = platform.wait_for(owner["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", done
    victim: dict[str, Any] = platform.job(borrower["id"])
    assert any(e["kind"] == "PREEMPTING" and "reclaim" in e["message"] and owner["id"] in e["message"] for e in victim["events"]), victim
    final = platform.wait_for(borrower["id"], TERMINAL, timeout=180)
    assert final["state"] == "SUCCEEDED" and final["attempt"] >= 2
