"""The placement service around the core, on a real store and a real Temporal server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from cli.platform import temporal_binary
from fairgang.settings import SEARCH_ATTRIBUTES, Settings
from fairgang.spec import JobState
from scheduler import service as service_module
from scheduler.service import LEASE_NAME, PlacementService
from store import jobs as stored_jobs
from store import nodes, placement, rollup
from store.db import Database
from store.models import Job, SchedulerLease
from tests.builders import job_spec
from workflows import starter


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
        await nodes.register_node(db, node_id=node_id, gpu_type=gpu_type, gpu_count=count, labels={}, boot_id="b", gpus=[])


async def test_service_wakes_on_a_queued_job_not_only_on_its_tick(seeded: Database, db_url: str, temporal_env: WorkflowEnvironment) -> None:
    await _register_all(seeded)
    settings = Settings(database_url=db_url, scheduler_tick_s=3600, scheduler_poll_s=0.05, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, temporal_env.client, holder="test")
    task = asyncio.create_task(service.serve())
    try:
        await asyncio.sleep(1.0)  # the first cycle runs at start; after it only a wake-up can bind
        job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="wake"), tenant="alpha")
        await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
        for _ in range(200):
            if await stored_jobs.job_allocations(seeded, job.id):
                break
            await asyncio.sleep(0.05)
        [alloc] = await stored_jobs.job_allocations(seeded, job.id)
        assert alloc.state == "BOUND" and alloc.members[0]["node_id"] == "h1"
        assert (await stored_jobs.get_job(seeded, job.id)).state == "PLACED"  # type: ignore[union-attr]
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
    job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="one"), tenant="alpha")
    await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
    report = await follower.cycle()
    assert not report.leader and await stored_jobs.job_allocations(seeded, job.id) == []
    assert (await leader.cycle()).bound == 1


async def test_pending_reason_is_recorded_for_jobs_that_cannot_fit(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    await _register_all(seeded)
    service = PlacementService(Settings(database_url=db_url, node_stale_after_s=3600), seeded, temporal_env.client, holder="s")
    big, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="big", gpu_type="L40S", gpu_count=4), tenant="alpha")
    bigger, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="bigger", gpu_type="L40S", gpu_count=4), tenant="alpha")
    for job in (big, bigger):
        await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
    assert (await service.cycle()).bound == 1
    waiting = await stored_jobs.get_job(seeded, bigger.id)
    assert waiting is not None and waiting.pending_reason == "no L40S node has 4 free GPUs"
    assert waiting.pending_code == "no_free_node"


async def test_a_reason_stored_without_its_code_gets_the_code_next_cycle(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    """A job queued before the store kept codes has the text but no code: the next cycle writes the code."""
    await _register_all(seeded)
    service = PlacementService(Settings(database_url=db_url, node_stale_after_s=3600), seeded, temporal_env.client, holder="s")
    big, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="big", gpu_type="L40S", gpu_count=4), tenant="alpha")
    bigger, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="bigger", gpu_type="L40S", gpu_count=4), tenant="alpha")
    for job in (big, bigger):
        await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
    await service.cycle()
    async with seeded.transaction() as session:
        await session.execute(update(Job).where(col(Job.id) == bigger.id).values(pending_code=None))
    await service.cycle()
    waiting = await stored_jobs.get_job(seeded, bigger.id)
    assert waiting is not None and (waiting.pending_reason, waiting.pending_code) == ("no L40S node has 4 free GPUs", "no_free_node")


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
    job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="counted"), tenant="alpha")
    await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
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
    job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="unacked"), tenant="alpha")
    await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
    now = time.time()
    first = await service.cycle(now=now)
    assert first.bound == 1 and first.resignalled == 0
    # No workflow runs for this job, so nobody acknowledges the binding: it stays BOUND and is signalled again.
    assert (await service.cycle(now=now + 1)).resignalled == 0
    assert (await service.cycle(now=now + 6)).resignalled == 1
    [alloc] = await stored_jobs.job_allocations(seeded, job.id)
    # A signal that reached a workflow which does not acknowledge is sent again with backoff: it had waited 6 s
    # before that signal, so it waits 6 s more before the next (a failed signal, as here, is tried every cycle).
    await placement.mark_signalled(seeded, [alloc.id], now + 6)
    assert (await service.cycle(now=now + 11.5)).resignalled == 0  # past the 5 s, not yet past the 6 s
    assert (await service.cycle(now=now + 12.5)).resignalled == 1
    assert alloc.state == "BOUND"
    await stored_jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=alloc.id)
    assert (await service.cycle(now=now + 40)).resignalled == 0


async def _workflow_count(client: Client, job_id: str) -> int:
    return (await client.count_workflows(f"WorkflowId = '{job_id}'")).count


async def test_reconciler_starts_a_missing_workflow_once_and_a_repeated_start_is_a_no_op(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    """A job stored while Temporal was down gets its workflow from the reconciler; starting it again changes nothing."""
    client = temporal_env.client
    settings = Settings(database_url=db_url, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, client, holder="s")
    job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="orphan"), tenant="alpha")
    assert not job.workflow_started
    now = time.time()
    # Too young: the API may still be starting it.
    assert (await service.cycle(now=now)).started_workflows == 0
    assert (await service.cycle(now=now + 10)).started_workflows == 1
    stored = await stored_jobs.get_job(seeded, job.id)
    assert stored is not None and stored.workflow_started
    run_id = (await client.get_workflow_handle(job.id).describe()).run_id
    # The next cycle leaves it alone.
    assert (await service.cycle(now=now + 20)).started_workflows == 0
    # A repeated start (the API and the reconciler racing, or the API retrying) returns the same run.
    again = await starter.start_job_workflow(client, stored, settings)
    assert again.result_run_id == run_id
    # Even when the store forgot that it started (the API died after starting it), the reconciler's repeat is harmless.
    async with seeded.transaction() as session:
        await session.execute(update(Job).where(col(Job.id) == job.id).values(workflow_started=False))
    assert (await service.cycle(now=now + 30)).started_workflows == 1
    assert (await client.get_workflow_handle(job.id).describe()).run_id == run_id
    for _ in range(100):
        if await _workflow_count(client, job.id) >= 1:
            break
        await asyncio.sleep(0.1)
    assert await _workflow_count(client, job.id) == 1


async def test_service_wakes_when_capacity_frees_not_only_on_its_tick(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    """Job B waits behind job A on the one L40S node; when A ends, B is bound at once, not on the hour-long tick."""
    await _register_all(seeded)
    settings = Settings(database_url=db_url, scheduler_tick_s=3600, scheduler_poll_s=0.05, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, temporal_env.client, holder="test")

    async def until(check: Any, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    task = asyncio.create_task(service.serve())
    try:
        a, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="a", gpu_type="L40S", gpu_count=4), tenant="alpha")
        await stored_jobs.mark_queued(seeded, job_id=a.id, attempt=1)
        await until(lambda: stored_jobs.job_allocations(seeded, a.id), "A to be bound")
        b, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="b", gpu_type="L40S", gpu_count=4), tenant="alpha")
        await stored_jobs.mark_queued(seeded, job_id=b.id, attempt=1)

        async def b_waits() -> bool:  # a cycle has seen B and left it waiting, with the reason
            job = await stored_jobs.get_job(seeded, b.id)
            return job is not None and job.pending_reason not in (None, "waiting for placement", "waiting for its workflow to start")

        await until(b_waits, "B's pending reason")
        await asyncio.sleep(1.0)  # every wake-up so far has been served: from here only a new change can bind B
        assert await stored_jobs.job_allocations(seeded, b.id) == []
        await stored_jobs.record_transition(seeded, job_id=a.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1", exit_code=0)
        await until(lambda: stored_jobs.job_allocations(seeded, b.id), "B to be bound after A ended (the tick is an hour)")
        [alloc] = await stored_jobs.job_allocations(seeded, b.id)
        assert alloc.members[0]["node_id"] == "g1" and sorted(alloc.members[0]["gpu_indices"]) == [0, 1, 2, 3]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class _CheckingClient:
    """A Temporal client stand-in: each placement signal checks that its allocation is already committed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.signals: list[tuple[str, Any]] = []
        self.committed_when_signalled: list[bool] = []

    def get_workflow_handle(self, job_id: str) -> Any:
        outer = self

        class Handle:
            async def signal(self, name: str, arg: Any) -> None:
                allocs = await stored_jobs.job_allocations(outer.db, job_id)
                outer.committed_when_signalled.append(any(a.id == arg.allocation_id and a.state == "BOUND" for a in allocs))
                outer.signals.append((name, arg))

        return Handle()


