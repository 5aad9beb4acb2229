"""The store on both backends: schema, invariants and idempotent transitions."""

from __future__ import annotations

import itertools

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import SQLModel, col

from fairgang.spec import JobState
from store import repo
from store.db import Database, migrate
from store.models import Allocation, AllocationGpu, ApiToken, Job, JobEvent
from tests.builders import job_spec


async def _bind(db: Database, job_id: str, members: list[dict], epoch: int) -> list[Allocation]:
    return await repo.commit_bindings(
        db,
        bindings=[repo.BindingRow(job_id=job_id, attempt=1, members=members)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
    )


async def _queued_job(db: Database, name: str, tenant: str = "alpha") -> Job:
    job, created = await repo.create_job(db, spec=job_spec(name=name), tenant=tenant)
    assert created
    await repo.mark_queued(db, job_id=job.id, attempt=1)
    return job


async def test_migrations_match_the_models(db: Database, db_url: str) -> None:
    await migrate(db_url)  # a second run is a no-op
    async with db.engine.connect() as conn:
        diff = await conn.run_sync(lambda sync: compare_metadata(MigrationContext.configure(sync), SQLModel.metadata))
    assert diff == []


async def test_tokens_are_stored_hashed_and_map_to_their_principal(seeded: Database) -> None:
    async with seeded.sessions() as session:
        hashes = (await session.execute(select(col(ApiToken.token_hash)))).scalars().all()
    assert "alpha-token" not in hashes
    assert repo.hash_token("alpha-token") in hashes
    assert await repo.authenticate(seeded, "alpha-token") == repo.Principal(role="tenant", tenant="alpha")
    assert await repo.authenticate(seeded, "admin-token") == repo.Principal(role="admin")
    assert await repo.authenticate(seeded, "nope") is None


async def test_seeding_twice_changes_nothing(seeded: Database) -> None:
    from tests.conftest import small_cluster

    await repo.seed_cluster(seeded, small_cluster())
    assert len(await repo.list_nodes(seeded)) == 3
    assert len(await repo.list_gpus(seeded)) == 20


async def test_same_idempotency_key_yields_one_job(seeded: Database) -> None:
    first, created = await repo.create_job(seeded, spec=job_spec(idempotency_key="k1"), tenant="alpha")
    again, created_again = await repo.create_job(seeded, spec=job_spec(idempotency_key="k1", name="other"), tenant="alpha")
    assert created and not created_again
    assert again.id == first.id
    other_tenant, created_other = await repo.create_job(seeded, spec=job_spec(idempotency_key="k1"), tenant="beta")
    assert created_other and other_tenant.id != first.id
    assert len(await repo.list_jobs(seeded, tenant="alpha")) == 1


async def test_concurrent_job_cap_refuses_with_reason(seeded: Database) -> None:
    await repo.create_job(seeded, spec=job_spec(name="a"), tenant="alpha", max_concurrent_jobs=1)
    with pytest.raises(repo.AdmissionRefused, match="1 unfinished jobs"):
        await repo.create_job(seeded, spec=job_spec(name="b"), tenant="alpha", max_concurrent_jobs=1)
    assert len(await repo.list_jobs(seeded)) == 1


async def test_store_refuses_a_second_live_allocation_of_the_same_gpu(seeded: Database) -> None:
    a = await _queued_job(seeded, "a")
    b = await _queued_job(seeded, "b")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    assert len(await _bind(seeded, a.id, [{"node_id": "h1", "gpu_indices": [0, 1], "rank": 0}], epoch)) == 1
    # Through the repository: the conflicting binding is skipped, not committed.
    assert await _bind(seeded, b.id, [{"node_id": "h1", "gpu_indices": [1, 2], "rank": 0}], epoch) == []
    assert (await repo.get_job(seeded, b.id)).state == "QUEUED"  # type: ignore[union-attr]
    # Straight at the table: the partial unique index itself refuses it.
    async with seeded.sessions() as session:
        session.add(Allocation(id="a-raw", job_id=b.id, attempt=1, members=[], created_at=0.0))
        await session.flush()
        session.add(AllocationGpu(allocation_id="a-raw", node_id="h1", gpu_index=0))
        with pytest.raises(IntegrityError):
            await session.flush()
        await session.rollback()


async def test_released_gpus_can_be_allocated_again(seeded: Database) -> None:
    a = await _queued_job(seeded, "a")
    b = await _queued_job(seeded, "b")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await _bind(seeded, a.id, [{"node_id": "h1", "gpu_indices": [0], "rank": 0}], epoch)
    await repo.record_transition(seeded, job_id=a.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1", exit_code=0)
    assert await repo.live_allocation_gpus(seeded) == []
    assert len(await _bind(seeded, b.id, [{"node_id": "h1", "gpu_indices": [0], "rank": 0}], epoch)) == 1
    assert (await repo.job_allocations(seeded, a.id))[0].state == "RELEASED"
    assert alloc.id != (await repo.job_allocations(seeded, b.id))[0].id


async def test_stale_leader_cannot_commit(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    old = await repo.acquire_lease(seeded, name="placement", holder="old", ttl_s=5, now=1000.0)
    assert old == 1
    assert await repo.acquire_lease(seeded, name="placement", holder="new", ttl_s=5, now=1001.0) is None
    new = await repo.acquire_lease(seeded, name="placement", holder="new", ttl_s=5, now=1010.0)
    assert new == 2
    with pytest.raises(repo.LeaseLost):
        await repo.commit_bindings(
            seeded,
            bindings=[repo.BindingRow(job_id=job.id, attempt=1, members=[{"node_id": "h1", "gpu_indices": [0], "rank": 0}])],
            pending_reasons={},
            lease_name="placement",
            epoch=old,
            now=1011.0,
        )
    assert await repo.live_allocation_gpus(seeded) == []


async def test_transitions_are_idempotent_and_terminal_states_stick(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    for _ in range(2):
        await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="running-1")
    done = await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.FAILED, event_key="end-1", exit_code=3)
    assert done.state == "FAILED" and done.exit_code == 3
    late = await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="running-again")
    assert late.state == "FAILED"
    kinds = [e.kind for e in await repo.job_events(seeded, job.id)]
    assert kinds == ["SUBMITTED", "RUNNING", "FAILED"]


async def test_requeue_moves_to_next_attempt_once(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await _bind(seeded, job.id, [{"node_id": "h1", "gpu_indices": [0], "rank": 0}], epoch)
    for _ in range(2):
        again = await repo.requeue_job(seeded, job_id=job.id, from_attempt=1, reason="node lost")
    assert again.attempt == 2 and again.state == "QUEUED"
    assert await repo.live_allocation_gpus(seeded) == []
    async with seeded.sessions() as session:
        requeues = (await session.execute(select(JobEvent).where(col(JobEvent.kind) == "REQUEUED"))).scalars().all()
    assert len(requeues) == 1


async def test_binding_a_cancelled_job_is_skipped(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.CANCELLED, event_key="cancel-1")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    assert await _bind(seeded, job.id, [{"node_id": "h1", "gpu_indices": [0], "rank": 0}], epoch) == []
    assert await repo.live_allocation_gpus(seeded) == []


async def test_heartbeat_from_old_boot_is_refused(seeded: Database) -> None:
    await repo.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="boot-1", gpus=[])
    assert (await repo.node_heartbeat(seeded, node_id="h1", boot_id="boot-1"))[0]
    await repo.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="boot-2", gpus=[])
    assert not (await repo.node_heartbeat(seeded, node_id="h1", boot_id="boot-1"))[0]
    assert (await repo.node_heartbeat(seeded, node_id="h1", boot_id="boot-2"))[0]


