"""Jobs on both backends: idempotent submission, transitions, requeues and an append-only event log."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlmodel import col

from fairgang.members import PlacedMember
from fairgang.spec import JobState
from store import jobs, placement
from store.db import Database
from store.models import JobEvent
from tests.builders import job_spec
from tests.store.helpers import bind, queued_job


async def test_same_idempotency_key_yields_one_job(seeded: Database) -> None:
    first, created = await jobs.create_job(seeded, spec=job_spec(idempotency_key="k1"), tenant="alpha")
    again, created_again = await jobs.create_job(seeded, spec=job_spec(idempotency_key="k1", name="other"), tenant="alpha")
    assert created and not created_again
    assert again.id == first.id
    other_tenant, created_other = await jobs.create_job(seeded, spec=job_spec(idempotency_key="k1"), tenant="beta")
    assert created_other and other_tenant.id != first.id
    assert len(await jobs.list_jobs(seeded, tenant="alpha")) == 1


async def test_concurrent_job_cap_refuses_with_reason(seeded: Database) -> None:
    await jobs.create_job(seeded, spec=job_spec(name="a"), tenant="alpha", max_concurrent_jobs=1)
    with pytest.raises(jobs.AdmissionRefused, match="1 unfinished jobs"):
        await jobs.create_job(seeded, spec=job_spec(name="b"), tenant="alpha", max_concurrent_jobs=1)
    assert len(await jobs.list_jobs(seeded)) == 1


async def test_transitions_are_idempotent_and_terminal_states_stick(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    for _ in range(2):
        await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="running-1")
    done = await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.FAILED, event_key="end-1", exit_code=3)
    assert done.state == "FAILED" and done.exit_code == 3
    late = await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="running-again")
    assert late.state == "FAILED"
    kinds = [e.kind for e in await jobs.job_events(seeded, job.id)]
    assert kinds == ["SUBMITTED", "RUNNING", "FAILED"]


async def test_requeue_moves_to_next_attempt_once(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    for _ in range(2):
        again = await jobs.requeue_job(seeded, job_id=job.id, from_attempt=1, reason="node lost")
    assert again.attempt == 2 and again.state == "QUEUED"
    assert await placement.live_allocation_gpus(seeded) == []
    async with seeded.sessions() as session:
        requeues = (await session.execute(select(JobEvent).where(col(JobEvent.kind) == "REQUEUED"))).scalars().all()
    assert len(requeues) == 1


async def test_launching_acknowledges_only_the_attempts_own_live_allocation(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    with pytest.raises(jobs.StalePlacement):
        await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-x", allocation_id="a-bogus")
    assert (await jobs.get_job(seeded, job.id)).state == "PLACED"  # type: ignore[union-attr]
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=alloc.id)
    assert (await jobs.job_allocations(seeded, job.id))[0].state == "ACKED"


async def test_checkpoint_is_recorded_once_per_path(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    for _ in range(2):
        await jobs.set_latest_checkpoint(seeded, job_id=job.id, checkpoint="/ckpt/alpha/a/step-10", now=50.0)
    got = await jobs.get_job(seeded, job.id)
    assert got is not None and got.latest_checkpoint == "/ckpt/alpha/a/step-10" and got.latest_checkpoint_at == 50.0
    assert [e.kind for e in await jobs.job_events(seeded, job.id)].count("CHECKPOINT") == 1


async def test_the_newest_checkpoint_wins_whichever_write_comes_last(seeded: Database) -> None:
    """Ordered by attempt, then the report's number: an older report that comes late is ignored; reports its agent
    did not number (0) are taken in the order they come."""
    job = await queued_job(seeded, "a")

    async def record(path: str, attempt: int, seq: int) -> bool:
        return await jobs.set_latest_checkpoint(seeded, job_id=job.id, checkpoint=f"/ckpt/alpha/a/{path}", attempt=attempt, seq=seq)

    async def latest() -> str | None:
        got = await jobs.get_job(seeded, job.id)
        return None if got is None else got.latest_checkpoint

    assert await record("s1", 1, 0) and await record("s2", 1, 0)
    assert await latest() == "/ckpt/alpha/a/s2"
    assert await record("s4", 1, 2)
    assert not await record("s3", 1, 1)  # reported before s4
    assert await latest() == "/ckpt/alpha/a/s4"
    assert await record("s4", 1, 2)  # a repeat: still the latest, recorded once
    assert await record("t1", 2, 1)  # the next attempt's first
    assert not await record("s5", 1, 3)  # the previous attempt's, late
    assert await latest() == "/ckpt/alpha/a/t1"
    # A job that takes turns between two names: each report counts, so a late one is still told apart.
    assert await record("t2", 2, 2) and await record("t1", 2, 3) and await record("t2", 2, 4)
    assert not await record("t1", 2, 3)
    assert await latest() == "/ckpt/alpha/a/t2"
    events = [e for e in await jobs.job_events(seeded, job.id) if e.kind == "CHECKPOINT"]
    recorded = [(e.message.rsplit("/", 1)[1], e.attempt, e.data["seq"]) for e in events]
    assert recorded == [("s1", 1, 0), ("s2", 1, 0), ("s4", 1, 2), ("t1", 2, 1), ("t2", 2, 2), ("t1", 2, 3), ("t2", 2, 4)]


async def test_concurrent_checkpoint_writes_leave_the_newest(seeded: Database) -> None:
    """Two writes of one attempt's reports at once (two activities): the newer one is the job's latest either way."""
    for i in range(6):
        job = await queued_job(seeded, f"c{i}")
        paths = {seq: f"/ckpt/alpha/c{i}/step-{seq}" for seq in (1, 2)}
        writes = [jobs.set_latest_checkpoint(seeded, job_id=job.id, checkpoint=paths[seq], attempt=1, seq=seq) for seq in (1, 2)]
        await asyncio.gather(*(writes if i % 2 else reversed(writes)))
        got = await jobs.get_job(seeded, job.id)
        assert got is not None and got.latest_checkpoint == paths[2]


async def test_change_feed_moves_when_queue_or_capacity_changes(seeded: Database) -> None:
    before = await placement.change_version(seeded)
    job = await queued_job(seeded, "a")
    after_queue = await placement.change_version(seeded)
    assert after_queue > before
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.CANCELLED, event_key="cancel-1")
    async with seeded.sessions() as session:
        assert (await session.execute(text("SELECT version FROM change_feed"))).scalar_one() == after_queue


def _event_rows(events: list[JobEvent]) -> list[tuple]:
    return [(e.id, e.ts, e.attempt, e.kind, e.message, e.data, e.dedupe_key) for e in events]


async def test_the_event_log_only_grows_and_the_database_refuses_to_rewrite_it(seeded: Database) -> None:
    """A job's events through two attempts: each step's log is the previous one plus new rows, never an edit."""
    job = await queued_job(seeded, "a")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000)
    assert epoch is not None
    member = [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)]
    logs = [_event_rows(list(await jobs.job_events(seeded, job.id)))]

    async def step() -> None:
        logs.append(_event_rows(list(await jobs.job_events(seeded, job.id))))

    [first] = await bind(seeded, job.id, member, epoch)
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=first.id)
    await step()
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="r-1")
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="r-1")  # a repeat adds nothing
    await step()
    await jobs.set_latest_checkpoint(seeded, job_id=job.id, checkpoint="/ckpt/alpha/a/step-1")
    await step()
    await jobs.requeue_job(seeded, job_id=job.id, from_attempt=1, reason="node lost")
    await step()
    [second] = await placement.commit_bindings(
        seeded,
        bindings=[placement.BindingRow(job_id=job.id, attempt=2, members=member)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
    )
    await jobs.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.LAUNCHING, event_key="l-2", allocation_id=second.id)
    await jobs.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.RUNNING, event_key="r-2")
    await step()
    await jobs.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.SUCCEEDED, event_key="end-2", exit_code=0)
    await jobs.record_transition(seeded, job_id=job.id, attempt=2, state=JobState.FAILED, event_key="late", exit_code=1)  # terminal sticks
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
    assert _event_rows(list(await jobs.job_events(seeded, job.id))) == logs[-1]
