"""The placement service around the core, on a real store and a real Temporal server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from fairgang.dev import temporal_binary
from fairgang.settings import SEARCH_ATTRIBUTES, Settings
from fairgang.spec import JobState
from scheduler.service import PlacementService
from store import repo
from store.db import Database
from tests.builders import job_spec


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=[SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES],
    )
    yield env
    await env.shutdown()


async def _register_all(db: Database) -> None:
    for node_id, gpu_type, count in (("h1", "H100-80GB", 8), ("h2", "H100-80GB", 8), ("g1", "L40S", 4)):
        await repo.register_node(db, node_id=node_id, gpu_type=gpu_type, gpu_count=count, labels={}, boot_id="b", gpus=[])


async def test_service_wakes_on_a_queued_job_not_only_on_its_tick(seeded: Database, db_url: str, temporal_env: WorkflowEnvironment) -> None:
    await _register_all(seeded)
    settings = Settings(database_url=db_url, scheduler_tick_s=3600, scheduler_poll_s=0.05, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, temporal_env.client, holder="test")
    task = asyncio.create_task(service.serve())
    try:
        await asyncio.sleep(1.0)  # the first cycle runs at start; after it only a wake-up can bind
        job, _ = await repo.create_job(seeded, spec=job_spec(name="wake"), tenant="alpha")
        await repo.mark_queued(seeded, job_id=job.id, attempt=1)
        for _ in range(200):
            if await repo.job_allocations(seeded, job.id):
                break
            await asyncio.sleep(0.05)
        [alloc] = await repo.job_allocations(seeded, job.id)
        assert alloc.state == "BOUND" and alloc.members[0]["node_id"] == "h1"
        assert (await repo.get_job(seeded, job.id)).state == "PLACED"  # type: ignore[union-attr]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_only_the_lease_holder_commits(seeded: Database, db_url: str, temporal_env: WorkflowEnvironment) -> None:
    await _register_all(seeded)
    settings = Settings(database_url=db_url, node_stale_after_s=3600)
    leader = PlacementService(settings, seeded, temporal_env.client, holder="leader")
    follower = PlacementService(settings, seeded, temporal_env.client, holder="follower")
    assert (await leader.cycle()).leader
    job, _ = await repo.create_job(seeded, spec=job_spec(name="one"), tenant="alpha")
    await repo.mark_queued(seeded, job_id=job.id, attempt=1)
    report = await follower.cycle()
    assert not report.leader and await repo.job_allocations(seeded, job.id) == []
    assert (await leader.cycle()).bound == 1


async def test_pending_reason_is_recorded_for_jobs_that_cannot_fit(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    await _register_all(seeded)
    service = PlacementService(Settings(database_url=db_url, node_stale_after_s=3600), seeded, temporal_env.client, holder="s")
    big, _ = await repo.create_job(seeded, spec=job_spec(name="big", gpu_type="L40S", gpu_count=4), tenant="alpha")
    bigger, _ = await repo.create_job(seeded, spec=job_spec(name="bigger", gpu_type="L40S", gpu_count=4), tenant="alpha")
    for job in (big, bigger):
        await repo.mark_queued(seeded, job_id=job.id, attempt=1)
    assert (await service.cycle()).bound == 1
    waiting = await repo.get_job(seeded, bigger.id)
    assert waiting is not None and waiting.pending_reason == "no L40S node has 4 free GPUs"


async def test_leader_cycles_are_counted_in_the_scheduling_metrics(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    from prometheus_client import REGISTRY

    await _register_all(seeded)
    settings = Settings(database_url=db_url, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, temporal_env.client, holder="metrics")

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    cycles, decisions, binds = (
        sample(n)
        for n in (
            "fairgang_scheduling_cycle_seconds_count",
            "fairgang_scheduling_decision_seconds_count",
            "fairgang_scheduler_bindings_total",
        )
    )
    job, _ = await repo.create_job(seeded, spec=job_spec(name="counted"), tenant="alpha")
    await repo.mark_queued(seeded, job_id=job.id, attempt=1)
    assert (await service.cycle()).bound == 1
    assert sample("fairgang_scheduling_cycle_seconds_count") == cycles + 1
    assert sample("fairgang_scheduling_decision_seconds_count") == decisions + 1
    assert sample("fairgang_scheduler_bindings_total") == binds + 1
    assert sample("fairgang_scheduler_leader") == 1


async def test_reconciler_resignals_bindings_their_workflow_has_not_acknowledged(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    await _register_all(seeded)
    settings = Settings(database_url=db_url, node_stale_after_s=1e12, scheduler_resignal_after_s=5)
    service = PlacementService(settings, seeded, temporal_env.client, holder="s")
    job, _ = await repo.create_job(seeded, spec=job_spec(name="unacked"), tenant="alpha")
    await repo.mark_queued(seeded, job_id=job.id, attempt=1)
    now = time.time()
    first = await service.cycle(now=now)
    assert first.bound == 1 and first.resignalled == 0
    # No workflow runs for this job, so nobody acknowledges the binding: it stays BOUND and is signalled again.
    assert (await service.cycle(now=now + 1)).resignalled == 0
    assert (await service.cycle(now=now + 6)).resignalled == 1
    [alloc] = await repo.job_allocations(seeded, job.id)
    assert alloc.state == "BOUND"
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=alloc.id)
    assert (await service.cycle(now=now + 20)).resignalled == 0