async def test_change_feed_moves_when_queue_or_capacity_changes(seeded: Database) -> None:
    before = await repo.change_version(seeded)
    job = await _queued_job(seeded, "a")
    after_queue = await repo.change_version(seeded)
    assert after_queue > before
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.CANCELLED, event_key="cancel-1")
    async with seeded.sessions() as session:
        assert (await session.execute(text("SELECT version FROM change_feed"))).scalar_one() == after_queue


async def test_silent_nodes_are_declared_lost_with_their_jobs(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    await repo.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[], now=100.0)
    await repo.register_node(seeded, node_id="h2", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=100.0)
    await repo.node_heartbeat(seeded, node_id="h2", boot_id="b2", now=125.0)
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000, now=100.0)
    assert epoch is not None
    await repo.commit_bindings(
        seeded,
        bindings=[repo.BindingRow(job_id=job.id, attempt=1, members=[{"node_id": "h1", "gpu_indices": [0], "rank": 0}])],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
        now=101.0,
    )
    lost = await repo.mark_lost_nodes(seeded, lost_after_s=20, now=130.0)
    assert lost == {"h1": [job.id]}
    assert await repo.mark_lost_nodes(seeded, lost_after_s=20, now=131.0) == {}
    states = {n.id: n.state for n in await repo.list_nodes(seeded)}
    assert states["h1"] == "LOST" and states["h2"] == "READY"