async def test_bindings_are_committed_before_their_signal_and_a_lost_lease_signals_nothing(
    seeded: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _register_all(seeded)
    client = _CheckingClient(seeded)
    service = PlacementService(Settings(database_url=db_url, node_stale_after_s=3600), seeded, client, holder="s")  # type: ignore[arg-type]
    job, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="ordered"), tenant="alpha")
    await stored_jobs.mark_queued(seeded, job_id=job.id, attempt=1)
    assert (await service.cycle()).bound == 1
    assert [name for name, _ in client.signals] == ["place"] and client.committed_when_signalled == [True]

    # Another placement service takes the lease over while this one decides: its commit is refused, so nothing is signalled.
    other, _ = await stored_jobs.create_job(seeded, spec=job_spec(name="fenced"), tenant="alpha")
    await stored_jobs.mark_queued(seeded, job_id=other.id, attempt=1)
    real_read = service.reader.read

    async def snapshot_then_lose_the_lease(*args: Any, **kwargs: Any) -> Any:
        snapshot = await real_read(*args, **kwargs)
        later = time.time() + 10 * service.lease_ttl_s
        assert await placement.acquire_lease(seeded, name=LEASE_NAME, holder="usurper", ttl_s=service.lease_ttl_s, now=later) is not None
        return snapshot

    monkeypatch.setattr(service.reader, "read", snapshot_then_lose_the_lease)
    report = await service.cycle()
    assert not report.leader and report.bound == 0
    assert len(client.signals) == 1 and await stored_jobs.job_allocations(seeded, other.id) == []