async def test_a_lost_node_gets_no_allocation_back_and_its_late_heartbeat_is_refused(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    await repo.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[], now=100.0)
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000, now=100.0)
    assert epoch is not None
    [alloc] = await repo.commit_bindings(
        seeded,
        bindings=[repo.BindingRow(job_id=job.id, attempt=1, members=[{"node_id": "h1", "gpu_indices": [0], "rank": 0}])],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
        now=101.0,
    )
    # While the node is fine, a re-registration (agent restart) gets its live allocation back.
    _, live = await repo.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=102.0)
    assert live == [alloc.id]
    await repo.mark_lost_nodes(seeded, lost_after_s=20, now=200.0)
    accepted, live = await repo.node_heartbeat(seeded, node_id="h1", boot_id="b2", now=201.0)
    assert not accepted and live == []
    node, live = await repo.register_node(
        seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=202.0
    )
    assert node.state == "READY" and live == []


async def test_launching_acknowledges_only_the_attempts_own_live_allocation(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await _bind(seeded, job.id, [{"node_id": "h1", "gpu_indices": [0], "rank": 0}], epoch)
    with pytest.raises(repo.StalePlacement):
        await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-x", allocation_id="a-bogus")
    assert (await repo.get_job(seeded, job.id)).state == "PLACED"  # type: ignore[union-attr]
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=alloc.id)
    assert (await repo.job_allocations(seeded, job.id))[0].state == "ACKED"


async def test_checkpoint_is_recorded_once_per_path(seeded: Database) -> None:
    job = await _queued_job(seeded, "a")
    for _ in range(2):
        await repo.set_latest_checkpoint(seeded, job_id=job.id, checkpoint="/ckpt/alpha/a/step-10", now=50.0)
    got = await repo.get_job(seeded, job.id)
    assert got is not None and got.latest_checkpoint == "/ckpt/alpha/a/step-10" and got.latest_checkpoint_at == 50.0
    assert [e.kind for e in await repo.job_events(seeded, job.id)].count("CHECKPOINT") == 1


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
        nodes = await asyncio.wait_for(repo.list_nodes(seeded), timeout=20)
        assert len(nodes) == 3
        assert not task.done()
    finally:
        release.set()
        await task


async def test_change_feed_moves_when_an_allocation_is_released(seeded: Database) -> None:
    """Freed capacity wakes the placement service: ending a bound job moves the change feed."""
    job = await _queued_job(seeded, "a")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await _bind(seeded, job.id, [{"node_id": "g1", "gpu_indices": [0, 1, 2, 3], "rank": 0}], epoch)
    before = await repo.change_version(seeded)
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1", exit_code=0)
    assert await repo.change_version(seeded) > before


def _event_rows(events: list[JobEvent]) -> list[tuple]:
    return [(e.id, e.ts, e.attempt, e.kind, e.message, e.data, e.dedupe_key) for e in events]


async def test_the_event_log_only_grows_and_the_database_refuses_to_rewrite_it(seeded: Database) -> None:
    """A job's events through two attempts: each step's log is the previous one plus new rows, never an edit."""
    job = await _queued_job(seeded, "a")
    epoch = await repo.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000)
    assert epoch is not None
    member = [{"node_id": "h1", "gpu_indices": [0], "rank": 0}]
    logs = [_event_rows(list(await repo.job_events(seeded, job.id)))]

    async def step() -> None:
        logs.append(_event_rows(list(await repo.job_events(seeded, job.id))))

    [first] = await _bind(seeded, job.id, member, epoch)
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=first.id)
    await step()
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="r-1")
    await repo.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="r-1")  # a repeat adds nothing
    await step()
    await repo.set_latest_checkpoint(seeded, job_id=job.id, checkpoint="/ckpt/alpha/a/step-1")
    await step()
    await repo.requeue_job(seeded, job_id=job.id, from_attempt=1, reason="node lost")
    await step()
    [second] = await repo.commit_bindings(
        seeded,
        bindings=[repo.BindingRow(job_id=job.id, attempt=2, members=member)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
    )
    await repo.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.LAUNCHING, event_key="l-2", allocation_id=second.id)
    await repo.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.RUNNING, event_key="r-2")
    await step()
    await repo.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.SUCCEEDED, event_key="end-2", exit_code=0)
    await repo.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.FAILED, event_key="late", exit_code=1)  # terminal sticks
    await step()
    for before, after in itertools.pairwise(logs):
        assert len(after) > len(before) and after[: len(before)] == before, (before, after)
    assert [row[3] for row in logs[-1]] == [
        *("SUBMITTED", "PLACED", "LAUNCHING", "RUNNING", "CHECKPOINT"),
        *("REQUEUED", "PLACED", "LAUNCHING", "RUNNING", "SUCCEEDED"),
    ]
    assert [row[2] for row in logs[-1]] == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    # The database itself refuses to edit or delete history (migration 0005), on both backends.
    for statement in (
        "UPDATE job_event SET kind = 'FAILED' WHERE kind = 'SUCCEEDED'",
        "DELETE FROM job_event WHERE kind = 'REQUEUED'",
    ):
        async with seeded.engine.connect() as conn:
            with pytest.raises(DBAPIError, match="append-only"):
                await conn.execute(text(statement))
    assert _event_rows(list(await repo.job_events(seeded, job.id))) == logs[-1]


async def test_a_fault_injected_while_a_report_is_assessed_is_kept(seeded: Database) -> None:
    """The heartbeat path reads a GPU, assesses the agent's report, then writes it back: an admin's
    injection (or return) in between must survive that write, not be overwritten by the stale read."""
    await repo.register_node(
        seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[{"index": 0, "health": {"simulated": True}}]
    )
    [stale] = [g for g in await repo.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert "injected" not in stale.health
    assert await repo.inject_gpu_fault(seeded, node_id="h1", index=0, fault={"kind": "thermal"}) == [{"kind": "thermal"}]
    await repo.set_gpu_health(seeded, node_id="h1", index=0, health={**stale.health, "temperature_c": 40}, keep_injected=True)
    [now] = [g for g in await repo.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert now.health["injected"] == [{"kind": "thermal"}] and now.health["temperature_c"] == 40
    # And the other way round: a GPU returned (injections cleared) meanwhile does not get a stale fault back.
    await repo.set_gpu_health(seeded, node_id="h1", index=0, healthy=True, health={"simulated": True})
    await repo.set_gpu_health(seeded, node_id="h1", index=0, health=dict(now.health), keep_injected=True)
    [after] = [g for g in await repo.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert "injected" not in after.health
    assert await repo.inject_gpu_fault(seeded, node_id="h9", index=0, fault={"kind": "thermal"}) is None


async def test_the_fleet_shape_for_admission_is_counted_per_node_shape(seeded: Database) -> None:
    shape = await repo.fleet_shape(seeded)
    assert shape.shapes == {"H100-80GB": {8: 2}, "L40S": {4: 1}}
    assert shape.levels == {"node", "leaf", "spine"}
    await repo.register_node(
        seeded, node_id="x1", gpu_type="L40S", gpu_count=2, labels={"rack": "r9"}, boot_id="b", gpus=[{"index": 0}, {"index": 1}]
    )
    shape = await repo.fleet_shape(seeded)
    assert shape.shapes == {"H100-80GB": {8: 2}, "L40S": {4: 1, 2: 1}}
    assert shape.levels == {"node", "leaf", "spine", "rack"}