async def test_reconciler_absorbs_a_backlog_in_bounded_batches_oldest_first(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs stored while their workflows could not be started are started a batch per cycle, oldest first."""
    monkeypatch.setattr(service_module, "RECONCILE_BATCH", 2)
    service = PlacementService(Settings(database_url=db_url, node_stale_after_s=3600), seeded, temporal_env.client, holder="s")
    now = time.time()
    jobs = [(await stored_jobs.create_job(seeded, spec=job_spec(name=f"backlog-{i}"), tenant="alpha", now=now + i))[0] for i in range(5)]
    assert (await service.cycle(now=now + 60)).started_workflows == 2
    assert [(await stored_jobs.get_job(seeded, j.id)).workflow_started for j in jobs] == [True, True, False, False, False]  # type: ignore[union-attr]
    started = [(await service.cycle(now=now + 61 + k)).started_workflows for k in range(3)]
    assert started == [2, 1, 0]
    for job in jobs:
        stored = await stored_jobs.get_job(seeded, job.id)
        assert stored is not None and stored.workflow_started
        assert await _workflow_count(temporal_env.client, job.id) == 1 or await _eventually_counted(temporal_env.client, job.id)


async def _eventually_counted(client: Client, job_id: str) -> bool:
    for _ in range(100):  # the visibility store lags the start a little
        if await _workflow_count(client, job_id) == 1:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_node_silent_since_before_the_service_started_is_lost_only_after_the_timeout_with_it_up(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    """A restart of the whole platform: no agent could heartbeat while the API was down, so silence from before
    the placement service started is not held against the nodes."""
    await _register_all(seeded)  # heard from now
    t0 = time.time()
    settings = Settings(database_url=db_url, node_lost_after_s=10, node_stale_after_s=3600)
    service = PlacementService(settings, seeded, temporal_env.client, holder="s")
    service.started_at = t0 + 60  # the platform came back a minute after the last heartbeats
    await service.cycle(now=t0 + 65)
    assert {n.id: n.state for n in await nodes.list_nodes(seeded)} == {"g1": "READY", "h1": "READY", "h2": "READY"}
    await service.cycle(now=t0 + 71)  # silent for the whole timeout with the service up
    assert {n.state for n in await nodes.list_nodes(seeded)} == {"LOST"}


async def lease_holder(db: Database) -> str | None:
    async with db.sessions() as session:
        lease = await session.get(SchedulerLease, LEASE_NAME)
    return None if lease is None else lease.holder


async def test_a_leader_that_stops_hands_the_lease_over_at_once(seeded: Database, db_url: str, temporal_env: WorkflowEnvironment) -> None:
    settings = Settings(database_url=db_url, scheduler_tick_s=60.0)  # a lease of 120 s: waiting it out would be long
    leader = PlacementService(settings, seeded, temporal_env.client, holder="leader")
    standby = PlacementService(settings, seeded, temporal_env.client, holder="standby")
    serving = asyncio.create_task(leader.serve())
    deadline = time.monotonic() + 30
    while await lease_holder(seeded) != "leader":
        assert time.monotonic() < deadline, "the leader never took the lease"
        await asyncio.sleep(0.1)
    assert not (await standby.cycle()).leader
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    # The standby leads at its next cycle, with a greater epoch (the old leader's commits are fenced).
    report = await standby.cycle()
    assert report.leader
    assert not await placement.release_lease(seeded, name=LEASE_NAME, holder="leader")  # no longer its to give


async def test_the_leader_writes_one_rollup_row_per_bucket_and_a_follower_none(
    seeded: Database, db_url: str, temporal_env: WorkflowEnvironment
) -> None:
    await _register_all(seeded)
    settings = Settings(database_url=db_url, node_stale_after_s=3600, rollup_bucket_s=60)
    leader = PlacementService(settings, seeded, temporal_env.client, holder="leader")
    follower = PlacementService(settings, seeded, temporal_env.client, holder="follower")
    bucket = rollup.bucket_of(time.time(), 60) + 120  # a bucket of its own, ahead of the clock
    assert (await leader.cycle(now=bucket + 1)).leader
    assert not (await follower.cycle(now=bucket + 2)).leader
    assert (await leader.cycle(now=bucket + 3)).leader
    [row] = await rollup.rollup_rows(seeded, since=bucket, until=bucket + 60)
    assert (row.at, row.gpus_total, row.gpus_allocated) == (bucket + 1, 20, 0)
    assert follower.rolled_bucket is None
    assert (await leader.cycle(now=bucket + 61)).leader
    assert [r.at for r in await rollup.rollup_rows(seeded, since=bucket, until=bucket + 120)] == [bucket + 1, bucket + 61]
